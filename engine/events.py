"""The engine's events, as plain data (torch-free): what `Engine.chat()` yields and what crosses the
pipe from the engine process to the app (with `engine.metrics.StepMetrics` for each step).

A settings change is a transaction: the front end sends it with a request id, and exactly one of
`SettingsApplied` (it took effect at `step`) or `SettingsRefused` (it did not; `settings` is what
the engine runs) names that id."""
from __future__ import annotations

from dataclasses import dataclass

from engine.settings import Settings


@dataclass(frozen=True)
class TokenEvent:
    token_id: int
    text: str  # the newly complete text (may be empty while a UTF-8 character is split)
    index: int  # 0 for the first generated token
    drafted: bool = False  # a speculative guess the target accepted (the chat tints it)


@dataclass(frozen=True)
class SettingsApplied:
    settings: Settings  # what the engine runs from `step` on
    changes: tuple[str, ...]  # e.g. ("kv cache off",); empty when nothing differed
    step: int  # the first step that runs with them
    t_s: float  # time.monotonic() when they took effect
    request_ids: tuple[int, ...] = ()  # the front end's requests this confirms


@dataclass(frozen=True)
class SettingsRefused:
    request_id: int
    reason: str  # one line
    settings: Settings | None  # what the engine runs (unchanged by the refused request); None: no model


@dataclass(frozen=True)
class DoneEvent:
    reason: str  # "eos", "max_tokens", "stopped", "context_full"
    text: str
    n_prompt_tokens: int
    n_new_tokens: int
    ttft_s: float
    decode_s: float  # time spent in decode steps
    n_cached_tokens: int = 0  # prompt tokens whose K/V were already cached (not prefilled again)

    @property
    def ttft_note(self) -> str:
        """'TTFT 123 ms', and how much of the prompt the cache spared: what makes a turn's TTFT."""
        text = f"TTFT {1e3 * self.ttft_s:.0f} ms"
        if self.n_cached_tokens:
            text += f" ({self.n_cached_tokens:,} of {self.n_prompt_tokens:,} prompt tokens cached)"
        return text

    @property
    def decode_tokens_per_s(self) -> float:
        return (self.n_new_tokens - 1) / self.decode_s if self.decode_s > 0 and self.n_new_tokens > 1 else 0.0


@dataclass(frozen=True)
class BatchStats:
    """The serving picture after one batched step. Plain data (no torch). Rates are over the last
    ~2 s (at least the last step); latencies are percentiles over the last 64 finished requests
    (nan before any)."""
    step: int  # the StepMetrics.step of the same step
    t_s: float  # time.monotonic() at the end of the step (StepMetrics.t_s's clock)
    users: int  # simulated users now (sending, waiting for a reply or thinking)
    policy: str  # "continuous" | "static"
    running: int  # requests in the batch after the step
    waiting: int  # queue length after the step (new and pre-empted requests)
    tokens: int  # tokens sampled this step, every request together
    aggregate_tokens_per_s: float  # all requests' sampled tokens / s over the window
    per_request_tokens_per_s: float  # median over running requests of their decode tok/s (nan: none yet)
    ttft_p50_s: float
    ttft_p95_s: float
    itl_p50_s: float  # inter-token latency: gaps between one request's consecutive tokens
    itl_p95_s: float
    preempted_total: int  # pre-emptions since serving started (a dtype switch re-queues all running)
    finished_total: int  # requests finished (EOS or length) since serving started
    cancelled_total: int  # requests cancelled (the person's Stop)
    kv_blocks_used: int
    kv_blocks_total: int
    person_in_batch: bool  # the person's reply is one of the running requests
    # users' finished requests since serving started: the share of their prompt tokens whose K/V came from
    # an earlier prompt's (engine/serving/prefix_store.py) instead of being computed; nan before any and
    # while the store is off (MEMBOUND_PREFIX_CACHE=0)
    prefix_hit_pct: float = float("nan")


@dataclass(frozen=True)
class Quality:
    label: str
    perplexity: float
    top1_agreement: float  # fraction of positions where the argmax token equals the reference's
    n_tokens: int  # tokens predicted
