"""The default model through the C++ step at every vector level this machine runs (AVX-512, AVX2,
scalar): greedy fp32 tokens unchanged (PyTorch's step's, which tests/engine/test_default_model.py
holds to transformers'), and perplexity measured token by token through the C++ step within the
bounds the weights sweep holds (int8 within 1% of fp32, int4 within 10%)."""
import contextlib
import math

import pytest
import torch

from engine.context import EngineContext
from engine.engine import Engine
from engine.kv.cache import ContiguousKVCache
from engine.model import cpu_step
from engine.model.quality import evaluation_ids
from engine.settings import SamplingParams, Settings
from kernels import cpu_decode
from tests.kernels.test_cpu_decode import LEVELS

PROMPT = "Write a short story about a lighthouse keeper who finds a message in a bottle."
GREEDY_TOKENS = 24
EVAL_TOKENS = 96


@pytest.fixture(scope="module")
def engine():
    settings = Settings(dtype="fp32", max_new_tokens=GREEDY_TOKENS, sampling=SamplingParams(greedy=True, temperature=0.0))
    return Engine("default", device="cpu", settings=settings, max_context=512)


@contextlib.contextmanager
def at_level(isa: str, monkeypatch, *models):
    """The models run the C++ step built at `isa` meanwhile: bound to a context whose options read it
    (the engine's own context keeps its level), then given back to their engine's."""
    monkeypatch.setenv(cpu_decode.ISA_VARIABLE, isa)
    context = EngineContext()
    before = [m.context for m in models]
    for m in models:
        m.bind(context)
    try:
        yield context
    finally:
        for m, c in zip(models, before):
            m.bind(c)


@torch.inference_mode()
def greedy(model, prompt_ids: list[int], n: int) -> list[int]:
    cache = ContiguousKVCache(model.cfg, 1, len(prompt_ids) + n + 1, model.dtype, "cpu")
    with cpu_step.pytorch_only():  # the same prompt for every level: PyTorch's prefill
        logits = model(torch.tensor([prompt_ids]), 0, cache)[0, -1]
    out = []
    for _ in range(n):
        out.append(int(logits.argmax()))
        logits = model(torch.tensor([[out[-1]]]), cache.length, cache)[0, -1]
    return out


@torch.inference_mode()
def stepwise_perplexity(model, ids: list[int]) -> float:
    """exp(mean cross-entropy) of ids[1:], each predicted by a one-token step (the decode path)."""
    cache = ContiguousKVCache(model.cfg, 1, len(ids), model.dtype, "cpu")
    nll = 0.0
    for pos, token in enumerate(ids[:-1]):
        logits = model(torch.tensor([[token]]), pos, cache)[0, -1]
        nll -= torch.log_softmax(logits.double(), -1)[ids[pos + 1]].item()
    return math.exp(nll / (len(ids) - 1))


@pytest.mark.parametrize("isa", LEVELS)
def test_greedy_fp32_tokens_are_unchanged_at_every_level(engine, isa, monkeypatch):
    prompt_ids = engine.tokenizer.encode(engine.tokenizer.render_chat([{"role": "user", "content": PROMPT}]))
    with cpu_step.pytorch_only():
        want = greedy(engine.model, prompt_ids, GREEDY_TOKENS)
    from engine import dispatch
    before = dispatch.counts()
    with at_level(isa, monkeypatch, engine.model) as context:
        got = greedy(engine.model, prompt_ids, GREEDY_TOKENS)
        assert context.cpu_step.plans[engine.model].lib.isa == cpu_decode.load(isa).isa
    assert dispatch.since(before)["decode step"] == {cpu_step.STEP_LABEL: GREEDY_TOKENS}
    assert got == want


@pytest.mark.parametrize("isa", LEVELS)
def test_perplexity_through_the_cpp_step_holds_its_bounds_at_every_level(engine, isa, monkeypatch):
    ids = evaluation_ids(engine.tokenizer, EVAL_TOKENS)
    with cpu_step.pytorch_only():
        pytorch_fp = stepwise_perplexity(engine.model, ids)
    models = {w: engine.model_for(Settings(dtype="fp32", weights=w)) for w in ("fp", "int8", "int4")}
    with at_level(isa, monkeypatch, *models.values()):
        ppl = {w: stepwise_perplexity(model, ids) for w, model in models.items()}
    assert abs(ppl["fp"] / pytorch_fp - 1) < 1e-3, (ppl, pytorch_fp)
    assert ppl["int8"] <= 1.01 * ppl["fp"] and ppl["int4"] <= 1.10 * ppl["fp"], ppl
