"""The hardware strip along the bottom: what the device is, its peak bandwidth and FLOP/s (spec
and measured), memory used, live NVML counters where they answer, and where each number comes
from. On a CPU it says "CPU — measured roof (how, when)" and never pretends to be a GPU."""
from __future__ import annotations

import os

from PySide6.QtCore import QEvent, Qt
from PySide6.QtWidgets import QFrame, QHBoxLayout, QLabel, QProgressBar, QSizePolicy, QVBoxLayout

from app.i18n import translate
from app.theme import Theme
from engine.hardware.spec import INT_DOT_KINDS


def _gb(n: float | None) -> str:
    return "?" if n is None else f"{n / 1e9:.1f} GB"


def _flops(value: float) -> str:
    return f"{value / 1e12:.1f} TFLOP/s" if value >= 1e12 else f"{value / 1e9:.1f} GFLOP/s"


def process_rss_bytes(pid: int | None = None) -> int | None:
    """Resident memory of process `pid` (None: this one; Linux /proc; None elsewhere or if it is gone)."""
    try:
        with open(f"/proc/{pid or 'self'}/statm") as statm:
            return int(statm.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    except (OSError, ValueError, IndexError):
        return None


def device_lines(spec) -> tuple[str, str, str]:
    """(device and source, bandwidth, compute) for a DeviceSpec."""
    if spec.kind == "cpu":
        device = f"{spec.name} — {spec.source or 'CPU'}"
    else:
        device = f"{spec.name} — {spec.source}{' · NVML' if spec.nvml else ' · no NVML'}"
    spec_word, measured_word = translate("HardwareStrip", "spec"), translate("HardwareStrip", "measured")
    bandwidth = []
    if spec.spec_bandwidth_gbs:
        bandwidth.append(f"{spec.spec_bandwidth_gbs:,.0f} GB/s ({spec_word})")
    if spec.measured_bandwidth_gbs:
        bandwidth.append(f"{spec.measured_bandwidth_gbs:,.1f} GB/s ({measured_word})")
    if getattr(spec, "cache_bandwidth_gbs", None):  # the roof of a step whose bytes fit the last-level cache
        bandwidth.append(translate("HardwareStrip", "{gbs} GB/s (last-level cache, {mib} MiB)").format(
            gbs=f"{spec.cache_bandwidth_gbs:,.1f}", mib=f"{(spec.cache_bytes or 0) / 2**20:.0f}"))
    compute = []
    for dtype in ("fp32", "bf16", "fp16"):
        spec_value = spec.peak_flops.get(dtype)
        measured = spec.measured_flops.get(dtype)
        if spec_value and measured and spec_value != measured:
            compute.append(f"{dtype} {_flops(spec_value)} ({spec_word}), {_flops(measured)} ({measured_word})")
        elif measured:
            compute.append(f"{dtype} {_flops(measured)} ({measured_word})")
        elif spec_value:
            compute.append(f"{dtype} {_flops(spec_value)} ({spec_word})")
    if spec.kind == "cpu":  # the integer dot products the quantised formats' C++ products run (kernels/cpu_roof.cpp)
        compute += [translate("HardwareStrip", "{kind} dots {rate} ({origin})").format(
            kind=kind, rate=_flops(spec.measured_flops[kind]), origin=measured_word)
            for kind in INT_DOT_KINDS if spec.measured_flops.get(kind)]
    unknown = translate("HardwareStrip", "unknown")
    return (device, translate("HardwareStrip", "peak bandwidth: {}").format(" · ".join(bandwidth) or unknown),
            translate("HardwareStrip", "peak compute: {}").format(" · ".join(compute) or unknown))


class OneLineLabel(QLabel):
    """A label kept to one line: text past its width ends in "…", and the whole text is its tooltip.
    It takes the width its layout gives and asks for none, so a long text never squeezes its neighbours."""

    def __init__(self, parent=None):
        super().__init__(parent)
        self._full_text = ""
        self.setSizePolicy(QSizePolicy.Policy.Ignored, QSizePolicy.Policy.Preferred)

    def full_text(self) -> str:
        return self._full_text

    def set_full_text(self, text: str) -> None:
        self._full_text = text
        self.setToolTip(text)
        self._elide()

    def resizeEvent(self, event) -> None:
        super().resizeEvent(event)
        self._elide()

    def _elide(self) -> None:
        self.ensurePolished()  # the style sheet's font and padding, before measuring with them
        width = max(self.contentsRect().width(), 1)
        self.setText(self.fontMetrics().elidedText(self._full_text, Qt.TextElideMode.ElideRight, width))


class SteadyLabel(QLabel):
    """A word-wrapped label whose height does not fall back while its width and font stay: a readout
    that wraps to two lines and back as its numbers change would resize what lies below it (a plot:
    a full repaint, and the plot jumping on stage) every few frames. It grows when a text needs more
    lines; a new width or font measures it afresh."""

    def __init__(self, text: str = "", parent=None):
        super().__init__(text, parent)
        self.setWordWrap(True)
        self._held = self._measured_chars = 0

    def setText(self, text: str) -> None:
        if text == self.text():  # (a readout that did not change: no text layout to measure, ~0.1 ms)
            return
        super().setText(text)
        self._hold(reset=False)

    def resizeEvent(self, event) -> None:
        super().resizeEvent(event)
        if event.size().width() != event.oldSize().width():
            self._hold(reset=True)

    def changeEvent(self, event) -> None:
        super().changeEvent(event)
        if event.type() in (QEvent.Type.FontChange, QEvent.Type.StyleChange):
            self._hold(reset=True)

    def _hold(self, reset: bool) -> None:
        if reset:  # (measured at the next text: the new font or width may not have been applied yet)
            self._held = self._measured_chars = 0
            self.setMinimumHeight(0)
            return
        width = self.width()
        # a text no longer than one measured at this width and font is not measured (a rich text's
        # layout, ~0.1-0.2 ms a readout, 4 times a second per title): were it to need more lines, the
        # layout still gives them (the held height is a floor, not a limit)
        if width <= 0 or not self.text() or len(self.text()) <= self._measured_chars:
            return
        self._measured_chars = len(self.text())
        need = self.heightForWidth(width)
        if need > self._held:
            self._held = need
            self.setMinimumHeight(need)


class HardwareStrip(QFrame):
    def __init__(self, theme: Theme, parent=None):
        super().__init__(parent)
        self.setObjectName("panel")
        self.theme = theme
        self.spec = None
        self.weight_bytes: int | None = None
        self.engine_pid: int | None = None  # the engine's process (None: it runs in this one)
        self.compact = self.small = False
        # word-wrapped (a 1280-pixel window with projector fonts wraps them rather than widening), and
        # steady: the memory line's figures change every few seconds without moving the plots above
        # the device and how its roof was measured: one line, the whole of it on hover (the probe's method
        # took three lines of a 1280x720 projector's strip, the plots' height)
        self.device_label = OneLineLabel()
        self.device_label.set_full_text(translate("HardwareStrip", "measuring the device…"))
        self.device_label.setObjectName("title")
        self.bandwidth_label = SteadyLabel()
        self.compute_label = SteadyLabel()
        self.memory_label = SteadyLabel()
        self.live_label = SteadyLabel()
        for label in (self.bandwidth_label, self.compute_label, self.memory_label, self.live_label):
            label.setObjectName("caption")
        self.progress = QProgressBar()
        self.progress.setRange(0, 1000)
        self.progress.setMaximumWidth(420)
        self.progress.setVisible(False)
        self.progress_label = QLabel("")
        self.progress_label.setObjectName("caption")
        self.path_label = OneLineLabel()  # on a CPU: which step decodes, at which vector level (whole line on hover)
        self.path_label.setObjectName("caption")
        self.path_label.setVisible(False)
        self.notes_label = OneLineLabel()  # kernels that failed their check at load, and what runs instead
        self.notes_label.setObjectName("error")
        self.notes_label.setVisible(False)
        left = QVBoxLayout()
        left.setSpacing(0)
        left.addWidget(self.device_label)
        left.addWidget(self.bandwidth_label)
        left.addWidget(self.compute_label)
        right = QVBoxLayout()
        right.setSpacing(0)
        right.addWidget(self.memory_label)
        right.addWidget(self.live_label)
        right.addWidget(self.path_label)
        right.addWidget(self.notes_label)
        right.addWidget(self.progress_label)
        right.addWidget(self.progress)
        layout = QHBoxLayout(self)
        layout.setContentsMargins(10, 4, 10, 4)
        layout.addLayout(left, 3)
        layout.addLayout(right, 2)

    def set_compact(self, compact: bool) -> None:
        """Compact (the presenter layout): the device line only; notes and progress still show."""
        self.compact = compact
        self._show_lines()

    def set_small(self, small: bool) -> None:
        """Small (a window too short for the strip's lines: a projector, large fonts): as compact."""
        self.small = small
        self._show_lines()

    def _show_lines(self) -> None:
        short = self.compact or self.small
        for label in (self.bandwidth_label, self.compute_label, self.memory_label, self.live_label):
            label.setVisible(not short)
        self.path_label.setVisible(not short and bool(self.path_label.full_text()))
        # the device line takes the width, but for what the right column still says (notes, progress)
        busy = self.notes_label.isVisibleTo(self) or self.progress.isVisibleTo(self)
        self.layout().setStretch(1, 0 if short and not busy else 2)
        lines = [self.bandwidth_label.text(), self.compute_label.text(), self.memory_label.text(),
                 self.live_label.text()]
        self.device_label.setToolTip("\n".join(line for line in [self.device_label.full_text(), *lines] if line)
                                     if short else self.device_label.full_text())

    def set_progress(self, fraction: float, message: str) -> None:
        busy = fraction < 1.0
        self.progress.setVisible(busy)
        self.progress.setValue(int(1000 * max(0.0, min(fraction, 1.0))))
        self.progress_label.setText(message if busy else "")
        self._show_lines()

    def set_notes(self, notes: list[str]) -> None:
        """One line, ending in "…" where it does not fit (the whole text is its tooltip, and the chat
        said each note in full at load): wrapped, a note took the plots' height at large fonts."""
        self.notes_label.set_full_text(" · ".join(notes))
        self.notes_label.setVisible(bool(notes))
        self._show_lines()

    def set_decode_path(self, line: str) -> None:
        """The CPU's decode path (engine Capabilities.decode_path), one elided line; hidden when empty."""
        self.path_label.set_full_text(line)
        self._show_lines()

    def set_device(self, spec, weight_bytes: int | None = None) -> None:
        self.spec = spec
        self.weight_bytes = weight_bytes
        device, bandwidth, compute = device_lines(spec)
        self.device_label.set_full_text(device)
        self.bandwidth_label.setText(bandwidth)
        self.compute_label.setText(compute)
        self.update_memory(None)

    def show_source(self, spec, device_line: str = "", live_line: str = "") -> None:
        """A source that is not this machine's engine (a server): its peaks, or `device_line` where none
        is known, and `live_line` on where its figures come from; none of this machine's readings."""
        if spec is not None:
            self.set_device(spec)
        else:
            self.device_label.set_full_text(device_line)
            self.bandwidth_label.setText("")
            self.compute_label.setText("")
        self.spec = None  # this machine's memory and NVML readings are not the source's
        self.memory_label.setText("")
        self.live_label.setText(live_line)

    def update_memory(self, sample) -> None:
        """sample: a HardwareSample (GPU, NVML) or None (CPU: the OS's figure for this process)."""
        spec = self.spec
        if spec is None:
            return
        weights = (translate("HardwareStrip", "weights {size} (model)").format(size=_gb(self.weight_bytes))
                   if self.weight_bytes else "")
        if sample is not None and sample.memory_used_bytes is not None:
            used = translate("HardwareStrip", "memory used {used} of {total} (NVML)").format(
                used=_gb(sample.memory_used_bytes), total=_gb(sample.memory_total_bytes))
            live = []
            if sample.dram_bw_util_pct is not None:
                live.append(translate("HardwareStrip", "DRAM bandwidth {pct}% of peak (NVML GPM)").format(
                    pct=f"{sample.dram_bw_util_pct:.0f}"))
            if sample.mem_util_pct is not None:
                live.append(translate("HardwareStrip", "memory busy {pct}% of time (NVML)").format(
                    pct=f"{sample.mem_util_pct:.0f}"))
            if sample.sm_util_pct is not None:
                live.append(translate("HardwareStrip", "SM busy {pct}% (NVML)").format(pct=f"{sample.sm_util_pct:.0f}"))
            if sample.power_w is not None:
                live.append(f"{sample.power_w:.0f} W (NVML)")
            if sample.sm_clock_mhz is not None:
                live.append(f"SM {sample.sm_clock_mhz:.0f} MHz")
            self.live_label.setText(" · ".join(live))
        else:
            rss = process_rss_bytes(self.engine_pid)
            used = translate("HardwareStrip", "engine process {used} of {total} RAM (OS)").format(
                used=_gb(rss), total=_gb(spec.memory_total_bytes)) if rss else f"RAM {_gb(spec.memory_total_bytes)}"
            self.live_label.setText(translate("HardwareStrip", "no NVML here: throughput and utilisation are "
                                                               "modelled (cost model ÷ measured step time)")
                                    if spec.kind == "cpu" or not spec.nvml else "")
        self.memory_label.setText(" · ".join(p for p in (weights, used) if p))
        if self.compact or self.small:
            self._show_lines()  # (the device line's tooltip has them)

    def set_theme(self, theme: Theme) -> None:
        self.theme = theme
