"""Attach mode: a running vLLM / SGLang / llama.cpp server as one more source of the window
(app/sources.py): its /metrics feeds the same LiveData and plots the engine feeds (one row per
scrape), and the chat streams from its OpenAI API.

`AttachSource` scrapes and chats on threads of its own and hands plain data to the GUI thread by
queued signals, then to the window as a source's signals: a scrape is a `ScrapeRow` in `events`, a
streamed piece a TokenEvent, the end of a reply a DoneEvent. `AttachMode` is the "Attach to server…"
button, its dialog and the status bar with Detach: it makes a source and hands it to the window
(`MainWindow.use_source`), and hands the window its own engine back."""
from __future__ import annotations

import dataclasses
import math
import threading
import time
from dataclasses import dataclass, field

from PySide6.QtCore import QObject, Signal
from PySide6.QtWidgets import (
    QComboBox,
    QDialog,
    QDialogButtonBox,
    QFormLayout,
    QHBoxLayout,
    QLabel,
    QLineEdit,
    QPushButton,
    QWidget,
)

from app.i18n import QT_TRANSLATE_NOOP, translate
from app.live_data import LiveData
from app.sources import EventSource, SourceView
from engine.attach.client import AttachError, ChatDone, Scraper, normalise_url, server_model, stream_chat
from engine.attach.peak import GpuPeak, resolve_peak
from engine.attach.series import ScrapeRecord
from engine.attach.servers import SERVERS
from engine.events import DoneEvent, SettingsRefused, TokenEvent
from engine.protocol import Chat, Reset
from engine.hardware.spec import KNOWN_GPUS, DeviceSpec

SOURCE = QT_TRANSLATE_NOOP("Plots", "server's estimate")  # data.source: translated where shown
NO_TIMELINE = QT_TRANSLATE_NOOP("Plots", "a server's /metrics has no per-step times: each reply's TTFT and tok/s "
                                         "come from its stream, in the chat")
FOREVER_S = 1e12


# ---- scrapes into the plots' buffers -----------------------------------------------------------

def add_record(data: LiveData, record: ScrapeRecord, label: str, peak: GpuPeak | None,
               preempted_total: float = 0.0) -> None:
    """One scrape as one row of the step plots (nan where the server did not say, so a failed
    scrape is a gap) and, when the server answered, one row of the serving panel."""
    interval_s = record.interval_s if math.isfinite(record.interval_s) else math.nan
    flops_per_s = record.tflops * 1e12
    bytes_per_s = record.gbs * 1e9
    ai = flops_per_s / bytes_per_s if math.isfinite(flops_per_s) and bytes_per_s > 0 else math.nan
    data.steps.append(
        x=data.steps.total, t_s=record.t_s, start_s=record.t_s - interval_s, prefill=0.0, mixed=0.0,
        label=data.label_code(label), peak_kind=data.kind_code(label.split(" ")[0]),
        tokens_per_s=record.generation_tokens_per_s,
        ceiling_tps=record.ceiling_tokens_per_s, roof_tps=math.nan, gbs=record.gbs, flops=flops_per_s,
        mfu_pct=100 * record.mfu, ai=ai, step_ms=1e3 * interval_s,
        peak_flops=peak.flops if peak is not None and peak.flops else math.nan,
        peak_bps=peak.bandwidth_bps if peak is not None else math.nan)
    data.version += 1
    if math.isfinite(record.running):
        # a request's own rate: one token per inter-token latency (its median)
        per_request = 1 / record.itl_p50_s if record.itl_p50_s > 0 else math.nan
        data.serving.append(
            x=max(data.steps.total - 1, 0), t_s=record.t_s, users=0, running=record.running,
            waiting=record.waiting if math.isfinite(record.waiting) else 0.0,
            aggregate_tps=record.generation_tokens_per_s, per_request_tps=per_request,
            ttft_p50_s=record.ttft_p50_s, ttft_p95_s=record.ttft_p95_s, itl_p50_s=record.itl_p50_s,
            itl_p95_s=record.itl_p95_s, preempted=preempted_total)
        data.serving_policy = "continuous"
        data.serving_version += 1


def device_spec(peak: GpuPeak) -> DeviceSpec:
    """The peak as the plots' DeviceSpec (datasheet figures only: nothing here is measured)."""
    return DeviceSpec(name=peak.label, kind="cuda", peak_bandwidth_gbs=peak.bandwidth_gbs,
                      peak_flops={"bf16": peak.flops} if peak.flops else {}, spec_bandwidth_gbs=peak.bandwidth_gbs,
                      source=translate("Attach", "the server's GPU: {source}").format(source=peak.source))


def status_line(record: ScrapeRecord, url: str) -> str:
    """One line under the toolbar: the server, its state, and the figures the plots do not carry."""
    server = SERVERS.get(record.kind)
    head = translate("Attach", "{server} at {url}").format(
        server=server.label if server else translate("Attach", "server"), url=url)
    if record.status in ("down", "bad answer"):
        return translate("Attach", "{server} · {message} · retrying").format(server=head, message=record.message)
    parts = [head]
    if math.isfinite(record.running):
        parts.append(translate("Attach", "running {running} · waiting {waiting}").format(
            running=f"{record.running:.0f}", waiting=f"{record.waiting:.0f}"))
    if math.isfinite(record.kv_cache_usage):
        parts.append(translate("Attach", "KV cache {pct}% used").format(pct=f"{100 * record.kv_cache_usage:.0f}"))
    if len(record.engines) > 1:  # a data-parallel server: each engine's share
        parts.append(translate("Attach", "engines") + " " + ", ".join(
            f"{key}: {figures.get('generation_tokens_per_s', math.nan):,.0f} tok/s" for key, figures in
            sorted(record.engines.items())))
    if len(record.gpus) > 1:
        parts.append("GPUs " + ", ".join(f"{key}: {figures.get('gbs', math.nan):,.0f} GB/s"
                                         for key, figures in sorted(record.gpus.items())))
    if math.isfinite(record.spec_acceptance):
        parts.append(translate("Attach", "speculative acceptance {pct}%").format(
            pct=f"{100 * record.spec_acceptance:.0f}"))
    if record.status != "ok":
        parts.append(record.message)
    return " · ".join(parts)


@dataclass(frozen=True)
class ScrapeRow:
    """One scrape for the plots (a `PlotRow` of app/sources.py): the record, the legend label it is
    drawn under, the peak, the server's pre-emptions so far, and the plots' notes it brings."""
    record: ScrapeRecord
    label: str
    peak: GpuPeak | None
    preempted_total: float = 0.0
    notes: dict = field(default_factory=dict)

    def add_to(self, data: LiveData) -> None:
        data.notes.update(self.notes)
        add_record(data, self.record, self.label, self.peak, self.preempted_total)


def scrape_notes(record: ScrapeRecord) -> dict:
    """What the plots say about a server's figures: which flag fills the byte and FLOP counters while
    they are missing, and what its token counts are."""
    server = SERVERS.get(record.kind)
    if server is None:
        return {}
    notes = {"memory": server.bytes_hint, "compute": server.bytes_hint, "roofline": server.bytes_hint} \
        if not math.isfinite(record.gbs) else {}
    if server.live_note:
        notes["tokens"] = server.live_note
    return notes


# ---- the source ---------------------------------------------------------------------------------

SETTINGS_REFUSAL = QT_TRANSLATE_NOOP("Attach", "attached to a server: its settings are its own")


class AttachSource(QObject, EventSource):
    """Scrapes `url` every `interval_s` on a thread (backing off while it is down) and streams chat
    replies on another; everything reaches the GUI thread as a queued signal, and the window as a
    source's signals. It keeps the conversation with the server, as the engine keeps its own."""
    record = Signal(object)  # ScrapeRecord (the scrape thread's, queued to the GUI thread)
    chat_piece = Signal(str)
    chat_done = Signal(object)  # ChatDone
    chat_failed = Signal(str)
    status = Signal(str)  # the status line: the server, its state, the figures the plots do not carry
    state_changed = Signal(str)  # "up" | "down"
    reply_finished = Signal(object)  # ChatDone, or None when the reply failed

    takes_settings = False  # the server's settings are its own
    picks_models = False
    needs_model = False  # the server has one
    local_hardware = False  # this machine's NVML and memory are not the server's

    def __init__(self, url: str, *, peak: GpuPeak | None = None, peak_note: str = "", api_key: str | None = None,
                 interval_s: float = 1.0, max_tokens: int = 256, temperature: float = 0.7, parent=None):
        super().__init__(parent)
        self.url = normalise_url(url)
        self.api_key = api_key
        self.peak, self.peak_note, self.interval_s = peak, peak_note, interval_s
        self.max_tokens, self.temperature = max_tokens, temperature
        self.scraper = Scraper(self.url, interval_s=interval_s, peak=peak, api_key=api_key)
        self.records: list[ScrapeRecord] = []
        self.messages: list[dict] = []
        self.server_state = "connecting"  # "up" | "down" once it answered or not
        self.replying = False
        self.last_reply: ChatDone | None = None
        self._reply_t0 = 0.0
        self._preempted_total = 0.0
        self._label = "server"
        self._stop = threading.Event()
        self._chat_stop = threading.Event()
        self._threads: list[threading.Thread] = []
        self._model: str | None = None
        self.record.connect(self._on_record)
        self.chat_piece.connect(self._on_piece)
        self.chat_done.connect(self._on_chat_done)
        self.chat_failed.connect(self._on_chat_failed)

    def view(self) -> SourceView:
        peak, note, url = self.peak, self.peak_note, self.url
        return SourceView(
            origin=SOURCE, x_label=translate("Plots", "scrape (every {s} s)").format(s=f"{self.interval_s:g}"),
            notes={"timeline": NO_TIMELINE}, hardware=device_spec(peak) if peak else None,
            device_line=translate("Attach", "the server's GPU: unknown — {note}").format(note=note),
            live_line=translate("Attach", "figures: the server's /metrics — its counters, and its own estimates of "
                                          "bytes and FLOPs where it publishes them"),
            serving_title=translate("Attach", "Serving: the server's batch, queue and latencies"),
            model_line=translate("Attach", "attached to {url}").format(url=url),
            greeting=translate("Attach", "attached to {url}: replies stream from its /v1/chat/completions; the plots "
                                         "are its /metrics, one point per scrape · {note}").format(url=url, note=note))

    # ---- commands
    def start(self) -> None:
        thread = threading.Thread(target=self.scraper.run, args=(FOREVER_S, self.record.emit, self._stop),
                                  name="membound-attach-scrape", daemon=True)
        thread.start()
        self._threads.append(thread)

    def submit(self, command) -> None:
        if isinstance(command, Chat):
            self.send(command.text)
        elif isinstance(command, Reset):
            self.stop()
            self.messages = []

    def request(self, command) -> None:
        self.events.emit([SettingsRefused(command.request_id, translate("Attach", SETTINGS_REFUSAL), None)])

    def send(self, text: str) -> None:
        if self.replying:
            return
        self.replying = True
        self._reply_t0 = time.monotonic()
        self.messages.append({"role": "user", "content": text})
        self.busy_changed.emit("reply", True)
        self._chat_stop.clear()
        thread = threading.Thread(target=self._chat, args=(list(self.messages), self.max_tokens, self.temperature),
                                  name="membound-attach-chat", daemon=True)
        self._threads = [t for t in self._threads if t.is_alive()] + [thread]
        thread.start()

    def _chat(self, messages: list[dict], max_tokens: int, temperature: float) -> None:
        try:
            if self._model is None:
                self._model = server_model(self.url, self.api_key)
            # a scrape as it is sent and one at its end: the summary's server rate is over the reply's time
            # exactly, however short (the periodic scrapes' intervals start before it; signals keep order)
            start = self.scraper.poll()
            self._reply_t0 = start.t_s
            self.record.emit(start)
            for piece in stream_chat(self.url, messages, model=self._model, max_tokens=max_tokens,
                                     temperature=temperature, api_key=self.api_key, stop=self._chat_stop):
                if isinstance(piece, ChatDone):
                    self.record.emit(self.scraper.poll())
                    self.chat_done.emit(piece)
                else:
                    self.chat_piece.emit(piece)
        except AttachError as error:
            self.chat_failed.emit(str(error))

    def stop(self) -> None:
        """Stop the reply in progress."""
        self._chat_stop.set()

    def shutdown(self, timeout_s: float = 5.0) -> bool:
        """End both threads; True when they ended within the timeout (a chat read may take until
        the server's next chunk: daemon threads never keep the app alive)."""
        self._stop.set()
        self._chat_stop.set()
        deadline = time.monotonic() + timeout_s
        for thread in self._threads:
            thread.join(max(0.0, deadline - time.monotonic()))
        return not any(t.is_alive() for t in self._threads)

    # ---- the reply (GUI thread)
    def _on_piece(self, piece: str) -> None:
        if self.replying:
            self.events.emit([TokenEvent(-1, piece, 0)])

    def _on_chat_done(self, done: ChatDone) -> None:
        if not self.replying:
            return
        self.messages.append({"role": "assistant", "content": done.text})
        self.last_reply = done
        self.events.emit([DoneEvent(reason=done.finish_reason, text=done.text, n_prompt_tokens=done.n_prompt_tokens or 0,
                                    n_new_tokens=done.n_tokens, ttft_s=done.ttft_s, decode_s=done.stream_s)])
        self._end_reply(done)

    def _on_chat_failed(self, message: str) -> None:
        if not self.replying:
            return
        self.failed.emit("reply", message)
        self._end_reply(None)

    def _end_reply(self, done: ChatDone | None) -> None:
        self.replying = False
        self.busy_changed.emit("reply", False)
        self.reply_finished.emit(done)

    def reply_summary(self, done: DoneEvent, steps) -> str:
        """The stream's own figures (network included), and what the whole server generated meanwhile."""
        reply = self.last_reply
        parts = [translate("Attach", "{n} tokens ({reason})").format(n=done.n_new_tokens, reason=done.reason)]
        if math.isfinite(done.ttft_s):
            parts.append(f"TTFT {1e3 * done.ttft_s:,.0f} ms")
        if reply is not None and math.isfinite(reply.tokens_per_s):
            parts.append(translate("Attach", "{tps} tok/s (this reply, from the stream)").format(
                tps=f"{reply.tokens_per_s:,.1f}"))
        server_rate = self.server_rate_since(self._reply_t0)
        if math.isfinite(server_rate):
            parts.append(translate("Attach", "server: {tps} tok/s generated, every request, since it was sent "
                                             "(its counters)").format(tps=f"{server_rate:,.1f}"))
        return "— " + " · ".join(parts)

    def server_rate_since(self, t0_s: float) -> float:
        """The server's generation tokens/s over the scrapes after t0_s, all requests together (nan
        without any): the reply's own rate beside what the whole server did meanwhile."""
        rows = [r for r in self.records if r.t_s > t0_s and r.ok and math.isfinite(r.generation_tokens)]
        span = sum(r.interval_s for r in rows)
        return sum(r.generation_tokens for r in rows) / span if span > 0 else math.nan

    # ---- scrapes (GUI thread)
    def _on_record(self, record: ScrapeRecord) -> None:
        if self._stop.is_set():
            return  # one still queued when it was shut down
        self.records = (self.records + [record])[-4096:]
        if math.isfinite(record.preemptions):
            self._preempted_total += record.preemptions
        server = SERVERS.get(record.kind)
        if server is not None:
            self._label = f"{server.label} server"  # one legend entry and colour; a gap keeps the last
        self.events.emit([ScrapeRow(record, self._label, self.peak, self._preempted_total, scrape_notes(record))])
        self.status.emit(status_line(record, self.url))
        state = "down" if record.status in ("down", "bad answer") else "up"
        if state != self.server_state:
            if state == "down":
                self.notice.emit(translate("Attach", "the server stopped answering: {message} (retrying)").format(
                    message=record.message), True)
            elif self.server_state == "down":
                self.notice.emit(translate("Attach", "the server answers again (it restarted)")
                                 if record.status == "restarted" else translate("Attach", "the server answers again"),
                                 False)
            self.server_state = state
            self.state_changed.emit(state)


# ---- the button, the dialog and the status bar ----------------------------------------------------

class AttachDialog(QDialog):
    def __init__(self, url: str = "http://localhost:8000", parent=None):
        super().__init__(parent)
        self.setWindowTitle(translate("Attach", "Attach to a server"))
        self.url_edit = QLineEdit(url)
        self.url_edit.setPlaceholderText(translate("Attach", "http://host:port of a vLLM, SGLang or llama.cpp server"))
        self.gpu_box = QComboBox()
        self.gpu_box.addItem(translate("Attach", "NVML when the server runs here"), "")
        for sheet in KNOWN_GPUS:
            self.gpu_box.addItem(sheet.label, sheet.label)
        self.key_edit = QLineEdit()
        self.key_edit.setEchoMode(QLineEdit.EchoMode.Password)
        self.key_edit.setPlaceholderText(translate("Attach", "only for a server started with --api-key"))
        form = QFormLayout(self)
        form.addRow(translate("Attach", "Server"), self.url_edit)
        form.addRow(translate("Attach", "Its GPU (for MBU, MFU)"), self.gpu_box)
        form.addRow(translate("Attach", "API key"), self.key_edit)
        buttons = QDialogButtonBox(QDialogButtonBox.StandardButton.Ok | QDialogButtonBox.StandardButton.Cancel)
        buttons.accepted.connect(self.accept)
        buttons.rejected.connect(self.reject)
        form.addRow(buttons)

    def values(self) -> tuple[str, str | None, str | None]:
        return self.url_edit.text().strip(), self.gpu_box.currentData() or None, self.key_edit.text().strip() or None


class AttachMode(QObject):
    """The "Attach to server…" button beside "Model…" and what it does: `attach` makes an AttachSource
    and hands it to the window (`use_source`), with a status line and a Detach button under the
    toolbar; `detach` hands the window its own engine back."""
    state_changed = Signal(str)  # "up" | "down" | "detached"
    reply_finished = Signal(object)  # ChatDone, or None when the reply failed

    def __init__(self, window):
        super().__init__(window)
        self.window = window
        self.source: AttachSource | None = None
        self.url = ""
        self.state = "detached"
        self.records: list[ScrapeRecord] = []  # the last source's, kept after it detached
        self.button = QPushButton(translate("Attach", "Attach to server…"))
        self.button.setToolTip(translate("Attach", "show a running vLLM, SGLang or llama.cpp server's figures and "
                                                   "chat with it"))
        self.button.clicked.connect(self.pick_server)
        self.status_label = QLabel("")
        self.status_label.setWordWrap(True)
        self.detach_button = QPushButton(translate("Attach", "Detach"))
        self.detach_button.clicked.connect(self.detach)
        self.bar = QWidget()
        row = QHBoxLayout(self.bar)
        row.setContentsMargins(0, 0, 0, 0)
        row.addWidget(self.status_label, 1)
        row.addWidget(self.detach_button)
        self.bar.setVisible(False)
        window.add_bar(self.bar)
        window.closing.connect(lambda: self.detach(restore=False))

    @property
    def attached(self) -> bool:
        return self.source is not None

    @property
    def messages(self) -> list[dict]:
        return self.source.messages if self.source is not None else []

    def pick_server(self) -> None:
        dialog = AttachDialog(self.url or "http://localhost:8000", self.window)
        if dialog.exec():
            self.attach(*dialog.values())

    def attach(self, url: str, gpu: str | None = None, api_key: str | None = None, interval_s: float = 1.0) -> bool:
        """Start showing the server at `url`; False (with the reason in the window) for a bad address
        or an unknown --gpu name. A server that does not answer yet is retried, not refused."""
        w = self.window
        try:
            url = normalise_url(url)
            peak, note = resolve_peak(url, gpu)
        except ValueError as error:
            w.show_error(str(error))
            return False
        self.detach(restore=False)
        w.clear_error()
        settings = w.settings
        if settings is not None and settings.users > 0:  # the local engine's users stop while it is not shown
            w.apply_settings(dataclasses.replace(settings, users=0))
        self.url = url
        source = AttachSource(url, peak=peak, peak_note=note, api_key=api_key, interval_s=interval_s,
                              max_tokens=settings.max_new_tokens if settings else 256,
                              temperature=settings.sampling.temperature if settings else 0.7, parent=self)
        source.status.connect(self.status_label.setText)
        source.state_changed.connect(self._set_state)
        source.reply_finished.connect(self.reply_finished)
        self.source, self.records = source, source.records
        self.status_label.setText(translate("Attach", "connecting to {url}…").format(url=url))
        self.bar.setVisible(True)
        w.use_source(source)
        source.start()
        return True

    def detach(self, restore: bool = True) -> None:
        """Stop reading the server; with `restore`, give the window back to its own engine."""
        if self.source is None:
            return
        source, self.source = self.source, None
        self.records = source.records
        source.shutdown()
        self.bar.setVisible(False)
        self._set_state("detached")
        if restore:
            w = self.window
            w.use_source(w.worker)
            w.chat.add_notice(translate("Attach", "detached: the local model again") if w.model_info is not None
                              else translate("Attach", "detached"))
        source.deleteLater()

    def _set_state(self, state: str) -> None:
        if state != self.state:
            self.state = state
            self.state_changed.emit(state)


def add_attach_button(window) -> AttachMode:
    """The "Attach to server…" button beside "Model…", and attach mode behind it."""
    mode = AttachMode(window)
    extra = window.controls.extra
    extra.insertWidget(extra.indexOf(window.model_button) + 1, mode.button)
    return mode
