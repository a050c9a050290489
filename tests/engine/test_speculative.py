"""Speculative decoding: greedy output token-for-token identical to plain decoding for every draft
source, KV layout, weights setting and attention backend; the rejection rule keeps the target's
distribution (and a biased rule is caught); random accept/reject patterns leave no KV position or
block behind; the verify step's figures."""
import math
from dataclasses import replace

import pytest
import torch
from hypothesis import HealthCheck, given, settings as hyp_settings, strategies as st
from test_engine import CFG as SHORT_CFG
from test_engine import fake_cpu, run

from engine.engine import Engine
from engine.events import SettingsApplied, SettingsRefused, TokenEvent
from engine.io.byte_tokenizer import ByteTokenizer
from engine.io.loader import LoadedWeights, synthetic_weights
from engine.metrics import StepMetrics, decode_rate
from engine.serving import speculative
from engine.serving.speculative import Draft, PromptLookup, lookup, verify
from engine.settings import EngineError, SamplingParams, Settings

CFG = SHORT_CFG.with_max_seq_len(400)
GREEDY = Settings(dtype="fp32", max_new_tokens=16, sampling=SamplingParams(greedy=True, temperature=0.0))
# the prompt repeats itself and holds most of the vocabulary, so prompt lookup always finds a match
PROMPT = [5, 6, 7, 8, 9, 10, 11, 12, 40, 41, 42, 43] * 3 + list(range(60, 256)) + [5, 6, 7]


def make_engine(settings=GREEDY, seed=0) -> Engine:
    """test_engine's tiny model (sharpened logits: few near-ties) with room for a long prompt."""
    w = synthetic_weights(CFG, torch.float32, "cpu", seed=seed)
    w = {k: (v * 20 if "norm" not in k else v) for k, v in w.items()}
    loaded = LoadedWeights(CFG, w, ByteTokenizer(CFG.vocab_size), "synthetic", "tiny", "fp32")
    return Engine(loaded, device="cpu", hardware=fake_cpu(), settings=settings)


def tokens_of(engine, prompt=PROMPT):
    tokens, steps, done, _ = run(engine.generate(prompt))
    return tokens, steps, done


_ENGINES: dict = {}  # one engine per weights setting (its quantised copy made once), switched by apply()
_REFERENCE: dict = {}


def engine_with(settings: Settings):
    if settings.weights not in _ENGINES:
        _ENGINES[settings.weights] = make_engine(replace(GREEDY, weights=settings.weights))
    eng = _ENGINES[settings.weights]
    eng.apply(settings)
    eng.take_settings(wait=True)
    eng.reset()
    return eng


def reference(settings: Settings) -> list[int]:
    """Plain greedy decoding with the same layout, weights and attention."""
    key = (settings.kv_layout, settings.weights, settings.attention)
    if key not in _REFERENCE:
        _REFERENCE[key] = tokens_of(engine_with(replace(settings, speculate="off")))[0]
    return _REFERENCE[key]


@pytest.mark.parametrize("attention", ["flash", "naive"])
@pytest.mark.parametrize("weights", ["fp", "int8", "int4"])
@pytest.mark.parametrize("layout", ["contiguous", "paged", "off"])
@pytest.mark.parametrize("source", ["ngram", "draft", "oracle"])
def test_greedy_speculation_gives_the_plain_tokens(source, layout, weights, attention):
    settings = replace(GREEDY, kv_layout=layout, weights=weights, attention=attention, speculate=source,
                       draft_tokens=4, draft_weights="int4" if weights == "fp" else "fp")
    expected = reference(settings)
    tokens, steps, done = tokens_of(engine_with(settings))
    assert tokens == expected
    verify_steps = [s for s in steps if s.phase == "verify"]
    assert verify_steps, "no speculative step ran"
    assert sum(s.tokens_out for s in steps) == done.n_new_tokens == len(tokens)
    assert all(s.new_tokens == s.draft_tokens + 1 or layout == "off" for s in verify_steps)
    if source == "oracle":  # every guess right: k + 1 tokens a step
        assert all(s.accepted_tokens == s.draft_tokens for s in verify_steps)
    assert (source == "draft") == any(s.phase == "draft" for s in steps)


def test_an_accepted_guess_is_marked_and_the_draft_has_its_own_step():
    eng = make_engine(replace(GREEDY, speculate="draft", draft_weights="int4"))
    events = list(eng.generate(PROMPT))
    steps = [e for e in events if isinstance(e, StepMetrics)]
    tokens = [e for e in events if isinstance(e, TokenEvent)]
    drafts = [s for s in steps if s.phase == "draft"]
    verifies = [s for s in steps if s.phase == "verify"]
    assert len(drafts) == len(verifies) and all(d.tokens_out == 0 and d.draft_tokens >= 1 for d in drafts)
    # the draft is the model at int4: its step reads fewer weight bytes per forward than the target's
    assert drafts[0].weight_bytes / drafts[0].draft_tokens < verifies[0].weight_bytes
    assert sum(t.drafted for t in tokens) == sum(s.accepted_tokens for s in verifies) > 0
    assert not tokens[0].drafted  # the prefill's token is the target's own
    assert [s.step for s in steps] == sorted({s.step for s in steps})


def test_verify_step_figures():
    eng = make_engine(replace(GREEDY, speculate="oracle", draft_tokens=4))
    _, steps, done = tokens_of(eng)
    step = next(s for s in steps if s.phase == "verify")
    plain = next(s for s in tokens_of(make_engine(GREEDY))[1] if s.phase == "decode")
    assert (step.new_tokens, step.draft_tokens, step.accepted_tokens, step.tokens_out) == (5, 4, 4, 5)
    assert step.acceptance_rate == 1.0 and math.isnan(plain.acceptance_rate)
    assert step.tokens_per_weight_read == 5 and plain.tokens_per_weight_read == 1
    assert step.weight_bytes == plain.weight_bytes  # one read of the weights for five tokens
    assert step.bytes_per_token < plain.bytes_per_token / 3
    assert step.tokens_per_s == pytest.approx(5 / step.step_s)
    assert step.overhead_s == pytest.approx(max(0.0, step.step_s - step.total_bytes / step.peak_bandwidth_bps))
    assert decode_rate(steps) == pytest.approx((done.n_new_tokens - 1) / sum(s.step_s for s in steps[1:]))


def test_sampled_speculation_is_reproducible_with_a_seed_and_ends_within_budget():
    s = replace(GREEDY, sampling=SamplingParams(temperature=1.0, top_p=0.9, seed=7), speculate="draft",
                draft_weights="int8", max_new_tokens=20)
    a, steps, done = tokens_of(engine_with(s))
    b, _, _ = tokens_of(engine_with(s))
    assert a == b and len(a) == done.n_new_tokens == 20
    assert any(st_.phase == "verify" for st_ in steps)


def test_speculation_switches_mid_reply_and_stays_lossless():
    eng = make_engine(GREEDY)
    events = []
    for event in eng.generate(PROMPT):
        events.append(event)
        if isinstance(event, TokenEvent) and event.index == 3:
            eng.apply(replace(GREEDY, speculate="ngram", draft_tokens=3))
        if isinstance(event, TokenEvent) and event.index == 12:
            eng.apply(replace(GREEDY, speculate="oracle", draft_tokens=5))
    applied = [e.changes for e in events if isinstance(e, SettingsApplied)]
    assert applied == [("speculation prompt lookup k3",), ("speculation oracle (upper bound) k5",)]
    tokens = [e.token_id for e in events if isinstance(e, TokenEvent)]
    assert tokens == reference(GREEDY)


def test_speculation_with_simulated_users_is_refused_in_one_line():
    with pytest.raises(EngineError, match="speculative decoding runs on the chat alone") as error:
        Settings(users=2, kv_layout="paged", speculate="ngram").validate()
    assert "\n" not in str(error.value)
    eng = make_engine(GREEDY)
    with pytest.raises(EngineError, match="set simulated users to 0"):
        eng.apply(replace(GREEDY, speculate="ngram", users=1))
    for bad, match in ((dict(draft_tokens=0), "draft tokens"), (dict(draft_tokens=9), "draft tokens"),
                       (dict(speculate="magic"), "speculation must be"), (dict(draft_weights="int2"), "draft weights")):
        with pytest.raises(EngineError, match=match):
            eng.apply(replace(GREEDY, **bad))


def test_a_draft_with_another_vocabulary_is_refused(tmp_path):
    from test_loader import save_hf_folder

    from engine.model.config import ModelConfig
    other = ModelConfig(name="other", dim=64, n_layers=1, n_heads=4, n_kv_heads=2, ffn_dim=128, vocab_size=300,
                        tied_embeddings=False, max_seq_len=128)
    save_hf_folder(tmp_path, other, synthetic_weights(other, torch.float32, "cpu"))
    eng = make_engine(GREEDY)
    eng.apply(replace(GREEDY, speculate="draft", draft_model=str(tmp_path), draft_weights="fp"), request_id=5)
    answers = eng.take_settings(wait=True)
    assert len(answers) == 1 and isinstance(answers[0], SettingsRefused)
    assert "another vocabulary" in answers[0].reason and answers[0].settings.speculate == "off"
    # a synthetic draft takes the target's vocabulary: a speed run's guesser
    eng.apply(replace(GREEDY, speculate="draft", draft_model="synthetic:smollm2-135m", draft_weights="fp"))
    # (a 30-layer random model is too slow for a unit test: its loading alone is checked)
    assert isinstance(eng.take_settings(wait=True)[0], SettingsApplied)
    assert eng.speculative.draft.model.cfg.vocab_size == CFG.vocab_size and eng.speculative.draft.model.cfg.n_layers == 30


# ---- KV rollback under random accept/reject patterns -------------------------------------------
class Scripted:
    """A draft source that guesses `right` tokens of the true continuation, then wrong ones."""

    def __init__(self, truth: list[int], patterns: list[tuple[int, int]]):
        self.truth, self.patterns, self.i = truth, patterns, 0

    def propose(self, ids, k, sampling, generator=None):
        want, right = self.patterns[self.i % len(self.patterns)]
        self.i += 1
        k = min(k, want)
        right = min(right, k)
        n = len(ids)
        guesses = self.truth[n:n + right] + [(t + 1) % CFG.vocab_size for t in self.truth[n + right:n + k]]
        return Draft(guesses[:k])


_PAIRS: dict = {}


@hyp_settings(max_examples=15, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(layout=st.sampled_from(["contiguous", "paged"]),
       patterns=st.lists(st.tuples(st.integers(1, 8), st.integers(0, 8)), min_size=1, max_size=6),
       prompt_len=st.integers(3, 40))
def test_random_accept_reject_patterns_leave_no_position_or_block_behind(layout, patterns, prompt_len):
    settings = replace(GREEDY, kv_layout=layout, draft_tokens=8)
    if layout not in _PAIRS:
        _PAIRS[layout] = (make_engine(settings), make_engine(replace(settings, speculate="ngram")))
    plain, eng = _PAIRS[layout]
    prompt = [(7 * i + 3) % CFG.vocab_size for i in range(prompt_len)]
    plain.reset()
    eng.reset()
    truth = prompt + tokens_of(plain, prompt)[0]
    eng.speculative.lookup = Scripted(truth, patterns)
    out = []
    for event in eng.generate(prompt):
        if isinstance(event, TokenEvent):
            out.append(event.token_id)
        if isinstance(event, StepMetrics) and event.phase in ("verify", "decode"):
            n = len(eng.cached_ids)
            assert eng.cached_ids == truth[:n]  # what the cache holds is the true context, nothing guessed
            assert eng.cache.length == n
            if layout == "paged":
                manager = eng.cache.manager
                assert manager.block_tables.keys() == {0}
                assert len(manager.block_tables[0]) == manager.blocks_for(n) == manager.pool.num_used
    assert prompt + out == truth


# ---- the rejection rule keeps the target's distribution ----------------------------------------
V = 4
TARGET = torch.tensor([[0.50, 0.20, 0.20, 0.10], [0.10, 0.60, 0.10, 0.20],
                       [0.25, 0.25, 0.25, 0.25], [0.70, 0.05, 0.05, 0.20]])  # p(next | last), a Markov chain
DRAFT = torch.tensor([[0.10, 0.20, 0.30, 0.40], [0.40, 0.40, 0.10, 0.10],
                      [0.70, 0.10, 0.10, 0.10], [0.25, 0.25, 0.25, 0.25]])
SAMPLED = SamplingParams(temperature=1.0, top_p=1.0)
CHI2_LIMIT = 37.7  # 15 degrees of freedom, p = 0.001


def sample_pairs(draft_kind: str, draws: int, k: int = 2, seed: int = 0, sampling=SAMPLED) -> torch.Tensor:
    """Counts of the first two tokens after token 0, decoded speculatively with the Markov chain
    TARGET as the target and guesses from DRAFT (sampled) or one-hot guesses (fixed tokens)."""
    gen = torch.Generator().manual_seed(seed)
    counts = torch.zeros(V * V)
    for _ in range(draws):
        seq = [0]
        while len(seq) < 3:
            guesses, qs, last = [], [], seq[-1]
            for _ in range(k):
                if draft_kind == "model":
                    q = DRAFT[last]
                    last = int(torch.multinomial(q, 1, generator=gen))
                    qs.append(q)
                else:  # prompt lookup's kind of guess: a token, certain
                    last = (last + 1) % V
                guesses.append(last)
            logits = TARGET[[seq[-1]] + guesses].log()
            _, tokens = verify(logits, Draft(guesses, torch.stack(qs) if qs else None), sampling, gen)
            seq += tokens
        counts[seq[1] * V + seq[2]] += 1
    return counts


def chi2(counts: torch.Tensor, target: torch.Tensor = TARGET) -> float:
    expected = (target[0][:, None] * target).flatten() * counts.sum()
    assert counts[expected == 0].sum() == 0  # top-p's dropped tokens are never drawn
    return float(((counts - expected) ** 2 / expected)[expected > 0].sum())


@pytest.fixture
def one_thread():
    """Ops on 4-element tensors: a second thread only adds a handover (milliseconds on a busy machine)."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


@pytest.mark.parametrize("draft_kind", ["model", "one-hot"])
def test_sampled_speculation_has_the_targets_distribution_and_a_biased_rule_fails(draft_kind, monkeypatch,
                                                                                    one_thread):
    assert chi2(sample_pairs(draft_kind, 2000)) < CHI2_LIMIT
    # the classic mistake: after a rejection, resample from p itself instead of (p - q)+
    monkeypatch.setattr(speculative, "residual_distribution", lambda p, q: p)
    assert chi2(sample_pairs(draft_kind, 2000)) > 3 * CHI2_LIMIT


# top-p 0.75 keeps tokens {0, 1, 2}, {1, 3}, {0, 1, 2} (a four-way tie: the lowest ids), {0, 3}
TOP_P_TARGET = torch.tensor([[5 / 9, 2 / 9, 2 / 9, 0], [0, 0.75, 0, 0.25], [1 / 3, 1 / 3, 1 / 3, 0],
                             [7 / 9, 0, 0, 2 / 9]])
CHI2_LIMIT_TOP_P = 24.3  # 8 cells reachable in two steps from token 0: 7 degrees of freedom, p = 0.001


@pytest.mark.parametrize("draft_kind", ["model", "one-hot"])
def test_sampled_speculation_with_top_p_has_the_renormalised_distribution(draft_kind, one_thread, monkeypatch):
    # the guess is accepted with the kept token's renormalised probability, not its raw softmax one (on a
    # CPU verify works over the kept tokens alone: target_rows)
    top_p = SamplingParams(temperature=1.0, top_p=0.75)
    assert torch.allclose(speculative.probabilities(TARGET.log(), top_p), TOP_P_TARGET)
    for i in range(len(TARGET)):
        ids, p = speculative.target_rows(TARGET.log(), top_p)(i)
        assert torch.allclose(torch.zeros(V, dtype=torch.float64).index_put_((ids,), p), TOP_P_TARGET[i].double())
    assert chi2(sample_pairs(draft_kind, 2000, sampling=top_p), TOP_P_TARGET) < CHI2_LIMIT_TOP_P
    monkeypatch.setattr(speculative, "residual_distribution", lambda p, q: p)  # the classic mistake fails here too
    assert chi2(sample_pairs(draft_kind, 2000, sampling=top_p), TOP_P_TARGET) > 3 * CHI2_LIMIT_TOP_P


def test_greedy_verification_accepts_while_equal_then_takes_the_targets_token():
    logits = torch.full((4, 10), -1.0)
    for row, best in enumerate([3, 5, 7, 9]):
        logits[row, best] = 1.0
    greedy = SamplingParams(greedy=True)
    assert verify(logits, Draft([3, 5, 7]), greedy) == (3, [3, 5, 7, 9])  # all right: the bonus token
    assert verify(logits, Draft([3, 6, 7]), greedy) == (1, [3, 5])
    assert verify(logits, Draft([0, 5, 7]), greedy) == (0, [3])


def test_prompt_lookup_copies_what_followed_the_latest_match():
    ids = [1, 2, 3, 4, 9, 1, 2, 3, 5, 6, 7, 8, 1, 2, 3]
    assert lookup(ids, 3) == [5, 6, 7]  # the latest "1 2 3" was followed by 5 6 7
    assert lookup(ids + [5], 2) == [6, 7]
    assert lookup([1, 2, 3], 4) == []  # nothing repeats
    assert lookup([4, 4, 4], 4) == [4]  # the match runs into the end
    assert PromptLookup().propose(ids, 2, GREEDY.sampling).tokens == [5, 6]


def test_settings_describe_speculation_and_the_oracle_says_it_is_the_upper_bound():
    from engine.settings import describe_change
    on = replace(GREEDY, speculate="draft", draft_tokens=6, draft_model="default", draft_weights="int8")
    assert on.label.endswith(" · spec draft default int8 k6")
    assert "upper bound" in replace(GREEDY, speculate="oracle").label
    assert describe_change(GREEDY, on) == ("speculation draft default int8 k6",)
    assert describe_change(on, replace(on, draft_tokens=2)) == ("speculation draft default int8 k2",)
    assert describe_change(on, GREEDY) == ("speculation off",)
    assert describe_change(GREEDY, replace(GREEDY, cuda_graphs=False)) == ("decode eager",)


def test_a_cpu_engine_runs_eager_and_its_capabilities_say_why():
    eng = make_engine(replace(GREEDY, cuda_graphs=True))
    assert eng.settings.cuda_graphs is False  # what runs: no front end shows a capture that is not there
    caps = eng.capabilities()
    assert caps.captured_step == "" and "compiled decode step measured no faster" in caps.captured_refusal
    assert "no captured decode step here" in caps.refusal(replace(GREEDY, cuda_graphs=True))
    assert caps.refusal(replace(GREEDY, cuda_graphs=False)) == ""
    eng.apply(replace(GREEDY, cuda_graphs=True, max_new_tokens=5))  # a script's default: runs eager
    assert eng.take_settings()[0].settings.cuda_graphs is False
    _, steps, _ = tokens_of(eng)
    assert not any(s.captured for s in steps)


def test_a_greedy_reply_that_parts_at_a_tie_is_named_and_a_real_change_is_not(monkeypatch):
    # (the first GPU run: oracle k=4 at bf16 parted from plain decoding, and the sweep stopped there)
    from engine.bench import speculative as sweep
    engine = engine_with(GREEDY)
    plain = reference(GREEDY)
    model = engine.model
    logits = model(torch.tensor([PROMPT + plain[:5]]), start_pos=0, cache=None, last_only=True)[0, -1]
    runner_up = int(logits.topk(2).indices[1])
    other = plain[:5] + [runner_up] + plain[6:]
    share = float(logits[plain[5]] - logits[runner_up]) / float(logits.max() - logits.min())
    assert share > sweep.TIE_SHARE["fp32"]  # sharpened logits: no tie at fp32, so a real change
    assert sweep.near_tie(model, PROMPT, plain, other) is None
    monkeypatch.setattr(sweep, "TIE_SHARE", {**sweep.TIE_SHARE, "fp32": 2 * share})  # looser rounding
    assert sweep.near_tie(model, PROMPT, plain, other) == f"token 6 of {len(plain)}, logits {share:.1e} of their spread apart"
    assert sweep.near_tie(model, PROMPT, plain, plain[:9]) is None  # a reply that stops early: no tie


def test_the_sweep_says_how_much_of_a_replys_time_its_steps_hold():
    # (the first GPU run: greedy oracle k=4 at 0.33x of plain with the same median step: the time
    # was outside the steps' median, and the table could not say where)
    from engine.bench import speculative as sweep
    eng = engine_with(GREEDY)
    tokens, steps, wall_s = sweep.measure(eng, PROMPT, 16)
    decode = [s for s in steps if s.phase in ("decode", "verify", "draft")]
    point = sweep._point(("none", 0, "greedy"), [(tokens, decode, wall_s)], [(tokens, decode, wall_s)])
    # (the tiny model's steps are ~0.1 ms: the reply loop's Python around them is a large share)
    assert 0.1 < point.in_steps <= 1.0 and point.in_steps == sum(s.step_s for s in decode) / wall_s
    assert point.slowest_step_ms == 1e3 * max(s.step_s for s in decode) >= point.target_step_ms
    stalled = sweep._point(("none", 0, "greedy"), [(tokens, decode, 3 * wall_s)], [(tokens, decode, wall_s)])
    assert stalled.in_steps == pytest.approx(point.in_steps / 3) and stalled.speedup == pytest.approx(1 / 3)
    assert "wall time in steps" in sweep.format_speculative([point])
