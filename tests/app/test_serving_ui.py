"""Batching in the app: the simulated-users slider and the policy switch reach the engine, batched
steps keep arriving between the person's replies (the serving panel and the roofline follow them),
the person's reply still streams while users are served, and closing while serving leaks nothing."""
from __future__ import annotations

import dataclasses

import numpy as np
from app_test_helpers import activate, confirmed, send_and_wait
from PySide6.QtCore import Qt

from engine.events import BatchStats


def users_slider(window):
    return window.controls.widgets["users"]


def test_the_users_slider_is_bounded_by_memory_and_steps_by_doubling(make_window, qtbot):
    window = make_window(max_new_tokens=8)
    activate(window, qtbot)
    slider = users_slider(window)
    assert slider.maximum() == min(64, window.model_info.capabilities.max_users[window.settings.dtype]) and slider.maximum() >= 8
    assert slider.value() == 0 and slider.isEnabled()
    for expected in (1, 2, 4):
        qtbot.keyClick(window, Qt.Key.Key_Up, Qt.KeyboardModifier.AltModifier)
        confirmed(window, qtbot)
        assert window.settings.users == expected == users_slider(window).value()
    assert window.controls.slider_values["users"].text() == "4"
    # annotated where the engine applied it: users 1 and 2 may never have run a step
    qtbot.waitUntil(lambda: any("4 simulated users" in note.text for note in window.data.annotations),
                    timeout=10_000)
    assert window.worker.engine.settings.users == 4
    assert window.side_tabs.currentWidget() is window.serving_panel or not window.side_tabs.isVisibleTo(window)


def test_users_are_served_between_replies_and_the_panel_draws_them(make_window, qtbot, monkeypatch):
    # think times of 0-50 ms: an arrival then nearly always finds others decoding, so "mixed" steps come
    # every second (with the app's 0.2-1.5 s against a tiny model's millisecond replies they were rare
    # enough that once no step of the last 50 was one for 30 s: a failed fresh-clone run)
    monkeypatch.setenv("MEMBOUND_USER_THINK_S", "0,0.05")
    # every prompt computed whole: with the users' prompts kept across requests (engine/serving/prefix_store.py)
    # a repeated one computes its last token only, a decode-shaped row, and "mixed" steps end within seconds
    monkeypatch.setenv("MEMBOUND_PREFIX_CACHE", "0")
    window = make_window(max_new_tokens=8)
    window.view.show_seed_table(True)
    slider = users_slider(window)
    slider.setValue(4)  # keyboard or a drag's end: one change
    confirmed(window, qtbot)
    assert window.settings.users == 4
    qtbot.waitUntil(lambda: window.data.serving.total >= 30, timeout=30_000)
    assert not window.replying  # nobody typed: these are the simulated users alone
    serving = window.data.serving
    assert np.nanmax(serving.column("running")) >= 2  # requests ran together
    assert np.all(serving.column("users") == 4)
    assert np.all(serving.column("aggregate_tps")[-5:] > 0)
    window.side_tabs.setCurrentWidget(window.serving_panel)
    assert window.serving_panel.refresh(force=True)
    x, y = window.serving_panel.running_item.getData()
    assert len(x) == len(serving) and x[-1] == 0.0
    assert "batching" in window.serving_panel.readout.text() and "TTFT p50" in window.serving_panel.readout.text()
    assert "prefix cache" not in window.serving_panel.readout.text()  # (off: nothing to say)
    # the two short plots label 0 and their top only (their own ticks overlapped at projector fonts)
    for plot in (window.serving_panel.rate_plot, window.serving_panel.seq_plot):
        ticks = plot.getAxis("left")._tickLevels
        assert len(ticks) == 1 and len(ticks[0]) == 2 and ticks[0][0] == (0.0, "0") and ticks[0][1][0] > 0
    assert window.serving_panel.seq_plot.getAxis("left")._tickLevels[0][1] == (4.0, "4")  # four users
    batched = window.data.steps.column("ai")[-10:]
    assert np.nanmax(batched) > 0
    # arrivals join the running decodes: those steps are "mixed", drawn apart from prefill and decode
    qtbot.waitUntil(lambda: (window.data.steps.column("mixed")[-50:] > 0.5).any(), timeout=30_000)
    assert window.plots.refresh(force=True)
    mixed_x = window.plots.tokens.mixed_item.getData()[0]
    assert len(mixed_x) > 0 and not set(mixed_x) & set(window.plots.tokens.prefill_item.getData()[0])
    label = window.plots.tokens.plot.legend.getLabel(window.plots.tokens.mixed_item)
    assert label is not None and label.text == "prefill + decode"
    slider.setValue(0)
    qtbot.waitUntil(lambda: window.worker.engine is not None and not window.worker.engine.serving, timeout=30_000)


def test_the_person_reply_streams_beside_the_users(make_window, qtbot, monkeypatch):
    monkeypatch.setenv("MEMBOUND_USER_THINK_S", "0,0")  # a user request always in flight (the C++ step serves
    # a tiny model's in milliseconds, against think times of seconds: the reply could run alone)
    window = make_window(max_new_tokens=24)
    users_slider(window).setValue(3)
    qtbot.waitUntil(lambda: window.data.serving.total > 5, timeout=30_000)
    stats = []
    window.worker.events.connect(lambda batch: stats.extend(e for e in batch if isinstance(e, BatchStats)))
    done = send_and_wait(window, qtbot, "hello beside the crowd", timeout_ms=60_000)
    assert done.reason in ("max_tokens", "eos") and done.n_new_tokens >= 1
    assert done.text in window.chat.plain_text()
    assert any(s.person_in_batch and s.running >= 2 for s in stats)  # the reply was one of a batch
    assert "this reply, batched" in window.chat.plain_text() or done.n_new_tokens == 1
    in_reply = int(window.data.reply_mask().sum())
    assert in_reply >= done.n_new_tokens  # one token a step at most, after its prefill
    total = window.data.serving.total
    qtbot.waitUntil(lambda: window.data.serving.total > total + 5, timeout=30_000)  # the users go on
    assert int(window.data.reply_mask().sum()) == in_reply  # their later steps are not the reply's
    assert window.data.steps.last("t_s") > window.data.reply_t1
    # the users' prompts repeat (24 bundled ones): their share taken from the prefix cache reaches the panel
    hits = window.data.serving.column("prefix_hit_pct")
    assert np.isfinite(hits).any() and np.nanmax(hits) > 0
    window.side_tabs.setCurrentWidget(window.serving_panel)
    assert window.serving_panel.refresh(force=True) and "prefix cache" in window.serving_panel.readout.text()


def test_the_policy_switch_reaches_the_engine_and_is_annotated(make_window, qtbot):
    window = make_window(max_new_tokens=8)
    activate(window, qtbot)
    users_slider(window).setValue(2)
    qtbot.keyClick(window, Qt.Key.Key_F12)
    confirmed(window, qtbot)
    assert window.settings.policy == "static"
    qtbot.waitUntil(lambda: window.data.serving_policy == "static", timeout=30_000)
    assert any("static batching" in note.text for note in window.data.annotations)


def test_kv_off_is_disabled_while_users_are_served_and_refused_if_asked(make_window, qtbot):
    window = make_window(max_new_tokens=8)
    users_slider(window).setValue(2)
    confirmed(window, qtbot)
    toggle = window.controls.widgets["kv_cache"]
    assert not toggle.isEnabled() and "KV cache" in toggle.toolTip()
    off = [b for b in window.controls.widgets["kv_layout"].buttons() if b.value == "off"][0]
    assert not off.isEnabled() and "KV cache" in off.toolTip()
    window.controls.toggle("kv_cache")  # the key does nothing while the switch is disabled
    assert not window.settings_pending
    window.apply_settings(dataclasses.replace(window.settings, kv_layout="off"))  # asked anyway: refused
    confirmed(window, qtbot)
    assert window.settings.kv_cache is True and "KV cache" in window.last_error and toggle.isChecked()


def test_closing_while_serving_leaves_nothing_running(make_window, qtbot):
    window = make_window(max_new_tokens=8)
    users_slider(window).setValue(4)
    qtbot.waitUntil(lambda: window.data.serving.total > 3, timeout=30_000)
    window.close()
    assert not window.worker.isRunning()


def test_the_readout_says_what_share_of_the_users_prompts_the_prefix_cache_gave():
    from app.serving_panel import latency_readout
    row = {"ttft_p50_s": 0.12, "ttft_p95_s": 0.48, "itl_p50_s": 0.035, "itl_p95_s": 0.06, "preempted": 2.0}
    assert latency_readout(row).endswith("pre-empted 2")
    assert latency_readout({**row, "prefix_hit_pct": float("nan")}).endswith("pre-empted 2")
    assert latency_readout({**row, "prefix_hit_pct": 86.4}).endswith("pre-empted 2   prefix cache 86%")
