"""Pens, fonts and the themed look shared by every plot (the serving panel's too), and the number
formats of axes and readouts."""
from __future__ import annotations

import math

import pyqtgraph as pg
from PySide6.QtCore import Qt
from PySide6.QtGui import QColor, QFont

from app.theme import Theme

# One pen object for "no outline": pyqtgraph's symbol atlas caches a rendered symbol per (pen, brush)
# object, and `symbolPen=None` makes a new pen at every update, which re-renders every symbol each
# frame and grows the atlas without end.
NO_PEN = pg.mkPen(None)
MIXED_NAME = "prefill + decode"  # batched steps of new prompts' chunks and running decodes


def pen(colour: str, width: float = 2.0, dashed: bool = False, dotted: bool = False):
    style = Qt.PenStyle.DashLine if dashed else Qt.PenStyle.DotLine if dotted else Qt.PenStyle.SolidLine
    p = pg.mkPen(QColor(colour), width=width, style=style)
    p.setCosmetic(True)
    return p


def with_alpha(colour: str, alpha: int) -> QColor:
    c = QColor(colour)
    c.setAlpha(alpha)
    return c


def label_font(theme: Theme, smaller: int = 2) -> QFont:
    font = QFont()
    font.setPointSize(max(theme.font_pt - smaller, 8))
    return font


def title_html(theme: Theme, title: str, readout: str = "") -> str:
    html = f"<span style='color:{theme.text}; font-weight:bold'>{title}</span>"
    if readout:
        html += f"&nbsp;&nbsp;<span style='color:{theme.accent}'>{readout}</span>"
    return html


def style_plot(widget: pg.PlotWidget, theme: Theme, left: str, bottom: str, legend_offset=(6, 4),
               legend_columns: int = 2, legend_smaller: int = 2) -> pg.PlotItem:
    """A cleared plot in the theme: axis labels with units ("" hides one), fixed view (no mouse,
    no buttons), an empty legend on top."""
    t = theme
    widget.setBackground(QColor(t.panel))
    plot = widget.getPlotItem()
    plot.clear()
    if plot.legend is not None:
        if plot.legend in _layout_items(plot):
            plot.layout.removeItem(plot.legend)
        plot.legend.scene() and plot.legend.scene().removeItem(plot.legend)
        plot.legend = None
    tick_font = QFont()
    tick_font.setPointSize(max(t.font_pt - 2, 8))
    label_style = {"color": t.text, "font-size": f"{t.font_pt - 1}pt"}
    for side, text in (("left", left), ("bottom", bottom)):
        axis = plot.getAxis(side)
        axis.setPen(pen(t.muted, 1))
        axis.setTextPen(pen(t.muted, 1))
        axis.setTickFont(tick_font)
        axis.setLabel(text, **label_style)
        axis.showLabel(bool(text))
    plot.getAxis("left").setWidth(int(3.6 * t.font_pt + 12))
    plot.hideButtons()
    plot.getViewBox().setMouseEnabled(x=False, y=False)
    # The legend sits in the plot's own layout, in the row above the data (the title's, unused):
    # it takes room from the view box and so never covers a curve, at any font size.
    legend = _Legend(offset=None, labelTextColor=QColor(t.text), labelTextSize=f"{t.font_pt - legend_smaller}pt",
                           brush=with_alpha(t.panel, 0), pen=pg.mkPen(None), verSpacing=-6, horSpacing=4,
                           colCount=legend_columns, frame=False)
    legend.setParentItem(plot)
    plot.legend = legend
    if plot.titleLabel in _layout_items(plot):
        plot.layout.removeItem(plot.titleLabel)
        plot.titleLabel.setVisible(False)
    plot.layout.addItem(legend, 0, 1, alignment=Qt.AlignmentFlag.AlignLeft)
    plot.layout.setRowMinimumHeight(0, 0)
    plot.layout.setRowMaximumHeight(0, 10_000)
    return plot


class _Legend(pg.LegendItem):
    """A legend placed by its plot's layout: a change of entries asks that layout for room again
    (pyqtgraph's own legend, anchored over the data, sets its geometry itself). Entries fill rows
    of `columnCount`, in the order they came, and close up when one leaves."""

    def updateSize(self) -> None:
        self.layout.invalidate()
        self.updateGeometry()

    def _addItemToLayout(self, sample, label) -> None:
        self._relayout()

    def removeItem(self, item) -> None:
        super().removeItem(item)
        self._relayout()

    def setColumnCount(self, columnCount: int) -> None:
        self.columnCount = max(1, int(columnCount))
        self._relayout()

    def _relayout(self) -> None:
        placed = getattr(self, "_placed", set())
        for sample, label in self.items:
            if id(sample) in placed:
                self.layout.removeItem(sample)
                self.layout.removeItem(label)
        self._placed = {id(sample) for sample, _ in self.items}
        for i, (sample, label) in enumerate(self.items):
            row, col = divmod(i, self.columnCount)
            self.layout.addItem(sample, row, 2 * col, alignment=Qt.AlignmentFlag.AlignVCenter)
            self.layout.addItem(label, row, 2 * col + 1)
        self.rowCount = -(-len(self.items) // self.columnCount)
        self.updateSize()


def _layout_items(plot: pg.PlotItem) -> list:
    layout = plot.layout
    return [layout.itemAt(i) for i in range(layout.count())]


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


def format_rate(value: float, unit: str) -> str:
    if value != value:
        return "–"
    digits = 0 if abs(value) >= 100 else 1 if abs(value) >= 10 else 2
    return f"{value:,.{digits}f} {unit}"
