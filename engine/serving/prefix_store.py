"""Prompt K/V kept across requests (prefix caching, as serving engines do for repeated system prompts
and templates): when a request's prompt has been computed its K/V are copied out of the pool under
its token ids; a later request whose prompt starts with the same tokens takes the longest such
prefix into its own blocks (a copy, so the pool's one-owner-a-block bookkeeping and the KV panel stay
as they are) and computes only the rest. Least recently used prompts go first past `max_bytes`.

What it keeps is what the model computed: the same model, the same tokens at the same positions. A
change of weights or precision empties it (engine/serving/batch_forward.py BatchRunner.set_model);
the K/V of requests already running stay, as at any mid-reply switch."""
from __future__ import annotations

from collections import OrderedDict

import torch

from engine.serving.scheduler import Request, common_prefix

MIN_SHARED_TOKENS = 2  # a shorter common prefix is not worth a lookup's copy


class PrefixStore:
    def __init__(self, max_bytes: int, max_prompts: int = 256):
        self.max_bytes = max_bytes
        self.max_prompts = max_prompts
        self._kv: OrderedDict[tuple[int, ...], tuple[torch.Tensor, torch.Tensor]] = OrderedDict()
        self.bytes = 0
        self.hits = 0  # requests that took a prefix
        self.reused_tokens = 0  # prompt tokens taken instead of computed
        self.looked_up_tokens = 0  # prompt tokens of every request looked up

    def __len__(self) -> int:
        return len(self._kv)

    def clear(self) -> None:
        self._kv.clear()
        self.bytes = 0

    def longest(self, ids: list[int]) -> tuple[tuple[int, ...] | None, int]:
        """The stored prompt sharing the most leading tokens with `ids`, and how many (None, 0: none)."""
        best, n = None, 0
        for key in self._kv:
            shared = common_prefix(list(key), ids)
            if shared > n:
                best, n = key, shared
        return best, n

    def lookup(self, request: Request) -> tuple[torch.Tensor, torch.Tensor] | None:
        """K/V (L, n_kv, n, hd) of the longest stored prefix of the request's prompt (views), or None."""
        self.looked_up_tokens += len(request.prompt_ids)
        key, n = self.longest(request.prompt_ids)
        if key is None or n < MIN_SHARED_TOKENS:
            return None
        self._kv.move_to_end(key)
        k, v = self._kv[key]
        return k[:, :, :n], v[:, :, :n]

    def taken(self, n: int) -> None:
        """A looked-up request took `n` prompt tokens (the scheduler may leave it fewer than offered)."""
        if n > 0:
            self.hits += 1
            self.reused_tokens += n

    def covers(self, ids: list[int]) -> bool:
        """A stored prompt starts with all of `ids` (touched: it is in use)."""
        key, n = self.longest(ids)
        if key is not None and n == len(ids):
            self._kv.move_to_end(key)
            return True
        return False

    def put(self, ids: list[int], k: torch.Tensor, v: torch.Tensor) -> None:
        """Keep a computed prompt's K/V (L, n_kv, len(ids), hd), owned here (copies, not views of the pool).
        A prompt another one starts with is not kept twice: the longer holds both."""
        size = k.numel() * k.element_size() + v.numel() * v.element_size()
        if size > self.max_bytes or self.covers(ids):
            return
        for key in [key for key in self._kv if len(key) < len(ids) and common_prefix(list(key), ids) == len(key)]:
            self._drop(key)
        self._kv[tuple(ids)] = (k, v)
        self.bytes += size
        while self.bytes > self.max_bytes or len(self._kv) > self.max_prompts:
            self._drop(next(iter(self._kv)))  # the least recently used

    def _drop(self, key: tuple[int, ...]) -> None:
        k, v = self._kv.pop(key)
        self.bytes -= k.numel() * k.element_size() + v.numel() * v.element_size()
