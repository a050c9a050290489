"""The controls bar: large labelled switches for the engine's `Settings`, each with a keyboard
shortcut, built from the declarative `CONTROLS` table. A later setting (weights int8/int4,
attention backend, KV layout, batching) is one more entry there; an entry whose field the
engine's Settings lacks is left out, and options the device refuses are greyed with the reason.
Shortcuts are function keys: they work while the chat input has the focus and clash with no
text-editing key (F1 speculation, Shift+F1 captured decode step, F2 KV cache, F3 precision, F4 weights,
F5 attention, F6 KV layout, F7 INT4 group, F12 batching policy); the simulated-users slider steps with
Alt+Up / Alt+Down (text boxes keep Ctrl+arrows)."""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any

from PySide6.QtCore import QSize, Qt, Signal
from PySide6.QtGui import QKeySequence, QShortcut
from PySide6.QtWidgets import (
    QAbstractSpinBox,
    QBoxLayout,
    QButtonGroup,
    QDoubleSpinBox,
    QFrame,
    QHBoxLayout,
    QLabel,
    QPushButton,
    QSlider,
    QSpinBox,
    QVBoxLayout,
    QWidget,
)

from app.flow_layout import FlowLayout, flow_height
from app.i18n import QT_TRANSLATE_NOOP, translate
from app.theme import SettingColours, Theme
from engine.protocol import with_changes
from engine.settings import Settings


@dataclass(frozen=True)
class Choice:
    field: str  # dotted path into Settings, e.g. "dtype"
    label: str
    options: tuple[tuple[Any, str], ...]  # (value, button text)
    shortcut: str  # cycles through the options ("": none)
    tooltip: str = ""
    second_row: bool = False  # below, with the numbers (the switches' row is full)


@dataclass(frozen=True)
class Toggle:
    field: str
    label: str
    shortcut: str
    tooltip: str = ""
    second_row: bool = False


@dataclass(frozen=True)
class Slider:
    field: str
    label: str
    minimum: int
    maximum: int  # the most the control offers; `ControlsBar.set_limit` lowers it (device memory)
    shortcuts: tuple[str, str]  # down, up
    tooltip: str = ""


@dataclass(frozen=True)
class Number:
    field: str
    label: str
    minimum: float
    maximum: float
    step: float
    decimals: int = 0  # 0: a whole number
    tooltip: str = ""


CONTROLS: tuple[Choice | Toggle | Slider | Number, ...] = (
    Choice("dtype", QT_TRANSLATE_NOOP("Controls", "Precision"), (("fp32", "FP32"), ("bf16", "BF16"), ("fp16", "FP16")),
           "F3", QT_TRANSLATE_NOOP("Controls", "bytes per weight read every step: fp32 = 4, bf16/fp16 = 2")),
    Toggle("kv_cache", QT_TRANSLATE_NOOP("Controls", "KV cache"), "F2",
           QT_TRANSLATE_NOOP("Controls", "off: every step recomputes the whole context "
                                         "(tokens/s falls as the context grows)")),
    Choice("weights", QT_TRANSLATE_NOOP("Controls", "Weights"), (("fp", "FP"), ("int8", "INT8"), ("int4", "INT4")),
           "F4",
           QT_TRANSLATE_NOOP("Controls", "weight-only quantisation: INT8 = 1 byte per weight (+ a scale per row), "
                                         "INT4 = half a byte (+ a scale and minimum per group); activations stay "
                                         "in the precision above")),
    Choice("group_size", QT_TRANSLATE_NOOP("Controls", "INT4 group"), ((32, "32"), (64, "64"), (128, "128")), "F7",
           QT_TRANSLATE_NOOP("Controls", "INT4: inputs sharing one scale and minimum (smaller = more accurate, "
                                         "more scale bytes)")),
    Choice("attention", QT_TRANSLATE_NOOP("Controls", "Attention"),
           (("flash", "Flash"), ("naive", QT_TRANSLATE_NOOP("Controls", "Naive"))), "F5",
           QT_TRANSLATE_NOOP("Controls", "naive writes the score matrix to memory and reads it back; "
                                         "flash keeps it on chip")),
    Choice("kv_layout", QT_TRANSLATE_NOOP("Controls", "KV layout"),
           (("contiguous", QT_TRANSLATE_NOOP("Controls", "Contig.")), ("paged", QT_TRANSLATE_NOOP("Controls", "Paged")),
            ("off", QT_TRANSLATE_NOOP("Controls", "Off"))), "F6",
           QT_TRANSLATE_NOOP("Controls", "contiguous reserves the whole context per sequence; paged takes blocks "
                                         "on demand; off recomputes the context every step")),
    Slider("users", QT_TRANSLATE_NOOP("Controls", "Users"), 0, 64, ("Alt+Down", "Alt+Up"),
           QT_TRANSLATE_NOOP("Controls", "simulated users sending requests beside your chat: the engine batches "
                                         "every running request into one forward, so the weights are read once "
                                         "per step for all of them")),
    Choice("policy", QT_TRANSLATE_NOOP("Controls", "Batching"),
           (("continuous", QT_TRANSLATE_NOOP("Controls", "Contin.")),
            ("static", QT_TRANSLATE_NOOP("Controls", "Static"))),
           "F12", QT_TRANSLATE_NOOP("Controls", "continuous: requests join and leave the batch at every step; static: "
                                                "a batch forms, runs until its longest member ends, then the next "
                                                "forms")),
    Choice("speculate", QT_TRANSLATE_NOOP("Controls", "Speculate"),
           (("off", QT_TRANSLATE_NOOP("Controls", "Off")), ("ngram", QT_TRANSLATE_NOOP("Controls", "Lookup")),
            ("draft", QT_TRANSLATE_NOOP("Controls", "Draft"))), "F1",
           QT_TRANSLATE_NOOP("Controls", "speculative decoding: guess k tokens cheaply, check them all in one "
                                         "step of the model (one read of the weights for up to k + 1 tokens; the "
                                         "reply is exactly what it would have been). Lookup copies what followed "
                                         "the last match of the text's final words in the conversation; Draft "
                                         "asks the model itself at the draft weights below")),
    Number("draft_tokens", QT_TRANSLATE_NOOP("Controls", "Draft k"), 1, 8, 1,
           tooltip=QT_TRANSLATE_NOOP("Controls", "tokens guessed per speculative step")),
    # (an fp draft, the model itself, guesses right but costs as much as the model: `membound chat` has it)
    Choice("draft_weights", QT_TRANSLATE_NOOP("Controls", "Draft weights"), (("int8", "INT8"), ("int4", "INT4")), "",
           QT_TRANSLATE_NOOP("Controls", "the draft model's weights (the model itself, quantised: fewer bytes "
                                         "per guess)"),
           second_row=True),
    Toggle("cuda_graphs", QT_TRANSLATE_NOOP("Controls", "Captured"), "Shift+F1",
           QT_TRANSLATE_NOOP("Controls", "the overhead lever: decode steps replayed from a captured CUDA graph "
                                         "instead of hundreds of kernel launches (small models are launch-bound "
                                         "on a GPU); off: every step eager")),
    Number("max_new_tokens", QT_TRANSLATE_NOOP("Controls", "Max tokens"), 1, 8192, 32,
           tooltip=QT_TRANSLATE_NOOP("Controls", "longest reply, in tokens")),
    Number("sampling.temperature", QT_TRANSLATE_NOOP("Controls", "Temperature"), 0.0, 2.0, 0.1, 2,
           QT_TRANSLATE_NOOP("Controls", "0 = greedy (always the likeliest token)")),
    Number("sampling.top_p", QT_TRANSLATE_NOOP("Controls", "Top-p"), 0.05, 1.0, 0.05, 2,
           QT_TRANSLATE_NOOP("Controls", "sample from the smallest set of tokens holding this mass")),
)



class _Tail:
    """The buttons at the end of a flow layout: addWidget / insertWidget(index) among themselves."""

    def __init__(self, flow: FlowLayout):
        self.flow, self.first = flow, flow.count()

    def count(self) -> int:
        return self.flow.count() - self.first

    def indexOf(self, widget) -> int:
        index = self.flow.indexOf(widget)
        return index - self.first if index >= self.first else -1

    def addWidget(self, widget) -> None:
        self.flow.addWidget(widget)

    def insertWidget(self, index: int, widget) -> None:
        self.flow.insertWidget(self.first + index, widget)


QUALITY_COLUMNS = (QT_TRANSLATE_NOOP("Controls", "weights"), QT_TRANSLATE_NOOP("Controls", "perplexity"),
                   QT_TRANSLATE_NOOP("Controls", "top-1 = fp"))


def _t(text: str) -> str:
    """A CONTROLS string (marked with QT_TRANSLATE_NOOP) in the UI's language."""
    return translate("Controls", text)


def get_field(settings: Any, path: str) -> Any:
    for part in path.split("."):
        settings = getattr(settings, part)
    return settings


def has_field(settings: Any, path: str) -> bool:
    try:
        get_field(settings, path)
        return True
    except AttributeError:
        return False


def with_field(settings: Any, path: str, value: Any) -> Any:
    """A copy of the frozen dataclass `settings` with the dotted field replaced."""
    head, _, rest = path.partition(".")
    if not rest:
        return dataclasses.replace(settings, **{head: value})
    return dataclasses.replace(settings, **{head: with_field(getattr(settings, head), rest, value)})


class OptionButton(QPushButton):
    """A switch's button: at least 64 pixels wide and never narrower than its text (a fixed minimum
    width would let the layout clip the text in large fonts)."""

    def sizeHint(self) -> QSize:
        hint = super().sizeHint()
        return QSize(max(64, hint.width()), hint.height())

    def minimumSizeHint(self) -> QSize:
        return self.sizeHint()


class _Cell:
    """One control's widgets in the bar, in each density: its caption above its buttons ("full"),
    beside them ("inline"), or one button naming the control and the value it runs, which steps to
    the next option like the control's key ("collapsed"; a slider stays inline)."""

    def __init__(self, control, widget: QWidget, caption: QLabel, body: list[QWidget]):
        self.control, self.widget, self.caption, self.body = control, widget, caption, body
        self.collapsed: QPushButton | None = None

    def set_density(self, density: str) -> None:
        collapsed = density == "collapsed" and self.collapsed is not None
        self.widget.layout().setDirection(QBoxLayout.Direction.TopToBottom if density == "full"
                                          else QBoxLayout.Direction.LeftToRight)
        # a toggle's own button names it when collapsed ("KV cache ON  F2")
        self.caption.setVisible(not collapsed and not (density == "collapsed" and isinstance(self.control, Toggle)))
        for widget in self.body:
            widget.setVisible(not collapsed)
        if self.collapsed is not None:
            self.collapsed.setVisible(collapsed)


DENSITIES = ("full", "inline", "collapsed")
BAR_SHARE = 0.2  # of the window's height, the most the bar may take before it folds to a denser form


class ControlsBar(QFrame):
    """Shows the settings the engine confirmed (`settings`) and marks the options asked for but not
    confirmed yet (`pending`: dashed outline, "→ value"). A user's change emits
    `settings_changed(Settings)`: the requested settings with that change; the control itself moves
    only when the window passes the engine's answer to `set_settings`. Options the loaded model or
    device cannot take (`Capabilities`) are disabled, the reason in their tooltip.

    Where the window is small the bar folds rather than push the plots off the screen: the captions
    move beside their buttons, then each switch becomes one button with its value (a click steps it,
    as its key does), and the numbers and the window's buttons fold behind "More" (their keys still
    work). `set_height_budget` says how tall it may be; the fullest form that fits is shown."""
    settings_changed = Signal(object)

    def __init__(self, theme: Theme, colours: SettingColours, parent=None):
        super().__init__(parent)
        self.setObjectName("panel")
        self.theme = theme
        self.colours = colours
        self.settings = Settings()  # what the engine runs
        self.pending: dict[str, Any] = {}  # field -> value asked for, not confirmed yet
        self.capabilities = None  # engine.protocol.Capabilities of the loaded model
        self._extra_tips: dict[str, str] = {}  # field -> more for its tooltip (measured quality)
        self.device = "cpu"
        self._updating = False
        self._enabled = False
        self.widgets: dict[str, Any] = {}  # field -> widget (QButtonGroup for a Choice)
        self.slider_values: dict[str, QLabel] = {}  # a slider's number beside it
        self.shortcuts: list[QShortcut] = []
        self._captions: list[tuple[QLabel, str, str]] = []  # (label, text, keys): redrawn in a new theme
        # two groups: the switches (each with its stage shortcut) above; the numbers and the
        # window's own buttons below. Each wraps onto another line where the window is narrow
        # (1280 pixels with projector fonts).
        rows = QVBoxLayout(self)
        rows.setContentsMargins(10, 6, 10, 6)
        rows.setSpacing(6)
        self.layout_ = FlowLayout(spacing=14, line_spacing=6)
        second = FlowLayout(spacing=14, line_spacing=6)
        self.cells: dict[str, _Cell] = {}
        for control in CONTROLS:
            if has_field(self.settings, control.field):
                below = isinstance(control, (Number, Slider)) or getattr(control, "second_row", False)
                target = second if below else self.layout_
                cell = QWidget()
                cell.setLayout(self._build(control))
                cell.layout().setContentsMargins(0, 0, 0, 0)
                target.addWidget(cell)
                self.cells[control.field] = self._cell(control, cell)
        # "More": in the folded forms, the second row (numbers, the window's buttons) behind one button
        self.more_button = OptionButton(translate("Controls", "More…"))
        self.more_button.setCheckable(True)
        self.more_button.setToolTip(translate("Controls", "the numbers (max tokens, temperature, top-p, draft k) "
                                                          "and the window's buttons; every switch keeps its key"))
        self.more_button.clicked.connect(lambda _checked: self._show_second_row())
        self.layout_.addWidget(self.more_button)
        self.extra = _Tail(second)  # the window adds its own buttons (model, theme) here
        self._second = second
        self._hidden_by_compact: list = []
        self.compact = False  # the presenter layout: the second row folds behind "More"
        self.density = "full"
        self.height_budget: int | None = None  # set by the window: the most height the bar may take
        self.second_row = QWidget()  # (a widget, so that folding it is one setVisible)
        self.second_row.setLayout(second)
        rows.addLayout(self.layout_)
        rows.addWidget(self.second_row)
        self._apply_density("full")
        self.set_enabled(False)

    def _cell(self, control, widget: QWidget) -> _Cell:
        column = widget.layout()
        caption = column.itemAt(0).widget()
        body: list[QWidget] = []
        for i in range(1, column.count()):
            item = column.itemAt(i)
            if item.widget() is not None:
                body.append(item.widget())
            elif item.layout() is not None:
                row = item.layout()
                body += [row.itemAt(j).widget() for j in range(row.count()) if row.itemAt(j).widget() is not None]
        cell = _Cell(control, widget, caption, body)
        if isinstance(control, Choice) and control.shortcut:
            cell.collapsed = OptionButton()
            cell.collapsed.setObjectName("collapsed")
            cell.collapsed.clicked.connect(lambda _checked=False, c=control: self.cycle(c.field))
            cell.collapsed.setVisible(False)
            column.addWidget(cell.collapsed)
        return cell

    # ---- building -----------------------------------------------------------------------------
    def _caption(self, text: str, shortcut: str | None = None) -> QLabel:
        keys = QKeySequence(shortcut).toString(QKeySequence.SequenceFormat.NativeText) if shortcut else ""
        label = QLabel()
        label.setObjectName("caption")
        self._captions.append((label, text, keys))
        self._show_caption(label, text, keys)
        return label

    def _build(self, control) -> QVBoxLayout:
        column = QVBoxLayout()
        column.setSpacing(2)
        shortcut = getattr(control, "shortcut", None)
        if isinstance(control, Slider):  # "Alt+↓ ↑": the two keys that step it
            down, up = (QKeySequence(k).toString(QKeySequence.SequenceFormat.NativeText) for k in control.shortcuts)
            keys = f"{down}/{up.split('+')[-1]}".replace("Down", "↓").replace("Up", "↑")
            caption = QLabel()
            caption.setObjectName("caption")
            self._captions.append((caption, _t(control.label), keys))
            self._show_caption(caption, _t(control.label), keys)
            column.addWidget(caption)
        else:
            column.addWidget(self._caption(_t(control.label), shortcut))
        if isinstance(control, Choice):
            row = QHBoxLayout()
            row.setSpacing(0)
            group = QButtonGroup(self)
            group.setExclusive(True)
            for value, text in control.options:
                button = OptionButton(_t(text))
                button.setCheckable(True)
                button.setToolTip(_t(control.tooltip))
                button.value = value
                group.addButton(button)
                row.addWidget(button)
            group.buttonClicked.connect(lambda _b, c=control: self._changed(c))
            self.widgets[control.field] = group
            column.addLayout(row)
            self._add_shortcut(shortcut, lambda c=control: self.cycle(c.field))
        elif isinstance(control, Toggle):
            button = OptionButton()
            button.setCheckable(True)
            button.setToolTip(_t(control.tooltip))
            button.clicked.connect(lambda _checked, c=control: self._changed(c))
            self.widgets[control.field] = button
            column.addWidget(button)
            self._add_shortcut(shortcut, lambda c=control: self.toggle(c.field))
        elif isinstance(control, Slider):
            row = QHBoxLayout()
            row.setSpacing(6)
            slider = QSlider(Qt.Orientation.Horizontal)
            slider.setRange(control.minimum, control.maximum)
            slider.setTracking(False)  # one change when the drag ends, not one per pixel
            slider.setPageStep(4)
            slider.setMinimumWidth(120)
            slider.setToolTip(_t(control.tooltip))
            slider.valueChanged.connect(lambda _v, c=control: self._changed(c))
            slider.sliderMoved.connect(lambda v, c=control: self._show_slider_value(c, v))
            value = QLabel("0")
            value.setObjectName("slider_value")
            value.setMinimumWidth(34)
            row.addWidget(slider)
            row.addWidget(value)
            self.widgets[control.field] = slider
            self.slider_values[control.field] = value
            column.addLayout(row)
            down, up = control.shortcuts
            self._add_shortcut(down, lambda c=control: self.step_slider(c.field, -1))
            self._add_shortcut(up, lambda c=control: self.step_slider(c.field, +1))
        else:
            box = QDoubleSpinBox() if control.decimals else QSpinBox()
            box.setRange(control.minimum, control.maximum)
            box.setSingleStep(control.step)
            if control.decimals:
                box.setDecimals(control.decimals)
            box.setKeyboardTracking(False)  # apply on Enter / arrows, not on every keystroke
            box.setButtonSymbols(QAbstractSpinBox.ButtonSymbols.UpDownArrows)
            box.setToolTip(_t(control.tooltip))
            box.setMinimumWidth(90)
            box.valueChanged.connect(lambda _v, c=control: self._changed(c))
            self.widgets[control.field] = box
            column.addWidget(box)
        return column

    def set_quality(self, table: dict) -> None:
        """Show perplexity and top-1 agreement of each weight setting on the weights switch."""
        group = self.widgets.get("weights")
        if group is None or not table:
            return
        rows = "".join(f"<tr><td>{label}</td><td align='right'>{q.perplexity:.2f}</td>"
                       f"<td align='right'>{100 * q.top1_agreement:.1f}%</td></tr>" for label, q in table.items())
        n = next(iter(table.values())).n_tokens
        head = translate("Controls", "<b>Quality</b> on {n} tokens of evaluation text").format(n=n)
        columns = "".join(f"<th>{translate('Controls', name)}</th>" for name in QUALITY_COLUMNS)
        self._extra_tips["weights"] = f"{head}<table><tr>{columns}</tr>{rows}</table>"
        self._render()

    def _add_shortcut(self, keys: str | None, action) -> None:
        if not keys:
            return
        shortcut = QShortcut(QKeySequence(keys), self)
        shortcut.setContext(Qt.ShortcutContext.WindowShortcut)
        shortcut.activated.connect(action)
        self.shortcuts.append(shortcut)

    def set_compact(self, compact: bool) -> None:
        """Compact (the presenter layout): the switches only; the numbers and the window's buttons
        fold behind "More" (their keys still work) and come back as they were."""
        self.compact = compact
        self._apply_density(self.density)

    # ---- density: how much room the bar takes -----------------------------------------------------
    def set_height_budget(self, pixels: int) -> None:
        """The most height the bar may take (the window's BAR_SHARE); the fullest form that fits shows."""
        if pixels != self.height_budget:
            self.height_budget = pixels
            self._fit(self.width())

    def resizeEvent(self, event) -> None:
        super().resizeEvent(event)
        if event.oldSize().width() != event.size().width():
            self._fit(event.size().width())

    def _fit(self, width: int) -> None:
        if self.height_budget is None or width <= 0:
            return
        fits = [d for d in DENSITIES if self.height_in(d, width) <= self.height_budget]
        density = fits[0] if fits else DENSITIES[-1]
        if density != self.density:
            self._apply_density(density)

    def height_in(self, density: str, width: int) -> int:
        """The bar's height at `width` in a density, from its widgets' size hints in that form
        (nothing is moved to measure)."""
        margins = self.layout().contentsMargins()
        inner = width - margins.left() - margins.right()
        sizes = [self._cell_size(cell, density) for cell in self.cells.values()
                 if not (cell.control.field in self._second_fields)]
        if density != "full":
            sizes.append(self.more_button.sizeHint())
        height = flow_height(sizes, inner, self.layout_)
        if density == "full" and not self.compact:
            second = [self._second.itemAt(i).widget() for i in range(self._second.count())]
            height += self.layout().spacing() + flow_height(
                [self._cell_size(self._cell_of(w), density) if self._cell_of(w) else w.sizeHint()
                 for w in second if w is not None and not w.isHidden()], inner, self._second)
        return height + margins.top() + margins.bottom()

    @property
    def _second_fields(self) -> set[str]:
        return {field for field, cell in self.cells.items() if self._second.indexOf(cell.widget) >= 0}

    def _cell_of(self, widget) -> _Cell | None:
        return next((cell for cell in self.cells.values() if cell.widget is widget), None)

    def _cell_size(self, cell: _Cell, density: str) -> QSize:
        caption, spacing = cell.caption.sizeHint(), cell.widget.layout().spacing()
        body = [w.sizeHint() for w in cell.body]
        body_w = sum(s.width() for s in body) + (6 * (len(body) - 1) if isinstance(cell.control, Slider) else 0)
        body_h = max((s.height() for s in body), default=0)
        if density == "collapsed" and cell.collapsed is not None:
            return self._collapsed_hint(cell)
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

    def _collapsed_hint(self, cell: _Cell) -> QSize:
        """The collapsed button's size with its widest text (it changes with the value it shows)."""
        button = cell.collapsed
        metrics = button.fontMetrics()
        widest = max((metrics.horizontalAdvance(self._collapsed_text(cell.control, value, value))
                      for value, _ in cell.control.options), default=0)
        hint = button.sizeHint()
        return QSize(max(hint.width(), hint.width() - metrics.horizontalAdvance(button.text()) + widest), hint.height())

    def _apply_density(self, density: str) -> None:
        self.density = density
        for cell in self.cells.values():
            cell.set_density("full" if self._second.indexOf(cell.widget) >= 0 else density)
        folded = density != "full" or self.compact
        self.more_button.setVisible(folded)
        if not folded:
            self.more_button.setChecked(False)
        self._show_second_row()
        if hasattr(self, "shortcuts"):
            self._render()  # (the toggles' text names them when collapsed)
        self.layout_.invalidate()
        self.updateGeometry()

    def _show_second_row(self) -> None:
        folded = self.density != "full" or self.compact
        self.second_row.setVisible(not folded or self.more_button.isChecked())
        self.updateGeometry()

    def _toggle_text(self, control, value, asked) -> str:
        """ON / OFF (→ the value asked for); collapsed, with the control's name and key before and after."""
        on, off = translate("Controls", "ON"), translate("Controls", "OFF")
        text = f"{on if value else off}" + (f" → {on if asked else off}…" if asked != value else "")
        if self.density == "collapsed":
            keys = QKeySequence(control.shortcut).toString(QKeySequence.SequenceFormat.NativeText)
            text = f"{_t(control.label)} {text}  {keys}"
        return text

    def _collapsed_text(self, control, value, asked) -> str:
        names = {v: _t(text) for v, text in control.options}
        keys = QKeySequence(control.shortcut).toString(QKeySequence.SequenceFormat.NativeText)
        text = f"{_t(control.label)} {names.get(value, value)}"
        if asked != value:
            text += f" → {names.get(asked, asked)}…"
        return f"{text}  {keys}"

    # ---- reading and showing ------------------------------------------------------------------
    def _value(self, control) -> Any:
        widget = self.widgets[control.field]
        if isinstance(control, Choice):
            checked = widget.checkedButton()
            return checked.value if checked else get_field(self.settings, control.field)
        if isinstance(control, Toggle):
            return widget.isChecked()
        if isinstance(control, Slider):
            return int(widget.value())
        return widget.value() if control.decimals else int(widget.value())

    @property
    def requested(self) -> Settings:
        """The confirmed settings with the pending changes laid over: what a new change builds on."""
        return with_changes(self.settings, self.pending.items())

    def _changed(self, control) -> None:
        if self._updating:
            return
        self._request(control.field, self._value(control))

    def _request(self, field: str, value: Any) -> None:
        new = with_field(self.requested, field, value)
        self._render()  # the widget shows the engine's value until the engine confirms the change
        if new != self.requested:
            self.settings_changed.emit(new)  # the window asks the engine, then calls set_settings

    def toggle(self, field: str) -> None:
        if self.widgets[field].isEnabled():
            self._request(field, not get_field(self.requested, field))

    def cycle(self, field: str) -> None:
        """Next allowed option of a Choice (the stage shortcut), after the one asked for last."""
        values = [b.value for b in self.widgets[field].buttons() if b.isEnabled()]
        if not values:
            return
        current = get_field(self.requested, field)
        index = values.index(current) if current in values else -1
        self._request(field, values[(index + 1) % len(values)])

    def step_slider(self, field: str, direction: int) -> None:
        """Alt+Up / Alt+Down: the next stop of 0, 1, 2, 4, 8, ... (doubling, as batch sweeps go)."""
        slider = self.widgets[field]
        if not slider.isEnabled():
            return
        value = get_field(self.requested, field)
        stops = sorted({0, slider.maximum(), *[2 ** i for i in range(12) if 2 ** i < slider.maximum()]})
        following = [v for v in stops if v > value] if direction > 0 else [v for v in stops if v < value][::-1]
        if following:
            self._request(field, following[0])

    def _show_slider_value(self, control, value: int) -> None:
        label = self.slider_values.get(control.field)
        if label is not None:
            label.setText(str(value))

    def set_limit(self, field: str, maximum: int, why: str = "") -> None:
        """Lower a slider's top (the users the device's memory allows); the reason goes in its tooltip."""
        slider = self.widgets.get(field)
        control = self._control(field)
        if slider is None or not isinstance(control, Slider):
            return
        updating, self._updating = self._updating, True
        try:
            slider.setMaximum(max(control.minimum, min(control.maximum, int(maximum))))
        finally:
            self._updating = updating
        at_most = translate("Controls", "at most {n} here: {why}").format(n=slider.maximum(), why=why)
        slider.setToolTip(_t(control.tooltip) + (f"<br><br>{at_most}" if why else ""))

    def _control(self, field: str):
        return next(c for c in CONTROLS if c.field == field)

    def set_device(self, device: str) -> None:
        self.device = device
        self._render()

    def set_enabled(self, enabled: bool) -> None:
        self._enabled = enabled
        self._refresh_enabled()

    def _refresh_enabled(self) -> None:
        enabled = self._enabled
        for control in CONTROLS:
            widget = self.widgets.get(control.field)
            if widget is None:
                continue
            for w in (widget.buttons() if isinstance(widget, QButtonGroup) else [widget]):
                w.setEnabled(enabled and self._allowed(control, getattr(w, "value", None)))
            cell = self.cells.get(control.field) if hasattr(self, "cells") else None
            if cell is not None and cell.collapsed is not None:  # it steps: another option must be allowed
                current = get_field(self.requested, control.field)
                cell.collapsed.setEnabled(enabled and any(b.isEnabled() and b.value != current
                                                          for b in widget.buttons()))

    def _allowed(self, control, value) -> bool:
        if isinstance(control, Choice):
            return not self._refusal(control, value)
        if isinstance(control, Toggle):
            return not self._refusal(control, not get_field(self.requested, control.field))
        if isinstance(control, Slider):  # usable when some value above the minimum is allowed
            return not self._refusal(control, control.minimum + 1)
        return True

    def _refusal(self, control, value) -> str:
        """Why the engine would refuse this option, from where the settings are heading ("" if not)."""
        settings = with_field(self.requested, control.field, value)
        if self.capabilities is not None:
            return self.capabilities.refusal(settings)
        try:
            settings.validate(self.device)
            return ""
        except ValueError as error:
            return str(error)

    def _option_tooltip(self, control, value) -> str:
        refusal = self._refusal(control, value)
        if refusal:
            return refusal
        note = self.capabilities.note(control.field, value) if self.capabilities is not None else ""
        extra = self._extra_tips.get(control.field, "")
        return _t(control.tooltip) + (f"<br><br>{note}" if note else "") + (f"<br><br>{extra}" if extra else "")

    def set_capabilities(self, capabilities) -> None:
        """What the loaded model and device can take (engine.protocol.Capabilities)."""
        self.capabilities = capabilities
        self._render()

    def set_settings(self, settings: Settings, pending: dict[str, Any] | None = None) -> None:
        """Show what the engine runs (and, if given, the options still waiting for its answer)."""
        self.settings = settings
        if pending is not None:
            self.pending = dict(pending)
        self._render()

    def set_pending(self, pending: dict[str, Any]) -> None:
        self.pending = dict(pending)
        self._render()

    def _render(self) -> None:
        self._updating = True
        try:
            settings = self.settings
            if self.capabilities is not None and "users" in self.widgets:
                self.set_limit("users", self.capabilities.max_users.get(self.requested.dtype, 0),
                               "the KV cache memory set aside for batching")
            for control in CONTROLS:
                widget = self.widgets.get(control.field)
                if widget is None:
                    continue
                value = get_field(settings, control.field)
                asked = self.pending.get(control.field, value)
                waiting = asked != value
                if isinstance(control, Choice):
                    for button in widget.buttons():
                        button.setChecked(button.value == value)
                        asked_note = translate("Controls", "asked for: waiting for the engine")
                        button.setToolTip(self._option_tooltip(control, button.value)
                                          + (f"<br><br>{asked_note}" if waiting and button.value == asked else ""))
                        colour = self.colours.option_colour(str(button.value))
                        style = (f"QPushButton:checked {{ background: {colour}; color: {self.theme.background}; "
                                 f"font-weight: bold; }}" if colour else "")
                        if waiting and button.value == asked:
                            style += f"QPushButton {{ border: 2px dashed {self.theme.accent}; }}"
                        button.setStyleSheet(style)
                    collapsed = self.cells[control.field].collapsed if control.field in self.cells else None
                    if collapsed is not None:
                        collapsed.setText(self._collapsed_text(control, value, asked))
                        colour = self.colours.option_colour(str(value)) or self.theme.accent
                        collapsed.setStyleSheet(f"QPushButton {{ border: 2px {'dashed' if waiting else 'solid'} "
                                                f"{colour}; font-weight: bold; }}")
                        collapsed.setToolTip(self._option_tooltip(control, value))
                elif isinstance(control, Toggle):
                    widget.setChecked(bool(value))
                    widget.setText(self._toggle_text(control, value, asked))
                    widget.setToolTip(self._option_tooltip(control, not value))
                    colour = self.colours.colour(settings.label)
                    border = "dashed" if waiting else "solid"
                    widget.setStyleSheet(f"QPushButton {{ font-weight: bold; border: 2px {border} {colour}; "
                                         f"color: {colour}; }} QPushButton:disabled {{ border: 1px solid "
                                         f"{self.theme.border}; color: {self.theme.muted}; font-weight: normal; }}")
                elif isinstance(control, Slider):
                    widget.setValue(int(value))
                    self.slider_values[control.field].setText(str(int(value)) + (f" → {asked}" if waiting else ""))
                    if not self._allowed(control, None):
                        widget.setToolTip(self._refusal(control, control.minimum + 1))
                else:
                    widget.setValue(value)
                    widget.setSuffix(f"  → {asked:g}" if waiting else "")
            self._refresh_enabled()
        finally:
            self._updating = False

    def set_theme(self, theme: Theme) -> None:
        self.theme = theme
        for label, text, keys in self._captions:  # the keys' colour is the theme's
            self._show_caption(label, text, keys)
        self._render()

    def _show_caption(self, label: QLabel, text: str, keys: str) -> None:
        label.setText(f"{text}  <span style='color:{self.theme.muted}'>{keys}</span>" if keys else text)
