"""App test fixtures: a tiny random model and a fake CPU spec (no measuring), a window factory,
and an autouse check that fails any test leaving a thread or an active timer behind."""
from __future__ import annotations

import threading
import time

import pytest
import torch
from app_test_helpers import GREEDY, fake_cpu
from PySide6.QtCore import QThread, QTimer
from PySide6.QtWidgets import QApplication

from app.worker import running_workers
from engine.io.byte_tokenizer import ByteTokenizer
from engine.io.loader import LoadedWeights, synthetic_weights
from engine.model.config import ModelConfig
from engine.settings import Settings

TINY = ModelConfig(name="tiny", dim=64, n_layers=2, n_heads=4, n_kv_heads=2, ffn_dim=128, vocab_size=256,
                   tied_embeddings=True, max_seq_len=4096)


@pytest.fixture(scope="session")
def tiny_model() -> LoadedWeights:
    return LoadedWeights(TINY, synthetic_weights(TINY, torch.float32, "cpu"), ByteTokenizer(TINY.vocab_size),
                         "synthetic", "tiny (random weights → fp32)", "fp32")


@pytest.fixture
def make_window(qtbot, tiny_model):
    """A window on the tiny model, loaded and ready: make_window(max_new_tokens=…)."""
    from app.window import MainWindow

    def make(max_new_tokens: int = 64, **kwargs):
        settings = Settings(max_new_tokens=max_new_tokens, sampling=GREEDY)
        window = MainWindow(model=kwargs.pop("model", tiny_model), hardware=fake_cpu(), settings=settings,
                            **kwargs)
        qtbot.addWidget(window)
        with qtbot.waitSignal(window.model_ready, timeout=30_000):
            pass
        return window
    return make


def find_leaks(threads_before: set[threading.Thread]) -> list[str]:
    """Threads started since `threads_before` that still run, running worker QThreads, and active
    QTimers owned by the application or any widget."""
    app = QApplication.instance()
    # a _DummyThread is Python's alias for a thread it did not start (a QThread that ran Python and
    # called current_thread()); it never "ends", and QThreads are checked below by isRunning()
    leaks = [f"thread {t.name!r}" for t in threading.enumerate()
             if t not in threads_before and t.is_alive() and not isinstance(t, threading._DummyThread)]
    leaks += [f"worker QThread {w.objectName()!r}" for w in running_workers()]
    # top-level widgets only: findChildren searches their trees on the C++ side and wraps just the
    # timers and threads (wrapping every widget, as allWidgets() does, crashed now and then under load)
    owners = [app] + list(app.topLevelWidgets()) if app is not None else []
    seen = set()
    for owner in owners:
        for thread in owner.findChildren(QThread):
            if id(thread) not in seen and thread.isRunning():
                seen.add(id(thread))
                leaks.append(f"QThread {thread.objectName() or type(thread).__name__!r} under {type(owner).__name__}")
        for timer in owner.findChildren(QTimer):
            if id(timer) not in seen and timer.isActive():
                seen.add(id(timer))
                leaks.append(f"active QTimer ({timer.interval()} ms) under {type(owner).__name__}")
    return leaks


@pytest.fixture
def leak_finder():
    return find_leaks


@pytest.fixture(autouse=True)
def one_torch_thread(one_torch_thread):
    """Every app test runs the engine on one torch thread (tests/conftest.py)."""
    yield


@pytest.fixture(autouse=True)
def no_leaked_threads_or_timers(qapp):
    threads_before = set(threading.enumerate())
    yield
    # pytest-qt has closed the test's widgets by now; give a thread that was told to end a moment.
    deadline = time.monotonic() + 2.0
    leaks = find_leaks(threads_before)
    while leaks and time.monotonic() < deadline:
        qapp.processEvents()
        time.sleep(0.02)
        leaks = find_leaks(threads_before)
    if leaks:
        pytest.fail("test left running: " + "; ".join(leaks), pytrace=False)
