"""Tokens/s per step, one line per settings label, under its ceiling (peak bandwidth ÷ bytes per
token, and the roofline's lower ceiling where a step is compute-bound); prefills are markers."""
from __future__ import annotations

import math

import numpy as np
import pyqtgraph as pg
from PySide6.QtGui import QColor

from app.i18n import QT_TRANSLATE_NOOP, translate
from app.plots.step_plot import StepPlot, StepWindow
from app.plots.style import MIXED_NAME, NO_PEN, pen


class TokensPlot(StepPlot):
    title = QT_TRANSLATE_NOOP("Plots", "Tokens/s")

    def build(self) -> None:
        t = self.theme
        plot = self.style(QT_TRANSLATE_NOOP("Plots", "tokens/s (log)"), self.data.x_label)
        plot.setLogMode(y=True)
        self.ceiling_item = pg.PlotDataItem(pen=pen(t.peak, 2, dashed=True), connect="finite",
                                            name=translate("Plots", "ceiling = peak BW ÷ bytes/token"))
        self.prefill_item = pg.PlotDataItem(pen=None, symbol="t1", symbolSize=t.font_pt + 3,
                                            symbolBrush=pg.mkBrush(QColor(t.prefill)), symbolPen=NO_PEN,
                                            name=translate("Plots", "prefill"))
        # continuous batching: steps where new prompts' chunks ride along with running decodes (in the
        # legend only while some are in view: without simulated users there are none)
        self.mixed_item = pg.PlotDataItem(pen=None, symbol="t1", symbolSize=t.font_pt + 3,
                                          symbolBrush=pg.mkBrush(QColor(t.mixed)), symbolPen=NO_PEN)
        # where the step is compute-bound (KV cache off, long prefills) the roofline's ceiling is lower
        self.roof_ceiling_item = pg.PlotDataItem(pen=pen(t.spec_peak, 2, dotted=True), connect="finite",
                                                 name=translate("Plots", "ceiling, compute-bound"))
        for item in (self.ceiling_item, self.roof_ceiling_item, self.prefill_item, self.mixed_item):
            plot.addItem(item)

    def draw(self, frame: StepWindow) -> None:
        # a speculative step's draft row has no tokens of its own: its verify row counts both
        keep = ~frame.draft
        x, prefill, mixed = frame.x[keep], frame.prefill[keep], frame.mixed[keep]
        decode = ~prefill
        tokens_per_s = frame.column("tokens_per_s")
        self.draw_series(frame, tokens_per_s, ~frame.prefill, skip=frame.draft)
        tokens_per_s = tokens_per_s[keep]
        ceiling = frame.column("ceiling_tps")[keep]
        self.ceiling_item.setData(x=x, y=np.where(decode, ceiling, np.nan))
        roof = frame.column("roof_tps")[keep]
        with np.errstate(invalid="ignore"):
            compute_bound = decode & (roof < 0.9 * ceiling)
        self.set_if_changed(self.roof_ceiling_item, (frame.n, True) if compute_bound.any() else "empty",
                            x, np.where(compute_bound, roof, np.nan))
        for item, mask in ((self.prefill_item, prefill & ~mixed), (self.mixed_item, mixed)):
            self.set_if_changed(item, tuple(x[mask]), x[mask], tokens_per_s[mask])
        legend = self.plot.legend
        if mixed.any() != (legend.getLabel(self.mixed_item) is not None):
            if mixed.any():
                legend.addItem(self.mixed_item, translate("Plots", MIXED_NAME))
            else:
                legend.removeItem(self.mixed_item)
        self.draw_step_axis(frame)
        self._set_y_range(tokens_per_s, ceiling, x >= frame.x_lo)

    def _set_y_range(self, tokens_per_s: np.ndarray, ceiling: np.ndarray, visible: np.ndarray) -> None:
        """Whole decades (log axis), with room above the ceiling for the legend."""
        values = np.concatenate([tokens_per_s[visible], ceiling[visible]])
        values = values[np.isfinite(values) & (values > 0)]
        if len(values):
            self.set_range("y", math.floor(math.log10(values.min()) - 0.15), math.ceil(math.log10(values.max()) + 0.5))

    def readout(self) -> str | None:
        steps = self.data.steps
        decode = (steps.column("prefill", last=64) < 0.5) & (steps.column("draft", last=64) < 0.5)
        recent_tps = steps.column("tokens_per_s", last=64)[decode][-8:]
        if not len(recent_tps):
            return None
        text = translate("Plots", "decode {tps} tok/s").format(tps=f"{np.mean(recent_tps):,.1f}")
        ceiling = steps.column("ceiling_tps", last=64)[decode][-1:]
        if len(ceiling):
            text += " · " + translate("Plots", "ceiling {tps} (model)").format(tps=f"{ceiling[0]:,.0f}")
        tokens = steps.column("tokens_out", last=64)[decode][-8:]
        if (steps.column("verify", last=8) > 0.5).any() and (tokens > 1).any():
            text += " · " + translate("Plots", "{tokens} tokens per weight read").format(
                tokens=f"{np.nanmean(tokens):.1f}")
        return text
