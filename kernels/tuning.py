"""Launch configurations for the weight-only matmul kernels, and a small tuner that times the
candidates once per (kernel, shape, M bucket) on the GPU and remembers the fastest.

Not `triton.autotune`: the wrapper must know a config's SPLIT_K before launching (split-K
accumulates into an fp32 buffer with atomics; SPLIT_K = 1 stores straight into the output),
and at decode sizes every extra launch costs as much as the matmul itself."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable


@dataclass(frozen=True)
class Config:
    block_m: int
    block_n: int
    block_k: int
    split_k: int = 1
    num_warps: int = 4
    num_stages: int = 3


# Decode (M <= 64 rows): the weight is streamed once; the tile's M side only pads the rows
# (tl.dot needs 16), so the choices are how wide a slice of W each program reads and whether
# K is split so that a few-thousand-row layer still gives every SM work.
DECODE_CONFIGS = tuple(
    Config(block_m=16, block_n=bn, block_k=bk, split_k=sk, num_warps=4, num_stages=st)
    for bn, bk, sk, st in [
        (16, 256, 1, 4), (32, 128, 1, 4), (64, 128, 1, 3),
        (16, 256, 2, 4), (32, 128, 4, 4), (64, 128, 4, 3),
    ])
# Each config compiles once per distinct K (a constexpr, see the kernels): a handful of
# candidates keeps the first decode step of a new model to seconds, not minutes.
# Prefill (M > 64): an ordinary tiled matmul.
PREFILL_CONFIGS = (
    Config(64, 64, 64, num_warps=4, num_stages=3),
    Config(64, 128, 64, num_warps=4, num_stages=3),
    Config(128, 128, 64, num_warps=8, num_stages=3),
)
DECODE_MAX_M = 64


def m_bucket(m: int) -> int:
    """Rows rounded up to a power of two (min 16): prefill lengths share tuning results."""
    b = 16
    while b < m:
        b *= 2
    return b


def candidates(m: int) -> tuple[Config, ...]:
    if m <= DECODE_MAX_M:
        block_m = min(m_bucket(m), 64)
        return tuple(Config(block_m, c.block_n, c.block_k, c.split_k, c.num_warps, c.num_stages)
                     for c in DECODE_CONFIGS)
    return PREFILL_CONFIGS


class Tuner:
    """Remembers the fastest config per key; times candidates only on a GPU. Each key's answer is
    set once and never changed (a later timing of the same key cannot replace it)."""

    def __init__(self):
        self.best: dict[tuple, Config] = {}

    def pick(self, key: tuple, m: int, launch: Callable[[Config], object], on_gpu: bool,
             allowed: Callable[[Config], bool] = lambda c: True) -> Config:
        full_key = key + (m_bucket(m),)
        found = self.best.get(full_key)
        if found is not None:
            return found
        options = [c for c in candidates(m) if allowed(c)]
        if not options:
            raise ValueError(f"no kernel configuration fits {key}")
        if not on_gpu or len(options) == 1:  # the interpreter (tests): timing means nothing there
            return self.best.setdefault(full_key, options[0])
        import torch
        if torch.cuda.is_current_stream_capturing():  # no timing inside a CUDA graph: decide later
            return options[0]
        from triton.testing import do_bench
        timed = [(do_bench(lambda c=c: launch(c), warmup=5, rep=20), i, c) for i, c in enumerate(options)]
        return self.best.setdefault(full_key, min(timed)[2])


# The one tuner of the process, shared by the weight-only matmuls (kernels/triton_common.py): a GPU's
# fastest launch configuration for a kernel and shape is the same for every engine, so it is not kept
# per engine (engine/context.py), and the captured decode step's custom op (which cannot be handed an
# engine's object) launches what the eager steps measured. Write-once per key, as Tuner.pick keeps it.
TUNED = Tuner()
