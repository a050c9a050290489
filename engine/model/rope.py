"""Rotary position embeddings: the inverse frequencies of a `ModelConfig` (base, scaling type,
GGUF frequency factors) and the cos/sin tables the transformer indexes by position."""
from __future__ import annotations

import math

import torch

from engine.model.config import ModelConfig, RopeScaling


def inv_frequencies(head_dim: int, theta: float, scaling: RopeScaling = RopeScaling(),
                    freq_factors: tuple[float, ...] = ()) -> torch.Tensor:
    """(head_dim / 2,) float64: the angle per position of each rotated pair, as transformers'
    rope types define them (`RopeScaling`); GGUF's rope_freqs factors divide them (llama.cpp)."""
    half = head_dim // 2
    inv = 1.0 / (theta ** (torch.arange(half, dtype=torch.float64) / half))
    kind = scaling.kind
    if kind == "linear":
        inv = inv / scaling.factor
    elif kind == "llama3":
        inv = _llama3(inv, scaling)
    elif kind == "yarn":
        inv = _yarn(inv, head_dim, theta, scaling)
    # "dynamic" (NTK) equals the default within the trained context: the model runs no longer than that
    if freq_factors:
        inv = inv / torch.tensor(freq_factors, dtype=torch.float64)
    return inv


def _llama3(inv: torch.Tensor, s: RopeScaling) -> torch.Tensor:
    """Wavelengths beyond original/low_freq_factor are stretched by the factor, those below
    original/high_freq_factor kept; the band between blends the two."""
    wavelen = 2 * math.pi / inv
    low_wavelen = s.original_max_len / s.low_freq_factor
    high_wavelen = s.original_max_len / s.high_freq_factor
    smooth = (s.original_max_len / wavelen - s.low_freq_factor) / (s.high_freq_factor - s.low_freq_factor)
    blended = (1 - smooth) * inv / s.factor + smooth * inv
    out = torch.where(wavelen > low_wavelen, inv / s.factor, inv)
    middle = (wavelen >= high_wavelen) & (wavelen <= low_wavelen)
    return torch.where(middle, blended, out)


def _yarn(inv: torch.Tensor, head_dim: int, theta: float, s: RopeScaling) -> torch.Tensor:
    """Frequencies that turn fewer than beta_slow times over the original context are interpolated
    (divided by the factor), those turning more than beta_fast times kept; a linear ramp between."""
    def dim_of(rotations: float) -> float:  # the pair index that turns `rotations` times
        return head_dim * math.log(s.original_max_len / (rotations * 2 * math.pi)) / (2 * math.log(theta))

    low, high = dim_of(s.beta_fast), dim_of(s.beta_slow)
    if s.truncate:
        low, high = math.floor(low), math.ceil(high)
    low, high = max(low, 0), min(high, head_dim - 1)
    if low == high:
        high += 0.001  # no zero-width ramp
    ramp = ((torch.arange(head_dim // 2, dtype=torch.float64) - low) / (high - low)).clamp(0, 1)
    keep = 1 - ramp  # 1: the original frequency, 0: the interpolated one
    return inv / s.factor * (1 - keep) + inv * keep


def rope_tables(cfg: ModelConfig, max_len: int, device=None, local: bool = False) -> tuple[torch.Tensor, torch.Tensor]:
    """cos and sin, (max_len, rotary_dim), fp32, in the rotate-half layout (yarn and longrope scale
    both). local: the sliding layers' own base, unscaled (Gemma 3)."""
    if local:
        inv = inv_frequencies(cfg.rotary_dim, cfg.rope_local_theta).to(device)
    else:
        inv = inv_frequencies(cfg.rotary_dim, cfg.rope_theta, cfg.rope_scaling, cfg.rope_freq_factors).to(device)
    angles = torch.outer(torch.arange(max_len, device=device, dtype=torch.float64), inv)
    angles = torch.cat([angles, angles], dim=-1)
    cos, sin = angles.cos(), angles.sin()
    scale = 1.0 if local else cfg.rope_scaling.cos_sin_scale
    if scale != 1.0:
        cos, sin = cos * scale, sin * scale
    return cos.float(), sin.float()
