"""Record a session to a file (app/replay.py plays one back in the window with no engine and no torch).

A recording is gzip'd JSON lines: a header, then one entry per thing the window acted on, in the
order it acted — `[t_s since start, monotonic time, kind, args]`, where `kind` is a worker signal
("events", "model_loaded", …; args as the signal carried them) or a window action ("send",
"new_chat", "hardware", "tour", …). Values are the engine contract's plain dataclasses, written by
class name; reading builds only those classes (nothing else is ever constructed from a file)."""
from __future__ import annotations

import dataclasses
import datetime
import gzip
import importlib
import json
import math
import sys
import time
import zlib
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from PySide6.QtCore import QObject, QTimer

from app.i18n import translate
from app.sources import SIGNALS

DEFAULT_RECORDING = Path(__file__).resolve().parents[1] / "assets" / "tour-default.membound"
FORMAT = "membound-recording"
VERSION = 1
FLUSH_MS = 1000
KV_SNAPSHOT_EVERY_S = 0.5  # the KV panel's pictures kept in a recording (the plots' data: every one)

# the engine's signals a recording keeps (app/sources.py, where each is described)
WORKER_SIGNALS = SIGNALS
# the torch-free contract: every dataclass a recording may hold is defined in one of these
CONTRACT_MODULES = ("engine.settings", "engine.events", "engine.metrics", "engine.protocol", "engine.model.config",
                    "engine.hardware.spec", "engine.hardware.nvml", "engine.kv.blocks")


class RecordingError(ValueError):
    """A recording that cannot be read (one line, naming the file)."""


def _contract_types() -> dict[str, type]:
    types: dict[str, type] = {}
    for name in CONTRACT_MODULES:
        module = importlib.import_module(name)
        for value in vars(module).values():
            if isinstance(value, type) and dataclasses.is_dataclass(value) and value.__module__ == name:
                types[value.__name__] = value
    return types


TYPES = _contract_types()


# ---- values <-> JSON ----------------------------------------------------------------------------
def encode(value: Any) -> Any:
    """A JSON-able form of a contract value: dataclasses by name, tuples and dicts tagged (floats
    as Python writes them, so they read back bit for bit; NaN and infinities included)."""
    if value is None or isinstance(value, (bool, str)):
        return value
    if isinstance(value, int):
        return int(value)
    if isinstance(value, float):
        return float(value)
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        name = type(value).__name__
        if TYPES.get(name) is not type(value):
            raise TypeError(f"a recording holds the engine contract's dataclasses, not {name}")
        out = {"@": name}
        for field in dataclasses.fields(value):
            out[field.name] = encode(getattr(value, field.name))
        return out
    if isinstance(value, tuple):
        return {"@t": [encode(v) for v in value]}
    if isinstance(value, list):
        return [encode(v) for v in value]
    if isinstance(value, dict):
        return {"@d": [[encode(k), encode(v)] for k, v in value.items()]}
    if hasattr(value, "item"):  # a numpy scalar
        return encode(value.item())
    raise TypeError(f"cannot record a {type(value).__name__}")


def decode(value: Any) -> Any:
    if isinstance(value, list):
        return [decode(v) for v in value]
    if not isinstance(value, dict):
        return value
    if "@t" in value:
        return tuple(decode(v) for v in value["@t"])
    if "@d" in value:
        return {decode(k): decode(v) for k, v in value["@d"]}
    name = value.get("@")
    cls = TYPES.get(name)
    if cls is None:
        raise ValueError(f"unknown type {name!r}")
    names = {f.name for f in dataclasses.fields(cls) if f.init}
    # fields a newer membound wrote and this one lacks are dropped; missing ones take their defaults
    return cls(**{k: decode(v) for k, v in value.items() if k in names})


# ---- the file -----------------------------------------------------------------------------------
@dataclass(frozen=True)
class Entry:
    t_s: float  # seconds since the recording started
    mono_s: float  # time.monotonic() when the window acted on it
    kind: str
    args: tuple


@dataclass
class Recording:
    path: str
    header: dict
    entries: list[Entry]
    truncated: bool = False  # the file ended mid-write (the app was killed): what came before is kept

    @property
    def duration_s(self) -> float:
        return self.entries[-1].t_s if self.entries else 0.0

    def first(self, kind: str) -> Entry | None:
        return next((e for e in self.entries if e.kind == kind), None)

    @property
    def model_info(self):
        entry = self.first("model_loaded")
        return entry.args[0] if entry is not None else None

    def describe(self, model: bool = True) -> str:
        """'recorded 2025-11-30 14:02 · NVIDIA H200 · SmolLM2-135M…' (model=False: the date alone)."""
        parts = []
        created = self.header.get("created")
        if created:
            try:
                created = datetime.datetime.fromisoformat(created).strftime("%Y-%m-%d %H:%M")
            except ValueError:
                pass
            parts.append(translate("Replay", "recorded {when}").format(when=created))
        info = self.model_info
        if info is not None and model:
            parts += [info.hardware.name, info.label.split(" (")[0]]
        return " · ".join(parts)


def read_recording(path: str | Path) -> Recording:
    """The whole file; RecordingError (one line naming the file) if it is not a recording."""
    name = str(path)
    try:
        raw = gzip.open(path, "rt", encoding="utf-8")
        header_line = raw.readline()
    except FileNotFoundError:
        raise RecordingError(f"{name}: no such file") from None
    except (OSError, EOFError, zlib.error, UnicodeDecodeError) as error:
        raise RecordingError(f"{name}: not a membound recording ({error})") from None
    try:
        header = json.loads(header_line)
    except json.JSONDecodeError:
        header = None
    if not isinstance(header, dict) or header.get("format") != FORMAT:
        raise RecordingError(f"{name}: not a membound recording (no {FORMAT} header)")
    if header.get("version", 0) > VERSION:
        raise RecordingError(f"{name}: recording format {header.get('version')} is newer than this membound reads "
                             f"({VERSION}); update membound")
    entries, truncated = [], False
    with raw:
        line_no = 1
        while True:
            try:
                line = raw.readline()
            except (OSError, EOFError, zlib.error):
                truncated = True
                break
            if not line:
                break
            line_no += 1
            try:
                t_s, mono_s, kind, args = json.loads(line)
                entries.append(Entry(float(t_s), float(mono_s), str(kind), tuple(decode(a) for a in args)))
            except json.JSONDecodeError:
                if not line.endswith("\n"):  # the last line, cut short
                    truncated = True
                    break
                raise RecordingError(f"{name}: line {line_no} is not JSON") from None
            except (TypeError, ValueError) as error:
                raise RecordingError(f"{name}: line {line_no}: {error}") from None
    return Recording(name, header, entries, truncated)


class Recorder(QObject):
    """Writes everything the window acts on to `path`. `MainWindow(recorder=...)` attaches it before
    the window connects to its worker, so each signal is written before the window handles it and
    the file's order is the window's. Writes go out once a second and at close."""

    def __init__(self, path: str | Path, parent=None):
        super().__init__(parent)
        self.path = str(path)
        try:
            self._file = gzip.open(self.path, "wt", encoding="utf-8", compresslevel=9)
        except OSError as error:
            raise RecordingError(f"cannot record to {self.path}: {error.strerror or error}") from None
        self._t0 = time.monotonic()
        self._pending: list[str] = []
        self._last_snapshot_s = -math.inf
        self.skipped: set[str] = set()  # kinds with a value a recording cannot hold
        self.count = 0
        self._taps: list[_Tap] = []
        self._timer: QTimer | None = None
        header = {"format": FORMAT, "version": VERSION,
                  "created": datetime.datetime.now().astimezone().isoformat(timespec="seconds")}
        self._pending.append(json.dumps(header))

    def attach(self, window) -> None:
        for name in WORKER_SIGNALS:
            tap = _Tap(self, name)
            getattr(window.worker, name).connect(tap.on)
            self._taps.append(tap)
        window.action.connect(self._on_action)
        window.closing.connect(self.close)
        self._timer = QTimer(self)
        self._timer.setInterval(FLUSH_MS)
        self._timer.timeout.connect(self.flush)
        self._timer.start()

    def _on_action(self, kind: str, args) -> None:
        self.record(kind, args if isinstance(args, tuple) else (args,))

    def record(self, kind: str, args: tuple) -> None:
        if self._file is None:
            return
        now = time.monotonic()
        if kind == "kv_snapshot":  # a GPU's pool has ~10^5 blocks: a few pictures a second are plenty
            if now - self._last_snapshot_s < KV_SNAPSHOT_EVERY_S:
                return
            self._last_snapshot_s = now
        try:
            line = json.dumps([round(now - self._t0, 6), now, kind, [encode(a) for a in args]])
        except TypeError as error:  # a value outside the contract: the window showed it, the file says so once
            if kind not in self.skipped:
                self.skipped.add(kind)
                print(f"membound: recording leaves out {kind!r}: {error}", file=sys.stderr)
            return
        self._pending.append(line)
        self.count += 1

    def flush(self) -> None:
        if self._file is None or not self._pending:
            return
        lines, self._pending = self._pending, []
        self._file.write("\n".join(lines) + "\n")
        self._file.flush()

    def close(self) -> None:
        if self._timer is not None:
            self._timer.stop()
        if self._file is not None:
            self.flush()
            self._file.close()
            self._file = None


class _Tap(QObject):
    """One worker signal into the recorder (a QObject slot: queued to the GUI thread like the window's)."""

    def __init__(self, recorder: Recorder, name: str):
        super().__init__(recorder)
        self.recorder, self.name = recorder, name

    def on(self, *args) -> None:
        self.recorder.record(self.name, args)
