"""Compute per step as a share of the chip's peak FLOP/s for the step's dtype (MFU), with the peak
line; NVML's SM and tensor-core activity beside it where NVML answers."""
from __future__ import annotations

import math

import numpy as np
import pyqtgraph as pg

from app.i18n import QT_TRANSLATE_NOOP, translate
from app.plots.step_plot import StepPlot, StepWindow
from app.plots.style import flops_unit, format_rate, nice_ceiling, pen


class ComputePlot(StepPlot):
    title = QT_TRANSLATE_NOOP("Plots", "Compute")

    def build(self) -> None:
        t = self.theme
        plot = self.style(QT_TRANSLATE_NOOP("Plots", "% of peak FLOP/s"), self.data.x_label)
        self.nvml = bool(self.hardware is not None and self.hardware.nvml)
        self.sm_item = pg.PlotDataItem(pen=pen(t.text, 2, dotted=True), connect="finite",
                                       name=translate("Plots", "SM busy (NVML)") if self.nvml else None)
        self.tensor_item = pg.PlotDataItem(pen=pen(t.spec_peak, 2, dotted=True), connect="finite",
                                           name=translate("Plots", "tensor cores busy (NVML GPM)")
                                           if self.nvml else None)
        if self.nvml:
            plot.addItem(self.sm_item)
            plot.addItem(self.tensor_item)

    def draw(self, frame: StepWindow) -> None:
        self.draw_series(frame, frame.column("mfu_pct"))
        spec, hw = self.hardware, self.data.hardware
        if self.nvml and hw.total:
            hw_x = hw.column("x", last=frame.rows * 8)
            for item, name in ((self.sm_item, "sm_util_pct"), (self.tensor_item, "tensor_active_pct")):
                self.set_if_changed(item, hw.total, hw_x, hw.column(name, last=frame.rows * 8))
        if spec is not None:
            self._draw_peak(spec)
        self.draw_step_axis(frame)

    def _draw_peak(self, spec) -> None:
        steps = self.data.steps
        peak_flops = steps.last("peak_flops")
        kind = steps.last("peak_kind") if steps.total else math.nan
        dtype = self.data.peak_kinds[int(kind)] if math.isfinite(kind) else ""  # "fp32", "int8/int16 dots + fp32"
        if " dots + " in dtype:  # the C++ step's integer dot products, the rest at a float rate (engine/metrics.py measured)
            dots, rest = dtype.split(" dots + ")
            dtype = translate("Plots", "{dots} dots + {rest}").format(dots=dots, rest=rest)
        if not math.isfinite(peak_flops):
            peak_flops = spec.peak_flops_for("fp32") or float("nan")
            dtype = "fp32"
        scale, unit = flops_unit(peak_flops if math.isfinite(peak_flops) else 0)
        if self.data.source != "model":  # a server's figures: the peak is the datasheet's, for its dtype
            dtype = spec.ridge_dtype or ""
        origin = translate("Plots", "measured") if spec.kind == "cpu" or dtype in spec.measured_flops and \
            spec.measured_flops.get(dtype) == peak_flops else translate("Plots", "spec")
        self.hline("peak_flops", 100.0 if math.isfinite(peak_flops) else None,
                   translate("Plots", "peak {value} {unit} {dtype} ({origin})").format(
                       value=f"{peak_flops / scale:.1f}", unit=unit, dtype=dtype, origin=origin), self.theme.peak)
        mfu = steps.column("mfu_pct")
        top_mfu = max(100.0, float(np.nanmax(mfu)) if np.isfinite(mfu).any() else 0)
        self.set_range("y", 0, nice_ceiling(1.4 * top_mfu))  # headroom for the legend

    def readout(self) -> str | None:
        steps = self.data.steps
        flops = steps.column("flops", last=8)
        peak_flops = steps.last("peak_flops")
        scale, unit = flops_unit(peak_flops if math.isfinite(peak_flops) else 0)
        mfu = steps.column("mfu_pct", last=8)
        mean_mfu = np.nanmean(mfu) if np.isfinite(mfu).any() else float("nan")
        return translate("Plots", "{rate} (model) · MFU {mfu}%").format(rate=format_rate(np.mean(flops) / scale, unit),
                                                                      mfu=f"{mean_mfu:.0f}")
