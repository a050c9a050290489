"""What each weights setting holds in memory, measured tensor by tensor (engine/model/footprint.py),
against the cost model's figure for it (engine/metrics.py: held_weight_bytes, the fit check's): within
5% for fp, INT8 and INT4 at two group sizes, tied and untied heads, the GPU's layout (one copy of each
weight in its stored format) and the CPU's (its kernels' layouts too); and the fit check refusing, in
one line and before anything is made, a copy the device has no room for."""
from dataclasses import replace

import pytest
import torch

import engine.model.quant as quant
from engine.engine import Engine, EngineError
from engine.io.byte_tokenizer import ByteTokenizer
from engine.io.loader import LoadedWeights, synthetic_weights
from engine.metrics import extra_copy_bytes, held_weight_bytes
from engine.model import footprint
from engine.model.config import ModelConfig
from engine.model.footprint import copy_fit_refusal, held_bytes
from engine.model.quant import Int4Linear, quantize_model
from engine.model.transformer import Transformer
from engine.settings import Settings

SETTINGS = [("fp", 32), ("int8", 32), ("int4", 32), ("int4", 128)]


def config(tied: bool) -> ModelConfig:  # SmolLM2's proportions, small: a wide vocabulary, GQA
    return ModelConfig(name="t", dim=256, n_layers=3, n_heads=4, n_kv_heads=2, ffn_dim=640, vocab_size=1000,
                       tied_embeddings=tied, max_seq_len=64)


@pytest.mark.parametrize("tied", [True, False])
@pytest.mark.parametrize("device", ["cuda", "cpu"])
def test_each_weights_setting_holds_what_the_cost_model_says(monkeypatch, tied, device):
    if device == "cuda":  # the GPU's layout, built from CPU tensors: what a layer holds, not what it runs
        monkeypatch.setattr(quant, "_backend", lambda d: "triton")
    cfg = config(tied)
    model = Transformer(cfg, synthetic_weights(cfg, torch.bfloat16, "cpu"))
    for weights, group_size in SETTINGS:
        made = model if weights == "fp" else quantize_model(model, weights, group_size)
        if device == "cpu":  # the C++ step's tiles, made at its first decode step
            for m in made.modules():
                if hasattr(m, "cpu_matrix"):
                    m.cpu_matrix()
        predicted = held_weight_bytes(cfg, 2, weights, group_size, device)
        measured = held_bytes(made)
        assert abs(measured / predicted - 1) <= 0.05, (weights, group_size, measured, predicted)
        if made is not model:  # beside the bf16 model it came from: its own matmul weights only
            extra = held_bytes(made, beside=model)
            assert abs(extra / extra_copy_bytes(cfg, 2, weights, group_size, device) - 1) <= 0.05


def test_an_int4_layer_on_a_gpu_holds_its_codes_once(monkeypatch):
    monkeypatch.setattr(quant, "_backend", lambda d: "triton")
    layer = Int4Linear.from_weight(torch.randn(96, 256), 32)
    codes = [t for t in layer.buffers() if t.dtype == torch.uint8]
    assert [tuple(t.shape) for t in codes] == [(96, 128)]  # two codes a byte, once
    assert held_bytes(layer) == 96 * 128 + 2 * 2 * 96 * (256 // 32)  # + an fp16 scale and min a group


def tiny_engine(settings: Settings) -> Engine:
    cfg = config(True)
    loaded = LoadedWeights(cfg, synthetic_weights(cfg, torch.float32, "cpu"), ByteTokenizer(cfg.vocab_size),
                           "synthetic", cfg.name, "fp32")
    return Engine(loaded, device="cpu", settings=settings)


def test_a_copy_that_does_not_fit_is_refused_in_one_line_before_it_is_made(monkeypatch):
    engine = tiny_engine(Settings())
    need = extra_copy_bytes(engine.cfg, 4, "int8", 32, "cpu")
    monkeypatch.setattr(footprint, "free_bytes", lambda device: need)  # room for the copy, not its temporaries
    with pytest.raises(EngineError) as refused:
        engine.apply(replace(engine.settings, weights="int8"))
    message = str(refused.value)
    assert "\n" not in message and message.startswith("int8 weights need") and "out of memory" in message
    assert "beside the fp32 ones already held" in message
    assert engine.variants.quantised.building is None and engine.variants.quantised.get(("fp32", "int8", 32)) is None
    with pytest.raises(EngineError, match="bf16 weights need"):  # another dtype is a copy too
        engine.apply(replace(engine.settings, dtype="bf16"))
    monkeypatch.setattr(footprint, "free_bytes", lambda device: 100 * need)
    engine.apply(replace(engine.settings, weights="int8"))  # room: the copy is made
    engine.take_settings(wait=True)
    assert engine.settings.weights == "int8"


def test_the_fit_check_counts_the_copy_and_its_temporaries(monkeypatch):
    cfg = config(False)
    need = extra_copy_bytes(cfg, 2, "int4", 32, "cuda")
    largest = max(cfg.vocab_size * cfg.dim, 2 * cfg.ffn_dim * cfg.dim)
    with_temporaries = need + footprint.QUANTISE_TEMPORARY_BYTES_PER_WEIGHT * largest
    assert copy_fit_refusal(cfg, "cuda", "bf16", "int4", 32, 2, free=int(with_temporaries / 0.9) + 1) == ""
    assert copy_fit_refusal(cfg, "cuda", "bf16", "int4", 32, 2, free=int(with_temporaries / 0.9) - 1)
    monkeypatch.setattr(footprint, "free_bytes", lambda device: None)
    assert copy_fit_refusal(cfg, "cuda", "bf16", "int4", 32, 2) == ""  # unknown memory: no refusal
