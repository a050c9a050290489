"""The worker: the GUI's only line to the `Engine`, which an `engine.host.EngineHost` owns.

Two ways to run the host, one interface: commands go in (`submit`, `apply`, `stop`), events come
out as Qt signals carrying plain data (the engine's frozen event dataclasses, lists of them,
strings).
- `process=True` (the app): the host runs in a process of its own and this QThread relays its
  pipe to the signals. The engine's Python never waits for the GIL while the GUI draws (in one
  process the app decoded at about half of `membound bench`'s speed on a 2-core CPU), and closing
  the window never waits on a long step: the process is ended if it does not stop in time.
- `process=False` (most tests, `--engine-thread`): the host runs on this QThread itself, and the
  test can reach the engine (`worker.engine`)."""
from __future__ import annotations

import multiprocessing
import os
import pickle
import queue
import threading
import weakref
from dataclasses import replace

from PySide6.QtCore import QThread, Signal

from engine.host import Cancelled, EngineHost
from engine.protocol import Apply, Chat, Load, MeasureQuality, ModelInfo, Quit, Reset, Stop, default_dtype, one_line
from engine.settings import Settings

__all__ = ["EngineWorker", "Chat", "Load", "MeasureQuality", "ModelInfo", "Reset", "default_dtype", "one_line",
           "running_workers"]

PROCESS_EXIT_WAIT_S = 5.0  # after Quit, how long the engine process may take before it is ended

_workers: "weakref.WeakSet[EngineWorker]" = weakref.WeakSet()


def running_workers() -> list["EngineWorker"]:
    """Workers whose thread or engine process is still running (the tests' leak check)."""
    running = []
    for worker in list(_workers):
        try:
            if worker.isRunning() or worker.process_alive():
                running.append(worker)
        except RuntimeError:  # its C++ object is gone with its parent window: the thread ended before
            pass
    return running


class EngineWorker(QThread):
    progress = Signal(float, str)  # fraction, message (model loading, device measurement)
    model_loaded = Signal(object)  # ModelInfo
    events = Signal(object)  # list of engine events, in order
    reply_started = Signal(float)  # time.monotonic() when the prompt was handed to the engine
    busy_changed = Signal(str, bool)  # ("load" | "reply", running): sent at the start and the end
    failed = Signal(str, str)  # (what failed: "load" | "reply" | "settings" | "quality" | "engine", message)
    kv_snapshot = Signal(object)  # engine.paged.KVCacheSnapshot: the KV cache's blocks, plain data
    quality = Signal(object)  # {label: engine.perplexity.Quality} for the weight settings

    def __init__(self, parent=None, process: bool = False):
        super().__init__(parent)
        self.setObjectName("EngineWorker")
        self.process_mode = process
        self._quitting = False
        self._device = "cpu"  # of the loaded model: settings are checked against it at once
        # thread mode
        self._commands: queue.Queue = queue.Queue()
        self._host = EngineHost(self._emit)
        # process mode
        self._process = None
        self._conn = None
        self._unsent: list = []  # commands given before the process was up
        self._send_lock = threading.Lock()
        self.model_loaded.connect(self._remember_device)
        _workers.add(self)

    def _emit(self, kind: str, *args) -> None:
        getattr(self, kind).emit(*args)

    def _remember_device(self, info: ModelInfo) -> None:
        self._device = info.device

    # ---- GUI thread -------------------------------------------------------------------------
    def submit(self, command) -> None:
        if self.process_mode:
            if isinstance(command, Load) and self._process is not None and not self._quitting \
                    and not self._process.is_alive():
                self.wait(5000)  # its relay ends right after reporting the death
                self._end_process()  # it died: a new load starts a new one
                self._process = None
                self.start()
            if not isinstance(command, Load) or isinstance(command.model, str):
                self._send(command)
                return
            # A model already in memory crosses as plain pickled bytes: the pipe's own pickler would
            # share its tensors through file descriptors, which needs a helper thread that never ends.
            self._send(replace(command, model=pickle.dumps(command.model)))
        else:
            self._commands.put(command)

    def apply(self, settings: Settings) -> None:
        """Raises ValueError (one-line message) for settings the device cannot run; a failure
        only the engine can find (a quantisation the shapes do not allow) comes back as
        failed("settings", ...)."""
        if self.process_mode:
            settings.validate(self._device)
            self._send(Apply(settings))
        else:
            self._host.apply(settings)

    def stop(self) -> None:
        if self.process_mode:
            self._send(Stop())
        else:
            self._host.stop()

    @property
    def engine(self):
        """The engine itself when it runs on this thread (None in process mode)."""
        return self._host.engine

    def process_alive(self) -> bool:
        process = self._process
        return process is not None and process.is_alive()

    def shutdown(self, timeout_s: float = 30.0) -> bool:
        """Stop the reply or load in progress and end the thread (and the engine process);
        True if it ended in time."""
        self._quitting = True
        if self.process_mode:
            self._send(Quit())
            ended = self.wait(int(PROCESS_EXIT_WAIT_S * 1000)) if self.isRunning() else True
            self._end_process()
            return self.wait(int(timeout_s * 1000)) if not ended else True
        self._host.quit()
        self._commands.put(Quit())
        if not self.isRunning():
            return True
        return self.wait(int(timeout_s * 1000))

    def _send(self, message) -> None:
        with self._send_lock:
            if self._conn is None:
                self._unsent.append(message)
                return
            try:
                self._conn.send(message)
            except (OSError, ValueError):  # the process has gone; the relay reports it
                pass

    def _end_process(self) -> None:
        process = self._process
        if process is None:
            return
        process.join(PROCESS_EXIT_WAIT_S if process.is_alive() else 0)
        if process.is_alive():  # in the middle of a long step: it holds nothing worth waiting for
            process.terminate()
            process.join(2.0)
        if process.is_alive():
            process.kill()
            process.join(2.0)
        with self._send_lock:
            if self._conn is not None:
                self._conn.close()
                self._conn = None

    # ---- worker thread ----------------------------------------------------------------------
    def run(self) -> None:
        if self.process_mode:
            self._relay()
            return
        try:
            self._host.run(self._commands)
        except Cancelled:
            pass

    def _relay(self) -> None:
        from engine.host import serve

        context = multiprocessing.get_context("spawn")  # never fork a process that runs Qt
        ours, theirs = context.Pipe(duplex=True)
        process = context.Process(target=serve, args=(theirs,), name="membound-engine", daemon=True)
        # The child inherits this environment; MEMBOUND_ENGINE_OMP_WAIT_POLICY sets the engine's
        # OpenMP waiting alone (the app's own process does no torch work), for measuring both.
        policy = os.environ.get("MEMBOUND_ENGINE_OMP_WAIT_POLICY")
        saved = os.environ.get("OMP_WAIT_POLICY")
        if policy:
            os.environ["OMP_WAIT_POLICY"] = policy
        try:
            process.start()
        finally:
            if policy:
                os.environ.pop("OMP_WAIT_POLICY", None) if saved is None else os.environ.update(OMP_WAIT_POLICY=saved)
        theirs.close()
        self._process = process
        with self._send_lock:
            self._conn = ours
            for message in self._unsent:
                ours.send(message)
            self._unsent = []
        while True:
            try:
                kind, args = ours.recv()
            except (EOFError, OSError):
                with self._send_lock:
                    self._conn = None
                if not self._quitting:
                    process.join(1.0)
                    self.failed.emit("engine", f"the engine process ended unexpectedly (exit code "
                                               f"{process.exitcode}); load a model to start it again")
                    self.busy_changed.emit("reply", False)
                return
            if kind == "exited":
                with self._send_lock:
                    self._conn = None
                ours.close()
                return
            self._emit(kind, *args)
