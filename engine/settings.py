"""What the engine runs, as plain data: `Settings` (frozen), its options, and the checks that give a
one-line reason for anything impossible. Torch-free: the app builds and checks settings with it.

`Capabilities` (engine/protocol.py) adds what only a loaded model and device can say (INT4 groups
that divide the layer widths, the users its KV memory holds); `Settings.validate` is what any
device allows."""
from __future__ import annotations

import functools
import numbers
from dataclasses import dataclass, field

DTYPE_NAMES = ("fp32", "bf16", "fp16")
KV_LAYOUTS = ("contiguous", "paged", "off")
WEIGHT_FORMATS = ("fp", "int8", "int4")
GROUP_SIZES = (32, 64, 128)  # int4: inputs per (scale, min) pair
ATTENTION_BACKENDS = ("naive", "flash")
POLICIES = ("continuous", "static")
MAX_USERS = 64
SPECULATE_SOURCES = ("off", "ngram", "draft", "oracle")  # speculative decoding's draft sources
MAX_DRAFT_TOKENS = 8
DRAFT_GROUP_SIZE = 32  # an int4 draft model's group size


class EngineError(ValueError):
    """Bad input or impossible settings (one-line message for the user)."""


class PromptError(EngineError):
    pass


class SamplingError(EngineError):
    pass


class QuantError(EngineError):
    """Settings the quantiser or its kernels cannot take (one-line message for the user)."""


@dataclass(frozen=True)
class SamplingParams:
    temperature: float = 0.7
    top_k: int = 0  # 0 = off
    top_p: float = 0.95  # 1.0 = off
    seed: int | None = None
    greedy: bool = False

    def validate(self) -> "SamplingParams":
        if not (self.temperature >= 0.0) or self.temperature > 100:
            raise SamplingError(f"temperature must be between 0 and 100, got {self.temperature}")
        if int(self.top_k) != self.top_k or self.top_k < 0:
            raise SamplingError(f"top-k must be a whole number >= 0, got {self.top_k}")
        if not (0.0 < self.top_p <= 1.0):
            raise SamplingError(f"top-p must be in (0, 1], got {self.top_p}")
        return self

    @property
    def is_greedy(self) -> bool:
        return self.greedy or self.temperature == 0.0

    @property
    def label(self) -> str:
        if self.is_greedy:
            return "greedy"
        return (f"T={self.temperature:g} top-p={self.top_p:g}" + (f" top-k={self.top_k}" if self.top_k else "")
                + (f" seed={self.seed}" if self.seed is not None else ""))


@dataclass(frozen=True)
class Settings:
    dtype: str = "fp32"
    kv_layout: str = "contiguous"  # "contiguous" | "paged" | "off" (no cache: every step recomputes)
    attention: str = "flash"  # "flash" (fused: scores never in memory) | "naive" (scores materialised)
    max_new_tokens: int = 256
    sampling: SamplingParams = field(default_factory=SamplingParams)
    cuda_graphs: bool = True  # capture the decode step where the device offers it: a CUDA graph on a GPU,
    # a compiled step on a CPU where that measured faster (engine/graphs.py; Capabilities.captured_step says)
    weights: str = "fp"  # "fp" (the dtype itself), "int8" (per channel) or "int4" (group-wise)
    group_size: int = 32  # int4 only: inputs per (scale, min) pair
    users: int = 0  # simulated users served beside the chat (0..64); > 0: batched, on the paged KV pool
    policy: str = "continuous"  # batching while users > 0: "continuous" (admit/evict every step) | "static"
    # speculative decoding (engine/serving/speculative.py): guess `draft_tokens` tokens, verify them in one step.
    # "ngram": prompt lookup in the conversation; "draft": a draft model; "oracle": the target's own greedy
    # reply computed beforehand (benchmarks: the upper bound of what speculation can give)
    speculate: str = "off"
    draft_tokens: int = 4  # k, tokens guessed per step (1..8)
    draft_model: str = "self"  # "self" (the target's own weights), "default", a .gguf, an HF folder, synthetic:SHAPE
    draft_weights: str = "int4"  # the draft model's weights: fp / int8 / int4 (group 32)

    def validate(self, device: str = "cpu") -> "Settings":
        """Raises EngineError (one line) for settings no model could run on `device` ("cpu" or
        "cuda..."); returns self, with `users` made a plain int."""
        if self.dtype not in DTYPE_NAMES:
            raise EngineError(f"dtype must be one of {', '.join(DTYPE_NAMES)}, got {self.dtype!r}")
        if self.weights not in WEIGHT_FORMATS:
            raise EngineError(f"weights must be one of {', '.join(WEIGHT_FORMATS)}, got {self.weights!r}")
        if self.group_size not in GROUP_SIZES:
            raise EngineError(f"int4 group size must be one of {', '.join(map(str, GROUP_SIZES))}, "
                              f"got {self.group_size}")
        if self.kv_layout not in KV_LAYOUTS:
            raise EngineError(f"KV layout must be one of {', '.join(KV_LAYOUTS)}, got {self.kv_layout!r}")
        if self.attention not in ATTENTION_BACKENDS:
            raise EngineError(f"attention must be one of {', '.join(ATTENTION_BACKENDS)}, got {self.attention!r}")
        if self.dtype == "fp16" and device == "cpu":
            raise EngineError("fp16 is not offered on the CPU (PyTorch has no fast fp16 matmul there); use fp32 or bf16")
        if isinstance(self.max_new_tokens, bool) or not isinstance(self.max_new_tokens, numbers.Real) or \
                int(self.max_new_tokens) != self.max_new_tokens or self.max_new_tokens < 1:
            raise EngineError(f"max new tokens must be a whole number >= 1, got {self.max_new_tokens}")
        if isinstance(self.users, bool) or not isinstance(self.users, numbers.Real) or \
                int(self.users) != self.users or not 0 <= self.users <= MAX_USERS:
            raise EngineError(f"simulated users must be a whole number from 0 to {MAX_USERS}, got {self.users!r}")
        object.__setattr__(self, "users", int(self.users))  # 4.0 or a numpy integer from a slider: 4
        if self.policy not in POLICIES:
            raise EngineError(f"batching policy must be one of {', '.join(POLICIES)}, got {self.policy!r}")
        if self.speculate not in SPECULATE_SOURCES:
            raise EngineError(f"speculation must be one of {', '.join(SPECULATE_SOURCES)}, got {self.speculate!r}")
        if isinstance(self.draft_tokens, bool) or not isinstance(self.draft_tokens, numbers.Real) or \
                int(self.draft_tokens) != self.draft_tokens or not 1 <= self.draft_tokens <= MAX_DRAFT_TOKENS:
            raise EngineError(f"draft tokens must be a whole number from 1 to {MAX_DRAFT_TOKENS}, "
                              f"got {self.draft_tokens!r}")
        object.__setattr__(self, "draft_tokens", int(self.draft_tokens))
        if self.draft_weights not in WEIGHT_FORMATS:
            raise EngineError(f"draft weights must be one of {', '.join(WEIGHT_FORMATS)}, got {self.draft_weights!r}")
        if not isinstance(self.draft_model, str) or not self.draft_model.strip():
            raise EngineError("draft model must name a model: self, default, a .gguf file, an HF folder "
                              "or synthetic:SHAPE")
        if self.speculate != "off" and self.users:
            raise EngineError("speculative decoding runs on the chat alone, not in the batch: set simulated "
                              "users to 0, or speculation off")
        if self.users and self.kv_layout == "off":
            raise EngineError("simulated users need the KV cache: batching keeps every sequence's K/V in the "
                              "paged pool (turn the KV cache on, or set users to 0)")
        self.sampling.validate()
        return self

    @property
    def label(self) -> str:
        weights = "" if self.weights == "fp" else f" · {weights_label(self.weights, self.group_size)}"
        kv = {"contiguous": "on", "paged": "paged", "off": "off"}.get(self.kv_layout, self.kv_layout)
        attention = " · naive attention" if self.attention == "naive" else ""
        if self.users:  # batched serving always runs on the paged pool, whatever the chat's layout
            return f"{self.dtype}{weights} · kv paged{attention} · {self.users} users {self.policy}"
        return f"{self.dtype}{weights} · kv {kv}{attention}{self.speculation_label}"

    @property
    def speculation_label(self) -> str:
        """' · spec ngram k4' (the oracle always says it is the upper bound), or '' when off."""
        if self.speculate == "off":
            return ""
        source = {"ngram": "prompt lookup", "oracle": "oracle (upper bound)"}.get(self.speculate, "")
        if self.speculate == "draft":
            source = f"draft {self.draft_model} {weights_label(self.draft_weights, DRAFT_GROUP_SIZE)}"
        return f" · spec {source} k{self.draft_tokens}"

    @property
    def kv_cache(self) -> bool:
        """The KV cache on/off view of `kv_layout` (the app's KV toggle)."""
        return self.kv_layout != "off"

    @property
    def weights_key(self) -> tuple[str, str, int] | None:
        """Which quantised copy of the model these settings run (None: the dtype's own weights)."""
        return None if self.weights == "fp" else (self.dtype, self.weights, self.group_size)


_settings_init = Settings.__init__


@functools.wraps(_settings_init)
def _settings_init_with_kv_cache(self, *args, kv_cache: bool | None = None, **kwargs):
    """`kv_cache` stays a keyword of Settings(...) and replace(...): False means kv_layout "off";
    True turns an "off" layout back on (contiguous) and leaves "contiguous"/"paged" as they are."""
    _settings_init(self, *args, **kwargs)
    if kv_cache is not None:
        on = self.kv_layout if self.kv_layout != "off" else "contiguous"
        object.__setattr__(self, "kv_layout", on if kv_cache else "off")


Settings.__init__ = _settings_init_with_kv_cache


def describe_change(old: Settings, new: Settings) -> tuple[str, ...]:
    """What differs, in the words the plots' annotations use (e.g. "kv cache off", "int4 g32")."""
    changes = []
    if new.dtype != old.dtype:
        changes.append(new.dtype)
    if (new.weights, new.group_size) != (old.weights, old.group_size) and new.weights_key != old.weights_key:
        changes.append(weights_label(new.weights, new.group_size))
    if new.kv_layout != old.kv_layout:  # a new layout starts empty: the next step re-prefills
        if new.kv_layout == "off" or (old.kv_layout == "off" and new.kv_layout == "contiguous"):
            changes.append(f"kv cache {'on' if new.kv_cache else 'off'}")
        else:
            changes.append(f"kv {new.kv_layout}")
        if new.users:
            changes[-1] += " (for the chat alone: batching stays paged)"
    if new.users != old.users:
        changes.append(f"{new.users} simulated users" if new.users else "simulated users off")
        if new.users and not old.users and new.kv_layout != "paged":
            changes.append("kv paged for batching")
    if new.policy != old.policy:
        changes.append(f"{new.policy} batching")
    if new.attention != old.attention:
        changes.append(f"{new.attention} attention")
    if new.max_new_tokens != old.max_new_tokens:
        changes.append(f"max tokens {new.max_new_tokens}")
    if new.sampling != old.sampling:
        changes.append(new.sampling.label)
    if new.cuda_graphs != old.cuda_graphs:
        changes.append("decode captured" if new.cuda_graphs else "decode eager")
    if new.speculate != old.speculate:
        changes.append("speculation off" if new.speculate == "off" else
                       f"speculation {new.speculation_label.removeprefix(' · spec ')}")
    elif new.speculate != "off" and (new.draft_tokens, new.draft_model, new.draft_weights) != \
            (old.draft_tokens, old.draft_model, old.draft_weights):
        changes.append(f"speculation {new.speculation_label.removeprefix(' · spec ')}")
    elif new.speculate == "off" and new.draft_tokens != old.draft_tokens:
        changes.append(f"draft tokens {new.draft_tokens}")
    return tuple(changes)


# ---- weight formats (what a model's shapes allow) ------------------------------------------------
def weights_label(weights: str, group_size: int) -> str:
    return {"fp": "fp weights", "int8": "int8"}.get(weights, f"int4 g{group_size}")


def _linear_inputs(cfg) -> dict[str, int]:
    # the head is INT8 (per channel) in every setting: no group constraint
    return {"wqkv and w_gate_up (dim)": cfg.dim, "wo (q_dim)": cfg.q_dim, "w_down (ffn_dim)": cfg.ffn_dim}


def valid_group_sizes(cfg) -> tuple[int, ...]:
    """INT4 group sizes that divide the inputs of every linear layer of this model shape."""
    return tuple(g for g in GROUP_SIZES if all(k % g == 0 for k in _linear_inputs(cfg).values()))


def group_size_refusal(cfg, group_size: int) -> str:
    """Why this model cannot take INT4 with this group size ("" if it can)."""
    if group_size not in GROUP_SIZES:
        return f"int4 group size must be one of {', '.join(map(str, GROUP_SIZES))}, got {group_size}"
    for what, k in _linear_inputs(cfg).items():
        if k % group_size:
            ok = valid_group_sizes(cfg)
            hint = f"use group {' or '.join(map(str, ok))}" if ok else "this model cannot run int4"
            return f"int4 group size {group_size} does not divide {what} = {k} of {cfg.name}: {hint}"
    return ""


def check_weights(cfg, weights: str, group_size: int) -> None:
    """QuantError (one line) when this model cannot take these weight settings."""
    if weights not in WEIGHT_FORMATS:
        raise QuantError(f"weights must be one of {', '.join(WEIGHT_FORMATS)}, got {weights!r}")
    if weights == "int4":
        refusal = group_size_refusal(cfg, group_size)
        if refusal:
            raise QuantError(refusal)
