"""Prompts' K/V kept across requests (engine/serving/prefix_store.py, BatchRunner's `prefixes`): a request
whose prompt starts as an earlier one did takes that prefix and computes only the rest, with the
greedy tokens it gets computing everything; the store forgets on a change of weights and keeps to its
bytes; the serving stats say what share of the users' prompt tokens came from it."""
import random

import pytest
import torch
from test_engine import CFG, make_engine

from engine.hardware.roof import Roof
from engine.io.loader import synthetic_weights
from engine.model.transformer import Transformer
from engine.serving.batch_forward import BatchRunner
from engine.serving.prefix_store import PrefixStore
from engine.serving.scheduler import Request
from engine.serving.server import BatchServer
from engine.serving.users import Workload

P = [5, 9, 2, 7, 7, 1, 30, 4, 11, 12, 3, 8, 6]  # 13 tokens


@pytest.fixture(scope="module")
def model():
    w = synthetic_weights(CFG, torch.float32, "cpu", seed=3)
    return Transformer(CFG, {k: v * 20 if "norm" not in k else v for k, v in w.items()})  # sharp logits


def serve(runner, requests):
    """Each request alone, one after another; returns [(its tokens, the tokens each of its steps fed)]."""
    out = []
    for req in requests:
        runner.scheduler.add_request(req)
        fed = []
        while runner.scheduler.has_unfinished:
            plan, _, m = runner.step()
            fed.append(plan.total_num_scheduled_tokens)
        runner.scheduler.take_finished()
        out.append((list(req.output_ids), fed))
    return out


def requests(first_id=1):
    prompts = [P, P, P[:9] + [40, 41, 42, 43], [50, 51, 52, 53, 54, 55]]
    return [Request(first_id + i, list(p), 6) for i, p in enumerate(prompts)]


def test_a_repeated_prompt_takes_its_kv_and_decodes_the_same_tokens(model):
    cold = BatchRunner(model, 64, 4, max_batch_size=4, token_budget=64)
    warm = BatchRunner(model, 64, 4, max_batch_size=4, token_budget=64, prefix_bytes=1 << 20)
    ref = serve(cold, requests())
    reqs = requests()
    got = serve(warm, reqs)
    assert [t for t, _ in got] == [t for t, _ in ref]
    assert [r.num_reused_tokens for r in reqs] == [0, 12, 9, 0]  # the whole prompt but its last token; 9 shared
    assert got[1][1][0] == 1 and ref[1][1][0] == 13  # the repeat's first step ran one prompt token
    assert got[2][1][0] == 4 and got[3][1][0] == 6
    assert warm.prefixes.hits == 2 and warm.prefixes.reused_tokens == 21
    assert len(warm.prefixes) == 3  # P, P[:9] + ..., the last: one entry a distinct prompt
    assert warm.cache.manager.pool.num_free == 64  # copies: the pool's blocks all came back


def test_prompts_are_shared_between_requests_running_together(model):
    """Two waves of four requests with the same prompts: the second wave takes them while the first
    decodes beside it, and every request gets the tokens it gets with no store."""
    def waves(runner):
        first = [Request(i, P[: 6 + i], 5) for i in range(4)]
        second = [Request(10 + i, P[: 6 + i] + [60 + i], 5) for i in range(4)]
        for r in first:
            runner.scheduler.add_request(r)
        runner.step()  # the first wave's prompts in, they start decoding
        for r in second:
            runner.scheduler.add_request(r)
        while runner.scheduler.has_unfinished:
            runner.step()
        return first + second

    ref = waves(BatchRunner(model, 64, 4, max_batch_size=8, token_budget=64))
    runner = BatchRunner(model, 64, 4, max_batch_size=8, token_budget=64, prefix_bytes=1 << 20)
    got = waves(runner)
    assert [r.output_ids for r in got] == [r.output_ids for r in ref]
    assert [r.num_reused_tokens for r in got] == [0] * 4 + [6 + i for i in range(4)]


def test_new_weights_empty_the_store(model):
    runner = BatchRunner(model, 64, 4, max_batch_size=4, token_budget=64, prefix_bytes=1 << 20)
    serve(runner, [Request(1, list(P), 3)])
    assert len(runner.prefixes) == 1
    runner.set_model(model)  # the same weights: kept
    assert len(runner.prefixes) == 1
    other = Transformer(CFG, synthetic_weights(CFG, torch.float32, "cpu", seed=4))
    runner.set_model(other)
    assert len(runner.prefixes) == 0
    again = Request(2, list(P), 3)
    serve(runner, [again])
    assert again.num_reused_tokens == 0


def test_the_persons_conversation_is_not_stored_or_served_from_the_store(model):
    runner = BatchRunner(model, 64, 4, max_batch_size=4, token_budget=64, prefix_bytes=1 << 20)
    serve(runner, [Request(1, list(P), 3, retain_kv=True)])
    assert len(runner.prefixes) == 0
    serve(runner, [Request(2, list(P), 3)])
    person = Request(3, list(P), 3, retain_kv=True)
    runner.scheduler.drop_retained()
    serve(runner, [person])
    assert person.num_reused_tokens == 0


def test_the_store_keeps_to_its_bytes_least_recently_used_first():
    def kv(n):
        return torch.zeros(2, 1, n, 4), torch.zeros(2, 1, n, 4)  # 32 bytes a token each, 64 both

    store = PrefixStore(max_bytes=64 * 20)
    store.put([1, 2, 3, 4, 5, 6, 7, 8], *kv(8))
    store.put([9, 9, 9, 9, 9, 9, 9, 9], *kv(8))
    assert store.bytes == 64 * 16 and len(store) == 2
    assert store.lookup(Request(1, [1, 2, 3, 4, 0], 1))[0].shape[2] == 4  # touches the first
    store.put([7, 7, 7, 7, 7, 7], *kv(6))  # over: the least recently used (the 9s) goes
    assert store.bytes == 64 * 14 and store.longest([9, 9, 9])[1] == 0 and store.longest([1, 2])[1] == 2
    assert store.lookup(Request(2, [1, 5], 1)) is None  # one shared token: not worth it
    store.put(list(range(100)), *kv(100))  # larger than the store: not kept
    assert len(store) == 2
    store.put([7, 7, 7], *kv(3))  # a prompt a stored one starts with: held by it
    assert len(store) == 2 and store.bytes == 64 * 14 and store.covers([7, 7, 7])
    store.put([7, 7, 7, 7, 7, 7, 7, 7, 7, 7], *kv(10))  # one that starts with a stored one: replaces it
    assert len(store) == 2 and store.bytes == 64 * 18 and store.longest([7] * 12)[1] == 10
    small = PrefixStore(max_bytes=1 << 20, max_prompts=2)
    for i in range(3):
        small.put([i] * 4, *kv(4))
    assert len(small) == 2 and small.longest([0, 0])[1] == 0


def test_serving_stats_give_the_share_of_the_users_prompt_tokens_taken_from_the_store():
    model = make_engine().model
    gen = random.Random(1)
    prompts = tuple(tuple(gen.randrange(1, CFG.vocab_size) for _ in range(10)) for _ in range(2))
    workload = Workload(prompts=prompts, prompt_lens=None, output_lens=(2, 4))
    seen = []
    server = BatchServer(model, workload, users=3, policy="continuous", attention="flash", budget_bytes=1 << 24,
                         roof=Roof(1e10, {"fp32": 1e11}), on_request=lambda what, r: seen.append((what, r)))
    stats = [server.step(i)[1] for i in range(40)]
    assert stats[0].prefix_hit_pct != stats[0].prefix_hit_pct  # nan: nothing finished yet
    finished = [r for what, r in seen if what == "finished"]
    assert len(finished) > 4
    want = 100 * sum(r.num_reused_tokens for r in finished) / sum(len(r.prompt_ids) for r in finished)
    assert stats[-1].prefix_hit_pct == pytest.approx(want) and want > 50  # two prompts: nearly all repeats


def test_with_the_cache_off_every_prompt_is_computed_and_the_stats_say_nothing():
    model = make_engine().model
    prompts = ((3, 4, 5, 6, 7, 8, 9, 10),)
    workload = Workload(prompts=prompts, prompt_lens=None, output_lens=(2, 3))
    seen = []
    server = BatchServer(model, workload, users=2, policy="continuous", attention="flash", budget_bytes=1 << 24,
                         roof=Roof(1e10, {"fp32": 1e11}), on_request=lambda what, r: seen.append((what, r)),
                         prefix_cache=False)
    stats = [server.step(i)[1] for i in range(20)]
    finished = [r for what, r in seen if what == "finished"]
    assert len(finished) > 2 and not any(r.num_reused_tokens for r in finished)
    assert server.runner.prefixes is None and stats[-1].prefix_hit_pct != stats[-1].prefix_hit_pct


def test_the_step_after_a_prefix_is_taken_counts_its_copy(model):
    """The copy into the pool is work the step's figures carry: its bytes (read and written) and its time."""
    from engine.metrics import KVCopy
    runner = BatchRunner(model, 64, 4, max_batch_size=4, token_budget=64, prefix_bytes=1 << 20)
    serve(runner, [Request(1, list(P), 3)])
    runner.scheduler.add_request(Request(2, list(P), 3))
    plan, _, m = runner.step()
    per_token = CFG.kv_bytes_per_token_per_elem * 4
    assert m.tokens_in == 1 and m.copy_bytes == KVCopy(read=12, written=12).bytes(CFG, 4) == 24 * per_token
    _, _, after = runner.step()  # the next step copies nothing
    assert after.copy_bytes == 0
