"""`Engine`: one model on one device, streaming a reply as plain-data events; a small orchestrator
over parts that each do one job:

    transaction.py         SettingsTransaction: asked-for settings, the request ids they answer
    variants.py            ModelVariants: fp per dtype, quantised and draft models made in the background
    steps/plain.py         PlainSteps: a batch-1 step on the engine's own KV cache (also the verify step)
    steps/speculative.py   SpeculativeSteps: a draft source guesses, one plain step verifies
    steps/batched.py       BatchedSteps: the reply as one request of the batch, beside simulated users
    steps/reply.py         Reply (one reply's accounting), StepSetup (what a step runs with), StepRunner
    steps/timing.py        StepTimer (CUDA events on a GPU), StepCounter
    serving/lifecycle.py   BatchLifecycle: the batch server made, configured and dropped

The public surface (engine/host.py, engine/cli.py, the bench, the tests):
    Engine(model, device, dtype, max_context, progress, hardware, settings, messages, context)
        model: a name, path or `synthetic:SHAPE`, or LoadedWeights already in memory; context: its
        EngineContext (engine/context.py: kernel switches, caches, faults; None: a new one).
    generate(ids, max_new_tokens, ignore_eos), chat(text, ignore_eos) -> Iterator of TokenEvent,
        StepMetrics, DoneEvent, SettingsApplied/SettingsRefused and (in the batch) BatchStats.
    apply(settings, request_id)   any thread; EngineError (one line) for what cannot run; it takes
        effect at the next step boundary, or at take_settings(wait) between replies.
    stop()                        any thread: the reply in progress ends at its next step.
    serve_step()                  between replies: one step for the simulated users (settings.users > 0).
    reset(); messages (get/set)   the conversation; complete(text): a base model's raw continuation.
    settings, requested_settings, has_pending, weights_building, refusal(s), capabilities(),
        max_users, max_users_for(dtype), serving, model, model_for(s), max_context, kv_snapshot(),
        disable_graphs(reason).
    Attributes: device, cfg, tokenizer, loaded, hardware (may be replaced: the bench re-probes the peak),
        context, graphs, kernel_notes, progress, step_count, and kept by the parts but read and
        set here: cache, cached_ids (plain steps), user_workload, kv_pool_budget_bytes, on_request
        (the batch's lifecycle).
"""
from __future__ import annotations

import threading
from dataclasses import replace
from typing import Iterator

import torch

from engine.context import EngineContext
from engine.conversation import Conversation
from engine.events import (
    BatchStats,  # noqa: F401  (an event of chat() and generate() too)
    DoneEvent,
    SettingsApplied,
)
from engine.graphs import GraphDecoder
from engine.io.loader import LoadedWeights, load_model
from engine.hardware.roof import Roof
from engine.kv.cache import DEFAULT_BLOCK_SIZE
from engine.model import cpu_step
from engine.model.config import ModelConfig
from engine.model.transformer import Transformer
from engine.protocol import Capabilities
from engine.serving.lifecycle import BatchLifecycle
from engine.serving.server import think_range
from engine.settings import EngineError, PromptError, QuantError, Settings
from engine.steps.batched import BatchedSteps
from engine.steps.plain import PlainSteps
from engine.steps.reply import Reply, StepRunner, StepSetup, check_prompt_length, make_generator
from engine.steps.speculative import SpeculativeSteps
from engine.steps.timing import StepCounter, elem_bytes
from engine.transaction import SettingsTransaction, applied, refused
from engine.variants import DTYPES, ModelVariants

__all__ = ["DTYPES", "Engine"]


class _Part:
    """An attribute of `Engine` kept by one of its parts, read and written there."""

    def __init__(self, part: str, name: str):
        self.part, self.name = part, name

    def __get__(self, engine, owner=None):
        return self if engine is None else getattr(getattr(engine, self.part), self.name)

    def __set__(self, engine, value) -> None:
        setattr(getattr(engine, self.part), self.name, value)


class Engine:
    cache = _Part("plain", "cache")  # the batch-1 KV cache (None until a step needs one)
    cached_ids = _Part("plain", "cached_ids")  # token ids whose K/V are in `cache`
    step_count = _Part("counter", "value")
    user_workload = _Part("batch", "user_workload")  # what simulated users send (None: bundled prompts)
    kv_pool_budget_bytes = _Part("batch", "kv_pool_budget_bytes")  # the batch KV pool's (None: from the device)
    on_request = _Part("batch", "on_request")  # optional callback(event "submitted" | "finished", Request)
    progress = _Part("variants", "progress")  # loading and quantisation progress(fraction, message)
    loaded = _Part("variants", "loaded")

    def __init__(self, model: "str | LoadedWeights" = "default", device: str = "cpu", dtype: str = "fp32",
                 max_context: int | None = 4096, progress=None, hardware=None, settings: Settings | None = None,
                 messages=(), context: EngineContext | None = None):
        from engine.hardware.detect import detect_device

        self.context = context if context is not None else EngineContext()  # engine/context.py
        self.device = device
        if device == "cpu":
            # subnormal floats take a slow microcode path on x86: random and real weights produce
            # them in decode, and steps ran 10-30x slower at random until they were flushed to zero
            torch.set_flush_denormal(True)
        self.graphs = GraphDecoder(device, kernels=self.context.kernels)
        self.settings = self._normalised((settings or Settings(dtype=dtype)).validate(device))
        from engine.io.check import check_model
        check_model(model)  # a bad or unsupported file says so now, not after the bandwidth probe
        self.hardware = hardware or detect_device(device, progress=(lambda m: progress(0.0, m)) if progress else None,
                                                  context=self.context)
        self.model_spec = model if isinstance(model, str) else None  # what a draft "self"/"default" compares to
        if not isinstance(model, LoadedWeights):  # else already in memory (tests, the app's model cache)
            model = load_model(model, DTYPES[self.settings.dtype], device, progress, max_context)
        self.variants = ModelVariants(model, self.settings.dtype, device, self.context, progress)
        self.cfg: ModelConfig = model.cfg
        self.tokenizer = model.tokenizer
        self.conversation = Conversation(self.tokenizer, messages)
        self.transaction = SettingsTransaction()
        self._stop = threading.Event()
        self.kernel_notes: dict[str, str] = {}  # "field=value" -> a kernel fallback (Capabilities.notes)
        self.counter = StepCounter()
        self.plain = PlainSteps(self.cfg, device, self.graphs, self.counter,
                                on_capture_failed=lambda: self.transaction.drop_capture(self.settings))
        self.speculative = SpeculativeSteps(self.plain, self.counter, self.max_context)
        # batched serving (engine/serving/lifecycle.py): made when users > 0, dropped when they are gone
        self.batch = BatchLifecycle(self.cfg, self.tokenizer, device, self.hardware.memory_total_bytes,
                                    think_range(self.context.options.user_think_s),
                                    prefix_cache=self.context.options.prefix_cache)
        self.batched = BatchedSteps(self.batch, self.counter, self.max_context, self.plain)
        self.batch.on_end = lambda ids, k, v: self.plain.take_over(ids, k, v, self.settings.kv_layout,
                                                                   self.model.dtype)
        self._reply_active = False  # a reply is streaming: serve_step() leaves the batch to it
        refusal = self.refusal(self.settings)
        if refusal:
            raise EngineError(refusal)
        self.variants.request(self.settings)  # quantised or speculating from the start: make what they need now
        self.speculative.use_draft(self.variants.wait(self.settings), self._setup())
        # the conversation's KV cache now, not in the first reply's time to first token (the default
        # model's 4,096 positions: ~190 MB written with zeros, ~0.2 s on a 2-core CPU)
        try:
            self.plain.prepare(self.settings.kv_layout, self.model.dtype)
        except (MemoryError, RuntimeError):  # (no room for it now: the first reply asks again, and says why not)
            pass

    @property
    def graphs(self) -> GraphDecoder:
        return self._graphs

    @graphs.setter
    def graphs(self, decoder: GraphDecoder) -> None:
        """The captured step's decoder; the plain steps take a replacement too (the overhead sweep
        gives a CPU engine a compiled step: it measured an eager one while they kept the first)."""
        self._graphs = decoder
        if "plain" in self.__dict__:
            self.plain.graphs = decoder

    # ---- control (thread-safe) ---------------------------------------------------------
    def apply(self, settings: Settings, request_id: int = 0) -> None:
        """Ask for `settings` from the next step on. Raises EngineError (one line) for settings
        this model or device cannot run; a refusal changes nothing. Quantised weights not made yet
        are made in a background thread and the switch waits for them (a reply keeps streaming)."""
        settings = self._normalised(settings.validate(self.device))
        refusal = self.refusal(settings)
        if refusal:
            raise EngineError(refusal)
        self.variants.request(settings)
        self.transaction.ask(settings, request_id)

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

    @property
    def requested_settings(self) -> Settings:
        """What the engine will run once pending changes are taken: the base a change is laid over."""
        return self.transaction.requested(self.settings)

    @property
    def has_pending(self) -> bool:
        return self.transaction.has_pending

    def refusal(self, settings: Settings) -> str:
        return self.capabilities().refusal(settings)

    def capabilities(self) -> Capabilities:
        """What this model on this device can take; the front end disables the rest, with why."""
        dtypes = [d for d in DTYPES if d != "fp16" or self.device != "cpu"]
        return Capabilities.for_model(self.cfg, self.device, {d: self.max_users_for(d) for d in dtypes},
                                      self.kernel_notes, captured_step=self.graphs.kind,
                                      captured_refusal=self.graphs.refusal,
                                      decode_path=cpu_step.path_line(self.model) if self.device == "cpu" else "")

    @property
    def weights_building(self) -> tuple[str, float] | None:
        """(label, fraction done) while quantised weights are being made, else None."""
        return self.variants.weights_building

    def stop(self) -> None:
        """End the reply in progress (its request leaves the batch; simulated users keep going)."""
        self._stop.set()

    def take_settings(self, wait: bool = False) -> list:
        """Switch to the pending settings now (call between steps, on the engine's thread): returns
        [SettingsApplied] (also for a change that turned out to change nothing, so every request
        is answered), [SettingsRefused, ...] when its weights could not be made, or [] when there is
        nothing pending or its weights are still being made (unless `wait`)."""
        taken = self.transaction.take(lambda new: wait or self.variants.ready(new))
        if taken is None:
            return []  # nothing pending, or not ready: keep streaming as is
        new, ids = taken
        old = self.settings
        try:
            draft = self.variants.wait(new)
            if new.dtype != old.dtype:
                self.variants.fp(new.dtype)
                self.plain.astype(DTYPES[new.dtype])  # keep the conversation: the cached K/V change precision
        except (QuantError, EngineError, MemoryError, RuntimeError, OSError) as error:
            return refused(ids, error, old)
        self.settings = new
        setup = self._setup()
        self.speculative.use_draft(draft, setup)
        if self.batch.server is not None:
            self.batch.sync(setup.model, new, setup.roof)
        return applied(old, new, ids, self.step_count)

    def _setup(self) -> StepSetup:
        """What the next step runs with: the settings, their model and the device's roof now."""
        return StepSetup(self.settings, self.model, self.roof)

    @property
    def roof(self) -> Roof:
        """The roofs every step is measured against (engine/hardware/roof.py), from `hardware`."""
        return Roof.of(self.hardware)

    # ---- simulated users ---------------------------------------------------------------------
    @property
    def max_users(self) -> int:
        """Simulated users the device's KV memory holds beside a full-length chat (0..64), for
        the current dtype: the app's slider bound."""
        return self.max_users_for(self.settings.dtype)

    def max_users_for(self, dtype: str) -> int:
        return self.batch.max_users(elem_bytes(DTYPES[dtype]))

    @property
    def serving(self) -> bool:
        """There is background work for serve_step(): users to serve, or their last requests."""
        return self.batch.server is not None or self.settings.users > 0

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
        setup = self._setup()
        self.batch.ensure(setup.model, setup.settings, setup.roof)
        metrics, stats = self.batch.step(self.step_count)
        if metrics is not None:
            self.counter.advance()
            events.append(metrics)
        if stats is not None:
            events.append(stats)
        self.batch.end_if_done(self.settings)
        return events

    # ---- models ------------------------------------------------------------------------------
    @property
    def model(self) -> Transformer:
        return self.variants.current(self.settings)

    def model_for(self, settings: Settings) -> Transformer:
        """The model `settings` would run, made now if need be (quality tables, the bench)."""
        return self.variants.model_for(settings)

    @property
    def max_context(self) -> int:
        return self.cfg.max_seq_len

    def kv_snapshot(self):
        """The KV cache's memory as plain data (engine/kv/blocks.py KVCacheSnapshot) for the app's
        panel: cells per block, owners, fill, reserved vs used bytes. Call between steps."""
        from engine.kv.blocks import KVCacheSnapshot
        if self.batch.server is not None and self.settings.users:  # batched serving: the shared block pool
            return self.batch.server.kv_snapshot()
        layout = self.settings.kv_layout
        if layout == "off" or self.cache is None or self.cache.layout != layout:
            bytes_per_token = self.cfg.kv_bytes_per_token_per_elem * elem_bytes(self.model.dtype)
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
        self.plain.reset()
        self.speculative.reset()
        if self.batch.server is not None:
            self.batch.server.runner.scheduler.drop_retained()

    def chat(self, user_text: str, ignore_eos: bool = False) -> Iterator:
        """One turn of the conversation; it is kept once the reply has run (finished or stopped).
        ignore_eos: the reply runs to its token budget or the context's end, in prose: the end of
        turn and every other special token are never sampled (else the model writes the template's
        next turns, role names and all, into its reply)."""
        ids = self.conversation.prompt_ids(user_text)
        check_prompt_length(len(ids), self.max_context)
        done = None
        masked = self.conversation.special_ids() if ignore_eos else frozenset()
        for event in self.generate(ids, ignore_eos=ignore_eos, masked_ids=masked):
            if isinstance(event, DoneEvent):
                done = event
            yield event
        self.conversation.add_turn(user_text, done.text if done else "")

    def complete(self, text: str, ignore_eos: bool = False) -> Iterator:
        """`text` continued exactly as written: no chat template and no conversation kept, BOS as
        the tokenizer's file says (a base model's use: `membound chat --raw`)."""
        if not text or not text.strip():
            raise PromptError("empty prompt: type something to complete")
        ids = self.tokenizer.encode(text)
        check_prompt_length(len(ids), self.max_context)
        yield from self.generate(ids, ignore_eos=ignore_eos)

    # ---- generation: one reply loop, each step plain (batch 1) or in the batch -----------------
    def generate(self, prompt_ids: list[int], max_new_tokens: int | None = None,
                 ignore_eos: bool = False, masked_ids: frozenset[int] = frozenset()) -> Iterator:
        """Stream a reply to `prompt_ids`, reusing whatever prefix of them is already cached;
        `masked_ids` are never sampled (their logits are -inf on every path: plain, verify, batched)."""
        if not prompt_ids:
            raise PromptError("empty prompt: nothing to generate from")
        check_prompt_length(len(prompt_ids), self.max_context)
        self._stop.clear()
        yield from self.take_settings(wait=True)  # a change made between replies runs from the first step
        eos = frozenset() if ignore_eos else frozenset(self.tokenizer.eos_ids)
        reply = Reply(list(prompt_ids), max_new_tokens or self.settings.max_new_tokens,
                      self.tokenizer.stream(skip_special_tokens=True), eos)
        reply.masked = tuple(sorted(masked_ids))
        gen = make_generator(self.settings.sampling.seed, self.device)
        if self.settings.speculate == "oracle":  # its guesses are computed before the reply's first step
            reply.oracle = self.speculative.oracle(reply, self._setup())
        self._reply_active = True
        try:
            while True:
                for event in self.take_settings():
                    yield event
                    if isinstance(event, SettingsApplied) and event.settings.sampling.seed is not None \
                            and any("seed" in change for change in event.changes):
                        gen = make_generator(self.settings.sampling.seed, self.device)
                    if reply.request is not None and isinstance(event, SettingsApplied):
                        self.batch.server.set_person_sampling(self.settings.sampling, gen)
                setup = self._setup()
                if reply.request is None:
                    reply.reason = reply.reason or reply.end_reason(self._stop.is_set(), self.max_context)
                    if reply.reason:
                        break
                    if self.settings.users > 0:  # users are on (or joined mid-reply): the rest runs batched
                        self.batched.submit(reply, gen, setup)
                if reply.request is not None:
                    if self._stop.is_set():
                        self.batch.server.cancel(reply.request.request_id)
                        break
                    if reply.request.is_finished:
                        break
                yield from self._runner(reply).step(reply, gen, setup)
        finally:
            self._reply_active = False
            if reply.request is not None and self.batch.server is not None:
                self.batch.server.release_person()  # cancels the request if the reply was abandoned mid-way
        yield from reply.closing_events()

    def _runner(self, reply: Reply) -> StepRunner:
        """Which kind of step the reply's next one is: in the batch, speculative, or plain."""
        if reply.request is not None:
            return self.batched
        if self.settings.speculate != "off" and reply.n_new > 0:
            return self.speculative
        return self.plain
