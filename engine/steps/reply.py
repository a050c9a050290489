"""One reply's accounting (`Reply`), whichever runner runs its steps, and what one step runs with
(`StepSetup`: the settings, the model and the peaks, fixed for the step)."""
from __future__ import annotations

import time
from dataclasses import dataclass

from engine.events import TokenEvent
from engine.serving.scheduler import Request
from engine.serving.speculative import Oracle
from engine.settings import Settings


@dataclass(frozen=True)
class StepSetup:
    """What the next step runs: settings change only between steps, so a step reads them once."""
    settings: Settings
    model: object  # engine.model.transformer.Transformer
    peak_bandwidth_bps: float
    peak_flops: float  # NaN where the device's peak for this dtype is not known


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
