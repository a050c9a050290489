"""How the window looks, switched by the person: the theme (F9), projector type (F10), the hardware
table on show (F8); each a button beside the controls and a key."""
from __future__ import annotations

from PySide6.QtWidgets import QPushButton

from app.controls import BAR_SHARE
from app.i18n import translate
from app.theme import stylesheet, themed


class ViewSwitches:
    """The theme, type size and hardware-table switches of `window` (a MainWindow: its panels)."""

    def __init__(self, window, large_fonts: bool):
        self.window = window
        self.theme_button = QPushButton(translate("Window", "Light theme  F9"))
        self.fonts_button = QPushButton(translate("Window", "Large fonts  F10"))
        self.fonts_button.setCheckable(True)
        self.table_button = QPushButton(translate("Window", "Hardware table  F8"))
        self.table_button.setCheckable(True)
        self.table_button.setChecked(not large_fonts)
        self.theme_button.clicked.connect(self.toggle_theme)
        self.fonts_button.clicked.connect(lambda checked: self.set_large_fonts(checked))
        self.table_button.clicked.connect(lambda _checked: self.toggle_seed_table())

    @property
    def buttons(self) -> tuple[QPushButton, ...]:
        return self.table_button, self.theme_button, self.fonts_button

    def apply_theme(self) -> None:
        window = self.window
        window.setStyleSheet(stylesheet(window.theme))
        window.colours.set_theme(window.theme)
        for part in (window.controls, window.chat, window.seed_table, window.kv_panel, window.serving_panel,
                     window.hardware_strip, window.plots):
            part.set_theme(window.theme)
        light = window.theme.name == "light"
        self.theme_button.setText(translate("Window", "Dark theme  F9") if light
                                  else translate("Window", "Light theme  F9"))
        self.fonts_button.setChecked(window.theme.large)

    def toggle_theme(self) -> None:
        window = self.window
        window.theme = themed("light" if window.theme.name == "dark" else "dark", window.theme.large)
        self.apply_theme()

    def set_large_fonts(self, large: bool) -> None:
        """Projector mode: bigger type everywhere; the seed table makes room for the plots (F8)."""
        window = self.window
        window.theme = themed(window.theme.name, large)
        self.apply_theme()
        self.show_seed_table(not large)
        window.screen_fit.fit_strip(window.height())
        window.controls.set_height_budget(int(BAR_SHARE * window.height()), again=True)  # the new type's sizes

    def show_seed_table(self, visible: bool) -> None:
        """Whether the grid keeps a cell for the seed table (when it has room for it)."""
        self.window.plots.set_extra_visible(visible)
        self.show_table_state()

    def seed_table_on_show(self) -> bool:
        window = self.window
        return window.seed_table.isVisibleTo(window) and window.side_tabs.currentWidget() is window.seed_table

    def show_table_state(self) -> None:
        self.table_button.setChecked(self.seed_table_on_show())

    def toggle_seed_table(self) -> None:
        """F8: the hardware table on show, or away. Where the grid has no readable cell for it (a
        small screen, large type) it comes as the presenter's panel (key 6), and F8 again brings the
        grid back."""
        window = self.window
        presenter = getattr(getattr(window, "talk", None), "presenter", None)
        presenting = window.plots.shown is not None
        if self.seed_table_on_show():
            if presenting and presenter is not None and "extra" in window.plots.shown:
                presenter.show([name for name in window.plots.shown if name != "extra"] or None)
            self.show_seed_table(False)
            return
        window.side_tabs.setCurrentWidget(window.seed_table)
        self.show_seed_table(True)
        if not self.seed_table_on_show() and presenter is not None:  # the grid (or the presenter) left it out
            presenter.show(["table"])
        self.show_table_state()
