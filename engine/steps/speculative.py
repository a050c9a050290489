"""The speculative step: a draft source (prompt lookup, a draft model, the oracle) guesses up to k
tokens and one plain step verifies them (engine/serving/speculative.py); no guess, a plain step."""
from __future__ import annotations

import time
from dataclasses import replace
from typing import Iterator

from engine.model.transformer import Transformer
from engine.serving.speculative import Draft, DraftModel, Oracle, PromptLookup, greedy_reference
from engine.steps.plain import PlainSteps
from engine.steps.reply import Reply, StepSetup
from engine.steps.timing import StepCounter


class SpeculativeSteps:
    """Owns the draft sources: `lookup` (the context's n-grams), `draft` (the draft model in use,
    with its own KV cache) and the last oracle reference computed."""

    def __init__(self, plain: PlainSteps, counter: StepCounter, max_context: int):
        self.plain = plain
        self.counter = counter
        self.max_context = max_context
        self.lookup = PromptLookup()
        self.draft: DraftModel | None = None  # the one in use, with its own KV cache
        self._last_oracle: tuple | None = None  # (what it was computed for, the reference)

    def use_draft(self, model: Transformer | None, setup: StepSetup) -> None:
        """Speculate with `model` from now on (None: no draft model); its cache is kept while it is the same."""
        if model is None:
            self.draft = None
        elif self.draft is None or self.draft.model is not model:
            self.draft = DraftModel(model, self.max_context, roof=setup.roof)
        if self.draft is not None:
            self.draft.attention = setup.settings.attention

    def reset(self) -> None:
        if self.draft is not None:
            self.draft.reset()

    def step(self, reply: Reply, gen, setup: StepSetup) -> Iterator:
        """A draft source guesses up to k tokens; one target step verifies them (engine/serving/
        speculative.py). No guess (no n-gram match, no room left): a plain decode step."""
        s = setup.settings
        k = min(s.draft_tokens, reply.budget - reply.n_new - 1, self.max_context - len(reply.ids) - 1)
        source = self.source(reply, setup)
        draft = source.propose(reply.ids, k, s.sampling, gen) if k >= 1 and source is not None else Draft([])
        if not draft.tokens:
            yield from self.plain.step(reply, gen, setup)
            return
        if draft.metrics is not None:  # the draft model's forwards: a step of their own
            draft.metrics = replace(draft.metrics, step=self.counter.value, settings_label=s.label)
            self.counter.advance()
            reply.decode_s += draft.metrics.step_s
            yield draft.metrics
        tokens, metrics = self.plain.run(reply.ids, produced=reply.n_new, gen=gen, setup=setup, draft=draft,
                                         masked=reply.masked)
        t_end = time.perf_counter()
        self.counter.advance()
        reply.decode_s += metrics.step_s
        yield metrics
        for i, token in enumerate(tokens):
            event = reply.add_token(token, t_end, drafted=i < metrics.accepted_tokens)
            if event is None:
                break
            yield event

    def source(self, reply: Reply, setup: StepSetup):
        speculate = setup.settings.speculate
        if speculate == "ngram":
            return self.lookup
        if speculate == "draft":
            return self.draft
        if speculate == "oracle":
            if reply.oracle is None:  # switched on mid-reply: the reference goes on from here
                reply.oracle = self.oracle(reply, setup)
            return reply.oracle
        return None

    def oracle(self, reply: Reply, setup: StepSetup) -> Oracle:
        """The target's greedy reply from where `reply` stands, decoded before it goes on (untimed;
        the last one is kept: a benchmark asks for the same reply at every k)."""
        s, model = setup.settings, setup.model
        budget = reply.budget - reply.n_new
        key = (tuple(reply.ids), budget, reply.eos, reply.masked, model, s.attention, s.kv_cache)
        if self._last_oracle is None or self._last_oracle[0] != key:
            reference = greedy_reference(model, reply.ids, budget, reply.eos, s.attention, s.kv_cache,
                                         reply.masked)
            self._last_oracle = (key, reference)
        return Oracle(self._last_oracle[1], len(reply.ids))
