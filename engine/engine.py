"""`Engine`: owns the model, its KV cache and the batch server; streams plain-data events.

`generate(ids)` (and `chat(text)`, which renders the conversation first) yields TokenEvent,
StepMetrics, DoneEvent, SettingsApplied/SettingsRefused, and BatchStats while simulated users are
served. `apply(settings)` and `stop()` may be called from another thread; a change takes effect
at the next step boundary (or at `take_settings()` between replies). With `settings.users > 0` a
reply runs as one request of the batch beside the simulated users (engine/serving/server.py), and
`serve_step()` serves them between replies."""
from __future__ import annotations

import itertools
import threading
import time
from dataclasses import replace
from typing import Iterator

import torch

from engine.conversation import Conversation
from engine.events import (
    BatchStats,  # noqa: F401  (an event of chat() and generate() too)
    DoneEvent,
    SettingsApplied,
    SettingsRefused,
    TokenEvent,
)
from engine.graphs import GraphDecoder
from engine.io.loader import LoadedWeights, load_model
from engine.kv.cache import DEFAULT_BLOCK_SIZE, ContiguousKVCache, PagedKVCache
from engine.metrics import StepMetrics, step_cost
from engine.model.config import ModelConfig
from engine.model.quant import QuantisedModels
from engine.model.sampling import mask_tokens, sample
from engine.model.transformer import Transformer
from engine.protocol import Capabilities
from engine.serving.scheduler import Request, RequestState, common_prefix
from engine.serving.server import BatchServer, kv_budget_bytes, per_user_tokens, pool_size, user_workload
from engine.serving.speculative import (
    Draft,
    DraftModel,
    DraftModels,
    Oracle,
    PromptLookup,
    greedy_reference,
    verify,
)
from engine.settings import (
    DRAFT_GROUP_SIZE,
    EngineError,
    PromptError,
    QuantError,
    Settings,
    check_weights,
    describe_change,
    weights_label,
)

DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}


class Engine:
    def __init__(self, model: "str | LoadedWeights" = "default", device: str = "cpu", dtype: str = "fp32",
                 max_context: int | None = 4096, progress=None, hardware=None, settings: Settings | None = None,
                 messages=()):
        from engine.hardware.detect import detect_device

        self.device = device
        if device == "cpu":
            # subnormal floats take a slow microcode path on x86: random and real weights produce
            # them in decode, and steps ran 10-30x slower at random until they were flushed to zero
            torch.set_flush_denormal(True)
        self.graphs = GraphDecoder(device)
        self.settings = self._normalised((settings or Settings(dtype=dtype)).validate(device))
        self.hardware = hardware or detect_device(device, progress=(lambda m: progress(0.0, m)) if progress else None)
        if isinstance(model, LoadedWeights):  # already in memory (tests, the app's model cache)
            self.loaded = model
        else:
            self.loaded = load_model(model, DTYPES[self.settings.dtype], device, progress, max_context)
        self.cfg: ModelConfig = self.loaded.cfg
        self.tokenizer = self.loaded.tokenizer
        self.conversation = Conversation(self.tokenizer, messages)
        self._models: dict[str, Transformer] = {self.settings.dtype: Transformer(self.cfg, self.loaded.weights)}
        self.cache: ContiguousKVCache | PagedKVCache | None = None
        self.cached_ids: list[int] = []  # token ids whose K/V are in self.cache
        self._pending: Settings | None = None  # asked for, not yet running
        self._pending_ids: list[int] = []  # the front end's requests `_pending` answers
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self.step_count = 0
        self.kernel_notes: dict[str, str] = {}  # "field=value" -> a kernel fallback (Capabilities.notes)
        self.progress = progress  # also reports quantisation, from its background thread
        self._quantised = QuantisedModels()
        self._drafts = DraftModels()  # draft models for speculation ("draft"), loaded in the background
        self._draft: DraftModel | None = None  # the one in use, with its own KV cache
        self._lookup = PromptLookup()
        self._last_oracle: tuple | None = None  # (what it was computed for, the reference)
        self.model_spec = model if isinstance(model, str) else None  # what a draft "self"/"default" compares to
        # batched serving (engine/serving/server.py): made when users > 0, dropped when they are gone
        self._server: BatchServer | None = None
        self._reply_active = False  # a reply is streaming: serve_step() leaves the batch to it
        self._person_ids = itertools.count(1)  # the person's requests; users' ids start far above
        self._next_user_id = 1_000_000
        self.kv_pool_budget_bytes: int | None = None  # the batch KV pool's budget (None: from the device)
        self.user_workload = None  # engine.serving.users.Workload the users send (None: bundled prompts)
        self.on_request = None  # optional callback(event "submitted" | "finished", Request): accounting
        refusal = self.refusal(self.settings)
        if refusal:
            raise EngineError(refusal)
        if self.settings.weights_key is not None:  # quantised from the start: make the copy now
            self._request_weights(self.settings)
            self._quantised.wait(self.settings.weights_key)
        if self.settings.speculate == "draft":  # and the draft model
            self._request_draft(self.settings)
            self._use_draft(self._drafts.wait(self._draft_key(self.settings)), self.settings)

    # ---- control (thread-safe) ---------------------------------------------------------
    def apply(self, settings: Settings, request_id: int = 0) -> None:
        """Ask for `settings` from the next step on. Raises EngineError (one line) for settings
        this model or device cannot run; a refusal changes nothing. Quantised weights not made yet
        are made in a background thread and the switch waits for them (a reply keeps streaming)."""
        settings = self._normalised(settings.validate(self.device))
        refusal = self.refusal(settings)
        if refusal:
            raise EngineError(refusal)
        self._request_weights(settings)
        self._request_draft(settings)
        with self._lock:
            self._pending = settings
            if request_id:
                self._pending_ids.append(request_id)

    def _normalised(self, settings: Settings) -> Settings:
        """`cuda_graphs` asks for a captured step where the device offers one: where it does not,
        the settings say eager (what runs), so no front end shows a capture that is not there."""
        if settings.cuda_graphs and self.graphs.unavailable:
            return replace(settings, cuda_graphs=False)
        return settings

    def disable_graphs(self, reason: str) -> None:
        """Every decode step runs eagerly from now on (a failed check at load), and the settings say
        so at once. Call between replies."""
        self.graphs.unavailable = reason
        self.settings = self._normalised(self.settings)

    def _capture_failed(self) -> None:
        """A capture failed and decode went eager for good: the settings say so at the next step."""
        with self._lock:
            base = self._pending if self._pending is not None else self.settings
            if base.cuda_graphs:
                self._pending = replace(base, cuda_graphs=False)

    @property
    def requested_settings(self) -> Settings:
        """What the engine will run once pending changes are taken: the base a change is laid over."""
        pending = self._pending
        return pending if pending is not None else self.settings

    @property
    def has_pending(self) -> bool:
        return self._pending is not None

    def refusal(self, settings: Settings) -> str:
        return self.capabilities().refusal(settings)

    def capabilities(self) -> Capabilities:
        """What this model on this device can take; the front end disables the rest, with why."""
        dtypes = [d for d in DTYPES if d != "fp16" or self.device != "cpu"]
        return Capabilities.for_model(self.cfg, self.device, {d: self.max_users_for(d) for d in dtypes},
                                      self.kernel_notes, captured_step=self.graphs.kind,
                                      captured_refusal=self.graphs.refusal)

    def _request_weights(self, settings: Settings) -> None:
        if settings.weights_key is None:
            return
        try:
            check_weights(self.cfg, settings.weights, settings.group_size)
            self._quantised.start(settings.weights_key, lambda: self._fp_model(settings.dtype), self.progress)
        except QuantError as e:
            raise EngineError(str(e)) from None

    def _request_draft(self, settings: Settings) -> None:
        """Start loading the draft model `settings` speculate with (a no-op unless speculate="draft")."""
        if settings.speculate != "draft":
            return
        key = self._draft_key(settings)
        self._drafts.start(key, lambda: self._build_draft(settings))

    def _draft_key(self, settings: Settings) -> tuple:
        return settings.draft_model, settings.dtype, settings.draft_weights

    def _build_draft(self, settings: Settings) -> Transformer:
        """The draft model of `settings` (runs on the loading thread). "self" is the target's own
        weights at the draft's precision (its quantised copy shared with the weights switch)."""
        from engine.serving.speculative import load_draft
        if settings.draft_model == "self":
            return self.model_for(Settings(dtype=settings.dtype, weights=settings.draft_weights,
                                           group_size=DRAFT_GROUP_SIZE))
        return load_draft(settings.draft_model, self.cfg, self.tokenizer, DTYPES[settings.dtype], self.device,
                          settings.draft_weights, self.max_context)

    @property
    def weights_building(self) -> tuple[str, float] | None:
        """(label, fraction done) while quantised weights are being made, else None."""
        building = self._quantised.building
        if building is None:
            return None
        (_, weights, group_size), fraction = building
        return weights_label(weights, group_size), fraction

    def stop(self) -> None:
        """End the reply in progress (its request leaves the batch; simulated users keep going)."""
        self._stop.set()

    def take_settings(self, wait: bool = False) -> list:
        """Switch to the pending settings now (call between steps, on the engine's thread): returns
        [SettingsApplied] (also for a change that turned out to change nothing, so every request
        is answered), [SettingsRefused, ...] when its weights could not be made, or [] when there is
        nothing pending or its weights are still being made (unless `wait`)."""
        with self._lock:
            new, ids = self._pending, self._pending_ids
            if new is None:
                return []
            key = new.weights_key
            draft_key = self._draft_key(new) if new.speculate == "draft" else None
            if not wait and ((key is not None and self._quantised.get(key) is None and self.weights_building is not None)
                             or (draft_key is not None and self._drafts.is_building(draft_key))):
                return []  # not ready: keep streaming as is
            self._pending, self._pending_ids = None, []
        old = self.settings
        try:
            if key is not None and self._quantised.get(key) is None:
                self._quantised.wait(key)
            draft = self._drafts.wait(draft_key) if draft_key is not None else None
            if new.dtype != old.dtype:
                self._switch_dtype(new.dtype)
        except (QuantError, EngineError, MemoryError, RuntimeError, OSError) as error:
            reason = str(error).strip().splitlines()[0] if str(error).strip() else type(error).__name__
            return [SettingsRefused(request_id, reason, old) for request_id in ids or [0]]
        self.settings = new
        self._use_draft(draft, new)
        if self._server is not None:
            self._sync_server()
        changes = describe_change(old, new)
        if not changes and not ids:
            return []
        return [SettingsApplied(new, changes, self.step_count, time.monotonic(), tuple(ids))]

    def _use_draft(self, model: Transformer | None, settings: Settings) -> None:
        """Speculate with `model` from now on (None: no draft model); its cache is kept while it is the same."""
        if model is None:
            self._draft = None
        elif self._draft is None or self._draft.model is not model:
            self._draft = DraftModel(model, self.max_context, self.hardware.peak_bandwidth_gbs * 1e9,
                                     self.hardware.peak_flops_for(settings.dtype) or float("nan"))
        if self._draft is not None:
            self._draft.attention = settings.attention

    # ---- simulated users ---------------------------------------------------------------------
    @property
    def max_users(self) -> int:
        """Simulated users the device's KV memory holds beside a full-length chat (0..64), for
        the current dtype: the app's slider bound."""
        return self.max_users_for(self.settings.dtype)

    def max_users_for(self, dtype: str) -> int:
        _, users = pool_size(self.cfg, _elem_bytes(DTYPES[dtype]), per_user_tokens(self._user_workload()),
                             self._pool_budget())
        return users

    def _pool_budget(self) -> int:
        if self.kv_pool_budget_bytes is None:  # measured once: the pool itself then takes free memory
            self.kv_pool_budget_bytes = kv_budget_bytes(self.device, self.hardware.memory_total_bytes)
        return self.kv_pool_budget_bytes

    def _user_workload(self):
        if self.user_workload is None:
            self.user_workload = user_workload(self.tokenizer, self.max_context)
        return self.user_workload

    @property
    def serving(self) -> bool:
        """There is background work for serve_step(): users to serve, or their last requests."""
        return self._server is not None or self.settings.users > 0

    def serve_step(self) -> list:
        """Between the person's replies: pending settings first (take_settings), then one batched
        step for the simulated users: [StepMetrics, BatchStats] for a step that ran, a lone
        BatchStats (tokens 0) at most 4 times a second while every user is thinking, or nothing
        (no users; a reply in progress). Never blocks long; cheap with no users. Call it from the
        thread that runs generate()."""
        if self._reply_active:
            return []
        events = self.take_settings()
        if not self.serving:
            return events
        server = self._ensure_server()
        metrics, stats = self._server_step()
        if metrics is not None:
            self.step_count += 1
            events.append(metrics)
        if stats is not None:
            events.append(stats)
        if not self.settings.users and not server.has_unfinished:  # the last user has left
            self._next_user_id = server.users.next_id
            self._server = None  # frees the pool
        return events

    def _ensure_server(self) -> BatchServer:
        if self._server is None:
            s = self.settings
            self._server = BatchServer(
                self.model, self._user_workload(), users=s.users, policy=s.policy, attention=s.attention,
                budget_bytes=self._pool_budget(),
                peak_bandwidth_bps=self.hardware.peak_bandwidth_gbs * 1e9,
                peak_flops=self.hardware.peak_flops_for(s.dtype) or float("nan"), settings_label=self._batch_label(),
                first_user_id=self._next_user_id, seed=self._next_user_id, on_request=self.on_request)
        return self._server

    def _server_step(self):
        try:
            return self._server.step(self.step_count)
        except Exception:  # a failed step leaves the batch mid-step: end it, its requests cancelled
            self._server.abort()
            self._next_user_id = self._server.users.next_id
            self._server = None
            raise

    def _sync_server(self) -> None:
        """Hand the current settings to the batch (between steps)."""
        s = self.settings
        self._server.configure(model=self.model, users=s.users, policy=s.policy, attention=s.attention,
                               settings_label=self._batch_label(),
                               peak_flops=self.hardware.peak_flops_for(s.dtype) or float("nan"))

    def _batch_label(self) -> str:
        s = self.settings
        return s.label if s.users else replace(s, kv_layout="paged").label + " · batched"

    # ---- models ------------------------------------------------------------------------------
    @property
    def model(self) -> Transformer:
        key = self.settings.weights_key
        return self._models[self.settings.dtype] if key is None else self._quantised.get(key)

    def model_for(self, settings: Settings) -> Transformer:
        """The model `settings` would run, made now if need be (quality tables, the bench)."""
        key = settings.validate(self.device).weights_key
        if key is None:
            return self._fp_model(settings.dtype)
        self._request_weights(settings)
        try:
            return self._quantised.wait(key)
        except QuantError as e:
            raise EngineError(str(e)) from None

    @property
    def max_context(self) -> int:
        return self.cfg.max_seq_len

    def _fp_model(self, name: str) -> Transformer:
        """The model in dtype `name` with its own floating-point weights, made once (may run
        on the quantisation thread: the table is guarded)."""
        with self._lock:
            model = self._models.get(name)
        if model is None:
            weights = {k: v.to(DTYPES[name]) for k, v in self.loaded.weights.items()}
            with self._lock:
                model = self._models.setdefault(name, Transformer(self.cfg, weights))
        return model

    def _switch_dtype(self, name: str) -> None:
        self._fp_model(name)
        if self.cache is not None:  # keep the conversation: the cached K/V change precision
            self.cache = self.cache.astype(DTYPES[name])

    def _new_cache(self, dtype: torch.dtype):
        """An empty cache in the settings' layout. Paged: a pool of blocks for one full-length
        sequence (the same bytes as the contiguous buffer), filled on demand."""
        if self.settings.kv_layout == "paged":
            blocks = -(-self.cfg.max_seq_len // DEFAULT_BLOCK_SIZE)
            return PagedKVCache(self.cfg, blocks, DEFAULT_BLOCK_SIZE, dtype, self.device)
        return ContiguousKVCache(self.cfg, 1, self.cfg.max_seq_len, dtype, self.device)

    def kv_snapshot(self):
        """The KV cache's memory as plain data (engine/kv/blocks.py KVCacheSnapshot) for the app's
        panel: cells per block, owners, fill, reserved vs used bytes. Call between steps."""
        from engine.kv.blocks import KVCacheSnapshot
        if self._server is not None and self.settings.users:  # batched serving: the shared block pool
            return self._server.kv_snapshot()
        layout = self.settings.kv_layout
        if layout == "off" or self.cache is None or self.cache.layout != layout:
            bytes_per_token = self.cfg.kv_bytes_per_token_per_elem * _elem_bytes(self.model.dtype)
            return KVCacheSnapshot(layout=layout, block_size=DEFAULT_BLOCK_SIZE, bytes_per_token=bytes_per_token)
        return self.cache.snapshot()

    # ---- the conversation ----------------------------------------------------------------------
    @property
    def messages(self) -> list[dict[str, str]]:
        return self.conversation.messages

    @messages.setter
    def messages(self, messages) -> None:
        self.conversation = Conversation(self.tokenizer, messages)

    def reset(self) -> None:
        """A new conversation: forget the messages and the cached context."""
        self.conversation.clear()
        self.cached_ids = []
        if self.cache is not None:
            self.cache.truncate(0)
        if self._draft is not None:
            self._draft.reset()
        if self._server is not None:
            self._server.runner.scheduler.drop_retained()

    def chat(self, user_text: str, ignore_eos: bool = False) -> Iterator:
        """One turn of the conversation; it is kept once the reply has run (finished or stopped).
        ignore_eos: the reply runs to its token budget or the context's end, in prose: the end of
        turn and every other special token are never sampled (else the model writes the template's
        next turns, role names and all, into its reply)."""
        ids = self.conversation.prompt_ids(user_text)
        self._check_prompt_length(len(ids))
        done = None
        masked = self.conversation.special_ids() if ignore_eos else frozenset()
        for event in self.generate(ids, ignore_eos=ignore_eos, masked_ids=masked):
            if isinstance(event, DoneEvent):
                done = event
            yield event
        self.conversation.add_turn(user_text, done.text if done else "")

    def _check_prompt_length(self, n: int) -> None:
        if n + 1 > self.max_context:
            raise PromptError(f"prompt is {n} tokens, but the context window is {self.max_context} "
                              "(start a new chat or shorten the prompt)")

    # ---- generation: one reply loop, each step plain (batch 1) or in the batch -----------------
    def generate(self, prompt_ids: list[int], max_new_tokens: int | None = None,
                 ignore_eos: bool = False, masked_ids: frozenset[int] = frozenset()) -> Iterator:
        """Stream a reply to `prompt_ids`, reusing whatever prefix of them is already cached;
        `masked_ids` are never sampled (their logits are -inf on every path: plain, verify, batched)."""
        if not prompt_ids:
            raise PromptError("empty prompt: nothing to generate from")
        self._check_prompt_length(len(prompt_ids))
        self._stop.clear()
        yield from self.take_settings(wait=True)  # a change made between replies runs from the first step
        eos = frozenset() if ignore_eos else frozenset(self.tokenizer.eos_ids)
        reply = _Reply(list(prompt_ids), max_new_tokens or self.settings.max_new_tokens,
                       self.tokenizer.stream(skip_special_tokens=True), eos)
        reply.masked = tuple(sorted(masked_ids))
        gen = self._make_generator()
        if self.settings.speculate == "oracle":  # its guesses are computed before the reply's first step
            reply.oracle = self._oracle(reply)
        person: Request | None = None  # the reply's request, once it runs in the batch
        self._reply_active = True
        try:
            while True:
                for event in self.take_settings():
                    yield event
                    if isinstance(event, SettingsApplied) and event.settings.sampling.seed is not None \
                            and any("seed" in change for change in event.changes):
                        gen = self._make_generator()
                    if person is not None and isinstance(event, SettingsApplied):
                        self._server.set_person_sampling(self.settings.sampling, gen)
                if person is None:
                    reply.reason = reply.reason or reply.end_reason(self._stop.is_set(), self.max_context)
                    if reply.reason:
                        break
                    if self.settings.users > 0:  # users are on (or joined mid-reply): the rest runs batched
                        person = self._submit_person(reply, gen)
                if person is None and self.settings.speculate != "off" and reply.n_new > 0:
                    yield from self._speculative_step(reply, gen)
                elif person is None:
                    yield from self._plain_step(reply, gen)
                elif self._stop.is_set():
                    self._server.cancel(person.request_id)
                    break
                elif person.is_finished:
                    break
                else:
                    yield from self._batched_step(reply, person)
        finally:
            self._reply_active = False
            if person is not None and self._server is not None:
                self._server.release_person()  # cancels the request if the reply was abandoned mid-way
        if person is not None:
            if person.state is RequestState.CANCELLED:
                reply.reason = "stopped"
            elif person.finish_reason == "eos":
                reply.reason = "eos"
            else:
                reply.reason = "max_tokens" if reply.n_new >= reply.budget else "context_full"
            if reply.batched_from_start:  # its prefix came from the last turn's retained blocks
                reply.n_cached = person.num_reused_tokens  # (0 if it was pre-empted: recomputed)
        tail = reply.stream.flush()  # a character still held back (split UTF-8) comes out now
        if tail:
            reply.parts.append(tail)
            yield TokenEvent(-1, tail, reply.n_new)
        yield DoneEvent(reply.reason, "".join(reply.parts), reply.n_prompt, reply.n_new, reply.ttft_s,
                        reply.decode_s, reply.n_cached)

    def _plain_step(self, reply: "_Reply", gen) -> Iterator:
        (token,), metrics = self._step(reply.ids, produced=reply.n_new, gen=gen, masked=reply.masked)
        t_end = time.perf_counter()
        self.step_count += 1
        if reply.n_new == 0:
            reply.n_cached = metrics.context_len  # the first step ran the prompt after its cached prefix
        else:
            reply.decode_s += metrics.step_s
        yield metrics
        event = reply.add_token(token, t_end)
        if event is not None:
            yield event

    def _speculative_step(self, reply: "_Reply", gen) -> Iterator:
        """A draft source guesses up to k tokens; one target step verifies them (engine/serving/
        speculative.py). No guess (no n-gram match, no room left): a plain decode step."""
        s = self.settings
        k = min(s.draft_tokens, reply.budget - reply.n_new - 1, self.max_context - len(reply.ids) - 1)
        source = self._draft_source(reply)
        draft = source.propose(reply.ids, k, s.sampling, gen) if k >= 1 and source is not None else Draft([])
        if not draft.tokens:
            yield from self._plain_step(reply, gen)
            return
        if draft.metrics is not None:  # the draft model's forwards: a step of their own
            draft.metrics = replace(draft.metrics, step=self.step_count, settings_label=s.label)
            self.step_count += 1
            reply.decode_s += draft.metrics.step_s
            yield draft.metrics
        tokens, metrics = self._step(reply.ids, produced=reply.n_new, gen=gen, draft=draft, masked=reply.masked)
        t_end = time.perf_counter()
        self.step_count += 1
        reply.decode_s += metrics.step_s
        yield metrics
        for i, token in enumerate(tokens):
            event = reply.add_token(token, t_end, drafted=i < metrics.accepted_tokens)
            if event is None:
                break
            yield event

    def _draft_source(self, reply: "_Reply"):
        speculate = self.settings.speculate
        if speculate == "ngram":
            return self._lookup
        if speculate == "draft":
            return self._draft
        if speculate == "oracle":
            if reply.oracle is None:  # switched on mid-reply: the reference goes on from here
                reply.oracle = self._oracle(reply)
            return reply.oracle
        return None

    def _oracle(self, reply: "_Reply") -> Oracle:
        """The target's greedy reply from where `reply` stands, decoded before it goes on (untimed;
        the last one is kept: a benchmark asks for the same reply at every k)."""
        s = self.settings
        budget = reply.budget - reply.n_new
        key = (tuple(reply.ids), budget, reply.eos, reply.masked, self.model, s.attention, s.kv_cache)
        if self._last_oracle is None or self._last_oracle[0] != key:
            reference = greedy_reference(self.model, reply.ids, budget, reply.eos, s.attention, s.kv_cache,
                                         reply.masked)
            self._last_oracle = (key, reference)
        return Oracle(self._last_oracle[1], len(reply.ids))

    def _submit_person(self, reply: "_Reply", gen) -> Request:
        """The (rest of the) reply as one request in the batch: the context so far is its prompt,
        prefilled into the paged pool (or taken over from the last turn's retained blocks)."""
        server = self._ensure_server()
        self._sync_server()
        want, room = reply.budget - reply.n_new, self.max_context - len(reply.ids)
        # retain_kv: the conversation's K/V stay in the pool after the reply, and the next turn
        # prefills only what is new (engine/serving/scheduler.py), as the plain path's cache does
        request = Request(next(self._person_ids), list(reply.ids), min(want, room), reply.eos, retain_kv=True)
        server.submit_person(request, self.settings.sampling, gen, masked=reply.masked)
        reply.batched_from_start = reply.n_new == 0
        reply.seen = len(request.output_ids)
        return request

    def _batched_step(self, reply: "_Reply", person: Request) -> Iterator:
        had_first_token = reply.n_new > 0
        metrics, stats = self._server_step()
        t_end = time.perf_counter()
        if metrics is None:  # nothing could run (cannot last: the running requests finish)
            time.sleep(0.001)
            return
        self.step_count += 1
        if had_first_token:
            reply.decode_s += metrics.step_s  # every step from the first token on, pre-empted ones too
        yield metrics
        yield stats
        for token in person.output_ids[reply.seen:]:
            event = reply.add_token(token, t_end)
            if event is None:
                break
            yield event
        reply.seen = len(person.output_ids)

    def _make_generator(self):
        seed = self.settings.sampling.seed
        if seed is None:
            return None
        return torch.Generator(device=self.device).manual_seed(seed)

    # ---- one step: plain, or a speculative step's verification ----------------------------------
    @torch.inference_mode()
    def _step(self, ids: list[int], produced: int, gen, draft: Draft | None = None,
              masked: tuple[int, ...] = ()) -> tuple[list[int], StepMetrics]:
        """Run the context's uncached tail (and the draft's guesses, if any) through the model;
        returns the tokens it produced (one; or the accepted guesses and the target's own) and the
        step's figures. Rejected guesses leave the KV cache (contiguous: its length; paged: their blocks)."""
        model = self.model
        use_cache = self.settings.kv_cache
        layout = self.settings.kv_layout
        attention = self.settings.attention
        guesses = draft.tokens if draft is not None else []
        if use_cache:
            if self.cache is None or self.cache.layout != layout:  # a new layout: prefill into it
                self.cache = self._new_cache(model.dtype)
                self.cached_ids = []
            common = common_prefix(self.cached_ids, ids)
            start = min(common, len(ids) - 1)  # at least one token must run to get logits
            self.cache.truncate(start)
            feed = ids[start:] + guesses
        else:
            start = 0
            feed = ids + guesses
        phase = "verify" if draft is not None else "prefill" if produced == 0 else "decode"
        tokens = torch.tensor([feed], dtype=torch.long, device=self.device)
        graph_kv_len = None
        if use_cache and layout == "contiguous" and len(feed) == 1:
            graph_kv_len = self.graphs.bucket(self.settings.cuda_graphs, start, self.cache.max_len)
        timer = _Timer(self.device)
        timer.start()
        if graph_kv_len is not None:
            replays = self.graphs.replays
            logits = self.graphs.decode(model, self.cache, tokens, start, graph_kv_len, attention)
            if self.graphs.replays == replays:  # fell back to eager this step: it read only the context
                graph_kv_len = None
                self._capture_failed()
        else:
            logits = model(tokens, start_pos=start, cache=self.cache if use_cache else None,
                           attention=attention, logits_rows=len(guesses) + 1)
        accepted = 0
        mask_tokens(logits, masked)
        if draft is None:
            out = [int(sample(logits[:, -1], self.settings.sampling, gen).item())]
        else:
            accepted, out = verify(logits[0], draft, self.settings.sampling, gen)
        step_s = timer.stop() + (draft.search_s if draft is not None else 0.0)
        if use_cache:
            self.cached_ids = list(ids) + guesses[:accepted]
            self.cache.truncate(len(self.cached_ids))  # the rejected guesses' K/V go (paged: their blocks)
        cost = step_cost(self.cfg, batch_size=1, new_tokens=len(feed), context_len=start,
                         weight_bytes=model.linear_weight_bytes(rows=len(feed)), kv_elem_bytes=_elem_bytes(model.dtype),
                         act_elem_bytes=_elem_bytes(model.dtype), kv_cache=use_cache,
                         logits_rows=len(guesses) + 1, kv_read_tokens=graph_kv_len, attention=attention,
                         kv_layout=layout, block_size=getattr(self.cache, "block_size", DEFAULT_BLOCK_SIZE))
        metrics = StepMetrics.from_cost(
            cost, step=self.step_count, phase=phase, batch_size=1, new_tokens=len(feed), tokens_out=len(out),
            context_len=start, step_s=step_s, peak_bandwidth_bps=self.hardware.peak_bandwidth_gbs * 1e9,
            peak_flops=self.hardware.peak_flops_for(self.settings.dtype) or float("nan"), t_s=time.monotonic(),
            settings_label=self.settings.label, draft_tokens=len(guesses), accepted_tokens=accepted,
            captured=graph_kv_len is not None)
        return out, metrics


class _Reply:
    """One reply's accounting, whichever path runs its steps: the ids so far, the text, and the
    figures its DoneEvent reports."""

    def __init__(self, ids: list[int], budget: int, stream, eos: frozenset):
        self.ids = ids
        self.n_prompt = len(ids)
        self.budget = budget
        self.stream = stream
        self.eos = eos
        self.parts: list[str] = []
        self.n_new = 0
        self.t_start = time.perf_counter()
        self.ttft_s = 0.0
        self.decode_s = 0.0
        self.n_cached = 0
        self.reason = ""
        self.batched_from_start = False
        self.seen = 0  # the batch request's output ids already streamed
        self.oracle: Oracle | None = None  # speculate="oracle": the reply's guesses, computed beforehand
        self.masked: tuple[int, ...] = ()  # token ids never sampled (keep-decoding's special tokens)

    def end_reason(self, stopped: bool, max_context: int) -> str:
        if self.n_new >= self.budget:
            return "max_tokens"
        if stopped:
            return "stopped"
        if len(self.ids) >= max_context:
            return "context_full"
        return ""

    def add_token(self, token: int, t_s: float, drafted: bool = False) -> TokenEvent | None:
        """Count a sampled token (`drafted`: a guess the target accepted); its TokenEvent, or None
        for the end-of-sequence token."""
        if self.n_new == 0:
            self.ttft_s = t_s - self.t_start
        self.n_new += 1
        self.ids.append(token)
        if token in self.eos:
            self.reason = "eos"
            return None
        piece = self.stream.feed(token)
        self.parts.append(piece)
        return TokenEvent(token, piece, self.n_new - 1, drafted)


def _elem_bytes(dtype: torch.dtype) -> int:
    return torch.tensor([], dtype=dtype).element_size()


class _Timer:
    """Wall time of a step: CUDA events on a GPU (the host clock would time only the launches)."""

    def __init__(self, device: str):
        self.cuda = device.startswith("cuda")

    def start(self):
        if self.cuda:
            self.begin = torch.cuda.Event(enable_timing=True)
            self.end = torch.cuda.Event(enable_timing=True)
            self.begin.record()
        else:
            self.t0 = time.perf_counter()

    def stop(self) -> float:
        if self.cuda:
            self.end.record()
            self.end.synchronize()
            return self.begin.elapsed_time(self.end) / 1e3
        return time.perf_counter() - self.t0

