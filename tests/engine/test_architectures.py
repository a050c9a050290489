"""Each supported family against transformers' own classes: a tiny random model made by transformers,
saved as an HF folder and written as GGUF the way llama.cpp's converter writes it; logits equal at fp32
tolerance over prefill and decode steps, greedy tokens equal. Anything else is refused in one line."""
import json
import math

import pytest
import torch
from model_files import (
    assert_logits_match,
    hf_greedy,
    our_greedy,
    save_hf_folder,
    tiny_gemma3_multimodal,
    tiny_hf,
    write_gguf,
)

from engine.io.loader import load_model
from engine.model.config import ConfigError, ModelConfig


pytestmark = pytest.mark.usefixtures("one_torch_thread")  # tiny models (tests/conftest.py)

GEMMA3_ROPE = {"sliding_attention": {"rope_type": "default", "rope_theta": 10000.0},  # transformers 5's per-layer form
               "full_attention": {"rope_type": "linear", "factor": 2.0, "rope_theta": 1e6}}
# Phi-3.5/4-mini: longrope (short factors within the original context) on 12 of 16 head dimensions
PHI_LONGROPE = {"rope_type": "longrope", "rope_theta": 10000.0, "partial_rotary_factor": 0.75,
                "short_factor": [1.0 + 0.1 * i for i in range(6)], "long_factor": [2.0] * 6}
CASES = {  # family, config overrides
    "llama": ("llama", dict(rope_theta=500000.0)),
    "llama-tied-mha": ("llama", dict(num_key_value_heads=4, tie_word_embeddings=True)),
    "mistral": ("mistral", dict(rope_theta=1000000.0)),
    "qwen2": ("qwen2", dict(rope_theta=1000000.0)),
    "qwen2-tied": ("qwen2", dict(tie_word_embeddings=True, num_key_value_heads=1)),
    "qwen3": ("qwen3", dict(rope_theta=1000000.0)),
    # Gemma 2: soft-capped scores and logits, a 5-key window on every other layer (17-token tests slide)
    "gemma2": ("gemma2", dict()),
    # Gemma 3: q/k norms, five sliding layers of six with their own RoPE base, the global ones scaled
    "gemma3": ("gemma3", dict(num_hidden_layers=6, rope_parameters=GEMMA3_ROPE)),
    "phi3.5": ("phi3", dict(original_max_position_embeddings=64, rope_parameters=PHI_LONGROPE)),
    "phi3-mini": ("phi3", dict(sliding_window=7, rope_theta=10000.0)),  # Phi-3-mini-4k: a window on every layer
    # Phi-3.5-mini's shape: longrope on every dimension, no window in reach: Llama-family layers (the C++ step's)
    "phi3-longrope": ("phi3", dict(original_max_position_embeddings=64, rope_parameters={
        **PHI_LONGROPE, "partial_rotary_factor": 1.0, "short_factor": [1.0 + 0.05 * i for i in range(8)],
        "long_factor": [2.0] * 8})),
}
HF_ONLY = {  # what only config.json says (the GGUF converter writes no query scale: llama.cpp assumes head_dim)
    "gemma2": dict(query_pre_attn_scalar=24), "gemma3": dict(query_pre_attn_scalar=24),
}


def model_file(tmp_path, hf, fmt):
    return save_hf_folder(hf, tmp_path / "hf") if fmt == "hf" else write_gguf(hf, tmp_path / "m.gguf")


@pytest.mark.parametrize("fmt", ["hf", "gguf"])
@pytest.mark.parametrize("case", CASES)
def test_family_matches_transformers(tmp_path, case, fmt):
    family, overrides = CASES[case]
    hf = tiny_hf(family, seed=len(case), **overrides, **(HF_ONLY.get(case, {}) if fmt == "hf" else {}))
    loaded = load_model(model_file(tmp_path, hf, fmt))
    cfg = loaded.cfg
    assert cfg.qkv_bias == (family == "qwen2") and cfg.qk_norm == (family in ("qwen3", "gemma3"))
    theta = GEMMA3_ROPE["full_attention"]["rope_theta"] if family == "gemma3" else overrides.get("rope_theta", 10000.0)
    assert cfg.rope_theta == theta
    assert cfg.family in loaded.label and ("F32 → fp32" in loaded.label or "fp32 → fp32" in loaded.label)
    assert_logits_match(loaded, hf)
    prompt = loaded.tokenizer.encode("Decode reads every weight")
    assert our_greedy(loaded, prompt, 16) == hf_greedy(hf, prompt, 16)


def test_parameter_count_includes_biases_and_qk_norms(tmp_path):
    for family in ("llama", "qwen2", "qwen3", "gemma2", "gemma3", "phi3"):
        hf = tiny_hf(family)
        cfg = ModelConfig.from_hf_config(save_hf_folder(hf, tmp_path / family))
        assert cfg.n_params == sum(p.numel() for p in hf.parameters()), family


@pytest.mark.parametrize("config,message", [
    ({"architectures": ["GPT2LMHeadModel"], "n_embd": 8}, "unsupported architecture 'GPT2LMHeadModel'"),
    ({"architectures": ["MambaForCausalLM"]}, "unsupported architecture 'MambaForCausalLM'"),
    ({"model_type": "phi"}, "unsupported architecture 'phi'"),  # Phi-1/2 (Phi-3 is supported)
])
def test_other_architectures_are_refused_in_one_line_naming_what_is_supported(tmp_path, config, message):
    (tmp_path / "config.json").write_text(json.dumps(config))
    with pytest.raises(ConfigError, match=message) as e:
        load_model(tmp_path)
    assert "Llama 1-3.x, Mistral, Qwen2/2.5, Qwen3, Gemma 2/3 (text), Phi-3/3.5/4-mini" in str(e.value)
    assert "\n" not in str(e.value)
    with pytest.raises(ConfigError, match="unsupported architecture 'gemma'.*Phi-3"):  # Gemma 1
        ModelConfig.from_gguf_metadata({"general.architecture": "gemma"})


def test_mistral_sliding_window_bounds_the_context():
    hf = {"architectures": ["MistralForCausalLM"], "hidden_size": 64, "num_attention_heads": 4,
          "num_hidden_layers": 1, "intermediate_size": 96, "vocab_size": 300, "max_position_embeddings": 32768,
          "sliding_window": 4096}
    assert ModelConfig.from_hf_config(hf).max_seq_len == 4096  # beyond the window it would attend differently
    assert ModelConfig.from_hf_config({**hf, "sliding_window": None}).max_seq_len == 32768


def test_llama2_style_gguf_with_a_sentencepiece_vocabulary(tmp_path):
    """Llama 1/2 and Mistral GGUF files carry SentencePiece vocabularies: the file loads, its
    logits are transformers', and a prompt starts with BOS as llama.cpp's does."""
    hf = tiny_hf("mistral", seed=11, vocab_size=400)
    loaded = load_model(write_gguf(hf, tmp_path / "m.gguf", sentencepiece=True))
    assert loaded.cfg.family == "Llama"  # llama.cpp's converter writes Mistral as llama-arch
    assert_logits_match(loaded, hf)
    prompt = loaded.tokenizer.encode("hello world")
    assert prompt[0] == 1 and our_greedy(loaded, prompt, 12) == hf_greedy(hf, prompt, 12)


def test_family_features_are_read_from_each_format(tmp_path):
    """What each family adds, as the config says it and as llama.cpp's rules read the GGUF."""
    gemma3 = ModelConfig.from_hf_config(save_hf_folder(tiny_hf("gemma3", num_hidden_layers=6,
                                                               rope_parameters=GEMMA3_ROPE), tmp_path / "g3"))
    assert gemma3.layer_types == ("sliding",) * 5 + ("full",) and gemma3.sliding_window == 5
    assert (gemma3.rope_local_theta, gemma3.rope_scaling.kind, gemma3.rope_scaling.factor) == (10000.0, "linear", 2.0)
    assert gemma3.embed_scale == pytest.approx(8.0) and gemma3.activation == "gelu_tanh" and gemma3.post_norms
    assert gemma3.attn_scale == pytest.approx(16 ** -0.5) and gemma3.tied_embeddings
    gemma2 = ModelConfig.from_gguf_metadata({"general.architecture": "gemma2", "gemma2.embedding_length": 64,
                                             "gemma2.attention.head_count": 4, "gemma2.block_count": 4,
                                             "gemma2.feed_forward_length": 96, "gemma2.vocab_size": 300,
                                             "gemma2.attention.key_length": 16, "gemma2.attention.sliding_window": 8,
                                             "gemma2.attn_logit_softcapping": 50.0,
                                             "gemma2.final_logit_softcapping": 30.0})
    assert gemma2.layer_types == ("sliding", "full") * 2 and (gemma2.attn_softcap, gemma2.final_softcap) == (50, 30)
    phi = ModelConfig.from_hf_config(save_hf_folder(tiny_hf("phi3", original_max_position_embeddings=64,
                                                            rope_parameters=PHI_LONGROPE), tmp_path / "phi"))
    assert (phi.rotary_dim, phi.head_dim, phi.max_seq_len) == (12, 16, 64)  # the long factors are not run
    assert phi.rope_freq_factors == tuple(PHI_LONGROPE["short_factor"])
    assert phi.rope_scaling.cos_sin_scale == pytest.approx((1 + math.log(2) / math.log(64)) ** 0.5)


def test_released_config_files_parse(tmp_path):
    """config.json as the released checkpoints write it (transformers 4 keys, multimodal Gemma 3 with
    its text defaults left out, Phi-3's first 'su' scaling name)."""
    gemma3_4b = {"architectures": ["Gemma3ForConditionalGeneration"], "model_type": "gemma3",
                 "text_config": {"hidden_size": 2560, "intermediate_size": 10240, "model_type": "gemma3_text",
                                 "num_hidden_layers": 34, "rope_scaling": {"factor": 8.0, "rope_type": "linear"},
                                 "sliding_window": 1024}, "vision_config": {"model_type": "siglip_vision_model"}}
    cfg = ModelConfig.from_hf_config(gemma3_4b)
    assert (cfg.n_heads, cfg.n_kv_heads, cfg.head_dim, cfg.vocab_size) == (8, 4, 256, 262208)
    assert cfg.layer_types[:6] == ("sliding",) * 5 + ("full",) and cfg.sliding_window == 1024
    assert (cfg.rope_theta, cfg.rope_local_theta, cfg.rope_scaling.factor) == (1e6, 1e4, 8.0)
    assert cfg.attn_scale == pytest.approx(256 ** -0.5) and cfg.tied_embeddings
    gemma2_27b = {"architectures": ["Gemma2ForCausalLM"], "hidden_size": 4608, "num_attention_heads": 32,
                  "num_key_value_heads": 16, "head_dim": 128, "num_hidden_layers": 46, "intermediate_size": 36864,
                  "vocab_size": 256000, "query_pre_attn_scalar": 144, "sliding_window": 4096,
                  "max_position_embeddings": 8192, "hidden_act": "gelu_pytorch_tanh",
                  "hidden_activation": "gelu_pytorch_tanh", "attn_logit_softcapping": 50.0,
                  "final_logit_softcapping": 30.0}
    cfg = ModelConfig.from_hf_config(gemma2_27b)
    assert cfg.attn_scale == pytest.approx(144 ** -0.5) and cfg.layer_types[:2] == ("sliding", "full")
    phi3_128k = {"architectures": ["Phi3ForCausalLM"], "hidden_size": 3072, "num_attention_heads": 32,
                 "num_hidden_layers": 32, "intermediate_size": 8192, "vocab_size": 32064,
                 "max_position_embeddings": 131072, "original_max_position_embeddings": 4096,
                 "rope_scaling": {"type": "su", "short_factor": [1.0] * 48, "long_factor": [2.0] * 48},
                 "sliding_window": 262144}
    cfg = ModelConfig.from_hf_config(phi3_128k)
    assert cfg.rope_scaling.kind == "longrope" and cfg.max_seq_len == 4096 and not cfg.windowed
    assert "longrope ×32 (short factors, ≤ 4096)" in cfg.rope_label
    phi4_mini = {**phi3_128k, "hidden_size": 3072, "num_attention_heads": 24, "num_key_value_heads": 8,
                 "partial_rotary_factor": 0.75, "tie_word_embeddings": True,
                 "rope_scaling": {"type": "longrope", "short_factor": [1.0] * 48, "long_factor": [2.0] * 48}}
    cfg = ModelConfig.from_hf_config(phi4_mini)
    assert (cfg.rotary_dim, cfg.head_dim) == (96, 128)


def test_gemma3_multimodal_checkpoint_runs_its_language_model(tmp_path):
    """Gemma3ForConditionalGeneration: the text part under its prefix, the vision tower left alone."""
    hf = tiny_gemma3_multimodal(seed=4)
    loaded = load_model(save_hf_folder(hf, tmp_path / "g3mm"))
    assert loaded.cfg.family == "Gemma 3" and loaded.cfg.n_params == sum(
        p.numel() for n, p in hf.named_parameters() if "language_model" in n)
    assert_logits_match(loaded, hf)
    prompt = loaded.tokenizer.encode("Decode reads every weight")
    assert our_greedy(loaded, prompt, 12) == hf_greedy(hf, prompt, 12)


def test_phi35_shape_decodes_in_the_cpu_step_and_the_others_in_pytorch(tmp_path):
    """Phi-3.5-mini's layers are Llama's (fused weights, longrope is only cos/sin tables): the C++
    step takes them; Gemma's and partial-rotary Phi's are declined with what they add."""
    from engine.model import cpu_step

    def cfg_of(case):
        family, overrides = CASES[case]
        return ModelConfig.from_hf_config(save_hf_folder(tiny_hf(family, **overrides), tmp_path / case))
    assert cpu_step.model_refusal(cfg_of("phi3-longrope")) == ""
    assert "partial rotary" in cpu_step.model_refusal(cfg_of("phi3.5"))
    assert "sliding-window layers" in cpu_step.model_refusal(cfg_of("phi3-mini"))
    gemma2 = cpu_step.model_refusal(cfg_of("gemma2"))
    assert gemma2.startswith("Gemma 2's scaled embeddings, GeGLU, four norms a layer, its own query scale, soft-capping")
