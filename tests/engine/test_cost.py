"""The cost model (engine/metrics.py) against hand counts of what each implementation moves: naive
attention's passes over its score matrix per backend (eager, captured), a graph bucket's padding,
the K/V a batched paged step copies out of the pool, and the round figures a verify step carries.
Each of these was under-counted before: 2 passes charged for naive attention's 4-6, no gathered copy,
a bucket's attention FLOPs charged for the live length only."""
from __future__ import annotations

import pytest
import torch
from test_engine import CFG

from engine.context import EngineContext
from engine.io.loader import synthetic_weights
from engine.kv.cache import PagedKVCache
from engine.metrics import KVCopy, StepCost, StepMetrics, naive_score_passes, plan_cost, step_cost
from engine.model.config import ModelConfig
from engine.model.transformer import Transformer
from engine.options import EngineOptions
from engine.serving import batch_forward
from engine.serving.batch_forward import forward_plan
from engine.serving.scheduler import ScheduledSeq

LLAMA = ModelConfig.from_name("llama3-8b")  # 32 layers, 32 heads, 8 KV heads of 128, q_dim 4096
BF16 = dict(kv_elem_bytes=2, act_elem_bytes=2, weight_bytes=10**9)


def test_naive_decode_is_charged_four_passes_over_its_scores_eagerly():
    # one query a row, every row all its keys: no mask. QK writes the scores, softmax reads them and
    # writes the probabilities, PV reads those: 4 passes of (B=2, 32 heads, 1, 1000) bf16, 32 layers
    naive = step_cost(LLAMA, attention="naive", batch_size=2, new_tokens=1, context_len=999, **BF16)
    flash = step_cost(LLAMA, attention="flash", batch_size=2, new_tokens=1, context_len=999, **BF16)
    assert naive.attention_bytes == 32 * 4 * (2 * 32 * 1 * 1000) * 2
    assert flash.attention_bytes == 0 and naive.total_bytes - flash.total_bytes == naive.attention_bytes


def test_the_cpp_steps_naive_attention_is_charged_its_causal_fp32_scores_four_times():
    # kernels/cpu_decode.cpp attend_naive: each row's scores over its own keys (C + i + 1, no masked half,
    # no mask), fp32 whatever the activations, written, softmaxed in place (read, written), read by PV
    T, C = 5, 995  # a verify step's rows of one sequence
    cpp = step_cost(LLAMA, attention="naive", batch_size=1, new_tokens=T, context_len=C, cpp_step=True, **BF16)
    torch_step = step_cost(LLAMA, attention="naive", batch_size=1, new_tokens=T, context_len=C, **BF16)
    flash = step_cost(LLAMA, attention="flash", batch_size=1, new_tokens=T, context_len=C, cpp_step=True, **BF16)
    keys = 32 * (T * C + T * (T + 1) // 2)
    assert cpp.attention_bytes == 4 * 32 * keys * 4
    assert cpp.attention_flops == flash.attention_flops == 4 * 4096 * keys
    assert torch_step.attention_bytes == 32 * (6 * 32 * T * (C + T) * 2 + 2 * T * (C + T))
    decode = step_cost(LLAMA, attention="naive", batch_size=2, new_tokens=1, context_len=999, cpp_step=True, **BF16)
    assert decode.attention_bytes == 32 * 4 * (2 * 32 * 1 * 1000) * 4  # the eager decode's count, in fp32


def test_naive_prefill_is_charged_six_passes_and_its_mask():
    # a prompt is masked in place (read and written: 2 more passes) and the bool mask (1, T, S) is
    # built and read once a layer; naive computes the masked half too, flash skips it
    T = 4096
    naive = step_cost(LLAMA, attention="naive", batch_size=1, new_tokens=T, context_len=0, **BF16)
    flash = step_cost(LLAMA, attention="flash", batch_size=1, new_tokens=T, context_len=0, **BF16)
    assert naive.attention_bytes == 32 * (6 * 32 * T * T * 2 + 2 * T * T)
    assert naive.attention_flops == 32 * 4 * 4096 * T * T
    assert flash.attention_flops == 32 * 4 * 4096 * (T * (T + 1) // 2)
    off = step_cost(LLAMA, attention="naive", kv_cache=False, batch_size=1, new_tokens=100, context_len=0,
                    weight_bytes=0, kv_elem_bytes=2, act_elem_bytes=4)  # no cache: the whole context, fp32
    assert off.attention_bytes == 32 * (6 * 32 * 100 * 100 * 4 + 2 * 100 * 100)
    assert naive_score_passes(masked=True) == 6 and naive_score_passes(masked=False) == 4


def test_a_graph_bucket_is_charged_for_all_of_it():
    # a captured step reads and computes attention over its bucket (the tail masked), not the live keys
    common = dict(batch_size=1, new_tokens=1, context_len=100, **BF16)
    eager = step_cost(LLAMA, **common)
    bucket = step_cost(LLAMA, kv_read_tokens=1024, captured=True, **common)
    assert eager.attention_flops == 32 * 4 * 4096 * 101
    assert bucket.attention_flops == 32 * 4 * 4096 * 1024  # charged 101 positions' FLOPs before
    assert bucket.kv_read_bytes == 1024 * LLAMA.kv_bytes_per_token_per_elem * 2
    # naive in a captured step: the compiler folds the mask into the softmax (4 passes, no mask in memory)
    naive = step_cost(LLAMA, attention="naive", kv_read_tokens=1024, captured=True, **common)
    assert naive.attention_bytes == 32 * 4 * 32 * 1024 * 2
    eager_bucket = step_cost(LLAMA, attention="naive", kv_read_tokens=1024, **common)  # an eager bucket: masked
    assert eager_bucket.attention_bytes == 32 * (6 * 32 * 1024 * 2 + 2 * 1024)


@pytest.fixture(scope="module")
def tiny():
    """PyTorch's batched path (the C++ step, which copies nothing, off: its charge has its own test)."""
    return Transformer(CFG, synthetic_weights(CFG, torch.float32, "cpu", seed=1),
                       EngineContext(EngineOptions(cpu_step=False)))


def decode_rows() -> list[ScheduledSeq]:
    # three decode rows at positions 10, 20 and 35 (11, 21 and 36 keys with their own), blocks of 16
    return [ScheduledSeq(1, (5,), 10, (0,), True), ScheduledSeq(2, (6,), 20, (1, 2), True),
            ScheduledSeq(3, (7,), 35, (3, 4, 5), True)]


def test_batched_decode_rows_gathered_on_a_cpu_are_charged_their_padded_copy(tiny, monkeypatch):
    monkeypatch.setattr(batch_forward, "CPU_GATHER_DECODE_KEYS", True)
    cache = PagedKVCache(CFG, num_blocks=8, block_size=16, dtype=torch.float32, device="cpu")
    moved: dict = {}
    forward_plan(tiny, cache, decode_rows(), "naive", moved)
    # whole blocks of the longest row (36 keys: 3 blocks) for each of 3 rows: 144 positions read from
    # the pool (79 beyond the 65 live ones the KV read counts), 144 written, 3 x 36 read back
    assert moved == {"kv_copy": KVCopy(read=79, written=144, read_back=108), "decode_width": 36}
    cost = plan_cost(CFG, decode_rows(), weight_bytes=0, elem_bytes=4, attention="naive", block_size=16, **moved)
    per_position = 2 * CFG.n_layers * CFG.n_kv_heads * CFG.head_dim * 4  # K and V, both layers, fp32
    assert cost.copy_bytes == (79 + 144 + 108) * per_position
    # naive over the padded width, rows of different lengths: masked (6 passes) and a (3, 1, 36) mask
    assert cost.attention_bytes == CFG.n_layers * (6 * 3 * CFG.n_heads * 36 * 4 + 2 * 3 * 36)
    assert cost.attention_flops == CFG.n_layers * 3 * 4 * CFG.q_dim * 36


def test_decode_rows_read_in_place_copy_nothing(tiny, monkeypatch):
    # a GPU's paged kernel reads the block tables in place (taken here with the gather off and the kernel on)
    monkeypatch.setattr(batch_forward, "CPU_GATHER_DECODE_KEYS", False)
    monkeypatch.setattr(batch_forward, "paged_kernel_enabled", lambda context=None: True)
    cache = PagedKVCache(CFG, num_blocks=8, block_size=16, dtype=torch.float32, device="cpu")
    moved: dict = {}
    forward_plan(tiny, cache, decode_rows(), "flash", moved)
    assert moved["kv_copy"].written == 3 * 36 + (11 + 21 + 36)  # on a CPU PagedKV.dense() still copies
    fake_cuda = type("Device", (), {"type": "cuda"})()
    assert batch_forward._kv_moved(decode_rows(), [], None, batch_forward._layout(decode_rows(), 16), "flash",
                                   fake_cuda, 16, True) == {"kv_copy": KVCopy(), "decode_width": None}
    assert batch_forward._kv_moved(decode_rows(), [], None, batch_forward._layout(decode_rows(), 16), "flash",
                                   fake_cuda, 16, False)["kv_copy"].written == 3 * 36 + (11 + 21 + 36)


def test_the_paged_kernel_is_asked_of_the_engines_own_switches(monkeypatch):
    # (the first GPU run failed here: every batched step on a GPU raised AttributeError)
    from engine.model import attention
    monkeypatch.setattr(attention, "_kernels_available", lambda: True)
    context = EngineContext()
    assert batch_forward.paged_kernel_enabled(context) and batch_forward.paged_kernel_enabled()
    context.kernels.disable("paged", "failed its check")
    assert not batch_forward.paged_kernel_enabled(context) and batch_forward.paged_kernel_enabled()


def test_a_batch_runners_steps_carry_their_copies(tiny, monkeypatch):
    from engine.serving.scheduler import Request
    monkeypatch.setattr(batch_forward, "CPU_GATHER_DECODE_KEYS", True)
    runner = batch_forward.BatchRunner(tiny, num_blocks=32, block_size=4, max_batch_size=4, token_budget=64)
    runner.scheduler.add_request(Request(1, [3, 4, 5], 4))
    runner.scheduler.add_request(Request(2, [3, 4, 5, 6, 7, 8, 9], 4))
    steps = [runner.step()[2] for _ in range(3)]
    assert [s.phase for s in steps] == ["prefill", "decode", "decode"]
    assert all(s.copy_bytes > 0 and s.total_bytes > s.weight_bytes + s.kv_bytes + s.other_bytes for s in steps[1:])


def test_a_verify_step_carries_its_rounds_draft():
    common = dict(batch_size=1, new_tokens=5, context_len=10, tokens_out=3, peak_bandwidth_bps=1e9, peak_flops=1e12)
    draft = StepMetrics.from_cost(StepCost(weight_bytes=10**6, flops=10), step=0, phase="draft", step_s=0.002,
                                  **{**common, "tokens_out": 0})
    verify = StepMetrics.from_cost(StepCost(weight_bytes=4 * 10**6, flops=10), step=1, phase="verify", step_s=0.005,
                                   **common).with_draft(draft)
    assert verify.round_tokens_per_s == pytest.approx(3 / 0.007)  # the round's time: both steps
    assert verify.round_memory_ceiling_tokens_per_s == pytest.approx(3 * 1e9 / (5 * 10**6))
    assert verify.round_ceiling_tokens_per_s == pytest.approx(3 / (0.004 + 0.001))
    assert verify.tokens_per_s == pytest.approx(3 / 0.005)  # the step alone is unchanged
