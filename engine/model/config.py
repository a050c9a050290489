"""Model shapes. `ModelConfig` is the one description of a supported model's shape (Llama 1-3.x,
Mistral, Qwen2/2.5, Qwen3, Gemma 2/3, Phi-3/3.5/4-mini); it comes from GGUF metadata, an HF
`config.json` in either transformers format (rope_theta/rope_scaling at the top, or transformers 5's
rope_parameters), or a named shape. The two parsers are modules of their own: engine/model/config_gguf.py
and engine/model/config_hf.py."""
from __future__ import annotations

import math
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any


class ConfigError(ValueError):
    """A model description the engine cannot use (one-line message for the user)."""


SUPPORTED = "Llama 1-3.x, Mistral, Qwen2/2.5, Qwen3, Gemma 2/3 (text), Phi-3/3.5/4-mini"
# HF `architectures` / `model_type` -> family
HF_ARCHITECTURES = {"LlamaForCausalLM": "llama", "MistralForCausalLM": "mistral",
                    "Qwen2ForCausalLM": "qwen2", "Qwen3ForCausalLM": "qwen3",
                    "Gemma2ForCausalLM": "gemma2", "Gemma3ForCausalLM": "gemma3",
                    "Gemma3ForConditionalGeneration": "gemma3",  # its language model (the vision tower is left)
                    "Phi3ForCausalLM": "phi3"}
HF_MODEL_TYPES = {"llama": "llama", "mistral": "mistral", "qwen2": "qwen2", "qwen3": "qwen3", "gemma2": "gemma2",
                  "gemma3_text": "gemma3", "gemma3": "gemma3", "phi3": "phi3"}
# GGUF `general.architecture` -> family (llama.cpp's converter writes Mistral models as "llama")
GGUF_ARCHITECTURES = {"llama": "llama", "qwen2": "qwen2", "qwen3": "qwen3", "gemma2": "gemma2", "gemma3": "gemma3",
                      "phi3": "phi3"}
FAMILY_NAMES = {"llama": "Llama", "mistral": "Mistral", "qwen2": "Qwen2", "qwen3": "Qwen3", "gemma2": "Gemma 2",
                "gemma3": "Gemma 3", "phi3": "Phi-3"}
GEMMA = ("gemma2", "gemma3")
ROPE_KINDS = ("default", "linear", "dynamic", "llama3", "yarn", "longrope")
# Gemma 3's text defaults (transformers' Gemma3TextConfig): released config.json files leave them out
GEMMA3_TEXT_DEFAULTS = dict(num_attention_heads=8, num_key_value_heads=4, head_dim=256, vocab_size=262208,
                            max_position_embeddings=131072, rms_norm_eps=1e-6, query_pre_attn_scalar=256,
                            sliding_window=4096, rope_theta=1_000_000.0, rope_local_base_freq=10_000.0,
                            sliding_window_pattern=6, hidden_activation="gelu_pytorch_tanh",
                            tie_word_embeddings=True)
GEMMA2_DEFAULTS = dict(head_dim=256, query_pre_attn_scalar=256, sliding_window=4096, attn_logit_softcapping=50.0,
                       final_logit_softcapping=30.0, hidden_activation="gelu_pytorch_tanh", rms_norm_eps=1e-6,
                       tie_word_embeddings=True)
ACTIVATIONS = {"silu": "silu", "gelu_pytorch_tanh": "gelu_tanh", "gelu_tanh": "gelu_tanh"}


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
    attention_factor: float = 0.0  # yarn, longrope: cos and sin are scaled by it; 0 = the rule of each
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
    def cos_sin_scale(self) -> float:
        """What cos and sin are multiplied by: yarn's and longrope's attention factor, else 1."""
        if self.kind == "yarn":
            return self.yarn_attention_factor
        if self.kind == "longrope":
            if self.attention_factor:
                return self.attention_factor
            return 1.0 if self.factor <= 1 else math.sqrt(1 + math.log(self.factor) / math.log(self.original_max_len))
        return 1.0

    @property
    def label(self) -> str:
        if self.kind == "longrope":  # its short factors: membound runs within the original context
            return f"longrope ×{self.factor:g} (short factors, ≤ {self.original_max_len})"
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
    rope_freq_factors: tuple[float, ...] = ()  # rope_freqs (GGUF), longrope's short factors: frequency i / entry i
    # Gemma 2/3 and Phi-3 (the defaults are the Llama family's)
    activation: str = "silu"  # the gated MLP's: "silu" (SwiGLU) or "gelu_tanh" (GeGLU: Gemma)
    embed_scale: float = 1.0  # the embeddings are multiplied by it (Gemma: sqrt(dim))
    post_norms: bool = False  # Gemma 2/3: RMSNorm on the attention's and the MLP's outputs too (four a layer)
    attn_scale: float = 0.0  # the query scale; 0 = head_dim ** -0.5 (Gemma: query_pre_attn_scalar ** -0.5)
    attn_softcap: float = 0.0  # Gemma 2: scores = cap * tanh(scores / cap); 0 = none
    final_softcap: float = 0.0  # Gemma 2: the logits soft-capped likewise
    sliding_window: int = 0  # a sliding layer's query sees the keys fewer than this many positions back
    layer_types: tuple[str, ...] = ()  # per layer "sliding" or "full"; () = all full
    rope_local_theta: float = 0.0  # the sliding layers' own RoPE base, unscaled (Gemma 3); 0 = as the others
    rotary_dim: int = 0  # RoPE on each head's first rotary_dim dimensions (partial rotary: Phi-4-mini); 0 = all

    def __post_init__(self):
        if self.head_dim == 0:
            object.__setattr__(self, "head_dim", self.dim // max(self.n_heads, 1))
        for name in ("dim", "n_layers", "n_heads", "n_kv_heads", "ffn_dim", "vocab_size", "max_seq_len"):
            if getattr(self, name) <= 0:
                raise ConfigError(f"model config: {name} must be positive, got {getattr(self, name)}")
        if self.n_heads % self.n_kv_heads:
            raise ConfigError(f"model config: {self.n_heads} query heads is not a multiple of {self.n_kv_heads} KV heads")
        if self.rotary_dim == 0:
            object.__setattr__(self, "rotary_dim", self.head_dim)
        if self.head_dim % 2 or self.rotary_dim % 2 or not 0 < self.rotary_dim <= self.head_dim:
            raise ConfigError(f"model config: RoPE on {self.rotary_dim} of head_dim {self.head_dim} "
                              "(both must be even, the first at most the second)")
        if self.arch not in FAMILY_NAMES:
            raise unsupported_architecture(self.arch)
        if self.rope_freq_factors and len(self.rope_freq_factors) != self.rotary_dim // 2:
            raise ConfigError(f"model config: {len(self.rope_freq_factors)} RoPE frequency factors for "
                              f"{self.rotary_dim} rotated dimensions (need {self.rotary_dim // 2})")
        if self.activation not in ("silu", "gelu_tanh"):
            raise ConfigError(f"activation {self.activation!r} is not supported (silu or gelu_tanh)")
        if self.layer_types and (len(self.layer_types) != self.n_layers
                                 or set(self.layer_types) - {"sliding", "full"}):
            raise ConfigError(f"model config: layer types {self.layer_types} for {self.n_layers} layers "
                              "(each 'sliding' or 'full')")
        if "sliding" in self.layer_types and self.sliding_window <= 0:
            raise ConfigError("model config: sliding layers without a sliding window")

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
        """Parameters of one block read beside its matmuls: the two RMSNorm weights (four: Gemma),
        the q/k/v biases (Qwen2) and the per-head q and k norm weights (Qwen3, Gemma 3)."""
        n = (4 if self.post_norms else 2) * self.dim
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

    def layer_window(self, layer: int) -> int:
        """The keys layer `layer` sees back from a query (0: all of them)."""
        if self.layer_types and self.layer_types[layer] == "sliding":
            return self.sliding_window
        return 0

    def layer_rope_local(self, layer: int) -> bool:
        """Whether layer `layer` rotates with the sliding layers' own RoPE base (Gemma 3's local layers)."""
        return bool(self.rope_local_theta) and self.layer_window(layer) > 0

    @property
    def windowed(self) -> bool:
        """Some layer's window is shorter than the context the model runs: it attends differently."""
        return any(0 < self.layer_window(i) < self.max_seq_len for i in range(self.n_layers))

    @property
    def sliding_layers(self) -> int:
        """Layers that attend within a window (0 for the Llama family)."""
        return sum(1 for t in self.layer_types if t == "sliding") if self.sliding_window else 0

    def kv_positions_read(self, context_len: int) -> int:
        """Cached positions attention reads over all layers for a step after `context_len` cached
        tokens: every one of them on a full layer, the window's (its `sliding_window - 1` latest
        beside the new token) on a sliding one."""
        sliding = self.sliding_layers
        return (self.n_layers - sliding) * context_len + sliding * min(context_len, self.sliding_window - 1)

    def keys_seen(self, context_len: int, new_tokens: int) -> int:
        """Keys the step's queries attend to, over all layers (causal: query i of T sees C + i + 1;
        on a sliding layer no more than the window)."""
        C, T = context_len, new_tokens
        full = T * C + T * (T + 1) // 2
        sliding = self.sliding_layers
        if not sliding:
            return self.n_layers * full
        W, a, b = self.sliding_window, C + 1, C + T  # query positions, counted from 1
        if b <= W:
            windowed = full
        elif a >= W:
            windowed = W * T
        else:
            windowed = (a + W) * (W - a + 1) // 2 + W * (b - W)
        return (self.n_layers - sliding) * full + sliding * windowed

    def beyond_llama(self) -> str:
        """What this model's layers do beyond the Llama family's ("" for none), e.g. "GeGLU, four
        norms a layer, soft-capping": what a Llama-only kernel (the C++ CPU step) cannot run."""
        parts = []
        if self.embed_scale != 1.0:
            parts.append("scaled embeddings")
        if self.activation != "silu":
            parts.append("GeGLU")
        if self.post_norms:
            parts.append("four norms a layer")
        if self.attn_scale:
            parts.append("its own query scale")
        if self.attn_softcap or self.final_softcap:
            parts.append("soft-capping")
        if self.windowed:
            parts.append("sliding-window layers")
        if self.rope_local_theta:
            parts.append("two RoPE bases")
        if self.rotary_dim != self.head_dim:
            parts.append("partial rotary")
        return ", ".join(parts)

    @property
    def rope_label(self) -> str:
        """RoPE as the model line shows it, e.g. "rope 500000, llama3 ×8"."""
        def base(theta: float) -> str:
            return str(int(theta)) if float(theta).is_integer() else f"{theta:g}"
        parts = [f"rope {base(self.rope_theta)}"]
        if self.rope_scaling.kind != "default":
            parts.append(self.rope_scaling.label)
        if self.rope_freq_factors and self.rope_scaling.kind != "longrope":
            parts.append("rope_freqs")
        if self.rope_local_theta:
            parts.append(f"local {base(self.rope_local_theta)}")
        if self.rotary_dim != self.head_dim:
            parts.append(f"on {self.rotary_dim} of {self.head_dim} dims")
        if self.windowed:
            n = sum(1 for i in range(self.n_layers) if self.layer_window(i))
            parts.append(f"window {self.sliding_window} on {n} of {self.n_layers} layers")
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
        """From GGUF key/values (engine/model/config_gguf.py)."""
        from engine.model.config_gguf import config_from_gguf

        return config_from_gguf(meta, name)

    @classmethod
    def from_hf_config(cls, source: dict | str | Path, name: str = "") -> "ModelConfig":
        """From an HF config.json, its folder or its dict (engine/model/config_hf.py)."""
        from engine.model.config_hf import config_from_hf

        return config_from_hf(source, name)


def every_nth_full(n_layers: int, every: int) -> tuple[str, ...]:
    """Layer types where every `every`-th layer attends globally and the rest slide (1: all full)."""
    return tuple("full" if every <= 1 or (i + 1) % every == 0 else "sliding" for i in range(n_layers))


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
