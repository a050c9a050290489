"""The worker thread: the only owner of the `Engine`. Commands go in through a queue (load, chat,
reset, quit); events come out as Qt signals carrying plain data (the engine's frozen event
dataclasses, lists of them, strings). `apply()` and `stop()` go straight to the engine, which
takes them at its next step boundary."""
from __future__ import annotations

import queue
import time
import weakref
from dataclasses import dataclass
from typing import Any

from PySide6.QtCore import QThread, Signal

from engine.config import ModelConfig
from engine.engine import DoneEvent, Engine, Settings
from engine.hardware import DeviceSpec
from engine.metrics import StepMetrics

# Events reach the GUI in batches at most this often (and at once when the engine is slower),
# so a tiny model decoding thousands of tokens a second does not flood the event loop.
BATCH_INTERVAL_S = 1 / 60
KV_SNAPSHOT_INTERVAL_S = 0.15  # the KV panel needs a few pictures a second, not one per token

_workers: "weakref.WeakSet[EngineWorker]" = weakref.WeakSet()


def running_workers() -> list["EngineWorker"]:
    """Workers whose thread is still running (the tests' leak check)."""
    running = []
    for worker in list(_workers):
        try:
            if worker.isRunning():
                running.append(worker)
        except RuntimeError:  # its C++ object is gone with its parent window: the thread ended before
            pass
    return running


@dataclass(frozen=True)
class ModelInfo:
    """What the GUI needs to know about a loaded model (plain data)."""
    label: str
    source: str  # "gguf", "hf", "synthetic"
    device: str
    cfg: ModelConfig
    weight_bytes: int  # matmul weights one step reads, at the current dtype
    hardware: DeviceSpec
    settings: Settings


@dataclass(frozen=True)
class Load:
    model: Any  # "default", "synthetic:SHAPE", a path, or a prebuilt engine.loader.LoadedWeights
    device: str = "auto"
    settings: Settings | None = None  # None: the device's default dtype
    hardware: DeviceSpec | None = None  # None: measured (once per process)
    max_context: int = 4096


@dataclass(frozen=True)
class Chat:
    text: str


@dataclass(frozen=True)
class Reset:
    pass


@dataclass(frozen=True)
class MeasureQuality:
    """Perplexity and top-1 agreement of fp / int8 / int4 on the evaluation text (seconds on a CPU)."""
    n_tokens: int = 256


@dataclass(frozen=True)
class Quit:
    pass


class _Cancelled(BaseException):
    """Raised inside a model load from its progress callback when the window closes."""


def one_line(error: BaseException) -> str:
    text = str(error).strip().splitlines()
    message = text[0] if text else ""
    if isinstance(error, MemoryError) or "out of memory" in message.lower():
        return f"out of memory: {message or 'the allocation failed'}"
    if isinstance(error, (ValueError, FileNotFoundError, PermissionError)):
        return message or type(error).__name__
    return f"{type(error).__name__}: {message}" if message else type(error).__name__


def default_dtype(device_kind: str) -> str:
    return "bf16" if device_kind == "cuda" else "fp32"


class EngineWorker(QThread):
    progress = Signal(float, str)  # fraction, message (model loading, device measurement)
    model_loaded = Signal(object)  # ModelInfo
    events = Signal(object)  # list of engine events, in order
    reply_started = Signal(float)  # time.monotonic() when the prompt was handed to the engine
    busy_changed = Signal(str, bool)  # ("load" | "reply", running): sent at the start and the end
    failed = Signal(str, str)  # (what failed: "load" | "reply" | "settings", one-line message)
    kv_snapshot = Signal(object)  # engine.paged.KVCacheSnapshot: the KV cache's blocks, plain data
    quality = Signal(object)  # {label: engine.perplexity.Quality} for the weight settings

    def __init__(self, parent=None):
        super().__init__(parent)
        self.setObjectName("EngineWorker")
        self._commands: queue.Queue = queue.Queue()
        self._engine: Engine | None = None
        self._quitting = False
        _workers.add(self)

    # ---- GUI thread -------------------------------------------------------------------------
    def submit(self, command) -> None:
        self._commands.put(command)

    def apply(self, settings: Settings) -> None:
        """Raises ValueError (one-line message) for settings the device cannot run."""
        engine = self._engine
        if engine is not None:
            engine.apply(settings)

    def stop(self) -> None:
        engine = self._engine
        if engine is not None:
            engine.stop()

    @property
    def engine(self) -> Engine | None:
        return self._engine

    def shutdown(self, timeout_s: float = 30.0) -> bool:
        """Stop the reply or load in progress and end the thread; True if it ended in time."""
        self._quitting = True
        self.stop()
        self._commands.put(Quit())
        if not self.isRunning():
            return True
        return self.wait(int(timeout_s * 1000))

    # ---- worker thread ----------------------------------------------------------------------
    def run(self) -> None:
        while True:
            command = self._commands.get()
            if isinstance(command, Quit) or self._quitting:
                return
            try:
                if isinstance(command, Load):
                    self._load(command)
                elif isinstance(command, Chat):
                    self._chat(command.text)
                elif isinstance(command, MeasureQuality):
                    self._measure_quality(command)
                elif isinstance(command, Reset):
                    if self._engine is not None:
                        self._engine.reset()
                        self._emit_kv_snapshot(self._engine)
            except _Cancelled:
                return

    def _progress(self, fraction: float, message: str) -> None:
        if self._quitting:
            raise _Cancelled()
        self.progress.emit(float(fraction), str(message))

    def _load(self, command: Load) -> None:
        self.busy_changed.emit("load", True)
        try:
            hardware = command.hardware
            device = command.device
            if device == "auto":
                if hardware is not None:
                    device = hardware.kind
                else:
                    from engine.hardware import detect_device
                    device = detect_device("auto", measure=False).kind
            settings = command.settings or Settings(dtype=default_dtype(device))
            self._progress(0.0, f"loading {command.model if isinstance(command.model, str) else 'model'}…")
            engine = Engine(command.model, device=device, dtype=settings.dtype, max_context=command.max_context,
                            progress=self._progress, hardware=hardware, settings=settings)
            old, self._engine = self._engine, engine
            if old is not None:
                old.stop()
            self._progress(1.0, "ready")
            self.model_loaded.emit(ModelInfo(
                label=engine.loaded.label, source=engine.loaded.source, device=device, cfg=engine.cfg,
                weight_bytes=engine.model.linear_weight_bytes(), hardware=engine.hardware,
                settings=engine.settings))
            self._emit_kv_snapshot(engine)
        except _Cancelled:
            raise
        except Exception as error:  # the old model (if any) stays loaded and usable
            self.failed.emit("load", one_line(error))
        finally:
            self.busy_changed.emit("load", False)

    def _measure_quality(self, command: MeasureQuality) -> None:
        engine = self._engine
        if engine is None:
            return
        from engine.perplexity import weight_quality
        try:
            self.quality.emit(weight_quality(engine, n_tokens=command.n_tokens))
        except Exception as error:  # quality is extra information: report, keep running
            self.failed.emit("quality", one_line(error))

    def _emit_kv_snapshot(self, engine: Engine) -> None:
        try:
            self.kv_snapshot.emit(engine.kv_snapshot())
        except Exception:  # the panel is a view: a failed snapshot must not end the reply
            pass

    def _chat(self, text: str) -> None:
        engine = self._engine
        if engine is None:
            self.failed.emit("reply", "no model is loaded yet")
            return
        kept_messages = list(engine.messages)
        self.busy_changed.emit("reply", True)
        self.reply_started.emit(time.monotonic())
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
                    self.events.emit(batch)
                    batch, last_emit = [], now
                if isinstance(event, DoneEvent) or now - last_snapshot >= KV_SNAPSHOT_INTERVAL_S:
                    self._emit_kv_snapshot(engine)  # the generator is paused: between steps
                    last_snapshot = now
        except Exception as error:  # a failed turn is not part of the conversation
            engine.messages = kept_messages
            if batch:
                self.events.emit(batch)
                batch = []
            self.failed.emit("reply", one_line(error))
        finally:
            if batch:
                self.events.emit(batch)
            self.busy_changed.emit("reply", False)
