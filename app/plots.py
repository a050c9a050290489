"""The live plots. `LiveData` is the GUI's record of the run (ring buffers of engine steps and
hardware samples, setting-change annotations); `PlotsPanel` draws it on a timer, never per token.

Plots: tokens/s with the memory ceiling, memory throughput against peak, compute against peak,
the roofline, and the phase timeline of the current reply. Step plots share the x axis "step";
every setting change is a labelled vertical line on each of them and on the timeline."""
from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
import pyqtgraph as pg
from PySide6.QtCore import Qt
from PySide6.QtGui import QColor, QFont
from PySide6.QtWidgets import QFrame, QGridLayout, QLabel, QVBoxLayout, QWidget

from app.ringbuffer import RingBuffer
from app.theme import SettingColours, Theme

STEP_CAPACITY = 8192  # steps kept (the step plots show the last WINDOW_STEPS of them)
HW_CAPACITY = 4096
WINDOW_STEPS = 400
TRAIL_STEPS = 24  # roofline dots left behind by the live one
MAX_ANNOTATIONS = 64
# One pen object for "no outline": pyqtgraph's symbol atlas caches a rendered symbol per (pen, brush)
# object, and `symbolPen=None` makes a new pen at every update, so each frame re-rendered the
# roofline's trail and the atlas grew without end (a frame took 2.6 ms of the 14 for it).
NO_PEN = pg.mkPen(None)

STEP_COLUMNS = ("x", "t_s", "start_s", "prefill", "mixed", "label", "tokens_per_s", "ceiling_tps", "roof_tps", "gbs",
                "flops", "mfu_pct", "ai", "step_ms", "context_len", "peak_flops", "peak_bps")
# timeline bars of the phases that are not a setting's decode: (colour, legend name)
PHASE_STYLE = {"prefill": lambda t: (t.prefill, "prefill"), "mixed": lambda t: (t.mixed, "prefill + decode")}
HW_COLUMNS = ("x", "t_s", "mem_util_pct", "sm_util_pct", "dram_bw_util_pct", "tensor_active_pct")
SERVING_CAPACITY = 8192
SERVING_COLUMNS = ("x", "t_s", "users", "running", "waiting", "aggregate_tps", "per_request_tps", "ttft_p50_s",
                   "ttft_p95_s", "itl_p50_s", "itl_p95_s", "preempted", "finished", "cancelled")


@dataclass(frozen=True)
class Annotation:
    x: float  # step index at which the change took effect
    t_s: float  # time.monotonic() of the change
    text: str  # e.g. "kv cache off"
    label: str  # the settings label after the change (its colour)


class LiveData:
    """Plain numbers the plots draw: no Qt. `version` grows with every change, so a view redraws
    only when something is new."""

    def __init__(self, step_capacity: int = STEP_CAPACITY, hw_capacity: int = HW_CAPACITY):
        self.steps = RingBuffer(step_capacity, STEP_COLUMNS)
        self.hardware = RingBuffer(hw_capacity, HW_COLUMNS)
        self.serving = RingBuffer(SERVING_CAPACITY, SERVING_COLUMNS)  # one row per batched step
        self.serving_policy = ""
        self.serving_version = 0  # the serving panel redraws when this moves
        self.labels: list[str] = []  # settings labels; the "label" column holds indices into it
        self.annotations: list[Annotation] = []
        self.reply_t0: float | None = None  # time.monotonic() when the current reply was sent
        self.reply_t1: float | None = None  # its last step's end (None while it streams)
        self.ttft_s: float | None = None
        self.version = 0
        # where the figures come from, for the readouts: the cost model, or (attach mode) the server
        self.source = "model"
        self.x_label = "step"  # what one row of `steps` is (attach mode: one scrape of the server)
        self.notes: dict[str, str] = {}  # plot name -> why it shows nothing (e.g. the flag to start a server with)

    def label_code(self, label: str) -> int:
        if label not in self.labels:
            self.labels.append(label)
        return self.labels.index(label)

    @property
    def next_x(self) -> int:
        return self.steps.total

    def add_step(self, m) -> None:
        """m: an engine StepMetrics."""
        prefill = m.phase != "decode"  # "prefill", or "mixed": prompt chunks with decode rows
        # batched steps carry other requests' prefills: the person's TTFT then comes with its reply
        if prefill and m.batch_size == 1 and self.reply_t0 is not None and self.ttft_s is None:
            self.ttft_s = m.t_s - self.reply_t0
        self.steps.append(
            x=self.steps.total, t_s=m.t_s, start_s=m.t_s - m.step_s, prefill=1.0 if prefill else 0.0,
            mixed=1.0 if m.phase == "mixed" else 0.0,
            label=self.label_code(m.settings_label), tokens_per_s=m.tokens_per_s,
            ceiling_tps=m.memory_ceiling_tokens_per_s, roof_tps=_finite_or_none(m.predicted_ceiling_tokens_per_s),
            gbs=m.achieved_gbs, flops=m.flops / m.step_s,
            mfu_pct=100 * m.mfu if m.peak_flops == m.peak_flops and m.peak_flops > 0 else None,
            ai=m.arithmetic_intensity, step_ms=1e3 * m.step_s, context_len=m.context_len,
            peak_flops=m.peak_flops, peak_bps=m.peak_bandwidth_bps)
        self.version += 1

    def add_batch_stats(self, b) -> None:
        """b: an engine BatchStats (after the step whose StepMetrics came just before)."""
        self.serving.append(
            x=max(self.steps.total - 1, 0), t_s=b.t_s, users=b.users, running=b.running, waiting=b.waiting,
            aggregate_tps=b.aggregate_tokens_per_s, per_request_tps=b.per_request_tokens_per_s,
            ttft_p50_s=b.ttft_p50_s, ttft_p95_s=b.ttft_p95_s, itl_p50_s=b.itl_p50_s, itl_p95_s=b.itl_p95_s,
            preempted=b.preempted_total, finished=b.finished_total, cancelled=b.cancelled_total)
        self.serving_policy = b.policy
        self.serving_version += 1

    def add_hardware(self, sample) -> None:
        """sample: an engine HardwareSample (NVML); x is the step the engine is at."""
        self.hardware.append(x=max(self.steps.total - 1, 0), t_s=sample.t_s, mem_util_pct=sample.mem_util_pct,
                             sm_util_pct=sample.sm_util_pct, dram_bw_util_pct=sample.dram_bw_util_pct,
                             tensor_active_pct=sample.tensor_active_pct)
        self.version += 1

    def annotate(self, text: str, label: str, t_s: float) -> Annotation:
        note = Annotation(float(self.next_x), t_s, text, label)
        self.annotations = (self.annotations + [note])[-MAX_ANNOTATIONS:]
        self.version += 1
        return note

    def start_reply(self, t0: float) -> None:
        self.reply_t0 = t0
        self.reply_t1 = None
        self.ttft_s = None
        self.version += 1

    def end_reply(self, t1: float) -> None:
        """The reply's last step ended at t1: steps after it (simulated users go on being served)
        are not the reply's."""
        self.reply_t1 = t1
        self.version += 1

    def reply_mask(self) -> np.ndarray:
        """Which steps in the buffer belong to the current (or last) reply: from its send to its
        last step."""
        start = self.steps.column("start_s")
        if self.reply_t0 is None:
            return np.zeros(len(start), bool)
        mask = start >= self.reply_t0 - 1e-3
        if self.reply_t1 is not None:
            mask &= self.steps.column("t_s") <= self.reply_t1 + 1e-6
        return mask

    def clear(self) -> None:
        self.steps.clear()
        self.hardware.clear()
        self.serving.clear()
        self.serving_version += 1
        self.labels = []
        self.annotations = []
        self.reply_t0 = None
        self.reply_t1 = None
        self.ttft_s = None
        self.version += 1


def _finite_or_none(value: float) -> float | None:
    return value if math.isfinite(value) else None


def _pen(colour: str, width: float = 2.0, dashed: bool = False, dotted: bool = False):
    style = Qt.PenStyle.DashLine if dashed else Qt.PenStyle.DotLine if dotted else Qt.PenStyle.SolidLine
    pen = pg.mkPen(QColor(colour), width=width, style=style)
    pen.setCosmetic(True)
    return pen


def _with_alpha(colour: str, alpha: int) -> QColor:
    c = QColor(colour)
    c.setAlpha(alpha)
    return c


def _label_font(theme: Theme, smaller: int = 2) -> QFont:
    font = QFont()
    font.setPointSize(max(theme.font_pt - smaller, 8))
    return font


def flops_unit(peak_flops: float) -> tuple[float, str]:
    """(scale, unit) so a device's FLOP/s read as small numbers: TFLOP/s on a GPU, GFLOP/s on a CPU."""
    if peak_flops >= 1e12:
        return 1e12, "TFLOP/s"
    return 1e9, "GFLOP/s"


def nice_ceiling(value: float) -> float:
    """The next of 1, 2, 5 x 10^k at or above value: axis ends that change rarely."""
    if not value > 0 or not math.isfinite(value):
        return 1.0
    decade = 10 ** math.floor(math.log10(value))
    for step in (1, 2, 5, 10):
        if step * decade >= value * (1 - 1e-9):
            return step * decade
    return 10 * decade


def x_window(n_steps: int, window: int = WINDOW_STEPS) -> tuple[float, float]:
    """The step plots' x range: it jumps a quarter window at a time instead of scrolling every
    frame, so the axes (costly to paint) repaint a few times per window, not 30 times a second."""
    page = window // 4
    if n_steps <= window:  # a short run fills the plot: 50, 100, 200, then the whole window
        return -2.0, float(min(window, max(50.0, nice_ceiling(n_steps * 1.1))))
    first = (n_steps - window + page) // page * page
    return first - 2.0, float(first + window)


MAX_BARS = 600  # more steps than this in one reply are drawn merged: a bar per pixel or so


def merge_bars(x0: np.ndarray, step_ms: np.ndarray, max_bars: int = MAX_BARS):
    """(starts, ends, heights) of the timeline's bars; runs of k neighbouring steps become one bar
    as tall as the tallest of them (peak downsampling: no spike disappears)."""
    x1 = x0 + step_ms / 1e3
    k = -(-len(x0) // max_bars)
    if k <= 1:
        return x0, x1, step_ms
    n = len(x0) // k * k  # whole groups; the ragged tail stays as it is
    merged = (x0[:n:k], x1[k - 1:n:k], step_ms[:n].reshape(-1, k).max(axis=1))
    return tuple(np.concatenate((m, tail)) for m, tail in zip(merged, (x0[n:], x1[n:], step_ms[n:])))


def format_rate(value: float, unit: str) -> str:
    if value != value:
        return "–"
    digits = 0 if abs(value) >= 100 else 1 if abs(value) >= 10 else 2
    return f"{value:,.{digits}f} {unit}"


def style_plot(widget: pg.PlotWidget, theme: Theme, left: str, bottom: str, legend_offset=(6, 4),
               legend_columns: int = 2, legend_smaller: int = 2) -> pg.PlotItem:
    """A cleared plot in the theme: axis labels with units ("" hides one), fixed view (no mouse,
    no buttons), an empty legend on top. Also the serving panel's plots."""
    t = theme
    widget.setBackground(QColor(t.panel))
    plot = widget.getPlotItem()
    plot.clear()
    if plot.legend is not None:
        plot.legend.scene() and plot.legend.scene().removeItem(plot.legend)
        plot.legend = None
    tick_font = QFont()
    tick_font.setPointSize(max(t.font_pt - 2, 8))
    label_style = {"color": t.text, "font-size": f"{t.font_pt - 1}pt"}
    for side, text in (("left", left), ("bottom", bottom)):
        axis = plot.getAxis(side)
        axis.setPen(_pen(t.muted, 1))
        axis.setTextPen(_pen(t.muted, 1))
        axis.setTickFont(tick_font)
        axis.setLabel(text, **label_style)
        axis.showLabel(bool(text))
    plot.getAxis("left").setWidth(int(3.6 * t.font_pt + 12))
    plot.hideButtons()
    plot.getViewBox().setMouseEnabled(x=False, y=False)
    legend = plot.addLegend(offset=legend_offset, labelTextColor=QColor(t.text),
                            labelTextSize=f"{t.font_pt - legend_smaller}pt", brush=_with_alpha(t.panel, 200),
                            pen=_pen(t.border, 1), verSpacing=-6, colCount=legend_columns)
    legend.setZValue(50)
    return plot


class PlotsPanel(QWidget):
    """Five live plots (and any extra widget, the seed table, in the sixth cell) in a grid."""

    def __init__(self, data: LiveData, theme: Theme, colours: SettingColours, extra: QWidget | None = None,
                 parent=None):
        super().__init__(parent)
        self.data = data
        self.theme = theme
        self.colours = colours
        self.hardware = None  # DeviceSpec, once a model is loaded
        self._drawn_version = -1
        self._readout_version = -1
        self.frames_drawn = 0
        names = ("tokens", "memory", "compute", "roofline", "timeline")
        self.widgets = {name: pg.PlotWidget() for name in names}
        # Titles are Qt labels above the plots: they wrap in large-font mode, where a pyqtgraph
        # title wider than its plot would push the axes out of view.
        self.titles = {name: QLabel() for name in names}
        cells = {}
        for name in names:
            self.widgets[name].setMinimumSize(200, 140)
            self.widgets[name].setMenuEnabled(False)
            self.titles[name].setWordWrap(True)
            self.titles[name].setAlignment(Qt.AlignmentFlag.AlignHCenter)
            cell = QFrame()
            cell.setObjectName("panel")
            column = QVBoxLayout(cell)
            column.setContentsMargins(4, 3, 4, 2)
            column.setSpacing(0)
            column.addWidget(self.titles[name])
            column.addWidget(self.widgets[name], 1)
            cells[name] = cell
        grid = QGridLayout(self)
        grid.setContentsMargins(0, 0, 0, 0)
        grid.setSpacing(6)
        grid.addWidget(cells["tokens"], 0, 0)
        grid.addWidget(cells["memory"], 0, 1)
        grid.addWidget(cells["compute"], 1, 0)
        grid.addWidget(cells["roofline"], 1, 1)
        grid.addWidget(cells["timeline"], 2, 0)
        self.extra = extra
        self._grid = grid
        self._cells = cells
        if extra is not None:
            grid.addWidget(extra, 2, 1)
        for row in range(3):
            grid.setRowStretch(row, 1)
        for col in range(2):
            grid.setColumnStretch(col, 1)
        self._build()

    def set_extra_visible(self, visible: bool) -> None:
        """Show or hide the sixth cell (the seed table); the timeline takes the row when hidden."""
        if self.extra is None:
            return
        self.extra.setVisible(visible)
        timeline = self._cells["timeline"]
        self._grid.removeWidget(timeline)
        self._grid.addWidget(timeline, 2, 0, 1, 1 if visible else 2)

    # ---- building -----------------------------------------------------------------------------
    def _style_plot(self, name: str, left: str, bottom: str, legend_offset=(6, 4), legend_columns: int = 2
                    ) -> pg.PlotItem:
        plot = style_plot(self.widgets[name], self.theme, left, bottom, legend_offset, legend_columns)
        plot.setDownsampling(auto=True, mode="peak")
        plot.setClipToView(True)
        return plot

    def _title(self, name: str, title: str, readout: str = "") -> None:
        t = self.theme
        html = f"<span style='color:{t.text}; font-weight:bold'>{title}</span>"
        if readout:
            html += f"&nbsp;&nbsp;<span style='color:{t.accent}'>{readout}</span>"
        self.titles[name].setText(html)

    def _build(self) -> None:
        t = self.theme
        self._series: dict[str, dict[int, pg.PlotDataItem]] = {"tokens": {}, "memory": {}, "compute": {}}
        self._bars: dict[object, pg.PlotDataItem] = {}
        self._ranges: dict[tuple[str, str], tuple[float, float]] = {}
        self._grid_items: dict[str, pg.PlotDataItem] = {}
        self._set_keys: dict[str, object] = {}  # what an item last drew: skip setData when unchanged
        self._brushes: dict[tuple[str, int], object] = {}
        self._annotation_lines: dict[str, list[pg.InfiniteLine]] = {}
        self._drawn_notes: list[Annotation] = []
        self._peak_lines: dict[str, pg.InfiniteLine] = {}

        tokens = self._style_plot("tokens", "tokens/s (log)", self.data.x_label)
        tokens.setLogMode(y=True)
        self.ceiling_item = pg.PlotDataItem(pen=_pen(t.peak, 2, dashed=True), connect="finite",
                                            name="ceiling = peak BW ÷ bytes/token")
        self.prefill_item = pg.PlotDataItem(pen=None, symbol="t1", symbolSize=t.font_pt + 3,
                                            symbolBrush=pg.mkBrush(QColor(t.prefill)), symbolPen=NO_PEN,
                                            name="prefill")
        # continuous batching: steps where new prompts' chunks ride along with running decodes (in the
        # legend only while some are in view: without simulated users there are none)
        self.mixed_item = pg.PlotDataItem(pen=None, symbol="t1", symbolSize=t.font_pt + 3,
                                          symbolBrush=pg.mkBrush(QColor(t.mixed)), symbolPen=NO_PEN)
        # where the step is compute-bound (KV cache off, long prefills) the roofline's ceiling is lower
        self.roof_ceiling_item = pg.PlotDataItem(pen=_pen(t.spec_peak, 2, dotted=True), connect="finite",
                                                 name="ceiling, compute-bound")
        tokens.addItem(self.ceiling_item)
        tokens.addItem(self.roof_ceiling_item)
        tokens.addItem(self.prefill_item)
        tokens.addItem(self.mixed_item)
        self._title("tokens", "Tokens/s")

        # NVML series only where NVML answers: a CPU run shows what is modelled, and says so.
        nvml = bool(self.hardware is not None and self.hardware.nvml)
        memory = self._style_plot("memory", "GB/s", self.data.x_label)
        self.dram_item = pg.PlotDataItem(pen=_pen(t.text, 2, dotted=True), connect="finite",
                                         name="DRAM bandwidth (NVML GPM)" if nvml else None)
        compute = self._style_plot("compute", "% of peak FLOP/s", self.data.x_label)
        self.sm_item = pg.PlotDataItem(pen=_pen(t.text, 2, dotted=True), connect="finite",
                                       name="SM busy (NVML)" if nvml else None)
        self.tensor_item = pg.PlotDataItem(pen=_pen(t.spec_peak, 2, dotted=True), connect="finite",
                                           name="tensor cores busy (NVML GPM)" if nvml else None)
        if nvml:
            memory.addItem(self.dram_item)
            compute.addItem(self.sm_item)
            compute.addItem(self.tensor_item)
        self._title("memory", "Memory traffic")
        self._title("compute", "Compute")

        roofline = self._style_plot("roofline", "FLOP/s (log)", "arithmetic intensity, FLOP/B (log)",
                                    legend_offset=(-6, -6))
        roofline.setLogMode(x=True, y=True)
        roofline.setClipToView(False)
        roofline.setDownsampling(auto=False)
        self.roof_item = pg.PlotDataItem(pen=_pen(t.peak, 2.5, dashed=True), name="roofline")
        self.ridge_item = pg.PlotDataItem(pen=None, symbol="d", symbolSize=t.font_pt + 4,
                                          symbolBrush=pg.mkBrush(QColor(t.spec_peak)), symbolPen=NO_PEN)
        self.ridge_text = pg.TextItem(color=QColor(t.spec_peak), anchor=(0, 1.1))
        self.ridge_text.setFont(_label_font(t))
        self.trail_item = pg.PlotDataItem(pen=None, symbol="o", symbolSize=t.font_pt - 1, symbolPen=NO_PEN)
        self.dot_item = pg.PlotDataItem(pen=None, symbol="o", symbolSize=t.font_pt + 9,
                                        symbolPen=_pen(t.text, 2), name="this step")
        # the last prefill stays on the chart: it lands right of the ridge, decode on the slope
        self.last_prefill_item = pg.PlotDataItem(pen=None, symbol="t1", symbolSize=t.font_pt + 7,
                                                 symbolBrush=pg.mkBrush(QColor(t.prefill)), symbolPen=_pen(t.text, 1),
                                                 name="last prefill")
        for item in (self.roof_item, self.ridge_item, self.trail_item, self.last_prefill_item, self.dot_item):
            roofline.addItem(item)
        roofline.addItem(self.ridge_text)
        self._title("roofline", "Roofline")

        # one column on the right: the TTFT line's label sits at the top left, where the reply starts
        timeline = self._style_plot("timeline", "step time (ms)", "time since send (s)", legend_offset=(-6, 4),
                                    legend_columns=1)
        timeline.setClipToView(False)
        timeline.setDownsampling(auto=False)  # bar outlines: every corner counts
        self.ttft_line = pg.InfiniteLine(angle=90, pen=_pen(t.prefill, 2, dashed=True), movable=False,
                                         label="", labelOpts={"position": 0.93, "color": QColor(t.prefill),
                                                              "anchors": [(0, 0), (0, 0)]})
        self.ttft_line.label.setFont(_label_font(t))
        self.ttft_line.setVisible(False)
        timeline.addItem(self.ttft_line)
        self._title("timeline", "Phase timeline")
        self._drawn_version = -1
        self._readout_version = -1

    def set_theme(self, theme: Theme) -> None:
        self.theme = theme
        self.colours.set_theme(theme)
        self._build()
        self.refresh(force=True)

    def set_hardware(self, spec) -> None:
        self.hardware = spec
        self._build()

    # ---- helpers ------------------------------------------------------------------------------
    def _set_range(self, plot_name: str, axis: str, lo: float, hi: float) -> None:
        """Set a view range only when it changes (each change repaints the axes)."""
        if axis == "y":  # a little room above the top tick, so its label is not cut in half
            hi = hi + 0.04 * (hi - lo)
        key = (plot_name, axis)
        if self._ranges.get(key) == (lo, hi) or not (math.isfinite(lo) and math.isfinite(hi) and hi > lo):
            return
        self._ranges[key] = (lo, hi)
        view = self.widgets[plot_name].getPlotItem()
        (view.setXRange if axis == "x" else view.setYRange)(lo, hi, padding=0)
        self._update_grid(plot_name)

    def _update_grid(self, plot_name: str) -> None:
        """Grid lines at the axes' major ticks, all in one path item in the view. (pyqtgraph's own
        grid is drawn by the axes, so every curve update would repaint the axes and their labels;
        one line item per grid line costs a Python paint call each.)"""
        plot = self.widgets[plot_name].getPlotItem()
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
        item = self._grid_items.get(plot_name)
        if item is None:
            pen = pg.mkPen(_with_alpha(self.theme.muted, int(255 * self.theme.grid_alpha)), width=1)
            pen.setCosmetic(True)
            item = pg.PlotDataItem(pen=pen, connect="pairs")
            item.setZValue(-20)
            plot.addItem(item, ignoreBounds=True)
            item.setClipToView(False)
            item.setDownsampling(auto=False)
            self._grid_items[plot_name] = item
        item.setData(x=gx, y=gy, connect="pairs")

    def _label_series(self, plot_name: str, code: int) -> pg.PlotDataItem:
        series = self._series[plot_name]
        if code not in series:
            label = self.data.labels[code]
            item = pg.PlotDataItem(pen=_pen(self.colours.colour(label), 2.5), connect="finite", name=label)
            item.setDownsampling(auto=True, method="peak")
            item.setClipToView(True)
            self.widgets[plot_name].getPlotItem().addItem(item)
            series[code] = item
        return series[code]

    def _hline(self, plot_name: str, key: str, y: float | None, text: str, colour: str) -> None:
        """A dashed horizontal peak line with its label, or hidden when y is None."""
        line = self._peak_lines.get(key)
        if line is None:
            line = pg.InfiniteLine(angle=0, pen=_pen(colour, 2, dashed=True), movable=False, label=text,
                                   labelOpts={"position": 0.98, "color": QColor(colour), "anchors": [(1, 1), (1, 1)],
                                              "fill": _with_alpha(self.theme.panel, 200)})
            line.label.setFont(_label_font(self.theme))
            self.widgets[plot_name].getPlotItem().addItem(line, ignoreBounds=False)
            self._peak_lines[key] = line
        if self._set_keys.get(id(line)) == (y, text):
            return
        self._set_keys[id(line)] = (y, text)
        if y is None or not math.isfinite(y):
            line.setVisible(False)
            return
        line.setVisible(True)
        line.setPos(y)
        line.label.setFormat(text)

    def _sync_annotations(self, x_first: float) -> None:
        """One labelled vertical line per setting change on every time plot."""
        notes = [n for n in self.data.annotations if n.x >= x_first - 0.5]
        if notes == self._drawn_notes and self._annotation_lines:
            self._place_timeline_annotations()
            return
        for plot_name, lines in self._annotation_lines.items():
            for line in lines:
                self.widgets[plot_name].getPlotItem().removeItem(line)
        self._annotation_lines = {"tokens": [], "memory": [], "compute": [], "timeline": []}
        for i, note in enumerate(notes):
            colour = self.colours.colour(note.label)
            for plot_name in self._annotation_lines:
                position = (0.6, 0.47, 0.34)[i % 3]
                line = pg.InfiniteLine(pos=note.x - 0.5, angle=90, pen=_pen(colour, 2), movable=False,
                                       label=f"▸ {note.text}",
                                       labelOpts={"position": position, "color": QColor(colour),
                                                  "fill": _with_alpha(self.theme.panel, 220),
                                                  "anchors": [(0, 0.5), (0, 0.5)]})
                line.setZValue(40)
                line.label.setFont(_label_font(self.theme))
                line.note = note
                self.widgets[plot_name].getPlotItem().addItem(line, ignoreBounds=True)
                self._annotation_lines[plot_name].append(line)
        self._drawn_notes = notes
        self._place_timeline_annotations()

    def _place_timeline_annotations(self) -> None:
        t0 = self.data.reply_t0
        for line in self._annotation_lines.get("timeline", []):
            visible = t0 is not None and line.note.t_s >= t0
            line.setVisible(visible)
            if visible:
                line.setPos(line.note.t_s - t0)

    # ---- drawing (the timer calls this ~30 times a second) ------------------------------------
    def refresh(self, force: bool = False) -> bool:
        """Redraw from the ring buffers if anything changed; True if it drew."""
        if not force and self.data.version == self._drawn_version:
            return False
        self._drawn_version = self.data.version
        steps = self.data.steps
        n = steps.total
        x_lo, x_hi = x_window(n)
        visible = int(n - x_lo) + 2  # rows in view: the plots never get the whole history

        def column(name: str) -> np.ndarray:
            return steps.column(name, last=visible)

        def masked(values: np.ndarray, mask: np.ndarray) -> np.ndarray:
            return np.where(mask, values, np.nan)

        x = column("x")
        labels = column("label")
        prefill = column("prefill") > 0.5  # tokens/s of prompt tokens fed: markers, not the decode line
        mixed = column("mixed") > 0.5
        decode = ~prefill
        tokens_per_s = column("tokens_per_s")
        present = {int(c) for c in np.unique(labels[~np.isnan(labels)])}
        for plot_name, values in (("tokens", tokens_per_s), ("memory", column("gbs")),
                                  ("compute", column("mfu_pct"))):
            for code, item in self._series[plot_name].items():
                if code not in present and self._set_keys.get(id(item)) != "empty":
                    item.setData(x=[], y=[])  # scrolled out of view: cleared once
                    self._set_keys[id(item)] = "empty"
            for code in present:
                in_label = labels == code
                mask = in_label & decode if plot_name == "tokens" else in_label
                item = self._label_series(plot_name, code)
                item.setData(x=x, y=masked(values, mask))
                self._set_keys[id(item)] = None
        ceiling = column("ceiling_tps")
        self.ceiling_item.setData(x=x, y=masked(ceiling, decode))
        roof = column("roof_tps")
        with np.errstate(invalid="ignore"):
            compute_bound = decode & (roof < 0.9 * ceiling)
        self._set_if_changed(self.roof_ceiling_item, (n, compute_bound.any()) if compute_bound.any() else "empty",
                             x, masked(roof, compute_bound))
        for item, mask in ((self.prefill_item, prefill & ~mixed), (self.mixed_item, mixed)):
            self._set_if_changed(item, tuple(x[mask]), x[mask], tokens_per_s[mask])
        legend = self.widgets["tokens"].getPlotItem().legend
        if mixed.any() != (legend.getLabel(self.mixed_item) is not None):
            if mixed.any():
                legend.addItem(self.mixed_item, PHASE_STYLE["mixed"](self.theme)[1])
            else:
                legend.removeItem(self.mixed_item)

        hw = self.data.hardware
        spec = self.hardware
        if spec is not None and spec.nvml and hw.total:
            hw_x = hw.column("x", last=visible * 8)
            bandwidth_gbs = spec.spec_bandwidth_gbs or spec.peak_bandwidth_gbs
            dram = hw.column("dram_bw_util_pct", last=visible * 8)
            self._set_if_changed(self.dram_item, hw.total, hw_x, dram / 100 * bandwidth_gbs)
            for item, name in ((self.sm_item, "sm_util_pct"), (self.tensor_item, "tensor_active_pct")):
                self._set_if_changed(item, hw.total, hw_x, hw.column(name, last=visible * 8))

        self._draw_peaks()
        self._draw_roofline()
        self._draw_timeline()
        self._sync_annotations(x_lo)
        for name in ("tokens", "memory", "compute"):
            self._set_range(name, "x", x_lo, x_hi)
        self._set_token_range(tokens_per_s, x, x_lo)
        self.frames_drawn += 1
        return True

    def _set_if_changed(self, item: pg.PlotDataItem, key, x, y) -> None:
        """setData only when `key` (what the data depends on) changed: each call re-renders the item."""
        if self._set_keys.get(id(item)) == key:
            return
        self._set_keys[id(item)] = key
        item.setData(x=x, y=y)

    def _set_token_range(self, tokens_per_s: np.ndarray, x: np.ndarray, x_lo: float) -> None:
        """Whole decades (log axis), with room above the ceiling for the legend."""
        visible = x >= x_lo
        ceiling = self.data.steps.column("ceiling_tps", last=len(x))
        values = np.concatenate([tokens_per_s[visible], ceiling[visible]])
        values = values[np.isfinite(values) & (values > 0)]
        if not len(values):
            return
        self._set_range("tokens", "y", math.floor(math.log10(values.min()) - 0.15),
                        math.ceil(math.log10(values.max()) + 0.5))

    def _draw_peaks(self) -> None:
        spec = self.hardware
        t = self.theme
        if spec is None:
            return
        measured = spec.measured_bandwidth_gbs
        self._hline("memory", "measured_bw", measured, f"measured peak {measured:.0f} GB/s" if measured else "",
                    t.peak)
        spec_bw = spec.spec_bandwidth_gbs
        self._hline("memory", "spec_bw", spec_bw, f"spec peak {spec_bw:.0f} GB/s (datasheet)" if spec_bw else "",
                    t.spec_peak)
        peak_flops = self.data.steps.last("peak_flops")
        dtype = self.data.labels[int(self.data.steps.last("label"))].split(" ")[0] if self.data.steps.total else ""
        if not math.isfinite(peak_flops):
            peak_flops = spec.peak_flops_for("fp32") or float("nan")
            dtype = "fp32"
        scale, unit = flops_unit(peak_flops if math.isfinite(peak_flops) else 0)
        if self.data.source != "model":  # a server's figures: the peak is the datasheet's, for its dtype
            dtype = spec.ridge_dtype or ""
        origin = "measured" if spec.kind == "cpu" or dtype in spec.measured_flops and \
            spec.measured_flops.get(dtype) == peak_flops else "spec"
        self._hline("compute", "peak_flops", 100.0 if math.isfinite(peak_flops) else None,
                    f"peak {peak_flops / scale:.1f} {unit} {dtype} ({origin})", t.peak)
        # headroom above the peak lines for the legend
        gbs = self.data.steps.column("gbs")
        top_gbs = max(measured or 0, spec_bw or 0, float(np.nanmax(gbs)) if np.isfinite(gbs).any() else 0)
        self._set_range("memory", "y", 0, nice_ceiling(1.4 * max(top_gbs, 1e-6)))
        mfu = self.data.steps.column("mfu_pct")
        top_mfu = max(100.0, float(np.nanmax(mfu)) if np.isfinite(mfu).any() else 0)
        self._set_range("compute", "y", 0, nice_ceiling(1.4 * top_mfu))

    def _draw_roofline(self) -> None:
        steps = self.data.steps
        plot = self.widgets["roofline"].getPlotItem()
        if steps.total == 0:
            for item in (self.roof_item, self.ridge_item, self.trail_item, self.dot_item, self.last_prefill_item):
                item.setData(x=[], y=[])
            self.ridge_text.setText("")
            return
        peak_flops, peak_bps = steps.last("peak_flops"), steps.last("peak_bps")
        if not (math.isfinite(peak_flops) and math.isfinite(peak_bps) and peak_bps > 0):
            return
        if not np.isfinite(steps.column("ai", last=TRAIL_STEPS)).any():  # a server without byte counters
            return
        scale, unit = flops_unit(peak_flops)
        if self._set_keys.get("roofline_unit") != unit:
            self._set_keys["roofline_unit"] = unit
            plot.getAxis("left").setLabel(f"{unit} (log)", color=self.theme.text,
                                          **{"font-size": f"{self.theme.font_pt - 1}pt"})
        ridge = peak_flops / peak_bps
        ai = steps.column("ai", last=TRAIL_STEPS)
        flops = steps.column("flops", last=TRAIL_STEPS) / scale
        labels = steps.column("label", last=TRAIL_STEPS)
        prefill = steps.column("prefill", last=TRAIL_STEPS) > 0.5
        mixed = steps.column("mixed", last=TRAIL_STEPS) > 0.5
        known = np.isfinite(ai) & np.isfinite(flops)  # (a server's scrapes: none where it did not answer)
        ai, flops, labels, prefill, mixed = ai[known], flops[known], labels[known], prefill[known], mixed[known]
        all_ai = steps.column("ai")
        lo = 10.0 ** math.floor(math.log10(min(ridge / 30, np.nanmin(ai) / 3)))
        hi = 10.0 ** math.ceil(math.log10(max(ridge * 30, np.nanmax(all_ai) * 3)))
        roof_key = (peak_flops, peak_bps, lo, hi)
        if self._set_keys.get("roof") != roof_key:
            self._set_keys["roof"] = roof_key
            self.roof_item.setData(x=[lo, ridge, hi],
                                   y=[lo * peak_bps / scale, peak_flops / scale, peak_flops / scale])
            self.ridge_item.setData(x=[ridge], y=[peak_flops / scale])
            self.ridge_text.setText(f"ridge {ridge:.2g} FLOP/B")
            self.ridge_text.setPos(math.log10(ridge), math.log10(peak_flops / scale))
        brushes = []
        for i, (code, is_prefill, is_mixed) in enumerate(zip(labels, prefill, mixed)):
            colour = self.theme.mixed if is_mixed else self.theme.prefill if is_prefill else \
                self.colours.colour(self.data.labels[int(code)])
            alpha = int(40 + 200 * (i + 1) / len(labels))
            if (colour, alpha) not in self._brushes:
                self._brushes[(colour, alpha)] = pg.mkBrush(_with_alpha(colour, alpha))
            brushes.append(self._brushes[(colour, alpha)])
        self.trail_item.setData(x=ai[:-1], y=flops[:-1], symbolBrush=brushes[:-1])
        self.dot_item.setData(x=ai[-1:], y=flops[-1:], symbolBrush=brushes[-1:])
        all_prefill = np.flatnonzero(steps.column("prefill") > 0.5)
        last = int(all_prefill[-1]) if len(all_prefill) else None
        self._set_if_changed(self.last_prefill_item, (last, steps.total - len(steps), scale),
                             all_ai[last:last + 1] if last is not None else [],
                             steps.column("flops")[last:last + 1] / scale if last is not None else [])
        y_lo = min(np.nanmin(flops), lo * peak_bps / scale)
        self._set_range("roofline", "x", math.log10(lo), math.log10(hi))
        self._set_range("roofline", "y", math.floor(math.log10(max(y_lo, 1e-12))),
                        math.ceil(math.log10(peak_flops / scale) + 0.7))

    def _draw_timeline(self) -> None:
        steps = self.data.steps
        t0 = self.data.reply_t0
        plot = self.widgets["timeline"].getPlotItem()
        start = steps.column("start_s")
        in_reply = self.data.reply_mask()
        step_ms = steps.column("step_ms")
        prefill = steps.column("prefill") > 0.5
        mixed = steps.column("mixed") > 0.5
        labels = steps.column("label")
        groups: dict[object, np.ndarray] = {"prefill": in_reply & prefill & ~mixed}
        if (in_reply & mixed).any():  # (a bar group in the legend only when the reply has such steps)
            groups["mixed"] = in_reply & mixed
        for code in np.unique(labels[in_reply & ~prefill]):
            groups[int(code)] = in_reply & ~prefill & (labels == code)
        for key in list(self._bars):
            if key not in groups:
                plot.removeItem(self._bars.pop(key))
        for key, mask in groups.items():
            if key not in self._bars:
                colour, name = PHASE_STYLE[key](self.theme) if key in PHASE_STYLE else \
                    (self.colours.colour(self.data.labels[key]), f"decode · {self.data.labels[key]}")
                # One filled outline of all the bars: one path to paint, not one rectangle per step.
                bars = pg.PlotDataItem(pen=_pen(colour, 1), fillLevel=0, brush=_with_alpha(colour, 170), name=name)
                plot.addItem(bars)
                self._bars[key] = bars
            x0, x1, height = merge_bars(start[mask] - (t0 or 0), step_ms[mask])
            zero = np.zeros_like(height)
            self._set_if_changed(self._bars[key], (t0, len(x0), float(x0[-1]) if len(x0) else None),
                                 np.stack([x0, x0, x1, x1], 1).ravel(), np.stack([zero, height, height, zero], 1).ravel())
        ttft = self.data.ttft_s
        if self._set_keys.get("ttft") != ttft:
            self._set_keys["ttft"] = ttft
            self.ttft_line.setVisible(ttft is not None)
            if ttft is not None:
                self.ttft_line.setPos(ttft)
                self.ttft_line.label.setFormat(f"TTFT {1e3 * ttft:.0f} ms")
        if in_reply.any():
            end = float(np.nanmax(steps.column("t_s")[in_reply]) - t0)
            self._set_range("timeline", "x", 0, nice_ceiling(max(end, 0.05) * 1.03))
            self._set_range("timeline", "y", 0, nice_ceiling(float(np.nanmax(step_ms[in_reply])) * 1.35))

    # ---- readouts (a few times a second: numbers that change 30 times a second cannot be read) ---
    def update_readouts(self) -> None:
        if self.data.version == self._readout_version:
            return
        self._readout_version = self.data.version
        steps = self.data.steps
        if steps.total == 0:
            return
        if self.data.source != "model":
            self._server_readouts()
            return
        decode = steps.column("prefill")[-64:] < 0.5
        recent_tps = steps.column("tokens_per_s")[-64:][decode][-8:]
        ceiling = steps.column("ceiling_tps")[-64:][decode][-1:]
        if len(recent_tps):
            text = f"decode {np.mean(recent_tps):,.1f} tok/s"
            if len(ceiling):
                text += f" · ceiling {ceiling[0]:,.0f} (model)"
            self._title("tokens", "Tokens/s", text)
        gbs = steps.column("gbs")[-8:]
        peak_gbs = steps.last("peak_bps") / 1e9
        self._title("memory", "Memory traffic",
                    f"{np.mean(gbs):.1f} GB/s (model) · {100 * np.mean(gbs) / peak_gbs:.0f}% of peak")
        flops = steps.column("flops")[-8:]
        scale, unit = flops_unit(steps.last("peak_flops") if math.isfinite(steps.last("peak_flops")) else 0)
        mfu = steps.column("mfu_pct")[-8:]
        self._title("compute", "Compute", f"{format_rate(np.mean(flops) / scale, unit)} (model) · "
                                          f"MFU {np.nanmean(mfu) if np.isfinite(mfu).any() else float('nan'):.0f}%")
        ai = steps.last("ai")
        ridge = steps.last("peak_flops") / steps.last("peak_bps")
        bound = "compute-bound" if ai >= ridge else "memory-bound"
        phase = "prefill + decode" if steps.last("mixed") > 0.5 else "prefill" if steps.last("prefill") > 0.5 \
            else "decode"
        self._title("roofline", "Roofline", f"{phase} {ai:.2g} FLOP/B: {bound}")
        t0 = self.data.reply_t0
        if t0 is not None:
            in_reply = self.data.reply_mask() & (steps.column("prefill") < 0.5)
            inter = steps.column("step_ms")[in_reply]
            parts = []
            if self.data.ttft_s is not None:
                parts.append(f"TTFT {1e3 * self.data.ttft_s:.0f} ms")
            if len(inter):
                parts.append(f"{np.median(inter):.0f} ms/token (median)")
            self._title("timeline", "Phase timeline", " · ".join(parts))

    def _server_readouts(self) -> None:
        """Attach mode: the latest scrapes' figures, labelled with their source; a plot whose figures
        the server does not publish says why (data.notes) instead of showing a number."""
        steps, source, notes = self.data.steps, self.data.source, self.data.notes

        def recent(name: str, n: int = 4) -> float:
            values = steps.column(name)[-n:]
            values = values[np.isfinite(values)]
            return float(np.mean(values)) if len(values) else math.nan

        tps, ceiling = recent("tokens_per_s"), recent("ceiling_tps", 1)
        text = f"generation {tps:,.1f} tok/s (server's counters)" if math.isfinite(tps) else notes.get("tokens", "–")
        if math.isfinite(ceiling):
            text += f" · ceiling {ceiling:,.0f} ({source})"
        self._title("tokens", "Tokens/s", text)
        gbs, peak_gbs = recent("gbs"), steps.last("peak_bps") / 1e9
        text = notes.get("memory", "–")
        if math.isfinite(gbs):
            text = f"{gbs:,.1f} GB/s per GPU ({source})"
            if math.isfinite(peak_gbs) and peak_gbs > 0:
                text += f" · MBU {100 * gbs / peak_gbs:.0f}%"
        self._title("memory", "Memory traffic", text)
        flops, mfu = recent("flops"), recent("mfu_pct")
        text = notes.get("compute", "–")
        if math.isfinite(flops):
            scale, unit = flops_unit(flops)
            text = f"{format_rate(flops / scale, unit)} per GPU ({source})"
            if math.isfinite(mfu):
                text += f" · MFU {mfu:.0f}%"
        self._title("compute", "Compute", text)
        ai, ridge = recent("ai", 1), steps.last("peak_flops") / steps.last("peak_bps")
        text = notes.get("roofline", "–")
        if math.isfinite(ai):
            text = f"{ai:.2g} FLOP/B ({source})"
            if math.isfinite(ridge):
                text += ": compute-bound" if ai >= ridge else ": memory-bound"
        self._title("roofline", "Roofline", text)
        self._title("timeline", "Phase timeline", notes.get("timeline", ""))
