"""A stand-in tokenizer for synthetic-weight models: bytes in, one letter per id out.
Their text is noise by design; only the speed of a model that shape is real."""
from __future__ import annotations


class ByteTokenizer:
    chat_template = None

    def __init__(self, vocab_size: int):
        self.vocab_size = vocab_size
        self.bos_id = None
        self.eos_ids: set[int] = set()  # random weights never "finish": generation runs to max tokens

    def encode(self, text: str, add_bos: bool | None = None) -> list[int]:
        return [b % self.vocab_size for b in text.encode("utf-8")]

    def decode(self, ids) -> str:
        return "".join(self._piece(i) for i in ids)

    @staticmethod
    def _piece(token_id: int) -> str:
        return " " if token_id % 7 == 0 else chr(ord("a") + token_id % 26)

    def render_chat(self, messages, add_generation_prompt: bool = True) -> str:
        return "".join(f"{m['role']}: {m['content']}\n" for m in messages) + ("assistant: " if add_generation_prompt else "")

    def encode_chat(self, messages, add_generation_prompt: bool = True) -> list[int]:
        return self.encode(self.render_chat(messages, add_generation_prompt))

    def stream(self, skip_special_tokens: bool = True):
        return _ByteStream(self)


class _ByteStream:
    def __init__(self, tok: ByteTokenizer):
        self.tok = tok

    def feed(self, token_id: int) -> str:
        return self.tok._piece(token_id)

    def flush(self) -> str:
        return ""
