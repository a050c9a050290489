"""The step runners (engine/steps/) on a tiny random model, without an Engine: the plain step's
cache reuse and layouts, the speculative step's fallback and rollback, the batched step beside
users, one reply's accounting, and the step counter every runner shares."""
import time
from dataclasses import replace

import pytest
import torch
from test_engine import CFG, GREEDY, make_engine
from test_serving import short_workload

from engine.events import BatchStats, DoneEvent, TokenEvent
from engine.graphs import GraphDecoder
from engine.hardware.roof import Roof
from engine.io.byte_tokenizer import ByteTokenizer
from engine.metrics import StepMetrics, step_cost
from engine.serving.lifecycle import BatchLifecycle, batch_label
from engine.model import cpu_step
from engine.model.cpu_step import Choice
from engine.serving.speculative import Draft
from engine.settings import SamplingParams
from engine.settings import PromptError
from engine.steps.batched import BatchedSteps
from engine.steps.plain import PlainSteps
from engine.steps.reply import Reply, StepSetup, check_prompt_length, make_generator
from engine.steps.speculative import SpeculativeSteps
from engine.steps.timing import StepCounter, StepTimer, elem_bytes

ROOF = Roof(20e9, {"fp32": 1e11, "bf16": 1e11})

PROMPT = list(range(1, 20))


@pytest.fixture(scope="module")
def model():
    return make_engine().model


def setup_for(model, **changes) -> StepSetup:
    return StepSetup(replace(GREEDY, **changes), model, ROOF)


def new_reply(ids=PROMPT, budget=6) -> Reply:
    return Reply(list(ids), budget, ByteTokenizer(CFG.vocab_size).stream(), frozenset())


def plain_steps(counter=None) -> PlainSteps:
    return PlainSteps(CFG, "cpu", GraphDecoder("cpu"), counter or StepCounter(), on_capture_failed=lambda: None)


def test_a_plain_step_yields_its_metrics_then_its_token_and_counts_itself(model):
    counter = StepCounter()
    plain = plain_steps(counter)
    reply = new_reply()
    events = list(plain.step(reply, None, setup_for(model)))
    assert [type(e) for e in events] == [StepMetrics, TokenEvent]
    assert events[0].phase == "prefill" and events[0].step == 0 and counter.value == 1
    assert reply.n_new == 1 and reply.ids[-1] == events[1].token_id and plain.cached_ids == PROMPT
    events = list(plain.step(reply, None, setup_for(model)))
    assert events[0].phase == "decode" and events[0].context_len == len(PROMPT) and events[0].new_tokens == 1
    assert events[0].step == 1 and reply.decode_s == events[0].step_s > 0


def test_the_cache_keeps_a_prefix_across_replies_and_starts_again_in_a_new_layout(model):
    plain = plain_steps()
    list(plain.step(new_reply(), None, setup_for(model)))
    (metrics, _) = plain.step(new_reply(PROMPT + [7, 8]), None, setup_for(model))
    assert metrics.context_len == len(PROMPT) and metrics.new_tokens == 2  # only what is new runs
    paged = list(plain.step(new_reply(PROMPT + [7, 8]), None, setup_for(model, kv_layout="paged")))[0]
    assert paged.context_len == 0 and plain.cache.layout == "paged"
    plain.reset()
    assert plain.cached_ids == [] and plain.cache.length == 0
    plain.astype(torch.bfloat16)
    assert plain.cache.k.dtype == plain.cache.v.dtype == torch.bfloat16


def numpy_rows(monkeypatch, numpy_row: bool) -> list:
    """Counts the steps whose logits came as numpy rows (one entry a step); none when `numpy_row` is off."""
    rows = []
    for name in ("decode_token", "decode_rows"):
        run = getattr(cpu_step, name)
        monkeypatch.setattr(cpu_step, name, lambda *a, _run=run, **k: rows.append(1) or _run(*a, **k))
    if not numpy_row:
        monkeypatch.setattr(PlainSteps, "_rows_in_cpp", lambda *a, **k: None)
    return rows


def plain_reply(model, monkeypatch, sampling, masked=(), numpy_row=True, budget=10):
    """A reply's tokens and step figures (time left out) from the plain runner, its decode steps' logits
    taken as numpy rows (`_rows_in_cpp`) or through the module (`_run`), and how many took the row."""
    rows = numpy_rows(monkeypatch, numpy_row)
    plain, reply = plain_steps(), new_reply(budget=budget)
    reply.masked = masked
    gen, setup = make_generator(5, "cpu"), setup_for(model, sampling=sampling)
    events = [e for _ in range(budget) for e in plain.step(reply, gen, setup)]
    monkeypatch.undo()
    tokens = [e.token_id for e in events if isinstance(e, TokenEvent)]
    steps = [replace(e, step_s=0.0, t_s=0.0) for e in events if isinstance(e, StepMetrics)]
    return tokens, steps, len(rows)


@pytest.mark.parametrize("sampling", [GREEDY.sampling, SamplingParams(temperature=1.5, top_p=0.9),
                                      SamplingParams(temperature=0.8, top_k=20, top_p=0.5)],
                         ids=["greedy", "top-p", "top-k and top-p"])
def test_a_cpu_decode_token_from_the_cpp_row_is_the_modules_token(model, monkeypatch, sampling):
    """The plain decode step on a CPU samples the C++ step's logits as a numpy row, with no PyTorch
    operator for a greedy token: the same tokens (the same uniform numbers, drawn before the step) and
    the same figures as through the module, masked tokens never."""
    def reply(**kw):
        monkeypatch.setattr(cpu_step, "choice", lambda m: Choice("fp32", 1e-6, 1.0, "test"))  # the C++ step wins
        return plain_reply(model, monkeypatch, sampling, **kw)

    tokens, steps, rows = reply()
    assert rows == 9 and reply(numpy_row=False) == (tokens, steps, 0)
    assert [s.phase for s in steps] == ["prefill"] + ["decode"] * 9 and len(set(tokens)) > 2
    masked = tuple(sorted(set(tokens[1:4])))  # the tokens it chose: masked, it must choose others
    got, got_steps, rows = reply(masked=masked)
    assert rows == 9 and reply(masked=masked, numpy_row=False) == (got, got_steps, 0)
    assert not set(got[1:]) & set(masked)


def test_the_numpy_row_waits_for_a_step_the_cpp_step_takes(model, monkeypatch):
    """Where PyTorch's step wins the timing, the numpy row is not taken and no uniform number is drawn."""
    monkeypatch.setattr(cpu_step, "choice", lambda m: Choice("fp32", 1.0, 1e-6, "test"))  # PyTorch's step wins
    sampled = SamplingParams(temperature=1.5, top_p=0.9)
    tokens, steps, rows = plain_reply(model, monkeypatch, sampled)
    assert rows == 0 and all(s.matmul_flops > 0 for s in steps)
    monkeypatch.setattr(cpu_step, "choice", lambda m: Choice("fp32", 1e-6, 1.0, "test"))
    assert plain_reply(model, monkeypatch, sampled)[0][:1] == tokens[:1]  # (the prefill's token: its draw first)


def test_a_prompt_in_cpp_chunks_counts_each_calls_weights_and_context(model, monkeypatch):
    """The cost of a prompt the C++ step ran in chunks (more rows than one call takes): every layer
    weight and norm read once a call, the head once, each call's K/V context read again; the FLOPs
    those of the prompt as one step."""
    monkeypatch.setattr(cpu_step, "choice", lambda m: Choice("fp32", 1e-6, 1.0, "test", 1e-6, 1.0))  # chunks win
    rows = cpu_step.library(model.context).max_rows
    prompt = [(7 * i) % CFG.vocab_size + 1 for i in range(2 * rows + 5)]
    metrics = next(plain_steps().step(new_reply(prompt), None, setup_for(model)))
    assert cpu_step.chunks(model) == (rows, rows, 5) and metrics.new_tokens == 2 * rows + 5
    layers = model.linear_weight_bytes(rows=1, head_rows=0)
    head = model.linear_weight_bytes(rows=1, head_rows=1) - layers
    norms = CFG.vector_elems_per_step * 4
    assert metrics.weight_bytes == 3 * (layers + norms) + head
    kv_position = CFG.n_layers * 2 * CFG.n_kv_heads * CFG.head_dim * 4  # K and V, every layer, fp32
    assert metrics.kv_read_bytes == (rows + 2 * rows) * kv_position  # the second call's context, the third's
    assert metrics.kv_write_bytes == len(prompt) * kv_position
    one = step_cost(CFG, batch_size=1, new_tokens=len(prompt), context_len=0, weight_bytes=layers + head,
                    kv_elem_bytes=4, cpp_step=True)
    assert metrics.flops == one.flops and metrics.matmul_flops == one.matmul_flops


class FromTruth:
    """Guesses from a reply known beforehand, every other round's third guess wrong."""

    def __init__(self, truth, prompt_len):
        self.truth, self.prompt_len = truth, prompt_len

    def propose(self, ids, k, sampling, generator=None):
        n = len(ids) - self.prompt_len
        guesses = list(self.truth[n:n + k])
        if n % 2 and len(guesses) > 2:
            guesses[2] = (guesses[2] + 1) % CFG.vocab_size
        return Draft(guesses)


def test_a_greedy_verify_step_from_the_cpp_rows_is_the_modules(model, monkeypatch):
    """A greedy verify step on a CPU takes the C++ step's k + 1 logits rows as numpy: the same tokens,
    accepted guesses and figures as through the module."""
    monkeypatch.setattr(cpu_step, "choice", lambda m: Choice("fp32", 1e-6, 1.0, "test"))
    truth = plain_reply(model, monkeypatch, GREEDY.sampling, budget=30)[0]

    def spec_reply(numpy_row: bool):
        monkeypatch.setattr(cpu_step, "choice", lambda m: Choice("fp32", 1e-6, 1.0, "test"))
        rows = numpy_rows(monkeypatch, numpy_row)
        counter = StepCounter()
        spec = SpeculativeSteps(plain_steps(counter), counter, CFG.max_seq_len)
        spec.lookup = FromTruth(truth, len(PROMPT))
        reply, setup = new_reply(budget=24), setup_for(model, speculate="ngram", draft_tokens=4)
        events = list(spec.plain.step(reply, None, setup))
        while reply.n_new < 24:
            events += spec.step(reply, None, setup)
        monkeypatch.undo()
        return ([e.token_id for e in events if isinstance(e, TokenEvent)],
                [replace(e, step_s=0.0, t_s=0.0) for e in events if isinstance(e, StepMetrics)], len(rows))

    tokens, steps, rows = spec_reply(True)
    assert tokens == truth[:24] and spec_reply(False) == (tokens, steps, 0)
    verify_steps = [s for s in steps if s.phase == "verify"]
    assert rows == len(steps) - 1 and len(verify_steps) >= 5
    assert {s.accepted_tokens for s in verify_steps} >= {2, 4}  # a wrong third guess, and all right


def test_without_the_cache_every_step_runs_the_whole_context(model):
    plain = plain_steps()
    reply = new_reply()
    steps = [e for _ in range(3) for e in plain.step(reply, None, setup_for(model, kv_cache=False))
             if isinstance(e, StepMetrics)]
    assert [m.new_tokens for m in steps] == [len(PROMPT), len(PROMPT) + 1, len(PROMPT) + 2]
    assert plain.cache is None


class Guesses:
    def __init__(self, tokens):
        self.tokens = tokens

    def propose(self, ids, k, sampling, generator=None):
        return Draft(self.tokens[:k])


def test_a_speculative_step_without_a_guess_is_a_plain_step(model):
    counter = StepCounter()
    spec = SpeculativeSteps(plain_steps(counter), counter, CFG.max_seq_len)
    spec.lookup = Guesses([])
    reply = new_reply()
    list(spec.plain.step(reply, None, setup_for(model)))
    events = list(spec.step(reply, None, setup_for(model, speculate="ngram")))
    assert events[0].phase == "decode" and counter.value == 2


def test_a_verify_step_keeps_the_right_guesses_and_rolls_the_cache_back(model):
    plain = plain_steps()
    truth = new_reply(budget=8)
    truth_tokens = [e.token_id for _ in range(5) for e in plain.step(truth, None, setup_for(model))
                    if isinstance(e, TokenEvent)]
    counter = StepCounter()
    spec = SpeculativeSteps(plain_steps(counter), counter, CFG.max_seq_len)
    reply = new_reply(budget=8)
    list(spec.plain.step(reply, None, setup_for(model)))
    wrong = (truth_tokens[3] + 1) % CFG.vocab_size
    spec.lookup = Guesses(truth_tokens[1:3] + [wrong, 5])  # two right, then wrong ones
    events = list(spec.step(reply, None, setup_for(model, speculate="ngram", draft_tokens=4)))
    verify_step = events[0]
    assert verify_step.phase == "verify" and verify_step.draft_tokens == 4 and verify_step.accepted_tokens == 2
    tokens = [e for e in events if isinstance(e, TokenEvent)]
    assert [t.token_id for t in tokens] == truth_tokens[1:4] and [t.drafted for t in tokens] == [True, True, False]
    assert spec.plain.cached_ids == PROMPT + truth_tokens[:3]  # nothing guessed wrong stays cached


def test_a_batched_step_runs_the_reply_beside_the_users(model):
    counter = StepCounter()
    batch = BatchLifecycle(CFG, ByteTokenizer(CFG.vocab_size), "cpu", None)
    batch.user_workload = short_workload()
    batched = BatchedSteps(batch, counter, CFG.max_seq_len)
    setup = setup_for(model, users=2)
    reply = new_reply(budget=4)
    batched.submit(reply, None, setup)
    assert reply.request is not None and reply.batched_from_start and batch.server is not None
    events = []
    while not reply.request.is_finished:
        events += batched.step(reply, None, setup)
    steps = [e for e in events if isinstance(e, StepMetrics)]
    assert len(steps) == sum(isinstance(e, BatchStats) for e in events) == counter.value
    assert [m.step for m in steps] == list(range(len(steps))) and max(m.batch_size for m in steps) > 1
    assert reply.n_new == 4 and reply.ids[:len(PROMPT)] == PROMPT
    *_, done = reply.closing_events()
    assert isinstance(done, DoneEvent) and done.reason == "max_tokens" and done.n_new_tokens == 4


def test_the_batch_is_dropped_when_the_last_user_has_left_and_after_a_failed_step(model):
    batch = BatchLifecycle(CFG, ByteTokenizer(CFG.vocab_size), "cpu", None)
    batch.user_workload = short_workload()
    settings = replace(GREEDY, users=2)
    server = batch.ensure(model, settings, ROOF)
    assert batch.ensure(model, settings, ROOF) is server
    batch.step(0)
    batch.end_if_done(settings)
    assert batch.server is server  # users on: it stays
    batch.sync(model, replace(settings, users=0), ROOF)
    for i in range(200):
        batch.step(i + 1)
        batch.end_if_done(replace(settings, users=0))
        if batch.server is None:
            break
    assert batch.server is None and batch.next_user_id > 1_000_000  # ids go on where they stopped
    batch.ensure(model, settings, ROOF)
    batch.server.step = lambda step: 1 / 0
    with pytest.raises(ZeroDivisionError):
        batch.step(0)
    assert batch.server is None
    assert batch_label(settings).endswith("2 users continuous")
    assert batch_label(replace(settings, users=0)).endswith(" · leaving users' last requests, batched")
    leaving = batch_label(replace(settings, users=0, speculate="ngram", draft_tokens=4))  # the chat speculates
    assert "spec" not in leaving and leaving.endswith("last requests, batched")  # the batch does not


def test_a_reply_counts_its_first_token_time_and_ends_on_eos_budget_or_context():
    reply = Reply([1, 2, 3], 2, ByteTokenizer(CFG.vocab_size).stream(), frozenset({0}))
    assert reply.end_reason(False, 10) == ""
    event = reply.add_token(72, time.perf_counter())
    assert event.token_id == 72 and event.index == 0 and reply.ttft_s > 0
    assert reply.end_reason(True, 10) == "stopped" and reply.end_reason(False, 4) == "context_full"
    assert reply.add_token(0, time.perf_counter()) is None and reply.reason == "eos"
    assert reply.end_reason(False, 10) == "max_tokens"
    *_, done = reply.closing_events()
    assert done.reason == "eos" and done.n_prompt_tokens == 3 and done.n_new_tokens == 2 and done.text == event.text != ""


def test_the_counter_timer_and_helpers():
    counter = StepCounter()
    counter.advance()
    assert counter.value == 1
    timer = StepTimer("cpu")
    timer.start()
    time.sleep(0.01)
    assert 0.005 < timer.stop() < 5
    assert elem_bytes(torch.bfloat16) == 2 and elem_bytes(torch.float32) == 4
    assert make_generator(None, "cpu") is None
    a, b = make_generator(3, "cpu"), make_generator(3, "cpu")
    assert torch.rand(2, generator=a).tolist() == torch.rand(2, generator=b).tolist()
    check_prompt_length(9, 10)
    with pytest.raises(PromptError, match="context window is 10"):
        check_prompt_length(10, 10)
