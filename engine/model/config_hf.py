"""A model's shape from an HF `config.json` (`ModelConfig.from_hf_config`), in either transformers
format: rope_theta/rope_scaling at the top, or transformers 5's rope_parameters."""
from __future__ import annotations

import json
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from engine.model.config import ACTIVATIONS, GEMMA, GEMMA2_DEFAULTS, GEMMA3_TEXT_DEFAULTS, HF_ARCHITECTURES, \
    HF_MODEL_TYPES, ROPE_KINDS, ConfigError, ModelConfig, RopeScaling, every_nth_full, unsupported_architecture


def config_from_hf(source: dict | str | Path, name: str = "") -> ModelConfig:
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
    if family == "gemma3":  # a multimodal checkpoint keeps its language model's shape in text_config
        text = hf.get("text_config") or {}
        hf = {**GEMMA3_TEXT_DEFAULTS, **hf, **text} if text else {**GEMMA3_TEXT_DEFAULTS, **hf}
        if text and "tie_word_embeddings" not in text and "tie_word_embeddings" in source:
            hf["tie_word_embeddings"] = source["tie_word_embeddings"]
    elif family == "gemma2":
        hf = {**GEMMA2_DEFAULTS, **hf}
    act = hf.get("hidden_activation") or hf.get("hidden_act") or "silu"
    if family in GEMMA and hf.get("hidden_activation") is None and act == "gelu":
        act = "gelu_pytorch_tanh"  # Gemma's config.json says gelu; its MLP runs the tanh approximation
    if act not in ACTIVATIONS or (family not in GEMMA and ACTIVATIONS[act] != "silu"):
        raise ConfigError(f"activation {act!r} is not supported for this family")
    if hf.get("mlp_bias"):
        raise ConfigError("MLP biases (mlp_bias) are not supported")
    if family not in ("qwen2",) and hf.get("attention_bias"):
        raise ConfigError("attention biases on q/k/v/o (attention_bias) are not supported for this family")
    dim = int(hf["hidden_size"])
    n_heads = int(hf["num_attention_heads"])
    n_layers = int(hf["num_hidden_layers"])
    head_dim = int(hf.get("head_dim") or dim // n_heads)
    max_len = int(hf.get("max_position_embeddings", 2048))
    rope = _rope_from_hf(hf, max_len, family)
    partial = float(hf.get("partial_rotary_factor") or rope.partial or 1.0)
    if partial != 1.0 and family != "phi3":
        raise ConfigError("partial rotary embeddings (partial_rotary_factor) are not supported for this family")
    rotary_dim = int(head_dim * partial)
    window = int(hf.get("sliding_window") or 0)
    layer_types = tuple("sliding" if t == "sliding_attention" else "full" for t in hf.get("layer_types") or ())
    extra: dict[str, Any] = {}
    if family in GEMMA:
        if not layer_types and window:
            every = 2 if family == "gemma2" else int(hf.get("sliding_window_pattern") or 6)
            layer_types = every_nth_full(n_layers, every)
        extra = dict(activation="gelu_tanh", embed_scale=math.sqrt(dim), post_norms=True,
                     attn_scale=float(hf.get("query_pre_attn_scalar") or head_dim) ** -0.5,
                     attn_softcap=float(hf.get("attn_logit_softcapping") or 0.0),
                     final_softcap=float(hf.get("final_logit_softcapping") or 0.0),
                     sliding_window=window if "sliding" in layer_types else 0,
                     layer_types=layer_types if "sliding" in layer_types else (),
                     rope_local_theta=rope.local_theta if family == "gemma3" else 0.0)
    elif family == "phi3":
        if window and window < max_len:  # Phi-3-mini's 2047 (all layers); Phi-3.5/4-mini's 262144: none
            extra = dict(sliding_window=window, layer_types=("sliding",) * n_layers)
        if rope.scaling.kind == "longrope":
            max_len = min(max_len, rope.scaling.original_max_len)  # the long factors are not run
    else:
        slides = family == "mistral" or hf.get("use_sliding_window") or "sliding" in layer_types
        if window and slides:  # within the window sliding attention is full attention: run no further
            max_len = min(max_len, window)
    return ModelConfig(
        name=name or hf.get("_name_or_path", "") or "hf model",
        dim=dim,
        n_layers=n_layers,
        n_heads=n_heads,
        n_kv_heads=int(hf.get("num_key_value_heads") or n_heads),
        ffn_dim=int(hf["intermediate_size"]),
        vocab_size=int(hf["vocab_size"]),
        head_dim=head_dim,
        rope_theta=rope.theta,
        norm_eps=float(hf.get("rms_norm_eps", 1e-6)),
        tied_embeddings=bool(hf.get("tie_word_embeddings", False)),
        max_seq_len=max_len,
        arch=family,
        qkv_bias=family == "qwen2",
        qk_norm=family in ("qwen3", "gemma3"),
        rope_scaling=rope.scaling,
        rope_freq_factors=rope.factors,
        rotary_dim=rotary_dim,
        **extra,
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


@dataclass(frozen=True)
class _HfRope:
    theta: float
    scaling: RopeScaling
    factors: tuple[float, ...] = ()  # longrope's short factors
    local_theta: float = 0.0  # Gemma 3's sliding layers' base
    partial: float = 0.0  # partial_rotary_factor, where transformers 5 keeps it with the RoPE


def _rope_from_hf(hf: dict, max_len: int, family: str = "llama") -> _HfRope:
    """RoPE from either format: transformers <5 keeps `rope_theta` and `rope_scaling` at the top
    level, transformers 5 both under `rope_parameters` (per layer type for Gemma's models)."""
    params = dict(hf.get("rope_parameters") or {})
    local_theta = float(hf.get("rope_local_base_freq") or 0.0)
    if params and all(isinstance(v, dict) or v is None for v in params.values()):  # per layer type
        if set(params) - {"full_attention", "sliding_attention"} or \
                ("sliding_attention" in params and family != "gemma3"):
            raise ConfigError(f"per-layer RoPE ({', '.join(sorted(params))}) is not supported for this family")
        local = dict(params.get("sliding_attention") or {})
        if local:
            if (local.get("rope_type") or "default") != "default":
                raise ConfigError(f"RoPE scaling {local.get('rope_type')!r} on sliding layers is not supported")
            local_theta = float(local.get("rope_theta") or local_theta or 10_000.0)
        params = dict(params.get("full_attention") or {})
    merged = {**(hf.get("rope_scaling") or {}), **params}
    theta = float(merged.get("rope_theta") or hf.get("rope_theta") or 10000.0)
    if family == "gemma3" and not local_theta:
        local_theta = 10_000.0
    partial = float(merged.get("partial_rotary_factor") or 0.0)
    named = merged.get("rope_type") or merged.get("type") or "default"
    kind = "longrope" if named == "su" else named  # su: longrope's first name (Phi-3's early configs)
    if kind not in ROPE_KINDS or (kind == "longrope" and family != "phi3"):
        raise ConfigError(f"RoPE scaling type {named!r} is not supported"
                          + (" for this family (Phi-3's)" if kind == "longrope"
                             else f" (supported: {', '.join(ROPE_KINDS)})"))
    if kind == "default":
        return _HfRope(theta, RopeScaling(), local_theta=local_theta, partial=partial)
    original = int(hf.get("original_max_position_embeddings") or merged.get("original_max_position_embeddings")
                   or max_len)
    if kind == "longrope":  # within the original context transformers runs the short factors
        short = merged.get("short_factor")
        if not short:
            raise ConfigError("RoPE scaling longrope without short_factor")
        factor = float(merged.get("factor") or max_len / original)
        return _HfRope(theta, RopeScaling("longrope", factor=factor, original_max_len=original,
                                          attention_factor=float(merged.get("attention_factor") or 0.0)),
                       factors=tuple(float(f) for f in short), partial=partial)
    factor = merged.get("factor")
    if kind == "yarn" and factor is None:
        factor = max_len / original
    if factor is None:
        raise ConfigError(f"RoPE scaling {kind} without a factor")
    attention_factor = float(merged.get("attention_factor") or 0.0)
    mscale, mscale_all_dim = merged.get("mscale"), merged.get("mscale_all_dim")
    if kind == "yarn" and not attention_factor and mscale and mscale_all_dim:
        attention_factor = _yarn_mscale(float(factor), mscale) / _yarn_mscale(float(factor), mscale_all_dim)
    return _HfRope(theta, RopeScaling(
        kind=kind, factor=float(factor),
        low_freq_factor=float(merged.get("low_freq_factor", 1.0)),
        high_freq_factor=float(merged.get("high_freq_factor", 4.0)),
        original_max_len=original,
        beta_fast=float(merged.get("beta_fast") or 32.0),
        beta_slow=float(merged.get("beta_slow") or 1.0),
        attention_factor=attention_factor,
        truncate=bool(merged.get("truncate", True)),
    ), local_theta=local_theta, partial=partial)


def _yarn_mscale(scale: float, mscale: float = 1.0) -> float:
    return 1.0 if scale <= 1 else 0.1 * mscale * math.log(scale) + 1.0
