"""What a loaded model cannot take is greyed in the window with the reason, and only that: a model
whose FFN width no INT4 group divides runs at fp and INT8, its INT4 option disabled and saying why."""
from __future__ import annotations

from dataclasses import replace

import torch

from engine.io.byte_tokenizer import ByteTokenizer
from engine.io.loader import LoadedWeights, synthetic_weights
from engine.model.config import ModelConfig


def test_int4_is_greyed_with_its_reason_when_no_group_divides_the_ffn(make_window, tiny_model):
    cfg = replace(tiny_model.cfg, name="ffn200", ffn_dim=200, max_seq_len=256)
    assert isinstance(cfg, ModelConfig)
    model = LoadedWeights(cfg, synthetic_weights(cfg, torch.float32, "cpu"), ByteTokenizer(cfg.vocab_size),
                          "synthetic", "ffn200 (random weights → fp32)", "fp32")
    window = make_window(max_new_tokens=4, model=model)
    buttons = {b.value: b for b in window.controls.widgets["weights"].buttons()}
    assert buttons["fp"].isEnabled() and buttons["int8"].isEnabled() and not buttons["int4"].isEnabled()
    assert "does not divide w_down (ffn_dim) = 200" in buttons["int4"].toolTip()
    assert "this model cannot run int4" in buttons["int4"].toolTip()
    assert all(b.isEnabled() for b in window.controls.widgets["group_size"].buttons())  # not in use: not refused
