"""app/gui_bench.py's own arithmetic: a reply's decode rate and the lateness figures (the bench itself
runs a model and a window: `python -m app.gui_bench`, docs/benchmarks.md)."""
from __future__ import annotations

import math
from types import SimpleNamespace

import pytest

from app.gui_bench import decode_tokens_per_s, lateness_ms


def step(phase: str, t_s: float):
    return SimpleNamespace(phase=phase, t_s=t_s)


def test_a_replys_rate_counts_decode_steps_between_the_first_and_the_last_and_skips_other_events():
    events = [step("prefill", 0.0), "a token", step("decode", 1.0), object(), step("decode", 1.5), step("decode", 2.0)]
    assert decode_tokens_per_s(events) == 2 / 1.0  # two steps after the first, in one second
    assert decode_tokens_per_s([step("prefill", 0.0), step("decode", 1.0)]) is None  # one step: no interval


def test_a_probe_that_never_ticked_gives_nan_not_an_error():
    assert math.isnan(lateness_ms([], 95))  # a 1000 ms probe over replies shorter than a second
    assert lateness_ms([1.0, 3.0], 100) == 3.0



def test_the_ratio_is_the_mean_of_each_replys_app_over_its_headless_run_and_skips_untimed_replies():
    from app.gui_bench import paired_ratios
    result = paired_ratios([180.0, None, 90.0], [200.0, 150.0, 100.0])
    assert result["app_over_headless_per_reply"] == [0.9, 0.9]
    assert result["app_over_headless"] == 0.9 and result["headless_decode_tokens_per_s"] == 150.0
    assert math.isnan(paired_ratios([None], [100.0])["app_over_headless"])


def test_the_in_window_users_run_serves_from_the_engine_process_as_the_app_does(monkeypatch):
    """`gui_bench --users` measures the window as it ships: the engine in its own process (it ran on a
    thread of the GUI's, its docstring saying otherwise, so its "app process cores" counted the engine)."""
    import app.window
    from app import gui_bench

    made = {}

    class Stop(Exception):
        pass

    def window(**kwargs):
        made.update(kwargs)
        raise Stop
    monkeypatch.setattr(app.window, "MainWindow", window)
    with pytest.raises(Stop):
        gui_bench.in_app_users("default", users=8, seconds=1.0)
    assert made["engine_process"] is True
    with pytest.raises(Stop):
        gui_bench.in_app_users("default", users=8, seconds=1.0, engine_process=False)
    assert made["engine_process"] is False


def test_warmup_replies_run_on_both_sides_and_are_not_counted(qapp):
    # the headless engine is warmed at its load; the app's first reply was its engine's first (cold),
    # which made "the first reply after load" the weakest pairing of every run before session 22
    from app import gui_bench
    asked = []
    result = gui_bench.in_app("default", tokens=6, replies=2, engine_process=False, settle_s=0.0,
                              after_reply=lambda i: asked.append(i) or 100.0 + i, warmup_replies=1)
    assert asked == [0, 1, 2]  # the headless side decodes the warm-up reply too: the same conversation
    assert result["after_reply"] == [101.0, 102.0]
    assert len(result["app_decode_tokens_per_s_per_reply"]) == 2
