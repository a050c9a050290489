"""`FrameBudget`: whether the window draws a frame of the plots at this tick of its ~30 fps timer.

With the engine on the CPU, every millisecond the GUI thread paints is taken from a core the
engine's threads were using, and a decode step's threads meet at barriers: one pre-empted thread
holds up the whole step. A plot frame is a burst of ~10-40 ms of painting, so the frame rate is
what the app's drawing costs the engine.

The budget is a credit of the GUI thread's CPU time, measured on its own clock: it grows at
`budget_cores` seconds a second, everything the thread spends is taken from it, and a frame is
drawn when the credit holds what a frame costs (measured: the CPU of the tick after one was drawn,
smoothed). The credit is capped at one frame, so an idle spell (the minutes a speaker talks between
replies) buys one frame at the next reply, not a second of frames in its first tenths (an average
over the last second let 3 frames through at the start of a reply after idle: issue 25). Never
fewer than `min_fps` frames a second, so the window never looks stopped. `share` is the thread's
share of a core over the last `window_s`, for the readouts."""
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
        self.credit_s = None  # CPU seconds the thread may still spend (None: full, before the first tick)
        self._last_draw = -float("inf")
        self._drew_last_tick = False

    def tick(self, now: float, cpu: float) -> bool:
        """A timer tick at `now` with the GUI thread's CPU clock at `cpu`: draw a frame?"""
        samples = self._samples
        if samples:
            last_now, last_cpu = samples[-1]
            if self._drew_last_tick:  # (the first frame measured is the estimate: none is free)
                cost = cpu - last_cpu
                self.frame_cpu_s = 0.7 * self.frame_cpu_s + 0.3 * cost if self.frame_cpu_s else cost
            credit = self.frame_cpu_s if self.credit_s is None else self.credit_s
            credit += self.budget_cores * (now - last_now) - (cpu - last_cpu)
            self.credit_s = max(0.0, min(credit, self.frame_cpu_s))
        self._drew_last_tick = False
        samples.append((now, cpu))
        while len(samples) > 2 and now - samples[1][0] >= self.window_s:
            samples.popleft()
        t0, cpu0 = samples[0]
        self.share = (cpu - cpu0) / (now - t0) if now - t0 >= 0.25 * self.window_s else 0.0
        full = self.credit_s is None or self.credit_s >= self.frame_cpu_s
        return full or now - self._last_draw >= 1 / self.min_fps

    def drew(self, now: float) -> None:
        self._last_draw = now
        self._drew_last_tick = True
