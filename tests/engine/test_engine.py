"""The engine loop on a tiny random model: multi-turn cache reuse, settings between steps,
stop, and bad input."""
import threading
from dataclasses import replace

import pytest
import torch

from engine.engine import Engine
from engine.events import DoneEvent, SettingsApplied, TokenEvent
from engine.hardware.spec import DeviceSpec
from engine.io.byte_tokenizer import ByteTokenizer
from engine.io.loader import LoadedWeights, synthetic_weights
from engine.metrics import StepMetrics
from engine.model.config import ModelConfig
from engine.settings import EngineError, PromptError, SamplingError, SamplingParams, Settings

CFG = ModelConfig(name="tiny", dim=64, n_layers=2, n_heads=4, n_kv_heads=2, ffn_dim=128, vocab_size=256,
                  tied_embeddings=True, max_seq_len=200)
GREEDY = Settings(dtype="fp32", max_new_tokens=12, sampling=SamplingParams(greedy=True, temperature=0.0))


def fake_cpu() -> DeviceSpec:
    return DeviceSpec(name="test cpu", kind="cpu", peak_bandwidth_gbs=20.0, peak_flops={"fp32": 1e11, "bf16": 1e11},
                      spec_bandwidth_gbs=None, measured_bandwidth_gbs=20.0, measured_flops={"fp32": 1e11},
                      memory_total_bytes=None, source="CPU — measured bandwidth", nvml=False)


def make_engine(settings=GREEDY, seed=0, context=None) -> Engine:
    w = synthetic_weights(CFG, torch.float32, "cpu", seed=seed)
    w = {k: (v * 20 if "norm" not in k else v) for k, v in w.items()}  # sharper logits: fewer near-ties
    loaded = LoadedWeights(CFG, w, ByteTokenizer(CFG.vocab_size), "synthetic", "tiny", "fp32")
    return Engine(loaded, device="cpu", hardware=fake_cpu(), settings=settings, context=context)


def run(events):
    events = list(events)
    tokens = [e.token_id for e in events if isinstance(e, TokenEvent) and e.token_id >= 0]
    steps = [e for e in events if isinstance(e, StepMetrics)]
    done = [e for e in events if isinstance(e, DoneEvent)]
    assert len(done) == 1
    return tokens, steps, done[0], events


def test_second_turn_prefills_only_the_new_part_and_answers_as_a_fresh_engine_would():
    eng = make_engine()
    _, steps1, done1, _ = run(eng.chat("hello there"))
    assert steps1[0].phase == "prefill" and steps1[0].context_len == 0
    tokens2, steps2, done2, _ = run(eng.chat("and again"))
    first_turn_len = done1.n_prompt_tokens
    # the second prompt repeats the first turn: only what follows the cached part runs
    assert steps2[0].context_len >= first_turn_len
    assert done1.n_cached_tokens == 0 and done2.n_cached_tokens == steps2[0].context_len  # what the footer says
    assert f"({done2.n_cached_tokens:,} of {done2.n_prompt_tokens:,} prompt tokens cached)" in done2.ttft_note
    assert "cached" not in done1.ttft_note
    assert steps2[0].new_tokens < done2.n_prompt_tokens - first_turn_len + done1.n_new_tokens + 2
    fresh = make_engine()
    fresh.messages = list(eng.messages[:-2])  # the same conversation, nothing cached
    tokens_fresh, steps_fresh, _, _ = run(fresh.chat("and again"))
    assert steps_fresh[0].context_len == 0
    assert tokens2 == tokens_fresh


def test_an_engine_makes_its_kv_cache_when_made_or_leaves_it_to_the_first_reply(monkeypatch):
    engine = make_engine()
    cache = engine.plain.cache
    assert cache is not None and cache.layout == "contiguous" and engine.plain.cached_ids == []
    from engine.steps.plain import PlainSteps
    made = PlainSteps.new_cache

    def no_room(self, layout, dtype):
        raise RuntimeError("DefaultCPUAllocator: can't allocate memory")

    monkeypatch.setattr(PlainSteps, "new_cache", no_room)
    engine = make_engine()  # (no room now: made anyway)
    assert engine.plain.cache is None
    monkeypatch.setattr(PlainSteps, "new_cache", made)
    tokens = run(engine.generate(list(range(1, 9)), max_new_tokens=3, ignore_eos=True))[0]
    assert len(tokens) == 3 and engine.plain.cache is not None


def test_kv_cache_off_recomputes_the_context_and_gives_the_same_tokens():
    on = make_engine()
    tokens_on, steps_on, _, _ = run(on.generate(list(range(1, 20))))
    off = make_engine(Settings(dtype="fp32", kv_cache=False, max_new_tokens=12, sampling=GREEDY.sampling))
    tokens_off, steps_off, _, _ = run(off.generate(list(range(1, 20))))
    assert tokens_on == tokens_off
    assert [s.new_tokens for s in steps_on[1:]] == [1] * (len(steps_on) - 1)
    assert [s.new_tokens for s in steps_off] == list(range(19, 19 + len(steps_off)))
    assert all(s.kv_bytes == 0 for s in steps_off)
    assert steps_on[-1].kv_read_bytes > 0


def test_settings_change_mid_reply_takes_effect_at_the_next_step():
    eng = make_engine()
    baseline, _, _, _ = run(make_engine().generate(list(range(1, 20))))
    gen = eng.generate(list(range(1, 20)))
    events = []
    for event in gen:
        events.append(event)
        if isinstance(event, TokenEvent) and event.index == 3:
            eng.apply(Settings(dtype="fp32", kv_cache=False, max_new_tokens=12, sampling=GREEDY.sampling))
    applied = [e for e in events if isinstance(e, SettingsApplied)]
    assert len(applied) == 1 and applied[0].changes == ("kv cache off",)
    steps = [e for e in events if isinstance(e, StepMetrics)]
    after = events.index(applied[0])
    later_steps = [e for e in events[after:] if isinstance(e, StepMetrics)]
    assert later_steps and all(s.kv_bytes == 0 and s.context_len == 0 for s in later_steps)
    assert all(s.kv_write_bytes > 0 for s in steps[:4])
    tokens = [e.token_id for e in events if isinstance(e, TokenEvent)]
    assert tokens == baseline  # same maths either way
    # and back on: the K/V cached before the switch (the prompt and the first 3 tokens fed) are
    # reused, one prefill-sized step catches up the rest, then decoding goes one token at a time
    eng.apply(GREEDY)
    prompt2 = list(range(1, 20)) + tokens + [7]
    tokens2, steps2, done2, _ = run(eng.generate(prompt2))
    assert (steps2[0].phase, steps2[0].context_len) == ("prefill", 19 + 3)
    assert steps2[0].new_tokens == len(prompt2) - 22 and steps2[0].kv_write_bytes > 0
    decodes = [(s.new_tokens, s.context_len) for s in steps2[1:]]
    assert decodes == [(1, len(prompt2) + i) for i in range(len(steps2) - 1)]
    assert done2.n_cached_tokens == 22
    fresh_tokens, _, _, _ = run(make_engine().generate(prompt2))
    assert tokens2 == fresh_tokens  # the caught-up cache holds the same K/V as a fresh prefill


def test_dtype_switch_mid_reply_keeps_generating():
    eng = make_engine()
    events = []
    for event in eng.generate(list(range(1, 20))):
        events.append(event)
        if isinstance(event, TokenEvent) and event.index == 2:
            eng.apply(Settings(dtype="bf16", max_new_tokens=12, sampling=GREEDY.sampling))
    steps = [e for e in events if isinstance(e, StepMetrics)]
    assert len(steps) == 12
    assert steps[-1].settings_label.startswith("bf16")
    assert steps[-1].weight_bytes < steps[0].weight_bytes * 0.6  # half the bytes per weight
    assert eng.model.dtype == torch.bfloat16


def test_stop_from_another_thread_ends_the_reply():
    eng = make_engine(Settings(dtype="fp32", max_new_tokens=150, sampling=GREEDY.sampling))
    seen = []
    for event in eng.generate([1, 2, 3]):
        seen.append(event)
        if isinstance(event, TokenEvent) and event.index == 5:
            t = threading.Thread(target=eng.stop)
            t.start()
            t.join()
    done = seen[-1]
    assert isinstance(done, DoneEvent) and done.reason == "stopped" and done.n_new_tokens == 6


def test_reply_stops_at_eos():
    eng = make_engine()
    tokens, _, _, _ = run(make_engine().generate([5, 6, 7]))
    eng.tokenizer.eos_ids = {tokens[3]}
    _, steps, done, _ = run(eng.generate([5, 6, 7]))
    assert done.reason == "eos" and done.n_new_tokens == 4


def test_context_window_fills_up_cleanly():
    eng = make_engine(Settings(dtype="fp32", max_new_tokens=100, sampling=GREEDY.sampling))
    _, _, done, _ = run(eng.generate(list(range(150))))
    assert done.reason == "context_full" and done.n_prompt_tokens + done.n_new_tokens == CFG.max_seq_len


def test_bad_input_is_refused_and_the_conversation_is_kept():
    eng = make_engine()
    run(eng.chat("first"))
    kept = list(eng.messages)
    with pytest.raises(PromptError, match="empty prompt"):
        list(eng.chat("   "))
    with pytest.raises(PromptError, match="context window"):
        list(eng.chat("x" * 500))
    assert eng.messages == kept
    with pytest.raises(SamplingError, match="top-p"):
        eng.apply(Settings(sampling=SamplingParams(top_p=1.5)))
    with pytest.raises(SamplingError, match="temperature"):
        eng.apply(Settings(sampling=SamplingParams(temperature=-1)))
    with pytest.raises(EngineError, match="fp16"):
        eng.apply(Settings(dtype="fp16"))
    with pytest.raises(EngineError, match="max new tokens"):
        eng.apply(Settings(max_new_tokens=0))
    tokens, _, _, _ = run(eng.chat("second"))
    assert len(eng.messages) == 4


def test_seeded_sampling_is_reproducible():
    s = Settings(dtype="fp32", max_new_tokens=10, sampling=SamplingParams(temperature=1.0, top_p=0.9, seed=123))
    a, _, _, _ = run(make_engine(s).generate([1, 2, 3]))
    b, _, _, _ = run(make_engine(s).generate([1, 2, 3]))
    assert a == b


def test_a_step_above_the_measured_roof_is_shown_as_such_never_absorbed_into_the_peak():
    # the app's engine once raised a CPU's peaks to the best step seen, so MBU and MFU were <= 100% by
    # construction and an over-count (or a probe that read low) silently became the roof
    low = replace(fake_cpu(), peak_flops={"fp32": 1e3}, measured_flops={"fp32": 1e3},
                  peak_bandwidth_gbs=1e-6, measured_bandwidth_gbs=1e-6)
    for kind in ("cpu", "cuda"):  # the same on a GPU's datasheet
        eng = make_engine()
        eng.hardware = replace(low, kind=kind)
        _, steps, _, _ = run(eng.chat("hello there"))
        assert eng.hardware == replace(low, kind=kind)  # the roof stays as measured
        assert all(s.peak_bandwidth_bps == 1e3 and s.peak_flops == 1e3 for s in steps)
        assert all(s.above_roof and s.mbu > 1.0 and s.to_dict()["above_roof"] for s in steps)


def test_a_step_under_its_roof_is_not_above_it():
    """The tiny model's ~0.4 MB a step fit the cache: its C++ steps read them faster than the fake
    machine's memory roof (20 GB/s), as on a real one, where the measured cache roof is theirs."""
    eng = make_engine()
    eng.hardware = replace(eng.hardware, cache_bandwidth_gbs=2000.0, cache_bytes=32 << 20)
    _, steps, _, _ = run(eng.chat("hello there"))
    assert steps and all(s.roof == "cache" for s in steps) and not any(s.above_roof for s in steps)


@pytest.mark.parametrize("how", [dict(), dict(sampling=SamplingParams(temperature=1.0, seed=3)),
                                 dict(speculate="ngram", draft_tokens=4), dict(speculate="oracle", draft_tokens=4),
                                 dict(speculate="draft", draft_weights="int8", draft_tokens=3),
                                 dict(users=2, kv_layout="paged")],
                         ids=["greedy", "sampled", "lookup", "oracle", "draft", "batched"])
def test_masked_tokens_are_never_sampled_on_any_path(how):
    """Keep-decoding's special tokens: masked ids never come out, whichever path runs the step
    (plain, a speculative verify step, the person's row in a batch)."""
    settings = replace(GREEDY, max_new_tokens=40, **how)
    prompt = list(range(30, 60))
    tokens, _, done, _ = run(make_engine(settings).generate(prompt, ignore_eos=True))
    common = sorted(set(tokens), key=tokens.count, reverse=True)[:4]  # what the reply says most
    assert done.n_new_tokens == 40 and tokens.count(common[0]) >= 2
    masked, _, done, _ = run(make_engine(settings).generate(prompt, ignore_eos=True, masked_ids=frozenset(common)))
    assert done.n_new_tokens == 40 and not set(masked) & set(common)


def test_a_model_no_int4_group_fits_chats_at_fp32_with_int4_refused_and_why(tmp_path):
    """intermediate_size 200: no INT4 group (32, 64, 128) divides w_down's inputs. That refuses INT4
    alone; the group size is not in use at fp weights, so the model loads and chats."""
    from model_files import save_hf_folder, tiny_llama

    folder = save_hf_folder(tiny_llama(intermediate_size=200), tmp_path / "ffn200")
    eng = Engine(str(folder), device="cpu", hardware=fake_cpu(), settings=GREEDY)
    tokens, _, done, _ = run(eng.chat("hello"))
    assert done.n_new_tokens == len(tokens) > 0
    caps, running = eng.capabilities(), eng.settings
    assert caps.refusal(running) == "" and caps.refusal(replace(running, group_size=64)) == ""
    reason = caps.refusal(replace(running, weights="int4"))
    assert reason == "int4 group size 32 does not divide w_down (ffn_dim) = 200 of ffn200: this model cannot run int4"
    assert caps.refusal(replace(running, weights="int8")) == ""
    with pytest.raises(EngineError, match="cannot run int4"):
        eng.apply(replace(running, weights="int4"))
