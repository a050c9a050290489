"""Keep decoding: the model goes on talking until stopped, so the plots keep moving while a speaker talks
and switches. Each reply runs to its token budget in prose (the engine never samples the end of turn or
any other special token: engine/engine.py `chat`); the next prompt of a queue, or a follow-up, is the
next user turn of the same conversation; when the context window fills, a new chat starts and the chat says so."""
from __future__ import annotations

from PySide6.QtCore import QObject, QTimer, Signal

# follow-ups sent after each reply (the conversation grows: its K/V is what attention reads)
FOLLOW_UPS = {
    "en": ("Go on.", "Tell me more about that.", "Explain it again, more simply.", "Give an example."),
    "es": ("Sigue.", "Cuéntame más sobre eso.", "Explícalo otra vez, más sencillo.", "Pon un ejemplo."),
}
FIRST_PROMPT = {
    "en": "Explain, step by step, why generating text one token at a time waits on memory rather than on arithmetic.",
    "es": "Explica, paso a paso, por qué generar texto token a token espera a la memoria y no a la aritmética.",
}
ROOM_TOKENS = 96  # a follow-up needs this much room left in the context, or the chat starts over

STARTING_OVER = {
    "en": "the context window is full ({n:,} tokens): starting over with a new chat",
    "es": "la ventana de contexto está llena ({n:,} tokens): empieza un chat nuevo",
}


def notice(window, text: str) -> None:
    """A line in the chat from talk mode (recorded, so a replay shows it too)."""
    window.chat.add_notice(text)
    window.action.emit("notice", (text, False))


class KeepDecoding(QObject):
    """Drives `window`: while `on`, every reply ends in the next send. Esc (a stopped reply) turns it off."""
    changed = Signal(bool)

    def __init__(self, window, lang: str = "en"):
        super().__init__(window)
        self.window = window
        self.lang = lang if lang in FOLLOW_UPS else "en"
        self.on = False
        self.first_prompt = FIRST_PROMPT[self.lang]
        self._queue: list[str] = []  # prompts to send before the follow-ups
        self._follow_up = 0
        self._switching = False  # the reply was stopped to answer a new prompt, not by the person
        self.restarts = 0  # times the context filled and the chat started over
        self._fresh = False  # a new chat has just started (a failure now is not the context's)
        window.reply_finished.connect(self._on_reply_finished)
        window.model_ready.connect(lambda _info: self._send_next())
        window.closing.connect(self.stop)

    def start(self, prompt: str | None = None) -> None:
        if prompt:
            self.first_prompt = prompt
        self.on = True
        self.changed.emit(True)
        if not self.window.replying:
            self._queue = [self.first_prompt] if prompt or not self.window.messages else []
            self._send_next()

    def stop(self) -> None:
        if self.on:
            self.on = False
            self.changed.emit(False)

    def toggle(self) -> None:
        if self.on:
            self.stop()
            self.window.stop()
        else:
            self.start()

    def ask(self, prompt: str) -> None:
        """Answer `prompt` next (a tour step's): the reply streaming now is cut short for it."""
        self.first_prompt = prompt
        self._queue = [prompt]
        if not self.on:
            self.start()
            return
        if self.window.replying:
            self._switching = True
            self.window.stop()
        else:
            self._send_next()

    @property
    def context_tokens(self) -> int:
        info = self.window.model_info
        return info.cfg.max_seq_len if info is not None else 0

    def _on_reply_finished(self, done) -> None:
        switching, self._switching = self._switching, False
        if not self.on:
            return
        if done is None:  # the reply failed (the window said why): a fresh chat gets one more try
            if self._fresh or self.window.engine_dead:
                self.stop()
            else:
                self._start_over()
            return
        self._fresh = False
        if done.reason == "stopped" and not switching:  # Esc: the person stopped it
            self.stop()
            return
        used = done.n_prompt_tokens + done.n_new_tokens
        if done.reason == "context_full" or used + ROOM_TOKENS >= self.context_tokens:
            self._start_over()
        else:
            QTimer.singleShot(0, self, self._send_next)

    def _start_over(self) -> None:
        self.restarts += 1
        self._fresh = True
        self._queue = [self.first_prompt]
        self.window.new_chat()
        notice(self.window, STARTING_OVER[self.lang].format(n=self.context_tokens))
        QTimer.singleShot(0, self, self._send_next)

    def _send_next(self) -> None:
        window = self.window
        if not self.on or window.replying or window.model_info is None or window.loading:
            return
        if self._queue:
            prompt = self._queue.pop(0)
        elif not window.messages:
            prompt = self.first_prompt
        else:
            follow_ups = FOLLOW_UPS[self.lang]
            prompt = follow_ups[self._follow_up % len(follow_ups)]
            self._follow_up += 1
        window.send(prompt, ignore_eos=True)
