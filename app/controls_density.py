"""How much room the controls bar takes: where the window is small it folds rather than push the
plots off the screen. In "full" form each caption sits above its buttons; "inline" puts it beside
them; "collapsed" makes each switch one button naming it and the value it runs (a click steps it, as
its key does). Folded, the second row (the numbers, the window's buttons) goes behind "More" (their
keys still work), as it does in the presenter layout (`set_compact`). The window says how tall the
bar may be (`set_height_budget`: BAR_SHARE of its height); the fullest form that fits is shown,
measured from the widgets' size hints in each form (nothing is moved to measure)."""
from __future__ import annotations

from typing import Callable

from PySide6.QtCore import QSize
from PySide6.QtGui import QKeySequence
from PySide6.QtWidgets import QFrame, QWidget

from app.control_table import Slider, Toggle, control_text as _t
from app.control_widgets import Cell, OptionButton
from app.flow_layout import FlowLayout, flow_height
from app.i18n import translate

DENSITIES = ("full", "inline", "collapsed")
BAR_SHARE = 0.2  # of the window's height, the most the bar may take before it folds to a denser form


class BarFolding:
    """The bar's form (`density`) and whether its second row shows. `first` and `second` are its two
    rows' flow layouts, `cells` the controls' cells; `render()` redraws the controls' texts (a
    collapsed toggle's names it)."""

    def __init__(self, bar: QFrame, first: FlowLayout, second: FlowLayout, second_row: QWidget,
                 cells: dict[str, Cell], more_button: OptionButton, render: Callable[[], None]):
        self.bar, self.first, self.second, self.second_row = bar, first, second, second_row
        self.cells, self.more_button, self.render = cells, more_button, render
        self.compact = False  # the presenter layout: the second row folds behind "More"
        self.density = "full"
        self.height_budget: int | None = None  # set by the window: the most height the bar may take

    def set_compact(self, compact: bool) -> None:
        """Compact (the presenter layout): the switches only; the numbers and the window's buttons
        fold behind "More" (their keys still work) and come back as they were."""
        self.compact = compact
        self.apply(self.density)

    def set_height_budget(self, pixels: int, again: bool = False) -> None:
        """The most height the bar may take (the window's BAR_SHARE); the fullest form that fits shows.
        `again`: choose the form again at the same budget (the type changed, and with it the sizes)."""
        if again or pixels != self.height_budget:
            self.height_budget = pixels
            self.fit(self.bar.width())

    def fit(self, width: int) -> None:
        if self.height_budget is None or width <= 0:
            return
        fits = [d for d in DENSITIES if self.height_in(d, width) <= self.height_budget]
        density = fits[0] if fits else DENSITIES[-1]
        if density != self.density:
            self.apply(density)

    def height_in(self, density: str, width: int) -> int:
        """The bar's height at `width` in a density, from its widgets' size hints in that form
        (nothing is moved to measure)."""
        margins = self.bar.layout().contentsMargins()
        inner = width - margins.left() - margins.right()
        sizes = [self.cell_size(cell, density) for cell in self.cells.values()
                 if not (cell.control.field in self.second_fields)]
        if density != "full":
            sizes.append(self.more_button.sizeHint())
        height = flow_height(sizes, inner, self.first)
        if density == "full" and not self.compact:
            second = [self.second.itemAt(i).widget() for i in range(self.second.count())]
            height += self.bar.layout().spacing() + flow_height(
                [self.cell_size(self.cell_of(w), density) if self.cell_of(w) else w.sizeHint()
                 for w in second if w is not None and not w.isHidden()], inner, self.second)
        return height + margins.top() + margins.bottom()

    @property
    def second_fields(self) -> set[str]:
        return {field for field, cell in self.cells.items() if self.second.indexOf(cell.widget) >= 0}

    def cell_of(self, widget) -> Cell | None:
        return next((cell for cell in self.cells.values() if cell.widget is widget), None)

    def cell_size(self, cell: Cell, density: str) -> QSize:
        caption, spacing = cell.caption.sizeHint(), cell.widget.layout().spacing()
        body = [w.sizeHint() for w in cell.body]
        body_w = sum(s.width() for s in body) + (6 * (len(body) - 1) if isinstance(cell.control, Slider) else 0)
        body_h = max((s.height() for s in body), default=0)
        if density == "collapsed" and cell.collapsed is not None:
            return self.collapsed_hint(cell)
        if density == "collapsed" and isinstance(cell.control, Toggle):
            button = cell.body[0]
            metrics = button.fontMetrics()
            keys = QKeySequence(cell.control.shortcut).toString(QKeySequence.SequenceFormat.NativeText)
            widest = f"{_t(cell.control.label)} {translate('Controls', 'OFF')} → {translate('Controls', 'ON')}…  {keys}"
            extra = metrics.horizontalAdvance(widest) - metrics.horizontalAdvance(button.text())
            return QSize(button.sizeHint().width() + max(0, extra), button.sizeHint().height())
        if density == "full":
            return QSize(max(caption.width(), body_w), caption.height() + spacing + body_h)
        return QSize(caption.width() + spacing + body_w, max(caption.height(), body_h))

    def collapsed_hint(self, cell: Cell) -> QSize:
        """The collapsed button's size with its widest text (it changes with the value it shows)."""
        button = cell.collapsed
        metrics = button.fontMetrics()
        widest = max((metrics.horizontalAdvance(self.collapsed_text(cell.control, value, value))
                      for value, _ in cell.control.options), default=0)
        hint = button.sizeHint()
        return QSize(max(hint.width(), hint.width() - metrics.horizontalAdvance(button.text()) + widest), hint.height())

    def apply(self, density: str) -> None:
        self.density = density
        for cell in self.cells.values():
            cell.set_density("full" if self.second.indexOf(cell.widget) >= 0 else density)
        folded = density != "full" or self.compact
        self.more_button.setVisible(folded)
        if not folded:
            self.more_button.setChecked(False)
        self.show_second_row()
        self.render()  # (the toggles' text names them when collapsed)
        self.first.invalidate()
        self.bar.updateGeometry()

    def show_second_row(self) -> None:
        folded = self.density != "full" or self.compact
        self.second_row.setVisible(not folded or self.more_button.isChecked())
        self.bar.updateGeometry()

    def toggle_text(self, control, value, asked) -> str:
        """ON / OFF (→ the value asked for); collapsed, with the control's name and key before and after."""
        on, off = translate("Controls", "ON"), translate("Controls", "OFF")
        text = f"{on if value else off}" + (f" → {on if asked else off}…" if asked != value else "")
        if self.density == "collapsed":
            keys = QKeySequence(control.shortcut).toString(QKeySequence.SequenceFormat.NativeText)
            text = f"{_t(control.label)} {text}  {keys}"
        return text

    def collapsed_text(self, control, value, asked) -> str:
        names = {v: _t(text) for v, text in control.options}
        keys = QKeySequence(control.shortcut).toString(QKeySequence.SequenceFormat.NativeText)
        text = f"{_t(control.label)} {names.get(value, value)}"
        if asked != value:
            text += f" → {names.get(asked, asked)}…"
        return f"{text}  {keys}"

    # ---- reading and showing ------------------------------------------------------------------
