"""The batched step: the person's reply as one request of the batch server, beside the simulated
users (engine/serving/server.py); each step serves every running request."""
from __future__ import annotations

import itertools
import time
from typing import Iterator

from engine.serving.lifecycle import BatchLifecycle
from engine.serving.scheduler import Request
from engine.steps.reply import Reply, StepSetup
from engine.steps.timing import StepCounter


class BatchedSteps:
    def __init__(self, batch: BatchLifecycle, counter: StepCounter, max_context: int, plain=None):
        self.batch = batch
        self.plain = plain  # the batch-1 steps (steps/plain.py): their cache seeds the person's request
        self.counter = counter
        self.max_context = max_context
        self._person_ids = itertools.count(1)  # the person's requests; users' ids start far above

    def submit(self, reply: Reply, gen, setup: StepSetup) -> Request:
        """The (rest of the) reply as one request in the batch: the context so far is its prompt,
        prefilled into the paged pool, or taken over: from the last turn's retained blocks, and
        beyond them from the batch-1 cache's K/V (copied into the pool)."""
        server = self.batch.ensure(setup.model, setup.settings, setup.roof)
        self.batch.sync(setup.model, setup.settings, setup.roof)
        want, room = reply.budget - reply.n_new, self.max_context - len(reply.ids)
        # retain_kv: the conversation's K/V stay in the pool after the reply, and the next turn
        # prefills only what is new (engine/serving/scheduler.py), as the plain path's cache does
        request = Request(next(self._person_ids), list(reply.ids), min(want, room), reply.eos, retain_kv=True)
        plain = self.plain  # (users need a KV cache: settings refuse users with it off)
        cached = (plain.cache, plain.cached_ids) if plain is not None and plain.cache is not None else None
        server.submit_person(request, setup.settings.sampling, gen, masked=reply.masked, cached=cached)
        reply.batched_from_start = reply.n_new == 0
        reply.seen = len(request.output_ids)
        reply.request = request
        return request

    def step(self, reply: Reply, gen, setup: StepSetup) -> Iterator:
        person = reply.request
        had_first_token = reply.n_new > 0
        metrics, stats = self.batch.step(self.counter.value)
        t_end = time.perf_counter()
        if metrics is None:  # nothing could run (cannot last: the running requests finish)
            time.sleep(0.001)
            return
        self.counter.advance()
        if had_first_token:
            reply.decode_s += metrics.step_s  # every step from the first token on, pre-empted ones too
        yield metrics
        yield stats
        for token in person.output_ids[reply.seen:]:
            event = reply.add_token(token, t_end)
            if event is None:
                break
            yield event
        reply.seen = len(person.output_ids)
