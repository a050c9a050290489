"""What the window's source says, shown: its signals (app/sources.py) connected to the panels. A
batch of events becomes chat text (app/conversation.py), ring-buffer rows and annotations; a
settings answer moves the controls (SettingsApplied) or puts them back with one line (SettingsRefused);
a step above its measured roof is said once; a failure is one line."""
from __future__ import annotations

from app.i18n import translate
from app.reply_summary import above_roof_line, failure_line, model_line
from app.sources import PlotRow
from engine.events import BatchStats, DoneEvent, SettingsApplied, SettingsRefused, TokenEvent
from engine.metrics import StepMetrics


class SourceEvents:
    """The handlers of `window`'s source signals (a MainWindow: its panels, conversation, requests and
    model lifecycle). `above_roof_note`: the line said once per load when a step went above the
    measured roof."""

    def __init__(self, window):
        self.window = window
        self.above_roof_note = ""

    def wire(self, source, connect: bool) -> None:
        window = self.window
        handlers = {"progress": self.progress, "model_loaded": window.lifecycle.model_loaded,
                    "events": self.on_events, "reply_started": window.data.start_reply,
                    "busy_changed": self.busy_changed, "failed": self.failed,
                    "kv_snapshot": window.kv_panel.set_snapshot, "quality": self.quality, "state": self.state,
                    "notice": window.chat.add_notice}
        for name, handler in handlers.items():
            signal = getattr(source, name)
            signal.connect(handler) if connect else signal.disconnect(handler)

    def progress(self, fraction: float, message: str) -> None:
        if self.window.loading:
            self.window.hardware_strip.set_progress(fraction, message)

    def quality(self, table: dict) -> None:
        """Perplexity / top-1 agreement per weight setting: shown on the weights switch."""
        self.window.quality = table
        self.window.controls.set_quality(table)

    def check_roof(self, step: StepMetrics) -> None:
        """A step above its measured roof is shown as such, never absorbed into the peak: one line in
        the chat and the strip (once per load), and in the recording; the plots draw it past the line."""
        if not step.above_roof or self.above_roof_note:
            return
        self.above_roof_note = above_roof_line(step)
        self.window.chat.add_notice(self.above_roof_note, error=True)
        self.show_notes()
        self.window.action.emit("above_roof", (step.step, self.above_roof_note))

    def show_notes(self) -> None:
        info = self.window.model_info
        notes = list(dict.fromkeys(info.capabilities.notes.values())) if info else []
        self.window.hardware_strip.set_notes(notes + ([self.above_roof_note] if self.above_roof_note else []))

    def on_events(self, batch: list) -> None:
        window, conversation = self.window, self.window.conversation
        text = []  # the reply's pieces: shown at once, before what comes after them
        for event in batch:
            if isinstance(event, StepMetrics):
                window.data.add_step(event)
                self.check_roof(event)
                conversation.add_step(event)
            elif isinstance(event, TokenEvent):
                text.append((event.text, event.drafted))  # an accepted speculative guess is tinted
            elif isinstance(event, BatchStats):
                window.data.add_batch_stats(event)
            elif isinstance(event, SettingsApplied):
                conversation.stream(text)
                text = []
                self.settings_applied(event)
            elif isinstance(event, SettingsRefused):
                self.settings_refused(event)
            elif isinstance(event, DoneEvent):
                conversation.stream(text)
                text = []
                conversation.finish(event, window.source.reply_summary(event, conversation.steps))
            elif isinstance(event, PlotRow):  # a row that is not an engine step (a server's scrape)
                event.add_to(window.data)
        conversation.stream(text)

    def busy_changed(self, kind: str, busy: bool) -> None:
        if busy:
            return
        if kind == "load":
            self.window.lifecycle.load_ended()
            return
        done = self.window.conversation.ended()
        self.window.show_ready()
        self.window.reply_finished.emit(done)

    def failed(self, what: str, message: str) -> None:
        window = self.window
        if what == "reset":  # the engine still holds the conversation: so does the window
            window.conversation.reset_failed()
        text = failure_line(what, message, window.model_info.label if window.model_info is not None else None)
        window.chat.add_notice(text, error=True)
        window.show_error(text)

    def state(self, settings) -> None:
        """What the source runs (the answer to query()): shown where the window holds settings."""
        if settings is not None:
            self.window.settings = settings
            self.window.controls.set_settings(settings)

    def settings_applied(self, event: SettingsApplied) -> None:
        window = self.window
        old = window.settings
        window.settings = event.settings
        window.controls.set_settings(event.settings)
        window.requests.answered(*event.request_ids)
        self.show_model_line()
        if event.changes:  # marks the step at which it took effect
            window.data.annotate(", ".join(event.changes), event.settings.label, event.t_s)
        if event.settings.users > 0 and (old is None or old.users == 0):
            window.side_tabs.users_started()  # where the batch shows (when the panel does)

    def show_model_line(self) -> None:
        """The model line with the precision and weights the engine runs now (the loader's line says
        what it loaded at)."""
        info, settings = self.window.model_info, self.window.settings
        if info is None or settings is None:
            return
        self.window.chat.model_label.setText(model_line(info, settings))

    def settings_refused(self, event: SettingsRefused) -> None:
        window = self.window
        if event.settings is not None:
            window.settings = event.settings
            window.controls.set_settings(event.settings)
        window.requests.answered(event.request_id)
        window.show_error(translate("Window", "not applied: {reason}").format(reason=event.reason))
