"""The roofline (log-log FLOP/s against arithmetic intensity) with the current step's dot, a
fading trail of the steps before it and the last prefill, which lands right of the ridge."""
from __future__ import annotations

import math

import numpy as np
import pyqtgraph as pg
from PySide6.QtGui import QColor

from app.i18n import QT_TRANSLATE_NOOP, translate
from app.plots.step_plot import StepWindow
from app.plots.style import MIXED_NAME, NO_PEN, flops_unit, label_font, pen, with_alpha
from app.plots.view import PlotView

TRAIL_STEPS = 24  # dots left behind by the live one


class RooflinePlot(PlotView):
    title = QT_TRANSLATE_NOOP("Plots", "Roofline")

    def build(self) -> None:
        t = self.theme
        plot = self.style(QT_TRANSLATE_NOOP("Plots", "FLOP/s (log)"),
                          QT_TRANSLATE_NOOP("Plots", "arithmetic intensity, FLOP/B (log)"), legend_offset=(-6, -6))
        plot.setLogMode(x=True, y=True)
        plot.setClipToView(False)
        plot.setDownsampling(auto=False)
        self._brushes: dict[tuple[str, int], object] = {}  # one brush object per style: see NO_PEN
        self.roof_item = pg.PlotDataItem(pen=pen(t.peak, 2.5, dashed=True), name=translate("Plots", "roofline"))
        self.ridge_item = pg.PlotDataItem(pen=None, symbol="d", symbolSize=t.font_pt + 4,
                                          symbolBrush=pg.mkBrush(QColor(t.spec_peak)), symbolPen=NO_PEN)
        self.ridge_text = pg.TextItem(color=QColor(t.spec_peak), anchor=(0, 1.1))
        self.ridge_text.setFont(label_font(t))
        self.trail_item = pg.PlotDataItem(pen=None, symbol="o", symbolSize=t.font_pt - 1, symbolPen=NO_PEN)
        self.dot_item = pg.PlotDataItem(pen=None, symbol="o", symbolSize=t.font_pt + 9,
                                        symbolPen=pen(t.text, 2), name=translate("Plots", "this step"))
        self.last_prefill_item = pg.PlotDataItem(pen=None, symbol="t1", symbolSize=t.font_pt + 7,
                                                 symbolBrush=pg.mkBrush(QColor(t.prefill)), symbolPen=pen(t.text, 1),
                                                 name=translate("Plots", "last prefill"))
        for item in (self.roof_item, self.ridge_item, self.trail_item, self.last_prefill_item, self.dot_item):
            plot.addItem(item)
        plot.addItem(self.ridge_text)

    def draw(self, frame: StepWindow) -> None:
        steps = self.data.steps
        if steps.total == 0:
            for item in (self.roof_item, self.ridge_item, self.trail_item, self.dot_item, self.last_prefill_item):
                item.setData(x=[], y=[])
            self.ridge_text.setText("")
            return
        peak_flops, peak_bps = steps.last("peak_flops"), steps.last("peak_bps")
        if not (math.isfinite(peak_flops) and math.isfinite(peak_bps) and peak_bps > 0):
            return
        scale, unit = flops_unit(peak_flops)
        if self._set_keys.get("unit") != unit:
            self._set_keys["unit"] = unit
            self.plot.getAxis("left").setLabel(translate("Plots", "{unit} (log)").format(unit=unit),
                                               color=self.theme.text,
                                               **{"font-size": f"{self.theme.font_pt - 1}pt"})
            self._set_keys.pop(("axis", "left"), None)  # (a new label: fit it to the axis again)
            self.fit_axis_labels()
        ridge = peak_flops / peak_bps
        ai = steps.column("ai", last=TRAIL_STEPS)
        flops = steps.column("flops", last=TRAIL_STEPS) / scale
        known = np.isfinite(ai) & np.isfinite(flops)  # (a server's scrapes: none where it did not answer)
        if not known.any():  # a server without byte counters
            return
        all_ai = steps.column("ai")
        lo = 10.0 ** math.floor(math.log10(min(ridge / 30, np.nanmin(ai) / 3)))
        hi = 10.0 ** math.ceil(math.log10(max(ridge * 30, np.nanmax(all_ai) * 3)))
        roof_key = (peak_flops, peak_bps, lo, hi)
        if self._set_keys.get("roof") != roof_key:
            self._set_keys["roof"] = roof_key
            self.roof_item.setData(x=[lo, ridge, hi],
                                   y=[lo * peak_bps / scale, peak_flops / scale, peak_flops / scale])
            self.ridge_item.setData(x=[ridge], y=[peak_flops / scale])
            self.ridge_text.setText(translate("Plots", "ridge {ai} FLOP/B").format(ai=f"{ridge:.2g}"))
            self.ridge_text.setPos(math.log10(ridge), math.log10(peak_flops / scale))
        brushes = [b for b, k in zip(self._trail_brushes(), known) if k]
        ai, flops = ai[known], flops[known]
        self.trail_item.setData(x=ai[:-1], y=flops[:-1], symbolBrush=brushes[:-1])
        self.dot_item.setData(x=ai[-1:], y=flops[-1:], symbolBrush=brushes[-1:])
        all_prefill = np.flatnonzero(steps.column("prefill") > 0.5)
        last = int(all_prefill[-1]) if len(all_prefill) else None
        self.set_if_changed(self.last_prefill_item, (last, steps.total - len(steps), scale),
                            all_ai[last:last + 1] if last is not None else [],
                            steps.column("flops")[last:last + 1] / scale if last is not None else [])
        y_lo = min(np.nanmin(flops), lo * peak_bps / scale)
        if last is not None and np.isfinite(steps.column("flops")[last]) and steps.column("flops")[last] > 0:
            y_lo = min(y_lo, steps.column("flops")[last] / scale)  # the last prefill's marker stays in view
        self.set_range("x", math.log10(lo), math.log10(hi))
        bottom, roof = math.floor(math.log10(max(y_lo, 1e-12))), math.log10(peak_flops / scale)
        self.set_range("y", bottom, math.ceil(roof + self._headroom_decades(roof - bottom)))

    def _headroom_decades(self, span: float) -> float:
        """Decades above the roof for the ridge's label (at least 0.7): a short plot needs more of them
        for the label to stay inside it."""
        height = self.plot.getViewBox().height()
        label_px = 1.2 * self.ridge_text.textItem.boundingRect().height()
        if height <= label_px * 1.5:
            return 0.7
        return max(0.7, label_px * span / (height - label_px))

    def _trail_brushes(self) -> list:
        """The trail's colours (phase, or the step's settings label), fading with age."""
        steps = self.data.steps
        labels = steps.column("label", last=TRAIL_STEPS)
        prefill = steps.column("prefill", last=TRAIL_STEPS) > 0.5
        mixed = steps.column("mixed", last=TRAIL_STEPS) > 0.5
        brushes = []
        for i, (code, is_prefill, is_mixed) in enumerate(zip(labels, prefill, mixed)):
            colour = self.theme.mixed if is_mixed else self.theme.prefill if is_prefill else \
                self.colours.colour(self.data.labels[int(code)])
            alpha = int(40 + 200 * (i + 1) / len(labels))
            if (colour, alpha) not in self._brushes:
                self._brushes[(colour, alpha)] = pg.mkBrush(with_alpha(colour, alpha))
            brushes.append(self._brushes[(colour, alpha)])
        return brushes

    def readout(self) -> str | None:
        steps = self.data.steps
        ai = steps.last("ai")
        bound = translate("Plots", "compute-bound") if ai >= steps.last("peak_flops") / steps.last("peak_bps") \
            else translate("Plots", "memory-bound")
        phase = MIXED_NAME if steps.last("mixed") > 0.5 else QT_TRANSLATE_NOOP("Plots", "prefill") \
            if steps.last("prefill") > 0.5 else QT_TRANSLATE_NOOP("Plots", "decode")
        return translate("Plots", "{phase} {ai} FLOP/B: {bound}").format(phase=translate("Plots", phase),
                                                                         ai=f"{ai:.2g}", bound=bound)
