"""The window on a tiny random model: streamed replies, plots fed from ring buffers, settings
changed mid-reply (annotated where the engine applied them), Stop, errors that leave the app
running, and closing mid-reply. Every test also passes the conftest's leak check."""
from __future__ import annotations

import dataclasses
import time

import numpy as np
import pytest
from app_test_helpers import GREEDY, activate, confirmed, fake_cpu, send_and_wait
from PySide6.QtCore import Qt
from PySide6.QtWidgets import QApplication

from engine.events import DoneEvent, TokenEvent
from engine.metrics import StepMetrics
from engine.settings import Settings
from engine.steps.plain import PlainSteps


def test_a_prompt_streams_a_reply_into_the_chat_panel(make_window, qtbot):
    # long enough to outlast the host's event interval on a CPU (engine/host.py BATCH_INTERVAL_S_CPU,
    # 0.2 s) even where the tiny model decodes in C++ (engine/model/cpu_step.py: ~0.1 ms a token)
    window = make_window(max_new_tokens=3000)
    batches = []
    window.worker.events.connect(lambda batch: batches.append(
        "".join(e.text for e in batch if isinstance(e, TokenEvent))))
    partial = []
    window.worker.events.connect(lambda _batch: partial.append(window.chat.reply_text))
    done = send_and_wait(window, qtbot, "hello there")
    assert isinstance(done, DoneEvent) and done.reason == "max_tokens" and done.n_new_tokens == 3000
    streamed = [text for text in batches if text]
    assert len(streamed) >= 2, "the reply arrived in one piece, not streamed"
    assert "".join(streamed) == done.text
    assert 0 < len(partial[0]) < len(done.text)  # the panel showed part of it before the end
    transcript = window.chat.plain_text()
    assert "hello there" in transcript and done.text in transcript and "3000 tokens" in transcript
    assert "assistant:" not in transcript  # the chat template stays hidden
    assert window.chat.send_button.isEnabled() and not window.chat.stop_button.isEnabled()


def test_plots_receive_every_step_in_their_ring_buffers(make_window, qtbot):
    window = make_window(max_new_tokens=40)
    done = send_and_wait(window, qtbot, "count the steps")
    steps = window.data.steps
    assert steps.total == done.n_new_tokens == 40
    assert steps.column("prefill")[0] == 1 and np.all(steps.column("prefill")[1:] == 0)
    assert np.all(steps.column("tokens_per_s") > 0) and np.all(steps.column("gbs") > 0)
    qtbot.waitUntil(lambda: window.plots.frames_drawn > 0 and window.plots._drawn_version == window.data.version)
    decode_series = window.plots.tokens.series[0]
    x, y = decode_series.getData()
    assert len(x) == 40 and np.isfinite(y).sum() == 39  # the prefill step is its own marker
    assert len(window.plots.tokens.prefill_item.getData()[0]) == 1
    # no simulated users, no "prefill + decode" steps: not in a legend either
    assert window.plots.tokens.plot.legend.getLabel(window.plots.tokens.mixed_item) is None
    assert set(window.plots.timeline.bars) == {"prefill", 0}
    assert window.data.ttft_s is not None and window.data.ttft_s > 0
    # the roofline's live dot is the last (decode) step, left of the ridge: memory-bound
    ridge = 1e11 / 20e9  # the fake CPU's peak FLOP/s / peak bytes/s
    assert window.plots.roofline.dot_item.xData[0] == pytest.approx(window.data.steps.last("ai"))
    assert window.data.steps.last("ai") < ridge
    assert window.plots.roofline.last_prefill_item.xData[0] > window.data.steps.last("ai")  # prefill lands right


def test_kv_cache_toggled_mid_reply_reaches_the_engine_and_is_annotated(make_window, qtbot):
    window = make_window(max_new_tokens=3000)
    activate(window, qtbot)
    window.send("a long reply please")
    qtbot.waitUntil(lambda: window.data.steps.total > 5, timeout=10_000)
    qtbot.keyClick(window, Qt.Key.Key_F2)  # the stage shortcut for the KV cache switch
    confirmed(window, qtbot)
    assert window.settings.kv_cache is False
    qtbot.waitUntil(lambda: any("kv cache off" in n.text for n in window.data.annotations), timeout=10_000)
    note = next(n for n in window.data.annotations if "kv cache off" in n.text)
    assert window.worker.engine.settings.kv_cache is False
    with qtbot.waitSignal(window.reply_finished, timeout=10_000) as finished:
        window.stop()
    assert finished.args[0].reason == "stopped"
    after = [s for s in window.reply_steps if s.step >= window.reply_steps[0].step + note.x]
    assert after and all(s.kv_bytes == 0 and s.new_tokens > 1 for s in after)  # recomputes the context
    assert all(s.kv_read_bytes > 0 for s in window.reply_steps[1:int(note.x)])
    window.plots.refresh(force=True)
    labels = [line.label.format for line in window.plots.tokens.annotation_lines]
    assert any("kv cache off" in text for text in labels)
    for plot in ("memory", "compute", "timeline"):  # every time plot carries the line
        assert len(window.plots.views[plot].annotation_lines) == len(window.plots.tokens.annotation_lines)
    assert "off" in window.controls.widgets["kv_cache"].text().lower()


def test_a_setting_changed_between_replies_is_annotated_at_once(make_window, qtbot):
    window = make_window(max_new_tokens=8)
    before = len(window.data.annotations)
    window.controls.cycle("dtype")  # fp32 -> bf16 (fp16 is refused on a CPU and skipped)
    assert window.settings.dtype == "fp32" and window.settings_pending  # shown once the engine confirms
    confirmed(window, qtbot)
    assert window.settings.dtype == "bf16" and window.controls.widgets["dtype"].checkedButton().value == "bf16"
    assert "→ bf16" in window.chat.model_label.text() and "fp32" not in window.chat.model_label.text()
    assert len(window.data.annotations) == before + 1 and window.data.annotations[-1].text == "bf16"
    fp16 = next(b for b in window.controls.widgets["dtype"].buttons() if b.value == "fp16")
    assert not fp16.isEnabled() and "fp16" in fp16.toolTip()
    done = send_and_wait(window, qtbot, "now in bf16")
    assert done.n_new_tokens == 8 and window.reply_steps[-1].settings_label.startswith("bf16")


def test_stop_ends_the_reply_and_the_chat_goes_on(make_window, qtbot):
    window = make_window(max_new_tokens=3000)
    activate(window, qtbot)
    window.send("go on forever")
    qtbot.waitUntil(lambda: window.data.steps.total > 3, timeout=10_000)
    with qtbot.waitSignal(window.reply_finished, timeout=10_000) as finished:
        qtbot.keyClick(window.chat.input, Qt.Key.Key_Escape)
    done = finished.args[0]
    assert done.reason == "stopped" and 0 < done.n_new_tokens < 3000
    assert "stopped" in window.chat.plain_text()
    window.apply_settings(Settings(max_new_tokens=5, sampling=window.settings.sampling))
    done2 = send_and_wait(window, qtbot, "second turn")
    assert done2.reason == "max_tokens" and done2.n_new_tokens == 5
    assert done2.n_cached_tokens > 0 and "prompt tokens cached)" in window.chat.plain_text()  # the first turn's
    assert [m["role"] for m in window.worker.engine.messages] == ["user", "assistant", "user", "assistant"]


def test_a_failing_step_shows_a_message_and_the_app_survives(make_window, qtbot, monkeypatch):
    window = make_window(max_new_tokens=20)
    send_and_wait(window, qtbot, "first turn")
    kept = list(window.worker.engine.messages)
    real_step = PlainSteps.run  # the batch-1 step (engine/steps/plain.py)
    calls = {"n": 0}

    def failing_step(self, *args, **kwargs):
        calls["n"] += 1
        if calls["n"] == 4:
            raise RuntimeError("simulated kernel failure")
        return real_step(self, *args, **kwargs)

    monkeypatch.setattr(PlainSteps, "run", failing_step)
    with qtbot.waitSignal(window.error_shown, timeout=10_000):
        window.send("this one breaks")
    qtbot.waitUntil(lambda: not window.replying)
    assert "simulated kernel failure" in window.last_error and window.error_bar.isVisibleTo(window)
    assert "simulated kernel failure" in window.chat.plain_text()
    assert window.worker.engine.messages == kept  # the failed turn is not part of the conversation
    monkeypatch.setattr(PlainSteps, "run", real_step)
    done = send_and_wait(window, qtbot, "and again")
    assert done.n_new_tokens == 20 and not window.error_bar.isVisibleTo(window)
    assert len(window.worker.engine.messages) == len(kept) + 2


def test_a_bad_model_path_is_reported_and_the_loaded_model_stays(make_window, qtbot, tmp_path):
    window = make_window(max_new_tokens=6)
    loaded = window.model_info
    with qtbot.waitSignal(window.error_shown, timeout=10_000) as shown:
        window.load_model(str(tmp_path / "missing.gguf"), "cpu", window.hardware, window.settings)
    assert "model not found" in shown.args[0] and "still using" in shown.args[0]
    qtbot.waitUntil(lambda: not window.loading)
    assert window.model_info is loaded and window.chat.send_button.isEnabled()
    assert send_and_wait(window, qtbot, "still here?").n_new_tokens == 6


def test_a_broken_model_file_is_reported_without_a_model(qtbot, tmp_path):
    from app_test_helpers import fake_cpu

    from app.window import MainWindow

    bad = tmp_path / "broken.gguf"
    bad.write_bytes(b"GGUF" + b"\0" * 64)
    window = MainWindow(model=str(bad), hardware=fake_cpu())
    qtbot.addWidget(window)
    with qtbot.waitSignal(window.error_shown, timeout=20_000) as shown:
        pass
    assert shown.args[0].startswith("could not load the model")
    qtbot.waitUntil(lambda: not window.loading)
    assert window.model_info is None and not window.chat.send_button.isEnabled()


def test_closing_mid_reply_stops_the_worker_and_every_timer(make_window, qtbot):
    window = make_window(max_new_tokens=3000)
    window.send("keep talking")
    qtbot.waitUntil(lambda: window.data.steps.total > 3, timeout=10_000)
    assert window.replying and window.worker.isRunning() and window.frame_timer.isActive()
    t0 = time.monotonic()
    window.close()
    assert time.monotonic() - t0 < 5.0
    assert not window.worker.isRunning() and not window.frame_timer.isActive()
    assert window.worker.engine.messages[-1]["role"] == "assistant"  # the reply ended as "stopped"


def test_themes_and_large_fonts_redraw_the_same_data(make_window, qtbot):
    window = make_window(max_new_tokens=12)
    send_and_wait(window, qtbot, "colours")
    colour_dark = window.colours.colour(window.data.labels[0])
    window.view.toggle_theme()
    assert window.theme.name == "light" and window.theme.background in window.styleSheet()
    window.set_large_fonts(True)
    assert window.theme.font_pt >= 15 and window.fonts_button.isChecked()
    assert window.plots.refresh(force=True)
    assert window.colours.colour(window.data.labels[0]) != colour_dark  # same slot, light palette
    x, _ = window.plots.tokens.series[0].getData()
    assert len(x) == 12
    window.view.toggle_theme()
    window.set_large_fonts(False)
    assert window.theme.name == "dark" and window.colours.colour(window.data.labels[0]) == colour_dark


def test_the_hardware_strip_and_seed_table_name_their_sources(make_window):
    window = make_window()
    strip = window.hardware_strip
    assert "CPU — measured roof" in strip.device_label.full_text()
    # one line however long the probe's method (three lines of a 1280x720 strip): all of it on hover
    assert strip.device_label.toolTip() == strip.device_label.full_text()
    assert "20.0 GB/s (measured)" in strip.bandwidth_label.text()
    assert "(model)" in strip.memory_label.text() and "no NVML" in strip.live_label.text()
    table = window.seed_table.table
    headers = [table.horizontalHeaderItem(i).text() for i in range(table.columnCount())]
    assert headers[0].startswith("this CPU") and [h.split()[0] for h in headers[1:4]] == ["A100", "H100", "H200"]
    assert [h.split("\n")[0] for h in headers[4:]] == ["TP 2", "TP 4", "TP 8"]  # tensor parallelism over H100s
    rows = [table.verticalHeaderItem(i).text() for i in range(table.rowCount())]
    assert rows[0].startswith("tiny") and any(r.startswith("llama3-70b") for r in rows)
    r70 = next(i for i, r in enumerate(rows) if r.startswith("llama3-70b"))
    assert table.item(r70, 1).text() == "OOM"  # 70B fp32 weights do not fit in 80 GB
    assert table.item(r70, 4).text() == "OOM" != table.item(r70, 5).text()  # nor on 2 H100s (282 GB): on 4
    window.resize(1280, 720)
    window.show()
    QApplication.processEvents()
    assert strip.device_label.height() <= strip.device_label.fontMetrics().lineSpacing() + 8


def test_model_picker_builds_engine_specs(qtbot):
    from app.model_picker import ModelPicker

    picker = ModelPicker("synthetic:llama3-8b")
    qtbot.addWidget(picker)
    assert picker.spec() == "synthetic:llama3-8b" and picker.shape_box.isEnabled()
    picker.gguf_radio.setChecked(True)
    picker.path_edit.setText("/models/x.gguf")
    assert picker.spec() == "/models/x.gguf" and not picker.shape_box.isEnabled()
    picker.default_radio.setChecked(True)
    assert picker.spec() == "default" and picker.device() == "auto"


def test_screenshot_mode_answers_and_saves_the_window(qapp, tiny_model, tmp_path):
    from types import SimpleNamespace

    from app_test_helpers import GREEDY, fake_cpu
    from PySide6.QtGui import QImage

    from app.main import SCREENSHOT_SIZE, main

    path = tmp_path / "shot.png"
    code = main(SimpleNamespace(screenshot=str(path), prompt="hi", debug=False), model=tiny_model,
                hardware=fake_cpu(), settings=Settings(max_new_tokens=30, sampling=GREEDY), timeout_s=60)
    assert code == 0
    image = QImage(str(path))
    assert (image.width(), image.height()) == SCREENSHOT_SIZE


def test_step_metrics_reach_the_gui_as_plain_frozen_data(make_window, qtbot):
    window = make_window(max_new_tokens=5)
    seen = []
    window.worker.events.connect(lambda batch: seen.extend(batch))
    send_and_wait(window, qtbot, "types")
    kinds = {type(e).__name__ for e in seen}
    assert {"StepMetrics", "TokenEvent", "DoneEvent"} <= kinds
    metrics = next(e for e in seen if isinstance(e, StepMetrics))
    assert metrics.__dataclass_params__.frozen and isinstance(metrics.to_dict(), dict)


def test_kv_layout_switch_reaches_the_engine_and_the_kv_panel_draws_the_blocks(make_window, qtbot):
    """Paged KV mid-conversation: the engine switches layout and the KV panel gets block snapshots."""
    window = make_window()
    window.side_tabs.setCurrentWidget(window.kv_panel)
    window.apply_settings(dataclasses.replace(window.settings, kv_layout="paged"))
    send_and_wait(window, qtbot, "hello there")
    assert window.worker.engine.settings.kv_layout == "paged"
    qtbot.waitUntil(lambda: window.kv_panel.snapshot is not None and window.kv_panel.snapshot.layout == "paged",
                    timeout=10_000)
    snap = window.kv_panel.snapshot
    assert snap.blocks_used > 0 and snap.used_bytes > 0
    assert "weights" in window.controls.widgets and "attention" in window.controls.widgets


def test_switching_to_int8_measures_quality_and_shows_it_on_the_weights_switch(make_window, qtbot):
    window = make_window(max_new_tokens=8)
    window.apply_settings(dataclasses.replace(window.settings, weights="int8"))
    qtbot.waitUntil(lambda: window.quality is not None, timeout=180_000)
    send_and_wait(window, qtbot, "hello")  # and the int8 weights answer
    assert any("int8" in label for label in window.quality)
    tip = window.controls.widgets["weights"].buttons()[0].toolTip()
    assert "perplexity" in tip and "int8" in tip


def test_the_roofline_trail_reuses_its_rendered_symbols(make_window, qtbot):
    """pyqtgraph caches one rendered symbol per (pen, brush) object: a new pen per update made the
    atlas grow every frame, without end, over a long demo."""
    window = make_window(max_new_tokens=30)
    send_and_wait(window, qtbot, "fill the trail")
    window.plots.refresh(force=True)
    atlas = window.plots.roofline.trail_item.scatter.fragmentAtlas
    size = len(atlas)
    assert size > 0
    send_and_wait(window, qtbot, "and again")  # new steps: the trail moves, its styles repeat
    for _ in range(5):
        window.plots.refresh(force=True)
    assert len(window.plots.roofline.trail_item.scatter.fragmentAtlas) <= size + 1  # (one new colour at most)


def test_a_planted_over_count_shows_above_the_roof_in_the_window_and_the_recording(qtbot, tiny_model, tmp_path,
                                                                                  monkeypatch):
    """The window once raised its peaks to follow the engine's ratchet (MBU <= 100% by construction):
    a step above the measured roof is now drawn past it, said in the chat and the strip, and logged."""
    from app.recording import Recorder, read_recording
    from app.window import MainWindow
    from engine.hardware.roof import ABOVE_ROOF
    from engine.steps import plain as plain_steps  # the batch-1 step, where the cost model is charged

    real = plain_steps.step_cost

    def over_counted(*args, **kwargs):  # the cost model charges 10^5 x the weights the step reads
        return dataclasses.replace(real(*args, **kwargs), weight_bytes=10**5 * kwargs["weight_bytes"])
    monkeypatch.setattr(plain_steps, "step_cost", over_counted)
    recorder = Recorder(tmp_path / "talk.membound")
    window = MainWindow(model=tiny_model, hardware=fake_cpu(), settings=Settings(max_new_tokens=8, sampling=GREEDY),
                        recorder=recorder)
    qtbot.addWidget(window)
    with qtbot.waitSignal(window.model_ready, timeout=30_000):
        pass
    send_and_wait(window, qtbot, "hi")
    gbs_col, peak_bps = window.data.steps.column("gbs"), window.data.steps.column("peak_bps")
    assert np.nanmax(gbs_col * 1e9 / peak_bps) > 1.5  # the memory plot's data drawn past its peak line
    assert window.hardware == fake_cpu() and np.all(peak_bps == 20e9)  # the peak stays the measured one
    assert ABOVE_ROOF in window.chat.plain_text()
    assert window.chat.plain_text().count(ABOVE_ROOF) == 1  # one line, not one a step
    assert ABOVE_ROOF in window.hardware_strip.notes_label.full_text()
    window.plots.refresh(force=True)
    dot_ai, dot_flops = window.plots.roofline.dot_item.getData()
    assert dot_ai is not None and len(dot_ai) == 1
    window.close()
    recorder.close()
    logged = [e for e in read_recording(tmp_path / "talk.membound").entries if e.kind == "above_roof"]
    assert len(logged) == 1 and ABOVE_ROOF in logged[0].args[1]


def test_the_frame_budget_guards_only_an_engine_that_shares_the_cpu(qtbot):
    """Frames are held to a small share of the cores only while a local engine decodes on them; on a
    GPU, in a replay or attached to a server, the GUI may draw at its timer's rate."""
    import os

    from app import frame_clock as clock_module
    from app.window import MainWindow
    window = MainWindow(device="cpu", autoload=False)
    qtbot.addWidget(window)
    assert window.frames.gui_cpu_budget == pytest.approx(clock_module.GUI_SHARE_OF_CPU_MACHINE * (os.cpu_count() or 2))
    assert window.frames.min_fps == clock_module.MIN_FPS_CPU
    window.device = "cuda:0"
    assert window.frames.gui_cpu_budget == clock_module.GUI_CPU_BUDGET_GPU and window.frames.min_fps == clock_module.MIN_FPS_GPU
    from app.replay import ReplaySource
    replay = MainWindow(model="replay", device="cpu", autoload=False, worker=ReplaySource())
    qtbot.addWidget(replay)
    assert replay.frames.gui_cpu_budget == clock_module.GUI_CPU_BUDGET_GPU
    window.frames.tick()  # a tick hands the device's budget to the frame budget
    assert window.frames.frame_budget.budget_cores == clock_module.GUI_CPU_BUDGET_GPU
    window.close()
    replay.close()


def test_a_long_note_in_the_strip_keeps_to_one_line_and_leaves_the_plots_their_height(qtbot):
    """At 1280x720 with large fonts a wrapped note took the strip's width and height (the device line
    wrapped to five lines) and squashed the plots; it is one elided line, the whole of it a tooltip."""
    from PySide6.QtWidgets import QApplication

    from app.window import MainWindow
    window = MainWindow(device="cpu", autoload=False, large_fonts=True)
    qtbot.addWidget(window)
    window.resize(1280, 720)
    window.show()
    strip = window.hardware_strip
    strip.set_device(fake_cpu(), 10**8)
    QApplication.processEvents()
    height, plots_height = strip.height(), window.plots.height()
    note = ("C++ CPU decode step failed its check (its logits were 0.5 from PyTorch's) — using PyTorch's step "
            "instead, which streams the weights at a third of the bandwidth")
    strip.set_notes([note])
    QApplication.processEvents()
    line = strip.notes_label.fontMetrics().height()
    assert strip.notes_label.height() < 2 * line  # one line (and the style's padding)
    assert strip.height() <= height + 2 * line and window.plots.height() >= plots_height - 2 * line
    assert strip.notes_label.toolTip() == note and strip.notes_label.text().endswith("…")
    window.close()


def test_typing_goes_to_the_chat_from_the_start(make_window, qtbot):
    """A speaker types the first question without clicking: the keys went to the bar's "More…" button
    (and Space pressed it); gui-drive's click at 1280x720 lands on the strip, which takes no focus."""
    window = make_window()
    window.show()
    window.activateWindow()
    qtbot.waitUntil(lambda: QApplication.focusWidget() is not None)
    assert QApplication.focusWidget() is window.chat.input
    qtbot.keyClicks(QApplication.focusWidget(), "why")
    assert window.chat.input.text() == "why"
