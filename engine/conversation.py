"""The conversation, outside the engine's core: its messages and the model's chat template turn a
new user turn into the token ids `Engine.generate` speaks. A failed turn leaves no trace; a turn
that ran (finished or stopped) is kept with the reply's text."""
from __future__ import annotations

from engine.settings import PromptError


class Conversation:
    def __init__(self, tokenizer, messages=()):
        self.tokenizer = tokenizer
        self.messages: list[dict[str, str]] = [dict(m) for m in messages]

    def prompt_ids(self, user_text: str) -> list[int]:
        """The whole conversation plus `user_text`, rendered with the model's template and ready for
        the assistant's turn (the part already cached is not prefilled again by the engine)."""
        if not user_text or not user_text.strip():
            raise PromptError("empty prompt: type something to send")
        return self.tokenizer.encode_chat(self.messages + [{"role": "user", "content": user_text}],
                                          add_generation_prompt=True)

    def special_ids(self) -> frozenset[int]:
        """The tokenizer's special tokens (end of turn, turn start, BOS, control tokens): markup of the
        template, never prose. Keep-decoding masks them so a reply cannot write the next turns."""
        ids = set(getattr(self.tokenizer, "eos_ids", ()))
        if getattr(self.tokenizer, "bos_id", None) is not None:
            ids.add(self.tokenizer.bos_id)
        backend = getattr(self.tokenizer, "backend", None)  # a `tokenizers.Tokenizer` (the byte tokenizer has none)
        if backend is not None:
            ids.update(i for i, added in backend.get_added_tokens_decoder().items() if added.special)
        return frozenset(ids)

    def add_turn(self, user_text: str, reply_text: str) -> None:
        self.messages = self.messages + [{"role": "user", "content": user_text},
                                         {"role": "assistant", "content": reply_text}]

    def clear(self) -> None:
        self.messages = []
