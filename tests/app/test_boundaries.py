"""Rules the app keeps whatever it draws: it never imports torch or triton (it talks to the engine
through engine.* in a worker thread); the Qt binding does not corrupt None's reference count;
and the leak check that guards every app test does catch a leak."""
from __future__ import annotations

import ast
import sys
import threading
from pathlib import Path

import pytest
from PySide6.QtCore import QTimer
from PySide6.QtWidgets import QWidget

APP = Path(__file__).resolve().parents[2] / "app"
FORBIDDEN = {"torch", "triton"}


def imported_roots(source: str) -> set[str]:
    roots = set()
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            roots |= {alias.name.split(".")[0] for alias in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            roots.add(node.module.split(".")[0])
        elif isinstance(node, ast.Call) and getattr(node.func, "id", getattr(node.func, "attr", "")) in (
                "import_module", "__import__") and node.args and isinstance(node.args[0], ast.Constant):
            roots.add(str(node.args[0].value).split(".")[0])
    return roots


def test_app_never_imports_torch_or_triton():
    files = sorted(APP.rglob("*.py"))
    assert len(files) >= 8
    offenders = {str(f.relative_to(APP)): sorted(imported_roots(f.read_text()) & FORBIDDEN) for f in files}
    assert {name: found for name, found in offenders.items() if found} == {}


def test_the_import_check_sees_every_spelling():
    source = "import torch.nn as nn\nfrom triton import jit\nimportlib.import_module('torch')\n"
    assert imported_roots(source) == {"torch", "triton"}


@pytest.mark.skipif(sys.version_info >= (3, 12), reason="None is immortal from Python 3.12")
def test_qt_binding_keeps_none_alive():
    from app.main import pyside_drops_none_references

    assert not pyside_drops_none_references(), "this PySide6 build decrefs None on every void call: the app " \
                                               "would abort after minutes (use PySide6-Essentials != 6.12.0)"


def test_leak_check_catches_a_running_thread_and_an_active_timer(qtbot, leak_finder):
    find_leaks = leak_finder
    before = set(threading.enumerate())
    widget = QWidget()
    qtbot.addWidget(widget)
    timer = QTimer(widget)
    timer.start(1000)
    release = threading.Event()
    thread = threading.Thread(target=release.wait, name="leaky")
    thread.start()
    try:
        leaks = find_leaks(before)
        assert any("leaky" in leak for leak in leaks)
        assert any("QTimer" in leak for leak in leaks)
    finally:
        release.set()
        thread.join()
        timer.stop()
    assert find_leaks(before) == []
