"""The captured decode step with the real torch.compile (Inductor's CPU backend, g++): one compile for
the engine's model and cache, made at load by the graph check, and none while a reply grows past
1024 positions (the old step compiled the model again at every 1024-position bucket); every decode
step of the reply runs the compiled step, its tokens those of eager decoding; and the compiled code
writes the cache in place (Inductor copied a whole layer's buffer in and out around an index_copy_
into it, every step). A tiny model, so the one compile costs seconds; Inductor's cache is a fresh
folder, so the compile is a real one."""
import re
from dataclasses import replace

import pytest
import torch
from torch._dynamo.utils import counters

from engine.engine import Engine
from engine.graphs import GraphDecoder
from engine.io.byte_tokenizer import ByteTokenizer
from engine.io.loader import LoadedWeights, synthetic_weights
from engine.kernel_checks import check_graphs
from engine.metrics import StepMetrics
from engine.model.config import ModelConfig
from engine.settings import SamplingParams, Settings

CFG = ModelConfig(name="tiny", dim=32, n_layers=2, n_heads=4, n_kv_heads=2, ffn_dim=64, vocab_size=97,
                  tied_embeddings=True, max_seq_len=1100)
PROMPT = 1012  # the reply's 24 decode steps cross position 1024
NEW_TOKENS = 24
GREEDY = Settings(max_new_tokens=NEW_TOKENS, sampling=SamplingParams(greedy=True, temperature=0.0))


def loaded() -> LoadedWeights:
    w = synthetic_weights(CFG, torch.float32, "cpu", seed=3)  # scaled up: sharp logits, no near-ties
    return LoadedWeights(CFG, {k: v * 20 if "norm" not in k else v for k, v in w.items()},
                         ByteTokenizer(CFG.vocab_size), "synthetic", CFG.name, "fp32")


def reply(engine: Engine) -> tuple[list[int], list[StepMetrics]]:
    prompt = [(7 * i) % (CFG.vocab_size - 1) + 1 for i in range(PROMPT)]
    events = list(engine.generate(prompt, ignore_eos=True))
    tokens = [e.token_id for e in events if getattr(e, "token_id", -1) >= 0]
    return tokens, [e for e in events if isinstance(e, StepMetrics) and e.phase == "decode"]


@pytest.fixture(scope="module")
def compiled_run(tmp_path_factory):
    """An engine whose decode steps are compiled (as the overhead sweep makes one on a CPU): the
    graph check at load, then one reply. The generated code of the compile is kept."""
    from torch._inductor import config as inductor_config
    from torch._inductor.utils import run_and_get_code

    # inductor's own patch, not monkeypatch: monkeypatch's undo deletes a config entry (the entry is then
    # hidden, and a second set-up of this fixture, as a random order makes, finds no compile_threads)
    with pytest.MonkeyPatch.context() as mp, inductor_config.patch(compile_threads=1):  # no compile workers
        mp.setenv("TORCHINDUCTOR_CACHE_DIR", str(tmp_path_factory.mktemp("inductor")))
        torch._dynamo.reset()
        engine = Engine(loaded(), device="cpu", settings=GREEDY)
        engine.graphs = GraphDecoder("cpu", cpu_compile=True)
        engine.apply(replace(GREEDY, cuda_graphs=True))
        engine.take_settings(wait=True)
        graphs_before = counters["stats"]["unique_graphs"]
        problem, code = run_and_get_code(lambda: check_graphs(engine))
        at_load = counters["stats"]["unique_graphs"] - graphs_before
        tokens, steps = reply(engine)
        in_reply = counters["stats"]["unique_graphs"] - graphs_before - at_load
    return engine, problem, at_load, in_reply, tokens, steps, "\n".join(code)


def test_one_compile_at_load_and_none_across_the_bucket_boundary(compiled_run):
    engine, problem, at_load, in_reply, tokens, steps, _ = compiled_run
    assert problem == "" and not engine.graphs.unavailable
    assert at_load == 1 and engine.graphs.captures == 1 and engine.graphs.capture_s > 0
    assert in_reply == 0 and engine.graphs.compiles == 1  # the 1024 boundary crossed mid-reply: no compile
    assert steps[0].context_len < 1024 <= steps[-1].context_len and len(steps) == NEW_TOKENS - 1
    assert all(s.captured for s in steps)
    assert engine.graphs.replays == len(steps)  # the check's calls are not counted as the reply's


def test_the_compiled_reply_is_the_eager_one(compiled_run):
    tokens, steps = compiled_run[4], compiled_run[5]
    eager = Engine(loaded(), device="cpu", settings=replace(GREEDY, cuda_graphs=False))
    want, eager_steps = reply(eager)
    assert tokens == want and not any(s.captured for s in eager_steps)
    # the cost model charges the compiled step what eager reads: the live keys (the op slices them)
    assert [s.kv_read_bytes for s in steps] == [s.kv_read_bytes for s in eager_steps]


def test_the_compiled_step_writes_the_cache_in_place(compiled_run):
    code = compiled_run[6]
    assert "membound.cache_write" in code and "membound.decode_attention" in code
    layer_buffer = CFG.n_kv_heads * CFG.max_seq_len * CFG.head_dim  # one layer's K (or V) buffer, elements
    loops = {int(n) for n in re.findall(r"static_cast<int64_t>\((\d+)L\)", code)}
    assert not {n for n in loops if n >= layer_buffer}, "a loop runs over a whole cache buffer: a per-step copy"


def test_the_fixture_leaves_inductor_s_config_as_it_found_it(compiled_run):
    """Set up again (a random order tears module fixtures down between a module's tests), the fixture must
    find inductor's config whole: monkeypatch's undo hid `compile_threads` for the rest of the process."""
    from torch._inductor import config as inductor_config

    assert isinstance(inductor_config.compile_threads, int)
