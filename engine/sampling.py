"""Sampling: greedy, temperature, top-k, top-p, seeded. `SamplingParams.validate()` gives
the one-line message for impossible values."""
from __future__ import annotations

from dataclasses import dataclass

import torch


class SamplingError(ValueError):
    pass


@dataclass(frozen=True)
class SamplingParams:
    temperature: float = 0.7
    top_k: int = 0  # 0 = off
    top_p: float = 0.95  # 1.0 = off
    seed: int | None = None
    greedy: bool = False

    def validate(self) -> "SamplingParams":
        if not (self.temperature >= 0.0) or self.temperature > 100:
            raise SamplingError(f"temperature must be between 0 and 100, got {self.temperature}")
        if int(self.top_k) != self.top_k or self.top_k < 0:
            raise SamplingError(f"top-k must be a whole number >= 0, got {self.top_k}")
        if not (0.0 < self.top_p <= 1.0):
            raise SamplingError(f"top-p must be in (0, 1], got {self.top_p}")
        return self

    @property
    def is_greedy(self) -> bool:
        return self.greedy or self.temperature == 0.0


def sample(logits: torch.Tensor, params: SamplingParams, generator: torch.Generator | None = None) -> torch.Tensor:
    """logits (B, vocab) fp32 → token ids (B,)."""
    if params.is_greedy:
        return logits.argmax(dim=-1)
    logits = logits / params.temperature
    if params.top_k and params.top_k < logits.shape[-1]:
        kth = torch.topk(logits, params.top_k, dim=-1).values[..., -1:]
        logits = logits.masked_fill(logits < kth, float("-inf"))
    probs = torch.softmax(logits, dim=-1)
    if params.top_p < 1.0:
        sorted_probs, order = probs.sort(dim=-1, descending=True)
        # drop a token once the mass before it already reaches top_p (the first always stays)
        drop = sorted_probs.cumsum(dim=-1) - sorted_probs >= params.top_p
        sorted_probs = sorted_probs.masked_fill(drop, 0.0)
        probs = torch.zeros_like(probs).scatter_(-1, order, sorted_probs)
    return torch.multinomial(probs, 1, generator=generator).squeeze(-1)
