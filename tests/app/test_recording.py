"""Record and replay: a session recorded from the window plays back into a window with no engine and
reproduces every plot's data exactly; a replay runs where torch cannot be imported; a damaged or
foreign file gets one line; the export writes the pictures, the CSV and the report."""
from __future__ import annotations

import csv
import gzip
import json
import os
import subprocess
import sys
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest
from app_test_helpers import activate, confirmed, send_and_wait
from PySide6.QtCore import Qt

from app.recording import DEFAULT_RECORDING, Recorder, RecordingError, read_recording
from app.replay import open_replay
from engine.hardware.nvml import HardwareSample

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(autouse=True)
def pytorch_decode_steps(monkeypatch):
    """PyTorch's decode step, in the engine's process or thread: the C++ CPU step decodes the tiny
    model's reply before the session below can switch the cache off and stop the reply."""
    monkeypatch.setenv("MEMBOUND_CPU_STEP", "0")  # read by the engine's context as it is made


def record_session(make_window, qtbot, path: Path) -> object:
    """A short session: a reply with the KV cache switched off mid-way, NVML samples, simulated
    users (batched steps: the serving buffer), a second reply. Returns the (closed) window."""
    # long enough to outlast the first event batches (a CPU engine sends five a second: 100-200 of
    # the tiny model's steps have run when the window sees the first), the settings round trip and
    # the samples, which a window takes only while a reply runs
    window = make_window(max_new_tokens=3000, recorder=Recorder(path))
    activate(window, qtbot)
    window.send("a reply to record")
    qtbot.waitUntil(lambda: window.data.steps.total > 10, timeout=10_000)
    qtbot.keyClick(window, Qt.Key.Key_F2)  # KV cache off, mid-reply
    confirmed(window, qtbot)
    for i in range(3):  # what the NVML timer adds on a GPU
        window.show_hardware_sample(HardwareSample(t_s=window.clock(), sm_util_pct=10.0 + i, dram_bw_util_pct=50.5,
                                                   tensor_active_pct=None))
    with qtbot.waitSignal(window.reply_finished, timeout=10_000):
        window.stop()
    window.apply_settings(replace(window.settings, kv_layout="paged", users=2, max_new_tokens=24))
    confirmed(window, qtbot)
    send_and_wait(window, qtbot, "and one more, batched")
    window.apply_settings(replace(window.settings, users=0))
    confirmed(window, qtbot)
    window.close()
    return window


def ring_state(ring) -> tuple:
    return ring.total, ring._next, ring._data.copy()


def assert_same_rings(a, b) -> None:
    for name in ("steps", "hardware", "serving"):
        total_a, next_a, data_a = ring_state(getattr(a, name))
        total_b, next_b, data_b = ring_state(getattr(b, name))
        assert (total_a, next_a) == (total_b, next_b), name
        np.testing.assert_array_equal(data_a, data_b, err_msg=name)  # NaN == NaN here, bit for bit otherwise


def test_the_window_keeps_its_recorder_alive(make_window, qtbot, tmp_path):
    """Nothing but the window holds a recorder made in its call; the garbage collector (which may
    run at any moment) must not take it, or the file is left empty."""
    import gc

    path = tmp_path / "kept.membound"
    window = make_window(max_new_tokens=8, recorder=Recorder(path))
    gc.collect()
    activate(window, qtbot)
    send_and_wait(window, qtbot, "hi")
    window.close()
    recording = read_recording(path)
    assert {"model_loaded", "events", "send"} <= {entry.kind for entry in recording.entries}


def test_a_recorded_session_replays_every_plot_exactly(make_window, qtbot, tmp_path):
    path = tmp_path / "session.membound"
    live = record_session(make_window, qtbot, path)
    assert live.data.steps.total > 20 and live.data.hardware.total == 3 and live.data.serving.total > 0
    recording = read_recording(path)
    assert not recording.truncated and recording.model_info.label.startswith("tiny")
    kinds = {entry.kind for entry in recording.entries}
    assert {"model_loaded", "events", "send", "hardware", "reply_started", "busy_changed"} <= kinds

    window, player = open_replay(str(path), speed=4)
    qtbot.addWidget(window)
    assert "REPLAY" in window.windowTitle() and "test cpu" in window.windowTitle()
    assert window.worker.engine is None
    player.play_all()
    assert_same_rings(live.data, window.data)
    assert window.data.labels == live.data.labels
    assert [(n.x, n.text, n.label) for n in window.data.annotations] == \
        [(n.x, n.text, n.label) for n in live.data.annotations]
    for replayed, recorded in zip(window.data.annotations, live.data.annotations):
        if not recorded.text.startswith("start:"):  # engine times: exact; the load's own is the record's time
            assert replayed.t_s == recorded.t_s
    assert (window.data.reply_t0, window.data.reply_t1, window.data.ttft_s) == \
        (live.data.reply_t0, live.data.reply_t1, live.data.ttft_s)
    assert window.chat.plain_text() == live.chat.plain_text()
    assert window.settings == live.settings and window.controls.settings == live.settings

    # seeking back starts the window over and plays up to the mark; forward again: the same data
    batches = [e for e in recording.entries if e.kind == "events"]
    player.seek(batches[len(batches) // 2].t_s)
    assert 0 < window.data.steps.total < live.data.steps.total
    player.seek(recording.duration_s)
    assert_same_rings(live.data, window.data)
    # a settings change in a replay is refused with one line, and the controls stay
    window.controls.cycle("dtype")
    assert "this is a replay" in window.last_error and window.controls.settings == live.settings
    window.close()


def test_replay_plays_in_real_time_at_the_chosen_speed(make_window, qtbot, tmp_path):
    path = tmp_path / "short.membound"
    live = make_window(max_new_tokens=30, recorder=Recorder(path))
    send_and_wait(live, qtbot, "short")
    live.close()
    window, player = open_replay(str(path), speed=4)
    qtbot.addWidget(window)
    from app import talk

    talk.install(window, player=player)
    player.play()
    with qtbot.waitSignal(player.finished, timeout=20_000):
        pass
    assert window.data.steps.total == live.data.steps.total == 30
    assert not player.playing and player.at_end
    window.close()


def test_a_replay_of_a_gpu_never_samples_this_machines_gpu(make_window, qtbot, tmp_path, monkeypatch):
    path = tmp_path / "cpu.membound"
    live = make_window(max_new_tokens=10, recorder=Recorder(path))
    send_and_wait(live, qtbot, "hi")
    live.close()
    lines = gzip.decompress(path.read_bytes()).decode().splitlines()
    for i, line in enumerate(lines[1:], 1):  # the session, as if it had run on an H200 with NVML
        entry = json.loads(line)
        if entry[2] == "model_loaded":
            entry[3][0]["hardware"].update({"name": "NVIDIA H200", "kind": "cuda", "nvml": True, "nvml_index": 0})
            lines[i] = json.dumps(entry)
    gpu = tmp_path / "h200.membound"
    gpu.write_bytes(gzip.compress(("\n".join(lines) + "\n").encode()))
    started = []

    class LocalGpu:  # what NVML would answer on a laptop that has a GPU of its own
        def __init__(self, index):
            started.append(index)
            self.available = True

        def close(self):
            started.append("closed")

    monkeypatch.setattr("engine.hardware.nvml.NvmlSampler", LocalGpu)
    window, player = open_replay(str(gpu))
    qtbot.addWidget(window)
    player.play_all()
    assert "NVIDIA H200" in window.hardware_strip.device_label.full_text()
    assert window.frames.sampler is None and not window.nvml_timer.isActive()
    assert started in ([], [0, "closed"])
    window.close()


BLOCK_TORCH = """
import sys
class NoTorch:
    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] in ("torch", "triton", "transformers", "gguf"):
            raise ImportError(f"{name} is blocked in this process")
sys.meta_path.insert(0, NoTorch())
from app.launcher import main
code = main(sys.argv[1:])
print("RESULT", code, ",".join(m for m in ("torch", "gguf") if m in sys.modules) or "none")
"""


def run_blocked(*args: str, cwd: Path = ROOT) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", BLOCK_TORCH, *args], cwd=cwd, capture_output=True, text=True,
                          timeout=240, env={**os.environ, "QT_QPA_PLATFORM": "offscreen"})


def test_replay_runs_where_torch_cannot_be_imported(make_window, qtbot, tmp_path):
    path = tmp_path / "for-a-laptop.membound"
    live = make_window(max_new_tokens=20, recorder=Recorder(path))
    send_and_wait(live, qtbot, "hello")
    live.close()
    out_dir = tmp_path / "export"
    out = run_blocked("replay", str(path), "--export", str(out_dir), "--screenshot", str(tmp_path / "replay.png"))
    assert "RESULT 0 none" in out.stdout, out.stdout + out.stderr[-3000:]
    assert (tmp_path / "replay.png").stat().st_size > 10_000
    names = {p.name for p in out_dir.iterdir()}
    assert {"window.png", "window.svg", "steps.csv", "report.md", "plot-tokens.png", "plot-roofline.svg"} <= names
    with open(out_dir / "steps.csv") as file:
        rows = list(csv.DictReader(file))
    assert len(rows) == live.data.steps.total == 20
    assert [float(r["tokens_per_s"]) for r in rows] == list(live.data.steps.column("tokens_per_s"))
    assert {r["peak_flops_of"] for r in rows} == {"fp32"}
    report = (out_dir / "report.md").read_text()
    assert "From a replay" in report and "![Tokens/s](plot-tokens.png)" in report and "| fp32 · kv on |" in report


def test_the_shipped_recording_plays_out_of_the_box():
    assert DEFAULT_RECORDING.exists() and DEFAULT_RECORDING.stat().st_size < 1_000_000
    recording = read_recording(DEFAULT_RECORDING)
    assert "SmolLM2" in recording.model_info.label and not recording.truncated
    captions = [e.args[0] for e in recording.entries if e.kind == "caption"]
    assert len(captions) >= 10  # the default tour's steps, with their captions


@pytest.mark.parametrize("content, message", [
    (b"not gzip at all", "not a membound recording"),
    (gzip.compress(b'{"format": "something else"}\n'), "no membound-recording header"),
    (gzip.compress(b'{"format": "membound-recording", "version": 99}\n'), "newer than this membound reads"),
    (gzip.compress(b'{"format": "membound-recording", "version": 1}\n[0, 0, "events", [{"@": "os.system"}]]\n'),
     "line 2: unknown type 'os.system'"),
])
def test_a_bad_recording_gets_one_line(tmp_path, content, message):
    path = tmp_path / "bad.membound"
    path.write_bytes(content)
    with pytest.raises(RecordingError) as error:
        read_recording(path)
    text = str(error.value)
    assert message in text and str(path) in text and "\n" not in text


def test_a_bad_recording_on_the_command_line_is_one_line_not_a_traceback(tmp_path):
    path = tmp_path / "bad.membound"
    path.write_bytes(b"junk")
    out = run_blocked("replay", str(path), "--export", str(tmp_path / "x"))
    assert "RESULT 2" in out.stdout
    lines = [line for line in out.stderr.splitlines() if line.strip()]
    assert lines == [f"membound: error: {path}: not a membound recording (Not a gzipped file (b'ju'))"], out.stderr


def test_a_recording_cut_short_keeps_what_came_before(make_window, qtbot, tmp_path):
    path = tmp_path / "cut.membound"
    live = make_window(max_new_tokens=20, recorder=Recorder(path))
    send_and_wait(live, qtbot, "hello")
    live.close()
    data = gzip.decompress(path.read_bytes())
    cut = tmp_path / "cut-short.membound"
    cut.write_bytes(gzip.compress(data)[:-40])  # the app killed mid-write: the gzip stream ends early
    recording = read_recording(cut)
    assert recording.truncated and recording.model_info is not None
    assert 0 < len(recording.entries) <= len(read_recording(path).entries)
    first = json.loads(data.splitlines()[0])
    assert first["format"] == "membound-recording"
