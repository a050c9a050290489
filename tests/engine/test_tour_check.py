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
    monkeypatch.setattr(tour_check, "BATCH_REQUESTS", 0)  # (the wait for finished requests: the test above)
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


class _Serving:
    """An engine's serve_step as plain events: the batch fills, then a static batch's slots empty as
    its members end (steps of 4, 4, 3, 1 rows at the same cost), the requests finishing as they go."""
    def __init__(self, rows, settings):
        self.rows, self.settings, self.serving, self.finished = list(rows), settings, True, 0

    def serve_step(self):
        from engine.events import BatchStats
        from engine.metrics import StepMetrics
        if not self.rows:
            return []
        n, done = self.rows.pop(0)
        self.finished += done
        step = StepMetrics.__new__(StepMetrics)
        object.__setattr__(step, "batch_size", n)
        object.__setattr__(step, "tokens_out", n)
        object.__setattr__(step, "step_s", 0.1)
        stats = BatchStats.__new__(BatchStats)
        object.__setattr__(stats, "finished_total", self.finished)
        return [step, stats]

    def apply(self, settings):
        self.settings, self.serving = settings, bool(settings.users)


def test_an_aggregate_counts_every_step_after_the_batch_fills_until_requests_finish(monkeypatch):
    from engine.settings import Settings
    monkeypatch.setattr(tour_check, "BATCH_STEPS", 2)
    monkeypatch.setattr(tour_check, "BATCH_REQUESTS", 1)
    # one row while the users arrive (not counted), then 4 rows; the members end one by one
    static = Settings(users=4, policy="static")
    engine = _Serving([(1, 0), (4, 0), (4, 0), (4, 1), (3, 1), (2, 1), (1, 1), (4, 0), (4, 0)], static)
    rate = tour_check._aggregate(engine, static)
    # counted: 4 + 4 + 4 + 3 + 2 + 1 tokens in 6 steps of 0.1 s; the under-filled steps are the cost
    assert rate == pytest.approx(18 / 0.6)
    assert engine.rows == [(4, 0), (4, 0)]  # it stopped once 4 requests (1 x 4 users) had finished
