"""The plots' sixth cell: tabs for the hardware table ("What the hardware allows", its format box
beside the tabs), the KV cache's blocks and serving (the batch's rates and sequences)."""
from __future__ import annotations

from PySide6.QtCore import QSize, Qt
from PySide6.QtWidgets import QTabWidget

from app.i18n import translate


class SideTabs(QTabWidget):
    """`chosen`: a presenter layout named the tab, so simulated users starting do not move it."""

    def __init__(self, seed_table, kv_panel, serving_panel):
        super().__init__()
        self.seed_table, self.kv_panel, self.serving_panel = seed_table, kv_panel, serving_panel
        self.chosen = False
        self.addTab(seed_table, translate("Window", "What the hardware allows"))
        seed_table.set_title_visible(False)  # (the tab says it; its format box sits beside the tabs)
        self.setCornerWidget(seed_table.format_box, Qt.Corner.TopRightCorner)
        self.currentChanged.connect(lambda _index: seed_table.format_box.setVisible(self.currentWidget() is seed_table))
        self.addTab(kv_panel, translate("Window", "KV cache"))
        self.addTab(serving_panel, translate("Window", "Serving"))

    def readable_size(self) -> QSize:
        """The hardware table's readable size, with the tabs around it (what the plots' grid must give the cell)."""
        return QSize(self.seed_table.readable_width() + 8,
                     self.seed_table.readable_height() + self.tabBar().sizeHint().height() + 8)

    def refresh_shown(self) -> None:
        """The panel on show redraws from its data (a frame of the window's clock)."""
        if self.currentWidget() is self.kv_panel and self.isVisible():
            self.kv_panel.refresh()
        if self.currentWidget() is self.serving_panel and self.isVisible():
            self.serving_panel.refresh()

    def users_started(self) -> None:
        """Simulated users began: serving comes to the front (where the batch shows), unless a
        presenter layout chose the tab."""
        if not self.chosen:
            self.setCurrentWidget(self.serving_panel)
