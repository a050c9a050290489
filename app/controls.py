"""The controls bar: large labelled switches for the engine's `Settings`, each with a keyboard
shortcut, built from the declarative `CONTROLS` table (app/control_table.py). A later setting (weights int8/int4,
attention backend, KV layout, batching) is one more entry there; an entry whose field the
engine's Settings lacks is left out, and options the device refuses are greyed with the reason.
Shortcuts are function keys: they work while the chat input has the focus and clash with no
text-editing key (F1 speculation, Shift+F1 captured decode step, F2 KV cache, F3 precision, F4 weights,
F5 attention, F6 KV layout, F7 INT4 group, F12 batching policy); the simulated-users slider steps with
Alt+Up / Alt+Down (text boxes keep Ctrl+arrows). Each control's widgets are built in
app/control_widgets.py; how the bar folds on a small window is app/controls_density.py's."""
from __future__ import annotations

from typing import Any

from PySide6.QtCore import Signal
from PySide6.QtWidgets import QButtonGroup, QFrame, QVBoxLayout, QWidget

from app.control_table import (  # (the table's names, as the bar's module has always offered them)
    CONTROLS,
    QUALITY_COLUMNS,
    Choice,
    Number,
    Slider,
    Toggle,
    control_of,
    control_text as _t,
    get_field,
    has_field,
    with_field,
)
from app.control_widgets import ControlWidgets, OptionButton, Tail
from app.controls_density import BAR_SHARE, DENSITIES, BarFolding
from app.flow_layout import FlowLayout
from app.i18n import translate
from app.theme import SettingColours, Theme
from engine.protocol import with_changes
from engine.settings import Settings

__all__ = ["BAR_SHARE", "CONTROLS", "DENSITIES", "Choice", "ControlsBar", "Number", "OptionButton", "Slider",
           "Toggle", "get_field", "has_field", "with_field"]


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
        self.parts = ControlWidgets(self, theme, self._changed, self.cycle, self.toggle, self.step_slider)
        self.widgets = self.parts.widgets  # field -> widget (QButtonGroup for a Choice)
        self.slider_values = self.parts.slider_values  # a slider's number beside it
        self.shortcuts = self.parts.shortcuts
        # two groups: the switches (each with its stage shortcut) above; the numbers and the
        # window's own buttons below. Each wraps onto another line where the window is narrow
        # (1280 pixels with projector fonts).
        rows = QVBoxLayout(self)
        rows.setContentsMargins(10, 6, 10, 6)
        rows.setSpacing(6)
        self.layout_ = FlowLayout(spacing=14, line_spacing=6)
        second = FlowLayout(spacing=14, line_spacing=6)
        self.cells = {}
        for control in CONTROLS:
            if has_field(self.settings, control.field):
                below = isinstance(control, (Number, Slider)) or getattr(control, "second_row", False)
                target = second if below else self.layout_
                cell = QWidget()
                cell.setLayout(self.parts.build(control))
                cell.layout().setContentsMargins(0, 0, 0, 0)
                target.addWidget(cell)
                self.cells[control.field] = self.parts.cell(control, cell)
        # "More": in the folded forms, the second row (numbers, the window's buttons) behind one button
        self.more_button = OptionButton(translate("Controls", "More…"))
        self.more_button.setCheckable(True)
        self.more_button.setToolTip(translate("Controls", "the numbers (max tokens, temperature, top-p, draft k) "
                                                          "and the window's buttons; every switch keeps its key"))
        self.more_button.clicked.connect(lambda _checked: self.folding.show_second_row())
        self.layout_.addWidget(self.more_button)
        self.extra = Tail(second)  # the window adds its own buttons (model, theme) here
        self.second_row = QWidget()  # (a widget, so that folding it is one setVisible)
        self.second_row.setLayout(second)
        rows.addLayout(self.layout_)
        rows.addWidget(self.second_row)
        self.folding = BarFolding(self, self.layout_, second, self.second_row, self.cells, self.more_button,
                                  self._render)
        self.folding.apply("full")
        self.set_enabled(False)

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

    # ---- density: how much room the bar takes (app/controls_density.py) ---------------------------
    @property
    def density(self) -> str:
        return self.folding.density

    def set_compact(self, compact: bool) -> None:
        """Compact (the presenter layout): the switches only; the numbers and the window's buttons
        fold behind "More" (their keys still work) and come back as they were."""
        self.folding.set_compact(compact)

    def set_height_budget(self, pixels: int, again: bool = False) -> None:
        """The most height the bar may take (the window's BAR_SHARE); the fullest form that fits shows
        (`again`: chosen again at the same budget, after the type changed)."""
        self.folding.set_height_budget(pixels, again)

    def resizeEvent(self, event) -> None:
        super().resizeEvent(event)
        if event.oldSize().width() != event.size().width():
            self.folding.fit(event.size().width())


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

    def set_limit(self, field: str, maximum: int, why: str = "") -> None:
        """Lower a slider's top (the users the device's memory allows); the reason goes in its tooltip."""
        slider = self.widgets.get(field)
        control = control_of(field)
        if slider is None or not isinstance(control, Slider):
            return
        updating, self._updating = self._updating, True
        try:
            slider.setMaximum(max(control.minimum, min(control.maximum, int(maximum))))
        finally:
            self._updating = updating
        at_most = translate("Controls", "at most {n} here: {why}").format(n=slider.maximum(), why=why)
        slider.setToolTip(_t(control.tooltip) + (f"<br><br>{at_most}" if why else ""))

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
            cell = self.cells.get(control.field)
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
                        collapsed.setText(self.folding.collapsed_text(control, value, asked))
                        colour = self.colours.option_colour(str(value)) or self.theme.accent
                        collapsed.setStyleSheet(f"QPushButton {{ border: 2px {'dashed' if waiting else 'solid'} "
                                                f"{colour}; font-weight: bold; }}")
                        collapsed.setToolTip(self._option_tooltip(control, value))
                elif isinstance(control, Toggle):
                    widget.setChecked(bool(value))
                    widget.setText(self.folding.toggle_text(control, value, asked))
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
        self.parts.set_theme(theme)
        self._render()
