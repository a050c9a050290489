"""The controls bar: large labelled switches for the engine's `Settings`, each with a keyboard
shortcut, built from the declarative `CONTROLS` table. A later setting (weights int8/int4,
attention backend, KV layout, batching) is one more entry there; an entry whose field the
engine's Settings lacks is left out, and options the device refuses are greyed with the reason.
Shortcuts are function keys: they work while the chat input has the focus and clash with no
text-editing key (F2 KV cache, F3 precision, F4 weights, F5 attention, F6 KV layout, F7 INT4 group,
F12 batching policy); the simulated-users slider steps with Alt+Up / Alt+Down (text boxes keep Ctrl+arrows)."""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any

from PySide6.QtCore import Qt, Signal
from PySide6.QtGui import QKeySequence, QShortcut
from PySide6.QtWidgets import (
    QAbstractSpinBox,
    QButtonGroup,
    QDoubleSpinBox,
    QFrame,
    QHBoxLayout,
    QLabel,
    QPushButton,
    QSlider,
    QSpinBox,
    QVBoxLayout,
)

from app.theme import SettingColours, Theme
from engine.settings import Settings


@dataclass(frozen=True)
class Choice:
    field: str  # dotted path into Settings, e.g. "dtype"
    label: str
    options: tuple[tuple[Any, str], ...]  # (value, button text)
    shortcut: str  # cycles through the options
    tooltip: str = ""


@dataclass(frozen=True)
class Toggle:
    field: str
    label: str
    shortcut: str
    tooltip: str = ""


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
    Choice("dtype", "Precision", (("fp32", "FP32"), ("bf16", "BF16"), ("fp16", "FP16")), "F3",
           "bytes per weight read every step: fp32 = 4, bf16/fp16 = 2"),
    Toggle("kv_cache", "KV cache", "F2",
           "off: every step recomputes the whole context (tokens/s falls as the context grows)"),
    Choice("weights", "Weights", (("fp", "FP"), ("int8", "INT8"), ("int4", "INT4")), "F4",
           "weight-only quantisation: INT8 = 1 byte per weight (+ a scale per row), INT4 = half a byte "
           "(+ a scale and minimum per group); activations stay in the precision above"),
    Choice("group_size", "INT4 group", ((32, "32"), (64, "64"), (128, "128")), "F7",
           "INT4: inputs sharing one scale and minimum (smaller = more accurate, more scale bytes)"),
    Choice("attention", "Attention", (("flash", "Flash"), ("naive", "Naive")), "F5",
           "naive writes the score matrix to memory and reads it back; flash keeps it on chip"),
    Choice("kv_layout", "KV layout", (("contiguous", "Contig."), ("paged", "Paged"), ("off", "Off")), "F6",
           "contiguous reserves the whole context per sequence; paged takes blocks on demand; "
           "off recomputes the context every step"),
    Slider("users", "Users", 0, 64, ("Alt+Down", "Alt+Up"),
           "simulated users sending requests beside your chat: the engine batches every running request "
           "into one forward, so the weights are read once per step for all of them"),
    Choice("policy", "Batching", (("continuous", "Contin."), ("static", "Static")), "F12",
           "continuous: requests join and leave the batch at every step; static: a batch forms, runs until "
           "its longest member ends, then the next forms"),
    Number("max_new_tokens", "Max tokens", 1, 8192, 32, tooltip="longest reply, in tokens"),
    Number("sampling.temperature", "Temperature", 0.0, 2.0, 0.1, 2, "0 = greedy (always the likeliest token)"),
    Number("sampling.top_p", "Top-p", 0.05, 1.0, 0.05, 2, "sample from the smallest set of tokens holding this mass"),
)


CONTROL_TOOLTIPS = {c.field: c.tooltip for c in CONTROLS}


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


def describe_changes(old: Settings, new: Settings) -> list[str]:
    """Labels for what differs, in the words the annotations use (e.g. "kv cache off")."""
    changes = []
    for control in CONTROLS:
        if not has_field(new, control.field):
            continue
        before, after = get_field(old, control.field), get_field(new, control.field)
        if before == after:
            continue
        if isinstance(control, Toggle):
            changes.append(f"{control.label.lower()} {'on' if after else 'off'}")
        elif control.field == "kv_layout":  # the KV cache switch and this choice share one state
            if get_field(old, "kv_cache") == get_field(new, "kv_cache"):
                changes.append(f"kv {after}")
        elif control.field == "group_size":
            if new.weights == "int4":
                changes.append(f"int4 group {after}")
        elif control.field == "policy":
            changes.append(f"{after} batching")
        elif isinstance(control, Slider):
            changes.append(f"{after} {control.label.lower()}")
        elif isinstance(control, Choice):
            changes.append(f"{after} attention" if control.field == "attention" else str(after))
        else:
            changes.append(f"{control.label.lower()} {after:g}")
    return changes


class ControlsBar(QFrame):
    """Emits `settings_changed(Settings)` when the user changes a control; `set_settings` shows
    the engine's settings without emitting."""
    settings_changed = Signal(object)

    def __init__(self, theme: Theme, colours: SettingColours, parent=None):
        super().__init__(parent)
        self.setObjectName("panel")
        self.theme = theme
        self.colours = colours
        self.settings = Settings()
        self.device = "cpu"
        self._updating = False
        self._enabled = False
        self.widgets: dict[str, Any] = {}  # field -> widget (QButtonGroup for a Choice)
        self.slider_values: dict[str, QLabel] = {}  # a slider's number beside it
        self.shortcuts: list[QShortcut] = []
        # two rows: the switches (each with its stage shortcut) above; the numbers and the
        # window's own buttons below, so the bar stays narrower than a 1680-pixel screen
        rows = QVBoxLayout(self)
        rows.setContentsMargins(10, 6, 10, 6)
        rows.setSpacing(6)
        self.layout_ = QHBoxLayout()
        self.layout_.setSpacing(14)
        second = QHBoxLayout()
        second.setSpacing(14)
        for control in CONTROLS:
            if has_field(self.settings, control.field):
                target = second if isinstance(control, (Number, Slider)) else self.layout_
                target.addLayout(self._build(control))
        self.layout_.addStretch(1)
        second.addStretch(1)
        self.extra = QHBoxLayout()  # the window adds its own buttons (model, theme) here
        self.extra.setSpacing(8)
        second.addLayout(self.extra)
        rows.addLayout(self.layout_)
        rows.addLayout(second)
        self.set_enabled(False)

    # ---- building -----------------------------------------------------------------------------
    def _caption(self, text: str, shortcut: str | None = None) -> QLabel:
        keys = QKeySequence(shortcut).toString(QKeySequence.SequenceFormat.NativeText) if shortcut else ""
        label = QLabel(f"{text}  <span style='color:{self.theme.muted}'>{keys}</span>" if keys else text)
        label.setObjectName("caption")
        return label

    def _build(self, control) -> QVBoxLayout:
        column = QVBoxLayout()
        column.setSpacing(2)
        shortcut = getattr(control, "shortcut", None)
        if isinstance(control, Slider):  # "Alt+↓ ↑": the two keys that step it
            down, up = (QKeySequence(k).toString(QKeySequence.SequenceFormat.NativeText) for k in control.shortcuts)
            keys = f"{down}/{up.split('+')[-1]}".replace("Down", "↓").replace("Up", "↑")
            caption = QLabel(f"{control.label}  <span style='color:{self.theme.muted}'>{keys}</span>")
            caption.setObjectName("caption")
            column.addWidget(caption)
        else:
            column.addWidget(self._caption(control.label, shortcut))
        if isinstance(control, Choice):
            row = QHBoxLayout()
            row.setSpacing(0)
            group = QButtonGroup(self)
            group.setExclusive(True)
            for value, text in control.options:
                button = QPushButton(text)
                button.setCheckable(True)
                button.setMinimumWidth(64)
                button.setToolTip(control.tooltip)
                button.value = value
                group.addButton(button)
                row.addWidget(button)
            group.buttonClicked.connect(lambda _b, c=control: self._changed(c))
            self.widgets[control.field] = group
            column.addLayout(row)
            self._add_shortcut(shortcut, lambda c=control: self.cycle(c.field))
        elif isinstance(control, Toggle):
            button = QPushButton()
            button.setCheckable(True)
            button.setMinimumWidth(110)
            button.setToolTip(control.tooltip)
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
            slider.setMinimumWidth(200)
            slider.setToolTip(control.tooltip)
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
            box.setToolTip(control.tooltip)
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
        tip = (f"{CONTROL_TOOLTIPS['weights']}<br><br><b>Quality</b> on {n} tokens of evaluation text"
               f"<table><tr><th>weights</th><th>perplexity</th><th>top-1 = fp</th></tr>{rows}</table>")
        for button in group.buttons():
            button.setToolTip(tip)

    def _add_shortcut(self, keys: str | None, action) -> None:
        if not keys:
            return
        shortcut = QShortcut(QKeySequence(keys), self)
        shortcut.setContext(Qt.ShortcutContext.WindowShortcut)
        shortcut.activated.connect(action)
        self.shortcuts.append(shortcut)

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

    def _changed(self, control) -> None:
        if self._updating:
            return
        new = with_field(self.settings, control.field, self._value(control))
        if new != self.settings:
            self.settings_changed.emit(new)  # the window applies it, then calls set_settings

    def toggle(self, field: str) -> None:
        button = self.widgets[field]
        if button.isEnabled():
            button.setChecked(not button.isChecked())
            self._changed(self._control(field))

    def cycle(self, field: str) -> None:
        """Next allowed option of a Choice (the stage shortcut)."""
        group = self.widgets[field]
        buttons = [b for b in group.buttons() if b.isEnabled()]
        if not buttons:
            return
        current = group.checkedButton()
        index = buttons.index(current) if current in buttons else -1
        buttons[(index + 1) % len(buttons)].setChecked(True)
        self._changed(self._control(field))

    def step_slider(self, field: str, direction: int) -> None:
        """Alt+Up / Alt+Down: the next stop of 0, 1, 2, 4, 8, ... (doubling, as batch sweeps go)."""
        slider = self.widgets[field]
        if not slider.isEnabled():
            return
        value = slider.value()
        stops = sorted({0, slider.maximum(), *[2 ** i for i in range(12) if 2 ** i < slider.maximum()]})
        following = [v for v in stops if v > value] if direction > 0 else [v for v in stops if v < value][::-1]
        if following:
            slider.setValue(following[0])  # emits valueChanged (tracking is off only for drags)

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
        self._updating = True
        try:
            slider.setMaximum(max(control.minimum, min(control.maximum, int(maximum))))
        finally:
            self._updating = False
        slider.setToolTip(control.tooltip + (f"<br><br>at most {slider.maximum()} here: {why}" if why else ""))

    def _control(self, field: str):
        return next(c for c in CONTROLS if c.field == field)

    def set_device(self, device: str) -> None:
        self.device = device
        self.set_settings(self.settings)

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

    def _allowed(self, control, value) -> bool:
        if not isinstance(control, Choice):
            return True
        try:
            with_field(self.settings, control.field, value).validate(self.device)
            return True
        except ValueError:
            return False

    def _refusal(self, control, value) -> str:
        try:
            with_field(self.settings, control.field, value).validate(self.device)
            return ""
        except ValueError as error:
            return str(error)

    def set_settings(self, settings: Settings) -> None:
        self._updating = True
        try:
            self.settings = settings
            for control in CONTROLS:
                widget = self.widgets.get(control.field)
                if widget is None:
                    continue
                value = get_field(settings, control.field)
                if isinstance(control, Choice):
                    for button in widget.buttons():
                        button.setChecked(button.value == value)
                        refusal = self._refusal(control, button.value)
                        button.setToolTip(refusal or control.tooltip)
                        colour = self.colours.option_colour(str(button.value))
                        button.setStyleSheet(f"QPushButton:checked {{ background: {colour}; color: "
                                             f"{self.theme.background}; font-weight: bold; }}" if colour else "")
                elif isinstance(control, Toggle):
                    widget.setChecked(bool(value))
                    widget.setText(f"{control.label}: {'ON' if value else 'OFF'}")
                    colour = self.colours.colour(settings.label)
                    widget.setStyleSheet(f"QPushButton {{ font-weight: bold; border: 2px solid {colour}; "
                                         f"color: {colour}; }}")
                elif isinstance(control, Slider):
                    widget.setValue(int(value))
                    self.slider_values[control.field].setText(str(int(value)))
                else:
                    widget.setValue(value)
            self._refresh_enabled()
        finally:
            self._updating = False

    def set_theme(self, theme: Theme) -> None:
        self.theme = theme
        self.set_settings(self.settings)
