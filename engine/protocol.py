"""The contract between the engine process and a front end, torch-free: the commands that go in,
`ModelInfo` and `Capabilities` that come out at load, and the one-line error format. Events are in
engine/events.py, step figures in engine/metrics.py; all of it is plain data that pickles."""
from __future__ import annotations

import dataclasses
import importlib
from dataclasses import dataclass, field
from typing import Any

from engine.hardware.spec import DeviceSpec
from engine.model.config import ModelConfig
from engine.settings import DRAFT_GROUP_SIZE, GROUP_SIZES, EngineError, Settings, group_size_refusal

ENGINE_ENTRY_POINT = ("engine.host", "serve")  # what the engine process runs: serve(conn)


@dataclass(frozen=True)
class Capabilities:
    """What the loaded model on its device can take, beyond what `Settings.validate` checks for
    any model: the front end disables what is refused here, with the reason as the tooltip, and
    the engine refuses the same settings with the same line."""
    device: str
    group_sizes: dict[int, str]  # INT4 group size -> why this model cannot take it ("" if it can)
    max_users: dict[str, int]  # dtype -> simulated users the KV memory holds beside a full chat
    notes: dict[str, str] = field(default_factory=dict)  # "field=value" -> a kernel fallback it runs with
    captured_step: str = ""  # what `cuda_graphs` captures here: "CUDA graph", "compiled step"; "" none
    captured_refusal: str = ""  # why this device runs every decode step eagerly ("" when it can capture)
    decode_path: str = ""  # on a CPU: which step decodes each format, at which vector level, and why (one line)

    @classmethod
    def for_model(cls, cfg: ModelConfig, device: str, max_users: dict[str, int],
                  notes: dict[str, str] | None = None, captured_step: str = "",
                  captured_refusal: str = "", decode_path: str = "") -> "Capabilities":
        return cls(device, {g: group_size_refusal(cfg, g) for g in GROUP_SIZES}, dict(max_users), dict(notes or {}),
                   captured_step, captured_refusal, decode_path)

    def refusal(self, settings: Settings) -> str:
        """Why the engine would refuse `settings` ("" if it would run them)."""
        try:
            settings.validate(self.device)
        except EngineError as error:
            return str(error)
        reason = self.group_sizes.get(settings.group_size, "") if settings.weights == "int4" else ""
        if reason:  # (a group size is a setting only of int4 weights: no refusal while they are off)
            return reason
        if settings.cuda_graphs and self.captured_refusal:
            return f"no captured decode step here: {self.captured_refusal}"
        if settings.speculate == "draft" and settings.draft_model == "self" and settings.draft_weights == "int4" \
                and self.group_sizes.get(DRAFT_GROUP_SIZE):
            return f"an int4 draft uses group {DRAFT_GROUP_SIZE}: {self.group_sizes[DRAFT_GROUP_SIZE]}"
        most = self.max_users.get(settings.dtype, 0)
        if settings.users > most:
            return (f"{settings.users} simulated users need more KV cache than this device's memory allows "
                    f"({most} at most with {settings.dtype})")
        return ""

    def note(self, field_name: str, value: Any) -> str:
        return self.notes.get(f"{field_name}={value}", "")


def with_changes(settings: Settings, changes) -> Settings:
    """`settings` with each (dotted field, value) of `changes` replaced."""
    for path, value in changes:
        settings = _with_field(settings, path, value)
    return settings


def _with_field(obj: Any, path: str, value: Any) -> Any:
    head, _, rest = path.partition(".")
    if head == "kv_cache" and not rest:  # the on/off view of kv_layout
        return dataclasses.replace(obj, kv_cache=bool(value))
    if not rest:
        return dataclasses.replace(obj, **{head: value})
    return dataclasses.replace(obj, **{head: _with_field(getattr(obj, head), rest, value)})


@dataclass(frozen=True)
class ModelInfo:
    """What a front end needs to know about a loaded model (plain data)."""
    label: str
    source: str  # "gguf", "hf", "synthetic"
    device: str
    cfg: ModelConfig
    weight_bytes: int  # matmul weights one step reads, at the current dtype
    hardware: DeviceSpec
    settings: Settings
    capabilities: "Capabilities"
    messages: tuple[dict, ...] = ()  # the conversation the engine holds (restored after a restart)


@dataclass(frozen=True)
class Load:
    model: Any  # "default", "synthetic:SHAPE", a path, a prebuilt engine.loader.LoadedWeights or one pickled
    device: str = "auto"
    settings: Settings | None = None  # None: the device's default dtype
    hardware: DeviceSpec | None = None  # None: measured (once per process)
    max_context: int = 4096
    messages: tuple[dict, ...] = ()  # a conversation to carry on (a restarted engine's)


@dataclass(frozen=True)
class Chat:
    text: str
    ignore_eos: bool = False  # the reply runs to its token budget (the app's keep-decoding mode)


@dataclass(frozen=True)
class Reset:
    pass


@dataclass(frozen=True)
class MeasureQuality:
    """Perplexity and top-1 agreement of fp / int8 / int4 on the evaluation text (seconds on a CPU)."""
    n_tokens: int = 256


@dataclass(frozen=True)
class Apply:
    """A settings change. `changes` ({field: value}, dotted for sampling: "sampling.top_p") is laid
    over what the engine will run (its settings with any change still pending), so a refused
    request never leaks into the next; `settings` replaces them whole. The engine answers the
    `request_id` with SettingsApplied or SettingsRefused."""
    settings: Settings | None = None
    changes: tuple[tuple[str, Any], ...] = ()
    request_id: int = 0


@dataclass(frozen=True)
class Stop:
    pass


@dataclass(frozen=True)
class Query:
    """Ask what the engine runs now (answered with `state(Settings)`, at once, mid-reply too)."""


@dataclass(frozen=True)
class Quit:
    pass


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


def engine_process_main(conn) -> None:
    """The engine process's entry point. It lives in this torch-free module and finds the host by
    name, so a front end can start the engine without importing it (torch comes in the child)."""
    module, function = ENGINE_ENTRY_POINT
    getattr(importlib.import_module(module), function)(conn)


def settings_delta(old: Settings, new: Settings) -> tuple[tuple[str, Any], ...]:
    """The (dotted field, value) pairs that turn `old` into `new` (an Apply's `changes`)."""
    return _delta(old, new, "")


def _delta(old: Any, new: Any, prefix: str) -> tuple[tuple[str, Any], ...]:
    changes: list[tuple[str, Any]] = []
    for f in dataclasses.fields(new):
        before, after = getattr(old, f.name), getattr(new, f.name)
        if before == after:
            continue
        if dataclasses.is_dataclass(after) and dataclasses.is_dataclass(before):
            changes.extend(_delta(before, after, f"{prefix}{f.name}."))
        else:
            changes.append((f"{prefix}{f.name}", after))
    return tuple(changes)
