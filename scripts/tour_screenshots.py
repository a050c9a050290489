"""Play a tour offscreen with the default model, as the app ships (engine in its own process), and
save a picture of the window at each step once it is done (`make screenshots`: docs/tour/); with
--record, the session is recorded too (the bundled assets/tour-default.membound).

    python scripts/tour_screenshots.py [--tour default] [--lang en] [--out docs/tour] [--size 1280x720]
                                       [--record FILE] [--model default]
"""
from __future__ import annotations

import argparse
import os
import re
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
os.environ.setdefault("QT_QPA_PLATFORM", "offscreen")


def slug(text: str) -> str:
    return re.sub(r"[^a-z0-9]+", "-", text.lower()).strip("-")[:40]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tour", default="default")
    parser.add_argument("--lang", default="en", choices=["en", "es"])
    parser.add_argument("--out", default=str(ROOT / "docs" / "tour"))
    parser.add_argument("--size", default="1280x720", help="window size, WxH (default 1280x720: a projector)")
    parser.add_argument("--theme", default="dark", choices=["dark", "light"])
    parser.add_argument("--record", metavar="FILE", help="also record the session to FILE")
    parser.add_argument("--model", default="default")
    parser.add_argument("--timeout", type=float, default=1200, help="give up after this many seconds")
    args = parser.parse_args(argv)

    from PySide6.QtCore import QEventLoop, QTimer
    from PySide6.QtWidgets import QApplication

    app = QApplication.instance() or QApplication(sys.argv[:1])
    from app import i18n

    translator = i18n.install(app, args.lang)  # noqa: F841 (kept alive while the window lives)
    from app.plots.style import configure_pyqtgraph

    configure_pyqtgraph()
    from app import talk
    from app.recording import Recorder
    from app.tour import TourError, load_tour
    from app.window import MainWindow

    try:
        tour = load_tour(args.tour, args.lang, checked=False)  # the docs picture every step, held here or not
    except TourError as error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    width, height = (int(v) for v in args.size.split("x"))
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    recorder = Recorder(args.record) if args.record else None
    window = MainWindow(model=args.model, theme=args.theme, autoload=False, engine_process=True, recorder=recorder)
    window.show()
    the_talk = talk.install(window, tour=tour, lang=args.lang, autoplay=True)
    window.resize(width, height)  # after the tour's projector fonts: the layout is the one on stage
    runner = the_talk.runner
    saved: list[Path] = []
    started = time.monotonic()

    def on_done(index: int) -> None:
        step = tour.steps[index]
        path = out / f"{index + 1:02d}-{slug(step.title)}{'' if args.lang == 'en' else '.' + args.lang}.png"
        window.save_screenshot(str(path))
        saved.append(path)
        print(f"{time.monotonic() - started:6.1f} s  step {index + 1}/{len(tour.steps)}: {path.name}", file=sys.stderr)

    loop = QEventLoop()
    runner.step_done.connect(on_done)
    runner.finished.connect(loop.quit)
    window.error_shown.connect(lambda message: print(f"  (the window says: {message})", file=sys.stderr))
    QTimer.singleShot(int(args.timeout * 1000), loop.quit)
    window.load_model(args.model)
    loop.exec()
    window.talk.keep.stop()
    window.close()
    if len(saved) < len(tour.steps):
        print(f"error: {len(saved)} of {len(tour.steps)} steps done in {args.timeout:.0f} s", file=sys.stderr)
        return 1
    print(f"saved {len(saved)} pictures in {out}" + (f"; recorded {args.record}" if args.record else ""),
          file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
