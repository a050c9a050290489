"""Speculative decoding's acceptance: the share of each verify step's guesses the target kept, over
the steps with a running mean (`AcceptancePlot`), and how often the i-th guess lands (`PositionPlot`:
a guess counts once it is made; it lands when it and every guess before it are kept). The readouts
say how many tokens each read of the weights produced."""
from __future__ import annotations

import numpy as np
import pyqtgraph as pg
from PySide6.QtGui import QColor

from app.i18n import QT_TRANSLATE_NOOP, translate
from app.plots.step_plot import StepPlot, StepWindow
from app.plots.style import NO_PEN, pen, with_alpha
from app.plots.view import PlotView

RUNNING_MEAN = 16  # verify steps in the running mean
POSITION_STEPS = 256  # the newest verify steps the per-position bars count
MAX_POSITIONS = 8


def verify_rows(data, last: int | None = None) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """(x, guesses, kept, tokens produced) of the verify steps among the newest `last` rows."""
    steps = data.steps
    verify = steps.column("verify", last=last) > 0.5
    return tuple(steps.column(name, last=last)[verify] for name in ("x", "draft_tokens", "accepted", "tokens_out"))


def position_rates(guesses: np.ndarray, kept: np.ndarray, positions: int = MAX_POSITIONS) -> np.ndarray:
    """Per guess position i (1-based): of the steps that made an i-th guess, the share that kept it."""
    made = np.array([(guesses >= i).sum() for i in range(1, positions + 1)], float)
    landed = np.array([((guesses >= i) & (kept >= i)).sum() for i in range(1, positions + 1)], float)
    with np.errstate(invalid="ignore", divide="ignore"):
        return np.where(made > 0, 100 * landed / made, np.nan)


class AcceptancePlot(StepPlot):
    title = QT_TRANSLATE_NOOP("Plots", "Speculation: guesses kept")

    def build(self) -> None:
        t = self.theme
        plot = self.style(QT_TRANSLATE_NOOP("Plots", "guesses kept (%)"), self.data.x_label)
        self.rate_item = pg.PlotDataItem(pen=None, symbol="o", symbolSize=max(5, t.font_pt - 4),
                                         symbolBrush=pg.mkBrush(with_alpha(t.verify, 150)), symbolPen=NO_PEN,
                                         name=translate("Plots", "one verify step"))
        self.mean_item = pg.PlotDataItem(pen=pen(t.verify, 2.5), connect="finite",
                                         name=translate("Plots", "mean of the last {n}").format(n=RUNNING_MEAN))
        plot.addItem(self.rate_item)
        plot.addItem(self.mean_item)
        self.set_range("y", 0, 110)

    def draw(self, frame: StepWindow) -> None:
        x, guesses, kept, _ = verify_rows(self.data, frame.rows)
        rate = 100 * kept / np.maximum(guesses, 1)
        self.set_if_changed(self.rate_item, (frame.n, len(x)), x, rate)
        if len(rate):
            sums = np.cumsum(np.concatenate([[0.0], kept]))
            made = np.cumsum(np.concatenate([[0.0], guesses]))
            lo = np.maximum(np.arange(1, len(rate) + 1) - RUNNING_MEAN, 0)
            hi = np.arange(1, len(rate) + 1)
            mean = 100 * (sums[hi] - sums[lo]) / np.maximum(made[hi] - made[lo], 1)
        else:
            mean = rate
        self.set_if_changed(self.mean_item, (frame.n, len(x)), x, mean)
        self.draw_step_axis(frame)

    def readout(self) -> str | None:
        _, guesses, kept, tokens = verify_rows(self.data, 256)
        guesses, kept, tokens = guesses[-RUNNING_MEAN:], kept[-RUNNING_MEAN:], tokens[-RUNNING_MEAN:]
        if not len(guesses):
            return None
        return translate("Plots", "{pct}% kept · {tokens} tokens per weight read (k = {k})").format(
            pct=f"{100 * kept.sum() / max(guesses.sum(), 1):.0f}", tokens=f"{tokens.mean():.1f}", k=int(guesses[-1]))


class PositionPlot(PlotView):
    title = QT_TRANSLATE_NOOP("Plots", "Speculation: kept by guess position")

    def build(self) -> None:
        t = self.theme
        plot = self.style(QT_TRANSLATE_NOOP("Plots", "kept (%)"), QT_TRANSLATE_NOOP("Plots", "guess position"))
        plot.setDownsampling(auto=False)
        plot.setClipToView(False)
        self.bars = pg.BarGraphItem(x=np.arange(1, MAX_POSITIONS + 1), height=np.zeros(MAX_POSITIONS), width=0.7,
                                    brush=pg.mkBrush(with_alpha(t.verify, 190)), pen=pen(t.verify, 1))
        plot.addItem(self.bars)
        plot.getAxis("bottom").setTicks([[(i, str(i)) for i in range(1, MAX_POSITIONS + 1)]])
        self.set_range("x", 0.4, MAX_POSITIONS + 0.6)
        self.set_range("y", 0, 110)
        self.empty = pg.TextItem("", color=QColor(t.muted), anchor=(0.5, 0.5))
        plot.addItem(self.empty)

    def draw(self, frame) -> None:
        _, guesses, kept, _ = verify_rows(self.data, POSITION_STEPS * 2)
        guesses, kept = guesses[-POSITION_STEPS:], kept[-POSITION_STEPS:]
        rates = position_rates(guesses, kept)
        key = (len(guesses), frame.n)
        if self._set_keys.get("bars") == key:
            return
        self._set_keys["bars"] = key
        self.bars.setOpts(height=np.nan_to_num(rates))
        self.empty.setText("" if len(guesses) else translate("Plots", "no speculative step yet"))
        self.empty.setPos((MAX_POSITIONS + 1) / 2, 55)

    def readout(self) -> str | None:
        _, guesses, kept, _ = verify_rows(self.data, POSITION_STEPS * 2)
        guesses, kept = guesses[-POSITION_STEPS:], kept[-POSITION_STEPS:]
        if not len(guesses):
            return None
        rates = position_rates(guesses, kept)
        k = int(guesses.max())
        if k > 1:
            return translate("Plots", "guess 1 {first}% · guess {k} {last}% (last {n} steps)").format(
                first=f"{rates[0]:.0f}", k=k, last=f"{rates[k - 1]:.0f}", n=len(guesses))
        return translate("Plots", "guess 1 {first}% (last {n} steps)").format(first=f"{rates[0]:.0f}", n=len(guesses))
