"""What feeds the window: one interface, three sources — the local engine (app/worker.py, in its own
process or on a thread), a recording played back (app/replay.py) and a running server (app/attach_source.py).

A source is a QObject that also derives from `EventSource`: it carries the signals below, takes the
engine protocol's commands (`submit`, `request`, `stop`, `query`), starts and shuts down, and answers
what the window asks of it (`takes_settings`, `needs_model`, `shares_cpu`, `view`, `reply_summary`).
The window connects to whichever source `MainWindow.use_source` hands it and never asks which kind
it is; a source that has nothing of a kind (a server has no KV snapshot) never emits that signal.

The signals carry plain data: the engine contract's dataclasses (engine/events.py,
engine/protocol.py), or, in `events`, a row for the plots that is not a step (`PlotRow`: it puts
itself into the LiveData)."""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Protocol, runtime_checkable

from PySide6.QtCore import Signal

from engine.events import DoneEvent
from engine.metrics import StepMetrics

# the engine's signals, which every source has (a recording keeps these: app/recording.py); and `notice`
SIGNALS = ("progress", "model_loaded", "events", "reply_started", "busy_changed", "failed", "kv_snapshot",
           "quality", "state", "engine_died")


@runtime_checkable
class PlotRow(Protocol):
    """An entry of `events` that is a row of the plots but not an engine step (a server's scrape)."""

    def add_to(self, data) -> None: ...


@dataclass(frozen=True)
class SourceView:
    """How the window shows a source that is not a model of its own (a server): what the plots'
    figures are, the peaks they are drawn against, the strip's and the chat's lines, and a bar of the
    source's own under the toolbar."""
    origin: str  # LiveData.source: where the figures come from (translated where shown)
    x_label: str  # what one row of the step plots is
    hardware: object = None  # engine.hardware.spec.DeviceSpec the plots and the strip draw against, or None
    device_line: str = ""  # the strip's device line when there is no spec
    live_line: str = ""  # the strip's line on where the live figures come from
    serving_title: str = ""  # the serving panel's title ("" keeps its own)
    model_line: str = ""  # the chat's model line
    greeting: str = ""  # the chat's first notice
    notes: dict = field(default_factory=dict)  # plot name -> why it shows nothing
    bar: object = None  # a QWidget under the toolbar (a status line, a button), or None


class EventSource:
    """The interface (a mixin: `class MySource(QObject, EventSource)`). Defaults describe a source that
    answers nothing; the local engine and the others override what they do."""
    progress = Signal(float, str)  # fraction, message (model loading, device measurement)
    model_loaded = Signal(object)  # engine.protocol.ModelInfo
    events = Signal(object)  # a list of engine events (and PlotRows), in order
    reply_started = Signal(float)  # time.monotonic() when the prompt was handed on
    busy_changed = Signal(str, bool)  # ("load" | "reply", running): at the start and the end
    failed = Signal(str, str)  # (what failed: "load" | "reply" | "reset" | "quality" | "serving" | "engine", line)
    kv_snapshot = Signal(object)  # engine.kv.blocks.KVCacheSnapshot
    quality = Signal(object)  # {label: engine.events.Quality}
    state = Signal(object)  # engine.settings.Settings the source runs (the answer to query()), or None
    engine_died = Signal(str)  # the engine process ended without being told to (one line)
    notice = Signal(str, bool)  # a line of the source's own for the chat (text, error)

    # ---- what the window may ask
    takes_settings = True  # the controls may ask it for settings (else they stay disabled)
    picks_models = True  # "Model…" may load another model into it
    needs_model = True  # a chat turn waits for a loaded model (a server has its own)
    local_hardware = True  # this machine's NVML and memory readings are its hardware's
    pid: int | None = None  # its engine process, for the strip's memory line

    def shares_cpu(self, device: str) -> bool:
        """Whether it decodes on this machine's CPU cores, beside the GUI (the frame budget's question)."""
        return False

    def view(self) -> SourceView | None:
        """How the window shows it; None: as the model it loads says (ModelInfo)."""
        return None

    def reply_summary(self, done: DoneEvent, steps: list[StepMetrics]) -> str:
        """The line under a finished reply."""
        from app.reply_summary import engine_reply_summary

        return engine_reply_summary(done, steps)

    # ---- commands (engine/protocol.py): the defaults take none
    def start(self) -> None:
        pass

    def submit(self, command) -> None:
        """Load, Chat, Reset, MeasureQuality."""

    def request(self, command) -> None:
        """A settings change (Apply): answered in `events` by SettingsApplied or SettingsRefused."""

    def stop(self) -> None:
        """Stop the reply in progress."""

    def query(self) -> None:
        """Ask what it runs: answered by `state`."""

    def process_alive(self) -> bool:
        return False

    def shutdown(self, timeout_s: float = 30.0) -> bool:
        """Stop what is in progress and end its threads; True if they ended in time."""
        return True
