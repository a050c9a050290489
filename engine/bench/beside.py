"""The memory read measured beside a timed run (CPU benches).

The roof the window and the bench divide by is the best read the machine gave when it was probed
(engine/hardware/probe.py). On a shared host — a cloud guest — what the memory gives moves between
modes within a minute, whatever the guest itself does: on this project's 2-core Zen 5 guest the
probe read 46, 49, 52, 82, 53 and 46 GB/s in six runs one after another (docs/benchmarks.md, session
23). A run that meets the slow mode then reads a low MBU that says nothing about the kernel. So the
CPU benches read a buffer of the step's own size with the probe's loop just before and just after each
timed run and show it beside the cached roof: "MBU beside the run" is the run's achieved bandwidth over
that read, the figure to judge a kernel by on such a host. The cached roof stays the roof everywhere
else (the window, the ceilings, the MBU row).
"""
from __future__ import annotations

from dataclasses import replace

BESIDE_PASSES = 3  # best of 3 passes after a first: ~40 ms over 512 MiB at 50 GB/s
PAGE = 2 << 20  # a buffer's size is the step's bytes rounded up to a huge page


class ReadBeside:
    """Read buffers the size of a decode step's bytes (the weights at the engine's settings, by the
    cost model: the same read the roof's cache knee holds a step of that size to), made on first use
    and kept, read on demand with the decode step's thread count."""

    def __init__(self, probe, threads: int):
        self._probe, self.threads, self._held = probe, threads, {}

    @classmethod
    def for_engine(cls, engine) -> "ReadBeside | None":
        """One for a CPU engine; None on a GPU or where the C++ probe does not build (the run then
        shows no read beside it)."""
        if getattr(engine.hardware, "kind", "cpu") != "cpu":
            return None
        import torch
        try:
            from kernels import cpu_roof as probe
            probe.load()
        except Exception:  # no compiler: the cached roof alone, as before
            return None
        return cls(probe, torch.get_num_threads())

    def read_gbs(self, n_bytes: int) -> float | None:
        """GB/s of the best pass over a buffer of `n_bytes` (rounded up to 2 MiB); None where the machine
        cannot spare the buffer (the run then shows no read beside it: the bench goes on)."""
        n = max(PAGE, -(-int(n_bytes) // PAGE) * PAGE)
        try:
            if n not in self._held:
                self._held[n], _ = self._probe.read_buffer(n)
        except (MemoryError, OSError, RuntimeError):
            return None
        buffer = self._held[n]
        return buffer.nbytes / self._probe.read_best_s(buffer, BESIDE_PASSES, self.threads) / 1e9


def step_bytes(engine) -> int:
    """The weight bytes a batch-1 decode step reads at the engine's settings (engine/metrics.py)."""
    from engine.metrics import decode_weight_bytes
    from engine.steps.timing import elem_bytes
    from engine.variants import DTYPES
    s = engine.settings
    return decode_weight_bytes(engine.cfg, elem_bytes(DTYPES[s.dtype]), s.weights, s.group_size, "cpu")


def mean_read(before_gbs: float | None, after_gbs: float | None) -> float | None:
    """GB/s between the reads before and after a run; None where either could not be made."""
    return None if before_gbs is None or after_gbs is None else (before_gbs + after_gbs) / 2


def with_read_beside(result, before_gbs: float | None, after_gbs: float | None):
    """The result with the reads of its step's size before and after its run, and its MBU against
    their mean: its achieved bandwidth over what a read of the same bytes got then (as it was where a
    read could not be made)."""
    mean = mean_read(before_gbs, after_gbs)
    if mean is None:
        return result
    mbu = result.decode_achieved_gbs / mean if mean > 0 else None
    return replace(result, read_beside_gbs=(round(before_gbs, 2), round(after_gbs, 2)), mbu_beside=mbu)


def beside_cell(result) -> str:
    reads = result.read_beside_gbs
    return f"{reads[0]:,.1f} / {reads[1]:,.1f}" if reads else ""


def mbu_beside_cell(result) -> str:
    return f"{100 * result.mbu_beside:.1f}%" if result.mbu_beside is not None else ""


BESIDE_ROWS = (("read before / after GB/s", beside_cell), ("MBU beside the run", mbu_beside_cell))


def beside_rows(results) -> tuple:
    """The two rows, where any result was read beside (CPU); none otherwise (a GPU's table unchanged)."""
    return BESIDE_ROWS if any(r.read_beside_gbs for r in results) else ()
