"""Sampling a token from logits: greedy, temperature, top-k, top-p, seeded (`SamplingParams`,
engine/settings.py, says which). `probabilities` is the distribution `sample` draws from (what
speculative decoding's verification compares a draft against)."""
from __future__ import annotations

import torch

from engine.settings import SamplingParams


def probabilities(logits: torch.Tensor, params: SamplingParams) -> torch.Tensor:
    """logits (..., vocab) fp32 → the sampling distribution (..., vocab) after temperature, top-k
    and top-p; greedy: one-hot on the argmax."""
    if params.is_greedy:
        return torch.zeros_like(logits).scatter_(-1, logits.argmax(dim=-1, keepdim=True), 1.0)
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
    return probs


def sample(logits: torch.Tensor, params: SamplingParams, generator: torch.Generator | None = None) -> torch.Tensor:
    """logits (B, vocab) fp32 → token ids (B,)."""
    if params.is_greedy:
        return logits.argmax(dim=-1)
    return torch.multinomial(probabilities(logits, params), 1, generator=generator).squeeze(-1)
