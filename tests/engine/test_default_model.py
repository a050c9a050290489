"""The default model (SmolLM2-135M-Instruct, Q4_1 GGUF) against transformers, which reads
the same GGUF with its own loader: greedy tokens must be identical."""
import re

import pytest
import torch

from engine.engine import Engine
from engine.events import DoneEvent, TokenEvent
from engine.io.default_model import find_default_model
from engine.settings import SamplingParams, Settings

PROMPT = "Write a short story about a lighthouse keeper who finds a message in a bottle."


@pytest.fixture(scope="module")
def engine():
    settings = Settings(dtype="fp32", max_new_tokens=40, sampling=SamplingParams(greedy=True, temperature=0.0))
    return Engine("default", device="cpu", settings=settings, max_context=1024)


@pytest.fixture(scope="module")
def hf_model():
    from transformers import AutoModelForCausalLM
    path = find_default_model()
    model = AutoModelForCausalLM.from_pretrained(path.parent, gguf_file=path.name, dtype=torch.float32)
    return model.eval()


def test_config_from_gguf_metadata(engine):
    cfg = engine.cfg
    assert (cfg.dim, cfg.n_layers, cfg.n_heads, cfg.n_kv_heads, cfg.ffn_dim, cfg.vocab_size) == \
        (576, 30, 9, 3, 1536, 49152)
    assert cfg.tied_embeddings and cfg.rope_theta == 100000.0
    assert engine.loaded.file_format == "Q4_1"


def test_greedy_tokens_identical_to_transformers(engine, hf_model):
    """Through the C++ CPU decode step (engine/model/cpu_step.py), as the app decodes on a CPU."""
    from engine import dispatch
    from engine.model.cpu_step import STEP_LABEL
    engine.reset()
    before = dispatch.counts()
    events = list(engine.chat(PROMPT))
    assert dispatch.since(before)["decode step"].get(STEP_LABEL, 0) >= 10
    ours = [e.token_id for e in events if isinstance(e, TokenEvent) and e.token_id >= 0]
    done = events[-1]
    assert isinstance(done, DoneEvent)
    prompt_ids = engine.tokenizer.encode(engine.tokenizer.render_chat([{"role": "user", "content": PROMPT}]))
    with torch.no_grad():
        out = hf_model.generate(torch.tensor([prompt_ids]), max_new_tokens=len(ours) + (done.reason == "eos"),
                                do_sample=False, pad_token_id=2)
    theirs = out[0, len(prompt_ids):].tolist()
    if done.reason == "eos":
        assert theirs[-1] in engine.tokenizer.eos_ids
        theirs = theirs[:-1]
    assert len(ours) >= 10
    assert ours == theirs
    assert "lighthouse" in done.text.lower() or "keeper" in done.text.lower()


def test_prefill_logits_close_to_transformers(engine, hf_model):
    ids = torch.tensor([engine.tokenizer.encode("The memory wall is")])
    with torch.no_grad():
        ours = engine.model(ids, last_only=False)
        theirs = hf_model(ids).logits
    torch.testing.assert_close(ours, theirs, rtol=1e-3, atol=1e-3)


def test_multi_turn_chat_reuses_the_cache(engine):
    from engine.metrics import StepMetrics
    engine.reset()
    first = list(engine.chat("Name a colour."))
    second = list(engine.chat("Name another one."))
    n1 = first[-1].n_prompt_tokens + first[-1].n_new_tokens
    prefill2 = [e for e in second if isinstance(e, StepMetrics)][0]
    assert prefill2.context_len >= n1 - 2  # the first turn is not prefilled again
    assert second[-1].n_cached_tokens == prefill2.context_len  # what the reply's footer says was reused


_SPECULATION_REFERENCE: dict = {}


@pytest.mark.parametrize("source", ["ngram", "oracle", "draft"])
def test_speculation_keeps_the_greedy_tokens(engine, source):
    """Verify steps run k + 1 tokens through the batched matmul path, plain steps one through the
    GEMV path: the reply must still be the plain one, token for token."""
    from dataclasses import replace

    from engine.metrics import StepMetrics
    prompt = "Repeat this sentence exactly: the keeper lit the lamp at dusk and put it out at dawn."
    plain = replace(engine.settings, speculate="off")
    engine.apply(plain)
    if "plain" not in _SPECULATION_REFERENCE:
        engine.reset()
        _SPECULATION_REFERENCE["plain"] = [e.token_id for e in engine.chat(prompt)
                                           if isinstance(e, TokenEvent) and e.token_id >= 0]
    expected = _SPECULATION_REFERENCE["plain"]
    engine.apply(replace(plain, speculate=source, draft_tokens=4, draft_weights="int4"))
    engine.reset()
    events = list(engine.chat(prompt))
    engine.apply(plain)
    tokens = [e.token_id for e in events if isinstance(e, TokenEvent) and e.token_id >= 0]
    verifies = [e for e in events if isinstance(e, StepMetrics) and e.phase == "verify"]
    assert tokens == expected and len(tokens) >= 10
    assert sum(v.accepted_tokens for v in verifies) >= len(tokens) // 3  # a copying reply: most guesses land


ROLE_LINE = re.compile(r"^\s*(system|user|assistant)\s*$", re.MULTILINE)


def test_keep_decoding_replies_are_prose_without_the_template_s_next_turns(engine):
    """ignore_eos (the app's keep-decoding) runs a reply to its budget; once the model would end its
    turn it used to write `<|im_end|>` and the template's next turns, role names and all ("Paris.\\n
    system\\n\\nuser\\nI'm planning…"). Special tokens are masked instead: every reply stays prose,
    and the conversation holds the real user turns between them."""
    engine.reset()
    special = set(engine.tokenizer.eos_ids) | {i for i, added in
                                               engine.tokenizer.backend.get_added_tokens_decoder().items()
                                               if added.special}
    assert {0, 1, 2} <= special  # <|endoftext|>, <|im_start|>, <|im_end|>
    turns = ("What is the capital of France?", "Go on.")  # the first answer ends after a few tokens
    for turn in turns:
        events = list(engine.chat(turn, ignore_eos=True))
        done = events[-1]
        tokens = [e.token_id for e in events if isinstance(e, TokenEvent) and e.token_id >= 0]
        assert done.reason == "max_tokens" and done.n_new_tokens == engine.settings.max_new_tokens
        assert not set(tokens) & special
        assert not ROLE_LINE.search(done.text) and "<|" not in done.text, done.text
    assert [m["role"] for m in engine.messages] == ["user", "assistant"] * 2
    assert [m["content"] for m in engine.messages[::2]] == list(turns)
