"""The main window: toggles along the top, chat on the left (a third), the live plots on the right,
the hardware strip along the bottom. It lays out the panels and wires them to one source
(app/sources.py: the local engine, a replay or a server; `use_source` swaps it) without asking which
kind it is: the source's events become chat text (app/conversation.py), ring-buffer rows and
annotations. It owns the redraw timer and its own engine's worker, which it shuts down cleanly when it
closes (also mid-reply). docs/app.md describes the parts.

Settings are a transaction (app/settings_requests.py): a change is sent with a request id and shows
(controls, annotation) only when the engine confirms it; a refusal puts the controls back and shows
its one line. The window keeps the conversation, so when the engine process dies the next action
starts a fresh one with the same model, settings and messages."""
from __future__ import annotations

import os
import sys
import time
import weakref

from PySide6.QtCore import QRect, QSize, Qt, QTimer, Signal
from PySide6.QtGui import QGuiApplication, QKeySequence, QShortcut
from PySide6.QtWidgets import QHBoxLayout, QLabel, QMainWindow, QPushButton, QSplitter, QTabWidget, QVBoxLayout, QWidget

from app.chat import ChatPanel
from app.conversation import Conversation
from app.controls import BAR_SHARE, ControlsBar
from app.frame_budget import FrameBudget
from app.hardware_strip import HardwareStrip
from app.i18n import QT_TRANSLATE_NOOP, translate
from app.kv_panel import KVCachePanel
from app.plots import LiveData, PlotsPanel
from app.seed_table import SeedTable
from app.reply_summary import above_roof_line, failure_line, model_line
from app.serving_panel import ServingPanel
from app.settings_requests import SettingsRequests
from app.theme import SettingColours, stylesheet, themed
from app.sources import SIGNALS, PlotRow
from app.worker import EngineWorker
from engine.events import BatchStats, DoneEvent, SettingsApplied, SettingsRefused, TokenEvent
from engine.metrics import StepMetrics
from engine.protocol import Chat, Load, MeasureQuality, ModelInfo, Reset
from engine.settings import Settings

FRAME_MS = 33  # ~30 fps redraw
# With the engine on the CPU the budget below holds the frames to 1-3 a second, so the timer ticks
# at 10 Hz rather than 30: each tick wakes the GUI thread, and on 2 cores a wake-up pre-empts one of
# the engine's two spinning OpenMP threads while the other waits at the step's next barrier.
FRAME_MS_CPU = 100
READOUT_INTERVAL_S = 0.25  # numbers in titles and the strip: ~4 Hz
# With the engine on the CPU, every core the GUI thread takes is one the engine's threads wanted:
# the GUI keeps to this share of the machine's cores (2 cores: 0.08 of one) and skips frames above
# it (app/frame_budget.py), never below MIN_FPS_CPU. Measured with `python -m app.gui_bench` on 2
# cores: a frame costs 20-60 ms of CPU, and at 4-5 fps the app decoded int8 at 0.73x of headless
# (0.97x with no frames drawn), at ~2 fps at 0.88-0.91x (docs/benchmarks.md, "issue 15").
GUI_SHARE_OF_CPU_MACHINE = 0.04
GUI_CPU_BUDGET_GPU = 0.5  # of one core, when the engine runs on a GPU (its CPU threads mostly wait), or elsewhere
MIN_FPS_CPU = 1
MIN_FPS_GPU = 4
NVML_SAMPLE_MS = 250
PREFERRED_SIZE = (1600, 960)  # on a larger screen; a smaller one gets its available area
STRIP_LINES_EM = 45  # a window shorter than this many ems shows the strip's device line only
CHAT_SHARE = 1 / 3  # of the window's width, the chat's (the splitter keeps the share as the window resizes)

_finishing_workers: list = []  # workers still inside a step when their window closed


def available_geometry(window) -> QRect:
    """The available area (no task bars) of the screen the window is on, or the primary screen's."""
    screen = window.screen() or QGuiApplication.primaryScreen()
    return screen.availableGeometry() if screen is not None else QRect(0, 0, *PREFERRED_SIZE)


def fitted_size(available: QSize, frame: QSize = QSize(0, 0)) -> tuple[int, int]:
    """The window's size on a screen with this much room: the preferred size where it fits (with its
    frame), else the room itself less the frame."""
    return (min(PREFERRED_SIZE[0], available.width() - frame.width()),
            min(PREFERRED_SIZE[1], available.height() - frame.height()))

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
        self.model_spec = model if isinstance(model, str) else "prebuilt"
        self._model_source = model  # what the last load asked for (a path, a shape or LoadedWeights)
        self._loaded_source = None  # what the model now in the engine was loaded from
        self.device = device
        self.hardware = hardware
        self._above_roof_note = ""  # said once per load: a step went above the measured roof
        self.max_context = max_context
        self.settings: Settings | None = settings  # what the engine runs (as it last confirmed)
        self.model_info: ModelInfo | None = None
        self.clock = time.monotonic  # the time of the window's own annotations (a replay's is the recording's)
        self.engine_dead = ""  # why the engine process ended, until the next action restarts it
        self._restarting = False
        self.loading = False
        self.last_error = ""
        self.quality: dict | None = None  # {label: Quality} once measured
        self._frame = 0
        self._readout_s = -float("inf")
        self.frame_budget = FrameBudget(GUI_CPU_BUDGET_GPU, MIN_FPS_GPU)  # set from the engine at every tick
        self._closed = False
        self._sampler = None

        # ---- widgets
        self.controls = ControlsBar(self.theme, self.colours)
        self.requests = SettingsRequests(self.controls)  # asked for, not answered yet
        self.model_button = QPushButton(translate("Window", "Model…  Ctrl+O"))
        self.theme_button = QPushButton(translate("Window", "Light theme  F9"))
        self.fonts_button = QPushButton(translate("Window", "Large fonts  F10"))
        self.fonts_button.setCheckable(True)
        self.table_button = QPushButton(translate("Window", "Hardware table  F8"))
        self.table_button.setCheckable(True)
        self.table_button.setChecked(not large_fonts)
        for button in (self.model_button, self.table_button, self.theme_button, self.fonts_button):
            self.controls.extra.addWidget(button)
        self.chat = ChatPanel(self.theme)
        self.conversation = Conversation(self.chat, self.data)  # (kept here: it outlives the engine process)
        self.seed_table = SeedTable(self.theme, self.colours)
        self.kv_panel = KVCachePanel(self.theme)
        self.side_tabs = QTabWidget()  # the sixth cell: the seed table, or the KV cache's blocks
        self.side_tab_chosen = False  # a presenter layout named the tab: simulated users do not move it
        self.side_tabs.addTab(self.seed_table, translate("Window", "What the hardware allows"))
        self.seed_table.set_title_visible(False)  # (the tab says it; its format box sits beside the tabs)
        self.side_tabs.setCornerWidget(self.seed_table.format_box, Qt.Corner.TopRightCorner)
        self.side_tabs.currentChanged.connect(
            lambda _index: (self.seed_table.format_box.setVisible(self.side_tabs.currentWidget() is self.seed_table),
                            self._show_table_state()))
        self.side_tabs.addTab(self.kv_panel, translate("Window", "KV cache"))
        self.serving_panel = ServingPanel(self.data, self.theme)
        self.side_tabs.addTab(self.serving_panel, translate("Window", "Serving"))
        self.plots = PlotsPanel(self.data, self.theme, self.colours, extra=self.side_tabs)
        self.plots.cells_changed.connect(self._show_table_state)  # (the table's button says whether it is on show)
        self.plots.extra_readable_size = lambda: QSize(  # the table's, with the tabs around it
            self.seed_table.readable_width() + 8, self.seed_table.readable_height() + self.side_tabs.tabBar().sizeHint().height() + 8)
        self.hardware_strip = HardwareStrip(self.theme)
        self.error_label = QLabel("")
        self.error_label.setObjectName("error")
        self.error_label.setWordWrap(True)
        self.error_close = QPushButton(translate("Window", "Dismiss"))
        self.error_close.clicked.connect(self.clear_error)
        self.error_bar = QWidget()
        error_row = QHBoxLayout(self.error_bar)
        error_row.setContentsMargins(0, 0, 0, 0)
        error_row.addWidget(self.error_label, 1)
        error_row.addWidget(self.error_close)
        self.error_bar.setVisible(False)

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
        self.maximize_on_show = False  # fit_to_screen: the screen is smaller than the preferred size
        self.fit_to_screen()

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
        self._wire(self.source, True)
        self.worker.engine_died.connect(self._on_engine_died)

        # ---- user actions
        self.chat.send_requested.connect(self.send)
        self.chat.stop_requested.connect(self.stop)
        self.chat.new_chat_requested.connect(self.new_chat)
        self.controls.settings_changed.connect(self.apply_settings)
        self.model_button.clicked.connect(self.pick_model)
        self.theme_button.clicked.connect(self.toggle_theme)
        self.fonts_button.clicked.connect(lambda checked: self.set_large_fonts(checked))
        self.table_button.clicked.connect(lambda _checked: self.toggle_seed_table())
        self.shortcuts = []
        for keys, action in (("Esc", self.stop), ("Ctrl+N", self.new_chat), ("Ctrl+O", self.pick_model),
                             ("F8", self.toggle_seed_table),
                             ("F9", self.toggle_theme), ("F10", lambda: self.set_large_fonts(not self.theme.large)),
                             ("F11", self.toggle_full_screen)):
            shortcut = QShortcut(QKeySequence(keys), self)
            shortcut.activated.connect(action)
            self.shortcuts.append(shortcut)

        # ---- timers: plots redraw from the ring buffers ~30 times a second, never per token
        self.frame_timer = QTimer(self)
        self.frame_timer.setInterval(FRAME_MS)
        self.frame_timer.timeout.connect(self._on_frame)
        self.nvml_timer = QTimer(self)
        self.nvml_timer.setInterval(NVML_SAMPLE_MS)
        self.nvml_timer.timeout.connect(self._sample_hardware)

        self._apply_theme()
        self.show_seed_table(not large_fonts)
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

    # ---- the source ---------------------------------------------------------------------------
    def _wire(self, source, connect: bool) -> None:
        handlers = {"progress": self._on_progress, "model_loaded": self._on_model_loaded, "events": self._on_events,
                    "reply_started": self.data.start_reply, "busy_changed": self._on_busy_changed,
                    "failed": self._on_failed, "kv_snapshot": self.kv_panel.set_snapshot, "quality": self._on_quality,
                    "state": self._on_state, "notice": self.chat.add_notice}
        for name, handler in handlers.items():
            signal = getattr(source, name)
            signal.connect(handler) if connect else signal.disconnect(handler)

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
        self._wire(self.source, False)
        self._messages_of[self.source] = self.messages
        self.source, self.messages = source, self._messages_of.pop(source, [])
        self._wire(source, True)
        self.requests.drop()
        self._show_source()
        if self.model_info is not None:
            source.query()

    def _show_source(self) -> None:
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
        self._show_ready()

    def _show_ready(self, controls: bool | None = None) -> None:
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

    def _on_state(self, settings) -> None:
        """What the source runs (the answer to query()): shown where the window holds settings."""
        if settings is not None:
            self.settings = settings
            self.controls.set_settings(settings)

    # ---- commands -----------------------------------------------------------------------------
    def load_model(self, model="default", device: str = "auto", hardware=None,
                   settings: Settings | None = None) -> None:
        if self.replying:
            self.source.stop()
        self.loading = True
        self._restarting = False
        self.engine_dead = ""
        self.model_spec = model if isinstance(model, str) else "prebuilt"
        self._model_source = model
        self.chat.set_ready(False)
        self.controls.set_enabled(False)
        self.hardware_strip.set_progress(0.0, translate("Window", "starting…"))
        self.source.submit(Load(model, device, settings, hardware, self.max_context))

    def _restart_engine(self) -> None:
        """A fresh engine process with the model, settings and conversation the dead one had."""
        source = self._loaded_source if self._loaded_source is not None else self._model_source
        self.engine_dead = ""
        self.loading = True
        self._restarting = True
        self.controls.set_enabled(False)
        self.chat.add_notice(translate("Window", "restarting the engine…"))
        self.hardware_strip.set_progress(0.0, translate("Window", "restarting the engine…"))
        self.worker.submit(Load(source, self.device, self.settings, self.hardware, self.max_context,
                                messages=tuple(self.messages)))

    def send(self, text: str, ignore_eos: bool = False) -> None:
        """A turn of the chat; ignore_eos: the reply runs to its token budget (keep-decoding)."""
        if self.replying or self._closed:
            return
        if self.engine_dead:
            self._restart_engine()  # the chat goes in after the load, on the same queue
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
            self._restart_engine()
        if self.loading and self._restarting:
            self.requests.after_load.append(command)  # a fresh engine takes it once it has loaded
        else:
            self.source.request(command)
        if new.weights != "fp" and not self.requests.quality_asked and self.source.takes_settings:
            # the quantised copies are being made anyway: measure their quality once, on the
            # worker thread after the reply in progress (it waits for the copies)
            self.requests.quality_asked = True
            self.source.submit(MeasureQuality())

    def _on_settings_applied(self, event: SettingsApplied) -> None:
        old = self.settings
        self.settings = event.settings
        self.controls.set_settings(event.settings)
        self.requests.answered(*event.request_ids)
        self._show_model_line()
        if event.changes:  # marks the step at which it took effect
            self.data.annotate(", ".join(event.changes), event.settings.label, event.t_s)
        if event.settings.users > 0 and (old is None or old.users == 0) and not self.side_tab_chosen:
            self.side_tabs.setCurrentWidget(self.serving_panel)  # where the batch shows (when the panel does)

    def _show_model_line(self) -> None:
        """The model line with the precision and weights the engine runs now (the loader's line says
        what it loaded at)."""
        info, settings = self.model_info, self.settings
        if info is None or settings is None:
            return
        self.chat.model_label.setText(model_line(info, settings))

    def _on_settings_refused(self, event: SettingsRefused) -> None:
        if event.settings is not None:
            self.settings = event.settings
            self.controls.set_settings(event.settings)
        self.requests.answered(event.request_id)
        self.show_error(translate("Window", "not applied: {reason}").format(reason=event.reason))

    def pick_model(self) -> None:
        from app.model_picker import ModelPicker

        if self.loading or not self.source.picks_models:
            return
        dialog = ModelPicker(self.model_spec, self, hardware=self.hardware)
        if not dialog.exec():
            return
        spec = dialog.spec()
        if not spec:
            self.show_error(translate("Window", "no model path given"))
            return
        same_device = dialog.device() in ("auto", self.device)
        # on the same device keep the measured spec and the user's settings; elsewhere start afresh
        self.load_model(spec, dialog.device(), self.hardware if same_device else None,
                        self.settings if same_device else None)

    # ---- theme --------------------------------------------------------------------------------
    def _apply_theme(self) -> None:
        self.setStyleSheet(stylesheet(self.theme))
        self.colours.set_theme(self.theme)
        self.controls.set_theme(self.theme)
        self.chat.set_theme(self.theme)
        self.seed_table.set_theme(self.theme)
        self.kv_panel.set_theme(self.theme)
        self.serving_panel.set_theme(self.theme)
        self.hardware_strip.set_theme(self.theme)
        self.plots.set_theme(self.theme)
        light = self.theme.name == "light"
        self.theme_button.setText(translate("Window", "Dark theme  F9") if light
                                  else translate("Window", "Light theme  F9"))
        self.fonts_button.setChecked(self.theme.large)

    def toggle_theme(self) -> None:
        self.theme = themed("light" if self.theme.name == "dark" else "dark", self.theme.large)
        self._apply_theme()

    def set_large_fonts(self, large: bool) -> None:
        """Projector mode: bigger type everywhere; the seed table makes room for the plots (F8)."""
        self.theme = themed(self.theme.name, large)
        self._apply_theme()
        self.show_seed_table(not large)
        self._fit_strip(self.height())
        self.controls.folding.height_budget = None  # the new type's sizes: choose the bar's form again
        self.controls.set_height_budget(int(BAR_SHARE * self.height()))

    def show_seed_table(self, visible: bool) -> None:
        """Whether the grid keeps a cell for the seed table (when it has room for it)."""
        self.plots.set_extra_visible(visible)
        self._show_table_state()

    def seed_table_on_show(self) -> bool:
        return self.seed_table.isVisibleTo(self) and self.side_tabs.currentWidget() is self.seed_table

    def _show_table_state(self) -> None:
        self.table_button.setChecked(self.seed_table_on_show())

    def toggle_seed_table(self) -> None:
        """F8: the hardware table on show, or away. Where the grid has no readable cell for it (a
        small screen, large type) it comes as the presenter's panel (key 6), and F8 again brings the
        grid back."""
        presenter = getattr(getattr(self, "talk", None), "presenter", None)
        presenting = self.plots.shown is not None
        if self.seed_table_on_show():
            if presenting and presenter is not None and "extra" in self.plots.shown:
                presenter.show([name for name in self.plots.shown if name != "extra"] or None)
            self.show_seed_table(False)
            return
        self.side_tabs.setCurrentWidget(self.seed_table)
        self.show_seed_table(True)
        if not self.seed_table_on_show() and presenter is not None:  # the grid (or the presenter) left it out
            presenter.show(["table"])
        self._show_table_state()

    def toggle_full_screen(self) -> None:
        if not self.isFullScreen():
            self._was_maximized = self.isMaximized()
            self.showFullScreen()
        elif getattr(self, "_was_maximized", False):
            self.showMaximized()
        else:
            self.showNormal()

    # ---- the screen ---------------------------------------------------------------------------
    def fit_to_screen(self, available: QRect | None = None) -> None:
        """Size and place the window from the screen's available area (`available`: a given one, in
        logical pixels): the preferred size where it fits, else the whole area, and never larger;
        centred. On a screen smaller than the preferred size `show_fitted` maximises it, so a window
        manager fits its frame in as well."""
        available = available if available is not None else available_geometry(self)
        width, height = fitted_size(available.size(), self._frame_extra())
        self.maximize_on_show = (width, height) != PREFERRED_SIZE
        self.resize(width, height)
        frame = self._frame_extra()
        self.move(available.x() + max(0, (available.width() - width - frame.width()) // 2),
                  available.y() + max(0, (available.height() - height - frame.height()) // 2))
        chat = int(width * CHAT_SHARE)
        self.splitter.setSizes([chat, width - chat])
        self._fitted = (available, QSize(width, height))

    def showEvent(self, event) -> None:
        """Shown, the window has its frame: fitted before it was known, it is fitted again so the frame
        stays on the screen too (unless something resized it since)."""
        super().showEvent(event)
        fitted = getattr(self, "_fitted", None)
        if fitted is not None and self.size() == fitted[1] and not (self.isMaximized() or self.isFullScreen()) \
                and not fitted[0].contains(self.frameGeometry()):
            self.fit_to_screen(fitted[0])

    def _frame_extra(self) -> QSize:
        """What a window manager's frame adds to the window (known once it is shown; none offscreen)."""
        frame, inner = self.frameGeometry(), self.geometry()
        return QSize(max(0, frame.width() - inner.width()), max(0, frame.height() - inner.height()))

    def resizeEvent(self, event) -> None:
        super().resizeEvent(event)
        self.controls.set_height_budget(int(BAR_SHARE * event.size().height()))
        self._fit_strip(event.size().height())

    def _fit_strip(self, height: int) -> None:
        """The strip keeps to its device line where the window is short for its type (STRIP_LINES_EM)."""
        em = self.theme.font_pt * self.logicalDpiY() / 72
        self.hardware_strip.set_small(height < STRIP_LINES_EM * em)

    def show_fitted(self) -> None:
        """Show the window as `fit_to_screen` sized it (maximised on a screen smaller than it prefers)."""
        self.showMaximized() if self.maximize_on_show else self.show()

    # ---- errors -------------------------------------------------------------------------------
    def show_error(self, message: str) -> None:
        self.last_error = message
        self.error_label.setText(f"⚠  {message}")
        self.error_bar.setVisible(True)
        self.error_shown.emit(message)

    def clear_error(self) -> None:
        self.error_bar.setVisible(False)

    # ---- worker signals (GUI thread, queued) --------------------------------------------------
    def _on_progress(self, fraction: float, message: str) -> None:
        if self.loading:
            self.hardware_strip.set_progress(fraction, message)

    def _on_model_loaded(self, info: ModelInfo) -> None:
        first = self.model_info is None
        restarted = self._restarting
        self._restarting = False
        self.model_info = info
        self._loaded_source = self._model_source if not restarted else self._loaded_source or self._model_source
        self.loading = False
        self._show_ready(controls=True)
        self.device = info.device
        self.hardware = info.hardware
        self.settings = info.settings
        self.messages = list(info.messages)
        self.plots.set_hardware(info.hardware)
        self.controls.set_device(info.device)
        self.controls.set_capabilities(info.capabilities)
        self.controls.set_settings(info.settings)
        self._show_model_line()
        if restarted:
            self.chat.add_notice(translate("Window", "the engine is back: {model}, {turns} turns of the conversation "
                                                     "kept").format(model=info.label, turns=len(info.messages) // 2))
            self.data.annotate(translate("Window", "engine restarted"), info.settings.label, self.clock())
        else:
            self.data.clear()
            if not first:
                self.chat.clear()
            self.chat.add_notice(translate("Window", "loaded {model}").format(model=info.label))
            self.data.annotate(translate("Window", "start: {settings}").format(settings=info.settings.label),
                               info.settings.label, self.clock())
        if info.capabilities.decode_path:  # on a CPU: which step decodes, at which vector level, why
            self.chat.add_notice(info.capabilities.decode_path)
        for note in dict.fromkeys(info.capabilities.notes.values()):
            self.chat.add_notice(note, error=True)
        self.hardware_strip.engine_pid = self.source.pid
        self.hardware_strip.set_device(info.hardware, info.weight_bytes)
        self._above_roof_note = ""
        self._show_notes()
        self.hardware_strip.set_decode_path(info.capabilities.decode_path)
        self.seed_table.set_model(info.cfg, info.label, info.hardware, info.settings.dtype)
        self._start_sampler(info.hardware)
        for command in self.requests.take_after_load():
            self.source.request(command)
        self.model_ready.emit(info)

    def _start_sampler(self, spec) -> None:
        if self._sampler is not None:
            self._sampler.close()
            self._sampler = None
        self.nvml_timer.stop()
        # (a replay's samples are the recording's: this machine's GPU is not the one recorded)
        if spec.kind == "cuda" and spec.nvml and spec.nvml_index is not None and self.source.local_hardware:
            from engine.hardware.nvml import NvmlSampler

            sampler = NvmlSampler(spec.nvml_index)
            if sampler.available:
                self._sampler = sampler
                self.nvml_timer.start()

    def _sample_hardware(self) -> None:
        if self._sampler is not None and self.source.local_hardware:
            self.show_hardware_sample(self._sampler.sample())

    def show_hardware_sample(self, sample) -> None:
        """An NVML sample: the strip's memory figures and, while steps run, the plots' NVML series."""
        self.action.emit("hardware", sample)
        self.hardware_strip.update_memory(sample)
        if self.replying or (self.settings is not None and self.settings.users > 0):
            self.data.add_hardware(sample)

    def _on_quality(self, table: dict) -> None:
        """Perplexity / top-1 agreement per weight setting: shown on the weights switch."""
        self.quality = table
        self.controls.set_quality(table)

    def _check_roof(self, step: StepMetrics) -> None:
        """A step above its measured roof is shown as such, never absorbed into the peak: one line in
        the chat and the strip (once per load), and in the recording; the plots draw it past the line."""
        if not step.above_roof or self._above_roof_note:
            return
        self._above_roof_note = above_roof_line(step)
        self.chat.add_notice(self._above_roof_note, error=True)
        self._show_notes()
        self.action.emit("above_roof", (step.step, self._above_roof_note))

    def _show_notes(self) -> None:
        notes = list(dict.fromkeys(self.model_info.capabilities.notes.values())) if self.model_info else []
        self.hardware_strip.set_notes(notes + ([self._above_roof_note] if self._above_roof_note else []))

    def _on_events(self, batch: list) -> None:
        text = []  # the reply's pieces: shown at once, before what comes after them
        for event in batch:
            if isinstance(event, StepMetrics):
                self.data.add_step(event)
                self._check_roof(event)
                self.conversation.add_step(event)
            elif isinstance(event, TokenEvent):
                text.append((event.text, event.drafted))  # an accepted speculative guess is tinted
            elif isinstance(event, BatchStats):
                self.data.add_batch_stats(event)
            elif isinstance(event, SettingsApplied):
                self.conversation.stream(text)
                text = []
                self._on_settings_applied(event)
            elif isinstance(event, SettingsRefused):
                self._on_settings_refused(event)
            elif isinstance(event, DoneEvent):
                self.conversation.stream(text)
                text = []
                self.conversation.finish(event, self.source.reply_summary(event, self.conversation.steps))
            elif isinstance(event, PlotRow):  # a row that is not an engine step (a server's scrape)
                event.add_to(self.data)
        self.conversation.stream(text)

    def _on_busy_changed(self, kind: str, busy: bool) -> None:
        if busy:
            return
        if kind == "load":
            self.loading = False
            self.hardware_strip.set_progress(1.0, "")
            self._show_ready()
            return
        done = self.conversation.ended()
        self._show_ready()
        self.reply_finished.emit(done)

    def _on_engine_died(self, message: str) -> None:
        """The engine process ended without being told to: say so, mark the reply in flight as
        interrupted, keep the conversation, and restart it with the next action."""
        if self.replying:
            self.conversation.interrupt(translate("Window", "interrupted: {message}").format(message=message))
            self.reply_finished.emit(None)
        self.loading = False
        self._restarting = False
        self.requests.drop()
        self.engine_dead = message
        self.hardware_strip.set_progress(1.0, "")
        self._show_ready(controls=self.settings is not None)
        self.chat.set_ready(True)  # the next message starts the engine again
        what = self.model_info.label if self.model_info is not None else translate("Window", "the model")
        text = translate("Window", "{message} — the conversation is kept; your next message or setting starts it "
                                   "again with {model} and the same settings").format(message=message, model=what)
        self.chat.add_notice(text, error=True)
        self.show_error(text)

    def _on_failed(self, what: str, message: str) -> None:
        if what == "reset":  # the engine still holds the conversation: so does the window
            self.conversation.reset_failed()
        text = failure_line(what, message, self.model_info.label if self.model_info is not None else None)
        self.chat.add_notice(text, error=True)
        self.show_error(text)

    # ---- drawing ------------------------------------------------------------------------------
    @property
    def _engine_shares_the_cpu(self) -> bool:
        """Whether the source decodes on this machine's CPU cores (a local engine not on a GPU)."""
        return self.source.shares_cpu(self.device)

    @property
    def gui_cpu_budget(self) -> float:
        """Cores the GUI thread may take before frames are skipped."""
        if self._engine_shares_the_cpu:
            return GUI_SHARE_OF_CPU_MACHINE * (os.cpu_count() or 2)
        return GUI_CPU_BUDGET_GPU

    @property
    def min_fps(self) -> float:
        return MIN_FPS_CPU if self._engine_shares_the_cpu else MIN_FPS_GPU

    def _on_frame(self) -> None:
        """~30 fps (10 with the engine on this CPU), but the GUI thread keeps to a CPU budget: on a
        CPU the engine and the drawing share the same cores, so when drawing (and the rest of the
        GUI) costs more than its budget (gui_cpu_budget), frames are skipped (app/frame_budget.py;
        never below min_fps)."""
        self._frame += 1
        interval = FRAME_MS_CPU if self._engine_shares_the_cpu else FRAME_MS
        if self.frame_timer.interval() != interval:  # the device may have changed
            self.frame_timer.setInterval(interval)
        budget = self.frame_budget
        budget.budget_cores, budget.min_fps = self.gui_cpu_budget, self.min_fps
        now = time.monotonic()
        drew = budget.tick(now, time.thread_time()) and self.plots.refresh()
        if drew:
            budget.drew(now)
        if self.side_tabs.currentWidget() is self.kv_panel and self.side_tabs.isVisible():
            self.kv_panel.refresh()
        if self.side_tabs.currentWidget() is self.serving_panel and self.side_tabs.isVisible():
            self.serving_panel.refresh()
        # the numbers a few times a second; over budget, with the frames (a readout relays its label)
        if now - self._readout_s >= READOUT_INTERVAL_S and (drew or budget.share <= budget.budget_cores):
            self._readout_s = now
            self.plots.update_readouts()
            if self._sampler is None and self.model_info is not None:
                self.hardware_strip.update_memory(None)

    def save_screenshot(self, path: str) -> bool:
        self.plots.refresh(force=True)
        self.plots.update_readouts(force=True)
        if self.model_info is not None:
            self.hardware_strip.update_memory(self._sampler.sample() if self._sampler else None)
        return self.grab().save(path, "PNG")

    # ---- closing ------------------------------------------------------------------------------
    def shutdown(self) -> None:
        """Stop the timers, stop the reply or load in progress and end the worker thread."""
        if self._closed:
            return
        self._closed = True
        self.closing.emit()
        self.frame_timer.stop()
        self.nvml_timer.stop()
        if not self.worker.shutdown():
            # One step can outlast the wait (a huge prefill on a CPU). Destroying a running QThread
            # aborts the process, so the worker leaves the window and ends on its own.
            print("membound: the engine is still finishing a step; it will stop after it", file=sys.stderr)
            self.worker.setParent(None)
            _finishing_workers.append(self.worker)
        if self._sampler is not None:
            self._sampler.close()
            self._sampler = None

    def closeEvent(self, event) -> None:
        self.shutdown()
        super().closeEvent(event)
