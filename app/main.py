"""Entry point of the desktop app (`membound` with no subcommand, or `membound attach URL`).

`main(args)`: open the window and load the default model; with `args.screenshot`, answer one
prompt, save a PNG of the whole window and exit 0 (1 if the model or the reply failed)."""
from __future__ import annotations

import os
import sys

from app.launcher import NO_DISPLAY, no_display, terminal_instead
from engine.options import passive_openmp_waits

# With --engine-thread the engine's OpenMP threads share the app's process with the GUI thread.
# Spinning OpenMP threads (the default) stall at every barrier while a core runs something else: on
# a 2-core machine the default model decoded at 0.8 tok/s in the app and 17 tok/s with passive
# waiting (measured, 2-core AMD EPYC under load). It must be set before torch loads, hence here,
# before the window (and so the engine) is imported; a user's setting wins. The engine's own
# process (the default) keeps OpenMP's default, as the headless CLI does.
if "--engine-thread" in sys.argv:
    passive_openmp_waits()

DEFAULT_PROMPT = ("In a few sentences: why is generating text one token at a time limited by memory "
                  "bandwidth rather than by compute?")
SCREENSHOT_SIZE = (1680, 1050)
SCREENSHOT_SEED = 5  # sampled, but the same reply every run (this seed answers the default prompt at length)
SCREENSHOT_TIMEOUT_S = 600


def pyside_drops_none_references() -> bool:
    """True for a PySide6 build that releases a reference to None on every call of a method that
    returns nothing (PySide6 6.12.0 on Python 3.11): None's count reaches zero after a few minutes
    of painting and the process aborts ("none_dealloc"). Python 3.12+ has an immortal None."""
    if sys.version_info >= (3, 12):
        return False
    from PySide6.QtCore import QRectF

    rect = QRectF()
    before = sys.getrefcount(None)
    for _ in range(200):
        rect.setWidth(1.0)
    return sys.getrefcount(None) < before - 100


def _application(lang: str = "en"):
    """The QApplication, with the UI's strings in `lang` (app.i18n)."""
    from PySide6.QtWidgets import QApplication

    from app import i18n

    app = QApplication.instance()
    if app is None:
        app = QApplication(sys.argv[:1])
        app.setApplicationName("membound")
    i18n.uninstall(app, getattr(app, "translator", None))  # a second main() in one process (the tests)
    app.translator = i18n.install(app, lang)
    return app


def main(args=None, *, model="default", device: str = "auto", hardware=None, settings=None,
         timeout_s: float = SCREENSHOT_TIMEOUT_S) -> int:
    """args: the CLI's namespace (.screenshot, .prompt, .debug) or None. The keywords let tests
    run the same path on a tiny model."""
    screenshot = getattr(args, "screenshot", None)
    prompt = getattr(args, "prompt", None)
    if getattr(args, "command", None) == "replay":
        return run_replay(args)
    tour = None
    from app.i18n import language

    lang = language(getattr(args, "lang", None))
    if getattr(args, "tour", None):
        from app.tour import TourError, load_tour

        try:
            tour = load_tour(args.tour, lang)
        except TourError as error:
            print(f"membound: error: {error}", file=sys.stderr)
            return 2
    if no_display():
        if not screenshot:  # Qt would abort ("could not connect to display"): say so, chat in the terminal
            return terminal_instead(args, NO_DISPLAY)
        os.environ["QT_QPA_PLATFORM"] = "offscreen"  # a screenshot needs no screen
    if pyside_drops_none_references():
        import PySide6

        print(f"membound: error: PySide6 {PySide6.__version__} on Python {sys.version.split()[0]} corrupts "
              "None's reference count and would crash the app; install another version: "
              "pip install 'PySide6-Essentials>=6.6,!=6.12.0'", file=sys.stderr)
        return 2
    app = _application(lang)
    from app.plots.style import configure_pyqtgraph

    configure_pyqtgraph()
    from app.window import MainWindow

    recorder = None
    if getattr(args, "record", None):
        from app.recording import Recorder, RecordingError

        try:
            recorder = Recorder(args.record)
        except RecordingError as error:
            print(f"membound: error: {error}", file=sys.stderr)
            return 2
    window = MainWindow(model=model, device=device, hardware=hardware, settings=settings, autoload=False,
                        engine_process=not getattr(args, "engine_thread", False), recorder=recorder)
    if screenshot:
        return take_screenshot(window, screenshot, prompt or DEFAULT_PROMPT, model, timeout_s)
    from app import talk

    talk.install(window, tour=tour, lang=lang, keep_decoding=getattr(args, "keep_decoding", False),
                 autoplay=getattr(args, "autoplay", False))
    if tour is not None and getattr(args, "autoplay", False):
        window.talk.runner.finished.connect(window.close)
    window.screen_fit.show_fitted()
    if getattr(args, "command", None) == "attach":  # `membound attach URL`: a server, not the local model
        if not window.attach.attach(args.url, args.gpu, args.api_key, args.interval):
            print(f"membound: error: {window.last_error}", file=sys.stderr)
            window.shutdown()
            return 2
        code = app.exec()
        window.shutdown()
        return code
    if prompt and tour is None:
        window.model_ready.connect(lambda _info: window.send(prompt))
    window.load_model(model, device, hardware, settings)
    code = app.exec()
    window.shutdown()
    return code


def run_replay(args) -> int:
    """`membound replay FILE`: the window plays a recording, with no engine and no torch. With
    --screenshot or --export it plays it all at once, writes, and exits."""
    from app.recording import DEFAULT_RECORDING, RecordingError
    from app.replay import open_replay

    path = DEFAULT_RECORDING if args.file == "default" else args.file
    shot, export = getattr(args, "replay_screenshot", None) or getattr(args, "screenshot", None), args.export
    if no_display():
        if not (shot or export):
            return terminal_instead(args, NO_DISPLAY)
        os.environ["QT_QPA_PLATFORM"] = "offscreen"
    from app.i18n import language

    app = _application(language(getattr(args, "lang", None)))
    from app.plots.style import configure_pyqtgraph

    configure_pyqtgraph()
    try:
        window, player = open_replay(str(path), args.speed)
    except RecordingError as error:
        print(f"membound: error: {error}", file=sys.stderr)
        return 2
    from app import talk

    talk.install(window, player=player)
    if shot or export:
        window.resize(*SCREENSHOT_SIZE)
        window.show()
        player.play_all()
        app.processEvents()
        code = 0
        if export:
            from app.export import export_session

            try:
                written = export_session(window, export, replay=player.recording.describe())
                print(f"membound: exported {len(written)} files to {export}", file=sys.stderr)
            except (OSError, ValueError) as error:
                print(f"membound: error: export failed: {error}", file=sys.stderr)
                code = 2
        if shot:
            if window.save_screenshot(shot):
                print(f"membound: saved {shot}", file=sys.stderr)
            else:
                print(f"membound: error: could not write {shot}", file=sys.stderr)
                code = 2
        window.close()
        return code
    window.screen_fit.show_fitted()
    player.play()
    code = app.exec()
    window.shutdown()
    return code


def take_screenshot(window, path: str, prompt: str, model="default", timeout_s: float = SCREENSHOT_TIMEOUT_S) -> int:
    """Load, answer `prompt`, save the window as a PNG at `path`; 0 on success."""
    from PySide6.QtCore import QEventLoop, QTimer

    result = {"code": 1, "why": "timed out"}
    loop = QEventLoop()

    def finish(code: int, why: str = "") -> None:
        if result.get("done"):
            return
        result.update(done=True, code=code, why=why)
        loop.quit()

    def on_reply(done) -> None:
        if done is None:
            finish(1, window.last_error or "the reply failed")
            return
        # let a few frames draw the last steps, then grab the window
        QTimer.singleShot(4 * 33 + 200, window, lambda: finish(0 if window.save_screenshot(path) else 1,
                                                                 f"could not write {path}"))

    def on_error(message: str) -> None:
        if window.model_info is None:  # the load failed: nothing to show
            finish(1, message)

    window.resize(*SCREENSHOT_SIZE)
    window.show()
    def on_ready(_info) -> None:
        from dataclasses import replace

        settings = window.settings
        window.apply_settings(replace(settings, sampling=replace(settings.sampling, seed=SCREENSHOT_SEED)))
        window.send(prompt)

    window.model_ready.connect(on_ready)
    window.reply_finished.connect(on_reply)
    window.error_shown.connect(on_error)
    deadline = QTimer(window)
    deadline.setSingleShot(True)
    deadline.timeout.connect(lambda: finish(1, f"no reply within {timeout_s:.0f} s"))
    deadline.start(int(timeout_s * 1000))
    window.load_model(model, window.device, window.hardware, window.settings)
    loop.exec()
    deadline.stop()
    window.close()
    if result["code"] == 0:
        print(f"membound: saved {path}", file=sys.stderr)
    else:
        print(f"membound: error: screenshot not saved: {result['why']}", file=sys.stderr)
    return result["code"]


if __name__ == "__main__":
    from engine.cli import build_parser

    sys.exit(main(build_parser().parse_args()))
