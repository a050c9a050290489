"""Model shapes. `ModelConfig` is the one description of a Llama-family model's shape;
it comes from GGUF metadata, an HF `config.json`, or a named shape (`from_name`)."""
from __future__ import annotations

import json
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any


class ConfigError(ValueError):
    """A model description the engine cannot use (one-line message for the user)."""


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

    def __post_init__(self):
        if self.head_dim == 0:
            object.__setattr__(self, "head_dim", self.dim // max(self.n_heads, 1))
        for field in ("dim", "n_layers", "n_heads", "n_kv_heads", "ffn_dim", "vocab_size", "max_seq_len"):
            if getattr(self, field) <= 0:
                raise ConfigError(f"model config: {field} must be positive, got {getattr(self, field)}")
        if self.n_heads % self.n_kv_heads:
            raise ConfigError(f"model config: {self.n_heads} query heads is not a multiple of {self.n_kv_heads} KV heads")
        if self.head_dim % 2:
            raise ConfigError(f"model config: head_dim {self.head_dim} must be even for RoPE")

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
    def n_params(self) -> int:
        norms = self.n_layers * 2 * self.dim + self.dim
        embed = self.vocab_size * self.dim
        head = 0 if self.tied_embeddings else self.vocab_size * self.dim
        return self.n_layers * self.layer_linear_params + norms + embed + head

    @property
    def kv_bytes_per_token_per_elem(self) -> int:
        """K and V elements one token adds to the cache, over all layers."""
        return 2 * self.n_layers * self.kv_dim

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
        arch = meta.get("general.architecture", "")
        if arch != "llama":
            raise ConfigError(f"unsupported architecture {arch!r}: membound runs Llama-family models")

        def get(key, default=None):
            value = meta.get(f"{arch}.{key}", default)
            if value is None:
                raise ConfigError(f"GGUF metadata lacks {arch}.{key}")
            return value

        dim = int(get("embedding_length"))
        n_heads = int(get("attention.head_count"))
        vocab = meta.get(f"{arch}.vocab_size") or len(meta.get("tokenizer.ggml.tokens", []))
        return cls(
            name=name or str(meta.get("general.name", "gguf model")),
            dim=dim,
            n_layers=int(get("block_count")),
            n_heads=n_heads,
            n_kv_heads=int(get("attention.head_count_kv", n_heads)),
            ffn_dim=int(get("feed_forward_length")),
            vocab_size=int(vocab),
            head_dim=int(meta.get(f"{arch}.attention.key_length", dim // n_heads)),
            rope_theta=float(get("rope.freq_base", 10000.0)),
            norm_eps=float(get("attention.layer_norm_rms_epsilon", 1e-5)),
            tied_embeddings=bool(meta.get("_tied_embeddings", True)),
            max_seq_len=int(get("context_length", 2048)),
        )

    @classmethod
    def from_hf_config(cls, source: dict | str | Path, name: str = "") -> "ModelConfig":
        if not isinstance(source, dict):
            path = Path(source)
            if path.is_dir():
                path = path / "config.json"
            try:
                source = json.loads(path.read_text())
            except FileNotFoundError:
                raise ConfigError(f"no config.json at {path}") from None
            except json.JSONDecodeError as e:
                raise ConfigError(f"{path} is not valid JSON ({e.msg}, line {e.lineno})") from None
        hf = source
        archs = hf.get("architectures") or [hf.get("model_type", "")]
        if not any(a in ("LlamaForCausalLM", "llama") for a in archs):
            raise ConfigError(f"unsupported architecture {archs[0]!r}: membound runs Llama-family models")
        if hf.get("rope_scaling"):
            raise ConfigError("models with rope_scaling are not supported yet")
        dim = int(hf["hidden_size"])
        n_heads = int(hf["num_attention_heads"])
        return cls(
            name=name or hf.get("_name_or_path", "") or "hf model",
            dim=dim,
            n_layers=int(hf["num_hidden_layers"]),
            n_heads=n_heads,
            n_kv_heads=int(hf.get("num_key_value_heads") or n_heads),
            ffn_dim=int(hf["intermediate_size"]),
            vocab_size=int(hf["vocab_size"]),
            head_dim=int(hf.get("head_dim") or dim // n_heads),
            rope_theta=float(hf.get("rope_theta", 10000.0)),
            norm_eps=float(hf.get("rms_norm_eps", 1e-6)),
            tied_embeddings=bool(hf.get("tie_word_embeddings", False)),
            max_seq_len=int(hf.get("max_position_embeddings", 2048)),
        )


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
    "llama3.2-1b": dict(dim=2048, n_layers=16, n_heads=32, n_kv_heads=8, ffn_dim=8192, vocab_size=128256,
                        rope_theta=500000.0, norm_eps=1e-5, tied_embeddings=True, max_seq_len=8192),
}
