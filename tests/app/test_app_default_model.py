"""The window with the real default model (SmolLM2-135M-Instruct): it loads with progress while
the event loop keeps running, answers a prompt in words, and says what the CPU is."""
from __future__ import annotations

from app_test_helpers import GREEDY, send_and_wait
from PySide6.QtCore import QTimer

from engine.settings import Settings


def test_window_opens_with_the_default_model_and_answers(qtbot):
    from app.window import MainWindow

    ticks = []
    heartbeat = QTimer()
    heartbeat.timeout.connect(lambda: ticks.append(1))
    heartbeat.start(50)
    progress = []
    window = MainWindow(settings=Settings(max_new_tokens=8, sampling=GREEDY))  # model="default", measured device
    qtbot.addWidget(window)
    window.worker.progress.connect(lambda fraction, message: progress.append((fraction, message)))
    try:
        with qtbot.waitSignal(window.model_ready, timeout=120_000) as ready:
            pass
    finally:
        heartbeat.stop()
    info = ready.args[0]
    assert "SmolLM2" in info.label and info.cfg.n_layers == 30 and info.device == "cpu"
    fractions = [f for f, _ in progress]
    assert len(progress) >= 5 and any(0 < f < 1 for f in fractions)  # loading showed progress
    assert len(ticks) >= 10  # the event loop kept running while the model loaded
    assert "CPU — measured roof (C++ streaming read" in window.hardware_strip.device_label.full_text()
    done = send_and_wait(window, qtbot, "What is the capital of France?", timeout_ms=120_000)
    assert done is not None and done.n_new_tokens >= 1 and done.text.strip()
    assert done.text.strip() in window.chat.plain_text()
    assert window.data.steps.total == done.n_new_tokens
    assert window.data.steps.last("gbs") > 0.05  # a real model moves real bytes


def test_closing_while_the_model_loads_cancels_the_load(qtbot):
    from app_test_helpers import fake_cpu

    from app.window import MainWindow

    window = MainWindow(hardware=fake_cpu())  # the default model, without measuring the device
    qtbot.addWidget(window)
    # (a connection kept for the window's life, not a waitSignal: the loader's progress arrives queued
    # from its thread, and a blocker disconnected with more of it still queued crashed pytest-qt's event
    # processing after the test once, on a loaded machine: a segfault in its slot)
    fractions = []
    window.worker.progress.connect(lambda fraction, message: fractions.append(fraction))
    qtbot.waitUntil(lambda: any(0.1 < f < 0.9 for f in fractions), timeout=60_000)
    assert window.loading and window.model_info is None
    window.close()  # the next progress call inside the loader ends the load
    assert not window.worker.isRunning()


def test_keep_decoding_with_the_default_model_stays_prose(qtbot):
    """Keep-decoding (the tour turns it on): each reply runs to its budget, the follow-ups are the
    person's turns, and no reply shows the template's markup or role names (the model's end of turn
    is never sampled; it used to write "Paris.\\nsystem\\n\\nuser\\nI'm planning…")."""
    import re

    from app_test_helpers import fake_cpu

    from app.keep_decoding import FOLLOW_UPS, KeepDecoding
    from app.window import MainWindow

    window = MainWindow(hardware=fake_cpu(), settings=Settings(max_new_tokens=40, sampling=GREEDY))
    qtbot.addWidget(window)
    with qtbot.waitSignal(window.model_ready, timeout=120_000):
        pass
    finished = []
    window.reply_finished.connect(finished.append)
    keep = KeepDecoding(window)
    keep.start("What is the capital of France?")
    qtbot.waitUntil(lambda: len(finished) >= 2, timeout=120_000)
    keep.stop()
    window.stop()
    qtbot.waitUntil(lambda: not window.replying, timeout=30_000)
    entries = window.chat._entries
    asked = [text for kind, text, role in entries if kind == "message" and role == "user"]
    replies = ["".join(piece for piece, _ in runs) for kind, runs, _ in entries if kind == "reply"]
    assert asked[:2] == ["What is the capital of France?", FOLLOW_UPS["en"][0]]
    assert all(done is not None and done.n_new_tokens == 40 for done in finished[:2])
    for reply in replies[:2]:
        assert reply.strip() and "<|" not in reply
        assert not re.search(r"^\s*(system|user|assistant)\s*$", reply, re.MULTILINE), reply
    assert [m["content"] for m in window.messages[::2]][:2] == asked[:2]
