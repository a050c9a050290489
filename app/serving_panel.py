"""The serving panel (batching with simulated users): two live plots over time, from the engine's
per-step `BatchStats` (plain data, kept in `LiveData.serving`):
1. tokens/s: every request together (aggregate) against one request's own decode rate. Batching
   makes the first climb with the batch while the second barely moves: the weights are read once
   per step for every sequence in it.
2. sequences: the batch (running), the queue (waiting) and the simulated users.
Its title carries the latency percentiles (time to first token, inter-token latency) over recently
finished requests and the pre-emption count. `refresh` redraws only when something is new."""
from __future__ import annotations

import math

import numpy as np
import pyqtgraph as pg
from PySide6.QtCore import Qt
from PySide6.QtWidgets import QLabel, QVBoxLayout, QWidget

from app.i18n import QT_TRANSLATE_NOOP, translate
from app.plots.style import nice_ceiling, pen, style_plot
from app.theme import Theme

WINDOW_S = 60.0  # seconds of history shown
POLICIES = {"continuous": QT_TRANSLATE_NOOP("Serving", "continuous batching"),
            "static": QT_TRANSLATE_NOOP("Serving", "static batching")}


def format_ms(seconds: float) -> str:
    if not math.isfinite(seconds):
        return "–"
    return f"{1e3 * seconds:,.0f} ms" if seconds >= 0.01 else f"{1e3 * seconds:.1f} ms"


def latency_readout(last: dict[str, float]) -> str:
    """'TTFT p50 120 ms · p95 480 ms   ITL p50 35 ms · p95 60 ms   pre-empted 2   prefix cache 86%' from
    a row (the last part once users' requests have finished: their prompt tokens taken from earlier prompts)."""
    text = (f"TTFT p50 {format_ms(last['ttft_p50_s'])} · p95 {format_ms(last['ttft_p95_s'])}   "
            f"ITL p50 {format_ms(last['itl_p50_s'])} · p95 {format_ms(last['itl_p95_s'])}   "
            + translate("Serving", "pre-empted {n}").format(n=int(last["preempted"])))
    hit = last.get("prefix_hit_pct", math.nan)
    if math.isfinite(hit):
        text += "   " + translate("Serving", "prefix cache {pct}%").format(pct=f"{hit:.0f}")
    return text


class ServingPanel(QWidget):
    def __init__(self, data, theme: Theme, parent=None):
        super().__init__(parent)
        self.data = data
        self.theme = theme
        self._drawn_version = -1
        self.frames_drawn = 0
        self.compact = False
        self.title = QLabel()
        self.title.setWordWrap(True)
        self.title.setAlignment(Qt.AlignmentFlag.AlignHCenter)
        self.readout = QLabel()
        self.readout.setWordWrap(True)
        self.readout.setAlignment(Qt.AlignmentFlag.AlignHCenter)
        self.rate_plot = pg.PlotWidget()
        self.seq_plot = pg.PlotWidget()
        for widget in (self.rate_plot, self.seq_plot):
            widget.setMenuEnabled(False)
            widget.setMinimumSize(200, 90)
        column = QVBoxLayout(self)
        column.setContentsMargins(4, 3, 4, 2)
        column.setSpacing(2)
        column.addWidget(self.title)
        column.addWidget(self.readout)
        column.addWidget(self.rate_plot, 1)
        column.addWidget(self.seq_plot, 1)
        self._build()

    def _build(self) -> None:
        t = self.theme
        # the plot below names the shared time axis
        # compact (the presenter layout, two short plots): no axis titles, the legends say what is drawn
        rates = style_plot(self.rate_plot, t, "" if self.compact else translate("Serving", "tokens/s"), "", (6, 2),
                           legend_columns=3, legend_smaller=3)
        self.aggregate_item = rates.plot(pen=pen(t.accent, 2.5), name=translate("Serving", "aggregate (all requests)"))
        self.per_request_item = rates.plot(pen=pen(t.prefill, 2), name=translate("Serving", "per request (median)"))
        seqs = style_plot(self.seq_plot, t, "" if self.compact else translate("Serving", "sequences"),
                          "" if self.compact else translate("Serving", "time (s)"), (6, 2), legend_columns=3,
                          legend_smaller=3)
        self.running_item = seqs.plot(pen=pen(t.accent, 2), name=translate("Serving", "batch (running)"), stepMode=None)
        self.waiting_item = seqs.plot(pen=pen(t.spec_peak, 2), name=translate("Serving", "queue (waiting)"))
        self.users_item = seqs.plot(pen=pen(t.muted, 1.5, dashed=True), name=translate("Serving", "users"))
        title = translate("Serving", "Serving: simulated users, batched")
        self.title.setText(f"<span style='color:{t.text}; font-weight:bold'>{title}</span>")
        self.readout.setStyleSheet(f"color: {t.accent}")
        self.readout.setText(translate("Serving", "move the Users slider above 0 to serve simulated users beside "
                                                  "the chat"))
        self._drawn_version = -1

    def set_title(self, text: str) -> None:
        """Another title (attach mode: the server's batch); set_theme gives it its own back."""
        self.title.setText(f"<b>{text}</b>")

    def set_theme(self, theme: Theme) -> None:
        self.theme = theme
        self._build()
        self.refresh(force=True)

    def set_compact(self, compact: bool) -> None:
        """Compact (the presenter layout): the tab names the panel, the legends the lines: no title, no
        axis titles, so the two plots keep their height at 720 pixels with projector fonts."""
        if compact == self.compact:
            return
        self.compact = compact
        self.title.setVisible(not compact)
        for widget in (self.rate_plot, self.seq_plot):
            widget.setMinimumSize(200, 64 if compact else 90)
        self.set_theme(self.theme)

    def refresh(self, force: bool = False) -> bool:
        buffer = self.data.serving
        if (not force and self._drawn_version == self.data.serving_version) or len(buffer) == 0:
            return False
        self._drawn_version = self.data.serving_version
        t = buffer.column("t_s")
        keep = t >= t[-1] - WINDOW_S
        x = t[keep] - t[-1]  # seconds before now (0 = the latest step)
        aggregate = buffer.column("aggregate_tps")[keep]
        self.aggregate_item.setData(x, aggregate, connect="finite")
        self.per_request_item.setData(x, buffer.column("per_request_tps")[keep], connect="finite")
        self.running_item.setData(x, buffer.column("running")[keep])
        self.waiting_item.setData(x, buffer.column("waiting")[keep])
        self.users_item.setData(x, buffer.column("users")[keep])
        last = {name: buffer.last(name) for name in buffer.columns}
        agg, per = last["aggregate_tps"], last["per_request_tps"]
        rate = (translate("Serving", "{agg} tok/s aggregate · {per} per request").format(
            agg=f"{agg:,.1f}", per=f"{per:,.1f}") + "   " if math.isfinite(agg) and math.isfinite(per) else "")
        policy = self.data.serving_policy
        policy = translate("Serving", POLICIES[policy]) if policy in POLICIES else \
            translate("Serving", "{policy} batching").format(policy=policy)
        self.readout.setText(rate + translate("Serving", "{policy} · batch {running} · queue {waiting}").format(
            policy=policy, running=int(last["running"]), waiting=int(last["waiting"])) + "   " + latency_readout(last))
        for widget in (self.rate_plot, self.seq_plot):
            widget.getPlotItem().setXRange(-min(WINDOW_S, max(float(-x[0]), 1.0)), 0, padding=0.02)
        top = nice_ceiling(max(float(np.nanmax(aggregate)) if np.isfinite(aggregate).any() else 1.0, 1.0))
        self.rate_plot.getPlotItem().setYRange(0, top * 1.15, padding=0)
        sequences = [buffer.column(name)[keep] for name in ("running", "waiting", "users")]
        most = max(1.0, *(float(np.nanmax(c)) for c in sequences if np.isfinite(c).any()))
        self.seq_plot.getPlotItem().setYRange(0, most * 1.15, padding=0)
        # two short plots: the y axes label 0 and the top only (at projector fonts pyqtgraph's own ticks
        # wrote "200/150/100/50" over one another in 40 pixels)
        for widget, high in ((self.rate_plot, top), (self.seq_plot, most)):
            widget.getAxis("left").setTicks([[(0.0, "0"), (high, f"{high:,.0f}")]])
        self.frames_drawn += 1
        return True
