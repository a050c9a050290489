"""The main window: toggles along the top, chat on the left (a third), the live plots on the right,
the hardware strip along the bottom. It lays out the panels and wires them to one source
(app/sources.py: the local engine, a replay or a server; `use_source` swaps it) without asking which
kind it is: the source's events become chat text (app/conversation.py), ring-buffer rows and
annotations (app/source_events.py). It owns its own engine's worker, which it shuts down cleanly when
it closes (also mid-reply), and its parts: the model's lifecycle (app/model_lifecycle.py), the redraw
clock (app/frame_clock.py), its place on the screen (app/screen_fit.py), the view switches
(app/view_switches.py). docs/app.md describes them.

Settings are a transaction (app/settings_requests.py): a change is sent with a request id and shows
(controls, annotation) only when the engine confirms it; a refusal puts the controls back and shows
its one line. The window keeps the conversation, so when the engine process dies the next action
starts a fresh one with the same model, settings and messages."""
from __future__ import annotations

import os
import sys
import time
import weakref

from PySide6.QtCore import QRect, Qt, Signal
from PySide6.QtGui import QKeySequence, QShortcut
from PySide6.QtWidgets import QMainWindow, QSplitter, QVBoxLayout, QWidget

from app.chat import ChatPanel
from app.controls import ControlsBar
from app.conversation import Conversation
from app.error_bar import ErrorBar
from app.frame_clock import FrameClock
from app.hardware_strip import HardwareStrip
from app.i18n import QT_TRANSLATE_NOOP, translate
from app.kv_panel import KVCachePanel
from app.model_lifecycle import ModelLifecycle
from app.plots import LiveData, PlotsPanel
from app.screen_fit import ScreenFit
from app.seed_table import SeedTable
from app.serving_panel import ServingPanel
from app.settings_requests import SettingsRequests
from app.side_tabs import SideTabs
from app.source_events import SourceEvents
from app.theme import SettingColours, themed
from app.view_switches import ViewSwitches
from app.worker import EngineWorker
from engine.metrics import StepMetrics
from engine.protocol import Chat, MeasureQuality, ModelInfo, Reset
from engine.settings import Settings

_finishing_workers: list = []  # workers still inside a step when their window closed


def single_threaded_painting() -> None:
    """Qt's GUI thread pool off: Qt converts and scales large images on a pool of threads, and a repaint
    of the whole 1600x960 window woke them ~14 times (712 wake-ups in 50 repaints offscreen; none
    with the pool off, and the GUI thread's own wake-ups fell from 544 to 175). With the engine on
    the CPU each wake-up pre-empts one of its threads. Qt reads the switch once, at the pool's first
    use (the first paint), so it is set before the window paints; a value already set stays."""
    os.environ.setdefault("QT_NO_GUI_THREADPOOL", "1")


class MainWindow(QMainWindow):
    model_ready = Signal(object)  # ModelInfo
    reply_finished = Signal(object)  # DoneEvent, or None when the reply failed
    error_shown = Signal(str)
    # what the window did of its own accord, not in answer to the engine (a recording keeps it):
    # ("send", (text, ignore_eos)), ("new_chat", None), ("hardware", HardwareSample), and talk mode's own
    action = Signal(str, object)
    closing = Signal()  # shutdown has begun: helpers stop their timers

    def __init__(self, model="default", device: str = "auto", hardware=None, settings: Settings | None = None,
                 theme: str = "dark", large_fonts: bool = False, autoload: bool = True, max_context: int = 4096,
                 engine_process: bool = False, worker=None, recorder=None):
        single_threaded_painting()
        super().__init__()
        self.setWindowTitle(translate("Window", "membound — watch decoding hit the memory wall"))
        self.theme = themed(theme, large_fonts)
        self.colours = SettingColours(self.theme)
        self.data = LiveData()
        self.lifecycle = ModelLifecycle(self, model)  # the model the window's own engine runs
        self.device = device
        self.hardware = hardware
        self.max_context = max_context
        self.settings: Settings | None = settings  # what the engine runs (as it last confirmed)
        self.model_info: ModelInfo | None = None
        self.clock = time.monotonic  # the time of the window's own annotations (a replay's is the recording's)
        self.last_error = ""
        self.quality: dict | None = None  # {label: Quality} once measured
        self._closed = False

        # ---- widgets
        self.controls = ControlsBar(self.theme, self.colours)
        self.requests = SettingsRequests(self.controls)  # asked for, not answered yet
        self.view = ViewSwitches(self, large_fonts)  # theme, type size, the hardware table
        self.model_button = self.lifecycle.model_button
        self.table_button = self.view.table_button
        self.fonts_button = self.view.fonts_button
        self.theme_button = self.view.theme_button
        for button in (self.model_button, *self.view.buttons):
            self.controls.extra.addWidget(button)
        self.chat = ChatPanel(self.theme)
        self.conversation = Conversation(self.chat, self.data)  # (kept here: it outlives the engine process)
        self.seed_table = SeedTable(self.theme, self.colours)
        self.kv_panel = KVCachePanel(self.theme)
        self.serving_panel = ServingPanel(self.data, self.theme)
        self.side_tabs = SideTabs(self.seed_table, self.kv_panel, self.serving_panel)  # the plots' sixth cell
        self.side_tabs.currentChanged.connect(lambda _index: self.view.show_table_state())
        self.plots = PlotsPanel(self.data, self.theme, self.colours, extra=self.side_tabs)
        self.plots.cells_changed.connect(self.view.show_table_state)  # (the table's button says whether it is on show)
        self.plots.extra_readable_size = self.side_tabs.readable_size
        self.hardware_strip = HardwareStrip(self.theme)
        self.error_bar = ErrorBar()

        self.splitter = QSplitter(Qt.Orientation.Horizontal)
        self.splitter.addWidget(self.chat)
        self.splitter.addWidget(self.plots)
        self.splitter.setStretchFactor(0, 1)
        self.splitter.setStretchFactor(1, 2)
        self.splitter.setChildrenCollapsible(False)
        central = QWidget()
        layout = QVBoxLayout(central)
        layout.setContentsMargins(8, 8, 8, 8)
        layout.setSpacing(6)
        layout.addWidget(self.controls)
        layout.addWidget(self.error_bar)
        layout.addWidget(self.splitter, 1)
        layout.addWidget(self.hardware_strip)
        self.setCentralWidget(central)
        from app.attach_source import add_attach_button  # attach mode: a server as the window's source

        self.attach = add_attach_button(self)  # "Attach to server…" beside "Model…"
        self.screen_fit = ScreenFit(self)  # sized and placed from the screen's available area
        self.screen_fit.fit_to_screen()

        # ---- the worker thread: commands in through its queue, plain-data signals out (queued).
        # A replay passes a worker that plays a recording; a recorder connects before the window
        # does, so it sees every signal before the window acts on it.
        self.worker = worker if worker is not None else EngineWorker(self, process=engine_process)
        self.recorder = recorder  # held here: the signals it listens to do not keep it alive
        if recorder is not None:
            recorder.attach(self)
        # what feeds the window (app/sources.py): its own engine (or a replay) until another source is
        # handed to use_source; the engine's death is the window's to handle whichever feeds it
        self.source = self.worker
        self._messages_of: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()  # each source's conversation
        self.events = SourceEvents(self)  # what the source's signals do to the panels
        self.events.wire(self.source, True)
        self.worker.engine_died.connect(self.lifecycle.engine_died)

        # ---- user actions
        self.chat.send_requested.connect(self.send)
        self.chat.stop_requested.connect(self.stop)
        self.chat.new_chat_requested.connect(self.new_chat)
        self.controls.settings_changed.connect(self.apply_settings)
        self.shortcuts = []
        for keys, action in (("Esc", self.stop), ("Ctrl+N", self.new_chat), ("Ctrl+O", self.lifecycle.pick_model),
                             ("F8", self.view.toggle_seed_table),
                             ("F9", self.view.toggle_theme),
                             ("F10", lambda: self.view.set_large_fonts(not self.theme.large)),
                             ("F11", self.screen_fit.toggle_full_screen)):
            shortcut = QShortcut(QKeySequence(keys), self)
            shortcut.activated.connect(action)
            self.shortcuts.append(shortcut)

        # ---- timers: plots redraw from the ring buffers ~30 times a second, never per token
        self.frames = FrameClock(self)
        self.frame_timer, self.nvml_timer = self.frames.frame_timer, self.frames.nvml_timer

        self.view.apply_theme()
        self.view.show_seed_table(not large_fonts)
        # typing goes to the chat from the start (it went to the bar's "More…", where Space pressed it);
        # number keys still reach the presenter with Ctrl, as in any text field (app/talk.py)
        self.chat.input.setFocus()
        self.worker.start()
        self.frame_timer.start()
        if autoload:
            self.load_model(model, device, hardware, settings)

    # ---- what the window keeps (its parts own it) ----------------------------------------------
    @property
    def messages(self) -> list[dict[str, str]]:
        """The conversation with the source, as the window keeps it."""
        return self.conversation.messages

    @messages.setter
    def messages(self, messages: list[dict[str, str]]) -> None:
        self.conversation.messages = messages

    @property
    def replying(self) -> bool:
        return self.conversation.replying

    @property
    def reply_steps(self) -> list[StepMetrics]:
        """The steps of the reply in flight (or the last one)."""
        return self.conversation.steps

    @property
    def settings_pending(self) -> bool:
        """Some settings request has not been answered by the engine yet."""
        return self.requests.waiting

    @property
    def loading(self) -> bool:
        """A model is loading into the window's engine (app/model_lifecycle.py)."""
        return self.lifecycle.loading

    @property
    def engine_dead(self) -> str:
        """Why the engine process ended, until the next action restarts it ("" while it runs)."""
        return self.lifecycle.engine_dead

    @property
    def maximize_on_show(self) -> bool:
        """The screen is smaller than the preferred size: `show_fitted` maximises the window."""
        return self.screen_fit.maximize_on_show

    # ---- the source ---------------------------------------------------------------------------
    def use_source(self, source) -> None:
        """Let `source` (app/sources.py) feed the window from now on: the reply in flight ends, the
        plots start empty, and the window shows it as it asks (`source.view()`; None: as its model
        says). Each source keeps its own conversation; the settings asked of the last one are dropped
        unanswered, and the window asks the new one what it runs."""
        if source is self.source:
            return
        if self.replying:
            self.source.stop()
            self.conversation.ended()
            self.reply_finished.emit(None)
        self.events.wire(self.source, False)
        self._messages_of[self.source] = self.messages
        self.source, self.messages = source, self._messages_of.pop(source, [])
        self.events.wire(source, True)
        self.requests.drop()
        self.show_source()
        if self.model_info is not None:
            source.query()

    def show_source(self) -> None:
        view, data = self.source.view(), self.data
        data.clear()
        self.chat.clear()
        if view is None:  # as its model says
            data.source, data.x_label, data.notes = "model", QT_TRANSLATE_NOOP("Plots", "step"), {}
            self.plots.set_hardware(self.hardware)
            if self.hardware is not None:
                self.hardware_strip.set_device(self.hardware)
            self.serving_panel.set_theme(self.theme)  # (its own title)
            self.chat.model_label.setText(self.model_info.label if self.model_info is not None else "")
        else:
            data.source, data.x_label, data.notes = view.origin, view.x_label, dict(view.notes)
            self.plots.set_hardware(view.hardware)
            self.hardware_strip.show_source(view.hardware, view.device_line, view.live_line)
            if view.serving_title:
                self.serving_panel.set_title(view.serving_title)
            self.chat.model_label.setText(view.model_line)
            if view.greeting:
                self.chat.add_notice(view.greeting)
        self.show_ready()

    def show_ready(self, controls: bool | None = None) -> None:
        """The chat takes a turn when its source can answer one; the controls and "Model…" only where
        the source takes them (`controls`: the caller's own condition, else a loaded model, not loading)."""
        has_model = self.model_info is not None or not self.source.needs_model
        self.chat.set_ready(has_model and not self.loading and not self.replying)
        if controls is None:
            controls = self.model_info is not None and not self.loading
        self.controls.set_enabled(controls and self.source.takes_settings)
        self.model_button.setEnabled(self.source.picks_models)

    def start_over(self) -> None:
        """The window as before its source's first event (a replay that seeks back): no reply
        streaming, nothing pending, empty plots and chat."""
        if self.replying:
            self.conversation.ended()
        self.requests.drop()
        self.data.clear()
        self.chat.clear()
        self.clear_error()

    def add_bar(self, bar: QWidget) -> None:
        """A bar of a source's own (a replay's, attach mode's status) under the toolbar."""
        self.centralWidget().layout().insertWidget(1, bar)

    # ---- commands -----------------------------------------------------------------------------
    def load_model(self, model="default", device: str = "auto", hardware=None,
                   settings: Settings | None = None) -> None:
        """Load a model into the window's engine (app/model_lifecycle.py)."""
        self.lifecycle.load_model(model, device, hardware, settings)

    def send(self, text: str, ignore_eos: bool = False) -> None:
        """A turn of the chat; ignore_eos: the reply runs to its token budget (keep-decoding)."""
        if self.replying or self._closed:
            return
        if self.engine_dead:
            self.lifecycle.restart_engine()  # the chat goes in after the load, on the same queue
        elif (self.model_info is None and self.source.needs_model) or self.loading:
            return
        self.clear_error()
        self.conversation.begin(text)
        self.action.emit("send", (text, ignore_eos))
        self.source.submit(Chat(text, ignore_eos=ignore_eos))

    def stop(self) -> None:
        if self.replying:
            self.source.stop()

    def new_chat(self) -> None:
        self.stop()
        self.conversation.reset()
        self.action.emit("new_chat", None)
        if not self.engine_dead:
            self.source.submit(Reset())
        self.chat.clear()
        self.chat.add_notice(translate("Window", "new chat"))

    def apply_settings(self, new: Settings) -> None:
        """Ask the engine for `new` (from the controls, mid-reply too). Only the changes from what is
        already asked for travel, with a request id; the engine answers with SettingsApplied (the
        controls and plots then show it) or SettingsRefused (the controls go back, one line says why)."""
        command = self.requests.ask(new)
        if command is None:
            return
        if self.engine_dead:
            self.lifecycle.restart_engine()
        if self.loading and self.lifecycle.restarting:
            self.requests.after_load.append(command)  # a fresh engine takes it once it has loaded
        else:
            self.source.request(command)
        if new.weights != "fp" and not self.requests.quality_asked and self.source.takes_settings:
            # the quantised copies are being made anyway: measure their quality once, on the
            # worker thread after the reply in progress (it waits for the copies)
            self.requests.quality_asked = True
            self.source.submit(MeasureQuality())

    # ---- how it looks (app/view_switches.py) and where it sits (app/screen_fit.py) ---------------
    def set_large_fonts(self, large: bool) -> None:
        """Projector mode: bigger type everywhere; the seed table makes room for the plots (F8)."""
        self.view.set_large_fonts(large)

    def toggle_seed_table(self) -> None:
        """F8: the hardware table on show, or away (app/view_switches.py)."""
        self.view.toggle_seed_table()

    def fit_to_screen(self, available: QRect | None = None) -> None:
        """Size and place the window from the screen's available area (app/screen_fit.py)."""
        self.screen_fit.fit_to_screen(available)

    def showEvent(self, event) -> None:
        super().showEvent(event)
        self.screen_fit.shown()

    def resizeEvent(self, event) -> None:
        super().resizeEvent(event)
        self.screen_fit.resized(event.size().height())

    # ---- errors -------------------------------------------------------------------------------
    def show_error(self, message: str) -> None:
        self.last_error = message
        self.error_bar.show_message(message)
        self.error_shown.emit(message)

    def clear_error(self) -> None:
        self.error_bar.setVisible(False)

    def show_hardware_sample(self, sample) -> None:
        """An NVML sample: the strip's memory figures and, while steps run, the plots' NVML series."""
        self.action.emit("hardware", sample)
        self.hardware_strip.update_memory(sample)
        if self.replying or (self.settings is not None and self.settings.users > 0):
            self.data.add_hardware(sample)

    def save_screenshot(self, path: str) -> bool:
        self.plots.refresh(force=True)
        self.plots.update_readouts(force=True)
        if self.model_info is not None:
            self.hardware_strip.update_memory(self.frames.sample_now())
        return self.grab().save(path, "PNG")

    # ---- closing ------------------------------------------------------------------------------
    def shutdown(self) -> None:
        """Stop the timers, stop the reply or load in progress and end the worker thread."""
        if self._closed:
            return
        self._closed = True
        self.closing.emit()
        self.frames.frame_timer.stop()
        self.frames.nvml_timer.stop()
        if not self.worker.shutdown():
            # One step can outlast the wait (a huge prefill on a CPU). Destroying a running QThread
            # aborts the process, so the worker leaves the window and ends on its own.
            print("membound: the engine is still finishing a step; it will stop after it", file=sys.stderr)
            self.worker.setParent(None)
            _finishing_workers.append(self.worker)
        self.frames.close_sampler()

    def closeEvent(self, event) -> None:
        self.shutdown()
        super().closeEvent(event)
