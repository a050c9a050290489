"""The step axis shared by the tokens, memory and compute plots: `StepWindow` (the rows in view this
frame, read once) and `StepPlot` (one line per settings label, a line per setting change)."""
from __future__ import annotations

from functools import cached_property

import numpy as np
import pyqtgraph as pg

from app.live_data import LiveData
from app.plots.style import nice_ceiling, pen
from app.plots.view import PlotView

WINDOW_STEPS = 400


def x_window(n_steps: int, window: int = WINDOW_STEPS) -> tuple[float, float]:
    """The step plots' x range: it jumps a quarter window at a time instead of scrolling every
    frame, so the axes (costly to paint) repaint a few times per window, not 30 times a second."""
    page = window // 4
    if n_steps <= window:  # a short run fills the plot: 50, 100, 200, then the whole window
        return -2.0, float(min(window, max(50.0, nice_ceiling(n_steps * 1.1))))
    first = (n_steps - window + page) // page * page
    return first - 2.0, float(first + window)


class StepWindow:
    """One redraw's view of the step buffer: the x range and the newest rows it shows (the plots
    never get the whole history), each column copied out once for all the plots."""

    def __init__(self, data: LiveData):
        self.data = data
        self.n = data.steps.total
        self.x_lo, self.x_hi = x_window(self.n)
        self.rows = int(self.n - self.x_lo) + 2
        self._columns: dict[str, np.ndarray] = {}
        self.notes = [n for n in data.annotations if n.x >= self.x_lo - 0.5]  # setting changes in view

    def column(self, name: str) -> np.ndarray:
        if name not in self._columns:
            self._columns[name] = self.data.steps.column(name, last=self.rows)
        return self._columns[name]

    @cached_property
    def x(self) -> np.ndarray:
        return self.column("x")

    @cached_property
    def labels(self) -> np.ndarray:
        return self.column("label")

    @cached_property
    def prefill(self) -> np.ndarray:
        """Prefill and mixed steps: their tokens/s count prompt tokens fed, so they are markers, not
        points on the decode line."""
        return self.column("prefill") > 0.5

    @cached_property
    def mixed(self) -> np.ndarray:
        return self.column("mixed") > 0.5

    @cached_property
    def draft(self) -> np.ndarray:
        """A speculative step's draft part: no token of its own (its verify row counts its time)."""
        return self.column("draft") > 0.5

    @cached_property
    def present(self) -> list[int]:
        """Settings labels (codes) with a step in view."""
        return [int(c) for c in np.unique(self.labels[~np.isnan(self.labels)])]


class StepPlot(PlotView):
    def rebuild(self) -> None:
        self.series: dict[int, pg.PlotDataItem] = {}  # settings label code -> its line
        super().rebuild()

    def draw_series(self, frame: StepWindow, values: np.ndarray, mask: np.ndarray | None = None,
                    skip: np.ndarray | None = None) -> None:
        """One line per settings label in view, of `values` where `mask` (all steps if None); rows
        where `skip` are left out altogether (the line joins across them)."""
        for code, item in self.series.items():
            if code not in frame.present and self._set_keys.get(id(item)) != "empty":
                item.setData(x=[], y=[])  # scrolled out of view: cleared once
                self._set_keys[id(item)] = "empty"
        for code in frame.present:
            shown = frame.labels == code
            if mask is not None:
                shown &= mask
            item = self._label_series(code)
            x, y = frame.x, np.where(shown, values, np.nan)
            if skip is not None:
                x, y = x[~skip], y[~skip]
            item.setData(x=x, y=y)
            self._set_keys[id(item)] = None
        self._legend_codes = tuple(sorted(frame.present))
        self.fit_legend()

    # the legend names the settings in view; when room runs out, the newest stay
    def legend_wanted(self) -> tuple:
        return getattr(self, "_legend_codes", ())

    def show_legend_entries(self) -> None:
        legend = self.plot.legend
        wanted = set(self.legend_wanted())
        for code, item in self.series.items():
            listed = legend.getLabel(item) is not None
            if listed and code not in wanted:
                legend.removeItem(item)
            elif not listed and code in wanted:
                legend.addItem(item, self.data.labels[code])

    def spare_legend_entry(self) -> bool:
        legend = self.plot.legend
        listed = sorted(code for code, item in self.series.items() if legend.getLabel(item) is not None)
        if len(listed) <= 1:
            return False
        legend.removeItem(self.series[listed[0]])
        return True

    def _label_series(self, code: int) -> pg.PlotDataItem:
        if code not in self.series:
            label = self.data.labels[code]
            item = pg.PlotDataItem(pen=pen(self.colours.colour(label), 2.5), connect="finite", name=label)
            item.setDownsampling(auto=True, method="peak")
            item.setClipToView(True)
            self.plot.addItem(item)
            self.series[code] = item
        return self.series[code]

    def draw_step_axis(self, frame: StepWindow) -> None:
        self.sync_annotations(frame.notes)
        self.set_range("x", frame.x_lo, frame.x_hi)
        self.place_annotation_labels()
