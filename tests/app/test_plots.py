"""Each plot view on its own: built on a `LiveData` fed by hand (no engine), drawn, and read back
from its pyqtgraph items; then the grid's redraw and readout gating."""
from __future__ import annotations

import numpy as np
import pytest
from PySide6.QtWidgets import QApplication
from app_test_helpers import fake_cpu

from app.live_data import LiveData
from app.plots import PlotsPanel
from app.plots.compute import ComputePlot
from app.plots.memory import MemoryPlot
from app.plots.roofline import RooflinePlot
from app.plots.step_plot import StepWindow
from app.plots.timeline import TimelinePlot
from app.plots.tokens import TokensPlot
from app.theme import DARK, SettingColours
from engine.metrics import StepMetrics

FP32, KV_OFF = "fp32 · kv on", "fp32 · kv off"
PEAK_BPS, PEAK_FLOPS = 20e9, 1e11  # fake_cpu's


def step(i: int, phase: str = "decode", label: str = FP32, t_s: float = 0.0, flops: int = 2 * 10**6,
         step_s: float = 0.01) -> StepMetrics:
    return StepMetrics(step=i, phase=phase, batch_size=1, new_tokens=8 if phase == "prefill" else 1, tokens_out=1,
                       context_len=i, step_s=step_s, weight_bytes=10**6, kv_read_bytes=1000, kv_write_bytes=100,
                       other_bytes=0, flops=flops, peak_bandwidth_bps=PEAK_BPS, peak_flops=PEAK_FLOPS,
                       t_s=t_s or 100.0 + 0.01 * (i + 1), settings_label=label)


@pytest.fixture
def data() -> LiveData:
    """A reply sent at t=100 s: a prefill, 5 decode steps, the KV cache switched off, 4 more."""
    live = LiveData()
    live.start_reply(100.0)
    live.add_step(step(0, "prefill"))
    for i in range(1, 6):
        live.add_step(step(i))
    live.annotate("kv cache off", KV_OFF, 100.06)
    for i in range(6, 10):  # recomputing the context: compute-bound, the roofline's ceiling is lower
        live.add_step(step(i, label=KV_OFF, flops=10**10))
    live.end_reply(100.1)
    return live


def make(view_class, data, qtbot, hardware=None):
    view = view_class(data, DARK, SettingColours(DARK))
    qtbot.addWidget(view)
    if hardware is not None:
        view.set_hardware(hardware)
    view.draw(StepWindow(data))
    return view


def finite(item) -> np.ndarray:
    x, y = item.getData()
    return np.asarray(x)[np.isfinite(y)] if x is not None else np.array([])


def test_tokens_plot_draws_a_line_per_setting_under_its_ceilings(data, qtbot):
    view = make(TokensPlot, data, qtbot)
    assert set(view.series) == {0, 1}  # one line per settings label
    assert finite(view.series[0]).tolist() == [1, 2, 3, 4, 5]  # the prefill is a marker, not on the line
    assert finite(view.series[1]).tolist() == [6, 7, 8, 9]
    assert view.prefill_item.getData()[0].tolist() == [0]
    assert len(finite(view.ceiling_item)) == 9
    assert finite(view.roof_ceiling_item).tolist() == [6, 7, 8, 9]  # only where compute-bound
    assert [line.label.format for line in view.annotation_lines] == ["▸ kv cache off"]
    assert view.annotation_lines[0].value() == 5.5  # between the last step before and the first after
    assert view.readout().startswith("decode 100.0 tok/s · ceiling")


def test_memory_and_compute_plots_draw_against_the_device_peaks(data, qtbot):
    memory = make(MemoryPlot, data, qtbot, fake_cpu())
    assert finite(memory.series[0]).tolist() == [0, 1, 2, 3, 4, 5]  # every phase: bytes moved
    gbs = memory.series[0].getData()[1][1]
    assert gbs == pytest.approx((10**6 + 1100) / 0.01 / 1e9)
    line = memory._peak_lines["measured_bw"]
    assert line.isVisible() and line.value() == 20.0 and "measured peak 20 GB/s" in line.label.format
    assert not memory._peak_lines["spec_bw"].isVisible()  # a CPU has no datasheet figure
    compute = make(ComputePlot, data, qtbot, fake_cpu())
    assert compute.series[1].getData()[1][-1] == pytest.approx(100 * 10**10 / 0.01 / PEAK_FLOPS)
    peak = compute._peak_lines["peak_flops"]
    assert peak.value() == 100.0 and peak.label.format == "peak 100.0 GFLOP/s fp32 (measured)"
    assert len(compute.annotation_lines) == len(memory.annotation_lines) == 1
    assert "% of peak" in memory.readout() and "MFU" in compute.readout()


def test_the_compute_peak_names_what_the_step_multiplies_with(qtbot):
    """An INT4 step of the C++ step is measured against its parts' roofs (engine/metrics.py measured):
    its layers' int8 dot products, its INT8 head's int16 ones, attention at fp32; the line says so."""
    from dataclasses import replace
    live = LiveData()
    live.start_reply(100.0)
    for i in range(4):
        live.add_step(replace(step(i, label="fp32 · int4 g32 · kv on"), peak_flops=3.5e11,
                              peak_kind="int8/int16 dots + fp32"))
    compute = make(ComputePlot, live, qtbot, fake_cpu())
    assert compute._peak_lines["peak_flops"].label.format == "peak 350.0 GFLOP/s int8/int16 dots + fp32 (measured)"
    assert compute.series[0].getData()[1][-1] == pytest.approx(100 * 2e6 / 0.01 / 3.5e11)  # MFU of that roof


def test_a_step_under_the_cache_roof_is_read_against_it_and_the_plot_draws_that_roof(qtbot):
    # an Intel guest's int4 step: ~100 MB fits its 120 MiB cache roof (56 GB/s); the readout once said
    # "34% of peak" under a line marked "measured peak 31 GB/s" (34% was of the cache's 56)
    from dataclasses import replace
    cpu = replace(fake_cpu(), cache_bandwidth_gbs=80.0, cache_bytes=120 << 20)
    live = LiveData()
    live.start_reply(100.0)
    live.add_step(step(0, "prefill"))
    for i in range(1, 6):
        live.add_step(replace(step(i), peak_bandwidth_bps=80e9, roof="cache"))
    memory = make(MemoryPlot, live, qtbot, cpu)
    line = memory._peak_lines["cache_bw"]
    assert line.isVisible() and line.value() == 80.0 and "last-level cache 80 GB/s (steps up to 120 MiB)" in line.label.format
    assert memory.readout().endswith(f"{100 * (10**6 + 1100) / 0.01 / 80e9:.0f}% of the cache roof")
    live.add_step(replace(step(6), peak_bandwidth_bps=45e9, roof="cache"))  # where the cache gives out:
    assert memory.readout().endswith("% of the cache roof")  # its roof a read of its size, still the cache's
    live.add_step(step(7))  # a step under the memory roof: "of peak" again
    assert memory.readout().endswith("% of peak")
    # past the cache, a read of the step's size a little faster than the memory roof's (Roof.level_for):
    # its roof, but not "the cache's" (the bf16 step of the Intel guest, 36.6 GB/s against 31.7)
    live.add_step(replace(step(8), peak_bandwidth_bps=23e9, roof="memory"))
    assert memory.readout().endswith("% of 23 GB/s")  # not "of peak": the line there is the memory's 20
    plain = make(MemoryPlot, live, qtbot, fake_cpu())  # no cache roof measured: no line
    assert not plain._peak_lines["cache_bw"].isVisible()


def test_a_peak_line_whose_label_does_not_fit_takes_its_short_form_before_it_hides(qtbot):
    # large fonts at 1280x720: the cache line's label ("last-level cache 61 GB/s (steps up to 184 MiB)")
    # hid, and a yellow dashed line stood in the memory plot with nothing saying what it was
    from dataclasses import replace
    live = LiveData()
    live.start_reply(100.0)
    live.add_step(step(0, "prefill"))
    memory = make(MemoryPlot, live, qtbot, replace(fake_cpu(), cache_bandwidth_gbs=61.0, cache_bytes=184 << 20))
    memory.show()
    label = memory._peak_lines["cache_bw"].label
    memory.resize(900, 300)
    qtbot.waitUntil(lambda: memory.plot.getViewBox().sceneBoundingRect().width() > 700)
    memory.fit_peak_labels()
    assert label.isVisible() and label.format == "last-level cache 61 GB/s (steps up to 184 MiB)"
    memory.resize(260, 300)
    qtbot.waitUntil(lambda: memory.plot.getViewBox().sceneBoundingRect().width() < 240)
    memory.fit_peak_labels()
    assert label.isVisible() and label.format == "cache 61 GB/s"
    memory.resize(900, 300)  # room again: the whole label
    qtbot.waitUntil(lambda: memory.plot.getViewBox().sceneBoundingRect().width() > 700)
    memory.fit_peak_labels()
    assert label.isVisible() and label.format.startswith("last-level cache")


def test_a_gpu_with_nvml_adds_its_measured_counters_beside_the_model(data, qtbot):
    from engine.hardware.nvml import HardwareSample
    from engine.hardware.spec import DeviceSpec

    h200 = DeviceSpec(name="NVIDIA H200", kind="cuda", peak_bandwidth_gbs=4800.0, peak_flops={"bf16": 989e12},
                      spec_bandwidth_gbs=4800.0, measured_bandwidth_gbs=4200.0, nvml=True)
    for pct in (50.0, 75.0):
        data.add_hardware(HardwareSample(t_s=100.1, sm_util_pct=90.0, dram_bw_util_pct=pct, tensor_active_pct=10.0))
    memory = make(MemoryPlot, data, qtbot, h200)
    assert memory.dram_item.getData()[1].tolist() == [2400.0, 3600.0]  # % of the datasheet peak, in GB/s
    assert memory._peak_lines["spec_bw"].isVisible() and memory._peak_lines["measured_bw"].value() == 4200.0
    compute = make(ComputePlot, data, qtbot, h200)
    assert compute.sm_item.getData()[1].tolist() == [90.0, 90.0]
    assert compute.tensor_item.getData()[1].tolist() == [10.0, 10.0]
    assert compute.plot.legend.getLabel(compute.sm_item) is not None
    cpu = make(ComputePlot, data, qtbot, fake_cpu())  # no NVML: nothing measured is drawn or named
    assert cpu.sm_item.getData()[0] is None and cpu.plot.legend.getLabel(cpu.sm_item) is None


def test_roofline_puts_the_dot_on_the_last_step_and_keeps_the_last_prefill(data, qtbot):
    view = make(RooflinePlot, data, qtbot)
    last = data.steps.last("ai")
    assert view.dot_item.xData.tolist() == pytest.approx([last])
    assert len(view.trail_item.xData) == 9  # every earlier step, up to the trail's length
    assert view.last_prefill_item.xData.tolist() == pytest.approx([data.steps.column("ai")[0]])
    ridge = PEAK_FLOPS / PEAK_BPS
    assert view.ridge_item.xData.tolist() == pytest.approx([ridge])
    assert view.readout() == f"decode {last:.2g} FLOP/B: {'compute' if last >= ridge else 'memory'}-bound"


def test_timeline_draws_the_reply_by_phase_and_marks_ttft(data, qtbot):
    data.annotate("bf16", "bf16 · kv on", 99.0)  # changed before this reply was sent
    view = make(TimelinePlot, data, qtbot)
    assert set(view.bars) == {"prefill", 0, 1}
    x, y = view.bars["prefill"].getData()
    assert x.tolist() == pytest.approx([0.0, 0.0, 0.01, 0.01]) and y.tolist() == pytest.approx([0, 10, 10, 0])
    assert view.ttft_line.isVisible() and view.ttft_line.value() == pytest.approx(0.01)
    kv_off, bf16 = view.annotation_lines
    assert kv_off.isVisible() and kv_off.value() == pytest.approx(0.06)  # at its time since send
    assert not bf16.isVisible()
    assert view.readout().startswith("TTFT 10 ms · 10 ms/token (median) · overhead ")


def test_panel_redraws_only_what_is_new_and_rebuilds_on_a_theme(data, qtbot):
    panel = PlotsPanel(data, DARK, SettingColours(DARK))
    qtbot.addWidget(panel)
    panel.set_hardware(fake_cpu())
    assert panel.refresh() and not panel.refresh() and panel.frames_drawn == 1
    panel.update_readouts()
    assert "tok/s" in panel.tokens.title_label.text()
    data.add_step(step(10, label=KV_OFF, flops=10**10, t_s=100.2))
    assert panel.refresh() and len(finite(panel.tokens.series[1])) == 5
    from app.theme import LIGHT

    panel.set_theme(LIGHT)  # rebuilt from scratch and drawn again from the same data
    assert panel.memory.theme is LIGHT and len(finite(panel.tokens.series[1])) == 5
    assert "tok/s" not in panel.tokens.title_label.text()  # readouts come back on the next update
    panel.update_readouts()
    assert "tok/s" in panel.tokens.title_label.text()


def test_a_title_that_wraps_and_unwraps_as_its_numbers_change_keeps_the_plot_s_height(qtbot):
    """A readout one line long, then two, then one again: the plot below it was resized (a full repaint
    and a jump on stage) each time it crossed the width; a new width measures it afresh."""
    from app.hardware_strip import SteadyLabel
    from PySide6.QtWidgets import QVBoxLayout, QWidget
    host = QWidget()
    qtbot.addWidget(host)
    column = QVBoxLayout(host)
    label, below = SteadyLabel(), QWidget()
    column.addWidget(label)
    column.addWidget(below, 1)
    host.resize(300, 300)
    host.show()
    short, long = "Memory traffic 32 GB/s", "Memory traffic 32.4 GB/s (model) · 58% of the cache roof · " * 2
    label.setText(short)
    qtbot.waitUntil(lambda: label.height() > 0)
    one_line = below.height()
    label.setText(long)
    qtbot.waitUntil(lambda: below.height() < one_line)
    two_lines = below.height()
    label.setText(short)
    QApplication.processEvents()
    assert below.height() == two_lines  # held: nothing below moved
    host.resize(900, 300)  # wide enough for one line: measured again at its next text
    QApplication.processEvents()
    label.setText(short)
    qtbot.waitUntil(lambda: below.height() > two_lines)


def test_a_frame_whose_ranges_move_paints_each_plot_once(data, qtbot):
    """A frame that moves the plots' view ranges repaints each plot once: the view's new transform is
    set before Qt paints (set during the paint, as pyqtgraph defers it, it queued a second paint of
    every plot area, ~1 ms each of the GUI thread a frame on a 2-core CPU engine)."""
    from PySide6.QtCore import QEvent, QObject

    class Paints(QObject):
        def __init__(self):
            super().__init__()
            self.count: dict[str, int] = {}

        def eventFilter(self, obj, event):
            if event.type() == QEvent.Type.Paint:
                self.count[obj.objectName()] = self.count.get(obj.objectName(), 0) + 1
            return False

    panel = PlotsPanel(data, DARK, SettingColours(DARK))
    qtbot.addWidget(panel)
    panel.set_hardware(fake_cpu())
    panel.resize(1100, 700)
    panel.show()
    qtbot.waitExposed(panel)
    assert panel.refresh()
    qtbot.wait(50)
    paints = Paints()
    for name, view in panel.views.items():
        if view.isVisibleTo(panel):
            view.widget.viewport().setObjectName(name)
            view.widget.viewport().installEventFilter(paints)
    for i in range(10, 80):  # past the x window's first page (50 steps), and a y range that grows
        data.add_step(step(i, label=KV_OFF, flops=10**10 * (1 + i // 20), t_s=100.2 + 0.01 * i))
    assert panel.refresh()
    qtbot.wait(100)
    moved = {name for name in ("tokens", "memory", "compute") if panel.views[name].isVisibleTo(panel)}
    assert moved and all(paints.count.get(name) == 1 for name in moved), paints.count
