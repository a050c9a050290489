"""`membound --tour default --check` (engine/tour_check.py): the default tour's steps each state their
caption's direction (`expect`), checked against the engine on this machine, headless; the verdicts are
kept, and the window's tour leaves out a step whose direction did not hold here."""
from __future__ import annotations

import pytest

from engine import tour_check
from engine.cli import main
from engine.tour_verdicts import failed_steps

# the directions the cost model fixes (bytes, intensity): they hold on any machine; the speed ones
# (KV cache, INT8, INT4, users, static batching) are measured and reported, never assumed here
BYTES_STEPS = {"Prefill vs decode", "Speculative decoding", "FlashAttention at long context", "KV cache on"}


def test_every_caption_that_states_a_direction_says_which_in_the_tour_file():
    steps = {s.title: s for s in tour_check.read_expectations("default")}
    expected = {"Prefill vs decode", "The memory wall: t = 2P / B_mem", "KV cache off", "KV cache on", "INT8 weights",
                "INT4 weights", "One user → many: continuous batching", "Static batching",
                "FlashAttention at long context"} | ({"Speculative decoding"} if "Speculative decoding" in steps else set())
    assert {t for t, s in steps.items() if s.expects} == expected
    int4 = steps["INT4 weights"]
    assert int4.settings.weights == "int4" and int4.expects[0].than == (("weights", "int8"),)


def test_a_malformed_expectation_is_one_line(tmp_path):
    bad = tmp_path / "t.toml"
    bad.write_text('[[step]]\ntitle = "a"\ncaption = "b"\nexpect = { figure = "speed", direction = "up" }\n')
    with pytest.raises(tour_check.TourCheckError, match="step 1: expect: a table with figure"):
        tour_check.read_expectations(str(bad))


def test_the_default_tour_checked_headless_on_the_default_model(capsys, monkeypatch, tmp_path):
    monkeypatch.setenv("MEMBOUND_TOUR_CHECKS", str(tmp_path / "checks.json"))
    monkeypatch.setattr(tour_check, "DECODE_TOKENS", 12)
    monkeypatch.setattr(tour_check, "BATCH_STEPS", 8)
    monkeypatch.setattr(tour_check, "REPEATS", 1)
    code = main(["--tour", "default", "--check"])
    out = capsys.readouterr().out
    lines = {line.split(":", 1)[0].split(" ", 2)[2]: line for line in out.splitlines() if line.startswith("step ")}
    assert len(lines) >= 9 and code in (0, 1)
    for title in BYTES_STEPS & set(lines):
        assert "✓" in lines[title], lines[title]
    for title, line in lines.items():  # each a figure and a verdict in one line
        assert ("✓" in line) != ("does not hold here" in line or "could not run here" in line), line
    kept = failed_steps("default")  # what the window's tour leaves out on this machine
    assert set(kept) == {int(line.split()[1]) for line in lines.values() if "✗" in line}
