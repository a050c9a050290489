"""The hardware table's bytes are the cost model's (engine/metrics.py): what a batch-1 decode step
reads at each weights format, as the engine stores it, counted from the shape alone
(`decode_weight_bytes`) equals what the engine's own modules say they read
(Transformer.linear_weight_bytes, through step_cost) -- for small awkward shapes on both devices'
layouts, and for the default model on a CPU, the row the app's table shows first."""
import pytest
import torch

import engine.model.quant as quant
from engine.hardware import ceilings
from engine.hardware.ceilings import FORMATS, GROUP_SIZE, Chip, decode_ceiling, model_size
from engine.io.default_model import find_default_model
from engine.io.gguf_file import read_gguf_metadata
from engine.io.loader import synthetic_weights
from engine.metrics import decode_weight_bytes, step_cost
from engine.model.config import ModelConfig
from engine.model.quant import quantize_model
from engine.model.transformer import Transformer

DTYPES = {4: torch.float32, 2: torch.bfloat16}


def engine_bytes(model: Transformer, cfg: ModelConfig, elem_bytes: int) -> int:
    """What the engine charges a batch-1 decode step for its weights (engine/steps/plain.py)."""
    return step_cost(cfg, batch_size=1, new_tokens=1, context_len=8, weight_bytes=model.linear_weight_bytes(),
                     kv_elem_bytes=elem_bytes, act_elem_bytes=elem_bytes).weight_bytes


def made(cfg: ModelConfig, fmt: str) -> Transformer:
    weights, elem_bytes = FORMATS[fmt]
    model = Transformer(cfg, synthetic_weights(cfg, DTYPES[elem_bytes], "cpu"))
    return model if weights == "fp" else quantize_model(model, weights, GROUP_SIZE)


@pytest.mark.parametrize("tied", [True, False])
@pytest.mark.parametrize("device", ["cpu", "cuda"])
def test_the_bytes_from_the_shape_are_the_bytes_the_modules_read(monkeypatch, tied, device):
    if device == "cuda":  # the GPU's layout, built from CPU tensors (what a layer reads, not how it runs)
        monkeypatch.setattr(quant, "_backend", lambda d: "triton")
    # rows not a multiple of 16 (q/k/v 96 + 2 x 12, a 1000-word vocabulary): a CPU's INT4 pads them
    cfg = ModelConfig(name="t", dim=96, n_layers=2, n_heads=8, n_kv_heads=1, ffn_dim=224, vocab_size=1000,
                      tied_embeddings=tied, max_seq_len=64)
    for fmt, (weights, elem_bytes) in FORMATS.items():
        if fmt == "fp16" and device == "cpu":
            continue  # (the engine runs no fp16 on a CPU; its bytes are bf16's)
        model = made(cfg, fmt)
        assert decode_weight_bytes(cfg, elem_bytes, weights, GROUP_SIZE, device) == engine_bytes(model, cfg, elem_bytes), \
            (fmt, device)


def test_the_default_model_s_row_is_what_the_engine_reads_on_this_cpu():
    cfg = ModelConfig.from_gguf_metadata(read_gguf_metadata(find_default_model()))
    size = model_size(cfg)
    cpu = Chip("this CPU", 20.0, 24 * 2**30, "measured", device="cpu")
    for fmt in ("fp32", "bf16", "int8", "int4"):
        weights, elem_bytes = FORMATS[fmt]
        cell = decode_ceiling(size, cpu, fmt)
        assert cell.weight_bytes_per_token == engine_bytes(made(cfg, fmt), cfg, elem_bytes), fmt
        assert cell.tokens_per_s == pytest.approx(20e9 / cell.weight_bytes_per_token)
    # by hand: INT4's layers at half a byte a weight plus an fp16 scale and min a group of 32 (0.625 a
    # weight), the 49152 x 576 head at INT8 (a byte a weight): not the 0.516 a weight of one scale a
    # group of 128
    int4 = decode_ceiling(size, cpu, "int4").weight_bytes_per_token
    layers = cfg.n_layers * cfg.layer_linear_params
    assert int4 == pytest.approx(0.625 * layers + 49152 * 576 + 49152 * 2, rel=0.01)
    assert int4 / size.read_params > 0.7


def test_the_table_s_gpu_columns_count_the_gpu_s_layout():
    cfg = ModelConfig.from_name("llama3-8b")
    size = model_size(cfg)
    h100 = ceilings.gpu_chip("H100 SXM")
    int4, bf16 = decode_ceiling(size, h100, "int4"), decode_ceiling(size, h100, "bf16")
    assert int4.weight_bytes_per_token == decode_weight_bytes(cfg, 2, "int4", GROUP_SIZE, "cuda")
    assert int4.stored_bytes > 0.3 * bf16.stored_bytes  # the bf16 embedding table stays beside the codes
