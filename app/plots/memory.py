"""Memory traffic per step (GB/s, from the cost model and the measured step time) against the
measured and datasheet peaks; NVML's DRAM bandwidth beside it where NVML answers."""
from __future__ import annotations

import numpy as np
import pyqtgraph as pg

from app.i18n import QT_TRANSLATE_NOOP, translate
from app.plots.step_plot import StepPlot, StepWindow
from app.plots.style import nice_ceiling, pen


def cache_roof_gbs(spec) -> float | None:
    """A CPU's last-level cache roof (GB/s), where it has one and the bytes a step must fit to be under it."""
    return getattr(spec, "cache_bandwidth_gbs", None) if getattr(spec, "cache_bytes", None) else None


class MemoryPlot(StepPlot):
    title = QT_TRANSLATE_NOOP("Plots", "Memory traffic")

    def build(self) -> None:
        plot = self.style("GB/s", self.data.x_label)
        # NVML series only where NVML answers: a CPU run shows what is modelled, and says so.
        self.nvml = bool(self.hardware is not None and self.hardware.nvml)
        self.dram_item = pg.PlotDataItem(pen=pen(self.theme.text, 2, dotted=True), connect="finite",
                                         name=translate("Plots", "DRAM bandwidth (NVML GPM)") if self.nvml else None)
        if self.nvml:
            plot.addItem(self.dram_item)

    def draw(self, frame: StepWindow) -> None:
        self.draw_series(frame, frame.column("gbs"))
        spec, hw = self.hardware, self.data.hardware
        if self.nvml and hw.total:
            bandwidth_gbs = spec.spec_bandwidth_gbs or spec.peak_bandwidth_gbs
            dram_pct = hw.column("dram_bw_util_pct", last=frame.rows * 8)
            self.set_if_changed(self.dram_item, hw.total, hw.column("x", last=frame.rows * 8),
                                dram_pct / 100 * bandwidth_gbs)
        if spec is not None:
            self._draw_peaks(spec)
        self.draw_step_axis(frame)

    def _draw_peaks(self, spec) -> None:
        t = self.theme
        measured, spec_bw = spec.measured_bandwidth_gbs, spec.spec_bandwidth_gbs
        measured_text = translate("Plots", "measured peak {gbs} GB/s").format(gbs=f"{measured:.0f}") if measured else ""
        self.hline("measured_bw", measured, measured_text, t.peak)
        spec_text = (translate("Plots", "spec peak {gbs} GB/s (datasheet)").format(gbs=f"{spec_bw:.0f}")
                     if spec_bw else "")
        self.hline("spec_bw", spec_bw, spec_text, t.spec_peak)
        # a CPU's last-level cache roof: the one a step whose bytes fit it is measured against
        cache_bw = cache_roof_gbs(spec)
        cache_text = translate("Plots", "last-level cache {gbs} GB/s (steps up to {mib} MiB)").format(
            gbs=f"{cache_bw:.0f}", mib=f"{spec.cache_bytes / 2**20:.0f}") if cache_bw else ""
        cache_short = translate("Plots", "cache {gbs} GB/s").format(gbs=f"{cache_bw:.0f}") if cache_bw else ""
        self.hline("cache_bw", cache_bw, cache_text, t.spec_peak, short=cache_short)
        gbs = self.data.steps.column("gbs")
        top_gbs = max(measured or 0, spec_bw or 0, cache_bw or 0, float(np.nanmax(gbs)) if np.isfinite(gbs).any() else 0)
        self.set_range("y", 0, nice_ceiling(1.4 * max(top_gbs, 1e-6)))  # headroom for the legend

    def readout(self) -> str | None:
        steps = self.data.steps
        gbs = steps.column("gbs", last=8)
        peak_gbs = steps.last("peak_bps") / 1e9
        cache_bw = cache_roof_gbs(self.hardware)
        memory_gbs = getattr(self.hardware, "peak_bandwidth_gbs", 0.0) or 0.0
        if cache_bw and steps.last("cache_roof") == 1.0:
            # the step's bytes fit the last-level cache (or lie where it gives out, under a read of their
            # size: engine/hardware/roof.py Roof.level_for): its roof is the cache's, and the readout says so
            return translate("Plots", "{gbs} GB/s (model) · {pct}% of the cache roof").format(
                gbs=f"{np.mean(gbs):.1f}", pct=f"{100 * np.mean(gbs) / peak_gbs:.0f}")
        if memory_gbs and abs(peak_gbs / memory_gbs - 1) > 0.01:
            # a read of the step's size ran a little faster than the memory roof's own (part of it from
            # the cache, engine/hardware/roof.py knee_curve): the figure names the roof it is a share of
            return translate("Plots", "{gbs} GB/s (model) · {pct}% of {roof} GB/s").format(
                gbs=f"{np.mean(gbs):.1f}", pct=f"{100 * np.mean(gbs) / peak_gbs:.0f}", roof=f"{peak_gbs:.0f}")
        return translate("Plots", "{gbs} GB/s (model) · {pct}% of peak").format(
            gbs=f"{np.mean(gbs):.1f}", pct=f"{100 * np.mean(gbs) / peak_gbs:.0f}")
