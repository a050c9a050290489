"""The window's sources (app/sources.py): the local engine, a replay and a server are each an
EventSource, and the window shows whatever source it is handed without knowing its kind: a stand-in
source written here feeds it a reply and a row for the plots, refuses settings, and the window gives
its own engine back with its conversation."""
from __future__ import annotations

import math

from app_test_helpers import fake_cpu
from PySide6.QtCore import QObject

from app.sources import SIGNALS, EventSource, SourceView
from engine.events import DoneEvent, SettingsRefused, TokenEvent
from engine.protocol import Chat, Reset


def test_every_source_is_an_event_source_with_every_signal():
    from app.attach_source import AttachSource
    from app.replay import ReplaySource
    from app.worker import EngineWorker

    for source in (EngineWorker, ReplaySource, AttachSource):
        assert issubclass(source, EventSource)
        for name in SIGNALS + ("notice",):
            assert type(getattr(source, name)).__name__ == "Signal", (source, name)
        for name in ("start", "submit", "request", "stop", "query", "shutdown", "shares_cpu", "view", "reply_summary"):
            assert callable(getattr(source, name)), (source, name)


class Row:
    """A row for the plots that is not an engine step (a PlotRow)."""

    def __init__(self, tokens_per_s: float):
        self.tokens_per_s = tokens_per_s

    def add_to(self, data) -> None:
        data.steps.append(x=data.steps.total, tokens_per_s=self.tokens_per_s)
        data.version += 1


class StandIn(QObject, EventSource):
    """A source of the test's own: answers each chat turn with two pieces and a DoneEvent."""
    takes_settings = picks_models = needs_model = local_hardware = False

    def __init__(self):
        super().__init__()
        self.commands = []

    def view(self) -> SourceView:
        return SourceView(origin="stand-in", x_label="tick", model_line="a stand-in", greeting="hello from it",
                          device_line="no device", live_line="nothing live")

    def submit(self, command) -> None:
        self.commands.append(command)
        if isinstance(command, Chat):
            self.busy_changed.emit("reply", True)
            self.events.emit([TokenEvent(-1, "two ", 0), TokenEvent(-1, "pieces", 1), Row(12.5)])
            self.events.emit([DoneEvent("eos", "two pieces", 3, 2, 0.01, 0.02)])
            self.busy_changed.emit("reply", False)

    def request(self, command) -> None:
        self.events.emit([SettingsRefused(command.request_id, "a stand-in takes no settings", None)])

    def reply_summary(self, done, steps) -> str:
        return f"— {done.n_new_tokens} tokens from the stand-in"


def test_the_window_shows_any_source_it_is_handed(qtbot, tiny_model):
    from app import frame_clock as clock_module
    from app.window import MainWindow

    window = MainWindow(model=tiny_model, hardware=fake_cpu(), autoload=False)
    qtbot.addWidget(window)
    window.messages = [{"role": "user", "content": "kept"}]  # the local engine's conversation
    source = StandIn()
    window.use_source(source)
    assert window.data.source == "stand-in" and window.data.x_label == "tick"
    assert window.chat.model_label.text() == "a stand-in" and "hello from it" in window.chat.plain_text()
    assert not window.model_button.isEnabled()  # it takes no model, and no settings
    assert window.hardware_strip.device_label.full_text() == "no device"
    assert window.frames.gui_cpu_budget == clock_module.GUI_CPU_BUDGET_GPU  # it shares no core with the GUI
    with qtbot.waitSignal(window.reply_finished) as finished:
        window.chat.send_requested.emit("say two words")
    assert isinstance(finished.args[0], DoneEvent) and isinstance(source.commands[-1], Chat)
    text = window.chat.plain_text()
    assert "two pieces" in text and "— 2 tokens from the stand-in" in text
    assert window.data.steps.last("tokens_per_s") == 12.5
    assert window.messages == [{"role": "user", "content": "say two words"},
                               {"role": "assistant", "content": "two pieces"}]
    window.new_chat()
    assert isinstance(source.commands[-1], Reset) and window.messages == []

    window.use_source(window.worker)  # its own engine again, with its own conversation
    assert window.messages == [{"role": "user", "content": "kept"}]
    assert window.data.source == "model" and window.data.steps.total == 0 and math.isnan(window.data.steps.last("tokens_per_s"))
    assert window.model_button.isEnabled()
    window.close()
