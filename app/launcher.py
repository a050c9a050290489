"""The `membound` command. A subcommand (`chat`, `bench`, `attach --headless`) runs the headless
engine CLI; none (or `attach URL`) opens the desktop app (or, without PySide6 and pyqtgraph, the
terminal chat)."""
from __future__ import annotations

import importlib.util
import sys


def main(argv: list[str] | None = None) -> int:
    from engine.cli import build_parser
    from engine.cli import main as engine_main

    argv = sys.argv[1:] if argv is None else argv
    args = build_parser().parse_args(argv)
    if args.command and args.command != "replay" and not (args.command == "attach" and not args.headless):
        return engine_main(argv)
    if args.check:  # the tour checked against the engine, headless
        return engine_main(argv)
    if not all(importlib.util.find_spec(name) for name in ("PySide6", "pyqtgraph")):
        if args.command == "attach":
            print("membound: error: the attach window needs PySide6 and pyqtgraph (make run installs them); "
                  "`membound attach URL --headless` scrapes in the terminal", file=sys.stderr)
            return 2
        if args.command == "replay":
            print("membound: error: a replay plays in the desktop app: install PySide6 and pyqtgraph "
                  "(pip install PySide6-Essentials pyqtgraph; no torch needed)", file=sys.stderr)
            return 2
        if args.screenshot:
            print("membound: error: --screenshot needs the desktop app: install PySide6 and pyqtgraph "
                  "(make run installs them)", file=sys.stderr)
            return 2
        print("membound: the desktop app needs PySide6 and pyqtgraph (make run installs them); "
              "starting the terminal chat", file=sys.stderr)
        return engine_main(["chat"])
    from app.main import main as app_main  # an ImportError inside the app is a bug: let it show
    return app_main(args)


if __name__ == "__main__":
    sys.exit(main())
