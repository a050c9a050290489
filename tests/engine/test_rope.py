"""RoPE base and scaling as the model files say them: both HF config.json formats, GGUF keys and the
rope_freqs tensor; each checked against transformers' own classes."""
import json
from dataclasses import replace

import pytest
import torch
from model_files import assert_logits_match, hf_greedy, our_greedy, save_hf_folder, tiny_hf, tiny_llama, write_gguf

from engine.io.loader import load_model
from engine.model.config import ConfigError, ModelConfig, RopeScaling
from engine.model.rope import inv_frequencies
from engine.model.transformer import Transformer


pytestmark = pytest.mark.usefixtures("one_torch_thread")  # tiny models (tests/conftest.py)


def test_rope_base_from_a_transformers_5_config_gives_transformers_greedy_text(tmp_path):
    """transformers 5 writes the base under rope_parameters; a base of 10,000 in its place
    changes the text."""
    hf = tiny_llama(seed=1, rope_theta=500000.0)
    save_hf_folder(hf, tmp_path)
    assert "rope_theta" not in json.loads((tmp_path / "config.json").read_text())  # the new format
    loaded = load_model(tmp_path)
    prompt = loaded.tokenizer.encode("The memory wall")
    expect = hf_greedy(hf, prompt, 24)
    got = our_greedy(loaded, prompt, 24)
    assert loaded.tokenizer.decode(got) == loaded.tokenizer.decode(expect)
    assert got == expect


# (head_dim 16, base 500,000: wavelengths 6 .. 635k positions, so an original context of 64 puts
# frequencies below, inside and above Llama 3's blended band)
SCALINGS = {
    "llama3": dict(rope_type="llama3", factor=8.0, low_freq_factor=1.0, high_freq_factor=4.0,
                   original_max_position_embeddings=64),
    "linear": dict(rope_type="linear", factor=4.0),
    "yarn": dict(rope_type="yarn", factor=4.0, original_max_position_embeddings=32),
    "yarn-attention-factor": dict(rope_type="yarn", factor=4.0, original_max_position_embeddings=32,
                                  attention_factor=1.2, beta_fast=16.0, beta_slow=2.0),
    "dynamic": dict(rope_type="dynamic", factor=2.0),
}


def scaled_llama(name, seed=2):
    return tiny_llama(seed=seed, rope_parameters={"rope_theta": 500000.0, **SCALINGS[name]})


@pytest.mark.parametrize("fmt", ["hf", "gguf"])
@pytest.mark.parametrize("name", SCALINGS)
def test_rope_scaling_matches_transformers(tmp_path, name, fmt):
    hf = scaled_llama(name)
    path = save_hf_folder(hf, tmp_path) if fmt == "hf" else write_gguf(hf, tmp_path / "m.gguf")
    loaded = load_model(path)
    cfg = loaded.cfg
    if fmt == "gguf" and name == "llama3":  # the converter writes Llama 3's scaling as the rope_freqs tensor
        assert cfg.rope_freq_factors and cfg.rope_scaling.kind == "default" and "rope_freqs" in loaded.label
    elif fmt == "gguf" and name == "dynamic":  # the converter writes nothing for it: the trained context is the same
        assert cfg.rope_scaling.kind == "default"
    else:
        assert cfg.rope_scaling.kind == SCALINGS[name]["rope_type"] and cfg.rope_scaling.factor == SCALINGS[name]["factor"]
    assert_logits_match(loaded, hf, n_prompt=40, n_decode=8)
    prompt = loaded.tokenizer.encode("A longer prompt, so that positions reach past the original context")
    assert our_greedy(loaded, prompt, 12) == hf_greedy(hf, prompt, 12)
    if name != "dynamic":  # the scaling matters here: without it the logits differ
        plain = replace(cfg, rope_scaling=RopeScaling(), rope_freq_factors=())
        tokens = torch.arange(60)[None] % cfg.vocab_size
        with torch.no_grad():
            a = Transformer(cfg, loaded.weights)(tokens, last_only=False)
            b = Transformer(plain, loaded.weights)(tokens, last_only=False)
        assert (a - b).abs().max() > 1e-2


def test_the_older_config_format_top_level_rope_theta_and_rope_scaling(tmp_path):
    """transformers < 5 writes `rope_theta` and `rope_scaling` at the top (the type as "type" in
    older files still); the same model either way."""
    hf = scaled_llama("llama3", seed=4)
    save_hf_folder(hf, tmp_path)
    config = json.loads((tmp_path / "config.json").read_text())
    params = config.pop("rope_parameters")
    config["rope_theta"] = params.pop("rope_theta")
    params["type"] = params.pop("rope_type")
    config["rope_scaling"] = params
    (tmp_path / "config.json").write_text(json.dumps(config))
    loaded = load_model(tmp_path)
    assert loaded.cfg.rope_theta == 500000.0 and loaded.cfg.rope_scaling.kind == "llama3"
    assert_logits_match(loaded, hf, n_prompt=40, n_decode=4)


def test_gguf_rope_freqs_equal_the_llama3_frequencies():
    s = RopeScaling("llama3", factor=8.0, low_freq_factor=1.0, high_freq_factor=4.0, original_max_len=8192)
    from model_files import llama3_rope_factors
    factors = llama3_rope_factors(128, 500000.0, dict(factor=8.0, low_freq_factor=1.0, high_freq_factor=4.0,
                                                      original_max_position_embeddings=8192))
    from_keys = inv_frequencies(128, 500000.0, s)
    from_tensor = inv_frequencies(128, 500000.0, freq_factors=tuple(float(f) for f in factors))
    torch.testing.assert_close(from_tensor, from_keys, rtol=1e-6, atol=0)
    assert (from_keys < inv_frequencies(128, 500000.0)).any()


def hf_dict(**kw):
    return {"architectures": ["LlamaForCausalLM"], "hidden_size": 64, "num_attention_heads": 4, "num_hidden_layers": 1,
            "intermediate_size": 96, "vocab_size": 300, "max_position_embeddings": 128, **kw}


@pytest.mark.parametrize("config,message", [
    (hf_dict(rope_scaling={"type": "longrope", "short_factor": [1.0], "long_factor": [2.0]}),
     "RoPE scaling type 'longrope' is not supported"),
    (hf_dict(rope_parameters={"rope_type": "su", "rope_theta": 1e4}), "RoPE scaling type 'su' is not supported"),
    (hf_dict(rope_parameters={"full_attention": {"rope_type": "default"}, "sliding_attention": {"rope_type": "default"}}),
     "per-layer RoPE"),
    (hf_dict(partial_rotary_factor=0.5), "partial rotary"),
])
def test_other_rope_kinds_are_refused_in_one_line(config, message):
    with pytest.raises(ConfigError, match=message) as e:
        ModelConfig.from_hf_config(config)
    assert "\n" not in str(e.value)


def test_gguf_rope_keys_refused_or_read():
    meta = {"general.architecture": "llama", "llama.embedding_length": 64, "llama.attention.head_count": 4,
            "llama.block_count": 1, "llama.feed_forward_length": 96, "llama.vocab_size": 300}
    assert ModelConfig.from_gguf_metadata(meta).rope_scaling.kind == "default"
    cfg = ModelConfig.from_gguf_metadata({**meta, "llama.rope.scaling.type": "linear", "llama.rope.scaling.factor": 2.0})
    assert (cfg.rope_scaling.kind, cfg.rope_scaling.factor) == ("linear", 2.0)
    with pytest.raises(ConfigError, match="RoPE scaling type 'longrope' is not supported"):
        ModelConfig.from_gguf_metadata({**meta, "llama.rope.scaling.type": "longrope"})
    with pytest.raises(ConfigError, match="partial rotary"):
        ModelConfig.from_gguf_metadata({**meta, "llama.rope.dimension_count": 8})
    with pytest.raises(ConfigError, match="frequency factors"):
        replace(ModelConfig.from_gguf_metadata(meta), rope_freq_factors=(1.0, 2.0))


def test_qwen_yarn_config_as_qwen_documents_it(tmp_path):
    """Qwen2.5's model card adds {"type": "yarn", "factor": 4.0, "original_max_position_embeddings": 32768}
    under rope_scaling for long inputs."""
    hf = tiny_hf("qwen2", seed=5, max_position_embeddings=128,
                 rope_parameters={"rope_theta": 1e6, "rope_type": "yarn", "factor": 4.0,
                                  "original_max_position_embeddings": 32})
    loaded = load_model(save_hf_folder(hf, tmp_path))
    assert loaded.cfg.rope_scaling == RopeScaling("yarn", factor=4.0, original_max_len=32)
    assert_logits_match(loaded, hf, n_prompt=40, n_decode=4)
