"""Each supported family against transformers' own classes: a tiny random model made by transformers,
saved as an HF folder and written as GGUF the way llama.cpp's converter writes it; logits equal at fp32
tolerance over prefill and decode steps, greedy tokens equal. Anything else is refused in one line."""
import json

import pytest
from model_files import assert_logits_match, hf_greedy, our_greedy, save_hf_folder, tiny_hf, write_gguf

from engine.io.loader import load_model
from engine.model.config import ConfigError, ModelConfig


pytestmark = pytest.mark.usefixtures("one_torch_thread")  # tiny models (tests/conftest.py)

CASES = {  # family, config overrides
    "llama": ("llama", dict(rope_theta=500000.0)),
    "llama-tied-mha": ("llama", dict(num_key_value_heads=4, tie_word_embeddings=True)),
    "mistral": ("mistral", dict(rope_theta=1000000.0)),
    "qwen2": ("qwen2", dict(rope_theta=1000000.0)),
    "qwen2-tied": ("qwen2", dict(tie_word_embeddings=True, num_key_value_heads=1)),
    "qwen3": ("qwen3", dict(rope_theta=1000000.0)),
}


def model_file(tmp_path, hf, fmt):
    return save_hf_folder(hf, tmp_path / "hf") if fmt == "hf" else write_gguf(hf, tmp_path / "m.gguf")


@pytest.mark.parametrize("fmt", ["hf", "gguf"])
@pytest.mark.parametrize("case", CASES)
def test_family_matches_transformers(tmp_path, case, fmt):
    family, overrides = CASES[case]
    hf = tiny_hf(family, seed=len(case), **overrides)
    loaded = load_model(model_file(tmp_path, hf, fmt))
    cfg = loaded.cfg
    assert cfg.qkv_bias == (family == "qwen2") and cfg.qk_norm == (family == "qwen3")
    assert cfg.rope_theta == overrides.get("rope_theta", 10000.0)
    assert cfg.family in loaded.label and ("F32 → fp32" in loaded.label or "fp32 → fp32" in loaded.label)
    assert_logits_match(loaded, hf)
    prompt = loaded.tokenizer.encode("Decode reads every weight")
    assert our_greedy(loaded, prompt, 16) == hf_greedy(hf, prompt, 16)


def test_parameter_count_includes_biases_and_qk_norms(tmp_path):
    for family in ("llama", "qwen2", "qwen3"):
        hf = tiny_hf(family)
        cfg = ModelConfig.from_hf_config(save_hf_folder(hf, tmp_path / family))
        assert cfg.n_params == sum(p.numel() for p in hf.parameters()), family


@pytest.mark.parametrize("config,message", [
    ({"architectures": ["GPT2LMHeadModel"], "n_embd": 8}, "unsupported architecture 'GPT2LMHeadModel'"),
    ({"architectures": ["Gemma2ForCausalLM"]}, "unsupported architecture 'Gemma2ForCausalLM'"),
    ({"model_type": "phi3"}, "unsupported architecture 'phi3'"),
])
def test_other_architectures_are_refused_in_one_line_naming_what_is_supported(tmp_path, config, message):
    (tmp_path / "config.json").write_text(json.dumps(config))
    with pytest.raises(ConfigError, match=message) as e:
        load_model(tmp_path)
    assert "Llama 1-3.x, Mistral, Qwen2/2.5, Qwen3" in str(e.value) and "\n" not in str(e.value)
    with pytest.raises(ConfigError, match="unsupported architecture 'gemma2'.*Qwen3"):
        ModelConfig.from_gguf_metadata({"general.architecture": "gemma2"})


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
