"""The chat's turns as the window keeps them (they outlive an engine process: a restart takes them
along) and the reply in flight: its text as it streams, the steps it ran, how it ended."""
from __future__ import annotations

from engine.events import DoneEvent
from engine.metrics import StepMetrics


class Conversation:
    """What the window says and keeps of each turn; `chat` shows it, `data` marks the reply's span."""

    def __init__(self, chat, data):
        self.chat, self.data = chat, data
        self.messages: list[dict[str, str]] = []
        self.replying = False
        self.turn_text = ""  # the user's turn in flight
        self.reply_text: list[str] = []  # the reply in flight, as streamed
        self.steps: list[StepMetrics] = []  # the reply's steps
        self.last_done: DoneEvent | None = None
        self._before_reset: list[dict[str, str]] = []

    def begin(self, text: str) -> None:
        self.replying = True
        self.steps, self.turn_text, self.reply_text = [], text, []
        self.chat.add_message("user", text)
        self.chat.begin_reply()
        self.chat.set_ready(False)
        self.chat.set_streaming(True)

    def add_step(self, step: StepMetrics) -> None:
        if self.replying:  # (with simulated users, steps also run between replies)
            self.steps.append(step)

    def stream(self, pieces: list[tuple[str, bool]]) -> None:
        """(text, drafted) pieces of the reply: an accepted speculative guess is tinted."""
        if pieces:
            self.reply_text += [text for text, _ in pieces]
            self.chat.append_reply(pieces)

    def finish(self, done: DoneEvent, summary: str) -> None:
        self.last_done = done
        data = self.data
        if self.steps:
            data.end_reply(self.steps[-1].t_s)
        if data.ttft_s is None and done.ttft_s > 0 and data.reply_t0 is not None:
            data.ttft_s = done.ttft_s  # a batched reply: its first token's own time
            data.version += 1
        self.chat.end_reply(summary)
        self.messages = self.messages + [{"role": "user", "content": self.turn_text},
                                         {"role": "assistant", "content": done.text}]
        self.reply_text = []

    def ended(self) -> DoneEvent | None:
        """The reply is over (answered or failed): its DoneEvent, or None."""
        self.replying = False
        self.chat.set_streaming(False)
        done, self.last_done = self.last_done, None
        return done

    def interrupt(self, line: str) -> None:
        """The engine ended mid-reply: what was said stays part of the conversation, as a stopped reply does."""
        self.chat.end_reply("— " + line)
        if self.reply_text:
            self.messages = self.messages + [{"role": "user", "content": self.turn_text},
                                             {"role": "assistant", "content": "".join(self.reply_text)}]
        self.reply_text = []
        self.replying = False
        self.chat.set_streaming(False)

    def reset(self) -> None:
        self._before_reset, self.messages = self.messages, []

    def reset_failed(self) -> None:
        """The engine still holds the conversation: so does the window."""
        self.messages = self._before_reset
