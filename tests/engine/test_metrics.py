"""The cost model against numbers worked out by hand."""
import dataclasses
import math

import pytest

from engine.metrics import StepMetrics, decode_ceiling_tokens_per_s, step_cost
from engine.model.config import ModelConfig

LLAMA_7B = ModelConfig.from_name("llama-7b")


def test_llama_7b_shape_counts():
    # per layer: q, k, v, o are 4096 x 4096; gate, up, down are 4096 x 11008
    assert LLAMA_7B.layer_linear_params == 4 * 4096 * 4096 + 3 * 4096 * 11008 == 202_375_168
    assert LLAMA_7B.n_params == 6_738_415_616  # the published 6.74B
    # K and V, 32 layers x 4096 wide, fp16: 0.5 MiB per token of context
    assert LLAMA_7B.kv_bytes_per_token_per_elem * 2 == 524_288


def test_qwen_families_count_their_biases_and_qk_norms():
    """Qwen2.5-0.5B: 494,032,768 parameters as published, its q/k/v biases among them; Qwen3-0.6B's
    q and k norms too. A decode step reads the biases, and the q/k norm weights once per head."""
    qwen2 = ModelConfig.from_name("qwen2.5-0.5b")
    assert qwen2.n_params == 494_032_768
    bias = 24 * (896 + 2 * 128)  # q_dim 896, kv_dim 2 x 64
    assert qwen2.vector_params == 24 * 2 * 896 + 896 + bias
    qwen3 = ModelConfig.from_name("qwen3-0.6b")
    assert qwen3.n_params == 596_049_920
    assert qwen3.vector_params == 28 * (2 * 1024 + 2 * 128) + 1024
    for cfg, vector_elems in [(qwen2, qwen2.vector_params), (qwen3, 28 * (2 * 1024 + (16 + 8) * 128) + 1024),
                              (LLAMA_7B, (2 * 32 + 1) * 4096)]:
        cost = step_cost(cfg, batch_size=1, new_tokens=1, context_len=0, weight_bytes=0, kv_elem_bytes=2,
                         act_elem_bytes=2)
        assert cost.weight_bytes == 2 * vector_elems, cfg.name


def test_seven_billion_fp16_on_two_tb_per_s_is_seven_ms():
    weight_bytes = 7e9 * 2
    assert decode_ceiling_tokens_per_s(weight_bytes, 2e12) == pytest.approx(1 / 0.007)


def decode_metrics(cfg, context_len, step_s, weight_bytes, peak_bw=2e12, peak_flops=312e12, kv_elem=2):
    cost = step_cost(cfg, batch_size=1, new_tokens=1, context_len=context_len, weight_bytes=weight_bytes,
                     kv_elem_bytes=kv_elem, act_elem_bytes=2)
    return cost, StepMetrics.from_cost(cost, step=0, phase="decode", batch_size=1, new_tokens=1, tokens_out=1,
                                       context_len=context_len, step_s=step_s, peak_bandwidth_bps=peak_bw,
                                       peak_flops=peak_flops)


def test_llama_7b_decode_step_by_hand():
    cfg = LLAMA_7B
    matmul_params = 32 * 202_375_168 + 32000 * 4096  # layers + untied head = 6_607_077_376
    weight_bytes = matmul_params * 2
    cost, m = decode_metrics(cfg, context_len=1000, step_s=0.010, weight_bytes=weight_bytes)
    norms = (2 * 32 + 1) * 4096 * 2
    assert cost.weight_bytes == weight_bytes + norms
    assert cost.kv_read_bytes == 1000 * 524_288  # 524 MB of cache read
    assert cost.kv_write_bytes == 524_288  # one new token's K and V
    assert cost.other_bytes == 4096 * 2 + 32000 * 4  # one embedding row, fp32 logits
    # FLOPs: 2 per weight, plus attention 2*2*q_dim per key for 32 layers over 1001 keys
    attention = 32 * 2 * 2 * 4096 * 1001
    assert cost.flops == 2 * matmul_params + attention
    total = weight_bytes + norms + 1001 * 524_288 + 4096 * 2 + 32000 * 4
    assert m.total_bytes == total
    assert m.achieved_gbs == pytest.approx(total / 0.010 / 1e9)
    assert m.mbu == pytest.approx(total / 0.010 / 2e12)
    assert m.mfu == pytest.approx(cost.flops / 0.010 / 312e12)
    assert m.arithmetic_intensity == pytest.approx(cost.flops / total)
    assert 0.9 < m.arithmetic_intensity < 1.1  # decode: about one FLOP per byte at fp16
    assert m.memory_ceiling_tokens_per_s == pytest.approx(2e12 / total)
    assert m.predicted_ceiling_tokens_per_s == pytest.approx(2e12 / total)  # memory-bound
    assert m.bound == "memory"
    assert m.tokens_per_s == pytest.approx(100.0)


def test_prefill_is_compute_bound_and_causal_attention_counts_half_the_square():
    cfg = LLAMA_7B
    weight_bytes = (32 * 202_375_168 + 32000 * 4096) * 2
    T = 2048
    cost = step_cost(cfg, batch_size=1, new_tokens=T, context_len=0, weight_bytes=weight_bytes,
                     kv_elem_bytes=2, act_elem_bytes=2)
    assert cost.attention_flops == 32 * 4 * 4096 * (T * (T + 1) // 2)
    assert cost.matmul_flops == 2 * 32 * 202_375_168 * T + 2 * 32000 * 4096  # head on the last row only
    assert cost.head_flops == 2 * 32000 * 4096  # (its own: an INT4 model's head is INT8, another roof)
    m = StepMetrics.from_cost(cost, step=0, phase="prefill", batch_size=1, new_tokens=T, tokens_out=1,
                              context_len=0, step_s=0.2, peak_bandwidth_bps=2e12, peak_flops=312e12)
    assert m.bound == "compute"
    assert m.tokens_per_s == pytest.approx(T / 0.2)
    assert m.predicted_ceiling_tokens_per_s == pytest.approx(T / (cost.flops / 312e12))


def test_batching_shares_the_weight_read():
    cfg = ModelConfig.from_name("llama3-8b")
    wb = 16e9
    one = step_cost(cfg, batch_size=1, new_tokens=1, context_len=0, weight_bytes=int(wb), kv_elem_bytes=2)
    many = step_cost(cfg, batch_size=16, new_tokens=1, context_len=0, weight_bytes=int(wb), kv_elem_bytes=2)
    assert many.weight_bytes == one.weight_bytes
    assert many.matmul_flops == pytest.approx(16 * one.matmul_flops, rel=0.01)
    assert many.flops / many.total_bytes > 15 * one.flops / one.total_bytes


def test_no_kv_cache_moves_no_cache_bytes_and_recomputes_everything():
    cfg = ModelConfig.from_name("smollm2-135m")
    with_cache = step_cost(cfg, batch_size=1, new_tokens=1, context_len=500, weight_bytes=10**8, kv_elem_bytes=4)
    without = step_cost(cfg, batch_size=1, new_tokens=501, context_len=0, weight_bytes=10**8, kv_elem_bytes=4,
                        kv_cache=False)
    assert without.kv_bytes == 0 and with_cache.kv_read_bytes == 500 * 2 * 30 * 192 * 4
    assert without.flops > 400 * with_cache.matmul_flops * 0.9


def test_metrics_are_immutable_and_serialise():
    _, m = decode_metrics(LLAMA_7B, 10, 0.01, 10**9)
    with pytest.raises(dataclasses.FrozenInstanceError):
        m.step_s = 1.0
    d = m.to_dict()
    assert d["mbu"] == m.mbu and d["phase"] == "decode" and math.isfinite(d["achieved_gbs"])


def test_a_reply_whose_steps_sat_under_different_roofs_is_measured_against_each_step_s_own():
    # seen in the window on the Intel guest: 250 fp32 steps under a 37 GB/s roof (a read of their
    # size), then a switch to bf16 (43 GB/s, partly from the cache) for the last 6: the reply's line said
    # "66% of 43 GB/s peak", the whole reply put under the last step's roof
    from engine.metrics import reply_figures
    _, fp32 = decode_metrics(LLAMA_7B, 10, 1.0, 547 * 10**6, peak_bw=37e9)
    _, bf16 = decode_metrics(LLAMA_7B, 10, 1.0, 274 * 10**6, peak_bw=43e9)
    fp32 = dataclasses.replace(fp32, step_s=fp32.total_bytes / 32e9)
    bf16 = dataclasses.replace(bf16, step_s=bf16.total_bytes / 34e9)
    figures = reply_figures([fp32] * 250 + [bf16] * 6)
    at_roofs_s = 250 * fp32.total_bytes / 37e9 + 6 * bf16.total_bytes / 43e9
    assert figures.mbu == pytest.approx(at_roofs_s / (250 * fp32.step_s + 6 * bf16.step_s))
    assert 0.86 < figures.mbu < 0.87 and 37.0 < figures.peak_gbs < 37.2
    assert figures.peak_gbs == pytest.approx(figures.achieved_gbs / figures.mbu)
    assert reply_figures([bf16] * 3).mbu == pytest.approx(34 / 43)  # one roof: as before
