"""Play a recording (app/recording.py) back in the window, with no engine and no torch: a
`ReplaySource` stands in for the engine's worker, a `Player` feeds it the recorded entries as the
playing position passes them, and a `ReplayBar` says plainly that this is a replay."""
from __future__ import annotations

import math
import time
from typing import Callable

from PySide6.QtCore import QObject, Qt, QTimer, Signal
from PySide6.QtGui import QKeySequence, QShortcut
from PySide6.QtWidgets import QComboBox, QFrame, QHBoxLayout, QLabel, QPushButton, QSlider

from app.i18n import QT_TRANSLATE_NOOP, translate
from app.recording import WORKER_SIGNALS, Entry, Recording, RecordingError, read_recording
from app.sources import EventSource
from engine.events import SettingsRefused

TICK_MS = 30
SPEEDS = (0.5, 1.0, 2.0, 4.0)
SEEK_STEP_S = 10.0


# ---- playing back -------------------------------------------------------------------------------
REPLAY_REFUSAL = QT_TRANSLATE_NOOP("Replay", "this is a replay: the settings are the recording's "
                                             "(the engine is not running)")


class ReplaySource(QObject, EventSource):
    """A recording as the window's source (app/sources.py), standing in for app.worker.EngineWorker:
    the same signals, fed by a `Player`; commands go nowhere and a settings request is refused with
    one line. This machine's hardware is not the one recorded (its samples are in the recording)."""
    local_hardware = False

    process_mode = False
    engine = None
    pid = -1  # no engine process: the hardware strip shows the recorded machine's memory, not this process's

    def __init__(self, parent=None):
        super().__init__(parent)
        self.settings = None  # what the recording's engine last ran

    def submit(self, command) -> None:
        pass  # the recording holds the answers to the commands it was given

    def request(self, command) -> None:
        self.events.emit([SettingsRefused(command.request_id, translate("Replay", REPLAY_REFUSAL), self.settings)])

    def query(self) -> None:
        self.state.emit(self.settings)

    def isRunning(self) -> bool:
        return False


class Player(QObject):
    """Plays a `Recording` into a window built with a `ReplaySource`: entries go out when the
    playing position (seconds of the recording, advancing at `speed`) passes them. `seek` jumps;
    backwards it starts the window over and plays up to the mark at once."""
    position_changed = Signal(float)
    state_changed = Signal()
    finished = Signal()

    def __init__(self, recording: Recording, window, speed: float = 1.0, parent=None):
        super().__init__(parent or window)
        self.recording = recording
        self.window = window
        self.worker: ReplaySource = window.worker
        self.speed = speed
        self.position_s = 0.0
        self.index = 0  # the next entry to play
        self.playing = False
        self._now_mono = recording.entries[0].mono_s if recording.entries else time.monotonic()
        window.clock = lambda: self._now_mono
        # window actions by kind; talk mode adds its own ("tour", "layout", "notice")
        self.handlers: dict[str, Callable[..., None]] = {
            "send": lambda text, ignore_eos=False: window.send(text, ignore_eos),
            "new_chat": lambda *_: window.new_chat(),
            "hardware": window.show_hardware_sample,
            "notice": lambda text, error=False: window.chat.add_notice(text, error),
        }
        self._timer = QTimer(self)
        self._timer.setInterval(TICK_MS)
        self._timer.timeout.connect(self._tick)
        self._last_tick = time.monotonic()
        window.closing.connect(self._timer.stop)

    @property
    def duration_s(self) -> float:
        return self.recording.duration_s

    @property
    def at_end(self) -> bool:
        return self.index >= len(self.recording.entries)

    def play(self) -> None:
        if self.at_end:
            self.seek(0.0)
        self.playing = True
        self._last_tick = time.monotonic()
        self._timer.start()
        self.state_changed.emit()

    def pause(self) -> None:
        self.playing = False
        self._timer.stop()
        self.state_changed.emit()

    def toggle(self) -> None:
        self.pause() if self.playing else self.play()

    def set_speed(self, speed: float) -> None:
        self.speed = float(speed)
        self.state_changed.emit()

    def seek(self, position_s: float) -> None:
        position_s = min(max(0.0, position_s), self.duration_s)
        if position_s < self.position_s:
            self._start_over()
        self._play_until(position_s)

    def play_all(self) -> None:
        """Everything, at once (exports, screenshots, tests)."""
        self._play_until(self.duration_s)

    def _tick(self) -> None:
        now = time.monotonic()
        elapsed, self._last_tick = now - self._last_tick, now
        self._play_until(self.position_s + elapsed * self.speed)
        if self.at_end:
            self.pause()
            self.finished.emit()

    def _play_until(self, position_s: float) -> None:
        entries = self.recording.entries
        while self.index < len(entries) and entries[self.index].t_s <= position_s + 1e-9:
            entry = entries[self.index]
            self.index += 1
            self._now_mono = entry.mono_s
            self._dispatch(entry)
        self.position_s = position_s
        self.position_changed.emit(position_s)

    def _dispatch(self, entry: Entry) -> None:
        if entry.kind in WORKER_SIGNALS:
            if entry.kind == "model_loaded":
                self.worker.settings = entry.args[0].settings
            elif entry.kind == "events":
                for event in entry.args[0]:
                    settings = getattr(event, "settings", None)
                    if settings is not None:
                        self.worker.settings = settings
            getattr(self.worker, entry.kind).emit(*entry.args)
            return
        handler = self.handlers.get(entry.kind)
        if handler is not None:  # an action this version does not know is passed over
            handler(*entry.args)

    def _start_over(self) -> None:
        """The window as before the first entry: no reply streaming, nothing pending, empty plots."""
        self.window.start_over()
        self.index = 0
        self.position_s = 0.0


def open_replay(path: str, speed: float = 1.0, theme: str = "dark", large_fonts: bool = False):
    """A window that plays `path` (RecordingError if it cannot be read): (window, player)."""
    from app.window import MainWindow

    if not (isinstance(speed, (int, float)) and math.isfinite(speed) and 0.1 <= speed <= 64):
        raise RecordingError(f"--speed must be between 0.1 and 64, got {speed}")
    recording = read_recording(path)
    if recording.model_info is None:
        raise RecordingError(f"{path}: the recording holds no loaded model (nothing to replay)")
    worker = ReplaySource()
    window = MainWindow(model="replay", theme=theme, large_fonts=large_fonts, autoload=False, worker=worker)
    worker.setParent(window)
    player = Player(recording, window, speed)
    bar = ReplayBar(player, window)
    window.replay_bar = bar
    window.setWindowTitle(translate("Replay", "membound — REPLAY · {recording}").format(
        recording=recording.describe()))
    return window, player


class ReplayBar(QFrame):
    """A banner that says plainly this is a replay (of what hardware, when), with play/pause, the
    speed and a seek slider. Space plays and pauses, ] and [ change the speed, Ctrl+Right/Left seek."""

    def __init__(self, player: Player, window):
        super().__init__(window)
        self.player = player
        self.setObjectName("replay")
        row = QHBoxLayout(self)
        row.setContentsMargins(10, 4, 10, 4)
        recording = player.recording
        info = recording.model_info
        where = " · ".join(p for p in (info.hardware.name if info else "", recording.describe(model=False)) if p)
        self.label = QLabel(translate("Replay", "<b>REPLAY</b> of {where} — no engine is running").format(where=where))
        self.label.setToolTip(f"{recording.path}: {recording.describe()}")
        self.label.setObjectName("replay_label")
        self.label.setWordWrap(True)  # a narrow window wraps it rather than widening
        self.play_button = QPushButton(translate("Replay", "Play  Space"))
        self.play_button.clicked.connect(player.toggle)
        self.speed_box = QComboBox()
        for speed in SPEEDS:
            self.speed_box.addItem(f"{speed:g}x", speed)
        self.speed_box.currentIndexChanged.connect(lambda i: player.set_speed(self.speed_box.itemData(i)))
        self.slider = QSlider(Qt.Orientation.Horizontal)
        self.slider.setRange(0, max(1, int(player.duration_s * 10)))
        self.slider.setMinimumWidth(120)
        self.slider.sliderReleased.connect(lambda: player.seek(self.slider.value() / 10))
        self.time_label = QLabel()
        row.addWidget(self.label, 3)  # the label's lines before the slider's width
        row.addWidget(self.play_button)
        row.addWidget(self.speed_box)
        row.addWidget(self.slider, 1)
        row.addWidget(self.time_label)
        window.add_bar(self)
        # the chat cannot talk to a recording: its input row goes, the transcript stays
        for widget in (window.chat.input, window.chat.send_button, window.chat.stop_button, window.chat.new_button):
            widget.setVisible(False)
        self.shortcuts = []
        for keys, action in (("Space", player.toggle), ("]", lambda: self._step_speed(+1)),
                             ("[", lambda: self._step_speed(-1)),
                             ("Ctrl+Right", lambda: player.seek(player.position_s + SEEK_STEP_S)),
                             ("Ctrl+Left", lambda: player.seek(player.position_s - SEEK_STEP_S))):
            shortcut = QShortcut(QKeySequence(keys), window)
            shortcut.activated.connect(action)
            self.shortcuts.append(shortcut)
        player.position_changed.connect(self._show_position)
        player.state_changed.connect(self._show_state)
        self._show_state()
        self._show_position(0.0)

    def _step_speed(self, direction: int) -> None:
        index = min(max(self.speed_box.currentIndex() + direction, 0), self.speed_box.count() - 1)
        self.speed_box.setCurrentIndex(index)

    def _show_state(self) -> None:
        playing = self.player.playing
        self.play_button.setText(translate("Replay", "Pause  Space") if playing else translate("Replay", "Play  Space"))
        index = self.speed_box.findData(self.player.speed)
        if index >= 0 and index != self.speed_box.currentIndex():
            self.speed_box.setCurrentIndex(index)

    def _show_position(self, position_s: float) -> None:
        if not self.slider.isSliderDown():
            self.slider.setValue(int(position_s * 10))
        self.time_label.setText(f"{_clock(position_s)} / {_clock(self.player.duration_s)}  ·  "
                                f"{self.player.speed:g}x")


def _clock(seconds: float) -> str:
    seconds = int(seconds)
    return f"{seconds // 60}:{seconds % 60:02d}"
