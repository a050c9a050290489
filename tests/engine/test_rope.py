"""RoPE base and scaling as the model files say them: both HF config.json formats, GGUF keys and the
rope_freqs tensor; each checked against transformers' own classes."""
import json

import torch

from engine.io.loader import load_model
from model_files import hf_greedy, our_greedy, save_hf_folder, tiny_llama


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
