"""The controls bar's table: one entry per setting of the engine's `Settings` (`CONTROLS`), each a
switch (`Choice`, `Toggle`), a slider or a number, with its label, keys and tooltip; and the
dotted-path helpers that read and replace a field of the frozen settings. app/controls.py builds the
bar from it; a later setting is one more entry here."""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any

from app.i18n import QT_TRANSLATE_NOOP, translate


@dataclass(frozen=True)
class Choice:
    field: str  # dotted path into Settings, e.g. "dtype"
    label: str
    options: tuple[tuple[Any, str], ...]  # (value, button text)
    shortcut: str  # cycles through the options ("": none)
    tooltip: str = ""
    second_row: bool = False  # below, with the numbers (the switches' row is full)


@dataclass(frozen=True)
class Toggle:
    field: str
    label: str
    shortcut: str
    tooltip: str = ""
    second_row: bool = False


@dataclass(frozen=True)
class Slider:
    field: str
    label: str
    minimum: int
    maximum: int  # the most the control offers; `ControlsBar.set_limit` lowers it (device memory)
    shortcuts: tuple[str, str]  # down, up
    tooltip: str = ""


@dataclass(frozen=True)
class Number:
    field: str
    label: str
    minimum: float
    maximum: float
    step: float
    decimals: int = 0  # 0: a whole number
    tooltip: str = ""


CONTROLS: tuple[Choice | Toggle | Slider | Number, ...] = (
    Choice("dtype", QT_TRANSLATE_NOOP("Controls", "Precision"), (("fp32", "FP32"), ("bf16", "BF16"), ("fp16", "FP16")),
           "F3", QT_TRANSLATE_NOOP("Controls", "bytes per weight read every step: fp32 = 4, bf16/fp16 = 2")),
    Toggle("kv_cache", QT_TRANSLATE_NOOP("Controls", "KV cache"), "F2",
           QT_TRANSLATE_NOOP("Controls", "off: every step recomputes the whole context "
                                         "(tokens/s falls as the context grows)")),
    Choice("weights", QT_TRANSLATE_NOOP("Controls", "Weights"), (("fp", "FP"), ("int8", "INT8"), ("int4", "INT4")),
           "F4",
           QT_TRANSLATE_NOOP("Controls", "weight-only quantisation: INT8 = 1 byte per weight (+ a scale per row), "
                                         "INT4 = half a byte (+ a scale and minimum per group); activations stay "
                                         "in the precision above")),
    Choice("group_size", QT_TRANSLATE_NOOP("Controls", "INT4 group"), ((32, "32"), (64, "64"), (128, "128")), "F7",
           QT_TRANSLATE_NOOP("Controls", "INT4: inputs sharing one scale and minimum (smaller = more accurate, "
                                         "more scale bytes)")),
    Choice("attention", QT_TRANSLATE_NOOP("Controls", "Attention"),
           (("flash", "Flash"), ("naive", QT_TRANSLATE_NOOP("Controls", "Naive"))), "F5",
           QT_TRANSLATE_NOOP("Controls", "naive writes the score matrix to memory and reads it back; "
                                         "flash keeps it on chip")),
    Choice("kv_layout", QT_TRANSLATE_NOOP("Controls", "KV layout"),
           (("contiguous", QT_TRANSLATE_NOOP("Controls", "Contig.")), ("paged", QT_TRANSLATE_NOOP("Controls", "Paged")),
            ("off", QT_TRANSLATE_NOOP("Controls", "Off"))), "F6",
           QT_TRANSLATE_NOOP("Controls", "contiguous reserves the whole context per sequence; paged takes blocks "
                                         "on demand; off recomputes the context every step")),
    Slider("users", QT_TRANSLATE_NOOP("Controls", "Users"), 0, 64, ("Alt+Down", "Alt+Up"),
           QT_TRANSLATE_NOOP("Controls", "simulated users sending requests beside your chat: the engine batches "
                                         "every running request into one forward, so the weights are read once "
                                         "per step for all of them")),
    Choice("policy", QT_TRANSLATE_NOOP("Controls", "Batching"),
           (("continuous", QT_TRANSLATE_NOOP("Controls", "Contin.")),
            ("static", QT_TRANSLATE_NOOP("Controls", "Static"))),
           "F12", QT_TRANSLATE_NOOP("Controls", "continuous: requests join and leave the batch at every step; static: "
                                                "a batch forms, runs until its longest member ends, then the next "
                                                "forms")),
    Choice("speculate", QT_TRANSLATE_NOOP("Controls", "Speculate"),
           (("off", QT_TRANSLATE_NOOP("Controls", "Off")), ("ngram", QT_TRANSLATE_NOOP("Controls", "Lookup")),
            ("draft", QT_TRANSLATE_NOOP("Controls", "Draft"))), "F1",
           QT_TRANSLATE_NOOP("Controls", "speculative decoding: guess k tokens cheaply, check them all in one "
                                         "step of the model (one read of the weights for up to k + 1 tokens; the "
                                         "reply is exactly what it would have been). Lookup copies what followed "
                                         "the last match of the text's final words in the conversation; Draft "
                                         "asks the model itself at the draft weights below")),
    Number("draft_tokens", QT_TRANSLATE_NOOP("Controls", "Draft k"), 1, 8, 1,
           tooltip=QT_TRANSLATE_NOOP("Controls", "tokens guessed per speculative step")),
    # (an fp draft, the model itself, guesses right but costs as much as the model: `membound chat` has it)
    Choice("draft_weights", QT_TRANSLATE_NOOP("Controls", "Draft weights"), (("int8", "INT8"), ("int4", "INT4")), "",
           QT_TRANSLATE_NOOP("Controls", "the draft model's weights (the model itself, quantised: fewer bytes "
                                         "per guess)"),
           second_row=True),
    Toggle("cuda_graphs", QT_TRANSLATE_NOOP("Controls", "Captured"), "Shift+F1",
           QT_TRANSLATE_NOOP("Controls", "the overhead lever: decode steps replayed from a captured CUDA graph "
                                         "instead of hundreds of kernel launches (small models are launch-bound "
                                         "on a GPU); off: every step eager")),
    Number("max_new_tokens", QT_TRANSLATE_NOOP("Controls", "Max tokens"), 1, 8192, 32,
           tooltip=QT_TRANSLATE_NOOP("Controls", "longest reply, in tokens")),
    Number("sampling.temperature", QT_TRANSLATE_NOOP("Controls", "Temperature"), 0.0, 2.0, 0.1, 2,
           QT_TRANSLATE_NOOP("Controls", "0 = greedy (always the likeliest token)")),
    Number("sampling.top_p", QT_TRANSLATE_NOOP("Controls", "Top-p"), 0.05, 1.0, 0.05, 2,
           QT_TRANSLATE_NOOP("Controls", "sample from the smallest set of tokens holding this mass")),
)


QUALITY_COLUMNS = (QT_TRANSLATE_NOOP("Controls", "weights"), QT_TRANSLATE_NOOP("Controls", "perplexity"),
                   QT_TRANSLATE_NOOP("Controls", "top-1 = fp"))


def control_text(text: str) -> str:
    """A CONTROLS string (marked with QT_TRANSLATE_NOOP) in the UI's language."""
    return translate("Controls", text)


def get_field(settings: Any, path: str) -> Any:
    for part in path.split("."):
        settings = getattr(settings, part)
    return settings


def has_field(settings: Any, path: str) -> bool:
    try:
        get_field(settings, path)
        return True
    except AttributeError:
        return False


def with_field(settings: Any, path: str, value: Any) -> Any:
    """A copy of the frozen dataclass `settings` with the dotted field replaced."""
    head, _, rest = path.partition(".")
    if not rest:
        return dataclasses.replace(settings, **{head: value})
    return dataclasses.replace(settings, **{head: with_field(getattr(settings, head), rest, value)})


def control_of(field: str):
    """The CONTROLS entry of a field."""
    return next(c for c in CONTROLS if c.field == field)
