"""The bench's prompt: the first N tokens of a fixed, self-written text (repeated if need be)."""
from __future__ import annotations

# A fixed, self-written text: the bench prompt is its first N tokens (repeated if need be).
BENCH_TEXT = (
    "A decoder writes one token at a time. For every token it must read each weight of the model once, "
    "so the speed of a single conversation is set by how fast memory can deliver those bytes, not by "
    "how fast the chip can multiply. Batching shares one read of the weights among many sequences; "
    "quantisation makes each weight smaller; the key-value cache avoids recomputing the past but must "
    "itself be read at every step. "
)


def bench_prompt_ids(tokenizer, n_tokens: int) -> list[int]:
    ids: list[int] = []
    while len(ids) < n_tokens:
        ids += tokenizer.encode(BENCH_TEXT)
    return ids[:n_tokens]
