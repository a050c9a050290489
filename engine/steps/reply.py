"""One reply's accounting (`Reply`), whichever runner runs its steps, and what one step runs with
(`StepSetup`: the settings, the model and the roof, fixed for the step)."""
from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Iterator, Protocol

import torch

from engine.events import DoneEvent, TokenEvent
from engine.hardware.roof import Roof
from engine.serving.scheduler import Request, RequestState
from engine.serving.speculative import Oracle
from engine.settings import PromptError, Settings


@dataclass(frozen=True)
class StepSetup:
    """What the next step runs: settings change only between steps, so a step reads them once."""
    settings: Settings
    model: object  # engine.model.transformer.Transformer
    roof: Roof  # the roofs the step is measured against (engine/hardware/roof.py)


class StepRunner(Protocol):
    """One kind of step (engine/steps/): runs the reply's next step and yields its StepMetrics (a
    speculative step: its draft's, then its verify's; a batched step: with BatchStats), then the
    TokenEvents it produced. Advances the engine's step counter once per StepMetrics."""

    def step(self, reply: "Reply", gen: torch.Generator | None, setup: StepSetup) -> Iterator: ...


class Reply:
    """One reply's accounting, whichever path runs its steps: the ids so far, the text, and the
    figures its DoneEvent reports."""

    def __init__(self, ids: list[int], budget: int, stream, eos: frozenset):
        self.ids = ids
        self.n_prompt = len(ids)
        self.budget = budget
        self.stream = stream
        self.eos = eos
        self.parts: list[str] = []
        self.n_new = 0
        self.t_start = time.perf_counter()
        self.ttft_s = 0.0
        self.decode_s = 0.0
        self.n_cached = 0
        self.reason = ""
        self.batched_from_start = False
        self.request: Request | None = None  # the reply's request, once it runs in the batch
        self.seen = 0  # the batch request's output ids already streamed
        self.oracle: Oracle | None = None  # speculate="oracle": the reply's guesses, computed beforehand
        self.masked: tuple[int, ...] = ()  # token ids never sampled (keep-decoding's special tokens)

    def end_reason(self, stopped: bool, max_context: int) -> str:
        if self.n_new >= self.budget:
            return "max_tokens"
        if stopped:
            return "stopped"
        if len(self.ids) >= max_context:
            return "context_full"
        return ""

    def add_token(self, token: int, t_s: float, drafted: bool = False) -> TokenEvent | None:
        """Count a sampled token (`drafted`: a guess the target accepted); its TokenEvent, or None
        for the end-of-sequence token."""
        if self.n_new == 0:
            self.ttft_s = t_s - self.t_start
        self.n_new += 1
        self.ids.append(token)
        if token in self.eos:
            self.reason = "eos"
            return None
        piece = self.stream.feed(token)
        self.parts.append(piece)
        return TokenEvent(token, piece, self.n_new - 1, drafted)

    def closing_events(self) -> Iterator:
        """The reply's last events: a character still held back (split UTF-8), then its DoneEvent.
        A reply that ran in the batch takes its end and its cached prefix from its request."""
        person = self.request
        if person is not None:
            if person.state is RequestState.CANCELLED:
                self.reason = "stopped"
            elif person.finish_reason == "eos":
                self.reason = "eos"
            else:
                self.reason = "max_tokens" if self.n_new >= self.budget else "context_full"
            if self.batched_from_start:  # its prefix came from the last turn's retained blocks
                self.n_cached = person.num_reused_tokens  # (0 if it was pre-empted: recomputed)
        tail = self.stream.flush()
        if tail:
            self.parts.append(tail)
            yield TokenEvent(-1, tail, self.n_new)
        yield DoneEvent(self.reason, "".join(self.parts), self.n_prompt, self.n_new, self.ttft_s,
                        self.decode_s, self.n_cached)


def check_prompt_length(n: int, max_context: int) -> None:
    if n + 1 > max_context:
        raise PromptError(f"prompt is {n} tokens, but the context window is {max_context} "
                          "(start a new chat or shorten the prompt)")


def make_generator(seed: int | None, device: str) -> torch.Generator | None:
    """The reply's random generator: seeded settings replay the same reply; None: torch's global one."""
    if seed is None:
        return None
    return torch.Generator(device=device).manual_seed(seed)
