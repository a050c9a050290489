"""The engine behind a command loop, for a front end that must never wait on it (the desktop app).

Commands go in as plain dataclasses (engine/protocol.py: `Load`, `Chat`, `Reset`, `MeasureQuality`,
`Quit`); events come out through `emit(kind, *args)` with plain-data arguments. `Apply`, `Stop` and
`Query` do not queue: they reach the engine at once; a change takes effect at its next step
boundary, mid-reply too, or at once between replies. No exception ends the loop: a failed command
is reported as one line and the engine keeps serving what it can.

The host runs either on a thread of the caller's process (`EngineHost.run`) or in a process of its
own (`serve`, the other end of a `multiprocessing` pipe). The app uses the process: on a CPU the
engine dispatches ~400 small operators per decode step, each needing the GIL, and in one process
the GUI thread's Python (drawing plots) holds it often enough to cost half the app's decode speed.

Emitted kinds (the app's worker turns each into a Qt signal of the same name):
    progress(fraction, message)      model loading, device measurement
    model_loaded(ModelInfo)
    events(list)                     engine events in order (StepMetrics, TokenEvent, SettingsApplied, ...)
    reply_started(t_monotonic)       when the prompt reached the engine
    busy_changed(what, running)      what: "load" | "reply"
    failed(what, message)            what: "load" | "reply" | "reset" | "quality" | "serving" | "engine"
    kv_snapshot(KVCacheSnapshot)
    quality({label: Quality})
    state(Settings | None)           the answer to Query: what the engine runs now
    exited(reason)                   the last message of `serve`: "quit", or why the loop ended
"""
from __future__ import annotations

import pickle
import queue
import threading
import time
from dataclasses import replace
from types import MappingProxyType
from typing import Callable

from engine.context import EngineContext
from engine.engine import Engine
from engine.events import DoneEvent, SettingsApplied, SettingsRefused
from engine.kernel_checks import check_kernels
from engine.metrics import StepMetrics
from engine.protocol import (
    Apply,
    Chat,
    Load,
    MeasureQuality,
    ModelInfo,
    Query,
    Quit,
    Reset,
    Stop,
    default_dtype,
    one_line,
    with_changes,
)
from engine.settings import EngineError, Settings

# Events leave in batches at most this often (and at once when the engine is slower), so a tiny
# model decoding thousands of tokens a second does not flood the front end's event loop. Each batch
# wakes the app's relay and GUI threads, and on a 2-core CPU each wake-up pre-empts one of the
# engine's threads: at 60 batches a second the app decoded at 0.78x headless, at 10 at 0.90x
# (`python -m app.gui_bench`, docs/benchmarks.md). Ten text updates a second still read as a stream.
BATCH_INTERVAL_S = 1 / 10
# An engine on the CPU shares its cores with the window, whose work per batch (the chat's text laid
# out and painted, the steps taken in) is taken from the engine's threads: five a second there (int4
# on 2 cores: the app at 0.91x headless against 0.86x at ten, docs/benchmarks.md "Session 20")
BATCH_INTERVAL_S_CPU = 1 / 5
KV_SNAPSHOT_INTERVAL_S = 0.15  # the KV panel needs a few pictures a second, not one per token
IDLE_WAIT_S = 0.02  # background work with nothing to run (users thinking, weights being made): look again

_WAKE = object()  # a queued no-op: wakes the loop to look at the engine's settings again
IMMEDIATE = (Apply, Stop, Query)  # commands that do not queue: they reach the engine at once
# how a failed command is named in `failed(what, message)` (any other: "engine")
FAILED_AS = MappingProxyType({Load: "load", Chat: "reply", MeasureQuality: "quality", Reset: "reset"})


class Cancelled(BaseException):
    """Raised inside a model load from its progress callback when the host is told to quit."""


class EngineHost:
    """Owns one `Engine` at a time. `run(commands)` executes queued commands until `Quit`;
    `request`, `stop`, `query` and `quit` may be called from any thread."""

    def __init__(self, emit: Callable[..., None], context: EngineContext | None = None):
        self.emit = emit
        # the engines it runs in turn share it: the device is measured and each kernel checked once,
        # and the faults a test injects count across them (engine/context.py)
        self.context = context if context is not None else EngineContext()
        self.faults = self.context.faults
        self.engine: Engine | None = None
        self.quitting = False
        self._commands: "queue.Queue | None" = None  # run()'s queue
        self._background: list = []  # events of background steps not yet emitted
        self._background_emit_s = self._background_snapshot_s = 0.0

    # ---- any thread ------------------------------------------------------------------------
    def request(self, command: Apply) -> None:
        """A settings change; never raises: a refusal is answered with SettingsRefused (one line),
        and the engine's settings stay as they were."""
        engine = self.engine
        try:
            self.faults.inject("apply")
            if engine is None:
                raise EngineError("no model is loaded yet")
            new = command.settings if command.settings is not None else \
                with_changes(engine.requested_settings, command.changes)
            engine.apply(new, command.request_id)
        except Exception as error:
            self.emit("events", [SettingsRefused(command.request_id, _refusal_line(error),
                                                 engine.settings if engine is not None else None)])
            return
        commands = self._commands
        if commands is not None:
            commands.put(_WAKE)  # between replies the loop takes the change at once

    def apply(self, settings: Settings) -> None:
        """Raises ValueError (one-line message) for settings the engine cannot run (scripts, tests)."""
        engine = self.engine
        if engine is not None:
            engine.apply(settings)
            commands = self._commands
            if commands is not None:
                commands.put(_WAKE)

    def stop(self) -> None:
        engine = self.engine
        if engine is not None:
            engine.stop()

    def query(self) -> None:
        engine = self.engine
        self.emit("state", engine.settings if engine is not None else None)

    def quit(self) -> None:
        self.quitting = True
        self.stop()

    # ---- the host's own thread -------------------------------------------------------------
    def run(self, commands: "queue.Queue") -> None:
        """Execute commands until Quit. Between commands, take pending settings at once and, while
        simulated users are on, serve them one step at a time (a command is looked for between
        steps)."""
        self._commands = commands
        while True:
            engine = self.engine
            if engine is not None and not self.quitting and (engine.serving or engine.has_pending):
                try:
                    command = commands.get_nowait()
                except queue.Empty:
                    if self._background_step(engine):
                        continue
                    try:  # nothing to run (users thinking, weights being made): wait a little
                        command = commands.get(timeout=IDLE_WAIT_S)
                    except queue.Empty:
                        continue
            else:
                self._flush_background()
                command = commands.get()
            self._flush_background()
            if isinstance(command, Quit) or self.quitting:
                return
            if command is _WAKE:
                continue
            try:
                self.execute(command)
            except Cancelled:
                return

    def _background_step(self, engine: Engine) -> bool:
        """Pending settings, then one serving step; events leave in batches like a reply's.
        False: nothing ran."""
        try:
            self.faults.inject("serve_step")
            events = engine.serve_step()
        except Exception as error:  # report once, switch the users off, keep the model
            self._flush_background()
            self.emit("failed", "serving", one_line(error))
            try:
                engine.apply(replace(engine.settings, users=0))
                self.emit("events", engine.serve_step())
            except Exception:
                pass
            return False
        if not events:
            return False
        self._background.extend(events)
        now = time.monotonic()
        if now - self._background_emit_s >= self.batch_interval_s() or not engine.serving \
                or any(isinstance(event, (SettingsApplied, SettingsRefused)) for event in events):
            self._flush_background()
        if now - self._background_snapshot_s >= KV_SNAPSHOT_INTERVAL_S or not engine.serving:
            self._emit_kv_snapshot(engine)
            self._background_snapshot_s = now
        return True

    def batch_interval_s(self) -> float:
        """How often events leave: BATCH_INTERVAL_S, or BATCH_INTERVAL_S_CPU for an engine on the CPU."""
        engine = self.engine
        return BATCH_INTERVAL_S_CPU if engine is not None and engine.device == "cpu" else BATCH_INTERVAL_S

    def _flush_background(self) -> None:
        if self._background:
            self.emit("events", self._background)
            self._background = []
        self._background_emit_s = time.monotonic()

    def execute(self, command) -> None:
        """One command; an exception is reported as one line (`failed`) and the loop goes on."""
        try:
            self.dispatch(command)
        except Cancelled:
            raise
        except Exception as error:
            self.emit("failed", FAILED_AS.get(type(command), "engine"), one_line(error))

    def dispatch(self, command) -> None:
        """The one table of commands. IMMEDIATE ones are safe from any thread (the process's
        listener hands them on at once); the others run on the host's own thread."""
        if isinstance(command, Apply):
            self.request(command)
        elif isinstance(command, Stop):
            self.stop()
        elif isinstance(command, Query):
            self.query()
        elif isinstance(command, Load):
            self._load(command)
        elif isinstance(command, Chat):
            self._chat(command.text, command.ignore_eos)
        elif isinstance(command, MeasureQuality):
            self._measure_quality(command)
        elif isinstance(command, Reset):
            self._reset()
        else:
            raise EngineError(f"unknown command {type(command).__name__}")

    def _progress(self, fraction: float, message: str) -> None:
        if self.quitting:
            raise Cancelled()
        self.emit("progress", float(fraction), str(message))

    def _load(self, command: Load) -> None:
        self.emit("busy_changed", "load", True)
        try:
            self.faults.inject("load")
            hardware = command.hardware
            device = command.device
            if device == "auto":
                if hardware is not None:
                    device = hardware.kind
                else:
                    from engine.hardware.detect import detect_device
                    device = detect_device("auto", measure=False, context=self.context).kind
            settings = command.settings or Settings(dtype=default_dtype(device))
            if isinstance(command.model, bytes):  # a LoadedWeights from another process
                command = replace(command, model=pickle.loads(command.model))
            self._progress(0.0, f"loading {command.model if isinstance(command.model, str) else 'model'}…")
            engine = Engine(command.model, device=device, dtype=settings.dtype, max_context=command.max_context,
                            progress=self._progress, hardware=hardware, settings=settings, messages=command.messages,
                            context=self.context)
            engine.kernel_notes = check_kernels(engine)  # a kernel that fails its check is switched off
            old, self.engine = self.engine, engine
            if old is not None:
                old.stop()
            self._progress(1.0, "ready")
            self.emit("model_loaded", ModelInfo(
                label=engine.loaded.label, source=engine.loaded.source, device=device, cfg=engine.cfg,
                weight_bytes=engine.model.linear_weight_bytes(), hardware=engine.hardware,
                settings=engine.settings, capabilities=engine.capabilities(), messages=tuple(engine.messages)))
            self._emit_kv_snapshot(engine)
        except Cancelled:
            raise
        except Exception as error:  # the old model (if any) stays loaded and usable
            self.emit("failed", "load", one_line(error))
        finally:
            self.emit("busy_changed", "load", False)

    def _reset(self) -> None:
        self.faults.inject("reset")
        engine = self.engine
        if engine is not None:
            engine.reset()
            self._emit_kv_snapshot(engine)

    def _measure_quality(self, command: MeasureQuality) -> None:
        engine = self.engine
        if engine is None:
            return
        from engine.model.quality import weight_quality
        try:
            self.faults.inject("quality")
            self.emit("quality", weight_quality(engine, n_tokens=command.n_tokens))
        except Exception as error:  # quality is extra information: report, keep running
            self.emit("failed", "quality", one_line(error))

    def _emit_kv_snapshot(self, engine: Engine) -> None:
        try:
            snapshot = engine.kv_snapshot()
        except Exception:  # the panel is a view: a failed snapshot must not end the reply
            return
        self.emit("kv_snapshot", snapshot)

    def _chat(self, text: str, ignore_eos: bool = False) -> None:
        engine = self.engine
        if engine is None:
            self.emit("failed", "reply", "no model is loaded yet")
            return
        self.emit("busy_changed", "reply", True)
        self.emit("reply_started", time.monotonic())
        batch: list = []
        last_emit = last_snapshot = time.monotonic()
        interval = self.batch_interval_s()
        snapshot_interval = max(KV_SNAPSHOT_INTERVAL_S, interval)  # (no wake-up of its own between batches)
        try:
            self.faults.inject("chat")
            for event in engine.chat(text, ignore_eos=ignore_eos):
                batch.append(event)
                # Metrics come just before their step's token: hold them so the two travel together.
                if isinstance(event, StepMetrics):
                    self.faults.inject("step")
                    continue
                now = time.monotonic()
                # a settings answer leaves at once: the window shows the change only when it arrives
                if isinstance(event, (DoneEvent, SettingsApplied, SettingsRefused)) \
                        or now - last_emit >= interval:
                    self.emit("events", batch)
                    batch, last_emit = [], now
                if isinstance(event, DoneEvent) or now - last_snapshot >= snapshot_interval:
                    self._emit_kv_snapshot(engine)  # the generator is paused: between steps
                    last_snapshot = now
        except Exception as error:  # a failed turn is not part of the conversation (Engine.chat)
            if batch:
                self.emit("events", batch)
                batch = []
            self.emit("failed", "reply", one_line(error))
        finally:
            if batch:
                self.emit("events", batch)
            self.emit("busy_changed", "reply", False)


def _refusal_line(error: BaseException) -> str:
    return one_line(error) if isinstance(error, ValueError) else f"the engine could not take it: {one_line(error)}"


def serve(conn) -> None:
    """A process's whole life as the engine host: commands arrive on `conn` (a multiprocessing
    Connection), emitted events leave on it as (kind, args) tuples, and a final ("exited", (reason,))
    says the host is done ("quit" when told to). Apply/Stop/Query/Quit are handled by a listener
    thread the moment they arrive, so they reach the engine mid-step as they would on a thread."""
    send_lock = threading.Lock()
    host: EngineHost | None = None

    def emit(kind: str, *args) -> None:
        with send_lock:
            try:
                conn.send((kind, args))
            except (OSError, ValueError):  # the front end is gone: stop what runs and end quietly
                if host is not None:
                    host.quit()

    host = EngineHost(emit)
    commands: queue.Queue = queue.Queue()

    def listen() -> None:
        while True:
            try:
                message = conn.recv()
            except (EOFError, OSError):  # the front end is gone: end as if told to
                message = Quit()
            except Exception as error:  # an unreadable message: say so, keep listening
                _report(emit, f"a command could not be read: {one_line(error)}")
                continue
            try:
                host.faults.inject("listener")
                if isinstance(message, Quit):
                    host.quit()
                    commands.put(message)
                    return
                if isinstance(message, IMMEDIATE):
                    host.dispatch(message)
                else:
                    commands.put(message)
            except Exception as error:  # the listener must outlive any one message, and say what was lost
                _report_lost(emit, host, message, error)

    threading.Thread(target=listen, name="membound-host-listener", daemon=True).start()
    reason = "quit"
    try:
        host.run(commands)
    except BaseException as error:
        reason = f"the engine's loop ended: {one_line(error)}"
        raise
    finally:
        try:
            emit("exited", reason)
        except (OSError, ValueError):
            pass
        conn.close()


def _report_lost(emit, host: EngineHost, message, error: BaseException) -> None:
    """A message the listener could not hand on: answer it as failed, so no front end waits for it."""
    line = one_line(error)
    if isinstance(message, Apply):
        _report(emit, None, SettingsRefused(message.request_id, _refusal_line(error),
                                            host.engine.settings if host.engine else None))
        return
    what = FAILED_AS.get(type(message))
    try:
        if what is not None:
            emit("failed", what, f"the engine could not take the command: {line}")
            if what in ("load", "reply"):
                emit("busy_changed", what, False)
        elif isinstance(message, Query):
            emit("state", host.engine.settings if host.engine else None)
        else:
            emit("failed", "engine", f"the engine could not handle {type(message).__name__}: {line}")
    except (OSError, ValueError):
        pass


def _report(emit, message: str | None, event=None) -> None:
    try:
        if event is not None:
            emit("events", [event])
        if message is not None:
            emit("failed", "engine", message)
    except (OSError, ValueError):
        pass
