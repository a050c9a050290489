"""Weight-only quantisation: quantiser round trips, the Q4_1 reproduction, the quantised
linears' CPU path against their one-line references, the bytes they report, the model swap,
switching weights between steps of a streaming reply, and the one-line errors."""
import math
import threading

import pytest
import torch
from hypothesis import given
from hypothesis import settings as hyp_settings
from hypothesis import strategies as st

from engine.engine import Engine
from engine.events import SettingsApplied, TokenEvent
from engine.io.byte_tokenizer import ByteTokenizer
from engine.io.loader import LoadedWeights, synthetic_weights
from engine.metrics import StepMetrics
from engine.model import cpu_step
from engine.model.config import ModelConfig
from engine.model.quality import evaluate, evaluation_ids, evaluation_text, score, weight_quality
from engine.model.quant import (
    HEAD_WEIGHTS,
    Int4Linear,
    Int8Linear,
    QuantisedModels,
    dequantize_int4,
    dequantize_int8,
    quantize_int4,
    quantize_int8,
    quantize_model,
)
from engine.model.transformer import Linear, Transformer
from engine.settings import EngineError, QuantError, SamplingParams, Settings, check_weights, valid_group_sizes
from kernels.int4_pack import pack_int4, unpack_int4
from tests.engine.test_engine import fake_cpu

CFG = ModelConfig(name="tiny", dim=64, n_layers=2, n_heads=4, n_kv_heads=2, ffn_dim=192, vocab_size=256,
                  tied_embeddings=True, max_seq_len=200)
GREEDY = SamplingParams(greedy=True, temperature=0.0)


def tiny_loaded(cfg=CFG, seed=0) -> LoadedWeights:
    w = synthetic_weights(cfg, torch.float32, "cpu", seed=seed)
    w = {k: (v * 20 if "norm" not in k else v) for k, v in w.items()}  # sharper logits: fewer near-ties
    return LoadedWeights(cfg, w, ByteTokenizer(cfg.vocab_size), "synthetic", "tiny", "fp32")


def tiny_engine(**settings) -> Engine:
    s = Settings(dtype="fp32", max_new_tokens=12, sampling=GREEDY, **settings)
    return Engine(tiny_loaded(), device="cpu", hardware=fake_cpu(), settings=s)


# ---- quantisers -------------------------------------------------------------------------------
def test_int8_round_trip_error_is_at_most_half_a_step():
    w = torch.randn(37, 100) * torch.linspace(0.01, 3, 37)[:, None]  # rows of very different ranges
    q, scales = quantize_int8(w)
    assert q.dtype == torch.int8 and q.abs().max() <= 127 and scales.shape == (37,)
    err = (dequantize_int8(q, scales) - w).abs()
    # half a step, plus the clip of the row maximum when its scale rounds down to a bf16 value
    assert (err <= scales[:, None] * (0.5 + 1e-3) + w.abs().amax(1, keepdim=True) * 2 ** -8).all()
    assert torch.equal(scales, scales.bfloat16().float())  # bf16-exact: the CPU kernel takes bf16


@pytest.mark.parametrize("group", [32, 64, 128])
def test_int4_round_trip_error_is_at_most_half_a_step(group):
    w = torch.randn(21, 384) * 0.05
    packed, scales, mins = quantize_int4(w, group)
    assert packed.shape == (21, 192) and scales.shape == mins.shape == (21, 384 // group)
    assert scales.dtype == mins.dtype == torch.float16
    deq = dequantize_int4(packed, scales, mins, group)
    step = scales.float().repeat_interleave(group, 1)
    # half a step, plus what rounding the min to fp16 moves the grid (a code can clamp at 0 or 15)
    slack = mins.float().abs().repeat_interleave(group, 1) * 2 ** -10
    assert ((deq - w).abs() <= step * 0.5 + slack + 1e-7).all()


def test_int4_constant_group_is_exact():
    w = torch.full((16, 64), 0.25)
    packed, scales, mins = quantize_int4(w, 32)
    assert torch.equal(dequantize_int4(packed, scales, mins, 32), w)


@hyp_settings(max_examples=25, deadline=None)
@given(st.integers(1, 9), st.integers(1, 40), st.integers(0, 2 ** 31 - 1))
def test_int4_pack_unpack_exact(n, half_k, seed):
    codes = torch.randint(0, 16, (n, 2 * half_k), generator=torch.Generator().manual_seed(seed), dtype=torch.uint8)
    packed = pack_int4(codes)
    assert packed.shape == (n, half_k) and torch.equal(unpack_int4(packed), codes)
    assert torch.equal(packed & 0xF, codes[:, 0::2])  # low nibble = even k: the kernel relies on it


def test_int4_group32_reproduces_the_default_models_q4_1_blocks():
    """Q4_1 stores, per 32 weights, fp16 d and m and 4-bit codes: w = code * d + m. Quantising the
    dequantised tensor back must give the same d, m and codes."""
    import gguf

    from engine.io.default_model import find_default_model
    path = find_default_model()
    reader = gguf.GGUFReader(str(path))
    tensor = next(t for t in reader.tensors if t.name == "blk.0.attn_q.weight")
    assert tensor.tensor_type.name == "Q4_1"
    raw = torch.from_numpy(tensor.data.copy())  # (rows, blocks * 20) bytes
    blocks = raw.reshape(raw.shape[0], -1, 20)
    d = blocks[..., 0:2].contiguous().view(torch.float16)[..., 0]
    m = blocks[..., 2:4].contiguous().view(torch.float16)[..., 0]
    qs = blocks[..., 4:20]
    codes = torch.cat([qs & 0xF, qs >> 4], dim=-1).reshape(raw.shape[0], -1)  # llama.cpp: low nibbles first
    w = torch.from_numpy(gguf.quants.dequantize(tensor.data, tensor.tensor_type))
    packed, scales, mins = quantize_int4(w, 32)
    assert torch.equal(scales, d) and torch.equal(mins, m)
    assert torch.equal(unpack_int4(packed), codes)
    assert torch.equal(dequantize_int4(packed, scales, mins, 32), w)


# ---- quantised linears on the CPU -------------------------------------------------------------
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=str)
@pytest.mark.parametrize("rows", [1, 3, 17, 40, 300])  # 40, 300: past CPU_PACKED_MAX_ROWS (dequantise + GEMM)
def test_cpu_packed_kernels_match_the_reference_forward(rows, dtype):
    gen = torch.Generator().manual_seed(rows)
    w = torch.randn(56, 128, generator=gen) * 0.05  # 56 rows: int4 pads to 64 for PyTorch's CPU kernel
    x = torch.randn(1, rows, 128, generator=gen).to(dtype)
    for module in (Int8Linear.from_weight(w), Int4Linear.from_weight(w, 32), Int4Linear.from_weight(w, 64)):
        assert module.backend == "cpu"
        got, want = module(x), module.reference(x)
        assert got.shape == (1, rows, 56) and got.dtype == dtype
        # the CPU kernels take bf16 activations (and int4 bf16 scales): a few bf16 roundings
        rel = ((got.float() - want.float()).abs().max() / want.float().abs().max()).item()
        assert rel < 2e-2, f"{type(module).__name__}: {rel:.2e}"


def test_weight_bytes_are_codes_plus_scales_as_stored():
    w = torch.randn(64, 128)
    assert Int8Linear.from_weight(w).weight_bytes == 64 * 128 + 64 * 2  # bf16 scales on the CPU
    # half a byte per weight + a bf16 (scale, zero) pair per group of 32
    assert Int4Linear.from_weight(w, 32).weight_bytes == 64 * 128 // 2 + 64 * (128 // 32) * 2 * 2
    ref = Int4Linear.from_weight(w, 32)
    ref.backend = "reference"  # the GPU layout: packed codes + fp16 scales + fp16 mins
    assert ref.weight_bytes == 64 * 64 + 2 * 64 * 4 * 2


def test_quantize_model_swaps_linears_and_shares_the_rest():
    model = Transformer(CFG, tiny_loaded().weights)
    q = quantize_model(model, "int4", 32)
    assert all(isinstance(m, Int4Linear) for b in q.layers for m in (b.wqkv, b.wo, b.w_gate_up, b.w_down))
    assert type(q.head).__name__ == {"int8": "Int8Linear"}[HEAD_WEIGHTS]
    assert q.embed is model.embed and q.layers[0].attn_norm is model.layers[0].attn_norm
    assert isinstance(model.layers[0].wqkv, Linear) and isinstance(model.head, Linear)  # source untouched
    expected = sum(m.weight_bytes for m in q.modules() if isinstance(m, (Int4Linear, Int8Linear)))
    assert q.linear_weight_bytes() == expected < model.linear_weight_bytes() / 4
    tokens = torch.tensor([[1, 2, 3, 4]])
    assert torch.allclose(q(tokens), model(tokens), atol=0.5 * model(tokens).abs().max().item())


def test_group_sizes_the_model_cannot_take_are_refused_in_one_line():
    cfg = ModelConfig(name="odd", dim=96, n_layers=1, n_heads=4, n_kv_heads=2, ffn_dim=160, vocab_size=64)
    assert valid_group_sizes(cfg) == (32,)
    with pytest.raises(QuantError, match=r"group size 64 does not divide wqkv and w_gate_up \(dim\) = 96 of odd: use group 32"):
        check_weights(cfg, "int4", 64)
    with pytest.raises(QuantError, match="weights must be one of"):
        check_weights(cfg, "int3", 32)
    smollm = ModelConfig.from_name("smollm2-135m")
    assert valid_group_sizes(smollm) == (32, 64)  # 576 inputs: 128 does not divide them
    with pytest.raises(QuantError, match="does not divide"):
        check_weights(smollm, "int4", 128)
    check_weights(ModelConfig.from_name("llama3-8b"), "int4", 128)


# ---- the engine: switching weights while a reply streams ----------------------------------
def test_switch_to_int8_then_int4_between_steps_of_one_reply():
    eng = tiny_engine()
    stream = eng.generate(list(range(1, 20)), max_new_tokens=10, ignore_eos=True)
    seen = []
    for event in stream:
        seen.append(event)
        n_steps = sum(isinstance(e, StepMetrics) for e in seen)
        if isinstance(event, StepMetrics) and n_steps == 3:
            eng.apply(Settings(dtype="fp32", max_new_tokens=12, sampling=GREEDY, weights="int8"))
            eng.variants.quantised.wait(("fp32", "int8", 32))  # make the switch land at the next boundary
        if isinstance(event, StepMetrics) and n_steps == 6:
            eng.apply(Settings(dtype="fp32", max_new_tokens=12, sampling=GREEDY, weights="int4", group_size=32))
            eng.variants.quantised.wait(("fp32", "int4", 32))
    applied = [e for e in seen if isinstance(e, SettingsApplied)]
    assert [a.changes for a in applied] == [("int8",), ("int4 g32",)]
    steps = [e for e in seen if isinstance(e, StepMetrics)]
    assert len(steps) == 10 and sum(isinstance(e, TokenEvent) for e in seen) == 10
    fp_bytes, int8_bytes, int4_bytes = steps[0].weight_bytes, steps[4].weight_bytes, steps[8].weight_bytes
    assert fp_bytes > 3 * int8_bytes and int8_bytes > int4_bytes  # the cost model follows at once
    assert steps[2].settings_label == "fp32 · kv on" and steps[3].settings_label == "fp32 · int8 · kv on"
    assert steps[6].settings_label == "fp32 · int4 g32 · kv on"


@pytest.mark.parametrize("weights", ["int4", "int8"])
def test_a_quantised_cpp_step_is_measured_against_the_roof_of_its_dot_products(weights, monkeypatch):
    """The C++ step multiplies INT4 (and Arm's INT8) as int8 dot products and x86's INT8 as int16
    pairs, at several times the FMA rate: against fp32's roof an int4 batch of 16 read 103% of its
    roofline. Each part at its own peak: the layers', the INT8 head's, attention at fp32."""
    from dataclasses import replace
    from engine.hardware.roof import Roof
    from engine.metrics import cost_of
    from kernels.cpu_decode import INT4, INT8, product_kind
    monkeypatch.setattr(cpu_step, "time_steps", lambda model: (1e-6, 1.0))  # the C++ step, whatever the timing
    hw = replace(fake_cpu(), peak_flops={"fp32": 1e11, "bf16": 1e11, "int8": 4e11, "int16": 2e11})
    eng = Engine(tiny_loaded(), device="cpu", hardware=hw,
                 settings=Settings(dtype="fp32", max_new_tokens=4, sampling=GREEDY, weights=weights))
    if cpu_step.unavailable_reason(eng.context):
        pytest.fail(f"the C++ step must build here: {cpu_step.unavailable_reason(eng.context)}")
    steps = [e for e in eng.generate(list(range(1, 20)), max_new_tokens=4, ignore_eos=True)
             if isinstance(e, StepMetrics)]
    lib = cpu_step.library(eng.context)
    kinds = (product_kind(lib, INT4 if weights == "int4" else INT8), product_kind(lib, INT8))
    assert kinds == (("int8", "int16") if weights == "int4" else ("int16", "int16"))  # x86: AVX-512 or AVX2
    decode = steps[-1]
    assert decode.phase == "decode" and decode.peak_kind == ("int8/int16" if weights == "int4" else "int16") + " dots + fp32"
    assert decode.peak_flops == pytest.approx(Roof.of(hw).step_flops_peak(cost_of(decode), "fp32", kinds))
    assert 1e11 < decode.peak_flops < (4e11 if weights == "int4" else 2e11)  # above fp32's, below the dots'
    with cpu_step.pytorch_only():  # PyTorch's step dequantises and multiplies in fp32: fp32's roof
        plain = [e for e in eng.generate(list(range(1, 20)), max_new_tokens=2, ignore_eos=True)
                 if isinstance(e, StepMetrics)][-1]
    assert plain.peak_flops == 1e11 and plain.peak_kind == "fp32"


def test_the_reply_keeps_streaming_while_weights_are_made_and_switches_when_ready():
    eng = tiny_engine()
    release = threading.Event()
    source = eng.variants.fp

    def slow_source(name):
        release.wait(10)
        return source(name)

    eng.variants.fp = slow_source
    stream = eng.generate(list(range(1, 20)), max_new_tokens=8, ignore_eos=True)
    seen = [next(stream), next(stream)]  # prefill: metrics, token
    eng.apply(Settings(dtype="fp32", max_new_tokens=12, sampling=GREEDY, weights="int8"))
    assert eng.weights_building[0] == "int8"
    for _ in range(4):  # two more steps with fp weights: nothing waits for the quantiser
        seen.append(next(stream))
    # a second switch while int8 is being made: int4 is queued behind it, and is what runs
    eng.apply(Settings(dtype="fp32", max_new_tokens=12, sampling=GREEDY, weights="int4"), request_id=9)
    release.set()
    eng.variants.quantised.wait(("fp32", "int4", 32))
    seen += list(stream)
    applied = [e for e in seen if isinstance(e, SettingsApplied)]
    assert len(applied) == 1 and applied[0].changes == ("int4 g32",) and applied[0].step >= 3
    assert applied[0].request_ids == (9,) and eng.variants.quantised.get(("fp32", "int8", 32)) is not None
    assert eng.weights_building is None and eng.model is eng.model_for(eng.settings)


def test_engine_started_with_int4_and_bad_group_is_refused():
    eng = tiny_engine(weights="int4", group_size=64)
    fp_bytes = eng.model_for(Settings()).linear_weight_bytes()
    assert "int4 g64" in eng.settings.label and eng.model.linear_weight_bytes() < fp_bytes / 6
    with pytest.raises(EngineError, match="group size 128 does not divide"):
        eng.apply(Settings(weights="int4", group_size=128))
    with pytest.raises(EngineError, match="int4 group size must be one of 32, 64, 128"):
        eng.apply(Settings(weights="int4", group_size=48))
    with pytest.raises(EngineError, match="weights must be one of fp, int8, int4"):
        eng.apply(Settings(weights="nf4"))


def test_quantised_models_one_build_at_a_time_others_queued_and_failures_reported():
    models = QuantisedModels()
    gate = threading.Event()
    model = Transformer(CFG, tiny_loaded().weights)

    def slow():
        gate.wait(10)
        return model

    models.start(("fp32", "int8", 32), slow)
    models.start(("fp32", "int8", 32), slow)  # the same copy again: nothing new
    models.start(("fp32", "int4", 32), slow)  # another: queued behind the first
    models.start(("fp32", "int4", 32), slow)
    assert models.building[0] == ("fp32", "int8", 32) and len(models._queue) == 1
    gate.set()
    assert isinstance(models.wait(("fp32", "int4", 32)).layers[0].wqkv, Int4Linear)
    assert isinstance(models.wait(("fp32", "int8", 32)).head, Int8Linear)

    def broken():
        raise MemoryError("out of memory")

    models.start(("bf16", "int4", 32), broken)
    with pytest.raises(QuantError, match="making int4 g32 weights failed: MemoryError: out of memory"):
        models.wait(("bf16", "int4", 32))


# ---- quality ----------------------------------------------------------------------------------
def test_evaluation_text_is_stdlib_prose_and_deterministic():
    text = evaluation_text()
    assert text == evaluation_text() and len(text.split()) > 2000
    assert "argparse" in text.lower()


def test_perplexity_is_the_exponentiated_mean_cross_entropy():
    model = Transformer(CFG, tiny_loaded().weights)
    ids = evaluation_ids(ByteTokenizer(256), 50)
    nll, count, argmax = score(model, ids, window=20)  # windows of 20, 20 and 9 predictions
    assert count == 49 and argmax.shape == (49,)
    manual = 0.0
    for start in (0, 20, 40):
        chunk = torch.tensor([ids[start:start + 21]])
        logits = model(chunk[:, :-1], last_only=False)[0]
        manual += torch.nn.functional.cross_entropy(logits, chunk[0, 1:], reduction="sum").item()
    assert math.isclose(nll, manual, rel_tol=1e-5)
    quality = evaluate({"fp": model, "int8": quantize_model(model, "int8")}, ids, reference="fp", window=20)
    assert quality["fp"].top1_agreement == 1.0 and 0.5 < quality["int8"].top1_agreement <= 1.0


def test_weight_sweep_reports_each_setting_side_by_side():
    from engine.bench.run import format_sweep, run_weight_sweep
    from engine.model.quality import weight_variants

    eng = tiny_engine()
    variants = weight_variants(eng.settings, 32)
    assert list(variants) == ["fp32", "int8", "int4 g32"]
    results, steps, quality, paths = run_weight_sweep(eng, variants, list(range(1, 17)), decode_tokens=4,
                                                      repeats=1, eval_tokens=64, progress=lambda f, m: None)
    table = format_sweep([results[k] for k in variants], quality)
    for row in ("decode tok/s", "speed-up vs fp32", "MBU", "perplexity", "top-1 agreement"):
        assert row in table
    assert "1.00x" in table and "100.0%" in table
    assert results["int4 g32"].decode_bytes_per_token < results["int8"].decode_bytes_per_token \
        < results["fp32"].decode_bytes_per_token
    # each setting's record names the path it ran: its matmul modules, C++ decode steps on a CPU
    assert paths["int8"]["matmul"]["Int8Linear"] == "PyTorch CPU int kernels"
    assert paths["fp32"]["matmul"] == {"Linear": "PyTorch"} and paths["fp32"]["cuda_graphs"] == "not on a GPU"
    assert paths["int4 g32"]["ops"]["decode step"] == {cpu_step.STEP_LABEL: 4}


def test_default_model_quality_int8_within_1_percent_int4_within_10():
    eng = Engine("default", device="cpu", hardware=fake_cpu(), max_context=1024)  # `make test` installs it
    quality = weight_quality(eng, n_tokens=256)  # what the app's quality table calls
    assert list(quality) == ["fp32", "int8", "int4 g32"]
    fp, int8, int4 = quality.values()
    assert int8.perplexity <= 1.01 * fp.perplexity and int4.perplexity <= 1.10 * fp.perplexity
    assert int8.top1_agreement > 0.9 and int4.top1_agreement > 0.85


def test_engine_and_kernels_import_without_triton():
    import subprocess
    import sys
    code = (
        "import sys; sys.modules['triton'] = None\n"  # `import triton` now raises ImportError
        "import torch, engine.engine, engine.model.quant\n"
        "from kernels.int8_matmul import int8_matmul, reference_int8_matmul\n"
        "q = torch.ones(4, 8, dtype=torch.int8); s = torch.ones(4); x = torch.ones(1, 8)\n"
        "assert reference_int8_matmul(x, q, s).sum() == 32\n"
        "try:\n    int8_matmul(x, q, s)\nexcept RuntimeError as e:\n    print(e)\n")
    from pathlib import Path
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120,
                         cwd=Path(__file__).resolve().parents[2])
    assert out.returncode == 0, out.stderr
    assert "triton is not installed" in out.stdout


def test_a_path_that_dequantises_counts_the_copy_it_writes_and_reads():
    """Prefill-sized steps on a CPU dequantise (past CPU_PACKED_MAX_ROWS): the cost model's weight
    bytes then carry the copy too, by the bytes per weight quant.py lists; decode steps do not."""
    from engine.metrics import DEQUANTISED_COPY_BYTES
    from engine.model.quant import CPU_PACKED_MAX_ROWS
    w = torch.randn(96, 64)
    int8, int4 = Int8Linear.from_weight(w), Int4Linear.from_weight(w, 32)
    for layer, kind in ((int8, "int8"), (int4, "int4")):
        rows = CPU_PACKED_MAX_ROWS[kind]
        assert layer.bytes_read(1) == layer.bytes_read(rows) == layer.weight_bytes
        assert layer.bytes_read(rows + 1) == layer.weight_bytes + DEQUANTISED_COPY_BYTES[kind, "cpu"] * w.numel()
    model = quantize_model(Transformer(CFG, tiny_loaded().weights), "int8")
    layers = [m for m in model.modules() if isinstance(m, Int8Linear) and m is not model.head]
    head = model.head.weight_bytes
    assert model.linear_weight_bytes(1) == head + sum(m.weight_bytes for m in layers)
    # 64 rows through the layers (dequantised), one through the head (packed)
    assert model.linear_weight_bytes(64) == head + sum(m.weight_bytes + 4 * m.q.numel() for m in layers)
    assert model.linear_weight_bytes(64, head_rows=0) == model.linear_weight_bytes(64) - head
    eng = tiny_engine(weights="int8")
    # 99 rows: past what the C++ step takes in one call (engine/model/cpu_step.py), so PyTorch's path, the copy
    steps = [e for e in eng.generate(list(range(1, 100)), max_new_tokens=2) if isinstance(e, StepMetrics)]
    assert steps[0].phase == "prefill" and steps[0].weight_bytes > steps[1].weight_bytes
