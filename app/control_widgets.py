"""Each control's widgets in the controls bar, built from its entry in CONTROLS
(app/control_table.py): a caption with its keys, then the buttons of a switch, a slider with its
number, or a spin box; and the pieces the bar folds with (a `Cell` per control, the `Tail` where the
window adds its own buttons)."""
from __future__ import annotations

from typing import Any, Callable

from PySide6.QtCore import QSize, Qt
from PySide6.QtGui import QKeySequence, QShortcut
from PySide6.QtWidgets import (
    QAbstractSpinBox,
    QBoxLayout,
    QButtonGroup,
    QDoubleSpinBox,
    QHBoxLayout,
    QLabel,
    QPushButton,
    QSlider,
    QSpinBox,
    QVBoxLayout,
    QWidget,
)

from app.control_table import Choice, Slider, Toggle, control_text as _t
from app.flow_layout import FlowLayout
from app.theme import Theme


class Tail:
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


class OptionButton(QPushButton):
    """A switch's button: at least 64 pixels wide and never narrower than its text (a fixed minimum
    width would let the layout clip the text in large fonts)."""

    def sizeHint(self) -> QSize:
        hint = super().sizeHint()
        return QSize(max(64, hint.width()), hint.height())

    def minimumSizeHint(self) -> QSize:
        return self.sizeHint()


class Cell:
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



class ControlWidgets:
    """The widgets of each control, keyed by its field, and the keys that work them. `owner` parents
    the button groups and shortcuts; `changed(control)` is called when a widget changes, and the
    keys call `cycle(field)`, `toggle(field)` and `step_slider(field, direction)`."""

    def __init__(self, owner, theme: Theme, changed: Callable, cycle: Callable, toggle: Callable,
                 step_slider: Callable):
        self.owner, self.theme = owner, theme
        self.changed, self.cycle, self.toggle, self.step_slider = changed, cycle, toggle, step_slider
        self.widgets: dict[str, Any] = {}  # field -> widget (QButtonGroup for a Choice)
        self.slider_values: dict[str, QLabel] = {}  # a slider's number beside it
        self.shortcuts: list[QShortcut] = []
        self.captions: list[tuple[QLabel, str, str]] = []  # (label, text, keys): redrawn in a new theme

    def cell(self, control, widget: QWidget) -> Cell:
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
        cell = Cell(control, widget, caption, body)
        if isinstance(control, Choice) and control.shortcut:
            cell.collapsed = OptionButton()
            cell.collapsed.setObjectName("collapsed")
            cell.collapsed.clicked.connect(lambda _checked=False, c=control: self.cycle(c.field))
            cell.collapsed.setVisible(False)
            column.addWidget(cell.collapsed)
        return cell

    def caption(self, text: str, shortcut: str | None = None) -> QLabel:
        keys = QKeySequence(shortcut).toString(QKeySequence.SequenceFormat.NativeText) if shortcut else ""
        label = QLabel()
        label.setObjectName("caption")
        self.captions.append((label, text, keys))
        self.show_caption(label, text, keys)
        return label

    def build(self, control) -> QVBoxLayout:
        column = QVBoxLayout()
        column.setSpacing(2)
        shortcut = getattr(control, "shortcut", None)
        if isinstance(control, Slider):  # "Alt+↓ ↑": the two keys that step it
            down, up = (QKeySequence(k).toString(QKeySequence.SequenceFormat.NativeText) for k in control.shortcuts)
            keys = f"{down}/{up.split('+')[-1]}".replace("Down", "↓").replace("Up", "↑")
            caption = QLabel()
            caption.setObjectName("caption")
            self.captions.append((caption, _t(control.label), keys))
            self.show_caption(caption, _t(control.label), keys)
            column.addWidget(caption)
        else:
            column.addWidget(self.caption(_t(control.label), shortcut))
        if isinstance(control, Choice):
            row = QHBoxLayout()
            row.setSpacing(0)
            group = QButtonGroup(self.owner)
            group.setExclusive(True)
            for value, text in control.options:
                button = OptionButton(_t(text))
                button.setCheckable(True)
                button.setToolTip(_t(control.tooltip))
                button.value = value
                group.addButton(button)
                row.addWidget(button)
            group.buttonClicked.connect(lambda _b, c=control: self.changed(c))
            self.widgets[control.field] = group
            column.addLayout(row)
            self.add_shortcut(shortcut, lambda c=control: self.cycle(c.field))
        elif isinstance(control, Toggle):
            button = OptionButton()
            button.setCheckable(True)
            button.setToolTip(_t(control.tooltip))
            button.clicked.connect(lambda _checked, c=control: self.changed(c))
            self.widgets[control.field] = button
            column.addWidget(button)
            self.add_shortcut(shortcut, lambda c=control: self.toggle(c.field))
        elif isinstance(control, Slider):
            row = QHBoxLayout()
            row.setSpacing(6)
            slider = QSlider(Qt.Orientation.Horizontal)
            slider.setRange(control.minimum, control.maximum)
            slider.setTracking(False)  # one change when the drag ends, not one per pixel
            slider.setPageStep(4)
            slider.setMinimumWidth(120)
            slider.setToolTip(_t(control.tooltip))
            slider.valueChanged.connect(lambda _v, c=control: self.changed(c))
            slider.sliderMoved.connect(lambda v, c=control: self.show_slider_value(c, v))
            value = QLabel("0")
            value.setObjectName("slider_value")
            value.setMinimumWidth(34)
            row.addWidget(slider)
            row.addWidget(value)
            self.widgets[control.field] = slider
            self.slider_values[control.field] = value
            column.addLayout(row)
            down, up = control.shortcuts
            self.add_shortcut(down, lambda c=control: self.step_slider(c.field, -1))
            self.add_shortcut(up, lambda c=control: self.step_slider(c.field, +1))
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
            box.valueChanged.connect(lambda _v, c=control: self.changed(c))
            self.widgets[control.field] = box
            column.addWidget(box)
        return column

    def add_shortcut(self, keys: str | None, action) -> None:
        if not keys:
            return
        shortcut = QShortcut(QKeySequence(keys), self.owner)
        shortcut.setContext(Qt.ShortcutContext.WindowShortcut)
        shortcut.activated.connect(action)
        self.shortcuts.append(shortcut)

    def show_slider_value(self, control, value: int) -> None:
        label = self.slider_values.get(control.field)
        if label is not None:
            label.setText(str(value))

    def show_caption(self, label: QLabel, text: str, keys: str) -> None:
        label.setText(f"{text}  <span style='color:{self.theme.muted}'>{keys}</span>" if keys else text)

    def set_theme(self, theme: Theme) -> None:
        self.theme = theme
        for label, text, keys in self.captions:  # the keys' colour is the theme's
            self.show_caption(label, text, keys)
