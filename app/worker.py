"""The worker: the GUI's only line to the `Engine`, which an `engine.host.EngineHost` owns.

Two ways to run the host, one interface (the window's `EventSource`, app/sources.py): commands go in
(`submit`, `request`, `stop`, `query`), events come out as Qt signals carrying plain data
(engine/events.py, engine/protocol.py).
- `process=True` (the app): the host runs in a process of its own and this QThread relays its
  pipe to the signals. The GUI process never imports torch; the engine's Python never waits for
  the GIL while the GUI draws; closing the window never waits on a long step (the process is ended
  if it does not stop in time); a process that dies (killed, crashed, out of memory) is told apart
  from one that quit, and reported with `engine_died` within a second.
- `process=False` (most tests, `--engine-thread`): the host runs on this QThread itself, and the
  test can reach the engine (`worker.engine`): torch is then in this process."""
from __future__ import annotations

import multiprocessing
import multiprocessing.connection
import pickle
import queue
import signal
import threading
import weakref
from dataclasses import replace

from PySide6.QtCore import QThread

from app.sources import EventSource

from engine.options import EngineOptions, openmp_wait_policy
from engine.protocol import Apply, Load, Query, Quit, Stop, engine_process_main

PROCESS_EXIT_WAIT_S = 5.0  # after Quit, how long the engine process may take before it is ended
DEATH_POLL_S = 0.5  # the relay also wakes this often to see whether the process is still there

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


def describe_exit(exitcode: int | None) -> str:
    """How an engine process ended, in words."""
    if exitcode is None:
        return "stopped answering"
    if exitcode < 0:
        try:
            name = signal.Signals(-exitcode).name
        except ValueError:
            name = f"signal {-exitcode}"
        if -exitcode == signal.SIGKILL:
            return f"was killed ({name}; the system may have run out of memory)"
        return f"was killed ({name})"
    return f"crashed (exit code {exitcode})"


class EngineWorker(QThread, EventSource):
    """The local engine as the window's source (app/sources.py: its signals, commands and answers)."""

    def __init__(self, parent=None, process: bool = False):
        super().__init__(parent)
        self.setObjectName("EngineWorker")
        self.process_mode = process
        self._quitting = False
        # thread mode
        self._commands: queue.Queue = queue.Queue()
        self._host = None
        if not process:
            from engine.host import EngineHost  # torch comes with it: thread mode only
            self._host = EngineHost(self._emit)
        # process mode
        self._process = None
        self._conn = None
        self._unsent: list = []  # commands given before the process was up
        self._send_lock = threading.Lock()
        _workers.add(self)

    def _emit(self, kind: str, *args) -> None:
        if kind == "exited":
            return
        getattr(self, kind).emit(*args)

    # ---- GUI thread -------------------------------------------------------------------------
    def submit(self, command) -> None:
        """Queue a command (Load, Chat, Reset, MeasureQuality). In process mode a Load after the
        process has died starts a new one."""
        if self.process_mode:
            if isinstance(command, Load) and self._process is not None and not self._quitting \
                    and not self._process.is_alive():
                self.restart_process()
            if isinstance(command, Load) and not isinstance(command.model, str):
                # A model already in memory crosses as plain pickled bytes: the pipe's own pickler would
                # share its tensors through file descriptors, which needs a helper thread that never ends.
                command = replace(command, model=pickle.dumps(command.model))
            self._send(command)
        else:
            self._commands.put(command)

    def request(self, command: Apply) -> None:
        """A settings change; the engine answers its request id with SettingsApplied or SettingsRefused
        (an `events` signal). Never raises."""
        if self.process_mode:
            self._send(command)
        else:
            self._host.request(command)

    def stop(self) -> None:
        if self.process_mode:
            self._send(Stop())
        else:
            self._host.stop()

    def query(self) -> None:
        """Ask what the engine runs: answered by the `state` signal."""
        if self.process_mode:
            self._send(Query())
        else:
            self._host.query()

    @property
    def engine(self):
        """The engine itself when it runs on this thread (None in process mode)."""
        return self._host.engine if self._host is not None else None

    def shares_cpu(self, device: str) -> bool:
        return not (device == "cuda" or str(device).startswith("cuda:"))

    @property
    def pid(self) -> int | None:
        process = self._process
        return process.pid if process is not None else None

    def process_alive(self) -> bool:
        process = self._process
        return process is not None and process.is_alive()

    def restart_process(self) -> None:
        """After the engine process died: end the relay and start a fresh process (empty: the
        caller loads a model into it)."""
        self.wait(5000)  # its relay ends right after reporting the death
        self._end_process()
        self._process = None
        self.start()

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
        from engine.host import Cancelled
        try:
            self._host.run(self._commands)
        except Cancelled:
            pass

    def _relay(self) -> None:
        context = multiprocessing.get_context("spawn")  # never fork a process that runs Qt
        ours, theirs = context.Pipe(duplex=True)
        process = context.Process(target=engine_process_main, args=(theirs,), name="membound-engine", daemon=True)
        # The child inherits this environment; MEMBOUND_ENGINE_OMP_WAIT_POLICY sets the engine's
        # OpenMP waiting alone (the app's own process does no torch work), for measuring both.
        with openmp_wait_policy(EngineOptions.from_environ().engine_omp_wait_policy):
            process.start()
        theirs.close()
        self._process = process
        with self._send_lock:
            self._conn = ours
            try:
                for message in self._unsent:
                    ours.send(message)
            except (OSError, ValueError):  # it died already: _pump reports it
                pass
            self._unsent = []
        reason = self._pump(ours, process)
        with self._send_lock:
            self._conn = None
        ours.close()
        if reason is not None and not self._quitting:
            process.join(1.0)
            if reason == "":
                reason = f"the engine process {describe_exit(process.exitcode)}"
            self.engine_died.emit(reason)

    def _pump(self, conn, process) -> str | None:
        """Relay messages until the process says it exited (None: it quit as told; else why not)
        or dies ("": its exit code tells)."""
        while True:
            ready = multiprocessing.connection.wait([conn, process.sentinel], timeout=DEATH_POLL_S)
            if conn in ready:
                try:
                    kind, args = conn.recv()
                except (EOFError, OSError):
                    return ""
                if kind == "exited":
                    reason = args[0] if args else "quit"
                    return None if reason == "quit" else reason
                self._emit(kind, *args)
            elif process.sentinel in ready or not process.is_alive():
                while conn.poll():  # what it sent before it died still counts
                    try:
                        kind, args = conn.recv()
                    except (EOFError, OSError):
                        break
                    if kind != "exited":
                        self._emit(kind, *args)
                return ""
