"""A model's shape from its GGUF metadata (`ModelConfig.from_gguf_metadata`), as llama.cpp's
converter writes it, with llama.cpp's rules for what the converter leaves out."""
from __future__ import annotations

import math
from typing import Any

from engine.model.config import GEMMA, GGUF_ARCHITECTURES, ConfigError, ModelConfig, RopeScaling, \
    every_nth_full, unsupported_architecture


def config_from_gguf(meta: dict[str, Any], name: str = "") -> ModelConfig:
    """From GGUF key/values, as llama.cpp's converter writes them. What only the tensors tell is
    passed in by the loader as `_tied_embeddings` (no output.weight), `_qkv_bias` (attn_q.bias
    present) and `_longrope` (Phi-3's rope_factors_short tensor present)."""
    arch = str(meta.get("general.architecture", ""))
    if arch not in GGUF_ARCHITECTURES:
        raise unsupported_architecture(arch)
    family = GGUF_ARCHITECTURES[arch]

    def get(key, default=None):
        value = meta.get(f"{arch}.{key}", default)
        if value is None:
            raise ConfigError(f"GGUF metadata lacks {arch}.{key}")
        return value

    dim = int(get("embedding_length"))
    n_heads = int(get("attention.head_count"))
    n_layers = int(get("block_count"))
    head_dim = int(get("attention.key_length", dim // n_heads))
    if int(get("attention.value_length", head_dim)) != head_dim:
        raise ConfigError("GGUF: attention.value_length differs from key_length (not a supported shape)")
    rotary_dim = int(get("rope.dimension_count", head_dim))
    if rotary_dim != head_dim and family != "phi3":
        raise ConfigError(f"GGUF: RoPE on {rotary_dim} of {head_dim} head dimensions "
                          f"(partial rotary) is not supported for {arch}")
    vocab = meta.get(f"{arch}.vocab_size") or len(meta.get("tokenizer.ggml.tokens", []))
    max_len = int(get("context_length", 2048))
    window = int(meta.get(f"{arch}.attention.sliding_window") or 0)
    extra: dict[str, Any] = {}
    scaling = _rope_scaling_from_gguf(meta, arch, max_len)
    if family in GEMMA:
        # llama.cpp's rules for what the converter does not write: the window pattern (Gemma 2:
        # every other layer slides, the first; Gemma 3: five of six), the local RoPE base, the
        # query scale (head_dim ** -0.5, but dim / n_heads for the 27B models: 46 and 62 layers)
        every = int(meta.get(f"{arch}.attention.sliding_window_pattern") or (2 if family == "gemma2" else 6))
        big = n_layers == (46 if family == "gemma2" else 62)
        extra = dict(activation="gelu_tanh", embed_scale=math.sqrt(dim), post_norms=True,
                     attn_scale=float(meta.get(f"{arch}.attention.scale") or
                                      (dim / n_heads if big else head_dim) ** -0.5),
                     attn_softcap=float(meta.get(f"{arch}.attn_logit_softcapping") or 0.0),
                     final_softcap=float(meta.get(f"{arch}.final_logit_softcapping") or 0.0),
                     sliding_window=window,
                     layer_types=every_nth_full(n_layers, every) if window else ())
        if family == "gemma3":
            extra["rope_local_theta"] = float(meta.get(f"{arch}.rope.freq_base_swa") or 10_000.0)
    elif family == "phi3":
        if window and window < max_len:  # Phi-3-mini's 2047; 0 or wider than the context: none
            extra = dict(sliding_window=window, layer_types=("sliding",) * n_layers)
        if meta.get("_longrope"):
            original = int(get("rope.scaling.original_context_length", max_len))
            scaling = RopeScaling("longrope", factor=max_len / original, original_max_len=original,
                                  attention_factor=float(meta.get(f"{arch}.rope.scaling.attn_factor") or 0.0))
            max_len = min(max_len, original)  # its long factors (beyond that context) are not run
    elif window:  # Mistral, Qwen: within the window sliding attention is full attention: run no further
        max_len = min(max_len, window)
    return ModelConfig(
        name=name or str(meta.get("general.name", "gguf model")),
        dim=dim,
        n_layers=n_layers,
        n_heads=n_heads,
        n_kv_heads=int(get("attention.head_count_kv", n_heads)),
        ffn_dim=int(get("feed_forward_length")),
        vocab_size=int(vocab),
        head_dim=head_dim,
        rope_theta=float(get("rope.freq_base", 10000.0)),
        norm_eps=float(get("attention.layer_norm_rms_epsilon", 1e-5)),
        tied_embeddings=bool(meta.get("_tied_embeddings", True)),
        max_seq_len=max_len,
        arch=family,
        qkv_bias=bool(meta.get("_qkv_bias", arch == "qwen2")),
        qk_norm=arch in ("qwen3", "gemma3"),
        rope_scaling=scaling,
        rotary_dim=rotary_dim,
        **extra,
    )


def _rope_scaling_from_gguf(meta: dict, arch: str, max_len: int) -> RopeScaling:
    """`{arch}.rope.scaling.*` as llama.cpp's converter writes it (linear and yarn; a Llama 3.x
    model's scaling is its rope_freqs tensor instead, and Phi-3's longrope its rope_factors
    tensors, read by the loader)."""
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
