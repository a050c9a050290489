"""Frame-cost benchmark (not a test): the CPU time of one redraw of the live plots (`refresh` and
Qt's paint) while synthetic steps stream in, one per frame, with setting changes and replies.

    QT_QPA_PLATFORM=offscreen python -m app.frame_bench [--frames 1200]

Prints one JSON object (ms of this thread's CPU per frame: mean, p50, p95, and the `refresh` part
alone). CPU time, not wall time, so a machine shared with other jobs moves it less than gui_bench."""
from __future__ import annotations

import argparse
import json
import sys
import time

LABELS = ("fp32 · kv on", "fp32 · kv off", "bf16 · kv on")


def run(frames: int, warmup: int = 50) -> dict:
    import numpy as np
    from PySide6.QtWidgets import QApplication

    from app.plots import LiveData, PlotsPanel
    from app.plots.style import configure_pyqtgraph
    from app.theme import SettingColours, themed
    from engine.hardware.spec import DeviceSpec
    from engine.metrics import StepMetrics

    app = QApplication.instance() or QApplication(sys.argv[:1])
    configure_pyqtgraph()
    theme = themed("dark")
    data = LiveData()
    panel = PlotsPanel(data, theme, SettingColours(theme))
    panel.set_hardware(DeviceSpec(name="cpu", kind="cpu", peak_bandwidth_gbs=20.0, peak_flops={"fp32": 1e11},
                                  measured_bandwidth_gbs=20.0, measured_flops={"fp32": 1e11}))
    panel.resize(1100, 900)
    panel.show()
    app.processEvents()
    rng = np.random.default_rng(0)
    t_s, label = 1000.0, LABELS[0]
    total_ms, refresh_ms = [], []
    for i in range(frames):
        phase = "prefill" if i % 300 == 0 else "decode"
        if phase == "prefill":
            data.start_reply(t_s)
        step_s = 0.01 * (1 + 0.2 * rng.random()) * (5 if phase == "prefill" else 1)
        t_s += step_s
        fed = 30 if phase == "prefill" else 1
        data.add_step(StepMetrics(step=i, phase=phase, batch_size=1, new_tokens=fed, tokens_out=1,
                                  context_len=i % 300, step_s=step_s, weight_bytes=10**8,
                                  kv_read_bytes=1000 * (i % 300), kv_write_bytes=100, other_bytes=0,
                                  flops=2 * 10**8 * fed, peak_bandwidth_bps=2e10, peak_flops=1e11, t_s=t_s,
                                  settings_label=label))
        if i % 250 == 125:
            label = LABELS[(i // 250 + 1) % len(LABELS)]
            data.annotate("switch", label, t_s)
        if i % 300 == 299:
            data.end_reply(t_s)
        cpu0 = time.thread_time()
        panel.refresh()
        if i % 10 == 0:
            panel.update_readouts()
        cpu1 = time.thread_time()
        app.processEvents()  # Qt paints the changed plots here
        total_ms.append(1e3 * (time.thread_time() - cpu0))
        refresh_ms.append(1e3 * (cpu1 - cpu0))
    panel.close()
    total, refresh = np.array(total_ms[warmup:]), np.array(refresh_ms[warmup:])
    return {"frames": len(total), "frame_cpu_ms_mean": float(total.mean()),
            "frame_cpu_ms_p50": float(np.percentile(total, 50)), "frame_cpu_ms_p95": float(np.percentile(total, 95)),
            "refresh_cpu_ms_mean": float(refresh.mean())}


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="python -m app.frame_bench", description=__doc__.splitlines()[0])
    parser.add_argument("--frames", type=int, default=1200)
    args = parser.parse_args(argv)
    print(json.dumps(run(args.frames), indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
