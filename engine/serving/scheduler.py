"""Requests and the batching scheduler in vLLM's shape, pure Python (no torch): every step
`schedule()` returns a plan {request_id: n_tokens} (a prefill chunk or one decode token each) and
allocates its KV slots; the model runs the plan; `update_from_output(plan, sampled)` appends the
sampled tokens, finishes requests (EOS, max tokens, cancel), frees their blocks and lets waiting
ones in. When the KV pool runs dry the newest running request is pre-empted: its blocks are freed
and it is re-queued to recompute its prompt and the tokens it already produced.

Policies: `continuous` admits and evicts at every step; `static` forms a batch when none is
running and admits nobody else until every member of that batch has finished (a pre-empted
member rejoins its own batch).

Prefix reuse for one conversation: a request made with `retain_kv` (the person's chat) leaves its
blocks in the pool when it ends; the next `retain_kv` request whose prompt starts with the same
tokens takes them over and prefills only the rest (the plain engine path's cache reuse, in the
batch). Retained blocks are the first thing given back when the pool runs short: before anyone is
pre-empted or kept waiting."""
from __future__ import annotations

import enum
import time
from collections import deque
from dataclasses import dataclass, field
from typing import Callable

from engine.kv.blocks import KVCacheManager
from engine.settings import POLICIES


def common_prefix(a: list[int], b: list[int]) -> int:
    """How many leading tokens two sequences share."""
    n = min(len(a), len(b))
    if a[:n] == b[:n]:  # the usual case (one extends the other): one C-speed compare
        return n
    i = 0
    while i < n and a[i] == b[i]:
        i += 1
    return i


class RequestState(enum.Enum):
    WAITING = "waiting"
    RUNNING = "running"
    PREEMPTED = "preempted"  # blocks freed; waiting to recompute what it had
    FINISHED = "finished"
    CANCELLED = "cancelled"


@dataclass(eq=False)
class Request:
    request_id: int
    prompt_ids: list[int]
    max_new_tokens: int
    eos_ids: frozenset[int] = frozenset()
    arrival_s: float | None = None  # the scheduler's clock; add_request stamps it when None
    state: RequestState = RequestState.WAITING
    output_ids: list[int] = field(default_factory=list)
    num_computed_tokens: int = 0  # positions whose K/V are in the cache
    first_token_s: float | None = None
    token_times_s: list[float] = field(default_factory=list)
    finish_reason: str | None = None  # "eos" | "length" | "cancelled"
    num_preemptions: int = 0
    cancel_requested: bool = False
    retain_kv: bool = False  # keep its K/V when it ends, for the next request of its conversation
    num_reused_tokens: int = 0  # prompt tokens whose K/V it took over instead of computing them

    @property
    def all_token_ids(self) -> list[int]:
        return self.prompt_ids + self.output_ids

    @property
    def num_tokens(self) -> int:
        return len(self.prompt_ids) + len(self.output_ids)

    @property
    def num_uncomputed_tokens(self) -> int:
        """Tokens still to run through the model before it can sample: the (rest of the)
        prompt, everything after a pre-emption, or the last sampled token at decode."""
        return self.num_tokens - self.num_computed_tokens

    @property
    def is_finished(self) -> bool:
        return self.state in (RequestState.FINISHED, RequestState.CANCELLED)

    @property
    def ttft_s(self) -> float | None:
        return None if self.first_token_s is None else self.first_token_s - self.arrival_s

    @property
    def max_cached_tokens(self) -> int:
        """Positions it can hold at most: the last sampled token is never run through the model."""
        return len(self.prompt_ids) + self.max_new_tokens - 1


@dataclass(frozen=True)
class ScheduledSeq:
    """One request's share of a step: run `token_ids` at positions start_pos.. (their K/V slots
    are allocated: `block_table`); when `samples`, the step's last logits give its next token."""
    request_id: int
    token_ids: tuple[int, ...]
    start_pos: int
    block_table: tuple[int, ...]
    samples: bool

    @property
    def is_prefill(self) -> bool:
        return len(self.token_ids) > 1 or not self.samples


@dataclass(frozen=True)
class SchedulerOutput:
    num_scheduled_tokens: dict[int, int]  # the plan: request_id -> tokens this step
    seqs: tuple[ScheduledSeq, ...]  # the same plan, with what the model runner needs
    preempted_req_ids: tuple[int, ...] = ()
    num_waiting: int = 0  # after this step's admissions
    num_running: int = 0

    @property
    def total_num_scheduled_tokens(self) -> int:
        return sum(self.num_scheduled_tokens.values())

    @property
    def is_empty(self) -> bool:
        return not self.num_scheduled_tokens


class Scheduler:
    """Plans each step within `token_budget` tokens and `max_batch_size` running requests;
    prefill runs in chunks of at most `chunk_size` tokens (default: the budget). The KV manager's
    token count of a request always equals its `num_computed_tokens` between steps."""

    def __init__(self, kv_manager: KVCacheManager, max_batch_size: int = 8, token_budget: int = 512,
                 policy: str = "continuous", chunk_size: int | None = None,
                 clock: Callable[[], float] = time.perf_counter):
        if policy not in POLICIES:
            raise ValueError(f"batching policy must be one of {', '.join(POLICIES)}, got {policy!r}")
        if max_batch_size < 1 or token_budget < 1 or (chunk_size is not None and chunk_size < 1):
            raise ValueError("max_batch_size, token_budget and chunk_size must be >= 1")
        self.kv = kv_manager
        self.max_batch_size = max_batch_size
        self.token_budget = token_budget
        self.policy = policy
        self.chunk_size = chunk_size or token_budget
        self.clock = clock
        self.requests: dict[int, Request] = {}  # every request not yet finished
        self.waiting: deque[Request] = deque()  # WAITING and PREEMPTED, in admission order
        self.running: list[Request] = []  # oldest admitted first
        self.num_preemptions = 0
        self._static_batch: set[int] = set()  # members of the batch a static policy is running
        self._in_flight: SchedulerOutput | None = None  # scheduled, not yet updated
        self._finished: list[Request] = []  # since the last take_finished()
        # a finished retain_kv request's cached tokens; its blocks stay in the KV manager under its id
        self._retained: tuple[int, list[int]] | None = None

    # ---- requests in and out -------------------------------------------------------------
    def add_request(self, request: Request) -> None:
        if request.request_id in self.requests:
            raise ValueError(f"request {request.request_id} is already scheduled")
        if not request.prompt_ids or request.max_new_tokens < 1:
            raise ValueError("a request needs a prompt and max_new_tokens >= 1")
        capacity = self.kv.pool.num_blocks * self.kv.block_size
        if request.max_cached_tokens > capacity:
            raise ValueError(f"request {request.request_id} needs up to {request.max_cached_tokens} positions; "
                             f"the whole KV pool holds {capacity}")
        request.state = RequestState.WAITING
        if request.arrival_s is None:
            request.arrival_s = self.clock()
        self.requests[request.request_id] = request
        self.waiting.append(request)
        if request.retain_kv and self._retained is not None:
            self._adopt_retained(request)

    # ---- prefix reuse ----------------------------------------------------------------------
    def _adopt_retained(self, request: Request) -> None:
        """Hand the retained blocks to `request`, cut to the prefix its prompt shares with them
        (at least one prompt token is left to run: its logits give the first new token)."""
        rid, cached = self._retained
        self._retained = None
        keep = min(common_prefix(cached, request.prompt_ids), len(request.prompt_ids) - 1)
        if keep == 0:
            self.kv.free(rid)
            return
        self.kv.rename(rid, request.request_id)
        self.kv.truncate(request.request_id, keep)
        request.num_computed_tokens = request.num_reused_tokens = keep

    def take_computed(self, request: Request, n: int) -> int | None:
        """A waiting request's first `n` tokens were computed elsewhere (the person's batch-1
        cache when users join a conversation; the old pool at a precision switch): their slots are
        allocated here and they count as computed (the prompt's among them as reused). Returns the
        position from which the caller writes their K/V (what the request held already), or None:
        nothing to add, or no room (it computes them). At least one token is left to run, as when
        it adopts retained blocks: its logits give the next token."""
        n = min(n, request.num_tokens - 1)
        have = request.num_computed_tokens
        if request.state is not RequestState.WAITING or n <= have or \
                not self.kv.can_allocate(request.request_id, n - have):
            return None
        self.kv.allocate_slots(request.request_id, n - have)
        request.num_computed_tokens = n
        request.num_reused_tokens = min(n, len(request.prompt_ids))
        return have

    @property
    def retained_tokens(self) -> int:
        """Tokens of a finished conversation turn kept in the pool for the next one (0: none)."""
        return 0 if self._retained is None else len(self._retained[1])

    @property
    def retained_ids(self) -> list[int]:
        """The token ids whose K/V the retained blocks hold ([]: none)."""
        return [] if self._retained is None else list(self._retained[1])

    @property
    def retained_id(self) -> int | None:
        """The finished request whose blocks are retained (they stay under its id)."""
        return None if self._retained is None else self._retained[0]

    def drop_retained(self) -> int:
        """Free the retained blocks (and a waiting request's taken-over prefix, which it will
        recompute); returns the blocks freed."""
        before = self.kv.pool.num_free
        if self._retained is not None:
            self.kv.free(self._retained[0])
            self._retained = None
        for req in self.waiting:
            if req.num_computed_tokens and req.state is RequestState.WAITING:
                self.kv.free(req.request_id)
                req.num_computed_tokens = req.num_reused_tokens = 0
        return self.kv.pool.num_free - before

    def cancel(self, request_id: int) -> bool:
        """Cancel now, or at the end of the step in flight if it is part of it. False: unknown."""
        req = self.requests.get(request_id)
        if req is None:
            return False
        req.cancel_requested = True
        in_step = self._in_flight is not None and request_id in self._in_flight.num_scheduled_tokens
        if not in_step:
            self._finish(req, RequestState.CANCELLED, "cancelled")
        return True

    def take_finished(self) -> list[Request]:
        """Requests that finished or were cancelled since the last call (each reported once)."""
        done, self._finished = self._finished, []
        return done

    @property
    def has_unfinished(self) -> bool:
        return bool(self.requests)

    @property
    def in_flight(self) -> SchedulerOutput | None:
        """The plan scheduled and not yet updated (None between steps): a sampler reads which
        request each logits row belongs to from it (rows follow the plan's sampling seqs)."""
        return self._in_flight

    # ---- one step --------------------------------------------------------------------------
    def schedule(self) -> SchedulerOutput:
        if self._in_flight is not None:
            raise RuntimeError("schedule() called twice without update_from_output()")
        plan: dict[int, int] = {}
        budget = self.token_budget
        preempted: list[int] = []
        # decodes first, then prefill chunks: a long prompt never stalls the running decodes
        for req in sorted(self.running, key=lambda r: r.num_uncomputed_tokens > 1):
            if budget == 0:
                break
            if req.state is not RequestState.RUNNING:  # pre-empted earlier in this loop
                continue
            n = min(req.num_uncomputed_tokens, self.chunk_size, budget)
            while not self.kv.can_allocate(req.request_id, n):
                if self.drop_retained():  # cached blocks nobody running needs go first
                    continue
                # the newest running request (skipping any that hold no blocks: they free nothing)
                victim = next(r for r in reversed(self.running) if r is req or self.kv.block_tables.get(r.request_id))
                budget += plan.pop(victim.request_id, 0)  # un-plan it if it already ran this step
                self._preempt(victim)
                preempted.append(victim.request_id)
                if victim is req:
                    break
            else:
                self.kv.allocate_slots(req.request_id, n)
                plan[req.request_id] = n
                budget -= n
        if not preempted:
            budget = self._admit(plan, budget)
        seqs = tuple(self._scheduled_seq(self.requests[rid], n) for rid, n in plan.items())
        out = SchedulerOutput(num_scheduled_tokens=plan, seqs=seqs, preempted_req_ids=tuple(preempted),
                              num_waiting=len(self.waiting), num_running=len(self.running))
        self._in_flight = out if plan else None
        return out

    def _admit(self, plan: dict[int, int], budget: int) -> int:
        forming = self.policy == "static" and not self.running
        if forming:  # a static batch takes everyone whose whole context fits (the budget only
            self._static_batch = set()  # limits what runs this step: the rest start next step)
            room = self.kv.pool.num_free
        while self.waiting and len(self.running) < self.max_batch_size:
            req = self.waiting[0]
            n = min(req.num_uncomputed_tokens, self.chunk_size, budget)
            if forming:  # (blocks beyond any prefix it took over)
                if self.kv.blocks_needed(req.request_id, req.num_uncomputed_tokens) > room:
                    room += self.drop_retained()
                need = self.kv.blocks_needed(req.request_id, req.num_uncomputed_tokens)
                if need > room:
                    break
                room -= need
            elif self.policy == "static" and req.request_id not in self._static_batch:
                break  # the static batch is closed until all its members finish
            elif n == 0 or not (self.kv.can_allocate(req.request_id, n) or
                                (self.drop_retained() and self.kv.can_allocate(req.request_id, n))):
                break  # first come, first served: nobody overtakes the head of the queue
            self.waiting.popleft()
            req.state = RequestState.RUNNING
            self.running.append(req)
            if forming:
                self._static_batch.add(req.request_id)
            if n:
                self.kv.allocate_slots(req.request_id, n)
                plan[req.request_id] = n
                budget -= n
        return budget

    def _scheduled_seq(self, req: Request, n: int) -> ScheduledSeq:
        start = req.num_computed_tokens
        return ScheduledSeq(request_id=req.request_id, token_ids=tuple(req.all_token_ids[start:start + n]),
                            start_pos=start, block_table=tuple(self.kv.block_tables[req.request_id]),
                            samples=start + n == req.num_tokens)

    def _preempt(self, req: Request) -> None:
        self.kv.free(req.request_id)
        self.running.remove(req)
        req.num_computed_tokens = req.num_reused_tokens = 0
        req.state = RequestState.PREEMPTED
        req.num_preemptions += 1
        self.num_preemptions += 1
        self.waiting.appendleft(req)  # first in line once there is room again

    def update_from_output(self, plan: SchedulerOutput, sampled: dict[int, int | None]) -> list[Request]:
        """Record a step's result: `sampled[request_id]` is the token drawn for each plan entry
        that `samples` (others may be absent or None). Returns the requests finished by it."""
        if plan is not self._in_flight and not plan.is_empty:
            raise RuntimeError("update_from_output() got a plan that is not the one in flight")
        missing = [s.request_id for s in plan.seqs if s.samples and sampled.get(s.request_id) is None
                   and not self.requests[s.request_id].cancel_requested]
        if missing:  # checked before anything changes: the step can be retried
            raise ValueError(f"no token sampled for request(s) {missing}, whose step reached their last token")
        self._in_flight = None
        now = self.clock()
        done = []
        for seq in plan.seqs:
            req = self.requests[seq.request_id]
            if req.cancel_requested:
                self._finish(req, RequestState.CANCELLED, "cancelled")
                done.append(req)
                continue
            req.num_computed_tokens += len(seq.token_ids)
            if not seq.samples:
                continue
            token = sampled[seq.request_id]
            req.output_ids.append(token)
            req.token_times_s.append(now)
            if req.first_token_s is None:
                req.first_token_s = now
            if token in req.eos_ids:
                self._finish(req, RequestState.FINISHED, "eos")
            elif len(req.output_ids) >= req.max_new_tokens:
                self._finish(req, RequestState.FINISHED, "length")
            if req.is_finished:
                done.append(req)
        return done

    def _finish(self, req: Request, state: RequestState, reason: str) -> None:
        if req.state is RequestState.RUNNING:
            self.running.remove(req)
        elif req in self.waiting:
            self.waiting.remove(req)
        if req.retain_kv and req.num_computed_tokens:  # its blocks stay for the next turn
            self.kv.truncate(req.request_id, req.num_computed_tokens)  # (cancelled mid-step: the step's
            if self._retained is not None:  # slots were allocated, not counted as computed)
                self.kv.free(self._retained[0])
            self._retained = (req.request_id, req.all_token_ids[:req.num_computed_tokens])
        else:
            self.kv.free(req.request_id)
        req.state = state
        req.finish_reason = reason
        del self.requests[req.request_id]
        self._finished.append(req)

    def set_policy(self, policy: str) -> None:
        """Switch between steps; a static batch already running keeps its members."""
        if policy not in POLICIES:
            raise ValueError(f"batching policy must be one of {', '.join(POLICIES)}, got {policy!r}")
        if policy == "static" and self.policy != "static":
            self._static_batch = {r.request_id for r in self.running}
        self.policy = policy
