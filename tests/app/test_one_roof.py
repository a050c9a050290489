"""One roof everywhere: the app (its engine in its own process), `membound bench` and `membound chat`
report the same peaks for the same machine, all read from the one cached roof (engine/hardware/probe.py).
The bench once re-probed after its runs and the app ratcheted its peak to the best step: three peaks."""
from __future__ import annotations

import json
import os

import pytest
from app_test_helpers import GREEDY

from engine.cli import main
from engine.context import reset_default_context
from engine.hardware.probe import machine_fingerprint
from engine.hardware.roof import MeasuredRoof
from engine.settings import Settings

READ_GBS, FP32 = 12.3, 4.56e10


@pytest.fixture
def one_cached_roof(tmp_path, monkeypatch):
    """A roof for this machine in a fresh cache (any thread count: the engine process has its own)."""
    records = {}
    for threads in range(1, (os.cpu_count() or 1) + 1):
        machine = machine_fingerprint(threads)
        records[machine] = MeasuredRoof(machine=machine, measured_at="2025-01-31 14:05", method="a planted roof",
                                        threads=threads, llc_bytes=32 << 20, read_gbs=READ_GBS,
                                        read_gbs_by_size={"128 MiB": READ_GBS}, cache_read_gbs=None,
                                        flops={"fp32": FP32, "bf16": 2 * FP32, "int8": 4 * FP32},
                                        flops_method={"fp32": "FMA loop", "bf16": "FMA loop",
                                                      "int8": "int8 dot loop"}).to_dict()
    path = tmp_path / "roof.json"
    path.write_text(json.dumps(records))
    monkeypatch.setenv("MEMBOUND_ROOF_CACHE", str(path))
    reset_default_context()  # this process measured before: read the cache again (an engine's own context does)


def test_the_app_the_bench_and_the_chat_report_the_same_peaks(one_cached_roof, capsys, qtbot, tiny_model):
    from app.window import MainWindow

    assert main(["chat", "--prompt", "hi", "--greedy", "--max-tokens", "4", "--max-context", "256"]) == 0
    chat = capsys.readouterr().err
    assert f"measured read {READ_GBS:.1f} GB/s" in chat and f"of {READ_GBS:.1f} GB/s" in chat

    assert main(["bench", "--model", "synthetic:smollm2-135m", "--prompt-tokens", "8", "--decode-tokens", "4",
                 "--max-context", "64"]) == 0
    bench = capsys.readouterr().out
    assert f"peak: the measured roof, read {READ_GBS:.1f} GB/s" in bench and "measured 2025-01-31 14:05" in bench

    window = MainWindow(model=tiny_model, engine_process=True, settings=Settings(max_new_tokens=4, sampling=GREEDY))
    qtbot.addWidget(window)
    with qtbot.waitSignal(window.model_ready, timeout=60_000):
        pass
    try:
        assert window.hardware.peak_bandwidth_gbs == READ_GBS and window.hardware.peak_flops["fp32"] == FP32
        assert f"{READ_GBS:.1f} GB/s (measured)" in window.hardware_strip.bandwidth_label.text()
        assert "fp32 45.6 GFLOP/s (measured)" in window.hardware_strip.compute_label.text()
        assert "int8 dots 182.4 GFLOP/s (measured)" in window.hardware_strip.compute_label.text()
        with qtbot.waitSignal(window.reply_finished, timeout=60_000):
            window.send("hi")
        assert set(window.data.steps.column("peak_bps")) == {READ_GBS * 1e9}
    finally:
        window.close()
