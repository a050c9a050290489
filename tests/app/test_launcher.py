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


def test_attach_routes_headless_to_the_cli_and_the_window_to_the_app(monkeypatch, capsys):
    import app.main
    import engine.cli

    seen = []
    monkeypatch.setattr(engine.cli, "main", lambda argv: seen.append(("cli", argv)) or 0)
    monkeypatch.setattr(app.main, "main", lambda args: seen.append(("app", args.url, args.gpu)) or 0)
    assert main(["attach", "localhost:8000", "--headless", "--seconds", "1"]) == 0
    assert main(["attach", "localhost:8000", "--gpu", "H100"]) == 0
    assert seen == [("cli", ["attach", "localhost:8000", "--headless", "--seconds", "1"]),
                    ("app", "localhost:8000", "H100")]


def test_attach_window_without_a_display_says_use_headless(monkeypatch, capsys):
    import app.main
    from engine.cli import build_parser

    for name in ("DISPLAY", "WAYLAND_DISPLAY", "QT_QPA_PLATFORM"):
        monkeypatch.delenv(name, raising=False)
    assert app.main.main(build_parser().parse_args(["attach", "localhost:1"])) == 2
    assert "--headless" in capsys.readouterr().err


def test_engine_cli_attach_without_headless_is_one_line(capsys):
    from engine.cli import main as cli_main

    assert cli_main(["attach", "localhost:1"]) == 2
    assert "needs the desktop app" in capsys.readouterr().err
