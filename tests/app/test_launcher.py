"""The `membound` command: subcommands run the headless CLI; with no subcommand and no GUI
packages, the terminal chat with a one-line note."""
import importlib.util

from app.launcher import main


def test_subcommands_go_to_the_engine_cli(capsys):
    code = main(["chat", "--prompt", "  "])
    assert code == 2 and "empty prompt" in capsys.readouterr().err


def test_without_pyside_the_screenshot_mode_says_so(monkeypatch, capsys):
    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "PySide6" else real(name, *a))
    code = main(["--screenshot", "x.png"])
    err = capsys.readouterr().err
    assert code == 2 and "needs the desktop app" in err and "Traceback" not in err


def test_launching_the_cli_leaves_openmp_alone():
    import os
    import subprocess
    import sys
    env = {k: v for k, v in os.environ.items() if k != "OMP_WAIT_POLICY"}
    out = subprocess.run([sys.executable, "-c", "import app.launcher, engine.cli, os; "
                          "print(os.environ.get('OMP_WAIT_POLICY'))"], capture_output=True, text=True, env=env)
    assert out.stdout.strip() == "None"  # the bench keeps OpenMP's fast default; only the GUI sets PASSIVE


def test_no_display_falls_back_to_the_terminal_chat(monkeypatch, capsys):
    import app.main
    for name in ("DISPLAY", "WAYLAND_DISPLAY", "QT_QPA_PLATFORM"):
        monkeypatch.delenv(name, raising=False)
    called = []
    monkeypatch.setattr("engine.cli.main", lambda argv: called.append(argv) or 0)
    assert app.main.main(None) == 0
    assert called == [["chat"]] and "no display" in capsys.readouterr().err
