"""Hugging Face transformers as an oracle and a yardstick (test/bench only: transformers
is not a dependency of the engine). Builds the family's `*ForCausalLM` holding the same weights."""
from __future__ import annotations

import torch

from engine.model.config import ModelConfig

_HF_PARTS = {"attn_norm": "input_layernorm.weight", "ffn_norm": "post_attention_layernorm.weight",
             "wq": "self_attn.q_proj.weight", "wk": "self_attn.k_proj.weight", "wv": "self_attn.v_proj.weight",
             "wo": "self_attn.o_proj.weight", "w_gate": "mlp.gate_proj.weight", "w_up": "mlp.up_proj.weight",
             "w_down": "mlp.down_proj.weight", "bq": "self_attn.q_proj.bias", "bk": "self_attn.k_proj.bias",
             "bv": "self_attn.v_proj.bias", "q_norm": "self_attn.q_norm.weight", "k_norm": "self_attn.k_norm.weight"}
_HF_CLASSES = {"llama": ("LlamaConfig", "LlamaForCausalLM"), "mistral": ("MistralConfig", "MistralForCausalLM"),
               "qwen2": ("Qwen2Config", "Qwen2ForCausalLM"), "qwen3": ("Qwen3Config", "Qwen3ForCausalLM")}


def _transformers():
    try:
        import transformers
    except ImportError:
        raise RuntimeError("--compare hf needs the 'transformers' package (pip install transformers)") from None
    return transformers


def hf_rope_parameters(cfg: ModelConfig) -> dict:
    s = cfg.rope_scaling
    params = {"rope_type": s.kind, "rope_theta": cfg.rope_theta}
    if s.kind != "default":
        params["factor"] = s.factor
    if s.kind == "llama3":
        params.update(low_freq_factor=s.low_freq_factor, high_freq_factor=s.high_freq_factor,
                      original_max_position_embeddings=s.original_max_len)
    if s.kind == "yarn":
        params.update(original_max_position_embeddings=s.original_max_len, beta_fast=s.beta_fast,
                      beta_slow=s.beta_slow, truncate=s.truncate)
        if s.attention_factor:
            params["attention_factor"] = s.attention_factor
    return params


def hf_config(cfg: ModelConfig):
    if cfg.arch not in _HF_CLASSES:
        raise ValueError(f"--compare hf builds {', '.join(c[1] for c in _HF_CLASSES.values())} from the weights; "
                         f"{cfg.family} is not among them (its transformers class is checked in the tests)")
    if cfg.rope_freq_factors:
        raise ValueError("--compare hf: transformers has no form for a GGUF file's rope_freqs factors "
                         "(Llama 3.1+): compare the model's HF folder instead")
    config_class = getattr(_transformers(), _HF_CLASSES[cfg.arch][0])
    kwargs = dict(
        vocab_size=cfg.vocab_size, hidden_size=cfg.dim, intermediate_size=cfg.ffn_dim,
        num_hidden_layers=cfg.n_layers, num_attention_heads=cfg.n_heads, num_key_value_heads=cfg.n_kv_heads,
        head_dim=cfg.head_dim, max_position_embeddings=cfg.max_seq_len, rms_norm_eps=cfg.norm_eps,
        rope_parameters=hf_rope_parameters(cfg), tie_word_embeddings=cfg.tied_embeddings,
        hidden_act="silu", bos_token_id=None, eos_token_id=None, pad_token_id=None)
    if cfg.arch in ("llama", "qwen3"):
        kwargs["attention_bias"] = False
    if cfg.arch == "llama":
        kwargs["mlp_bias"] = False
    if cfg.arch == "mistral":
        kwargs["sliding_window"] = None
    return config_class(**kwargs)


def hf_state_dict(weights: dict[str, torch.Tensor], cfg: ModelConfig | None = None) -> dict[str, torch.Tensor]:
    """transformers' names for the engine's weights; fused q/k/v, gate/up and biases are split
    back into views (that needs `cfg`)."""
    sd = {"model.embed_tokens.weight": weights["embed"], "model.norm.weight": weights["norm"]}
    if "head" in weights:
        sd["lm_head.weight"] = weights["head"]
    for key, t in weights.items():
        if not key.startswith("layers."):
            continue
        _, idx, part = key.split(".", 2)
        if part in ("wqkv", "bqkv"):
            names = ("wq", "wk", "wv") if part == "wqkv" else ("bq", "bk", "bv")
            pieces = dict(zip(names, t.split([cfg.q_dim, cfg.kv_dim, cfg.kv_dim], dim=0)))
        elif part == "w_gate_up":
            pieces = dict(zip(("w_gate", "w_up"), t.split(cfg.ffn_dim, dim=0)))
        else:
            pieces = {part: t}
        for name, piece in pieces.items():
            sd[f"model.layers.{idx}.{_HF_PARTS[name]}"] = piece
    return sd


def build_hf_model(cfg: ModelConfig, weights: dict[str, torch.Tensor], dtype: torch.dtype, device: str = "cpu",
                   attn_implementation: str = "sdpa"):
    config = hf_config(cfg)
    config._attn_implementation = attn_implementation
    model = getattr(_transformers(), _HF_CLASSES[cfg.arch][1])(config)  # random init, then our weights
    sd = {k: v.to(torch.float32) for k, v in hf_state_dict(weights, cfg).items()}
    missing, unexpected = model.load_state_dict(sd, strict=False)
    missing = [k for k in missing if not (cfg.tied_embeddings and k == "lm_head.weight")]
    if missing or unexpected:
        raise RuntimeError(f"HF model weights do not line up: missing {missing[:3]}, unexpected {unexpected[:3]}")
    if cfg.tied_embeddings:
        model.tie_weights()
    model.to(device=device, dtype=dtype)
    model.eval()
    return model
