"""Batched serving beside the person's chat: `BatchServer` owns a `BatchRunner` (one paged KV pool,
the scheduler), the simulated users and rolling statistics; `step()` runs one batched step and
returns (StepMetrics, BatchStats), or when nobody is ready (None, None) — (None, BatchStats), a
heartbeat, at most 4 times a second. The Engine submits the person's reply as one more request
(engine/engine.py); setting changes apply between steps (`configure`).

Sizing: the pool holds the person's full context plus `max_users` users' longest requests, within
a memory budget (half the free GPU memory; on a CPU min(1 GiB, RAM / 8)). A dtype change makes a
new pool: every unfinished request is re-queued and recomputes its context (none is dropped)."""
from __future__ import annotations

import bisect
import statistics
import time
from collections import deque
from dataclasses import dataclass
from typing import Callable

import torch

from engine.events import BatchStats
from engine.kv.cache import DEFAULT_BLOCK_SIZE
from engine.hardware.roof import Roof
from engine.metrics import StepMetrics
from engine.model.config import ModelConfig
from engine.model import cpu_step
from engine.model.sampling import greedy, mask_tokens, sample
from engine.model.transformer import Transformer
from engine.serving.batch_forward import BatchRunner
from engine.serving.scheduler import Request, RequestState, common_prefix
from engine.serving.users import SimulatedUsers, Workload, bundled_prompts
from engine.settings import MAX_USERS, SamplingParams

STATS_WINDOW_S = 2.0  # tokens/s are measured over the last this-many seconds
STATS_FINISHED = 64  # TTFT and inter-token latency percentiles over this many recent requests
USER_OUTPUT_LENS = (16, 128)
USER_THINK_S = (0.2, 1.5)
CPU_TOKEN_BUDGET = 256  # token rows a batched step plans on a CPU without the C++ step (cpu_token_budget)
IDLE_STATS_S = 0.25  # while every user thinks, a BatchStats (tokens 0) at most this often


def kv_budget_bytes(device: str, memory_total_bytes: int | None) -> int:
    """Bytes the batch KV pool may take: half the free GPU memory, or on a CPU min(1 GiB, RAM / 8)."""
    if device.startswith("cuda"):
        free, _ = torch.cuda.mem_get_info(torch.device(device))
        return free // 2
    ram = memory_total_bytes or 8 << 30
    return min(1 << 30, ram // 8)


def prefix_store_bytes(budget_bytes: int) -> int:
    """Room for the users' prompts' K/V kept across requests (engine/serving/prefix_store.py): an
    eighth of the pool's budget, beside it."""
    return budget_bytes // 8


def pool_size(cfg: ModelConfig, kv_elem_bytes: int, per_user_tokens: int, budget_bytes: int,
              block_size: int = DEFAULT_BLOCK_SIZE) -> tuple[int, int]:
    """(blocks, users): the person's whole context plus as many users' longest requests as the
    budget holds (at most 64)."""
    bytes_per_block = cfg.kv_bytes_per_token_per_elem * kv_elem_bytes * block_size
    person = -(-cfg.max_seq_len // block_size)
    per_user = -(-per_user_tokens // block_size)
    users = max(0, min(MAX_USERS, (budget_bytes // bytes_per_block - person) // per_user))
    return person + users * per_user, users


def cpu_token_budget(model: Transformer) -> int:
    """Token rows a batched step plans on a CPU: as many as the C++ step takes where it runs (a plan
    of more falls to PyTorch's path, which dequantises INT4 matrices whole: 8 users arriving with
    ~50-token prompts spent two thirds of their time there, issue 23), else CPU_TOKEN_BUDGET."""
    from engine.model import cpu_step
    context = cpu_step._context(model)
    if cpu_step.unavailable_reason(context):  # (a kernel check that failed included)
        return CPU_TOKEN_BUDGET
    return min(CPU_TOKEN_BUDGET, cpu_step.library(context).max_rows)


def think_range(text: str) -> tuple[float, float]:
    """MEMBOUND_USER_THINK_S's "LO,HI" seconds (engine/options.py); USER_THINK_S where empty or not
    two numbers 0 <= LO <= HI."""
    try:
        lo, hi = (float(v) for v in text.split(","))
    except ValueError:
        return USER_THINK_S
    return (lo, hi) if 0 <= lo <= hi else USER_THINK_S


def user_workload(tokenizer, max_context: int, output_lens: tuple[int, int] = USER_OUTPUT_LENS,
                  think_s: tuple[float, float] = USER_THINK_S) -> Workload:
    """The bundled prompts (assets/user_prompts.txt) in the model's chat template, each a
    one-message conversation; outputs and prompts cut to fit the context."""
    hi = min(output_lens[1], max(2, max_context // 2))
    lo = min(output_lens[0], hi)
    prompts = []
    for text in bundled_prompts():
        ids = tokenizer.encode_chat([{"role": "user", "content": text}], add_generation_prompt=True)
        prompts.append(tuple(ids[-(max_context - hi):]))
    return Workload(prompts=tuple(p for p in prompts if p), prompt_lens=None, output_lens=(lo, hi),
                    think_s=think_s, eos_ids=frozenset(tokenizer.eos_ids))


def per_user_tokens(workload: Workload) -> int:
    longest = max(len(p) for p in workload.prompts) if workload.prompt_lens is None else workload.prompt_lens[1]
    return longest + workload.output_lens[1]


@dataclass
class _Person:
    request: Request
    sampling: SamplingParams
    generator: torch.Generator | None
    masked: tuple[int, ...] = ()  # token ids the person's row never samples (keep-decoding)


class _Sampler:
    """The runner's sampler: users decode greedily; the person's row follows the person's
    sampling settings. (A separate object, so runner and server hold no reference cycle and a
    dropped server's pool is freed at once.)"""

    def __init__(self):
        self.person: _Person | None = None
        self.scheduler = None
        self.native = None  # the C++ library the person's CPU rows are sampled with (cpu_step.sampler)

    def __call__(self, logits: torch.Tensor) -> torch.Tensor:
        person = self.person
        if person is None or (person.sampling.is_greedy and not person.masked):
            return greedy(logits)
        rows = [s.request_id for s in self.scheduler.in_flight.seqs if s.samples]  # logits rows, plan order
        i = rows.index(person.request.request_id) if person.request.request_id in rows else None
        if i is not None:
            mask_tokens(logits[i], person.masked)
        tokens = greedy(logits)
        if i is not None and not person.sampling.is_greedy:
            tokens[i] = sample(logits[i:i + 1], person.sampling, person.generator, self.native)[0]
        return tokens


class BatchServer:
    """The batch: simulated users' requests and (while a reply streams) the person's, one paged
    pool, one scheduler. Single-threaded: the Engine calls it between steps."""

    def __init__(self, model: Transformer, workload: Workload, *, users: int, policy: str, attention: str,
                 budget_bytes: int, roof: Roof, settings_label: str = "",
                 first_user_id: int = 1_000_000, seed: int = 0,
                 on_request: Callable[[str, Request], None] | None = None,
                 clock: Callable[[], float] = time.perf_counter, prefix_cache: bool = True):
        self.workload = workload
        self.prefix_cache = prefix_cache  # users' prompts kept across requests (engine/serving/prefix_store.py)
        self.budget_bytes = budget_bytes
        self.on_request = on_request  # ("submitted" | "finished", request): tests account for every request
        self.clock = clock  # the scheduler's too: arrivals, token times, windows
        self.start_s = self.clock()
        self.users = SimulatedUsers(users, workload, seed=seed, first_id=first_user_id, start_s=self.start_s)
        self._users_target = users
        self._sampler = _Sampler()
        self.runner = self._new_runner(model, policy, attention, roof, settings_label)
        self._preempted_before = 0  # pre-emptions counted by runners replaced since
        self.finished_total = 0
        self.cancelled_total = 0
        self._prompt_tokens = self._prefix_hit_tokens = 0  # users' finished requests (prefix_hit_pct)
        self._window: deque[tuple[float, float, int]] = deque()  # (step start, step end, tokens sampled)
        self._recent: deque[tuple[float, list[float]]] = deque(maxlen=STATS_FINISHED)  # (ttft, gaps)
        self._latency: tuple[float, float, float, float] = (float("nan"),) * 4
        self._latency_stale = False
        self._last_stats_s = self.start_s

    def _new_runner(self, model: Transformer, policy: str, attention: str, roof: Roof,
                    settings_label: str) -> BatchRunner:
        num_blocks, _ = pool_size(model.cfg, model.embed.element_size(), per_user_tokens(self.workload),
                                  self.budget_bytes)
        gpu = model.device.type == "cuda"
        budget = 2048 if gpu else cpu_token_budget(model)
        runner = BatchRunner(model, num_blocks, DEFAULT_BLOCK_SIZE, max_batch_size=MAX_USERS + 1,
                             token_budget=budget, chunk_size=512 if gpu else min(128, budget), policy=policy,
                             attention=attention, roof=roof, sample=self._sampler, settings_label=settings_label,
                             prefix_bytes=prefix_store_bytes(self.budget_bytes) if self.prefix_cache else 0)
        self._sampler.scheduler = runner.scheduler
        self._sampler.native = None if gpu else cpu_step.sampler(model)
        runner.scheduler.clock = self.clock
        return runner

    @property
    def person(self) -> _Person | None:
        return self._sampler.person

    # ---- settings (between steps) ------------------------------------------------------------
    def configure(self, *, model: Transformer, users: int, policy: str, attention: str, settings_label: str,
                  roof: Roof) -> None:
        if model.dtype != self.runner.cache.k.dtype:  # (no reference to the old runner is kept here:
            self._rebuild(model)  # its pool is freed before the new one is made)
        elif model is not self.runner.model:
            self.runner.set_model(model)
        runner = self.runner
        runner.attention = attention
        runner.settings_label = settings_label
        runner.roof = roof
        if policy != runner.scheduler.policy:
            runner.scheduler.set_policy(policy)
        if users != self._users_target:
            self.users.set_users(users, self.clock())  # fewer: idle users leave, busy ones after their reply
            self._users_target = users

    def _rebuild(self, model: Transformer) -> None:
        """A new pool in the model's dtype: every unfinished request is re-queued (the running
        ones first, oldest first, then the queue in order) and recomputes what it had."""
        old = self.runner
        sched = old.scheduler
        self._drain_finished()
        requests = list(sched.running) + list(sched.waiting)
        # the person's context keeps its K/V, converted (as the batch-1 cache's are at a switch):
        # recomputing a long conversation in chunks would stall the batch for seconds
        person = self.person.request if self.person is not None else None
        carried = None
        if person is not None and any(r is person for r in requests) and person.num_computed_tokens:
            k, v = old.cache.prefix(person.num_computed_tokens, seq=person.request_id)
            carried = k.to(model.dtype), v.to(model.dtype)
            reused = person.num_reused_tokens  # (what it took over when it came, not what it computed)
        recomputing = [r for r in sched.running if r is not person or carried is None]
        self._preempted_before += sched.num_preemptions + len(recomputing)
        for req in recomputing:
            req.num_preemptions += 1
        kept = (sched.policy, old.attention, old.roof, old.settings_label)
        self.runner = None
        del old, sched  # the old pool's memory goes before the new one is made
        self.runner = self._new_runner(model, *kept)
        for req in requests:
            req.num_computed_tokens = req.num_reused_tokens = 0
            self.runner.scheduler.add_request(req)
        if carried is not None and self._take_computed(person, *carried):
            person.num_reused_tokens = reused

    # ---- requests ---------------------------------------------------------------------------
    def submit_person(self, request: Request, sampling: SamplingParams, generator: torch.Generator | None,
                      masked: tuple[int, ...] = (), cached=None) -> None:
        """The person's request; `cached` (the batch-1 KV cache and the ids it holds) gives the
        pool the K/V of the prefix it shares with the request's prompt, so a long conversation
        joins the batch without prefilling its context again (the users are not kept waiting)."""
        self.runner.scheduler.add_request(request)
        if cached is not None:
            cache, ids = cached
            self._take_computed(request, *cache.prefix(min(common_prefix(ids, request.prompt_ids), cache.length)))
        self._sampler.person = _Person(request, sampling, generator, masked)
        if self.on_request:
            self.on_request("submitted", request)

    def _take_computed(self, request: Request, k: torch.Tensor, v: torch.Tensor) -> bool:
        """K/V (L, n_kv, n, hd) of the request's first n tokens, computed elsewhere, into the pool
        where it has room (False: it computes them)."""
        return self.runner.take_computed(request, k, v) > 0

    def retained_kv(self):
        """(ids, K, V (L, n_kv, n, hd)) of the person's last turn kept in the pool, or None."""
        sched = self.runner.scheduler
        ids = sched.retained_ids
        if not ids:
            return None
        k, v = self.runner.cache.prefix(len(ids), seq=sched.retained_id)
        return ids, k, v

    def cancel(self, request_id: int) -> None:
        self.runner.scheduler.cancel(request_id)
        self._drain_finished()

    def set_person_sampling(self, sampling: SamplingParams, generator: torch.Generator | None) -> None:
        if self._sampler.person is not None:
            person = self._sampler.person
            self._sampler.person = _Person(person.request, sampling, generator, person.masked)

    def release_person(self) -> None:
        """The person's reply is over (finished, stopped, or its generator closed)."""
        person, self._sampler.person = self._sampler.person, None
        if person is not None and not person.request.is_finished:
            self.cancel(person.request.request_id)

    def abort(self) -> None:
        """After a failed step (the scheduler may be mid-step): every unfinished request ends as
        cancelled, reported once; the server is not used again."""
        sched = self.runner.scheduler
        self._drain_finished()
        for req in list(sched.requests.values()):
            req.state, req.finish_reason = RequestState.CANCELLED, "cancelled"
            self.cancelled_total += 1
            if self.on_request:
                self.on_request("finished", req)
        sched.requests.clear()
        self._sampler.person = None

    @property
    def has_unfinished(self) -> bool:
        return self.runner.scheduler.has_unfinished

    # ---- one step -----------------------------------------------------------------------------
    def step(self, step_index: int) -> tuple[StepMetrics | None, BatchStats | None]:
        sched = self.runner.scheduler
        now = self.clock()
        for req in self.users.due(now):
            sched.add_request(req)
            if self.on_request:
                self.on_request("submitted", req)
        self.runner.step_count = step_index
        start = self.clock()
        plan, sampled, metrics = self.runner.step()
        self._drain_finished()
        end = self.clock()
        if metrics is None:  # everyone is thinking: a heartbeat now and then, so rates fall to 0 on a plot
            if end - self._last_stats_s < IDLE_STATS_S:
                return None, None
            return None, self._stats(step_index, time.monotonic(), end, 0)
        self._window.append((start, end, len(sampled)))
        return metrics, self._stats(metrics.step, metrics.t_s, end, len(sampled))

    def _drain_finished(self) -> None:
        now = self.clock()
        for req in self.runner.scheduler.take_finished():
            if req.state is RequestState.CANCELLED:
                self.cancelled_total += 1
            else:
                self.finished_total += 1
                if not req.retain_kv:  # a user's (the person's conversation keeps its own prefix)
                    self._prompt_tokens += len(req.prompt_ids)
                    self._prefix_hit_tokens += req.num_reused_tokens
                if req.first_token_s is not None:
                    times = req.token_times_s
                    self._recent.append((req.ttft_s, [b - a for a, b in zip(times, times[1:])]))
                    self._latency_stale = True
            self.users.finished(req, now)  # a user's request: its think time starts (others: no-op)
            if self.on_request:
                self.on_request("finished", req)

    # ---- statistics ---------------------------------------------------------------------------
    def _stats(self, step: int, t_s: float, now: float, tokens: int) -> BatchStats:
        self._last_stats_s = now
        sched = self.runner.scheduler
        # the steps that ended in the window, and at least the last one (steps slower than the
        # window still give a rate); idle time between and after them counts
        window_start = now - STATS_WINDOW_S
        while len(self._window) > 1 and self._window[0][1] <= window_start:
            self._window.popleft()
        span = now - self._window[0][0] if self._window else 0.0
        aggregate = sum(n for _, _, n in self._window) / span if span > 0 else 0.0
        rates = []
        for req in sched.running:  # its tokens in the window, or at least its last two
            times = req.token_times_s
            first = min(bisect.bisect_right(times, window_start), len(times) - 2)
            if first >= 0 and times[-1] > times[first]:
                rates.append((len(times) - first - 1) / (times[-1] - times[first]))
        if self._latency_stale:
            ttfts = sorted(t for t, _ in self._recent)
            gaps = sorted(g for _, gs in self._recent for g in gs)
            self._latency = (_percentile(ttfts, 50), _percentile(ttfts, 95), _percentile(gaps, 50),
                             _percentile(gaps, 95))
            self._latency_stale = False
        pool = self.runner.cache.manager.pool
        person = self.person
        return BatchStats(
            step=step, t_s=t_s, users=self.users.n_users, policy=sched.policy,
            running=len(sched.running), waiting=len(sched.waiting), tokens=tokens,
            aggregate_tokens_per_s=aggregate,
            per_request_tokens_per_s=statistics.median(rates) if rates else float("nan"),
            ttft_p50_s=self._latency[0], ttft_p95_s=self._latency[1], itl_p50_s=self._latency[2],
            itl_p95_s=self._latency[3], preempted_total=self.preempted_total, finished_total=self.finished_total,
            cancelled_total=self.cancelled_total, kv_blocks_used=pool.num_used, kv_blocks_total=pool.num_blocks,
            person_in_batch=person is not None and person.request in sched.running,
            prefix_hit_pct=100 * self._prefix_hit_tokens / self._prompt_tokens
            if self._prompt_tokens and self.prefix_cache else float("nan"))

    @property
    def preempted_total(self) -> int:
        return self._preempted_before + self.runner.scheduler.num_preemptions

    def kv_snapshot(self):
        return self.runner.cache.snapshot()


def _percentile(sorted_values: list[float], q: float) -> float:
    """Nearest-rank percentile of an already sorted list (nan when empty)."""
    if not sorted_values:
        return float("nan")
    rank = max(0, min(len(sorted_values) - 1, -(-len(sorted_values) * q // 100) - 1))
    return sorted_values[int(rank)]
