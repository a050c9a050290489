"""A scheduler plan run as one batched forward (engine/serving/batch_forward.py) gives each request the
greedy tokens it gets run alone through the plain model path — mixed lengths, chunked prefill
beside decodes, pre-emption and recompute included (fp32, tiny random model)."""
import pytest
import torch
from test_engine import CFG

from engine.io.loader import synthetic_weights
from engine.kv.cache import ContiguousKVCache, PagedKVCache
from engine.model.transformer import Transformer
from engine.serving import batch_forward
from engine.serving.batch_forward import forward_plan
from engine.serving.scheduler import Request, Scheduler


@pytest.fixture(scope="module")
def model():
    w = synthetic_weights(CFG, torch.float32, "cpu", seed=3)
    return Transformer(CFG, {k: v * 20 if "norm" not in k else v for k, v in w.items()})  # sharp logits


def alone(model, prompt, max_new):
    """Greedy tokens and their logits, batch 1, contiguous cache: the reference path."""
    cache = ContiguousKVCache(CFG, 1, len(prompt) + max_new, torch.float32, "cpu")
    logits = model(torch.tensor([prompt]), 0, cache)[0, -1]
    tokens, all_logits = [], []
    for _ in range(max_new):
        all_logits.append(logits)
        tokens.append(int(logits.argmax()))
        logits = model(torch.tensor([[tokens[-1]]]), cache.length, cache)[0, -1]
    return tokens, torch.stack(all_logits)


def batched(model, requests, num_blocks, attention, **sched_kw):
    cache = PagedKVCache(CFG, num_blocks=num_blocks, block_size=4, dtype=torch.float32, device="cpu")
    sched = Scheduler(cache.manager, **sched_kw)
    logits: dict[int, list[torch.Tensor]] = {r.request_id: [] for r in requests}
    pending = list(requests)
    steps = 0
    while pending or sched.has_unfinished:
        if pending and steps % 2 == 0:  # arrivals spread over the run: mixed phases in one batch
            sched.add_request(pending.pop(0))
        plan = sched.schedule()
        ids, out = forward_plan(model, cache, plan.seqs, attention)
        for rid, row in zip(ids, out):
            logits[rid].append(row)
        sched.update_from_output(plan, {rid: int(row.argmax()) for rid, row in zip(ids, out)})
        steps += 1
    assert cache.manager.pool.num_free == num_blocks
    return sched, logits


# 12 blocks of 4 positions: the pool runs dry and requests are pre-empted; gather=False reads the
# decode rows' keys through their block tables as on a GPU (the CPU gathers them block by block)
@pytest.mark.parametrize("attention, num_blocks, gather", [("flash", 64, True), ("flash", 12, True),
                                                            ("naive", 12, True), ("flash", 12, False)])
def test_each_request_gets_its_solo_greedy_tokens_in_a_mixed_batch(model, attention, num_blocks, gather,
                                                                    monkeypatch):
    monkeypatch.setattr(batch_forward, "CPU_GATHER_DECODE_KEYS", gather)
    lengths = [(5, 8), (17, 6), (1, 9), (11, 7), (3, 5)]  # (prompt, new tokens)
    gen = torch.Generator().manual_seed(0)
    requests = [Request(i, torch.randint(1, CFG.vocab_size, (p,), generator=gen).tolist(), n)
                for i, (p, n) in enumerate(lengths)]
    sched, logits = batched(model, requests, num_blocks, attention, max_batch_size=4, token_budget=10,
                            chunk_size=6)
    if num_blocks == 12:
        assert sched.num_preemptions > 0
    for req in requests:
        tokens, ref_logits = alone(model, req.prompt_ids, req.max_new_tokens)
        assert req.output_ids == tokens, f"request {req.request_id}"
        # a pre-empted request's logits after its recompute come from a prefill, not a decode
        torch.testing.assert_close(torch.stack(logits[req.request_id]), ref_logits, rtol=1e-4, atol=1e-3)


@pytest.mark.parametrize("starts", [(9, 2, 5), (6, 6, 6)])  # ragged rows, and rows of one length
def test_decode_rows_keys_are_gathered_block_by_block_in_position_order(starts):
    from engine.serving.batch_forward import _decode_gather, _gather_blocks
    from engine.serving.scheduler import ScheduledSeq
    bs, n_kv, hd, num_blocks = 4, 2, 3, 12
    pool = torch.randn(n_kv, num_blocks * bs, hd)
    tables = [(7, 0, 10), (3, 8), (11, 4)]  # scattered blocks, out of order
    seqs = [ScheduledSeq(i, (1,), start, tables[i], True) for i, start in enumerate(starts)]
    rows, kv_lens, width = _decode_gather(seqs, bs, n_kv, num_blocks, "cpu")
    got = _gather_blocks(pool, rows, len(seqs), width, bs)  # (B, n_kv, width, hd)
    assert got.shape == (3, n_kv, max(starts) + 1, hd)
    lens = [s + 1 for s in starts]
    assert (kv_lens is None) == (len(set(lens)) == 1)
    if kv_lens is not None:
        assert kv_lens.tolist() == lens
    for b, (table, n) in enumerate(zip(tables, lens)):
        slots = [table[p // bs] * bs + p % bs for p in range(n)]
        torch.testing.assert_close(got[b, :, :n], pool[:, slots])  # the keys a row may see, in order


def test_steps_are_labelled_decode_prefill_or_mixed_and_count_every_token_fed(model):
    runner = batch_forward.BatchRunner(model, num_blocks=32, block_size=4, max_batch_size=4, token_budget=64)
    runner.scheduler.add_request(Request(1, [3, 4, 5], 4))
    phases = []
    for step in range(4):
        if step == 2:  # a new prompt arrives while request 1 decodes: both run in one step
            runner.scheduler.add_request(Request(2, [6, 7, 8, 9, 10], 2))
        plan, _, m = runner.step()
        phases.append(m.phase)
        assert m.tokens_fed == plan.total_num_scheduled_tokens
        n = m.tokens_out if m.phase == "decode" else plan.total_num_scheduled_tokens
        assert m.tokens_per_s == pytest.approx(n / m.step_s)
    assert phases == ["prefill", "decode", "mixed", "decode"]


def test_the_gpu_smoke_scripts_batched_check_runs_here():
    """scripts/gpu_smoke.py's batched check, on the CPU: the GPU session's script cannot rot unseen."""
    import runpy
    from pathlib import Path
    script = runpy.run_path(str(Path(__file__).resolve().parents[2] / "scripts" / "gpu_smoke.py"))
    assert "pre-emptions" in script["Smoke"]("cpu", tiny=True).batched_matches_solo()
