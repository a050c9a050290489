"""A step's wall time (CUDA events on a GPU) and the engine's step numbers."""
from __future__ import annotations

import time

import torch


class StepTimer:
    """Wall time of a step: CUDA events on a GPU (the host clock would time only the launches)."""

    def __init__(self, device: str):
        self.cuda = device.startswith("cuda")

    def start(self):
        if self.cuda:
            self.begin = torch.cuda.Event(enable_timing=True)
            self.end = torch.cuda.Event(enable_timing=True)
            self.begin.record()
        else:
            self.t0 = time.perf_counter()

    def stop(self) -> float:
        if self.cuda:
            self.end.record()
            self.end.synchronize()
            return self.begin.elapsed_time(self.end) / 1e3
        return time.perf_counter() - self.t0


class StepCounter:
    """The engine's step number, shared by its runners: every step that yields StepMetrics (a
    speculative step's draft and verify each) takes one."""

    def __init__(self):
        self.value = 0

    def advance(self) -> None:
        self.value += 1


def elem_bytes(dtype: torch.dtype) -> int:
    return dtype.itemsize
