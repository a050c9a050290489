"""Rules the app keeps whatever it draws: the GUI process never holds torch (checked on the running
app and by the import-linter contracts in pyproject.toml, which also keep Qt out of the engine and the
engine's layers acyclic); the Qt binding does not corrupt None's reference count; and the leak check
that guards every app test does catch a leak."""
from __future__ import annotations

import os
import shutil
import subprocess
import sys
import threading
from pathlib import Path

import pytest
from PySide6.QtCore import QTimer
from PySide6.QtWidgets import QWidget

ROOT = Path(__file__).resolve().parents[2]
LINT_IMPORTS = Path(sys.executable).with_name("lint-imports")

# The app as it ships (`membound`: engine in its own process), answering a prompt offscreen; then
# the GUI process's own modules are listed.
RUN_THE_APP = """
import argparse, sys
from app.main import main
from engine.hardware.spec import DeviceSpec
from engine.settings import SamplingParams, Settings
cpu = DeviceSpec(name="test cpu", kind="cpu", peak_bandwidth_gbs=20.0, peak_flops={"fp32": 1e11},
                 memory_total_bytes=16 * 2**30, source="CPU - measured bandwidth")
args = argparse.Namespace(screenshot=sys.argv[1], prompt="hello", debug=False, engine_thread=False)
code = main(args, model="synthetic:smollm2-135m", device="cpu", hardware=cpu,
            settings=Settings(max_new_tokens=4, sampling=SamplingParams(greedy=True)), timeout_s=240)
heavy = sorted(m for m in ("torch", "triton", "transformers", "gguf", "kernels") if m in sys.modules)
print("RESULT", code, ",".join(heavy) or "none")
"""


def test_the_running_app_process_holds_no_torch(tmp_path):
    out = subprocess.run([sys.executable, "-c", RUN_THE_APP, str(tmp_path / "shot.png")], cwd=ROOT,
                         capture_output=True, text=True, timeout=300,
                         env={**os.environ, "QT_QPA_PLATFORM": "offscreen", "OMP_NUM_THREADS": "1"})
    result = [line for line in out.stdout.splitlines() if line.startswith("RESULT")]
    assert result, out.stdout + out.stderr
    assert result[-1] == "RESULT 0 none", out.stderr[-2000:]
    assert (tmp_path / "shot.png").stat().st_size > 10_000  # it did draw the window and its reply


def lint_imports(cwd: Path) -> subprocess.CompletedProcess:
    return subprocess.run([str(LINT_IMPORTS), "--no-cache"], cwd=cwd, capture_output=True, text=True, timeout=300)


def test_the_import_contracts_hold():
    out = lint_imports(ROOT)
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-2000:]
    assert "broken" in out.stdout and " 0 broken" in out.stdout


def test_the_contracts_catch_an_indirect_import_of_torch(tmp_path):
    for name in ("app", "engine", "kernels"):
        shutil.copytree(ROOT / name, tmp_path / name, ignore=shutil.ignore_patterns("__pycache__"))
    shutil.copy(ROOT / "pyproject.toml", tmp_path)
    chat = tmp_path / "app" / "chat.py"  # the chat panel reaching for the engine, which imports torch
    chat.write_text(chat.read_text() + "\n\ndef _engine():\n    from engine.serving import server\n    return server\n")
    out = lint_imports(tmp_path)
    assert out.returncode != 0 and "the GUI process never imports torch" in out.stdout
    assert "app.chat -> engine.serving.server" in out.stdout


def test_the_contracts_catch_the_app_reaching_past_the_engines_contract(tmp_path):
    """A torch-free module of the engine that is not its contract (fault injection) is
    still out of the app's reach: the app speaks to the engine through the contract alone."""
    for name in ("app", "engine", "kernels"):
        shutil.copytree(ROOT / name, tmp_path / name, ignore=shutil.ignore_patterns("__pycache__"))
    shutil.copy(ROOT / "pyproject.toml", tmp_path)
    chat = tmp_path / "app" / "chat.py"
    chat.write_text(chat.read_text() + "\n\ndef _pending():\n    from engine import faults\n    return faults\n")
    out = lint_imports(tmp_path)
    assert out.returncode != 0 and "the app imports from the engine only its torch-free contract" in out.stdout
    assert "app.chat -> engine.faults" in out.stdout


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


def test_no_other_installed_distribution_provides_this_project_s_import_names():
    """`app`, `engine` and `kernels` are this project's import names: a distribution that installs the
    same name is shadowed by ours, and its users import ours in its place (transformers 5.25 requires
    Hugging Face's `kernels` and then failed to build any model class, the oracle of 82 tests)."""
    from importlib.metadata import packages_distributions

    owners = packages_distributions()
    clashes = {name: sorted(set(owners.get(name, [])) - {"membound"}) for name in ("app", "engine", "kernels")}
    assert not any(clashes.values()), f"installed distributions also provide these import names: {clashes}"
