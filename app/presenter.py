"""The presenter layout: one or two plots as large as the window allows, beside the chat, chosen
with number keys. 1–5 (or Ctrl+1–5 while typing) show tokens/s, memory, compute, roofline and
the timeline; 6 the side panel (hardware table, KV cache, serving); 7 and 8 speculative decoding's
acceptance and accepted-per-position plots; a second number adds a second
plot (the older of two goes), the number of a plot on show takes it away; 0 brings the grid back."""
from __future__ import annotations

from PySide6.QtCore import QObject, Signal

PLOT_KEYS = {1: "tokens", 2: "memory", 3: "compute", 4: "roofline", 5: "timeline", 6: "extra", 7: "acceptance",
             8: "positions"}
# names a tour may use for the side panel's tabs: each brings the panel forward on that tab
SIDE_TABS = {"table": 0, "kv": 1, "serving": 2}
PLOT_NAMES = tuple(name for name in PLOT_KEYS.values() if name != "extra") + tuple(SIDE_TABS)
CHAT_SHARE = 0.36  # of the window's width, in the presenter layout


class Presenter(QObject):
    changed = Signal(object)  # the names on show (None: the grid)

    def __init__(self, window):
        super().__init__(window)
        self.window = window
        self.shown: list[str] | None = None
        self._grid_sizes: list[int] | None = None

    def press(self, number: int) -> None:
        """A number key: 0 the grid; 1–6 add that plot, or take it away if it is on show."""
        if number == 0:
            self.show(None)
            return
        name = PLOT_KEYS.get(number)
        if name is None:
            return
        shown = list(self.shown or [])
        if name in shown:
            shown.remove(name)
        else:
            shown = (shown + [name])[-2:]
        self.show(shown or None)

    def show(self, names) -> None:
        """None (or empty): the grid. Else up to two of PLOT_NAMES ("table", "kv", "serving" bring
        the side panel forward on that tab)."""
        window = self.window
        cells: list[str] = []
        window.side_tabs.chosen = False
        for name in names or []:
            if name in SIDE_TABS:
                window.side_tabs.setCurrentIndex(SIDE_TABS[name])
                window.side_tabs.chosen = True
                name = "extra"
            if name not in cells:
                cells.append(name)
        cells = cells[-2:]
        was_grid = self.shown is None
        self.shown = cells or None
        if was_grid and self.shown is not None:
            self._grid_sizes = window.splitter.sizes()
        window.plots.arrange(self.shown)
        # the essentials, large
        for part in (window.controls, window.hardware_strip, window.chat, window.seed_table, window.serving_panel):
            part.set_compact(self.shown is not None)
        total = sum(window.splitter.sizes()) or window.width()
        if self.shown is not None:
            window.splitter.setSizes([int(total * CHAT_SHARE), total - int(total * CHAT_SHARE)])
        elif self._grid_sizes is not None:
            window.splitter.setSizes(self._grid_sizes)
        window.plots.refresh(force=True)
        window.action.emit("layout", (list(names) if names else None,))
        self.changed.emit(self.shown)
