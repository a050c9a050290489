"""Shared by the app tests (tests/app is on sys.path under pytest's default import mode)."""
from __future__ import annotations

from engine.hardware.spec import DeviceSpec
from engine.settings import SamplingParams

GREEDY = SamplingParams(greedy=True, temperature=0.0)


def fake_cpu() -> DeviceSpec:
    """A CPU spec with round numbers, so no test waits for the start-up measurement."""
    return DeviceSpec(name="test cpu (2 cores)", kind="cpu", peak_bandwidth_gbs=20.0,
                      peak_flops={"fp32": 1e11, "bf16": 2e11}, measured_bandwidth_gbs=20.0,
                      measured_flops={"fp32": 1e11, "bf16": 2e11}, memory_total_bytes=16 * 2**30,
                      source="CPU — measured roof (a test)")


def send_and_wait(window, qtbot, text: str, timeout_ms: int = 30_000):
    """Send a prompt and wait for the reply to end; returns its DoneEvent (None if it failed)."""
    with qtbot.waitSignal(window.reply_finished, timeout=timeout_ms) as finished:
        window.send(text)
    return finished.args[0]


def activate(window, qtbot) -> None:
    """Show and activate the window: its keyboard shortcuts work only in the active window."""
    window.show()
    window.activateWindow()
    qtbot.waitUntil(window.isActiveWindow, timeout=5_000)  # (qtbot.waitActive is a context manager)


def confirmed(window, qtbot, timeout_ms: int = 30_000) -> None:
    """Wait until the engine has answered every settings request the window made."""
    qtbot.waitUntil(lambda: not window.settings_pending, timeout=timeout_ms)


def queried_settings(window, qtbot, timeout_ms: int = 30_000):
    """The settings the engine runs, as it answers `worker.query()`: through a connection kept for the
    window's life, not a waitSignal (a blocker disconnected while the worker's signals are still
    queued crashed pytest-qt's event processing once: tests/app/test_app_default_model.py)."""
    answers = getattr(window, "_queried_settings", None)
    if answers is None:
        answers = window._queried_settings = []
        window.worker.state.connect(answers.append)
    before = len(answers)
    window.worker.query()
    qtbot.waitUntil(lambda: len(answers) > before, timeout=timeout_ms)
    return answers[-1]

