"""The phase timeline of the current (or last) reply: one bar per step, as long as the step took
and as tall as its time, coloured by phase (speculative steps: draft and verify apart) and settings
label, over time since send; TTFT marked. Its readout: the step's overhead beyond its bytes."""
from __future__ import annotations

import numpy as np
import pyqtgraph as pg
from PySide6.QtGui import QColor

from app.i18n import QT_TRANSLATE_NOOP, translate
from app.plots.step_plot import StepWindow
from app.plots.style import MIXED_NAME, label_font, nice_ceiling, pen, with_alpha
from app.plots.view import PlotView

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


class TimelinePlot(PlotView):
    title = QT_TRANSLATE_NOOP("Plots", "Phase timeline")

    def build(self) -> None:
        t = self.theme
        # one legend column on the right: the TTFT line's label sits at the top left, where the reply starts
        plot = self.style(QT_TRANSLATE_NOOP("Plots", "step time (ms)"),
                          QT_TRANSLATE_NOOP("Plots", "time since send (s)"),
                          legend_offset=(-6, 4), legend_columns=1)
        plot.setClipToView(False)
        plot.setDownsampling(auto=False)  # bar outlines: every corner counts
        self.bars: dict[object, pg.PlotDataItem] = {}  # "prefill", "mixed" or a settings label code
        self.ttft_line = pg.InfiniteLine(angle=90, pen=pen(t.prefill, 2, dashed=True), movable=False,
                                         label="", labelOpts={"position": 0.93, "color": QColor(t.prefill),
                                                              "anchors": [(0, 0), (0, 0)]})
        self.ttft_line.label.setFont(label_font(t))
        self.ttft_line.setVisible(False)
        plot.addItem(self.ttft_line)

    def draw(self, frame: StepWindow) -> None:
        steps = self.data.steps
        t0 = self.data.reply_t0
        start = steps.column("start_s")
        in_reply = self.data.reply_mask()
        step_ms = steps.column("step_ms")
        prefill = steps.column("prefill") > 0.5
        mixed = steps.column("mixed") > 0.5
        labels = steps.column("label")
        speculative = {"draft": steps.column("draft") > 0.5, "verify": steps.column("verify") > 0.5}
        groups: dict[object, np.ndarray] = {"prefill": in_reply & prefill & ~mixed}
        # (a bar group in the legend only when the reply has such steps)
        for name, mask in (("mixed", mixed), *speculative.items()):
            if (in_reply & mask).any():
                groups[name] = in_reply & mask
        plain = in_reply & ~prefill & ~speculative["draft"] & ~speculative["verify"]
        for code in np.unique(labels[plain]):
            groups[int(code)] = plain & (labels == code)
        for key in list(self.bars):
            if key not in groups:
                self.plot.removeItem(self.bars.pop(key))
        for key, mask in groups.items():
            if key not in self.bars:
                self.bars[key] = self._bar_item(key)
            x0, x1, height = merge_bars(start[mask] - (t0 or 0), step_ms[mask])
            zero = np.zeros_like(height)
            outline_x = np.stack([x0, x0, x1, x1], 1).ravel()
            outline_y = np.stack([zero, height, height, zero], 1).ravel()
            self.set_if_changed(self.bars[key], (t0, len(x0), float(x0[-1]) if len(x0) else None), outline_x, outline_y)
        ttft = self.data.ttft_s
        if self._set_keys.get("ttft") != ttft:
            self._set_keys["ttft"] = ttft
            self.ttft_line.setVisible(ttft is not None)
            if ttft is not None:
                self.ttft_line.setPos(ttft)
                self.ttft_line.label.setFormat(f"TTFT {1e3 * ttft:.0f} ms")
        self.sync_annotations(frame.notes)
        self._place_annotations()
        if in_reply.any():
            end = float(np.nanmax(steps.column("t_s")[in_reply]) - t0)
            self.set_range("x", 0, nice_ceiling(max(end, 0.05) * 1.03))
            self.set_range("y", 0, nice_ceiling(float(np.nanmax(step_ms[in_reply])) * 1.35))
        self.place_annotation_labels()

    def _bar_item(self, key) -> pg.PlotDataItem:
        t = self.theme
        if key == "prefill":
            colour, name = t.prefill, translate("Plots", "prefill")
        elif key == "mixed":
            colour, name = t.mixed, translate("Plots", MIXED_NAME)
        elif key == "draft":
            colour, name = t.draft, translate("Plots", "draft (the draft model's guesses)")
        elif key == "verify":
            colour, name = t.verify, translate("Plots", "verify (the target checks k + 1 tokens)")
        else:
            label = self.data.labels[key]
            colour, name = self.colours.colour(label), translate("Plots", "decode · {settings}").format(settings=label)
        # One filled outline of all the bars: one path to paint, not one rectangle per step.
        bars = pg.PlotDataItem(pen=pen(colour, 1), fillLevel=0, brush=with_alpha(colour, 170), name=name)
        self.plot.addItem(bars)
        return bars

    def _place_annotations(self) -> None:
        """Setting changes at their time since send; those before the send are hidden."""
        t0 = self.data.reply_t0
        for line in self.annotation_lines:
            visible = t0 is not None and line.note.t_s >= t0
            line.setVisible(visible)
            if visible:
                line.setPos(line.note.t_s - t0)

    def readout(self) -> str | None:
        if self.data.reply_t0 is None:
            return None
        steps = self.data.steps
        in_reply = self.data.reply_mask() & (steps.column("prefill") < 0.5)
        inter = steps.column("step_ms")[in_reply]
        parts = []
        if self.data.ttft_s is not None:
            parts.append(f"TTFT {1e3 * self.data.ttft_s:.0f} ms")
        if (steps.column("verify")[in_reply] > 0.5).any():  # draft and verify rows make their tokens together
            ms = np.sum(inter) / max(np.nansum(steps.column("tokens_out")[in_reply]), 1)
            parts.append(translate("Plots", "{ms} ms/token").format(ms=f"{ms:.0f}"))
        elif len(inter):
            parts.append(translate("Plots", "{ms} ms/token (median)").format(ms=f"{np.median(inter):.0f}"))
        overhead = steps.column("overhead_ms")[in_reply]
        overhead = overhead[np.isfinite(overhead)]
        if len(overhead):
            parts.append(translate("Plots", "overhead {ms} ms a step beyond its bytes at peak").format(
                ms=f"{np.median(overhead):.1f}"))
        return " · ".join(parts)
