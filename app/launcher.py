"""The `membound` command. A subcommand (`chat`, `bench`, `attach --headless`) runs the headless
engine CLI; none (or `attach URL`) opens the desktop app (or, without PySide6 and pyqtgraph, the
terminal chat)."""
from __future__ import annotations

import importlib.util
import os
import sys


NO_QT = "the desktop app needs PySide6 and pyqtgraph (make run installs them; a replay needs no torch)"
NO_DISPLAY = "no display here (DISPLAY is not set)"


def main(argv: list[str] | None = None) -> int:
    from engine.cli import build_parser
    from engine.cli import main as engine_main
    from engine.options import huge_page_tensors

    huge_page_tensors()  # before torch loads (the headless commands load it here, the app in its engine)

    argv = sys.argv[1:] if argv is None else argv
    args = build_parser().parse_args(argv)
    if args.command and args.command != "replay" and not (args.command == "attach" and not args.headless):
        return engine_main(argv)
    if args.check:  # the tour checked against the engine, headless
        return engine_main(argv)
    if not all(importlib.util.find_spec(name) for name in ("PySide6", "pyqtgraph")):
        return terminal_instead(args, NO_QT)
    from app.main import main as app_main  # an ImportError inside the app is a bug: let it show
    return app_main(args)


def no_display() -> bool:
    """On Linux, no X or Wayland display and no Qt platform asked for: Qt would abort at the window."""
    env = os.environ
    return sys.platform.startswith("linux") and not (
        env.get("QT_QPA_PLATFORM") or env.get("DISPLAY") or env.get("WAYLAND_DISPLAY"))


def terminal_instead(args, why: str) -> int:
    """No window can open here (`why`, one line): what only a window does is refused in one line
    with what to do instead (exit 2); anything else is the terminal chat."""
    command, offscreen = getattr(args, "command", None), why == NO_DISPLAY
    if command == "attach":
        return _refuse(f"{why}: `membound attach URL --headless` scrapes the server in the terminal")
    if command == "replay":
        return _refuse(f"{why}: " + ("`membound replay FILE --export DIR` writes the plots and a report instead"
                                     if offscreen else "a replay plays in the desktop app"))
    if getattr(args, "screenshot", None):
        return _refuse(f"--screenshot needs the desktop app: {why}")
    print(f"membound: {why}: starting the terminal chat"
          + ("; `membound --screenshot FILE` draws the app offscreen" if offscreen else ""), file=sys.stderr)
    from engine.cli import main as engine_main
    return engine_main(["chat"])


def _refuse(line: str) -> int:
    print(f"membound: error: {line}", file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main())
