"""The INT4 storage layout shared by the quantiser and the kernel: codes 0..15, two per byte
along K, the low nibble holding the even k. Imports nothing but torch (no triton)."""
from __future__ import annotations

import torch


def pack_int4(codes: torch.Tensor) -> torch.Tensor:
    """(N, K) codes 0..15 (K even) → (N, K/2) uint8; byte j holds k = 2j (low) and 2j + 1 (high)."""
    codes = codes.to(torch.uint8)
    return codes[:, 0::2] | (codes[:, 1::2] << 4)


def unpack_int4(packed: torch.Tensor) -> torch.Tensor:
    """(N, K/2) uint8 → (N, K) uint8 codes 0..15; the inverse of `pack_int4`."""
    return torch.stack([packed & 0xF, packed >> 4], dim=-1).reshape(packed.shape[0], -1)
