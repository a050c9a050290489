"""The engine behind a command loop, for a front end that must never wait on it (the desktop app).

Commands go in as plain dataclasses (`Load`, `Chat`, `Reset`, `MeasureQuality`, `Quit`); events come
out through `emit(kind, *args)` with plain-data arguments. `Apply` and `Stop` do not queue: they
reach the engine at once and take effect at its next step boundary, mid-reply too.

The host runs either on a thread of the caller's process (`EngineHost.run`) or in a process of its
own (`serve`, the other end of a `multiprocessing` pipe). The app uses the process: on a CPU the
engine dispatches ~400 small operators per decode step, each needing the GIL, and in one process
the GUI thread's Python (drawing plots) holds it often enough to cost half the app's decode speed.

Emitted kinds (the app's worker turns each into a Qt signal of the same name):
    progress(fraction, message)      model loading, device measurement
    model_loaded(ModelInfo)
    events(list)                     engine events in order (StepMetrics, TokenEvent, ...)
    reply_started(t_monotonic)       when the prompt reached the engine
    busy_changed(what, running)      what: "load" | "reply"
    failed(what, message)            what: "load" | "reply" | "settings" | "quality"; one line
    kv_snapshot(KVCacheSnapshot)
    quality({label: Quality})
"""
from __future__ import annotations

import pickle
import queue
import threading
import time
from dataclasses import replace
from typing import Callable

from engine.engine import Engine
from engine.events import DoneEvent
from engine.metrics import StepMetrics
from engine.protocol import Apply, Chat, Load, MeasureQuality, ModelInfo, Quit, Reset, Stop, default_dtype, one_line
from engine.settings import Settings

# Events leave in batches at most this often (and at once when the engine is slower), so a tiny
# model decoding thousands of tokens a second does not flood the front end's event loop. Each batch
# wakes the app's relay and GUI threads, and on a 2-core CPU each wake-up pre-empts one of the
# engine's threads: at 60 batches a second the app decoded at 0.78x headless, at 10 at 0.90x
# (`python -m app.gui_bench`, docs/benchmarks.md). Ten text updates a second still read as a stream.
BATCH_INTERVAL_S = 1 / 10
KV_SNAPSHOT_INTERVAL_S = 0.15  # the KV panel needs a few pictures a second, not one per token
IDLE_WAIT_S = 0.02  # serving with nothing to run (every simulated user thinking): look again this often


_WAKE = object()  # a queued no-op: wakes the loop to look at the engine's settings again


class Cancelled(BaseException):
    """Raised inside a model load from its progress callback when the host is told to quit."""


class EngineHost:
    """Owns one `Engine` at a time. `run(commands)` executes queued commands until `Quit`;
    `apply`, `stop` and `quit` may be called from any thread."""

    def __init__(self, emit: Callable[..., None]):
        self.emit = emit
        self.engine: Engine | None = None
        self.quitting = False
        self._commands: "queue.Queue | None" = None  # run()'s queue
        self._background: list = []  # events of background serving steps not yet emitted
        self._background_emit_s = self._background_snapshot_s = 0.0

    # ---- any thread ------------------------------------------------------------------------
    def apply(self, settings: Settings) -> None:
        """Raises ValueError (one-line message) for settings the device cannot run."""
        engine = self.engine
        if engine is not None:
            engine.apply(settings)
            commands = self._commands
            if settings.users and commands is not None:
                commands.put(_WAKE)  # the loop may be waiting for a command: serving starts now

    def stop(self) -> None:
        engine = self.engine
        if engine is not None:
            engine.stop()

    def quit(self) -> None:
        self.quitting = True
        self.stop()

    # ---- the host's own thread -------------------------------------------------------------
    def run(self, commands: "queue.Queue") -> None:
        """Execute commands until Quit. Between commands, while simulated users are on, run the
        engine's background serving one step at a time (a command is looked for between steps)."""
        self._commands = commands
        while True:
            engine = self.engine
            if engine is not None and engine.serving and not self.quitting:
                try:
                    command = commands.get_nowait()
                except queue.Empty:
                    if not self._serve_step(engine):
                        try:  # nothing to run (every user thinking): wait a little for a command
                            command = commands.get(timeout=IDLE_WAIT_S)
                        except queue.Empty:
                            continue
                    else:
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

    def _serve_step(self, engine: Engine) -> bool:
        """One background step; its events leave in batches like a reply's. False: nothing ran."""
        try:
            events = engine.serve_step()
        except Exception as error:  # report once, switch the users off, keep the model
            self._flush_background()
            self.emit("failed", "serving", one_line(error))
            try:
                engine.apply(replace(engine.settings, users=0))
                engine.serve_step()
            except Exception:
                pass
            return False
        if not events:
            return False
        self._background.extend(events)
        now = time.monotonic()
        if now - self._background_emit_s >= BATCH_INTERVAL_S:
            self._flush_background()
        if now - self._background_snapshot_s >= KV_SNAPSHOT_INTERVAL_S:
            self._emit_kv_snapshot(engine)
            self._background_snapshot_s = now
        return True

    def _flush_background(self) -> None:
        if self._background:
            self.emit("events", self._background)
            self._background = []
        self._background_emit_s = time.monotonic()

    def execute(self, command) -> None:
        if isinstance(command, Load):
            self._load(command)
        elif isinstance(command, Chat):
            self._chat(command.text)
        elif isinstance(command, MeasureQuality):
            self._measure_quality(command)
        elif isinstance(command, Reset):
            if self.engine is not None:
                self.engine.reset()
                self._emit_kv_snapshot(self.engine)

    def _apply_reporting(self, settings: Settings) -> None:
        try:
            self.apply(settings)
        except ValueError as error:
            self.emit("failed", "settings", one_line(error))

    def _progress(self, fraction: float, message: str) -> None:
        if self.quitting:
            raise Cancelled()
        self.emit("progress", float(fraction), str(message))

    def _load(self, command: Load) -> None:
        self.emit("busy_changed", "load", True)
        try:
            hardware = command.hardware
            device = command.device
            if device == "auto":
                if hardware is not None:
                    device = hardware.kind
                else:
                    from engine.hardware.detect import detect_device
                    device = detect_device("auto", measure=False).kind
            settings = command.settings or Settings(dtype=default_dtype(device))
            if isinstance(command.model, bytes):  # a LoadedWeights from another process
                command = replace(command, model=pickle.loads(command.model))
            self._progress(0.0, f"loading {command.model if isinstance(command.model, str) else 'model'}…")
            engine = Engine(command.model, device=device, dtype=settings.dtype, max_context=command.max_context,
                            progress=self._progress, hardware=hardware, settings=settings)
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

    def _measure_quality(self, command: MeasureQuality) -> None:
        engine = self.engine
        if engine is None:
            return
        from engine.model.quality import weight_quality
        try:
            self.emit("quality", weight_quality(engine, n_tokens=command.n_tokens))
        except Exception as error:  # quality is extra information: report, keep running
            self.emit("failed", "quality", one_line(error))

    def _emit_kv_snapshot(self, engine: Engine) -> None:
        try:
            snapshot = engine.kv_snapshot()
        except Exception:  # the panel is a view: a failed snapshot must not end the reply
            return
        self.emit("kv_snapshot", snapshot)

    def _chat(self, text: str) -> None:
        engine = self.engine
        if engine is None:
            self.emit("failed", "reply", "no model is loaded yet")
            return
        kept_messages = list(engine.messages)
        self.emit("busy_changed", "reply", True)
        self.emit("reply_started", time.monotonic())
        batch: list = []
        last_emit = last_snapshot = time.monotonic()
        try:
            for event in engine.chat(text):
                batch.append(event)
                # Metrics come just before their step's token: hold them so the two travel together.
                if isinstance(event, StepMetrics):
                    continue
                now = time.monotonic()
                if isinstance(event, DoneEvent) or now - last_emit >= BATCH_INTERVAL_S:
                    self.emit("events", batch)
                    batch, last_emit = [], now
                if isinstance(event, DoneEvent) or now - last_snapshot >= KV_SNAPSHOT_INTERVAL_S:
                    self._emit_kv_snapshot(engine)  # the generator is paused: between steps
                    last_snapshot = now
        except Exception as error:  # a failed turn is not part of the conversation
            engine.messages = kept_messages
            if batch:
                self.emit("events", batch)
                batch = []
            self.emit("failed", "reply", one_line(error))
        finally:
            if batch:
                self.emit("events", batch)
            self.emit("busy_changed", "reply", False)


def serve(conn) -> None:
    """A process's whole life as the engine host: commands arrive on `conn` (a multiprocessing
    Connection), emitted events leave on it as (kind, args) tuples, and a final ("exited", ())
    says the host is done. Apply/Stop/Quit are handled by a listener thread the moment they
    arrive, so they reach the engine mid-step as they would on a thread."""
    send_lock = threading.Lock()

    def emit(kind: str, *args) -> None:
        with send_lock:
            conn.send((kind, args))

    host = EngineHost(emit)
    commands: queue.Queue = queue.Queue()

    def listen() -> None:
        while True:
            try:
                message = conn.recv()
            except (EOFError, OSError):  # the front end is gone: end as if told to
                message = Quit()
            if isinstance(message, Apply):
                host._apply_reporting(message.settings)
            elif isinstance(message, Stop):
                host.stop()
            elif isinstance(message, Quit):
                host.quit()
                commands.put(message)
                return
            else:
                commands.put(message)

    threading.Thread(target=listen, name="membound-host-listener", daemon=True).start()
    try:
        host.run(commands)
    finally:
        try:
            emit("exited", )
        except (OSError, ValueError):
            pass
        conn.close()
