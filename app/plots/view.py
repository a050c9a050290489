"""`PlotView`: one live plot in a titled cell, the base of every plot in the grid. It takes the
`LiveData` it draws in `__init__`, builds its items in `build`, draws a frame in `draw` and gives
its title's readout in `readout`; it sets data, ranges and lines only when they change."""
from __future__ import annotations

import math

import numpy as np
import pyqtgraph as pg
from PySide6.QtCore import Qt, QTimer
from PySide6.QtGui import QColor
from PySide6.QtWidgets import QFrame, QVBoxLayout

from app.hardware_strip import SteadyLabel
from app.i18n import translate
from app.live_data import Annotation, LiveData
from app.plots.style import ReadableAxis, device_pixel_ratio, label_font, pen, style_plot, title_html, with_alpha
from app.theme import SettingColours, Theme

LEGEND_SHARE = 0.3  # of a plot's height, the most its legend may take
LEGEND_MIN_PT = 8  # the smallest type a legend shrinks to before it hides
ANNOTATION_SHARE = 0.35  # of a plot's height, where setting-change labels go (at least two rows)


def same_device(a, b) -> bool:
    """Whether two DeviceSpecs describe the same device with the same counters (peaks aside)."""
    return a is not None and b is not None and (a.name, a.kind, a.nvml) == (b.name, b.kind, b.nvml)


class PlotView(QFrame):
    title = ""

    def __init__(self, data: LiveData, theme: Theme, colours: SettingColours, parent=None):
        super().__init__(parent)
        self.data = data
        self.theme = theme
        self.colours = colours
        self.hardware = None  # DeviceSpec, once a model is loaded
        self.setObjectName("panel")
        self.widget = pg.PlotWidget(axisItems={side: ReadableAxis(side) for side in ("left", "bottom")})
        self.widget.setMinimumSize(200, 90)  # small enough for a 720-pixel screen with projector fonts
        self.widget.setMenuEnabled(False)
        # The title is a Qt label above the plot: it wraps in large-font mode, where a pyqtgraph
        # title wider than its plot would push the axes out of view; steady, so a readout that wraps
        # and unwraps as its numbers change does not resize the plot (a full repaint) each time.
        self.title_label = SteadyLabel()
        self.title_label.setAlignment(Qt.AlignmentFlag.AlignHCenter)
        column = QVBoxLayout(self)
        column.setContentsMargins(4, 3, 4, 2)
        column.setSpacing(0)
        column.addWidget(self.title_label)
        column.addWidget(self.widget, 1)
        self.rebuild()

    @property
    def plot(self) -> pg.PlotItem:
        return self.widget.getPlotItem()

    # ---- what each plot defines ----------------------------------------------------------------
    def build(self) -> None:
        """Style the (cleared) plot and add its items."""
        raise NotImplementedError

    def draw(self, frame) -> None:
        """Draw the data; frame: the `StepWindow` of this redraw."""
        raise NotImplementedError

    def readout(self) -> str | None:
        """The numbers beside the title (None: leave them), from a non-empty step buffer."""
        return None

    # ---- life cycle ----------------------------------------------------------------------------
    def rebuild(self) -> None:
        self._ranges: dict[str, tuple[float, float]] = {}
        self._set_keys: dict[object, object] = {}  # what an item last drew: skip setData when unchanged
        self._grid_item: pg.PlotDataItem | None = None
        self._peak_lines: dict[str, pg.InfiniteLine] = {}
        self.annotation_lines: list[pg.InfiniteLine] | None = None  # None: not drawn since the build
        self._drawn_notes: list[Annotation] = []
        self.build()
        self.show_readout()

    def set_theme(self, theme: Theme) -> None:
        self.theme = theme
        self.rebuild()

    def set_hardware(self, spec) -> None:
        """Another device rebuilds the plot. The same device with raised peaks (a CPU engine raises
        its measured peaks when a step beats them) keeps its items: the next frame moves the peak
        lines (a rebuild cost ~90 ms of the GUI thread, several times in a CPU reply's first second)."""
        before, self.hardware = self.hardware, spec
        if not same_device(before, spec):
            self.rebuild()

    def show_readout(self, readout: str = "") -> None:
        self.title_label.setText(title_html(self.theme, translate("Plots", self.title), readout))

    def style(self, left: str, bottom: str, legend_offset=(6, 4), legend_columns: int = 2) -> pg.PlotItem:
        plot = style_plot(self.widget, self.theme, translate("Plots", left), translate("Plots", bottom), legend_offset,
                          legend_columns)
        plot.setDownsampling(auto=True, mode="peak")
        plot.setClipToView(True)
        return plot

    # ---- cheap redraws -------------------------------------------------------------------------
    def set_if_changed(self, item: pg.PlotDataItem, key, x, y) -> None:
        """setData only when `key` (what the data depends on) changed: each call re-renders the item."""
        if self._set_keys.get(id(item)) == key:
            return
        self._set_keys[id(item)] = key
        item.setData(x=x, y=y)

    def set_range(self, axis: str, lo: float, hi: float) -> None:
        """Set a view range only when it changes (each change repaints the axes)."""
        if axis == "y":  # a little room above the top tick, so its label is not cut in half
            hi = hi + 0.04 * (hi - lo)
        if self._ranges.get(axis) == (lo, hi) or not (math.isfinite(lo) and math.isfinite(hi) and hi > lo):
            return
        self._ranges[axis] = (lo, hi)
        (self.plot.setXRange if axis == "x" else self.plot.setYRange)(lo, hi, padding=0)
        self._update_grid()

    def _update_grid(self) -> None:
        """Grid lines at the axes' major ticks, all in one path item in the view. (pyqtgraph's own
        grid is drawn by the axes, so every curve update would repaint the axes and their labels;
        one line item per grid line costs a Python paint call each.)"""
        plot = self.plot
        view = plot.getViewBox()
        (x_lo, x_hi), (y_lo, y_hi) = view.viewRange()
        bottom, left = plot.getAxis("bottom"), plot.getAxis("left")
        x_ticks = bottom.tickValues(x_lo, x_hi, max(view.width(), 150))
        y_ticks = left.tickValues(y_lo, y_hi, max(view.height(), 150))
        xs = [v for v in (x_ticks[0][1] if x_ticks else []) if x_lo <= v <= x_hi]
        ys = [v for v in (y_ticks[0][1] if y_ticks else []) if y_lo <= v <= y_hi]
        gx = np.array([c for v in xs for c in (v, v)] + [c for _ in ys for c in (x_lo, x_hi)], float)
        gy = np.array([c for _ in xs for c in (y_lo, y_hi)] + [c for v in ys for c in (v, v)], float)
        if bottom.logMode:  # the item takes data coordinates; a log axis's view is log10 of them
            gx = 10.0 ** gx
        if left.logMode:
            gy = 10.0 ** gy
        if self._grid_item is None:
            grid_pen = pg.mkPen(with_alpha(self.theme.muted, int(255 * self.theme.grid_alpha)), width=device_pixel_ratio())
            grid_pen.setCosmetic(True)
            self._grid_item = pg.PlotDataItem(pen=grid_pen, connect="pairs")
            self._grid_item.setZValue(-20)
            plot.addItem(self._grid_item, ignoreBounds=True)
            self._grid_item.setClipToView(False)
            self._grid_item.setDownsampling(auto=False)
        self._grid_item.setData(x=gx, y=gy, connect="pairs")

    def hline(self, key: str, y: float | None, text: str, colour: str, short: str = "") -> None:
        """A dashed horizontal peak line with its label, or hidden when y is None; `short`: the label
        where the whole one does not fit (large fonts on a small screen), before it hides."""
        line = self._peak_lines.get(key)
        if line is None:
            line = pg.InfiniteLine(angle=0, pen=pen(colour, 2, dashed=True), movable=False, label=text,
                                   labelOpts={"position": 0.98, "color": QColor(colour), "anchors": [(1, 1), (1, 1)],
                                              "fill": with_alpha(self.theme.panel, 200)})
            line.label.setFont(label_font(self.theme))
            line.setZValue(45)  # its label over the setting-change lines (40) that cross it
            self.plot.addItem(line, ignoreBounds=False)
            self._peak_lines[key] = line
        if self._set_keys.get(id(line)) == (y, text, short):
            return
        self._set_keys[id(line)] = (y, text, short)
        if y is None or not math.isfinite(y):
            line.setVisible(False)
            return
        line.setVisible(True)
        line.setPos(y)
        line.label.setFormat(text)
        line.texts = (text, short) if short else (text,)
        self.fit_peak_labels()

    def fit_peak_labels(self) -> None:
        """A peak line's label wider than the plot takes smaller type, then its short form, then
        hides (the line stays, and the legend or the strip names it): a label is never cut at the
        plot's edge."""
        width = self.plot.getViewBox().sceneBoundingRect().width()
        if width < 20:
            return
        for line in self._peak_lines.values():
            if not line.isVisible():
                continue
            fits = False
            for text in getattr(line, "texts", (line.label.format,)):
                line.label.setFormat(text)
                for smaller in (2, 4):
                    line.label.setFont(label_font(self.theme, smaller))
                    if fits := _text_size(line.label)[0] <= 0.96 * width:
                        break
                if fits:
                    break
            line.label.setVisible(fits)

    def sync_annotations(self, notes: list[Annotation]) -> None:
        """One labelled vertical line per setting change, at the step where it took effect."""
        if notes == self._drawn_notes and self.annotation_lines is not None:
            return
        for line in self.annotation_lines or []:
            self.plot.removeItem(line)
        self.annotation_lines = []
        for note in notes:
            colour = self.colours.colour(note.label)
            line = pg.InfiniteLine(pos=note.x - 0.5, angle=90, pen=pen(colour, 2), movable=False,
                                   label=f"▸ {note.text}",
                                   labelOpts={"position": 0.9, "color": QColor(colour),
                                              "fill": with_alpha(self.theme.panel, 220),
                                              "anchors": [(0, 0.5), (0, 0.5)]})
            line.setZValue(40)
            line.label.setFont(label_font(self.theme))
            line.note = note
            self.plot.addItem(line, ignoreBounds=True)
            self.annotation_lines.append(line)
        self._drawn_notes = notes

    def place_annotation_labels(self) -> None:
        """Lay the setting-change labels out in rows from the top (in ANNOTATION_SHARE of the plot)
        so that no two overlap: the newest first, each in the highest row with room; a label that
        would run past the right edge hangs left of its line; one that finds no room, or whose line
        is outside the x range, is hidden (its line stays)."""
        lines = [line for line in self.annotation_lines or [] if line.isVisible()]
        view = self.plot.getViewBox()
        rect = view.sceneBoundingRect()
        (x_lo, x_hi), _ = view.viewRange()
        key = (tuple((id(line), line.value()) for line in lines), x_lo, x_hi, rect.width(), rect.height())
        if not lines or self._set_keys.get("annotation_labels") == key or rect.width() < 20 or x_hi <= x_lo:
            return
        self._set_keys["annotation_labels"] = key
        gap = 6.0
        label_h = max(_text_size(line.label)[1] for line in lines)
        # the rows stay in the top of the plot, the headroom the y ranges leave above the data: a
        # plot too short for a row of them shows the lines alone
        rows = int(ANNOTATION_SHARE * rect.height() // (label_h + 2))
        free_left = [math.inf] * rows  # per row, where the labels already placed (to the right) begin
        blocked = self._peak_label_spans(rect, label_h)  # per row, the peak lines' labels (x spans)
        for line in sorted(lines, key=lambda line: line.value(), reverse=True):
            width = _text_size(line.label)[0]
            x_px = rect.left() + (line.value() - x_lo) / (x_hi - x_lo) * rect.width()
            if not rect.left() <= x_px <= rect.right():  # its line is off the plot (a change after the last step)
                line.label.setVisible(False)
                continue
            hang_left = x_px + width > rect.right() - 2 and x_px - width >= rect.left()
            start, end = (x_px - width, x_px) if hang_left else (x_px, x_px + width)
            row = next((r for r in range(rows) if end + gap <= free_left[r] and not any(
                start < b_end and b_start < end for b_start, b_end in blocked.get(r, ()))), None)
            if row is None:
                line.label.setVisible(False)
                continue
            free_left[row] = start
            anchor = (1, 0.5) if hang_left else (0, 0.5)
            line.label.anchors = [anchor, anchor]
            line.label.setVisible(True)
            line.label.setPosition(1 - ((row + 0.5) * (label_h + 2) + 4) / rect.height())

    def _peak_label_spans(self, rect, label_h: float) -> dict[int, list[tuple[float, float]]]:
        """The rows (as place_annotation_labels counts them) a peak line's label sits in, with its
        x span in pixels: a setting's label never lands on one."""
        spans: dict[int, list[tuple[float, float]]] = {}
        (_, _), (y_lo, y_hi) = self.plot.getViewBox().viewRange()
        log_y = self.plot.getAxis("left").logMode
        for line in self._peak_lines.values():
            if not line.isVisible() or y_hi <= y_lo:
                continue
            y = math.log10(line.value()) if log_y and line.value() > 0 else line.value()
            bottom = rect.top() + (y_hi - y) / (y_hi - y_lo) * rect.height()  # the label sits above its line
            width = line.label.boundingRect().width()
            right = rect.left() + 0.98 * rect.width()
            for row in range(int(max(0, bottom - line.label.boundingRect().height() - rect.top() - 4) // (label_h + 2)),
                             int(max(0, bottom - rect.top() - 4) // (label_h + 2)) + 1):
                spans.setdefault(row, []).append((right - width, right))
        return spans

    def fit_legend(self) -> None:
        """Flow the legend's entries into the plot's width, in at most LEGEND_SHARE of its height:
        past that, `spare_legend_entry` takes out what the plot can spare (the oldest settings: their
        labelled change lines stay), then its type shrinks (to LEGEND_MIN_PT), and a legend that still
        does not fit is hidden: it never takes the curves' room, nor runs past the plot's edge."""
        legend = self.plot.legend
        if legend is None:
            return
        room = self.plot.getViewBox().width() or self.widget.width() - 80
        key = (self.legend_wanted(), tuple(label.text for _, label in legend.items), room, self.widget.height(),
               self.theme.font_pt)
        if self._set_keys.get("legend") == key:
            return
        self.show_legend_entries()
        legend.room_px = max(room, 100.0)
        allowed = LEGEND_SHARE * self.widget.height()
        base_pt = getattr(legend, "base_pt", self.theme.font_pt - 2)
        legend.set_hidden(False)
        legend.set_point_size(base_pt)
        legend.relayout()
        while legend.maximumHeight() > allowed and self.spare_legend_entry():
            legend.relayout()
        pt = base_pt
        while (legend.maximumHeight() > allowed or legend.widest_entry() > legend.room_px) and pt > LEGEND_MIN_PT:
            pt -= 1
            legend.set_point_size(pt)
            legend.relayout()
        legend.set_hidden(legend.maximumHeight() > allowed or legend.widest_entry() > legend.room_px)
        # the plot's layout at once, not at its posted request: a paint in between (a frame, a grab)
        # drew a legend that had just gained its first row over the top of the data
        self.plot.layout.activate()
        key = (self.legend_wanted(), tuple(label.text for _, label in legend.items), room, self.widget.height(),
               self.theme.font_pt)
        self._set_keys["legend"] = key

    def legend_wanted(self) -> tuple:
        """What the legend should list beyond its fixed entries (a plot with changing entries overrides)."""
        return ()

    def show_legend_entries(self) -> None:
        """Put every wanted entry in the legend (before fit_legend spares any)."""

    def spare_legend_entry(self) -> bool:
        """Take one entry out of a legend too tall for its plot; False: none can go."""
        return False

    def resizeEvent(self, event) -> None:
        super().resizeEvent(event)
        QTimer.singleShot(0, self, self._after_resize)

    def fit_axis_labels(self) -> None:
        """An axis's label longer than its side (the left one on a short plot) takes smaller type,
        then hides: its numbers keep the room, and the title says what is plotted."""
        view = self.plot.getViewBox()
        for side, room in (("left", view.height()), ("bottom", view.width())):
            axis = self.plot.getAxis(side)
            text = axis.labelText
            if not text or room < 20:
                continue
            key = (text, int(room), self.theme.font_pt)
            if self._set_keys.get(("axis", side)) == key:
                continue
            self._set_keys[("axis", side)] = key
            for smaller in (1, 3):
                axis.setLabel(text, **{**axis.labelStyle, "font-size": f"{max(self.theme.font_pt - smaller, 8)}pt"})
                if axis.label.boundingRect().width() <= room:
                    break
            axis.showLabel(axis.label.boundingRect().width() <= room)

    def _after_resize(self) -> None:
        self.fit_legend()
        self.fit_peak_labels()
        self.fit_axis_labels()
        if self.annotation_lines:
            self.place_annotation_labels()


def _text_size(label) -> tuple[float, float]:
    """A label's size in pixels, as it will paint: its text document's own box. The TextItem's
    boundingRect only takes a new font (F10) or the view's scale at the next paint."""
    box = label.textItem.boundingRect()
    return box.width(), box.height()
