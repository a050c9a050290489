"""`PlotsPanel`: the grid of the five live plots (and an extra widget, the seed table, in the sixth
cell), and a row of speculation plots (acceptance over time and by guess position) that shows while
the data holds speculative steps. Where the panel is too small for every cell at a readable size
(a small screen, large fonts) the grid holds fewer, larger ones, the most telling first, and a line
names the number keys that bring the others. The window's timer calls `refresh`, which redraws every
plot from one `StepWindow` only when `LiveData` has changed, and `update_readouts` a few times a second."""
from __future__ import annotations

import math

import numpy as np
from PySide6.QtCore import QSize, Qt, Signal
from PySide6.QtWidgets import QGridLayout, QSplitter, QVBoxLayout, QWidget

from app.hardware_strip import OneLineLabel
from app.i18n import QT_TRANSLATE_NOOP, translate
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


# the grid's cells in the order they are laid out (row by row, two to a row; a last cell alone takes
# the row), and the order they are kept in when fewer fit
GRID_ORDER = ("tokens", "memory", "compute", "roofline", "timeline", "extra", "acceptance", "positions")
KEEP_ORDER = ("tokens", "memory", "acceptance", "positions", "roofline", "compute", "timeline", "extra")
GRID_KEYS = {"tokens": 1, "memory": 2, "compute": 3, "roofline": 4, "timeline": 5, "extra": 6, "acceptance": 7,
             "positions": 8}  # app/presenter.py's number keys
# a plot's smallest readable cell, in ems of the theme's type: axes, their numbers, a legend line and
# the curves between them. Projector type is large for the cells' width: titles and legends wrap, so
# it needs another em of height.
READABLE_CELL_EM = {False: (14.0, 11.5), True: (14.0, 12.5)}
GRID_COLUMNS = 2
PLOT_ASPECT = 1.8  # width / height a time plot reads best at
MORE_PLOTS = QT_TRANSLATE_NOOP("Plots", "more plots on the number keys: {plots} (0: this grid)")
SIDE_PANEL = QT_TRANSLATE_NOOP("Plots", "side panel")


def grid_shape(names: list[str], room: QSize, cell: QSize, spacing: int) -> tuple[list[str], int]:
    """The cells (of `names`, in KEEP_ORDER) that fit `room` at no less than `cell` each, and the
    columns they are laid out in: every cell if they fit, else as many as fit, at least one."""
    keep = [name for name in KEEP_ORDER if name in names]
    if not keep:
        return [], GRID_COLUMNS
    rows_fit = max(1, int((room.height() + spacing) // (cell.height() + spacing)))
    options = []
    for columns in range(1, GRID_COLUMNS + 1):
        width = (room.width() - (columns - 1) * spacing) / columns
        if columns > 1 and width < cell.width():
            continue
        n = max(1, min(len(keep), rows_fit * columns))
        rows = math.ceil(n / columns)
        height = max(1.0, (room.height() - (rows - 1) * spacing) / rows)
        # the most cells; among as many, the cells nearest a plot's shape (wider than tall)
        options.append((n, -abs(math.log(max(width, 1.0) / height / PLOT_ASPECT)), columns))
    n, _, columns = max(options)
    return [name for name in GRID_ORDER if name in keep[:n]], min(columns, n)


class PlotsPanel(QWidget):
    cells_changed = Signal()  # the cells on show changed (the grid's, or the presenter's)

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
        self.speculation_visible = False
        self.extra_readable_size = None  # () -> QSize, the smallest the extra cell is readable at (None: any)
        self.grid_cells: list[str] = []  # the cells the grid shows now
        self.grid_columns = GRID_COLUMNS
        self._stack = QSplitter(Qt.Orientation.Vertical, self)  # the presenter's one or two cells
        self._stack.setChildrenCollapsible(False)
        self._stack.setVisible(False)
        self.grid_area = QWidget(self)
        self._grid = QGridLayout(self.grid_area)
        self._grid.setContentsMargins(0, 0, 0, 0)
        self._grid.setSpacing(6)
        self.more_label = OneLineLabel()  # which plots the grid left out, and their keys
        self.more_label.setObjectName("caption")
        self.more_label.setVisible(False)
        column = QVBoxLayout(self)
        column.setContentsMargins(0, 0, 0, 0)
        column.setSpacing(2)
        column.addWidget(self.grid_area, 1)
        column.addWidget(self._stack, 1)
        column.addWidget(self.more_label)
        # the panel's cells follow its size, not the other way round: the grid's minimum is one cell's
        # (else the cells shown at a larger size would hold the window larger than a smaller screen)
        for area in (self.grid_area, self._stack):
            area.setMinimumSize(QSize(160, 120))
        self._layout_grid()

    @property
    def cells(self) -> dict[str, QWidget]:
        return dict(self.views, extra=self.extra) if self.extra is not None else dict(self.views)

    def readable_cell(self) -> QSize:
        """The smallest readable plot cell at the theme's type size (READABLE_CELL_EM)."""
        em = self.theme.font_pt * self.logicalDpiY() / 72
        width_em, height_em = READABLE_CELL_EM[self.theme.large]
        return QSize(int(width_em * em), int(height_em * em))

    def _grid_wanted(self) -> list[str]:
        wanted = [name for name in GRID_ORDER if name in self.cells]
        if not (self._extra_visible and self.extra is not None):
            wanted.remove("extra") if "extra" in wanted else None
        if not self.speculation_visible:
            wanted = [name for name in wanted if name not in ("acceptance", "positions")]
        return wanted

    def _layout_grid(self, force: bool = False) -> None:
        """Lay the grid out for the room it has: every wanted cell, or the most telling that are
        readable (grid_shape); the others are hidden and named, with their keys, below."""
        if self.shown is not None:
            return
        wanted = self._grid_wanted()
        room = self.size()
        if self.more_label.isVisibleTo(self):
            room = QSize(room.width(), room.height() - self.more_label.sizeHint().height() - 2)
        names, columns = grid_shape(wanted, room, self.readable_cell(), self._grid.spacing())
        if not self.isVisible():  # not laid out yet (its size is no screen's): every cell, until it shows
            names, columns = wanted, GRID_COLUMNS
        elif "extra" in names and self.extra_readable_size is not None and not self._extra_fits(names, columns, room):
            wanted.remove("extra")  # its table would not be readable in a cell this small (key 6: larger)
            names, columns = grid_shape(wanted, room, self.readable_cell(), self._grid.spacing())
            wanted.append("extra")
        if not force and names == self.grid_cells and columns == self.grid_columns:
            return
        self.grid_cells, self.grid_columns = names, columns
        cells = self.cells
        for widget in cells.values():
            self._grid.removeWidget(widget)
            if widget.parent() is not self.grid_area:
                widget.setParent(self.grid_area)
        for row in range(self._grid.rowCount()):
            self._grid.setRowStretch(row, 0)
        for i, name in enumerate(names):
            row, col = divmod(i, columns)
            alone = i == len(names) - 1 and col == 0 and columns > 1
            self._grid.addWidget(cells[name], row, col, 1, columns if alone else 1)
            self._grid.setRowStretch(row, 1)
        for col in range(GRID_COLUMNS):
            self._grid.setColumnStretch(col, 1 if col < columns else 0)
        for name, widget in cells.items():
            widget.setVisible(name in names)
        self._drawn_version = self._readout_version = -1  # a plot that comes back draws at the next frame
        left_out = [name for name in wanted if name not in names]
        if left_out:
            plots = " · ".join(f"{GRID_KEYS[name]} {self._cell_title(name)}" for name in left_out)
            self.more_label.set_full_text(translate("Plots", MORE_PLOTS).format(plots=plots))
        self.more_label.setVisible(bool(left_out))
        self.cells_changed.emit()

    def _extra_fits(self, names: list[str], columns: int, room: QSize) -> bool:
        spacing = self._grid.spacing()
        rows = math.ceil(len(names) / columns)
        alone = names[-1] == "extra" and len(names) % columns == 1  # (a last cell alone takes the row)
        width = room.width() if alone else (room.width() - (columns - 1) * spacing) / columns
        height = (room.height() - (rows - 1) * spacing) / rows
        need = self.extra_readable_size()
        return width >= need.width() and height >= need.height()

    def _cell_title(self, name: str) -> str:
        if name == "extra":
            return translate("Plots", SIDE_PANEL)
        return translate("Plots", self.views[name].title)

    def resizeEvent(self, event) -> None:
        super().resizeEvent(event)
        self._layout_grid()

    def showEvent(self, event) -> None:
        super().showEvent(event)
        self._layout_grid()

    def set_extra_visible(self, visible: bool) -> None:
        """Show or hide the sixth cell (the seed table); the timeline takes the row when hidden."""
        if self.extra is None:
            return
        self._extra_visible = visible
        self._layout_grid(force=True)  # (presenting: the choice applies when the grid comes back)

    def arrange(self, shown: list[str] | None) -> None:
        """None: the grid of five plots (and the extra cell). A list of one or two names of
        `views` (or "extra"): only those, stacked in a splitter as large as the panel (the presenter
        layout; the side panel, with its text, gets a little more height than a plot)."""
        cells = self.cells
        self.shown = list(shown) if shown else None
        if self.shown is None:
            self._stack.setVisible(False)
            self.grid_area.setVisible(True)
            self._layout_grid(force=True)  # (emits cells_changed)
            return
        for name, widget in cells.items():
            self._grid.removeWidget(widget)
            if name not in self.shown:
                widget.setVisible(False)
        self.grid_area.setVisible(False)
        self.more_label.setVisible(False)
        for name in self.shown:
            self._stack.addWidget(cells[name])
            cells[name].setVisible(True)
        self._drawn_version = self._readout_version = -1
        # sizes go to the splitter's widgets in its order, and it keeps the cells of earlier layouts
        # (hidden): each gets a size, 0 for those off show (else a shown cell took a hidden one's)
        weights = {cells[name]: 1300 if name == "extra" else 1000 for name in self.shown}
        self._stack.setSizes([weights.get(self._stack.widget(i), 0) for i in range(self._stack.count())])
        self._stack.setVisible(True)
        self.cells_changed.emit()

    def _set_speculation_visible(self, visible: bool) -> None:
        """The speculation row, only while the data holds speculative steps."""
        self.speculation_visible = visible
        self._layout_grid(force=True)

    def set_theme(self, theme: Theme) -> None:
        self.theme = theme
        self.colours.set_theme(theme)
        for view in self.views.values():
            view.set_theme(theme)
        self._layout_grid()  # another type size: another readable cell
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
        for view in self.views.values():
            if view.isVisibleTo(self):  # a plot the grid or the presenter leaves out costs nothing
                view.draw(frame)
                view.fit_legend()  # (a new settings label may have joined the legend)
                # the new view range's transform now, not in the paint: set there, it queued a second
                # paint of the plot area (~1 ms a plot) after every frame whose ranges moved
                view.plot.getViewBox().prepareForPaint()
        self.frames_drawn += 1
        return True

    def update_readouts(self, force: bool = False) -> None:
        """The numbers beside the titles, a few times a second (30 a second cannot be read)."""
        if self.data.version == self._readout_version and not force:
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
