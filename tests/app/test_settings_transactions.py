"""Settings are a transaction (process mode, as the app ships): random sequences of changes, valid and
invalid, sent idle and mid-reply; once the engine has answered every request, the controls show
exactly what the engine runs (asked for by `Query`), option by option."""
from __future__ import annotations

import dataclasses

import pytest
from app_test_helpers import GREEDY, confirmed, fake_cpu, queried_settings
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from app.controls import CONTROLS, Choice, Number, Slider, Toggle, get_field, with_field
from engine.settings import Settings

# (field, value): the tiny model takes INT4 groups 32 and 64, not 128; a CPU has no fp16; users need
# the KV cache and at most 64; max tokens >= 1; temperature 0..100; speculation is refused beside
# users, draft k is 1..8; a CPU has no captured decode step
CHANGES = st.one_of(
    st.tuples(st.just("dtype"), st.sampled_from(["fp32", "bf16", "fp16"])),
    st.tuples(st.just("weights"), st.sampled_from(["fp", "int8", "int4"])),
    st.tuples(st.just("group_size"), st.sampled_from([32, 64, 128])),
    st.tuples(st.just("kv_layout"), st.sampled_from(["contiguous", "paged", "off"])),
    st.tuples(st.just("kv_cache"), st.booleans()),
    st.tuples(st.just("attention"), st.sampled_from(["flash", "naive"])),
    st.tuples(st.just("users"), st.sampled_from([0, 1, 2, 65])),
    st.tuples(st.just("policy"), st.sampled_from(["continuous", "static"])),
    st.tuples(st.just("max_new_tokens"), st.sampled_from([0, 16, 400])),
    st.tuples(st.just("sampling.temperature"), st.sampled_from([-1.0, 0.0, 0.7])),
    st.tuples(st.just("speculate"), st.sampled_from(["off", "ngram", "draft"])),
    st.tuples(st.just("draft_tokens"), st.sampled_from([0, 3, 9])),
    st.tuples(st.just("cuda_graphs"), st.booleans()),
)


def shown(window) -> dict:
    """What each control displays, read off its widget."""
    controls = window.controls
    out = {}
    for control in CONTROLS:
        widget = controls.widgets.get(control.field)
        if widget is None:
            continue
        if isinstance(control, Choice):
            checked = widget.checkedButton()
            out[control.field] = checked.value if checked else None
        elif isinstance(control, Toggle):
            out[control.field] = widget.isChecked()
        elif isinstance(control, Slider):
            out[control.field] = widget.value()
        elif isinstance(control, Number):
            out[control.field] = widget.value() if control.decimals else int(widget.value())
    return out


def expected(settings: Settings) -> dict:
    return {c.field: get_field(settings, c.field) for c in CONTROLS if c.field in shown_fields}


shown_fields = {c.field for c in CONTROLS}


@pytest.fixture
def process_window(qtbot, tiny_model, monkeypatch):
    from app.window import MainWindow

    monkeypatch.setenv("OMP_NUM_THREADS", "1")
    # PyTorch's step (the C++ one decodes the tiny model's tokens far faster) and a long budget: the
    # first event batch leaves the engine process BATCH_INTERVAL_S_CPU into the reply (engine/host.py),
    # and mid_reply needs a reply still running when it arrives (400 tokens took 0.1-0.2 s here)
    monkeypatch.setenv("MEMBOUND_CPU_STEP", "0")
    window = MainWindow(model=tiny_model, hardware=fake_cpu(), engine_process=True,
                        settings=Settings(max_new_tokens=2000, sampling=GREEDY))
    qtbot.addWidget(window)
    with qtbot.waitSignal(window.model_ready, timeout=60_000):
        pass
    return window


def test_after_every_answer_the_controls_equal_the_engine_settings(process_window, qtbot):
    window = process_window

    @settings(max_examples=14, deadline=None, derandomize=True,
              suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
    @given(changes=st.lists(CHANGES, min_size=1, max_size=5), mid_reply=st.booleans())
    def run(changes, mid_reply):
        if mid_reply:
            window.send("keep talking while the settings change")
            qtbot.waitUntil(lambda: window.replying and window.data.steps.total > 0, timeout=60_000)
        for field, value in changes:  # one after another, without waiting for the answers
            window.apply_settings(with_field(window.controls.requested, field, value))
        confirmed(window, qtbot, timeout_ms=120_000)
        engine_settings = queried_settings(window, qtbot)
        assert window.settings == engine_settings == window.controls.settings
        assert window.controls.pending == {}
        assert shown(window) == expected(engine_settings)
        assert engine_settings.group_size != 128 and engine_settings.dtype != "fp16"
        assert not engine_settings.cuda_graphs and not (engine_settings.users and engine_settings.speculate != "off")
        if mid_reply and window.replying:
            with qtbot.waitSignal(window.reply_finished, timeout=60_000):
                window.stop()
        qtbot.waitUntil(lambda: not window.replying, timeout=60_000)
        if window.settings.users:  # the next example starts from a quiet engine
            window.apply_settings(dataclasses.replace(window.controls.requested, users=0))
            confirmed(window, qtbot)

    run()
