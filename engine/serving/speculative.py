"""Speculative decoding: a draft source guesses k tokens, the target scores them all in one step
(k + 1 tokens fed, the weights read once), and `verify` keeps exactly what the target itself would
have produced: greedy, token for token; sampling, the same distribution (the rejection rule).

Sources: `PromptLookup` (the conversation's own n-grams: no second model), `DraftModel` (a model
with the target's vocabulary, on its own KV cache) and `Oracle` (the target's greedy reply computed
beforehand: the upper bound of what speculation can give, for benchmarks)."""
from __future__ import annotations

import threading
import time
from dataclasses import dataclass, replace
from typing import Callable

import torch

from engine.kv.cache import ContiguousKVCache
from engine.hardware.roof import Roof
from engine.hardware.spec import dtype_name
from engine.metrics import StepCost, StepMetrics, calls_cost, measured, step_cost, sum_costs
from engine.model import cpu_step
from engine.model.sampling import draw, greedy, kept_tokens, mask_tokens, probabilities, top_p_rows
from engine.model.transformer import Transformer
from engine.serving.scheduler import common_prefix
from engine.settings import DRAFT_GROUP_SIZE, EngineError, SamplingParams


@dataclass
class Draft:
    """k guessed tokens. `probs` (k, vocab): the draft's distribution at each guess (a draft model
    that sampled); None: each guess was certain (a one-hot draft: prompt lookup, the oracle, greedy)."""
    tokens: list[int]
    probs: torch.Tensor | None = None
    metrics: StepMetrics | None = None  # the draft model's forward passes, as one "draft" step
    search_s: float = 0.0  # host time spent finding the guesses (charged to the verify step)


# ---- verification ------------------------------------------------------------------------------
def verify(logits: torch.Tensor, draft: Draft, sampling: SamplingParams,
           generator: torch.Generator | None = None, native=None) -> tuple[int, list[int]]:
    """logits (k + 1, vocab): the target's before each guess and after the last. Returns
    (accepted, tokens): the first `accepted` guesses, then one token of the target's own (the
    correction at the first rejection, or the bonus when all k are accepted). `native`: the C++
    library the engine samples its CPU rows with (sampling.top_p_rows), or None."""
    k = len(draft.tokens)
    if sampling.is_greedy:
        return greedy_accept(greedy(logits).tolist(), draft.tokens)
    rows = target_rows(logits, sampling, native)
    guesses = draft.tokens
    p_guess = torch.tensor([mass_at(*rows(i), guesses[i]) for i in range(k)], dtype=torch.float64)
    q_guess = torch.ones_like(p_guess) if draft.probs is None else \
        draft.probs[torch.arange(k), torch.tensor(guesses, dtype=torch.long)].to(torch.float64)
    # accept guess i with probability min(1, p/q): u < p/q, written u q < p (q > 0: the guess was drawn)
    u = torch.rand(k, generator=generator, device=logits.device).to(torch.float64)
    rejected = (u * q_guess >= p_guess).nonzero()
    n = int(rejected[0, 0]) if len(rejected) else k
    if n == k:  # all accepted: the bonus token comes from the target's last row
        ids, p = rows(k)
        return k, guesses + [token_of(ids, draw(p, generator))]
    ids, p = rows(n)
    if draft.probs is not None:
        q_row = draft.probs[n].to(p.dtype)
        q_row = q_row if ids is None else q_row[ids]
    else:  # the guess was certain: all of q's mass on it
        q_row = torch.zeros_like(p)
        at = guesses[n] if ids is None else (ids == guesses[n]).nonzero()[:, 0]
        q_row[at] = 1.0
    return n, guesses[:n] + [token_of(ids, draw(residual_distribution(p, q_row), generator))]


def greedy_accept(target: list[int], guesses: list[int]) -> tuple[int, list[int]]:
    """Greedy verification on the target's argmax at each row (k + 1 of them): accept while the guess
    is the target's; (accepted, the accepted guesses and the target's own token after them)."""
    n = 0
    while n < len(guesses) and guesses[n] == target[n]:
        n += 1
    return n, guesses[:n] + [target[n]]


def target_rows(logits: torch.Tensor, sampling: SamplingParams, native=None):
    """row(i) → (ids, p): the target's sampling distribution at row i of logits, over the whole
    vocabulary (ids None: `probabilities`) or, on a CPU with top-p, over the tokens top-p keeps
    (their ids, their renormalised probabilities in fp64: sampling.kept_tokens, the same tokens)."""
    soft = top_p_rows(logits, sampling, native)
    if soft is None:
        p = probabilities(logits, sampling)
        return lambda i: (None, p[i])
    kept: dict[int, tuple] = {}

    def row(i: int):
        if i not in kept:
            ids, values = kept_tokens(soft[i], sampling.top_p)
            p = torch.from_numpy(values.astype("float64"))
            kept[i] = (torch.from_numpy(ids), p / p.sum())
        return kept[i]
    return row


def mass_at(ids: torch.Tensor | None, p: torch.Tensor, token: int) -> float:
    """The probability of `token` in a distribution of target_rows."""
    if ids is None:
        return float(p[token])
    at = (ids == token).nonzero()
    return float(p[at[0, 0]]) if len(at) else 0.0


def token_of(ids: torch.Tensor | None, drawn: torch.Tensor) -> int:
    return int(drawn) if ids is None else int(ids[int(drawn)])


def residual_distribution(p: torch.Tensor, q: torch.Tensor) -> torch.Tensor:
    """Where a rejected guess leaves the target's mass: the positive part of p - q, normalised.
    (It is never empty after a rejection, which needs q > p at the guess; p itself otherwise.)"""
    residual = (p - q).clamp(min=0.0)
    total = residual.sum()
    return residual / total if total > 0 else p


# ---- draft sources -----------------------------------------------------------------------------
class PromptLookup:
    """Guess that the text goes on as it did the last time its final n tokens appeared (n from
    `max_ngram` down to `min_ngram`): replies that repeat, edit or quote their input copy runs of
    it. No second model, any target; a guess costs a search of the context on the host."""
    name = "ngram"

    def __init__(self, max_ngram: int = 3, min_ngram: int = 1):
        self.max_ngram, self.min_ngram = max_ngram, min_ngram

    def propose(self, ids: list[int], k: int, sampling: SamplingParams, generator=None) -> Draft:
        t0 = time.perf_counter()
        tokens = lookup(ids, k, self.max_ngram, self.min_ngram)
        return Draft(tokens, search_s=time.perf_counter() - t0)


def lookup(ids: list[int], k: int, max_ngram: int = 3, min_ngram: int = 1) -> list[int]:
    """Up to k tokens that followed the latest earlier occurrence of the longest matching tail."""
    for n in range(min(max_ngram, len(ids) - 1), min_ngram - 1, -1):
        tail = ids[-n:]
        last = tail[-1]
        for end in range(len(ids) - 2, n - 2, -1):  # `end`: the last token of an earlier occurrence
            if ids[end] == last and ids[end - n + 1:end + 1] == tail:
                return ids[end + 1:end + 1 + k]
    return []


class Oracle:
    """The target's own greedy reply, computed before the reply runs: while the reply follows it
    every guess is right, so its speed is the upper bound of speculation with k guesses. (Sampled
    replies leave it at their first different token; from there it guesses nothing.)"""
    name = "oracle"

    def __init__(self, reference: list[int], prompt_len: int):
        self.reference = reference  # prompt + greedy reply
        self.prompt_len = prompt_len

    def propose(self, ids: list[int], k: int, sampling: SamplingParams, generator=None) -> Draft:
        t0 = time.perf_counter()
        n, p = len(ids), self.prompt_len
        follows = n <= len(self.reference) and ids[:p] == self.reference[:p] and ids[p:] == self.reference[p:n]
        return Draft(self.reference[n:n + k] if follows else [], search_s=time.perf_counter() - t0)


@torch.inference_mode()
def greedy_reference(model: Transformer, prompt_ids: list[int], max_new_tokens: int, eos: frozenset,
                     attention: str = "flash", kv_cache: bool = True, masked: tuple[int, ...] = ()) -> list[int]:
    """The prompt and the target's greedy reply to it (up to EOS or max_new_tokens; `masked` ids
    never chosen, as in the reply), decoded as the reply's own steps will run (on a private cache the
    size of the reply, or recomputing the context when the KV cache is off): the oracle's guesses."""
    ids = list(prompt_ids)
    length = min(len(ids) + max_new_tokens + 1, model.cfg.max_seq_len)
    cache = ContiguousKVCache(model.cfg, 1, length, model.dtype, model.device) if kv_cache else None
    feed, start = list(ids), 0
    while len(ids) - len(prompt_ids) < max_new_tokens and len(ids) < length:
        tokens = torch.tensor([feed], dtype=torch.long, device=model.device)
        token = int(mask_tokens(model(tokens, start_pos=start, cache=cache, attention=attention)[0, -1], masked).argmax())
        ids.append(token)
        if token in eos:
            break
        if kv_cache:
            start += len(feed)
            feed = [token]
        else:
            feed = list(ids)
    return ids


class DraftModel:
    """A model with the target's vocabulary guesses k tokens, one forward each, on a contiguous KV
    cache of its own; at the next proposal the cache is rolled back to what the target kept. Its
    forwards are reported as one "draft" step with their own bytes (the draft's weights, k times)."""
    name = "draft"

    def __init__(self, model: Transformer, max_len: int, roof: Roof, attention: str = "flash"):
        self.model = model
        self.cache = ContiguousKVCache(model.cfg, 1, min(max_len, model.cfg.max_seq_len), model.dtype, model.device)
        self.cached_ids: list[int] = []
        self.roof = roof  # the one its steps are measured against (engine/hardware/roof.py)
        self.attention = attention

    @torch.inference_mode()
    def propose(self, ids: list[int], k: int, sampling: SamplingParams, generator=None) -> Draft:
        model = self.model
        k = min(k, self.cache.max_len - len(ids))
        if k < 1:
            return Draft([])
        sync = torch.cuda.synchronize if model.device.type == "cuda" else (lambda: None)
        sync()
        t0 = time.perf_counter()
        start = min(common_prefix(self.cached_ids, ids), len(ids) - 1)  # roll back to what the target kept
        self.cache.truncate(start)
        feed = ids[start:]
        context = start
        tokens: list[int] = []
        probs: list[torch.Tensor] = []
        costs: list[StepCost] = []
        elem = model.embed.element_size()
        for _ in range(k):
            x = torch.tensor([feed], dtype=torch.long, device=model.device)
            logits = model(x, start_pos=start, cache=self.cache, attention=self.attention)[:, -1]
            if sampling.is_greedy:
                token = int(logits.argmax())
            else:
                q = probabilities(logits, sampling)
                token = int(draw(q, generator)[0])
                probs.append(q)
            calls = cpu_step.chunks(model)  # (a long first prompt, in C++ chunks: each call's weights)
            costs.append(calls_cost(model, calls, context_len=start, kv_elem_bytes=elem, act_elem_bytes=elem,
                                    attention=self.attention) if calls else
                         step_cost(model.cfg, batch_size=1, new_tokens=len(feed), context_len=start,
                                   weight_bytes=model.linear_weight_bytes(), kv_elem_bytes=elem, act_elem_bytes=elem,
                                   attention=self.attention, cpp_step=cpu_step.ran_in_cpp(model)))
            start += len(feed)
            tokens.append(token)
            feed = [token]
        sync()
        step_s = time.perf_counter() - t0
        self.cached_ids = list(ids) + tokens[:-1]  # the last guess was never fed
        products = cpu_step.products(model)  # its forwards' products, where they ran in C++ (the compute roof)
        metrics = measured(
            sum_costs(costs), self.roof, dtype_name(model.dtype), products, step=0, phase="draft", batch_size=1,
            new_tokens=len(ids) - context + k - 1, tokens_out=0, context_len=context, step_s=step_s,
            t_s=time.monotonic(), draft_tokens=k)
        return Draft(tokens, torch.cat(probs) if probs else None, metrics)

    def reset(self) -> None:
        self.cached_ids = []
        self.cache.truncate(0)


# ---- draft models: loaded once, in the background ------------------------------------------------
VOCABULARY_PROBE = "The memory wall: every decode step reads each weight once."


def load_draft(spec: str, target_cfg, target_tokenizer, dtype: torch.dtype, device: str, weights: str,
               max_context: int) -> Transformer:
    """A draft model from `spec` (default, a .gguf, an HF folder, synthetic:SHAPE) at `weights`
    (fp / int8 / int4 g32). EngineError (one line) when its vocabulary is not the target's; a
    synthetic shape takes the target's vocabulary (random guesses: a speed run's draft)."""
    from engine.io.loader import load_model, synthetic_weights
    from engine.model.config import ModelConfig
    from engine.model.quant import quantize_model

    if spec.startswith("synthetic:"):
        cfg = replace(ModelConfig.from_name(spec.split(":", 1)[1]), vocab_size=target_cfg.vocab_size)
        cfg = cfg.with_max_seq_len(min(cfg.max_seq_len, max_context))
        model = Transformer(cfg, synthetic_weights(cfg, dtype, device, seed=1))
    else:
        loaded = load_model(spec, dtype, device, max_context=max_context)
        if loaded.cfg.vocab_size != target_cfg.vocab_size or \
                loaded.tokenizer.encode(VOCABULARY_PROBE) != target_tokenizer.encode(VOCABULARY_PROBE):
            raise EngineError(f"draft model {spec} has another vocabulary ({loaded.cfg.vocab_size} tokens, "
                              f"the target {target_cfg.vocab_size}): a draft must share the target's tokenizer")
        model = Transformer(loaded.cfg, loaded.weights)
    return model if weights == "fp" else quantize_model(model, weights, DRAFT_GROUP_SIZE)


class DraftModels:
    """Draft models by key, each made once in a background thread (a reply keeps streaming
    meanwhile), one at a time; a failure is kept for `wait`, which raises it as one line."""

    def __init__(self):
        self._ready: dict[tuple, Transformer] = {}
        self._errors: dict[tuple, BaseException] = {}
        self._building: tuple | None = None
        self._thread: threading.Thread | None = None
        self._lock = threading.Lock()

    def is_building(self, key: tuple) -> bool:
        with self._lock:
            return self._building == key

    def start(self, key: tuple, build: Callable[[], Transformer]) -> None:
        with self._lock:
            if key in self._ready or self._building == key:
                return
            if self._building is not None:
                raise EngineError(f"draft model {self._building[0]} is still loading: switch again when it is ready")
            self._building = key
            self._errors.pop(key, None)

        def run() -> None:
            try:
                made = build()
                with self._lock:
                    self._ready[key] = made
            except BaseException as error:  # kept for wait()
                with self._lock:
                    self._errors[key] = error
            finally:
                with self._lock:
                    self._building = None

        self._thread = threading.Thread(target=run, name=f"draft model {key[0]}")
        self._thread.start()

    def wait(self, key: tuple) -> Transformer:
        thread = self._thread
        if thread is not None and self.is_building(key):
            thread.join()
        with self._lock:
            if key in self._ready:
                return self._ready[key]
            error = self._errors.pop(key, None)
        if isinstance(error, EngineError):
            raise error
        if error is not None:
            first = str(error).strip().splitlines()[0] if str(error).strip() else type(error).__name__
            raise EngineError(f"draft model {key[0]} could not be loaded: {first}") from error
        raise EngineError(f"draft model {key[0]} was never requested")
