"""Pens, fonts and the themed look shared by every plot (the serving panel's too), and the number
formats of axes and readouts."""
from __future__ import annotations

import math

import pyqtgraph as pg
from PySide6.QtCore import QRectF, Qt
from PySide6.QtGui import QColor, QFont, QGuiApplication

from app.i18n import QT_TRANSLATE_NOOP
from app.theme import Theme

# One pen object for "no outline": pyqtgraph's symbol atlas caches a rendered symbol per (pen, brush)
# object, and `symbolPen=None` makes a new pen at every update, which re-renders every symbol each
# frame and grows the atlas without end.
NO_PEN = pg.mkPen(None)
MIXED_NAME = QT_TRANSLATE_NOOP("Plots", "prefill + decode")  # translate(...) where shown


def configure_pyqtgraph() -> None:
    """How every plot of the app draws (once, before the first plot is made): antialiased lines,
    each drawn as its segments rather than as one path. Qt strokes a 2.5-pixel path through its
    general path stroker, the larger part of a frame's paint; segments take ~25% less CPU a frame
    (`python -m app.frame_bench`), and at the app's ~2 points per pixel the joins look the same."""
    pg.setConfigOptions(antialias=True, segmentedLineMode="on")  # batched steps of new prompts' chunks and running decodes


def device_pixel_ratio() -> float:
    """Device pixels per logical pixel of the screens (2 on a HiDPI screen at scale 2)."""
    app = QGuiApplication.instance()
    return max((screen.devicePixelRatio() for screen in app.screens()), default=1.0) if app is not None else 1.0


def pen(colour: str, width: float = 2.0, dashed: bool = False, dotted: bool = False):
    """A cosmetic pen `width` logical pixels wide: a cosmetic pen's width is in device pixels, so on a
    HiDPI screen (device pixel ratio 2) it is drawn twice as wide, and the curves look as they do at 1x."""
    style = Qt.PenStyle.DashLine if dashed else Qt.PenStyle.DotLine if dotted else Qt.PenStyle.SolidLine
    p = pg.mkPen(QColor(colour), width=width * device_pixel_ratio(), style=style)
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
    legend.base_pt = t.font_pt - legend_smaller
    plot.legend = legend
    if plot.titleLabel in _layout_items(plot):
        plot.layout.removeItem(plot.titleLabel)
        plot.titleLabel.setVisible(False)
    plot.layout.addItem(legend, 0, 1, alignment=Qt.AlignmentFlag.AlignLeft)
    plot.layout.setRowMinimumHeight(0, 0)
    plot.layout.setRowMaximumHeight(0, 10_000)
    return plot


class _Legend(pg.LegendItem):
    """A legend placed by its plot's layout, in the row above the data, its entries flowing left to
    right and wrapping at `room_px` (a long settings label takes a line, short ones share one).
    Entries are placed by hand, not by the legend's grid; its height is what they take."""
    room_px = 10_000.0
    GAP_PX = 14.0

    def updateSize(self) -> None:
        self.updateGeometry()

    def _addItemToLayout(self, sample, label) -> None:
        sample.setParentItem(self)
        label.setParentItem(self)
        self.relayout()

    def _removeItemFromLayout(self, *items) -> None:
        for item in items:
            item.close()
            scene = item.scene()
            if scene:
                scene.removeItem(item)

    def removeItem(self, item) -> None:
        super().removeItem(item)
        self.relayout()

    def setColumnCount(self, columnCount: int) -> None:
        self.columnCount = max(1, int(columnCount))

    hidden = False

    def set_point_size(self, pt: int) -> None:
        """The entries' type size (and the size of entries added later)."""
        size = f"{pt}pt"
        self.opts["labelTextSize"] = size
        for _, label in self.items:
            if label.opts.get("size") != size:
                label.setText(label.text, size=size)

    def widest_entry(self) -> float:
        return max((24 + label.item.boundingRect().width() for _, label in self.items), default=0.0)

    def set_hidden(self, hidden: bool) -> None:
        """Hidden: out of sight and taking no height (its plot too small for it)."""
        self.hidden = hidden
        self.setVisible(not hidden)
        if hidden:
            self.setMinimumHeight(0)
            self.setMaximumHeight(0)
            self.setPreferredHeight(0)
            self.updateGeometry()

    def relayout(self) -> None:
        x = y = row_h = 0.0
        rows = 0
        for sample, label in self.items:
            text = label.item.boundingRect()
            width = 20 + 4 + text.width()
            if x > 0 and x + width > self.room_px:
                x, y, rows = 0.0, y + row_h, rows + 1
                row_h = 0.0
            height = max(text.height(), 20.0)
            sample.setPos(x, y + (height - 20) / 2)
            label.setGeometry(QRectF(x + 24, y, text.width() + 4, height))
            x += width + self.GAP_PX
            row_h = max(row_h, height - 4)
        self.rowCount = rows + 1 if self.items else 0
        height = y + row_h + 2 if self.items and not self.hidden else 0.0
        self.setMinimumHeight(height)
        self.setMaximumHeight(height)
        self.setPreferredHeight(height)
        self.updateGeometry()


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
