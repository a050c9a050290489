"""Hugging Face transformers as an oracle and a yardstick (test/bench only: transformers
is not a dependency of the engine). Builds a `LlamaForCausalLM` holding the same weights."""
from __future__ import annotations

import torch

from engine.model.config import ModelConfig

_HF_PARTS = {"attn_norm": "input_layernorm", "ffn_norm": "post_attention_layernorm", "wq": "self_attn.q_proj",
             "wk": "self_attn.k_proj", "wv": "self_attn.v_proj", "wo": "self_attn.o_proj",
             "w_gate": "mlp.gate_proj", "w_up": "mlp.up_proj", "w_down": "mlp.down_proj"}


def hf_config(cfg: ModelConfig):
    try:
        from transformers import LlamaConfig
    except ImportError:
        raise RuntimeError("--compare hf needs the 'transformers' package (pip install transformers)") from None
    return LlamaConfig(
        vocab_size=cfg.vocab_size, hidden_size=cfg.dim, intermediate_size=cfg.ffn_dim,
        num_hidden_layers=cfg.n_layers, num_attention_heads=cfg.n_heads, num_key_value_heads=cfg.n_kv_heads,
        head_dim=cfg.head_dim, max_position_embeddings=cfg.max_seq_len, rms_norm_eps=cfg.norm_eps,
        rope_theta=cfg.rope_theta, tie_word_embeddings=cfg.tied_embeddings, attention_bias=False,
        mlp_bias=False, hidden_act="silu", bos_token_id=None, eos_token_id=None, pad_token_id=None)


def hf_state_dict(weights: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    sd = {"model.embed_tokens.weight": weights["embed"], "model.norm.weight": weights["norm"]}
    if "head" in weights:
        sd["lm_head.weight"] = weights["head"]
    for key, t in weights.items():
        if key.startswith("layers."):
            _, idx, part = key.split(".", 2)
            sd[f"model.layers.{idx}.{_HF_PARTS[part]}.weight"] = t
    return sd


def build_hf_model(cfg: ModelConfig, weights: dict[str, torch.Tensor], dtype: torch.dtype, device: str = "cpu",
                   attn_implementation: str = "sdpa"):
    from transformers import LlamaForCausalLM

    config = hf_config(cfg)
    config._attn_implementation = attn_implementation
    model = LlamaForCausalLM(config)  # random init, then overwritten with our weights
    sd = {k: v.to(torch.float32) for k, v in hf_state_dict(weights).items()}
    missing, unexpected = model.load_state_dict(sd, strict=False)
    missing = [k for k in missing if not (cfg.tied_embeddings and k == "lm_head.weight")]
    if missing or unexpected:
        raise RuntimeError(f"HF model weights do not line up: missing {missing[:3]}, unexpected {unexpected[:3]}")
    if cfg.tied_embeddings:
        model.tie_weights()
    model.to(device=device, dtype=dtype)
    model.eval()
    return model
