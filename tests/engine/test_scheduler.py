"""The batching scheduler against a fake model that keeps its "KV cache" in the pool's slots: each
step writes the planned tokens into the slots of their block tables and samples from the context
read back through them, so wrong positions, lost blocks or a bad recompute change the tokens.
Property tests (hypothesis): every request ends exactly once, no block leaks, the token budget and
batch size hold, and pre-empted requests produce the tokens of an undisturbed run."""
import pytest
from hypothesis import event, given, settings
from hypothesis import strategies as st

from engine.kv.blocks import FREE, BlockPool, KVCacheManager
from engine.serving.scheduler import Request, RequestState, Scheduler

VOCAB = 50
EOS = 0


def next_token(request_id: int, context: list[int]) -> int:
    return hash((request_id, *context)) % VOCAB


def reference_output(req: Request) -> list[int]:
    """What the request produces run alone, token by token."""
    ids, out = list(req.prompt_ids), []
    while len(out) < req.max_new_tokens:
        token = next_token(req.request_id, ids)
        out.append(token)
        ids.append(token)
        if token in req.eos_ids:
            break
    return out


class FakeModel:
    """K/V stand-in: slot -> token id. Reads a request's context back through its block table."""

    def __init__(self, kv: KVCacheManager):
        self.kv = kv
        self.slots: list[int | None] = [None] * (kv.pool.num_blocks * kv.block_size)

    def slot(self, table, pos):
        bs = self.kv.block_size
        return table[pos // bs] * bs + pos % bs

    def step(self, plan) -> dict[int, int | None]:
        sampled = {}
        for seq in plan.seqs:
            assert len(seq.block_table) * self.kv.block_size >= seq.start_pos + len(seq.token_ids)
            for i, token in enumerate(seq.token_ids):
                self.slots[self.slot(seq.block_table, seq.start_pos + i)] = token
            if seq.samples:
                n = seq.start_pos + len(seq.token_ids)
                context = [self.slots[self.slot(seq.block_table, p)] for p in range(n)]
                sampled[seq.request_id] = next_token(seq.request_id, context)
        return sampled


def make(num_blocks=16, block_size=4, **kw):
    kv = KVCacheManager(BlockPool(num_blocks), block_size)
    return Scheduler(kv, clock=iter(range(10**6)).__next__, **kw), FakeModel(kv)


def request(rid, prompt_len, max_new, eos=(EOS,)):
    return Request(rid, [(rid * 7 + i) % VOCAB + 1 for i in range(prompt_len)], max_new, frozenset(eos))


def drive(sched, model, max_steps=10_000):
    steps = []
    while sched.has_unfinished and len(steps) < max_steps:
        plan = sched.schedule()
        steps.append(plan)
        sched.update_from_output(plan, model.step(plan))
    return steps


# ---- examples ---------------------------------------------------------------------------------
def test_prefill_is_chunked_then_one_decode_token_per_step():
    sched, model = make(chunk_size=4, token_budget=8)
    req = request(1, prompt_len=10, max_new=3, eos=())
    sched.add_request(req)
    steps = drive(sched, model)
    assert [p.num_scheduled_tokens[1] for p in steps] == [4, 4, 2, 1, 1]
    assert [s.samples for p in steps for s in p.seqs] == [False, False, True, True, True]
    assert req.state is RequestState.FINISHED and req.finish_reason == "length"
    assert req.output_ids == reference_output(req)
    # the fake clock ticks once at arrival (0) and once per step
    assert req.arrival_s == 0 and req.ttft_s == 3 and req.token_times_s == [3, 4, 5]
    assert sched.kv.pool.num_free == 16 and sched.take_finished() == [req]


def test_decodes_go_first_and_a_long_prompt_does_not_stall_them():
    sched, model = make(num_blocks=64, chunk_size=6, token_budget=8, max_batch_size=4)
    short = request(1, 2, 20, eos=())
    sched.add_request(short)
    drive_steps = [sched.schedule()]
    sched.update_from_output(drive_steps[0], model.step(drive_steps[0]))
    sched.add_request(request(2, 40, 2, eos=()))
    for _ in range(5):  # the long prompt prefills in chunks beside the decode
        plan = sched.schedule()
        assert plan.num_scheduled_tokens[1] == 1 and plan.num_scheduled_tokens[2] == 6
        assert plan.total_num_scheduled_tokens <= 8
        sched.update_from_output(plan, model.step(plan))


def test_the_newest_request_is_preempted_when_the_pool_runs_dry_and_recomputes_the_same_tokens():
    sched, model = make(num_blocks=6, block_size=2, token_budget=16, max_batch_size=4)
    old, new = request(1, 4, 5, eos=()), request(2, 4, 5, eos=())
    sched.add_request(old)
    sched.add_request(new)
    steps = drive(sched, model)
    assert sched.num_preemptions >= 1 and new.num_preemptions >= 1 and old.num_preemptions == 0
    assert any(p.preempted_req_ids == (2,) for p in steps)
    assert old.output_ids == reference_output(old) and new.output_ids == reference_output(new)
    assert sched.kv.pool.num_free == 6


def test_static_batch_admits_nobody_until_its_longest_member_finishes():
    sched, model = make(num_blocks=64, token_budget=64, max_batch_size=4, policy="static")
    a, b = request(1, 3, 2, eos=()), request(2, 3, 6, eos=())
    sched.add_request(a)
    sched.add_request(b)
    plan = sched.schedule()
    sched.update_from_output(plan, model.step(plan))
    late = request(3, 3, 2, eos=())
    sched.add_request(late)
    batches = []
    while sched.has_unfinished:
        plan = sched.schedule()
        batches.append(set(plan.num_scheduled_tokens))
        sched.update_from_output(plan, model.step(plan))
    assert 3 not in set().union(*batches[:5])  # b runs 5 more decode steps; late waits for them all
    assert batches[5] == {3}


def test_a_static_batch_forms_with_everyone_that_fits_not_only_what_this_steps_budget_runs():
    sched, model = make(num_blocks=64, token_budget=4, max_batch_size=3, policy="static")
    for rid in range(4):
        sched.add_request(request(rid, 6, 3, eos=()))
    plan = sched.schedule()
    assert plan.num_scheduled_tokens == {0: 4} and [r.request_id for r in sched.running] == [0, 1, 2]
    seen = set()
    while True:
        sched.update_from_output(plan, model.step(plan))
        members_left = any(rid in sched.requests for rid in (0, 1, 2))
        plan = sched.schedule()
        if not members_left:
            break
        assert 3 not in plan.num_scheduled_tokens  # 3 waits for the next batch
        seen |= set(plan.num_scheduled_tokens)
    assert seen >= {1, 2} and set(plan.num_scheduled_tokens) == {3}


def test_continuous_batch_admits_at_once():
    sched, model = make(num_blocks=64, token_budget=64, max_batch_size=4)
    sched.add_request(request(1, 3, 6, eos=()))
    plan = sched.schedule()
    sched.update_from_output(plan, model.step(plan))
    sched.add_request(request(2, 3, 2, eos=()))
    assert set(sched.schedule().num_scheduled_tokens) == {1, 2}


def test_cancel_waiting_running_and_in_flight():
    sched, model = make(num_blocks=64, token_budget=64, max_batch_size=1)
    running, waiting = request(1, 3, 9, eos=()), request(2, 3, 9, eos=())
    sched.add_request(running)
    sched.add_request(waiting)
    assert sched.cancel(2) and waiting.state is RequestState.CANCELLED
    plan = sched.schedule()
    assert sched.cancel(1) and running.state is RequestState.RUNNING  # in the step in flight
    assert sched.update_from_output(plan, model.step(plan)) == [running]
    assert running.state is RequestState.CANCELLED and running.output_ids == []
    assert not sched.cancel(1) and not sched.has_unfinished
    assert sched.take_finished() == [waiting, running] and sched.kv.pool.num_free == 64


def test_a_step_without_its_sampled_token_is_refused_and_can_be_retried():
    sched, model = make()
    sched.add_request(request(1, 3, 2, eos=()))
    plan = sched.schedule()
    with pytest.raises(ValueError, match=r"no token sampled for request\(s\) \[1\]"):
        sched.update_from_output(plan, {})
    sched.update_from_output(plan, model.step(plan))
    assert sched.requests[1].output_ids == reference_output(sched.requests[1])[:1]


def test_bad_requests_and_settings_are_refused():
    sched, _ = make(num_blocks=2, block_size=4)
    with pytest.raises(ValueError, match="whole KV pool holds 8"):
        sched.add_request(request(1, 6, 4))
    with pytest.raises(ValueError, match="needs a prompt"):
        sched.add_request(Request(2, [], 3))
    with pytest.raises(ValueError, match="policy"):
        make(policy="fifo")


# ---- properties -------------------------------------------------------------------------------
@settings(max_examples=120, deadline=None)
@given(num_blocks=st.integers(2, 16), block_size=st.sampled_from([1, 2, 4, 16]),
       max_batch=st.integers(1, 6), budget=st.integers(1, 24), chunk=st.one_of(st.none(), st.integers(1, 12)),
       policy=st.sampled_from(["continuous", "static"]),
       reqs=st.lists(st.tuples(st.integers(0, 12), st.integers(1, 20), st.integers(1, 12)), min_size=1, max_size=14),
       cancels=st.lists(st.tuples(st.integers(0, 40), st.integers(0, 13), st.booleans()), max_size=4),
       switch_at=st.one_of(st.none(), st.integers(0, 30)))
def test_random_workloads_end_every_request_once_leak_nothing_and_keep_the_budget(
        num_blocks, block_size, max_batch, budget, chunk, policy, reqs, cancels, switch_at):
    sched, model = make(num_blocks, block_size, max_batch_size=max_batch, token_budget=budget,
                        chunk_size=chunk, policy=policy)
    capacity = num_blocks * block_size
    arrivals: dict[int, list[Request]] = {}
    for rid, (arrive, prompt_len, max_new) in enumerate(reqs):
        prompt_len = min(prompt_len, capacity)
        max_new = max(1, min(max_new, capacity - prompt_len + 1))
        arrivals.setdefault(arrive, []).append(request(rid, prompt_len, max_new))
    cancel_at: dict[tuple[int, bool], list[int]] = {}  # (step, while the step is in flight) -> ids
    for step, rid, in_flight in cancels:
        cancel_at.setdefault((step, in_flight), []).append(rid)
    every = [r for rs in arrivals.values() for r in rs]
    ended: list[Request] = []
    step = 0
    while step < 2000 and (sched.has_unfinished or any(k >= step for k in arrivals)):
        for req in arrivals.get(step, []):
            sched.add_request(req)
        for rid in cancel_at.get((step, False), []):
            sched.cancel(rid)
        if step == switch_at:
            sched.set_policy("static" if policy == "continuous" else "continuous")
        plan = sched.schedule()
        if sched.has_unfinished:
            assert not plan.is_empty  # always progress
        assert plan.total_num_scheduled_tokens <= budget
        assert len(plan.seqs) <= max_batch and len(sched.running) <= max_batch
        assert all(chunk is None or n <= chunk for n in plan.num_scheduled_tokens.values())
        # ownership: each running request owns exactly its table; nobody else owns anything
        owned = [o for o in sched.kv.pool.owners if o != FREE]
        assert sorted(owned) == sorted(r for r, t in sched.kv.block_tables.items() for _ in t)
        assert set(sched.kv.block_tables) <= {r.request_id for r in sched.running}
        for rid in cancel_at.get((step, True), []):
            sched.cancel(rid)
        sched.update_from_output(plan, model.step(plan))
        ended += sched.take_finished()
        assert all(sched.kv.num_tokens(r.request_id) == r.num_computed_tokens for r in sched.running)
        step += 1
    assert not sched.has_unfinished
    assert sorted(r.request_id for r in ended) == sorted(r.request_id for r in every)  # each exactly once
    assert sched.kv.pool.num_free == num_blocks and sched.kv.block_tables == {}
    for req in every:
        assert req.is_finished
        ref = reference_output(req)
        if req.state is RequestState.FINISHED:
            assert req.output_ids == ref
            assert req.finish_reason == ("eos" if ref[-1] == EOS else "length")
        else:  # cancelled: what it produced so far is a prefix of the undisturbed run
            assert req.output_ids == ref[:len(req.output_ids)]
        assert len(req.token_times_s) == len(req.output_ids)


# ---- prefix reuse: the person's conversation keeps its K/V between turns -------------------------
def turn(rid, prompt, max_new=4):
    return Request(rid, list(prompt), max_new, frozenset(), retain_kv=True)


def test_a_retained_turn_hands_its_blocks_to_the_next_turn_which_prefills_only_the_rest():
    sched, model = make(num_blocks=16, block_size=4)
    first = turn(1, range(1, 10))
    sched.add_request(first)
    drive(sched, model)
    assert first.output_ids == reference_output(first) and sched.take_finished() == [first]
    cached = first.all_token_ids[:-1]  # the last sampled token never ran through the model
    assert sched.retained_tokens == len(cached) == 12 and sched.kv.pool.num_used == 3
    second = turn(2, first.all_token_ids + [7, 8])
    sched.add_request(second)
    assert second.num_reused_tokens == second.num_computed_tokens == 12
    assert set(sched.kv.pool.owners) == {2, FREE} and sched.retained_tokens == 0
    plan = sched.schedule()
    assert plan.num_scheduled_tokens == {2: 3} and plan.seqs[0].start_pos == 12  # 13 of 15 prompt tokens reused
    sched.update_from_output(plan, model.step(plan))
    drive(sched, model)
    assert second.output_ids == reference_output(second)  # read its first 12 positions from turn 1's slots


def test_a_diverging_prompt_keeps_only_the_shared_prefix_and_a_stranger_takes_nothing():
    sched, model = make(num_blocks=16, block_size=4)
    first = turn(1, range(1, 10))
    sched.add_request(first)
    drive(sched, model)
    stranger = request(5, 6, 2)  # not retain_kv: the retained blocks are not its to take
    sched.add_request(stranger)
    assert stranger.num_computed_tokens == 0 and sched.retained_tokens == 12
    drive(sched, model)
    second = turn(2, [1, 2, 3, 4, 5, 6, 99, 98])  # shares 6 tokens: 2 blocks of 4 kept, cut to 6
    sched.add_request(second)
    assert second.num_reused_tokens == 6 and sched.kv.num_tokens(2) == 6 and sched.kv.pool.num_used == 2
    drive(sched, model)
    assert second.output_ids == reference_output(second)
    third = turn(3, [42, 43])  # a new conversation: nothing shared, the retained blocks are freed
    sched.add_request(third)
    assert third.num_reused_tokens == 0 and sched.kv.pool.num_used == 0


def test_retained_blocks_are_given_back_before_anyone_is_preempted_or_kept_waiting():
    for policy in ("continuous", "static"):
        sched, model = make(num_blocks=6, block_size=4, policy=policy)
        first = turn(1, range(1, 14))  # 16 positions cached: 4 of the 6 blocks
        sched.add_request(first)
        drive(sched, model)
        assert sched.kv.pool.num_used == 4
        others = [request(10 + i, 7, 2) for i in range(2)]  # 8 positions each: the pool is full
        for r in others:
            sched.add_request(r)
        drive(sched, model)
        assert sched.num_preemptions == 0 and sched.retained_tokens == 0, policy
        assert [r.output_ids for r in others] == [reference_output(r) for r in others]
        assert sched.kv.pool.num_free == 6


def test_a_turn_cancelled_mid_step_retains_only_what_it_computed():
    sched, model = make(num_blocks=16, block_size=4, token_budget=4)
    first = turn(1, range(1, 11), max_new=8)  # a 10-token prompt in chunks of 4
    sched.add_request(first)
    plan = sched.schedule()
    sched.update_from_output(plan, model.step(plan))
    plan = sched.schedule()  # the second chunk is in flight when the person presses Stop
    sched.cancel(1)
    sched.update_from_output(plan, model.step(plan))
    assert first.state is RequestState.CANCELLED and sched.retained_tokens == 4
    assert sched.kv.num_tokens(1) == 4 and sched.kv.pool.num_used == 1
    again = turn(2, range(1, 11))
    sched.add_request(again)
    assert again.num_reused_tokens == 4
    drive(sched, model)
    assert again.output_ids == reference_output(again)


@settings(max_examples=100, deadline=None)
@given(num_blocks=st.integers(4, 16), block_size=st.integers(1, 5), budget=st.integers(1, 24),
       turns=st.lists(st.tuples(st.integers(1, 6), st.integers(1, 6), st.booleans()), min_size=1, max_size=6),
       others=st.lists(st.tuples(st.integers(0, 20), st.integers(1, 16), st.integers(1, 8)), max_size=10),
       cancel_turn_at=st.one_of(st.none(), st.integers(0, 10)), policy=st.sampled_from(["continuous", "static"]))
def test_random_conversations_beside_other_requests_reuse_only_valid_prefixes_and_leak_nothing(
        num_blocks, block_size, budget, turns, others, cancel_turn_at, policy):
    """Turns of one conversation (each prompt the last one's tokens plus new ones, or a fresh start)
    among other requests in a small pool: every request gives the tokens of an undisturbed run,
    ends once, and when all is done only the retained turn holds blocks."""
    sched, model = make(num_blocks, block_size, max_batch_size=4, token_budget=budget, policy=policy)
    capacity = num_blocks * block_size
    pending: dict[int, list[Request]] = {}
    for i, (step, n, m) in enumerate(others):
        n = min(n, capacity)
        pending.setdefault(step, []).append(request(100 + i, n, max(1, min(m, capacity - n + 1))))
    conversation: list[int] = []
    done: list[Request] = []
    turn_ids = iter(range(1, 100))
    current = None
    step = 0
    while step < 3000 and (turns or current is not None or sched.has_unfinished or pending):
        for req in pending.pop(step, []):
            sched.add_request(req)
        if current is None and turns:
            new_tokens, max_new, fresh = turns.pop(0)
            prompt = ([] if fresh else conversation) + [(7 * step + j) % VOCAB + 1 for j in range(new_tokens)]
            prompt = prompt[-(capacity // 2):]  # within the pool, with room to reply
            current = turn(next(turn_ids), prompt, max(1, min(max_new, capacity - len(prompt) + 1)))
            sched.add_request(current)
        if cancel_turn_at == step and current is not None:
            sched.cancel(current.request_id)
        plan = sched.schedule()
        if sched.has_unfinished:
            assert not plan.is_empty
        assert plan.total_num_scheduled_tokens <= budget
        sched.update_from_output(plan, model.step(plan))
        for req in sched.take_finished():
            done.append(req)
            if req is current:
                conversation, current = req.all_token_ids, None
        held = {r for r, table in sched.kv.block_tables.items() if table}
        assert held <= set(sched.requests) | {r.request_id for r in done if r.retain_kv}
        assert sum(len(t) for t in sched.kv.block_tables.values()) == sched.kv.pool.num_used
        step += 1
    assert not sched.has_unfinished and not turns
    for req in done:
        ref = reference_output(req)
        assert req.output_ids == (ref if req.state is RequestState.FINISHED else ref[:len(req.output_ids)])
    assert len({r.request_id for r in done}) == len(done)
    event(f"prefix reused: {any(r.num_reused_tokens for r in done)}; pre-empted: {sched.num_preemptions > 0}")
    assert sched.kv.pool.num_used == sched.kv.blocks_for(sched.retained_tokens)
    sched.drop_retained()
    assert sched.kv.pool.num_free == num_blocks and sched.kv.block_tables == {}
