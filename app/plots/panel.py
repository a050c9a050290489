"""`PlotsPanel`: the grid of the five live plots (and an extra widget, the seed table, in the sixth
cell), and a row of speculation plots (acceptance over time and by guess position) that shows while
the data holds speculative steps. The window's timer calls `refresh`, which redraws every plot from
one `StepWindow` only when `LiveData` has changed, and `update_readouts` a few times a second."""
from __future__ import annotations

import math

import numpy as np
from PySide6.QtCore import Qt
from PySide6.QtWidgets import QGridLayout, QSplitter, QWidget

from app.i18n import translate
from app.live_data import LiveData
from app.plots.acceptance import AcceptancePlot, PositionPlot
from app.plots.compute import ComputePlot
from app.plots.memory import MemoryPlot
from app.plots.roofline import RooflinePlot
from app.plots.step_plot import StepWindow
from app.plots.style import flops_unit, format_rate
from app.plots.timeline import TimelinePlot
from app.plots.tokens import TokensPlot
from app.theme import SettingColours, Theme


class PlotsPanel(QWidget):
    def __init__(self, data: LiveData, theme: Theme, colours: SettingColours, extra: QWidget | None = None,
                 parent=None):
        super().__init__(parent)
        self.data = data
        self.theme = theme
        self.colours = colours
        self.tokens = TokensPlot(data, theme, colours)
        self.memory = MemoryPlot(data, theme, colours)
        self.compute = ComputePlot(data, theme, colours)
        self.roofline = RooflinePlot(data, theme, colours)
        self.timeline = TimelinePlot(data, theme, colours)
        self.acceptance = AcceptancePlot(data, theme, colours)
        self.positions = PositionPlot(data, theme, colours)
        self.views = {"tokens": self.tokens, "memory": self.memory, "compute": self.compute,
                      "roofline": self.roofline, "timeline": self.timeline, "acceptance": self.acceptance,
                      "positions": self.positions}
        self._drawn_version = -1
        self._readout_version = -1
        self.frames_drawn = 0
        self.extra = extra
        self._extra_visible = True
        self.shown: list[str] | None = None  # the presenter's plots (None: the grid)
        self._stack = QSplitter(Qt.Orientation.Vertical, self)  # the presenter's one or two cells
        self._stack.setChildrenCollapsible(False)
        self._stack.setVisible(False)
        self._grid = QGridLayout(self)
        self._grid.setContentsMargins(0, 0, 0, 0)
        self._grid.setSpacing(6)
        self._grid.addWidget(self.tokens, 0, 0)
        self._grid.addWidget(self.memory, 0, 1)
        self._grid.addWidget(self.compute, 1, 0)
        self._grid.addWidget(self.roofline, 1, 1)
        self._grid.addWidget(self.timeline, 2, 0)
        if extra is not None:
            self._grid.addWidget(extra, 2, 1)
        self._grid.addWidget(self._stack, 0, 0, 3, 2)
        self._grid.addWidget(self.acceptance, 3, 0)
        self._grid.addWidget(self.positions, 3, 1)
        self._set_speculation_visible(False)
        for row in range(3):
            self._grid.setRowStretch(row, 1)
        for col in range(2):
            self._grid.setColumnStretch(col, 1)

    def set_extra_visible(self, visible: bool) -> None:
        """Show or hide the sixth cell (the seed table); the timeline takes the row when hidden."""
        if self.extra is None:
            return
        self._extra_visible = visible
        if self.shown is not None:  # presenting: the choice applies when the grid comes back
            return
        self.extra.setVisible(visible)
        self._grid.removeWidget(self.timeline)
        self._grid.addWidget(self.timeline, 2, 0, 1, 1 if visible else 2)

    def arrange(self, shown: list[str] | None) -> None:
        """None: the grid of five plots (and the extra cell). A list of one or two names of
        `views` (or "extra"): only those, stacked in a splitter as large as the panel (the presenter
        layout; the side panel, with its text, gets a little more height than a plot)."""
        cells = dict(self.views, extra=self.extra) if self.extra is not None else dict(self.views)
        for widget in cells.values():
            self._grid.removeWidget(widget)
            if widget.parent() is self._stack:
                widget.setParent(self)
        self.shown = list(shown) if shown else None
        if self.shown is None:
            self._stack.setVisible(False)
            cells_at = ((0, 0), (0, 1), (1, 0), (1, 1), (2, 0), (3, 0), (3, 1))  # speculation's row last
            for widget, (row, col) in zip(self.views.values(), cells_at):
                self._grid.addWidget(widget, row, col)
                widget.setVisible(True)
            self._set_speculation_visible(self.speculation_visible)  # its row only while speculating
            if self.extra is not None:
                self._grid.addWidget(self.extra, 2, 1)
            self.set_extra_visible(self._extra_visible)
            return
        for name, widget in cells.items():
            if name not in self.shown:
                widget.setVisible(False)
        for name in self.shown:
            self._stack.addWidget(cells[name])
            cells[name].setVisible(True)
        self._stack.setSizes([1300 if name == "extra" else 1000 for name in self.shown])
        self._stack.setVisible(True)

    def _set_speculation_visible(self, visible: bool) -> None:
        """The speculation row, only while the data holds speculative steps."""
        self.speculation_visible = visible
        self.acceptance.setVisible(visible)
        self.positions.setVisible(visible)
        self._grid.setRowStretch(3, 1 if visible else 0)

    def set_theme(self, theme: Theme) -> None:
        self.theme = theme
        self.colours.set_theme(theme)
        for view in self.views.values():
            view.set_theme(theme)
        self._readout_version = -1
        self.refresh(force=True)

    def set_hardware(self, spec) -> None:
        for view in self.views.values():
            view.set_hardware(spec)
        self._drawn_version = -1
        self._readout_version = -1

    def refresh(self, force: bool = False) -> bool:
        """Redraw from the ring buffers if anything changed (~30 times a second); True if it drew."""
        if not force and self.data.version == self._drawn_version:
            return False
        self._drawn_version = self.data.version
        frame = StepWindow(self.data)
        speculating = bool((self.data.steps.column("verify") > 0.5).any())
        if speculating != self.speculation_visible and self.shown is None:
            self._set_speculation_visible(speculating)
        for name, view in self.views.items():
            if self.speculation_visible or name not in ("acceptance", "positions") or name in (self.shown or ()):
                view.draw(frame)
                view.fit_legend()  # (a new settings label may have joined the legend)
        self.frames_drawn += 1
        return True

    def update_readouts(self) -> None:
        """The numbers beside the titles, a few times a second (30 a second cannot be read)."""
        if self.data.version == self._readout_version:
            return
        self._readout_version = self.data.version
        if self.data.steps.total == 0:
            return
        if self.data.source != "model":
            self._server_readouts()
            return
        for name, view in self.views.items():
            if name in ("acceptance", "positions") and not self.speculation_visible:
                continue
            readout = view.readout()
            if readout is not None:
                view.show_readout(readout)

    def _server_readouts(self) -> None:
        """Attach mode: the latest scrapes' figures, labelled with their source; a plot whose figures
        the server does not publish says why (data.notes) instead of showing a number."""
        steps, source = self.data.steps, translate("Plots", self.data.source)
        notes = {name: translate("Plots", note) for name, note in self.data.notes.items()}  # (a server's own: as is)

        def recent(name: str, n: int = 4) -> float:
            values = steps.column(name)[-n:]
            values = values[np.isfinite(values)]
            return float(np.mean(values)) if len(values) else math.nan

        tps, ceiling = recent("tokens_per_s"), recent("ceiling_tps", 1)
        text = translate("Plots", "generation {tps} tok/s (server's counters)").format(tps=f"{tps:,.1f}") \
            if math.isfinite(tps) else notes.get("tokens", "–")
        if math.isfinite(ceiling):
            text += " · " + translate("Plots", "ceiling {tps} ({source})").format(tps=f"{ceiling:,.0f}", source=source)
        self.views["tokens"].show_readout(text)
        gbs, peak_gbs = recent("gbs"), steps.last("peak_bps") / 1e9
        text = notes.get("memory", "–")
        if math.isfinite(gbs):
            text = translate("Plots", "{gbs} GB/s per GPU ({source})").format(gbs=f"{gbs:,.1f}", source=source)
            if math.isfinite(peak_gbs) and peak_gbs > 0:
                text += f" · MBU {100 * gbs / peak_gbs:.0f}%"
        self.views["memory"].show_readout(text)
        flops, mfu = recent("flops"), recent("mfu_pct")
        text = notes.get("compute", "–")
        if math.isfinite(flops):
            scale, unit = flops_unit(flops)
            text = translate("Plots", "{rate} per GPU ({source})").format(rate=format_rate(flops / scale, unit),
                                                                          source=source)
            if math.isfinite(mfu):
                text += f" · MFU {mfu:.0f}%"
        self.views["compute"].show_readout(text)
        ai, ridge = recent("ai", 1), steps.last("peak_flops") / steps.last("peak_bps")
        text = notes.get("roofline", "–")
        if math.isfinite(ai):
            text = f"{ai:.2g} FLOP/B ({source})"
            if math.isfinite(ridge):
                bound = translate("Plots", "compute-bound") if ai >= ridge else translate("Plots", "memory-bound")
                text += ": " + bound
        self.views["roofline"].show_readout(text)
        self.views["timeline"].show_readout(notes.get("timeline", ""))
