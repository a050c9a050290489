"""The model the window's own engine runs, over its life: loaded (Load, with the device, settings and
context asked for), shown once the engine says it is (every panel told the model, device and
settings), picked with "Model…" (Ctrl+O), and restarted after the engine process dies: the window
keeps the conversation, so the next action starts a fresh engine with the same model, settings and
messages."""
from __future__ import annotations

from PySide6.QtWidgets import QPushButton

from app.i18n import translate
from engine.protocol import Load, ModelInfo
from engine.settings import Settings


class ModelLifecycle:
    """The model of `window` (a MainWindow: its source and panels). `loading`: a load is under way;
    `engine_dead`: why the engine process ended, until the next action restarts it."""

    def __init__(self, window, model):
        self.window = window
        self.model_spec = model if isinstance(model, str) else "prebuilt"
        self.model_source = model  # what the last load asked for (a path, a shape or LoadedWeights)
        self.loaded_source = None  # what the model now in the engine was loaded from
        self.engine_dead = ""
        self.restarting = False
        self.loading = False
        self.model_button = QPushButton(translate("Window", "Model…  Ctrl+O"))
        self.model_button.clicked.connect(self.pick_model)

    def load_model(self, model="default", device: str = "auto", hardware=None,
                   settings: Settings | None = None) -> None:
        window = self.window
        if window.replying:
            window.source.stop()
        self.loading = True
        self.restarting = False
        self.engine_dead = ""
        self.model_spec = model if isinstance(model, str) else "prebuilt"
        self.model_source = model
        window.chat.set_ready(False)
        window.controls.set_enabled(False)
        window.hardware_strip.set_progress(0.0, translate("Window", "starting…"))
        window.source.submit(Load(model, device, settings, hardware, window.max_context))

    def restart_engine(self) -> None:
        """A fresh engine process with the model, settings and conversation the dead one had."""
        window = self.window
        source = self.loaded_source if self.loaded_source is not None else self.model_source
        self.engine_dead = ""
        self.loading = True
        self.restarting = True
        window.controls.set_enabled(False)
        window.chat.add_notice(translate("Window", "restarting the engine…"))
        window.hardware_strip.set_progress(0.0, translate("Window", "restarting the engine…"))
        window.worker.submit(Load(source, window.device, window.settings, window.hardware, window.max_context,
                                  messages=tuple(window.messages)))

    def model_loaded(self, info: ModelInfo) -> None:
        window = self.window
        first = window.model_info is None
        restarted = self.restarting
        self.restarting = False
        window.model_info = info
        self.loaded_source = self.model_source if not restarted else self.loaded_source or self.model_source
        self.loading = False
        window.show_ready(controls=True)
        window.device = info.device
        window.hardware = info.hardware
        window.settings = info.settings
        window.messages = list(info.messages)
        window.plots.set_hardware(info.hardware)
        window.controls.set_device(info.device)
        window.controls.set_capabilities(info.capabilities)
        window.controls.set_settings(info.settings)
        window.events.show_model_line()
        chat, data = window.chat, window.data
        if restarted:
            chat.add_notice(translate("Window", "the engine is back: {model}, {turns} turns of the conversation "
                                                "kept").format(model=info.label, turns=len(info.messages) // 2))
            data.annotate(translate("Window", "engine restarted"), info.settings.label, window.clock())
        else:
            data.clear()
            if not first:
                chat.clear()
            chat.add_notice(translate("Window", "loaded {model}").format(model=info.label))
            data.annotate(translate("Window", "start: {settings}").format(settings=info.settings.label),
                          info.settings.label, window.clock())
        if info.capabilities.decode_path:  # on a CPU: which step decodes, at which vector level, why
            chat.add_notice(info.capabilities.decode_path)
        for note in dict.fromkeys(info.capabilities.notes.values()):
            chat.add_notice(note, error=True)
        window.hardware_strip.engine_pid = window.source.pid
        window.hardware_strip.set_device(info.hardware, info.weight_bytes)
        window.events.above_roof_note = ""
        window.events.show_notes()
        window.hardware_strip.set_decode_path(info.capabilities.decode_path)
        window.seed_table.set_model(info.cfg, info.label, info.hardware, info.settings.dtype)
        window.frames.start_sampler(info.hardware)
        for command in window.requests.take_after_load():
            window.source.request(command)
        window.model_ready.emit(info)

    def load_ended(self) -> None:
        """The load is over (loaded, or failed: `failed` said why)."""
        self.loading = False
        self.window.hardware_strip.set_progress(1.0, "")
        self.window.show_ready()

    def engine_died(self, message: str) -> None:
        """The engine process ended without being told to: say so, mark the reply in flight as
        interrupted, keep the conversation, and restart it with the next action."""
        window = self.window
        if window.replying:
            window.conversation.interrupt(translate("Window", "interrupted: {message}").format(message=message))
            window.reply_finished.emit(None)
        self.loading = False
        self.restarting = False
        window.requests.drop()
        self.engine_dead = message
        window.hardware_strip.set_progress(1.0, "")
        window.show_ready(controls=window.settings is not None)
        window.chat.set_ready(True)  # the next message starts the engine again
        what = window.model_info.label if window.model_info is not None else translate("Window", "the model")
        text = translate("Window", "{message} — the conversation is kept; your next message or setting starts it "
                                   "again with {model} and the same settings").format(message=message, model=what)
        window.chat.add_notice(text, error=True)
        window.show_error(text)

    def pick_model(self) -> None:
        from app.model_picker import ModelPicker

        window = self.window
        if self.loading or not window.source.picks_models:
            return
        dialog = ModelPicker(self.model_spec, window, hardware=window.hardware)
        if not dialog.exec():
            return
        spec = dialog.spec()
        if not spec:
            window.show_error(translate("Window", "no model path given"))
            return
        same_device = dialog.device() in ("auto", window.device)
        # on the same device keep the measured spec and the user's settings; elsewhere start afresh
        self.load_model(spec, dialog.device(), window.hardware if same_device else None,
                        window.settings if same_device else None)
