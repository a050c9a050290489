"""The GUI's record of the run: ring buffers of engine steps, hardware samples and batch stats, plus
the setting-change annotations. Plain numbers, no Qt; `version` grows with every change."""
from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from app.i18n import QT_TRANSLATE_NOOP
from app.ringbuffer import RingBuffer

STEP_CAPACITY = 8192  # steps kept (the step plots show the last few hundred)
HW_CAPACITY = 4096
SERVING_CAPACITY = 8192
MAX_ANNOTATIONS = 64

STEP_COLUMNS = ("x", "t_s", "start_s", "prefill", "mixed", "label", "tokens_per_s", "ceiling_tps", "roof_tps", "gbs",
                "flops", "mfu_pct", "ai", "step_ms", "peak_flops", "peak_bps",
                "peak_kind",  # what peak_flops is of ("fp32", "int8/int16 dots + fp32"): an index into `peak_kinds`
                # speculative decoding: a draft step (the draft model's forwards), a verify step (the target's),
                # its guesses and those kept; tokens produced; time beyond the step's bytes at peak bandwidth
                "draft", "verify", "draft_tokens", "accepted", "tokens_out", "overhead_ms", "cache_roof")
HW_COLUMNS = ("x", "t_s", "sm_util_pct", "dram_bw_util_pct", "tensor_active_pct")
SERVING_COLUMNS = ("x", "t_s", "users", "running", "waiting", "aggregate_tps", "per_request_tps", "ttft_p50_s",
                   "ttft_p95_s", "itl_p50_s", "itl_p95_s", "preempted", "prefix_hit_pct")


def _code(table: list[str], text: str) -> int:
    """text's index in table, appended first where it is new (a column holds the index)."""
    if text not in table:
        table.append(text)
    return table.index(text)


@dataclass(frozen=True)
class Annotation:
    x: float  # step index at which the change took effect
    t_s: float  # time.monotonic() of the change
    text: str  # e.g. "kv cache off"
    label: str  # the settings label after the change (its colour)


class LiveData:
    """What the plots draw. Views compare `version` (`serving_version` for the serving panel) with
    the one they last drew, so they redraw only when something is new."""

    def __init__(self, step_capacity: int = STEP_CAPACITY, hw_capacity: int = HW_CAPACITY):
        self.steps = RingBuffer(step_capacity, STEP_COLUMNS)
        self.hardware = RingBuffer(hw_capacity, HW_COLUMNS)
        self.serving = RingBuffer(SERVING_CAPACITY, SERVING_COLUMNS)  # one row per batched step
        self.serving_policy = ""
        self.serving_version = 0
        self.labels: list[str] = []  # settings labels; the "label" column holds indices into it
        self.peak_kinds: list[str] = []  # what a step's compute roof is of ("fp32", "int8/int16 dots + fp32")
        self.annotations: list[Annotation] = []
        self.reply_t0: float | None = None  # time.monotonic() when the current reply was sent
        self.reply_t1: float | None = None  # its last step's end (None while it streams)
        self.ttft_s: float | None = None
        self.version = 0
        # where the figures come from, for the readouts: the cost model, or (attach mode) the server
        self.source = "model"
        # what one row of `steps` is (attach mode: one scrape of the server)
        self.x_label = QT_TRANSLATE_NOOP("Plots", "step")
        self.notes: dict[str, str] = {}  # plot name -> why it shows nothing (e.g. the flag to start a server with)

    def label_code(self, label: str) -> int:
        return _code(self.labels, label)

    def kind_code(self, kind: str) -> int:
        return _code(self.peak_kinds, kind)

    @property
    def next_x(self) -> int:
        return self.steps.total

    def add_step(self, m) -> None:
        """m: an engine StepMetrics. A speculative step's tokens/s and ceiling count its draft too: the
        verify row carries the tokens it produced over the draft's and its own time and bytes; the
        draft row has none (it produced no token) and is left out of the tokens/s line."""
        prefill = m.phase in ("prefill", "mixed")  # "mixed": prompt chunks with decode rows
        # batched steps carry other requests' prefills: the person's TTFT then comes with its reply
        if prefill and m.batch_size == 1 and self.reply_t0 is not None and self.ttft_s is None:
            self.ttft_s = m.t_s - self.reply_t0
        # the engine's figures for the step's round (a verify step carries its draft's: engine/metrics.py)
        tokens_per_s, ceiling = m.round_tokens_per_s, m.round_memory_ceiling_tokens_per_s
        roof = _finite_or_none(m.round_ceiling_tokens_per_s)
        if m.phase == "draft":
            tokens_per_s = ceiling = roof = None
        self.steps.append(
            x=self.steps.total, t_s=m.t_s, start_s=m.t_s - m.step_s, prefill=1.0 if prefill else 0.0,
            mixed=1.0 if m.phase == "mixed" else 0.0,
            label=self.label_code(m.settings_label), tokens_per_s=tokens_per_s,
            ceiling_tps=ceiling, roof_tps=roof,
            gbs=m.achieved_gbs, flops=m.flops / m.step_s,
            mfu_pct=100 * m.mfu if m.peak_flops == m.peak_flops and m.peak_flops > 0 else None,
            ai=m.arithmetic_intensity, step_ms=1e3 * m.step_s, peak_flops=m.peak_flops, peak_bps=m.peak_bandwidth_bps,
            peak_kind=self.kind_code(m.peak_kind or m.settings_label.split(" ")[0]),
            draft=1.0 if m.phase == "draft" else 0.0, verify=1.0 if m.phase == "verify" else 0.0,
            draft_tokens=m.draft_tokens, accepted=m.accepted_tokens if m.phase == "verify" else None,
            tokens_out=m.tokens_out, overhead_ms=1e3 * m.overhead_s,
            cache_roof=1.0 if m.roof == "cache" else 0.0)  # the roof it sits under (engine/hardware/roof.py)
        self.version += 1

    def add_batch_stats(self, b) -> None:
        """b: an engine BatchStats (after the step whose StepMetrics came just before)."""
        self.serving.append(
            x=max(self.steps.total - 1, 0), t_s=b.t_s, users=b.users, running=b.running, waiting=b.waiting,
            aggregate_tps=b.aggregate_tokens_per_s, per_request_tps=b.per_request_tokens_per_s,
            ttft_p50_s=b.ttft_p50_s, ttft_p95_s=b.ttft_p95_s, itl_p50_s=b.itl_p50_s, itl_p95_s=b.itl_p95_s,
            preempted=b.preempted_total, prefix_hit_pct=b.prefix_hit_pct)
        self.serving_policy = b.policy
        self.serving_version += 1

    def add_hardware(self, sample) -> None:
        """sample: an engine HardwareSample (NVML); x is the step the engine is at."""
        self.hardware.append(x=max(self.steps.total - 1, 0), t_s=sample.t_s, sm_util_pct=sample.sm_util_pct,
                             dram_bw_util_pct=sample.dram_bw_util_pct, tensor_active_pct=sample.tensor_active_pct)
        self.version += 1

    def annotate(self, text: str, label: str, t_s: float) -> Annotation:
        note = Annotation(float(self.next_x), t_s, text, label)
        self.annotations = (self.annotations + [note])[-MAX_ANNOTATIONS:]
        self.version += 1
        return note

    def start_reply(self, t0: float) -> None:
        self.reply_t0 = t0
        self.reply_t1 = None
        self.ttft_s = None
        self.version += 1

    def end_reply(self, t1: float) -> None:
        """The reply's last step ended at t1: steps after it (simulated users go on being served)
        are not the reply's."""
        self.reply_t1 = t1
        self.version += 1

    def reply_mask(self) -> np.ndarray:
        """Which steps in the buffer belong to the current (or last) reply: from its send to its
        last step."""
        start = self.steps.column("start_s")
        if self.reply_t0 is None:
            return np.zeros(len(start), bool)
        mask = start >= self.reply_t0 - 1e-3
        if self.reply_t1 is not None:
            mask &= self.steps.column("t_s") <= self.reply_t1 + 1e-6
        return mask

    def clear(self) -> None:
        self.steps.clear()
        self.hardware.clear()
        self.serving.clear()
        self.serving_version += 1
        self.labels = []
        self.peak_kinds = []
        self.annotations = []
        self.reply_t0 = None
        self.reply_t1 = None
        self.ttft_s = None
        self.version += 1


def _finite_or_none(value: float) -> float | None:
    return value if math.isfinite(value) else None
