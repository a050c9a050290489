"""M token rows in one C++ step (engine/model/cpu_step.py sequence_step and plan_step): a speculative
verify step's k + 1 rows give exactly the bits of k + 1 one-token steps (contiguous and paged), the
rows of a batch of sequences exactly each sequence's own steps, and both hold to PyTorch's path, at
every vector level this machine runs and for every weight format; and the engine routes batched,
verify and paged steps to it (PyTorch's path stays the reference)."""
import pytest
import torch

from engine import dispatch
from engine.context import default_context, reset_default_context
from engine.kv.cache import ContiguousKVCache, PagedKVCache
from engine.model import cpu_step
from engine.serving.batch_forward import forward_plan
from engine.serving.scheduler import Request, Scheduler
from kernels import cpu_decode
from tests.kernels.test_cpu_decode import (GQA, LEVELS, QWEN, bf16_bound, int4_rounding, model_of, reference_of,
                                           relative_error, step_tolerance)

FORMATS = [("fp32", "fp"), ("fp32", "int8"), ("fp32", "int4"), ("bf16", "fp"), ("bf16", "int4")]


def new_cache(cfg, dtype, layout: str, num_blocks: int = 16):
    if layout == "paged":
        return PagedKVCache(cfg, num_blocks=num_blocks, block_size=4, dtype=dtype, device="cpu")
    return ContiguousKVCache(cfg, 1, cfg.max_seq_len, dtype, "cpu")


@torch.inference_mode()
@pytest.mark.parametrize("isa", LEVELS)
@pytest.mark.parametrize("layout", ["contiguous", "paged"])
@pytest.mark.parametrize("dtype,weights", FORMATS)
def test_a_verify_steps_rows_are_the_one_token_steps_bits(isa, layout, dtype, weights, monkeypatch):
    """Five new rows of one sequence (a draft of four and the token before it), causal among
    themselves, against five one-token steps: the same logits bit for bit, and the same K/V."""
    monkeypatch.setenv(cpu_decode.ISA_VARIABLE, isa)
    reset_default_context()  # (its options read the level now)
    model = model_of(QWEN, dtype, weights)
    prompt, new = [3, 17, 40, 2, 99, 150, 7], [11, 23, 5, 180, 64]
    one, many = new_cache(QWEN, model.dtype, layout), new_cache(QWEN, model.dtype, layout)
    for cache in (one, many):
        model(torch.tensor([prompt]), 0, cache)
    singles = torch.cat([model(torch.tensor([[t]]), len(prompt) + i, one)[0] for i, t in enumerate(new)])
    before = dispatch.counts()
    rows = model(torch.tensor([new]), len(prompt), many, logits_rows=len(new))[0]
    assert dispatch.since(before)["multi-row step"] == {cpu_step.ROWS_LABEL: 1}
    assert torch.equal(rows, singles), f"{cpu_decode.load(isa).isa}: {(rows - singles).abs().max():.2e}"
    assert torch.equal(one.k, many.k) and torch.equal(one.v, many.v)
    # and PyTorch's multi-row step of the same weights (dequantise, then matmul), the reference, agrees
    default_context().kernels.disable("cpu_step", "the reference")
    ref_model = reference_of(model, int4_rounding(isa))
    ref = new_cache(QWEN, model.dtype, layout)
    ref_model(torch.tensor([prompt]), 0, ref)
    want = ref_model(torch.tensor([new]), len(prompt), ref, logits_rows=len(new))[0]
    assert relative_error(rows, want) < (bf16_bound(isa, weights, 1e-1) if dtype == "bf16" else step_tolerance(isa, dtype, weights))


def schedule_all(model, prompts, block_size=4, num_blocks=48):
    cache = PagedKVCache(model.cfg, num_blocks=num_blocks, block_size=block_size, dtype=model.dtype, device="cpu")
    sched = Scheduler(cache.manager, max_batch_size=8, token_budget=64)
    for i, p in enumerate(prompts):
        sched.add_request(Request(i, p, 6))
    return cache, sched


@torch.inference_mode()
@pytest.mark.parametrize("isa", LEVELS)
@pytest.mark.parametrize("dtype,weights", FORMATS)
def test_a_batch_of_sequences_in_one_step_gives_each_its_own_steps_bits(isa, dtype, weights, monkeypatch):
    """Four sequences of ragged lengths, prefilled and decoded together through the scheduler's plans
    (one C++ step each, blocks scattered in the pool): each request's logits are the bits of its
    own one-sequence steps, and PyTorch's batched forward agrees to rounding."""
    monkeypatch.setenv(cpu_decode.ISA_VARIABLE, isa)
    reset_default_context()  # (its options read the level now)
    model = model_of(GQA, dtype, weights)
    gen = torch.Generator().manual_seed(1)
    prompts = [torch.randint(1, GQA.vocab_size, (n,), generator=gen).tolist() for n in (5, 11, 2, 8)]

    def run_batched(use_cpp: bool):
        run_model = model
        if not use_cpp:
            default_context().kernels.disable("cpu_step", "the reference")
            run_model = reference_of(model, int4_rounding(isa))
        cache, sched = schedule_all(run_model, prompts)
        got = {i: [] for i in range(len(prompts))}
        routed = 0
        while sched.has_unfinished:
            plan = sched.schedule()
            before = dispatch.counts()
            ids, out = forward_plan(run_model, cache, plan.seqs)
            routed += dispatch.since(before).get("batched step", {}).get(cpu_step.ROWS_LABEL, 0)
            for rid, row in zip(ids, out):
                got[rid].append(row)
            sched.update_from_output(plan, {rid: int(row.argmax()) for rid, row in zip(ids, out)})
        default_context().kernels.reset()
        return got, routed

    got, routed = run_batched(True)
    assert routed > 0
    for i, prompt in enumerate(prompts):  # each alone: its prompt in one step, then one token a step
        cache = PagedKVCache(GQA, num_blocks=16, block_size=4, dtype=model.dtype, device="cpu")
        logits = model(torch.tensor([prompt]), 0, cache)[0, -1]
        alone = []
        for _ in range(len(got[i])):
            alone.append(logits)
            logits = model(torch.tensor([[int(logits.argmax())]]), cache.length, cache)[0, -1]
        assert torch.equal(torch.stack(got[i]), torch.stack(alone)), f"request {i}"
    want, _ = run_batched(False)
    for i in got:  # up to the first token the two paths pick differently (bf16's near-ties), if any
        n = next((j + 1 for j, (g, w) in enumerate(zip(got[i], want[i])) if g.argmax() != w.argmax()),
                 min(len(got[i]), len(want[i])))
        assert relative_error(torch.stack(got[i][:n]), torch.stack(want[i][:n])) < \
            (bf16_bound(isa, weights, 1e-1) if dtype == "bf16" else step_tolerance(isa, dtype, weights))


@torch.inference_mode()
@pytest.mark.parametrize("layout", ["contiguous", "paged"])
@pytest.mark.parametrize("dtype,weights", [("fp32", "fp"), ("fp32", "int4"), ("bf16", "int8")])
def test_a_prompt_longer_than_the_rows_runs_in_chunks_each_a_call_of_its_own(layout, dtype, weights, monkeypatch):
    """Where the chunks win the timing, a prompt of more rows than one C++ call takes runs as calls of
    that many rows in order: its logits and K/V the bits of those calls made one by one, the calls'
    rows told to the cost model, and PyTorch's step over the whole prompt agrees to rounding."""
    isa = LEVELS[0]
    monkeypatch.setenv(cpu_decode.ISA_VARIABLE, isa)
    reset_default_context()  # (its options read the level now)
    monkeypatch.setattr(cpu_step, "time_prompts", lambda model: (1e-6, 1.0))  # the chunks win
    cfg = GQA.with_max_seq_len(200)
    model = model_of(cfg, dtype, weights)
    rows = cpu_step.library(model.context).max_rows
    prompt = torch.randint(1, cfg.vocab_size, (1, 2 * rows + 5), generator=torch.Generator().manual_seed(3))
    whole, parts = new_cache(cfg, model.dtype, layout, 48), new_cache(cfg, model.dtype, layout, 48)
    before = dispatch.counts()
    got = model(prompt, 0, whole, last_only=False)[0]
    assert dispatch.since(before)["multi-row step"] == {cpu_step.CHUNKS_LABEL: 1}
    assert cpu_step.ran_in_cpp(model) and cpu_step.chunks(model) == (rows, rows, 5)
    assert f"prompts over {rows} tokens in chunks of {rows}: {cpu_step.format_label(model)} 1000000.0x (to " \
        f"{cpu_step.PROMPT_CONTEXT_WIDE:,})" in cpu_step.path_line(model)
    want = torch.cat([model(prompt[:, lo:lo + rows], lo, parts, last_only=False)[0]
                      for lo in range(0, 2 * rows + 5, rows)])
    assert cpu_step.chunks(model) == ()  # (each of those one call)
    assert torch.equal(got, want) and torch.equal(whole.k, parts.k) and torch.equal(whole.v, parts.v)
    last = model(prompt[:, -3:], 2 * rows + 2, parts, logits_rows=2)[0]  # (and a call's last rows only)
    assert torch.equal(last, got[-2:])
    default_context().kernels.disable("cpu_step", "the reference")
    ref_model = reference_of(model, int4_rounding(isa))
    want = ref_model(prompt, 0, new_cache(cfg, model.dtype, layout, 48), last_only=False)[0]
    default_context().kernels.reset()
    assert relative_error(got, want) < (bf16_bound(isa, weights, 1e-1) if dtype == "bf16" else
                                        step_tolerance(isa, dtype, weights))


@torch.inference_mode()
def test_a_prompt_past_the_chunks_context_or_timed_slower_runs_in_pytorch(monkeypatch):
    cfg = GQA.with_max_seq_len(200)
    model = model_of(cfg, "fp32", "int4")
    rows = cpu_step.library(model.context).max_rows
    monkeypatch.setattr(cpu_step, "time_prompts", lambda model: (1.0, 1.5))  # the chunks win the timing ...
    monkeypatch.setattr(cpu_step, "PROMPT_CONTEXT", rows + 8)
    monkeypatch.setattr(cpu_step, "PROMPT_CONTEXT_WIDE", rows + 20)  # (where they win by 2x or more)
    cache = ContiguousKVCache(cfg, 1, cfg.max_seq_len, torch.float32, "cpu")
    model(torch.randint(1, 200, (1, rows + 8)), 0, cache)
    assert cpu_step.chunks(model) == (rows, 8)
    model(torch.randint(1, 200, (1, rows + 9)), 0, cache)  # ... within the context they were timed for only
    assert not cpu_step.ran_in_cpp(model) and cache.length == rows + 9
    default_context().cpu_step.timings.clear()
    default_context().cpu_step.model_timing.clear()
    monkeypatch.setattr(cpu_step, "time_prompts", lambda model: (1.0, 2.0))  # won by 2x: the wider context
    model(torch.randint(1, 200, (1, rows + 20)), 0, cache)
    assert cpu_step.chunks(model) == (rows, 20)
    model(torch.randint(1, 200, (1, rows + 21)), 0, cache)
    assert not cpu_step.ran_in_cpp(model)
    default_context().cpu_step.timings.clear()
    default_context().cpu_step.model_timing.clear()
    monkeypatch.setattr(cpu_step, "time_prompts", lambda model: (1.0, 1e-6))  # PyTorch's step wins
    model(torch.randint(1, 200, (1, rows + 8)), 0, cache)
    assert not cpu_step.ran_in_cpp(model) and cpu_step.chunks(model) == ()


def test_the_prompt_timing_stops_once_one_path_is_clearly_faster(monkeypatch):
    """A path PROMPT_CLEAR times faster after one timed round decides it: no more rounds (at AVX2
    PyTorch's bf16 prompt takes ~4x the chunks' time, and the load waited for three of them)."""
    import time
    model = model_of(GQA.with_max_seq_len(200), "fp32", "fp")
    calls = []

    def chunks(plan, ids, start, n, attention, table=None):
        calls.append(len(ids))
        return None, []

    monkeypatch.setattr(cpu_step, "_in_chunks", chunks)  # (the C++ chunks at no time at all)
    cpp_s, pytorch_s = cpu_step.time_prompts(model)
    assert pytorch_s / cpp_s >= cpu_step.PROMPT_CLEAR and len(calls) == 2  # one to warm up, one timed
    monkeypatch.setattr(cpu_step, "_in_chunks", lambda *a, **k: calls.append(0) or time.sleep(pytorch_s) or (None, []))
    calls.clear()
    cpu_step.time_prompts(model)  # (close: every round)
    assert len(calls) == cpu_step.PROMPT_TIMED + 1


@torch.inference_mode()
def test_steps_past_the_rows_the_cpp_step_takes_run_in_pytorch(monkeypatch):
    monkeypatch.setattr(cpu_step, "time_prompts", lambda model: (1.0, 1e-6))  # PyTorch's step wins prompts
    cfg = GQA.with_max_seq_len(160)
    model = model_of(cfg, "fp32", "fp")
    cache = ContiguousKVCache(cfg, 1, cfg.max_seq_len, torch.float32, "cpu")
    rows = cpu_step.library(model.context).max_rows
    before = dispatch.counts()
    model(torch.randint(1, 200, (1, rows + 1)), 0, cache)  # a long prompt: PyTorch's prefill
    assert "multi-row step" not in dispatch.since(before) and cache.length == rows + 1
    assert not cpu_step.ran_in_cpp(model)
    model(torch.randint(1, 200, (1, 3)), rows + 1, cache)
    assert cpu_step.ran_in_cpp(model) and cache.length == rows + 4


def test_a_batched_step_in_cpp_counts_each_weight_once():
    """The cost model: a C++ step of 40 INT8 rows reads each weight once as stored (PyTorch's path for
    that many rows would write and read a dequantised copy, and counts it)."""
    from engine.serving.batch_forward import BatchRunner
    model = model_of(GQA, "fp32", "int8")
    runner = BatchRunner(model, num_blocks=64, block_size=4, max_batch_size=8, token_budget=64)
    runner.scheduler.add_request(Request(0, list(range(1, 41)), 2))
    before = dispatch.counts()
    _, _, metrics = runner.step()
    assert dispatch.since(before)["batched step"] == {cpu_step.ROWS_LABEL: 1}
    assert metrics.copy_bytes == 0 and metrics.weight_bytes == model.linear_weight_bytes(rows=1, head_rows=1) + \
        2 * GQA.n_layers * GQA.dim * 4 + GQA.dim * 4  # (and the norms, once)


@torch.inference_mode()
def test_the_path_line_names_the_step_that_ran_a_batchs_decode_rows():
    """`bench --sweep batch`'s path line (engine/bench/single.py path_line) says which step ran the
    batch's decode rows and their attention: the C++ step's plans count as its (they read "decode steps
    (their path not recorded); decode attention torch SDPA" before), PyTorch's batched forward as its own."""
    from engine.bench.single import path_line
    from engine.serving.batch_forward import PYTORCH_ROWS_LABEL
    model = model_of(GQA, "fp32", "fp")

    def ops_of_a_batch(use_cpp: bool) -> dict:
        if not use_cpp:
            default_context().kernels.disable("cpu_step", "the reference")
        cache, sched = schedule_all(model, [[1, 2, 3], [4, 5, 6, 7]])
        before = dispatch.counts()
        while sched.has_unfinished:
            plan = sched.schedule()
            ids, out = forward_plan(model, cache, plan.seqs)
            sched.update_from_output(plan, {rid: int(row.argmax()) for rid, row in zip(ids, out)})
        default_context().kernels.reset()
        return dispatch.since(before)

    ops = ops_of_a_batch(True)
    steps = ops["decode step"][cpu_step.ROWS_LABEL]
    assert ops["decode step"] == {cpu_step.ROWS_LABEL: steps} and steps == 5  # 6 tokens each: 1 from the prefill
    assert ops["attention decode"] == {"C++ CPU step": steps * GQA.n_layers}
    line = path_line({"cuda_graphs": "off", "ops": ops})
    assert f"decode steps {steps} {cpu_step.ROWS_LABEL}; decode attention C++ CPU step;" in line and "SDPA" not in line
    ops = ops_of_a_batch(False)
    assert ops["decode step"] == {PYTORCH_ROWS_LABEL: 5} and "C++ CPU step" not in ops["attention decode"]
    assert f"decode steps 5 {PYTORCH_ROWS_LABEL}; decode attention torch SDPA" in path_line({"cuda_graphs": "off", "ops": ops})


@torch.inference_mode()
def test_a_paged_cache_switched_to_another_precision_and_back_is_the_one_the_step_writes():
    """The chat's paged cache changes precision in place (a dtype switch keeps the conversation): fp32,
    then a bf16 step, then fp32 again. The fp32 model's C++ step must read and write the cache's new
    K/V, not the ones it was planned over before the switch (kept alive, they held the context as it
    was then); and a plan keeps no cache's K/V alive."""
    import gc
    import weakref

    fp32, bf16 = model_of(QWEN, "fp32", "fp"), model_of(QWEN, "bf16", "fp")
    prompt, (a, b, c) = [3, 17, 40, 2, 99, 150, 7], (11, 23, 5)

    def run(use_cpp: bool):
        if not use_cpp:
            default_context().kernels.disable("cpu_step", "the reference")
        cache = PagedKVCache(QWEN, num_blocks=16, block_size=4, dtype=torch.float32, device="cpu")
        routed = 0
        fp32(torch.tensor([prompt]), 0, cache)
        fp32(torch.tensor([[a]]), len(prompt), cache)
        routed += cpu_step.ran_in_cpp(fp32)
        first_k = weakref.ref(cache.k)
        cache.astype(torch.bfloat16)
        bf16(torch.tensor([[b]]), len(prompt) + 1, cache)
        routed += cpu_step.ran_in_cpp(bf16)
        cache.astype(torch.float32)
        logits = fp32(torch.tensor([[c]]), len(prompt) + 2, cache)[0, -1]
        routed += cpu_step.ran_in_cpp(fp32)
        default_context().kernels.reset()
        gc.collect()
        return logits, cache, routed, first_k() is None

    got, cache, routed, freed = run(True)
    assert routed == 3  # each of the three one-token steps ran in C++
    want, ref, _, _ = run(False)
    assert relative_error(cache.k, ref.k) < 1e-2 and relative_error(cache.v, ref.v) < 1e-2
    assert relative_error(got, want) < 1e-2
    assert freed  # the fp32 K/V before the switch went with it
