"""Tours: a TOML file of ordered steps, each a caption (shown large over the window), the settings to
apply (through the window's transaction), an optional prompt, the plots to bring forward and an
optional wait. `load_tour` reads and checks one (TourError: one line naming the file, step and field);
`TourRunner` steps through it, forward and back, from a presentation clicker's keys.

    [tour]
    title = "Why decoding waits on memory"
    [tour.settings]                   # where the first step starts (the steps change it from there)
    kv_layout = "contiguous"
    [[step]]
    title.en = "KV cache off"         # any text field: a string, or one per language (title.es = …)
    caption.en = "Every step now recomputes the whole context."
    settings = { kv_layout = "off" }  # laid over the step before's (going back restores them)
    prompt.en = "…"                   # optional: the next reply answers it
    plots = ["tokens", "compute"]     # one or two of tokens, memory, compute, roofline, timeline, table, kv, serving
    wait_tokens = 48                  # optional: the step is done when the engine has confirmed its settings
    wait_s = 5                        # and this many tokens have streamed / seconds passed
    requires = "speculate"            # optional: left out where the engine has no such setting
    expect = { figure = "decode_tokens_per_s", direction = "higher", than = { weights = "fp" } }
                                      # optional: the caption's direction, checked by `membound --tour
                                      # FILE --check` (engine/tour_check.py); a step whose direction did
                                      # not hold on this machine is left out here, saying why
"""
from __future__ import annotations

import dataclasses
import time
import tomllib
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from PySide6.QtCore import QObject, QTimer, Signal

from app.i18n import translate
from app.presenter import PLOT_NAMES
from engine.events import TokenEvent
from engine.protocol import with_changes
from engine.settings import EngineError, SamplingParams, Settings
from engine.tour_verdicts import failed_steps

TOURS_DIR = Path(__file__).resolve().parents[1] / "assets" / "tours"
LANGUAGES = ("en", "es")
STEP_FIELDS = ("title", "caption", "settings", "prompt", "plots", "wait_tokens", "wait_s", "requires", "expect")
TOUR_FIELDS = ("title", "settings", "keep_decoding", "large_fonts", "optional")
POLL_MS = 100


def left_out_line(number: int, setting: str) -> str:
    """Why step `number` is left out, in the UI's language."""
    return translate("Tour", "step {number} needs the setting {setting}, which this engine does not have").format(
        number=number, setting=repr(setting))


class TourError(ValueError):
    """A tour file that cannot be used: one line naming the file, the step and the field."""


@dataclass(frozen=True)
class TourStep:
    number: int  # 1-based, in the file
    title: str
    caption: str
    settings: tuple[tuple[str, Any], ...] = ()  # (dotted field, value), laid over the step before's
    prompt: str = ""
    plots: tuple[str, ...] = ()
    wait_tokens: int = 0
    wait_s: float = 0.0


@dataclass(frozen=True)
class Tour:
    path: str
    lang: str
    title: str
    steps: tuple[TourStep, ...]
    base: tuple[tuple[str, Any], ...] = ()  # [tour.settings]
    keep_decoding: bool = True
    large_fonts: bool = True
    left_out: tuple[tuple[int, str], ...] = ()  # steps this engine cannot run: (step number, the setting it lacks)
    # steps whose caption's direction did not hold when checked on this machine: (step number, why)
    skipped: tuple[tuple[int, str], ...] = ()

    @property
    def fields(self) -> tuple[str, ...]:
        """Every setting the tour touches."""
        names = dict.fromkeys(path for path, _ in self.base)
        for step in self.steps:
            names.update(dict.fromkeys(path for path, _ in step.settings))
        return tuple(names)

    def targets(self, initial: Settings) -> list[dict[str, Any]]:
        """For each step, the value of every setting the tour touches: `initial`'s, then the base's,
        then each step's up to this one (so stepping back puts the earlier values back)."""
        current = {path: _get(initial, path) for path in self.fields}
        current.update(self.base)
        out = []
        for step in self.steps:
            current = {**current, **dict(step.settings)}
            out.append(dict(current))
        return out


def tour_path(spec: str) -> Path:
    return TOURS_DIR / "default.toml" if spec == "default" else Path(spec)


def load_tour(spec: str, lang: str = "en", settings_type: type = Settings, checked: bool = True) -> Tour:
    """Read and check a tour: `spec` is "default" or a path. settings_type: the engine's Settings
    (a test passes one without a field to see steps left out). checked: leave out the steps whose
    direction `membound --tour SPEC --check` found not to hold on this machine."""
    path = tour_path(spec)
    name = str(spec if spec != "default" else path)
    if lang not in LANGUAGES:
        raise TourError(f"{name}: language must be one of {', '.join(LANGUAGES)}, got {lang!r}")
    try:
        with open(path, "rb") as file:
            doc = tomllib.load(file)
    except FileNotFoundError:
        raise TourError(f"{name}: no such tour file") from None
    except IsADirectoryError:
        raise TourError(f"{name}: is a folder, not a tour file") from None
    except tomllib.TOMLDecodeError as error:
        raise TourError(f"{name}: not valid TOML: {error}") from None
    except UnicodeDecodeError:
        raise TourError(f"{name}: not valid TOML: not UTF-8 text") from None
    return _parse(doc, name, lang, settings_type, failed_steps(spec) if checked else {})


def _parse(doc: dict, name: str, lang: str, settings_type: type, failed: dict[int, str] | None = None) -> Tour:
    unknown = [k for k in doc if k not in ("tour", "step")]
    if unknown:
        raise TourError(f"{name}: unknown table [{unknown[0]}] (a tour has [tour] and [[step]])")
    head = doc.get("tour", {})
    if not isinstance(head, dict):
        raise TourError(f"{name}: [tour] must be a table")
    where = f"{name}: [tour]"
    for key in head:
        if key not in TOUR_FIELDS:
            raise TourError(f"{where}: unknown field {key!r} (known: {', '.join(TOUR_FIELDS)})")
    optional = head.get("optional", [])
    if not isinstance(optional, list) or not all(isinstance(o, str) for o in optional):
        raise TourError(f"{where}: optional: must be a list of setting names")
    known = _setting_paths(settings_type)
    title = _text(head.get("title", "membound tour"), lang, f"{where}: title")
    base = _settings(head.get("settings", {}), f"{where}: settings", known, optional)
    keep = _flag(head, "keep_decoding", True, where)
    large = _flag(head, "large_fonts", True, where)
    raw_steps = doc.get("step")
    if not isinstance(raw_steps, list) or not raw_steps:
        raise TourError(f"{name}: no steps (add [[step]] tables)")
    steps, left_out, skipped = [], [], []
    current = with_changes(settings_type(), base)
    for number, raw in enumerate(raw_steps, 1):
        where = f"{name}: step {number}"
        if not isinstance(raw, dict):
            raise TourError(f"{where}: must be a table ([[step]])")
        if isinstance(raw.get("title"), (str, dict)):
            try:
                where += f" ({_text(raw['title'], lang, where)})"
            except TourError:
                pass
        for key in raw:
            if key not in STEP_FIELDS:
                raise TourError(f"{where}: unknown field {key!r} (known: {', '.join(STEP_FIELDS)})")
        for key in ("title", "caption"):
            if key not in raw:
                raise TourError(f"{where}: {key}: missing")
        requires = raw.get("requires", "")
        if not isinstance(requires, str):
            raise TourError(f"{where}: requires: must be the name of a setting")
        if requires and requires not in known:
            left_out.append((number, requires))
            continue
        if failed and number in failed:  # its caption's direction does not hold on this machine
            skipped.append((number, failed[number]))
            continue
        step_settings = _settings(raw.get("settings", {}), f"{where}: settings", known, optional)
        current = with_changes(current, step_settings)
        try:
            current.validate("cuda")  # what any device could run; the loaded model's own limits come later
        except EngineError as error:
            raise TourError(f"{where}: settings: {error}") from None
        plots = raw.get("plots", [])
        if isinstance(plots, str):
            plots = [plots]
        if not isinstance(plots, list) or len(plots) > 2 or not all(p in PLOT_NAMES for p in plots):
            raise TourError(f"{where}: plots: one or two of {', '.join(PLOT_NAMES)}, got {plots!r}")
        steps.append(TourStep(
            number=number, title=_text(raw["title"], lang, f"{where}: title"),
            caption=_text(raw["caption"], lang, f"{where}: caption"), settings=step_settings,
            prompt=_text(raw.get("prompt", ""), lang, f"{where}: prompt"), plots=tuple(plots),
            wait_tokens=_number(raw, "wait_tokens", where, whole=True),
            wait_s=_number(raw, "wait_s", where, whole=False)))
    if not steps:
        raise TourError(f"{name}: every step was left out: {left_out_line(*left_out[0])}")
    return Tour(name, lang, title, tuple(steps), base, keep, large, tuple(left_out), tuple(skipped))


def _setting_paths(settings_type: type) -> set[str]:
    paths = {"kv_cache"} | {f"sampling.{f.name}" for f in dataclasses.fields(SamplingParams)}
    paths |= {f.name for f in dataclasses.fields(settings_type) if f.name != "sampling"}
    return paths


def _settings(raw, where: str, known: set[str], optional: list[str]) -> tuple[tuple[str, Any], ...]:
    if not isinstance(raw, dict):
        raise TourError(f"{where}: must be a table of settings, e.g. {{ kv_layout = \"off\" }}")
    out = []
    for path, value in _flatten(raw):
        if path not in known:
            if path in optional:  # e.g. speculation, on an engine without it
                continue
            raise TourError(f"{where}.{path}: no such setting (known: {', '.join(sorted(known))})")
        if isinstance(value, (dict, list)):
            raise TourError(f"{where}.{path}: must be a single value, got {value!r}")
        out.append((path, value))
    return tuple(out)


def _flatten(raw: dict, prefix: str = ""):
    for key, value in raw.items():
        if isinstance(value, dict) and key == "sampling":
            yield from _flatten(value, f"{prefix}{key}.")
        else:
            yield f"{prefix}{key}", value


def _text(value, lang: str, where: str) -> str:
    """A text field: a string, or a table of languages (title.en = …, title.es = …)."""
    if isinstance(value, str):
        return value.strip()
    if isinstance(value, dict):
        if lang not in value:
            raise TourError(f"{where}: has no {lang!r} text (has {', '.join(sorted(value)) or 'none'})")
        if not isinstance(value[lang], str):
            raise TourError(f"{where}.{lang}: must be text")
        return value[lang].strip()
    raise TourError(f"{where}: must be text, or a table of languages ({'.'.join(LANGUAGES)} = …), got {value!r}")


def _number(raw: dict, key: str, where: str, whole: bool) -> Any:
    value = raw.get(key, 0)
    kind = int if whole else (int, float)
    if isinstance(value, bool) or not isinstance(value, kind) or value < 0:
        raise TourError(f"{where}: {key}: must be a {'whole ' if whole else ''}number >= 0, got {value!r}")
    return value


def _flag(raw: dict, key: str, default: bool, where: str) -> bool:
    value = raw.get(key, default)
    if not isinstance(value, bool):
        raise TourError(f"{where}: {key}: must be true or false, got {value!r}")
    return value


def _get(settings: Settings, path: str) -> Any:
    for part in path.split("."):
        settings = getattr(settings, part)
    return settings


# ---- running a tour -----------------------------------------------------------------------------
class TourRunner(QObject):
    """Steps `window` through `tour`: a step applies its settings (the window's transaction), asks
    its prompt, brings its plots forward and shows its caption; it is *done* once the engine has
    answered every settings request and its wait has passed. With `autoplay` the next step follows
    each done one (screenshots, unattended recordings)."""
    step_started = Signal(int)  # index into tour.steps
    step_done = Signal(int)
    finished = Signal()  # autoplay went past the last step

    def __init__(self, window, tour: Tour, presenter, overlay, keep=None, autoplay: bool = False):
        super().__init__(window)
        self.window, self.tour, self.presenter, self.overlay, self.keep = window, tour, presenter, overlay, keep
        self.autoplay = autoplay
        self.index = -1
        self.targets: list[dict[str, Any]] | None = None
        self._done = False
        self._tokens = 0  # tokens streamed since the step began
        self._step_t0 = 0.0
        self._timer = QTimer(self)
        self._timer.setInterval(POLL_MS)
        self._timer.timeout.connect(self._check_done)
        window.worker.events.connect(self._count_tokens)
        window.closing.connect(self._timer.stop)

    @property
    def step(self) -> TourStep | None:
        return self.tour.steps[self.index] if 0 <= self.index < len(self.tour.steps) else None

    @property
    def done(self) -> bool:
        return self._done

    def start(self) -> None:
        """The first step, once a model is loaded."""
        if self.window.model_info is None or self.window.loading:
            self.window.model_ready.connect(self._start_once)
            return
        self.go(0)

    def _start_once(self, _info) -> None:
        self.window.model_ready.disconnect(self._start_once)
        self.go(0)

    def next(self) -> None:
        if self.targets is None:
            return
        if self.index + 1 < len(self.tour.steps):
            self.go(self.index + 1)
        elif self.autoplay:
            self._timer.stop()
            self.finished.emit()

    def back(self) -> None:
        if self.targets is not None and self.index > 0:
            self.go(self.index - 1, forward=False)

    def go(self, index: int, forward: bool = True) -> None:
        window = self.window
        if self.targets is None:  # the first step: what the tour leaves alone stays the person's
            self.targets = self.tour.targets(window.controls.requested)
            self._warn_refusals()
        self.index = index
        step = self.tour.steps[index]
        self._done = False
        self._tokens = 0
        self._step_t0 = time.monotonic()
        self.overlay.show_step(step, index, len(self.tour.steps))
        self.presenter.show(list(step.plots) or None)
        target = with_changes(window.controls.requested, self.targets[index].items())
        window.apply_settings(target)
        if step.prompt and forward:
            if self.keep is not None and self.tour.keep_decoding:
                self.keep.ask(step.prompt)
            elif not window.replying:
                window.send(step.prompt)
        elif self.keep is not None and self.tour.keep_decoding and not self.keep.on:
            self.keep.start()
        self.step_started.emit(index)
        self._timer.start()

    def matches(self, index: int | None = None) -> bool:
        """The engine runs what step `index` (default: the current one) asks for."""
        index = self.index if index is None else index
        settings = self.window.settings
        return settings is not None and all(_get(settings, path) == value
                                            for path, value in self.targets[index].items())

    def _warn_refusals(self) -> None:
        """Steps the loaded model or device will refuse, said once at the start (the tour goes on)."""
        from app.keep_decoding import notice

        info = self.window.model_info
        if info is None:
            return
        for step, target in zip(self.tour.steps, self.targets):
            refusal = info.capabilities.refusal(with_changes(info.settings, target.items()))
            if refusal:
                notice(self.window, translate("Tour", "tour step {number} ({title}) will be refused here: {why}")
                       .format(number=step.number, title=step.title, why=refusal))
        for number, setting in self.tour.left_out:
            notice(self.window, translate("Tour", "tour: {what}: left out").format(what=left_out_line(number, setting)))

    def _count_tokens(self, batch: list) -> None:
        self._tokens += sum(1 for event in batch if isinstance(event, TokenEvent))

    def _check_done(self) -> None:
        step = self.step
        if step is None or self._done:
            return
        if self.window.settings_pending or self._tokens < step.wait_tokens \
                or time.monotonic() - self._step_t0 < step.wait_s:
            return
        self._done = True
        self._timer.stop()
        self.step_done.emit(self.index)
        if self.autoplay:
            QTimer.singleShot(0, self, self.next)
