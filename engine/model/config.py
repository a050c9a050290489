"""Model shapes. `ModelConfig` is the one description of a supported model's shape (Llama 1-3.x,
Mistral, Qwen2/2.5, Qwen3); it comes from GGUF metadata, an HF `config.json` in either transformers
format (rope_theta/rope_scaling at the top, or transformers 5's rope_parameters), or a named shape."""
from __future__ import annotations

import json
import math
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any


class ConfigError(ValueError):
    """A model description the engine cannot use (one-line message for the user)."""


SUPPORTED = "Llama 1-3.x, Mistral, Qwen2/2.5, Qwen3"
# HF `architectures` / `model_type` -> family
HF_ARCHITECTURES = {"LlamaForCausalLM": "llama", "MistralForCausalLM": "mistral",
                    "Qwen2ForCausalLM": "qwen2", "Qwen3ForCausalLM": "qwen3"}
HF_MODEL_TYPES = {"llama": "llama", "mistral": "mistral", "qwen2": "qwen2", "qwen3": "qwen3"}
# GGUF `general.architecture` -> family (llama.cpp's converter writes Mistral models as "llama")
GGUF_ARCHITECTURES = {"llama": "llama", "qwen2": "qwen2", "qwen3": "qwen3"}
FAMILY_NAMES = {"llama": "Llama", "mistral": "Mistral", "qwen2": "Qwen2", "qwen3": "Qwen3"}
ROPE_KINDS = ("default", "linear", "dynamic", "llama3", "yarn")


def unsupported_architecture(name: str) -> ConfigError:
    return ConfigError(f"unsupported architecture {name!r}: membound runs {SUPPORTED}")


@dataclass(frozen=True)
class RopeScaling:
    """How the RoPE frequencies are stretched, by transformers' rope types: `linear` divides every
    frequency by `factor`; `llama3` divides the low ones and blends the middle band; `yarn` blends
    interpolated and original frequencies and scales cos/sin; `dynamic` (NTK) changes nothing
    within the trained context, which is as far as membound runs such a model."""
    kind: str = "default"
    factor: float = 1.0
    low_freq_factor: float = 1.0  # llama3
    high_freq_factor: float = 4.0  # llama3
    original_max_len: int = 0  # llama3, yarn: the pre-training context
    beta_fast: float = 32.0  # yarn
    beta_slow: float = 1.0  # yarn
    attention_factor: float = 0.0  # yarn: cos and sin are scaled by it; 0 = 0.1 ln(factor) + 1
    truncate: bool = True  # yarn: the blend's band rounded outward to whole frequencies

    def __post_init__(self):
        if self.kind not in ROPE_KINDS:
            raise ConfigError(f"RoPE scaling type {self.kind!r} is not supported "
                              f"(supported: {', '.join(ROPE_KINDS)})")
        if self.kind != "default" and not self.factor > 0:
            raise ConfigError(f"RoPE scaling {self.kind}: factor must be positive, got {self.factor}")

    @property
    def yarn_attention_factor(self) -> float:
        if self.attention_factor:
            return self.attention_factor
        return 1.0 if self.factor <= 1 else 0.1 * math.log(self.factor) + 1.0

    @property
    def label(self) -> str:
        return "" if self.kind == "default" else f"{self.kind} ×{self.factor:g}"


@dataclass(frozen=True)
class ModelConfig:
    name: str
    dim: int
    n_layers: int
    n_heads: int
    n_kv_heads: int
    ffn_dim: int
    vocab_size: int
    head_dim: int = 0  # 0 = dim // n_heads
    rope_theta: float = 10000.0
    norm_eps: float = 1e-5
    tied_embeddings: bool = False
    max_seq_len: int = 2048
    arch: str = "llama"  # family: llama, mistral, qwen2, qwen3
    qkv_bias: bool = False  # Qwen2: q, k and v projections add a bias
    qk_norm: bool = False  # Qwen3: RMSNorm over each head of q and k before RoPE
    rope_scaling: RopeScaling = field(default_factory=RopeScaling)
    rope_freq_factors: tuple[float, ...] = ()  # GGUF's rope_freqs tensor: frequency i is divided by entry i

    def __post_init__(self):
        if self.head_dim == 0:
            object.__setattr__(self, "head_dim", self.dim // max(self.n_heads, 1))
        for name in ("dim", "n_layers", "n_heads", "n_kv_heads", "ffn_dim", "vocab_size", "max_seq_len"):
            if getattr(self, name) <= 0:
                raise ConfigError(f"model config: {name} must be positive, got {getattr(self, name)}")
        if self.n_heads % self.n_kv_heads:
            raise ConfigError(f"model config: {self.n_heads} query heads is not a multiple of {self.n_kv_heads} KV heads")
        if self.head_dim % 2:
            raise ConfigError(f"model config: head_dim {self.head_dim} must be even for RoPE")
        if self.arch not in FAMILY_NAMES:
            raise unsupported_architecture(self.arch)
        if self.rope_freq_factors and len(self.rope_freq_factors) != self.head_dim // 2:
            raise ConfigError(f"model config: {len(self.rope_freq_factors)} RoPE frequency factors for "
                              f"head_dim {self.head_dim} (need {self.head_dim // 2})")

    # Derived sizes, in elements.
    @property
    def q_dim(self) -> int:
        return self.n_heads * self.head_dim

    @property
    def kv_dim(self) -> int:
        return self.n_kv_heads * self.head_dim

    @property
    def layer_linear_params(self) -> int:
        """Parameters of one block's matmuls (q, k, v, o, gate, up, down)."""
        attn = self.dim * (self.q_dim + 2 * self.kv_dim) + self.q_dim * self.dim
        return attn + 3 * self.dim * self.ffn_dim

    @property
    def layer_vector_params(self) -> int:
        """Parameters of one block read beside its matmuls: the two RMSNorm weights, the q/k/v
        biases (Qwen2) and the per-head q and k norm weights (Qwen3)."""
        n = 2 * self.dim
        if self.qkv_bias:
            n += self.q_dim + 2 * self.kv_dim
        if self.qk_norm:
            n += 2 * self.head_dim
        return n

    @property
    def vector_params(self) -> int:
        """Every non-matmul parameter one step reads: each block's vectors and the final norm."""
        return self.n_layers * self.layer_vector_params + self.dim

    @property
    def vector_elems_per_step(self) -> int:
        """Non-matmul weight elements one forward step reads: `vector_params`, with Qwen3's q and k
        norm weights counted as the model holds them, one row per head (one multiply for q and k)."""
        if not self.qk_norm:
            return self.vector_params
        return self.vector_params + self.n_layers * (self.n_heads + self.n_kv_heads - 2) * self.head_dim

    @property
    def n_params(self) -> int:
        embed = self.vocab_size * self.dim
        head = 0 if self.tied_embeddings else self.vocab_size * self.dim
        return self.n_layers * self.layer_linear_params + self.vector_params + embed + head

    @property
    def kv_bytes_per_token_per_elem(self) -> int:
        """K and V elements one token adds to the cache, over all layers."""
        return 2 * self.n_layers * self.kv_dim

    @property
    def family(self) -> str:
        return FAMILY_NAMES[self.arch]

    @property
    def rope_label(self) -> str:
        """RoPE as the model line shows it, e.g. "rope 500000, llama3 ×8"."""
        theta = self.rope_theta
        parts = [f"rope {int(theta) if float(theta).is_integer() else theta:g}"]
        if self.rope_scaling.kind != "default":
            parts.append(self.rope_scaling.label)
        if self.rope_freq_factors:
            parts.append("rope_freqs")
        return ", ".join(parts)

    def with_max_seq_len(self, n: int) -> "ModelConfig":
        return replace(self, max_seq_len=n)

    # ---- constructors -------------------------------------------------------
    @classmethod
    def from_name(cls, name: str) -> "ModelConfig":
        key = name.lower()
        if key not in NAMED_SHAPES:
            known = ", ".join(sorted(NAMED_SHAPES))
            raise ConfigError(f"unknown model shape {name!r} (known: {known})")
        return cls(name=key, **NAMED_SHAPES[key])

    @classmethod
    def from_gguf_metadata(cls, meta: dict[str, Any], name: str = "") -> "ModelConfig":
        """From GGUF key/values. What only the tensors tell is passed in by the loader as
        `_tied_embeddings` (no output.weight) and `_qkv_bias` (attn_q.bias present)."""
        arch = str(meta.get("general.architecture", ""))
        if arch not in GGUF_ARCHITECTURES:
            raise unsupported_architecture(arch)

        def get(key, default=None):
            value = meta.get(f"{arch}.{key}", default)
            if value is None:
                raise ConfigError(f"GGUF metadata lacks {arch}.{key}")
            return value

        dim = int(get("embedding_length"))
        n_heads = int(get("attention.head_count"))
        head_dim = int(get("attention.key_length", dim // n_heads))
        if int(get("attention.value_length", head_dim)) != head_dim:
            raise ConfigError("GGUF: attention.value_length differs from key_length (not a supported shape)")
        if int(get("rope.dimension_count", head_dim)) != head_dim:
            raise ConfigError(f"GGUF: RoPE on {get('rope.dimension_count')} of {head_dim} head dimensions "
                              "(partial rotary) is not supported")
        vocab = meta.get(f"{arch}.vocab_size") or len(meta.get("tokenizer.ggml.tokens", []))
        max_len = int(get("context_length", 2048))
        window = meta.get(f"{arch}.attention.sliding_window")
        if window:  # within the window sliding attention is full attention: run no further
            max_len = min(max_len, int(window))
        return cls(
            name=name or str(meta.get("general.name", "gguf model")),
            dim=dim,
            n_layers=int(get("block_count")),
            n_heads=n_heads,
            n_kv_heads=int(get("attention.head_count_kv", n_heads)),
            ffn_dim=int(get("feed_forward_length")),
            vocab_size=int(vocab),
            head_dim=head_dim,
            rope_theta=float(get("rope.freq_base", 10000.0)),
            norm_eps=float(get("attention.layer_norm_rms_epsilon", 1e-5)),
            tied_embeddings=bool(meta.get("_tied_embeddings", True)),
            max_seq_len=max_len,
            arch=GGUF_ARCHITECTURES[arch],
            qkv_bias=bool(meta.get("_qkv_bias", arch == "qwen2")),
            qk_norm=arch == "qwen3",
            rope_scaling=_rope_scaling_from_gguf(meta, arch, max_len),
        )

    @classmethod
    def from_hf_config(cls, source: dict | str | Path, name: str = "") -> "ModelConfig":
        if not isinstance(source, dict):
            source = read_hf_config(source)
        hf = source
        archs = hf.get("architectures") or []
        if archs:
            family = next((HF_ARCHITECTURES[a] for a in archs if a in HF_ARCHITECTURES), None)
            if family is None:
                raise unsupported_architecture(archs[0])
        else:
            family = HF_MODEL_TYPES.get(hf.get("model_type", ""))
            if family is None:
                raise unsupported_architecture(hf.get("model_type") or "unknown (config.json names none)")
        if hf.get("hidden_act", "silu") != "silu":
            raise ConfigError(f"activation {hf['hidden_act']!r} is not supported (these families use silu)")
        if hf.get("mlp_bias"):
            raise ConfigError("MLP biases (mlp_bias) are not supported")
        if family in ("llama", "qwen3", "mistral") and hf.get("attention_bias"):
            raise ConfigError("attention biases on q/k/v/o (attention_bias) are not supported for this family")
        if float(hf.get("partial_rotary_factor") or 1.0) != 1.0:
            raise ConfigError("partial rotary embeddings (partial_rotary_factor) are not supported")
        dim = int(hf["hidden_size"])
        n_heads = int(hf["num_attention_heads"])
        max_len = int(hf.get("max_position_embeddings", 2048))
        theta, scaling = _rope_from_hf(hf, max_len)
        window = hf.get("sliding_window")
        slides = family == "mistral" or hf.get("use_sliding_window") or "sliding_attention" in (hf.get("layer_types") or ())
        if window and slides:  # within the window sliding attention is full attention: run no further
            max_len = min(max_len, int(window))
        return cls(
            name=name or hf.get("_name_or_path", "") or "hf model",
            dim=dim,
            n_layers=int(hf["num_hidden_layers"]),
            n_heads=n_heads,
            n_kv_heads=int(hf.get("num_key_value_heads") or n_heads),
            ffn_dim=int(hf["intermediate_size"]),
            vocab_size=int(hf["vocab_size"]),
            head_dim=int(hf.get("head_dim") or dim // n_heads),
            rope_theta=theta,
            norm_eps=float(hf.get("rms_norm_eps", 1e-6)),
            tied_embeddings=bool(hf.get("tie_word_embeddings", False)),
            max_seq_len=max_len,
            arch=family,
            qkv_bias=family == "qwen2",
            qk_norm=family == "qwen3",
            rope_scaling=scaling,
        )


def read_hf_config(path: str | Path) -> dict:
    path = Path(path)
    if path.is_dir():
        path = path / "config.json"
    try:
        return json.loads(path.read_text())
    except FileNotFoundError:
        raise ConfigError(f"no config.json at {path}") from None
    except (OSError, UnicodeDecodeError) as e:
        raise ConfigError(f"cannot read {path}: {e}") from None
    except json.JSONDecodeError as e:
        raise ConfigError(f"{path} is not valid JSON ({e.msg}, line {e.lineno})") from None


def _rope_from_hf(hf: dict, max_len: int) -> tuple[float, RopeScaling]:
    """(base, scaling) from either format: transformers <5 keeps `rope_theta` and `rope_scaling` at
    the top level, transformers 5 both under `rope_parameters` (per layer type for some models)."""
    params = dict(hf.get("rope_parameters") or {})
    if params and all(isinstance(v, dict) or v is None for v in params.values()):  # per layer type
        if set(params) - {"full_attention"}:
            raise ConfigError(f"per-layer RoPE ({', '.join(sorted(params))}) is not supported")
        params = dict(params["full_attention"] or {})
    merged = {**(hf.get("rope_scaling") or {}), **params}
    theta = float(merged.get("rope_theta") or hf.get("rope_theta") or 10000.0)
    kind = merged.get("rope_type") or merged.get("type") or "default"
    if kind not in ROPE_KINDS:
        raise ConfigError(f"RoPE scaling type {kind!r} is not supported (supported: {', '.join(ROPE_KINDS)})")
    if kind == "default":
        return theta, RopeScaling()
    original = int(hf.get("original_max_position_embeddings") or merged.get("original_max_position_embeddings")
                   or max_len)
    factor = merged.get("factor")
    if kind == "yarn" and factor is None:
        factor = max_len / original
    if factor is None:
        raise ConfigError(f"RoPE scaling {kind} without a factor")
    attention_factor = float(merged.get("attention_factor") or 0.0)
    mscale, mscale_all_dim = merged.get("mscale"), merged.get("mscale_all_dim")
    if kind == "yarn" and not attention_factor and mscale and mscale_all_dim:
        attention_factor = _yarn_mscale(float(factor), mscale) / _yarn_mscale(float(factor), mscale_all_dim)
    return theta, RopeScaling(
        kind=kind, factor=float(factor),
        low_freq_factor=float(merged.get("low_freq_factor", 1.0)),
        high_freq_factor=float(merged.get("high_freq_factor", 4.0)),
        original_max_len=original,
        beta_fast=float(merged.get("beta_fast") or 32.0),
        beta_slow=float(merged.get("beta_slow") or 1.0),
        attention_factor=attention_factor,
        truncate=bool(merged.get("truncate", True)),
    )


def _yarn_mscale(scale: float, mscale: float = 1.0) -> float:
    return 1.0 if scale <= 1 else 0.1 * mscale * math.log(scale) + 1.0


def _rope_scaling_from_gguf(meta: dict, arch: str, max_len: int) -> RopeScaling:
    """`{arch}.rope.scaling.*` as llama.cpp's converter writes it (linear and yarn; a Llama 3.x
    model's scaling is its rope_freqs tensor instead, read by the loader)."""
    def key(name, default=None):
        return meta.get(f"{arch}.rope.scaling.{name}", default)

    kind = str(key("type", "none") or "none")
    factor = key("factor")
    if factor is None and meta.get(f"{arch}.rope.scale_linear") is not None:  # an older key
        kind, factor = "linear", meta[f"{arch}.rope.scale_linear"]
    if kind == "none" or (kind == "linear" and float(factor or 1.0) == 1.0):
        return RopeScaling()
    if kind not in ("linear", "yarn"):
        raise ConfigError(f"RoPE scaling type {kind!r} is not supported (supported: linear, yarn, rope_freqs)")
    if factor is None:
        raise ConfigError(f"GGUF: RoPE scaling {kind} without {arch}.rope.scaling.factor")
    return RopeScaling(
        kind=kind, factor=float(factor),
        original_max_len=int(key("original_context_length") or max_len),
        beta_fast=float(key("yarn_beta_fast") or 32.0),
        beta_slow=float(key("yarn_beta_slow") or 1.0),
        attention_factor=float(key("yarn_attn_factor") or key("attn_factor") or 0.0),
    )


_LLAMA31_ROPE = RopeScaling("llama3", factor=8.0, low_freq_factor=1.0, high_freq_factor=4.0, original_max_len=8192)

# Named shapes for synthetic-weight runs (public architecture figures).
NAMED_SHAPES: dict[str, dict[str, Any]] = {
    "smollm2-135m": dict(dim=576, n_layers=30, n_heads=9, n_kv_heads=3, ffn_dim=1536, vocab_size=49152,
                         rope_theta=100000.0, norm_eps=1e-5, tied_embeddings=True, max_seq_len=8192),
    "smollm2-360m": dict(dim=960, n_layers=32, n_heads=15, n_kv_heads=5, ffn_dim=2560, vocab_size=49152,
                         rope_theta=100000.0, norm_eps=1e-5, tied_embeddings=True, max_seq_len=8192),
    "llama-7b": dict(dim=4096, n_layers=32, n_heads=32, n_kv_heads=32, ffn_dim=11008, vocab_size=32000,
                     rope_theta=10000.0, norm_eps=1e-5, tied_embeddings=False, max_seq_len=4096),
    "llama-13b": dict(dim=5120, n_layers=40, n_heads=40, n_kv_heads=40, ffn_dim=13824, vocab_size=32000,
                      rope_theta=10000.0, norm_eps=1e-5, tied_embeddings=False, max_seq_len=4096),
    "llama3-8b": dict(dim=4096, n_layers=32, n_heads=32, n_kv_heads=8, ffn_dim=14336, vocab_size=128256,
                      rope_theta=500000.0, norm_eps=1e-5, tied_embeddings=False, max_seq_len=8192),
    "llama3-70b": dict(dim=8192, n_layers=80, n_heads=64, n_kv_heads=8, ffn_dim=28672, vocab_size=128256,
                       rope_theta=500000.0, norm_eps=1e-5, tied_embeddings=False, max_seq_len=8192),
    "llama3.1-8b": dict(dim=4096, n_layers=32, n_heads=32, n_kv_heads=8, ffn_dim=14336, vocab_size=128256,
                        rope_theta=500000.0, norm_eps=1e-5, tied_embeddings=False, max_seq_len=131072,
                        rope_scaling=_LLAMA31_ROPE),
    "llama3.1-405b": dict(dim=16384, n_layers=126, n_heads=128, n_kv_heads=8, ffn_dim=53248, vocab_size=128256,
                          rope_theta=500000.0, norm_eps=1e-5, tied_embeddings=False, max_seq_len=131072,
                          rope_scaling=_LLAMA31_ROPE),
    "llama3.2-1b": dict(dim=2048, n_layers=16, n_heads=32, n_kv_heads=8, ffn_dim=8192, vocab_size=128256,
                        rope_theta=500000.0, norm_eps=1e-5, tied_embeddings=True, max_seq_len=8192,
                        rope_scaling=replace(_LLAMA31_ROPE, factor=32.0)),
    "mistral-7b": dict(dim=4096, n_layers=32, n_heads=32, n_kv_heads=8, ffn_dim=14336, vocab_size=32768,
                       rope_theta=1000000.0, norm_eps=1e-5, tied_embeddings=False, max_seq_len=32768,
                       arch="mistral"),
    "qwen2.5-0.5b": dict(dim=896, n_layers=24, n_heads=14, n_kv_heads=2, ffn_dim=4864, vocab_size=151936,
                         rope_theta=1000000.0, norm_eps=1e-6, tied_embeddings=True, max_seq_len=32768,
                         arch="qwen2", qkv_bias=True),
    "qwen2.5-7b": dict(dim=3584, n_layers=28, n_heads=28, n_kv_heads=4, ffn_dim=18944, vocab_size=152064,
                       rope_theta=1000000.0, norm_eps=1e-6, tied_embeddings=False, max_seq_len=32768,
                       arch="qwen2", qkv_bias=True),
    "qwen3-0.6b": dict(dim=1024, n_layers=28, n_heads=16, n_kv_heads=8, head_dim=128, ffn_dim=3072,
                       vocab_size=151936, rope_theta=1000000.0, norm_eps=1e-6, tied_embeddings=True,
                       max_seq_len=40960, arch="qwen3", qk_norm=True),
    "qwen3-8b": dict(dim=4096, n_layers=36, n_heads=32, n_kv_heads=8, head_dim=128, ffn_dim=12288,
                     vocab_size=151936, rope_theta=1000000.0, norm_eps=1e-6, tied_embeddings=False,
                     max_seq_len=40960, arch="qwen3", qk_norm=True),
}
