"""`FrameBudget`: whether the window draws a frame of the plots at this tick of its ~30 fps timer.

With the engine on the CPU, every millisecond the GUI thread paints is taken from a core the
engine's threads were using, and a decode step's threads meet at barriers: one pre-empted thread
holds up the whole step. A plot frame is a burst of ~10-25 ms of painting, so the frame rate is
what the app's drawing costs the engine. The budget is the GUI thread's share of a core over the
last second, measured on its own CPU clock and weighted by time (an average of per-tick shares
misses most of a frame's cost: the paint lands in a single long tick). Above it frames are skipped,
but never fewer than `min_fps` a second, so the window never looks stopped."""
from __future__ import annotations

from collections import deque


class FrameBudget:
    def __init__(self, budget_cores: float, min_fps: float, window_s: float = 1.0):
        self.budget_cores = budget_cores
        self.min_fps = min_fps
        self.window_s = window_s
        self.share = 0.0  # of one core, over the last window_s
        self._samples: deque[tuple[float, float]] = deque()  # (monotonic s, thread CPU s)
        self.frame_cpu_s = 0.0  # what a frame costs: the CPU of the tick after one was drawn, smoothed
        self._last_draw = -float("inf")
        self._drew_last_tick = False

    def tick(self, now: float, cpu: float) -> bool:
        """A timer tick at `now` with the GUI thread's CPU clock at `cpu`: draw a frame?"""
        samples = self._samples
        if self._drew_last_tick and samples:
            self.frame_cpu_s = 0.7 * self.frame_cpu_s + 0.3 * (cpu - samples[-1][1])
        self._drew_last_tick = False
        samples.append((now, cpu))
        while len(samples) > 2 and now - samples[1][0] >= self.window_s:
            samples.popleft()
        t0, cpu0 = samples[0]
        self.share = (cpu - cpu0) / (now - t0) if now - t0 >= 0.25 * self.window_s else 0.0
        # draw if the frame fits in the budget, with its own cost counted
        fits = self.share + self.frame_cpu_s / self.window_s <= self.budget_cores
        return fits or now - self._last_draw >= 1 / self.min_fps

    def drew(self, now: float) -> None:
        self._last_draw = now
        self._drew_last_tick = True
