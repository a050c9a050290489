"""The window's clock: the plots redraw from the ring buffers on a timer (~30 times a second, never
per token) under a CPU budget for the GUI thread (app/frame_budget.py), the numbers a few times a
second, and a local GPU's NVML sampler on a timer of its own."""
from __future__ import annotations

import os
import time

from PySide6.QtCore import QTimer

from app.frame_budget import FrameBudget

FRAME_MS = 33  # ~30 fps redraw
# With the engine on the CPU the budget below holds the frames to 1-3 a second, so the timer ticks
# at 10 Hz rather than 30: each tick wakes the GUI thread, and on 2 cores a wake-up pre-empts one of
# the engine's two spinning OpenMP threads while the other waits at the step's next barrier.
FRAME_MS_CPU = 100
READOUT_INTERVAL_S = 0.25  # numbers in titles and the strip: ~4 Hz
# With the engine on the CPU, every core the GUI thread takes is one the engine's threads wanted:
# the GUI keeps to this share of the machine's cores (2 cores: 0.08 of one) and skips frames above
# it (app/frame_budget.py), never below MIN_FPS_CPU. Measured with `python -m app.gui_bench` on 2
# cores: a frame costs 20-60 ms of CPU, and at 4-5 fps the app decoded int8 at 0.73x of headless
# (0.97x with no frames drawn), at ~2 fps at 0.88-0.91x (docs/benchmarks.md, "issue 15").
GUI_SHARE_OF_CPU_MACHINE = 0.04
GUI_CPU_BUDGET_GPU = 0.5  # of one core, when the engine runs on a GPU (its CPU threads mostly wait), or elsewhere
MIN_FPS_CPU = 1
MIN_FPS_GPU = 4
NVML_SAMPLE_MS = 250


class FrameClock:
    """The frame and NVML timers of `window` (a MainWindow: its source, device, plots, side tabs and
    strip). `sampler` is the NVML sampler of the local GPU the model runs on (None elsewhere)."""

    def __init__(self, window):
        self.window = window
        self.frame = 0
        self._readout_s = -float("inf")
        self.frame_budget = FrameBudget(GUI_CPU_BUDGET_GPU, MIN_FPS_GPU)  # set from the engine at every tick
        self.sampler = None
        self.frame_timer = QTimer(window)
        self.frame_timer.setInterval(FRAME_MS)
        self.frame_timer.timeout.connect(self.tick)
        self.nvml_timer = QTimer(window)
        self.nvml_timer.setInterval(NVML_SAMPLE_MS)
        self.nvml_timer.timeout.connect(self.sample_hardware)

    @property
    def engine_shares_the_cpu(self) -> bool:
        """Whether the source decodes on this machine's CPU cores (a local engine not on a GPU)."""
        return self.window.source.shares_cpu(self.window.device)

    @property
    def gui_cpu_budget(self) -> float:
        """Cores the GUI thread may take before frames are skipped."""
        if self.engine_shares_the_cpu:
            return GUI_SHARE_OF_CPU_MACHINE * (os.cpu_count() or 2)
        return GUI_CPU_BUDGET_GPU

    @property
    def min_fps(self) -> float:
        return MIN_FPS_CPU if self.engine_shares_the_cpu else MIN_FPS_GPU

    def tick(self) -> None:
        """~30 fps (10 with the engine on this CPU), but the GUI thread keeps to a CPU budget: on a
        CPU the engine and the drawing share the same cores, so when drawing (and the rest of the
        GUI) costs more than its budget (gui_cpu_budget), frames are skipped (app/frame_budget.py;
        never below min_fps)."""
        window = self.window
        self.frame += 1
        interval = FRAME_MS_CPU if self.engine_shares_the_cpu else FRAME_MS
        if self.frame_timer.interval() != interval:  # the device may have changed
            self.frame_timer.setInterval(interval)
        budget = self.frame_budget
        budget.budget_cores, budget.min_fps = self.gui_cpu_budget, self.min_fps
        now = time.monotonic()
        drew = budget.tick(now, time.thread_time()) and window.plots.refresh()
        if drew:
            budget.drew(now)
        window.side_tabs.refresh_shown()
        # the numbers a few times a second; over budget, with the frames (a readout relays its label)
        if now - self._readout_s >= READOUT_INTERVAL_S and (drew or budget.share <= budget.budget_cores):
            self._readout_s = now
            window.plots.update_readouts()
            if self.sampler is None and window.model_info is not None:
                window.hardware_strip.update_memory(None)

    def start_sampler(self, spec) -> None:
        self.close_sampler()
        # (a replay's samples are the recording's: this machine's GPU is not the one recorded)
        if spec.kind == "cuda" and spec.nvml and spec.nvml_index is not None and self.window.source.local_hardware:
            from engine.hardware.nvml import NvmlSampler

            sampler = NvmlSampler(spec.nvml_index)
            if sampler.available:
                self.sampler = sampler
                self.nvml_timer.start()

    def sample_hardware(self) -> None:
        if self.sampler is not None and self.window.source.local_hardware:
            self.window.show_hardware_sample(self.sampler.sample())

    def sample_now(self):
        """A sample of the local GPU now (None without a sampler)."""
        return self.sampler.sample() if self.sampler is not None else None

    def close_sampler(self) -> None:
        if self.sampler is not None:
            self.sampler.close()
            self.sampler = None
        self.nvml_timer.stop()

    def stop(self) -> None:
        self.frame_timer.stop()
        self.close_sampler()
