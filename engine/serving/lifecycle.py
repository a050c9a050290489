"""The batch server's life beside the person's chat: made when simulated users come (or the
person's reply joins them), handed each settings change, dropped (its KV pool freed) when the last
user has left or a step failed. Also the pool's budget and the users' workload, made once."""
from __future__ import annotations

from dataclasses import replace
from typing import Callable

from engine.hardware.roof import Roof
from engine.model.config import ModelConfig
from engine.model.transformer import Transformer
from engine.serving.server import USER_THINK_S, BatchServer, kv_budget_bytes, per_user_tokens, pool_size, user_workload
from engine.settings import Settings


class BatchLifecycle:
    """`server` is the running BatchServer or None. `kv_pool_budget_bytes` and `user_workload` may
    be set before the first server is made (tests, the bench); `on_request` is handed to each one."""

    def __init__(self, cfg: ModelConfig, tokenizer, device: str, memory_total_bytes: int | None,
                 think_s: tuple[float, float] = USER_THINK_S, prefix_cache: bool = True):
        self.cfg = cfg
        self.prefix_cache = prefix_cache  # the users' prompts kept across requests (EngineOptions.prefix_cache)
        self.think_s = think_s  # the users' think time between requests (EngineOptions.user_think_s)
        self.tokenizer = tokenizer
        self.device = device
        self.memory_total_bytes = memory_total_bytes
        self.server: BatchServer | None = None
        self.next_user_id = 1_000_000  # the person's requests count from 1; the users' far above
        self.kv_pool_budget_bytes: int | None = None  # the batch KV pool's budget (None: from the device)
        self.user_workload = None  # engine.serving.users.Workload the users send (None: bundled prompts)
        self.on_request: Callable | None = None  # optional callback(event "submitted" | "finished", Request)
        # callback(ids, K, V) given the person's last turn's K/V when the server is dropped after its
        # users have left (the batch-1 path takes the conversation over: engine/steps/plain.py)
        self.on_end: Callable | None = None

    def max_users(self, kv_elem_bytes: int) -> int:
        """Simulated users the KV budget holds beside a full-length chat (0..64)."""
        _, users = pool_size(self.cfg, kv_elem_bytes, per_user_tokens(self.workload()), self.pool_budget())
        return users

    def pool_budget(self) -> int:
        if self.kv_pool_budget_bytes is None:  # measured once: the pool itself then takes free memory
            self.kv_pool_budget_bytes = kv_budget_bytes(self.device, self.memory_total_bytes)
        return self.kv_pool_budget_bytes

    def workload(self):
        if self.user_workload is None:
            self.user_workload = user_workload(self.tokenizer, self.cfg.max_seq_len, think_s=self.think_s)
        return self.user_workload

    def ensure(self, model: Transformer, settings: Settings, roof: Roof) -> BatchServer:
        if self.server is None:
            s = settings
            self.server = BatchServer(
                model, self.workload(), users=s.users, policy=s.policy, attention=s.attention,
                budget_bytes=self.pool_budget(), roof=roof, settings_label=batch_label(s),
                first_user_id=self.next_user_id, seed=self.next_user_id, on_request=self.on_request,
                prefix_cache=self.prefix_cache)
        return self.server

    def step(self, step_index: int):
        try:
            return self.server.step(step_index)
        except Exception:  # a failed step leaves the batch mid-step: end it, its requests cancelled
            self.server.abort()
            self._drop()
            raise

    def sync(self, model: Transformer, settings: Settings, roof: Roof) -> None:
        """Hand the current settings to the batch (between steps)."""
        s = settings
        self.server.configure(model=model, users=s.users, policy=s.policy, attention=s.attention,
                              settings_label=batch_label(s), roof=roof)

    def end_if_done(self, settings: Settings) -> None:
        if not settings.users and not self.server.has_unfinished:  # the last user has left
            kept = self.server.retained_kv()
            if kept is not None and self.on_end is not None:
                self.on_end(*kept)
            self._drop()  # frees the pool

    def _drop(self) -> None:
        self.next_user_id = self.server.users.next_id
        self.server = None


def batch_label(settings: Settings) -> str:
    """The batch's steps' label. With users set to 0 the batch goes on until the leaving users' last
    replies end: those steps say so, and never name the chat's speculation (a batch does not speculate)."""
    s = settings
    if s.users:
        return s.label
    return replace(s, kv_layout="paged", speculate="off").label + " · leaving users' last requests, batched"
