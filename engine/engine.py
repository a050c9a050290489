"""`Engine`: owns the model, its KV cache and the conversation; streams events.

`chat(text)` and `generate(ids)` are generators of plain-data events (TokenEvent,
StepMetrics, DoneEvent, SettingsApplied; BatchStats while simulated users are served).
`apply(settings)` and `stop()` may be called from another thread; they take effect at the next
step boundary. With `settings.users > 0` the reply runs as one request of a batch beside the
simulated users (engine/serving/server.py), and `serve_step()` serves them between replies."""
from __future__ import annotations

import itertools
import threading
import time
from dataclasses import replace
from typing import Iterator

import torch

from engine.events import (
    BatchStats,  # noqa: F401  (an event of chat() and generate() too)
    DoneEvent,
    SettingsApplied,
    TokenEvent,
)
from engine.io.loader import LoadedWeights, load_model
from engine.kv.cache import DEFAULT_BLOCK_SIZE, ContiguousKVCache, PagedKVCache
from engine.metrics import StepMetrics, step_cost
from engine.model.config import ModelConfig
from engine.model.quant import QuantisedModels
from engine.model.sampling import sample
from engine.model.transformer import Transformer
from engine.protocol import Capabilities
from engine.serving.scheduler import Request, RequestState, common_prefix
from engine.serving.server import BatchServer, kv_budget_bytes, per_user_tokens, pool_size, user_workload
from engine.settings import EngineError, PromptError, QuantError, Settings, check_weights, weights_label

DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}


class Engine:
    def __init__(self, model: "str | LoadedWeights" = "default", device: str = "cpu", dtype: str = "fp32",
                 max_context: int | None = 4096, progress=None, hardware=None, settings: Settings | None = None):
        from engine.hardware.detect import detect_device

        self.device = device
        if device == "cpu":
            # subnormal floats take a slow microcode path on x86: random and real weights produce
            # them in decode, and steps ran 10-30x slower at random until they were flushed to zero
            torch.set_flush_denormal(True)
        self.settings = (settings or Settings(dtype=dtype)).validate(device)
        if settings is None:
            self.settings = replace(self.settings, dtype=dtype)
        self.hardware = hardware or detect_device(device, progress=(lambda m: progress(0.0, m)) if progress else None)
        if isinstance(model, LoadedWeights):  # already in memory (tests, the app's model cache)
            self.loaded = model
        else:
            self.loaded = load_model(model, DTYPES[self.settings.dtype], device, progress, max_context)
        self.cfg: ModelConfig = self.loaded.cfg
        self.tokenizer = self.loaded.tokenizer
        self._models: dict[str, Transformer] = {self.settings.dtype: Transformer(self.cfg, self.loaded.weights)}
        self.cache: ContiguousKVCache | PagedKVCache | None = None
        self.cached_ids: list[int] = []  # token ids whose K/V are in self.cache
        self.messages: list[dict[str, str]] = []
        self._pending: Settings | None = None
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self.step_count = 0
        self._generator = None
        self._graph_steps: dict = {}
        self._graph_failed = False
        self.progress = progress  # also reports quantisation, from its background thread
        self._quantised = QuantisedModels()
        if self.settings.weights_key is not None:  # quantised from the start: make the copy now
            self._request_weights(self.settings)
            self._quantised.wait(self.settings.weights_key)
        # batched serving (engine/serving/server.py): made when users > 0, dropped when they are gone
        self._server: BatchServer | None = None
        self._reply_active = False  # a reply is streaming: serve_step() leaves the batch to it
        self._person_ids = itertools.count(1)  # the person's requests; users' ids start far above
        self._next_user_id = 1_000_000
        self.kv_pool_budget_bytes: int | None = None  # the batch KV pool's budget (None: from the device)
        self.user_workload = None  # engine.load.Workload the simulated users send (None: bundled prompts)
        self.on_request = None  # optional callback(event "submitted" | "finished", Request): accounting
        if self.settings.users and self.settings.users > self.max_users:
            raise EngineError(self._too_many_users(self.settings))

    # ---- control (thread-safe) ---------------------------------------------------------
    def apply(self, settings: Settings) -> None:
        """Quantised weights not made yet are made in a background thread; the switch happens
        at the first step boundary after they are ready (a reply keeps streaming meanwhile)."""
        settings.validate(self.device)
        if settings.users and settings.users > self.max_users_for(settings.dtype):
            raise EngineError(self._too_many_users(settings))
        self._request_weights(settings)
        with self._lock:
            self._pending = settings

    def _request_weights(self, settings: Settings) -> None:
        if settings.weights_key is None:
            return
        try:
            check_weights(self.cfg, settings.weights, settings.group_size)
            self._quantised.start(settings.weights_key, lambda: self._fp_model(settings.dtype), self.progress)
        except QuantError as e:
            raise EngineError(str(e)) from None

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

    def capabilities(self) -> Capabilities:
        """What this model on this device can take (the front end disables the rest, with why)."""
        dtypes = [d for d in DTYPES if d != "fp16" or self.device != "cpu"]
        return Capabilities.for_model(self.cfg, self.device, {d: self.max_users_for(d) for d in dtypes})

    def _pool_budget(self) -> int:
        if self.kv_pool_budget_bytes is None:  # measured once: the pool itself then takes free memory
            self.kv_pool_budget_bytes = kv_budget_bytes(self.device, self.hardware.memory_total_bytes)
        return self.kv_pool_budget_bytes

    def _too_many_users(self, settings: Settings) -> str:
        most = self.max_users_for(settings.dtype)
        return (f"{settings.users} simulated users need more KV cache than this device's memory allows "
                f"({most} at most with {settings.dtype})")

    def _user_workload(self):
        if self.user_workload is None:
            self.user_workload = user_workload(self.tokenizer, self.max_context)
        return self.user_workload

    @property
    def serving(self) -> bool:
        """There is background work for serve_step(): users to serve, or their last requests."""
        pending = self._pending
        return self._server is not None or self.settings.users > 0 or (pending is not None and pending.users > 0)

    def serve_step(self) -> list:
        """One batched step for the simulated users between the person's replies: pending settings
        first ([SettingsApplied]), then [StepMetrics, BatchStats] for a step that ran, a lone
        BatchStats (tokens 0) at most 4 times a second while every user is thinking, or [] when
        there is nothing to do (no users; a reply in progress). One step: never blocks long. Cheap
        with no users: a couple of attribute reads. Call it from the thread that runs chat()."""
        if self._reply_active:
            return []
        if self._server is None and not self.settings.users:
            pending = self._pending  # one reference read; taken under the lock below
            if pending is None or not pending.users:
                return []  # without users, a change waits to be announced by the next reply, as before
        events: list = []
        changed = self._take_pending()
        if changed is not None:
            events.append(changed)
        if self._server is None:
            if not self.settings.users:
                return events
            self._ensure_server()
        elif changed is not None:
            self._sync_server()
        server = self._server
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

    def reset(self) -> None:
        """A new conversation: forget the messages and the cached context."""
        self.messages = []
        self.cached_ids = []
        if self.cache is not None:
            self.cache.truncate(0)
        if self._server is not None:
            self._server.runner.scheduler.drop_retained()

    # ---- chat ----------------------------------------------------------------------------
    def chat(self, user_text: str) -> Iterator:
        """One turn: the whole conversation is rendered with the model's template; the part
        already in the KV cache is not prefilled again."""
        if not user_text or not user_text.strip():
            raise PromptError("empty prompt: type something to send")
        messages = self.messages + [{"role": "user", "content": user_text}]
        ids = self.tokenizer.encode_chat(messages, add_generation_prompt=True)
        self._check_prompt_length(len(ids))
        self.messages = messages
        done = None
        for event in self.generate(ids):
            if isinstance(event, DoneEvent):
                done = event
            yield event
        self.messages = self.messages + [{"role": "assistant", "content": done.text if done else ""}]

    def _check_prompt_length(self, n: int) -> None:
        if n + 1 > self.max_context:
            raise PromptError(f"prompt is {n} tokens, but the context window is {self.max_context} "
                              "(start a new chat or shorten the prompt)")

    # ---- generation ----------------------------------------------------------------------
    def generate(self, prompt_ids: list[int], max_new_tokens: int | None = None,
                 ignore_eos: bool = False) -> Iterator:
        """Stream a reply to `prompt_ids`, reusing whatever prefix of them is already cached."""
        if not prompt_ids:
            raise PromptError("empty prompt: nothing to generate from")
        self._check_prompt_length(len(prompt_ids))
        self._stop.clear()
        applied = self._take_pending()  # a change made between replies is announced too
        if applied is not None:
            yield applied
        budget = max_new_tokens or self.settings.max_new_tokens
        gen = self._make_generator()
        ids = list(prompt_ids)
        n_prompt = len(ids)
        stream = self._stream_decoder()
        text_parts: list[str] = []
        t_start = time.perf_counter()
        ttft = 0.0
        decode_s = 0.0
        reason = "max_tokens"
        n_new = 0
        n_cached = 0
        batched = self.settings.users > 0
        while not batched:
            if n_new >= budget:
                reason = "max_tokens"
                break
            if self._stop.is_set():
                reason = "stopped"
                break
            if len(ids) >= self.max_context:
                reason = "context_full"
                break
            changed = self._take_pending()
            if changed is not None:
                yield changed
                gen = self._make_generator() if changed.settings.sampling.seed is not None and \
                    "seed" in " ".join(changed.changes) else gen
                if self.settings.users > 0:  # users joined mid-reply: the rest of it runs in the batch
                    batched = True
                    break
            token, metrics = self._step(ids, produced=n_new, gen=gen)
            self.step_count += 1
            if n_new == 0:
                ttft = time.perf_counter() - t_start
                n_cached = metrics.context_len  # the first step ran the prompt after its cached prefix
            else:
                decode_s += metrics.step_s
            yield metrics
            n_new += 1
            if token in self.tokenizer.eos_ids and not ignore_eos:
                reason = "eos"
                ids.append(token)
                break
            ids.append(token)
            piece = stream.feed(token)
            text_parts.append(piece)
            yield TokenEvent(token, piece, n_new - 1)
        if batched:
            first = n_new == 0
            reason, n_new, ttft, decode_s, reused = yield from self._generate_batched(
                ids, n_new, budget, gen, stream, text_parts, t_start, ttft, decode_s, ignore_eos)
            n_cached = reused if first else n_cached
        tail = stream.flush()  # a character still held back (split UTF-8) comes out now
        if tail:
            text_parts.append(tail)
            yield TokenEvent(-1, tail, n_new)
        yield DoneEvent(reason, "".join(text_parts), n_prompt, n_new, ttft, decode_s, n_cached)

    def _generate_batched(self, ids: list[int], n_new: int, budget: int, gen, stream, text_parts: list[str],
                          t_start: float, ttft: float, decode_s: float, ignore_eos: bool):
        """The (rest of the) reply as one request in the batch beside the simulated users: the
        context so far is its prompt (prefilled into the paged pool), events as on the plain path
        plus a BatchStats per step. Returns (reason, n_new, ttft, decode_s, prompt tokens whose K/V
        it took over from the last turn) for the DoneEvent."""
        want, room = budget - n_new, self.max_context - len(ids)
        if want <= 0 or room <= 0:
            return ("max_tokens" if want <= 0 else "context_full"), n_new, ttft, decode_s, 0
        server = self._ensure_server()
        self._sync_server()
        eos = frozenset() if ignore_eos else frozenset(self.tokenizer.eos_ids)
        # retain_kv: the conversation's K/V stay in the pool after the reply, and the next turn
        # prefills only what is new (engine/serving/scheduler.py), as the plain path's cache does
        req = Request(next(self._person_ids), list(ids), min(want, room), eos, retain_kv=True)
        server.submit_person(req, self.settings.sampling, gen)
        self._reply_active = True
        seen = len(req.output_ids)
        try:
            while not req.is_finished:
                if self._stop.is_set():
                    server.cancel(req.request_id)
                    break
                changed = self._take_pending()
                if changed is not None:
                    yield changed
                    if changed.settings.sampling.seed is not None and "seed" in " ".join(changed.changes):
                        gen = self._make_generator()
                    server.set_person_sampling(self.settings.sampling, gen)
                    self._sync_server()
                first_out = n_new > 0
                metrics, stats = self._server_step()
                step_end = time.perf_counter()
                if metrics is None:  # nothing could run (cannot last: the running requests finish)
                    time.sleep(0.001)
                    continue
                self.step_count += 1
                if first_out:
                    decode_s += metrics.step_s  # every step from the first token on, pre-empted ones too
                yield metrics
                yield stats
                for token in req.output_ids[seen:]:
                    if n_new == 0:
                        ttft = step_end - t_start
                    n_new += 1
                    ids.append(token)
                    if token in eos:
                        break
                    piece = stream.feed(token)
                    text_parts.append(piece)
                    yield TokenEvent(token, piece, n_new - 1)
                seen = len(req.output_ids)
        finally:
            self._reply_active = False
            server.release_person()  # cancels the request if the reply was abandoned mid-way
        if req.state is RequestState.CANCELLED:
            reason = "stopped"
        elif req.finish_reason == "eos":
            reason = "eos"
        else:
            reason = "max_tokens" if n_new >= budget else "context_full"
        return reason, n_new, ttft, decode_s, req.num_reused_tokens  # (0 if it was pre-empted: recomputed)

    def _stream_decoder(self):
        return self.tokenizer.stream(skip_special_tokens=True)

    def _make_generator(self):
        seed = self.settings.sampling.seed
        if seed is None:
            return None
        return torch.Generator(device=self.device).manual_seed(seed)

    def _take_pending(self, initial: bool = False) -> SettingsApplied | None:
        with self._lock:
            new, self._pending = self._pending, None
        if new is None or new == self.settings:
            return None
        key = new.weights_key
        if key is not None and self._quantised.get(key) is None:
            if not initial and self.weights_building is not None:  # not ready: keep streaming as is
                with self._lock:
                    self._pending = self._pending or new
                return None
            try:
                self._quantised.wait(key)
            except QuantError as e:
                raise EngineError(str(e)) from None
        old = self.settings
        changes = []
        if new.dtype != old.dtype:
            self._switch_dtype(new.dtype)
            changes.append(new.dtype)
        if new.weights_key != old.weights_key and (new.weights, new.group_size) != (old.weights, old.group_size):
            changes.append(weights_label(new.weights, new.group_size))
        if new.kv_layout != old.kv_layout:  # a new layout starts empty: the next step re-prefills
            if new.kv_layout == "off" or (old.kv_layout == "off" and new.kv_layout == "contiguous"):
                changes.append(f"kv cache {'on' if new.kv_cache else 'off'}")
            else:
                changes.append(f"kv {new.kv_layout}")
            if new.users:
                changes[-1] += " (for the chat alone: batching stays paged)"
        if new.users != old.users:
            changes.append(f"{new.users} simulated users" if new.users else "simulated users off")
            if new.users and not old.users and new.kv_layout != "paged":
                changes.append("kv paged for batching")
        if new.policy != old.policy:
            changes.append(f"{new.policy} batching")
        if new.attention != old.attention:
            changes.append(f"{new.attention} attention")
        if new.max_new_tokens != old.max_new_tokens:
            changes.append(f"max tokens {new.max_new_tokens}")
        if new.sampling != old.sampling:
            s = new.sampling
            changes.append("greedy" if s.is_greedy else f"T={s.temperature:g} top-p={s.top_p:g}"
                           + (f" top-k={s.top_k}" if s.top_k else "") + (f" seed={s.seed}" if s.seed is not None else ""))
        self.settings = new
        return SettingsApplied(new, tuple(changes), self.step_count, time.monotonic())

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

    # ---- one step ------------------------------------------------------------------------
    @torch.inference_mode()
    def _step(self, ids: list[int], produced: int, gen) -> tuple[int, StepMetrics]:
        model = self.model
        use_cache = self.settings.kv_cache
        layout = self.settings.kv_layout
        attention = self.settings.attention
        if use_cache:
            if self.cache is None or self.cache.layout != layout:  # a new layout: prefill into it
                self.cache = self._new_cache(model.dtype)
                self.cached_ids = []
            common = common_prefix(self.cached_ids, ids)
            start = min(common, len(ids) - 1)  # at least one token must run to get logits
            self.cache.truncate(start)
            feed = ids[start:]
        else:
            start = 0
            feed = ids
        phase = "prefill" if produced == 0 else "decode"
        tokens = torch.tensor([feed], dtype=torch.long, device=self.device)
        graph_kv_len = self._graph_bucket(start) if layout == "contiguous" and len(feed) == 1 else None
        timer = _Timer(self.device)
        timer.start()
        if graph_kv_len is not None:
            logits = self._decode_graph(model, tokens, start, graph_kv_len)
        else:
            logits = model(tokens, start_pos=start, cache=self.cache if use_cache else None, attention=attention)
        token = sample(logits[:, -1], self.settings.sampling, gen)
        token_id = int(token.item())
        step_s = timer.stop()
        if graph_kv_len is not None and self._graph_failed:  # fell back to eager this step
            graph_kv_len = None
        if use_cache:
            self.cached_ids = list(ids)
        cost = step_cost(self.cfg, batch_size=1, new_tokens=len(feed), context_len=start,
                         weight_bytes=model.linear_weight_bytes(), kv_elem_bytes=_elem_bytes(model.dtype),
                         act_elem_bytes=_elem_bytes(model.dtype), kv_cache=use_cache,
                         kv_read_tokens=graph_kv_len, attention=attention, kv_layout=layout,
                         block_size=getattr(self.cache, "block_size", DEFAULT_BLOCK_SIZE))
        metrics = StepMetrics.from_cost(
            cost, step=self.step_count, phase=phase, batch_size=1, new_tokens=len(feed), tokens_out=1,
            context_len=start, step_s=step_s, peak_bandwidth_bps=self.hardware.peak_bandwidth_gbs * 1e9,
            peak_flops=self.hardware.peak_flops_for(self.settings.dtype) or float("nan"), t_s=time.monotonic(),
            settings_label=self.settings.label)
        return token_id, metrics


    # ---- CUDA graphs ----------------------------------------------------------------------
    GRAPH_BUCKET = 1024  # attention in a captured step reads a multiple of this many positions

    def _graph_bucket(self, start: int) -> int | None:
        if not (self.device.startswith("cuda") and self.settings.cuda_graphs and not self._graph_failed):
            return None
        bucket = -(-(start + 1) // self.GRAPH_BUCKET) * self.GRAPH_BUCKET
        return min(bucket, self.cache.max_len)

    def _decode_graph(self, model: Transformer, tokens, start: int, kv_len: int):
        """The decode step through torch.compile(mode="reduce-overhead"): one graph replay per
        token instead of hundreds of kernel launches. Any failure falls back to eager for good."""
        key = (id(model), id(self.cache))
        try:
            if key not in self._graph_steps:
                import torch._dynamo
                torch._dynamo.config.cache_size_limit = max(torch._dynamo.config.cache_size_limit, 64)
                # the cache is written in place by the graph: its address must stay fixed
                torch._dynamo.mark_static_address(self.cache.k)
                torch._dynamo.mark_static_address(self.cache.v)
                self._graph_steps = {key: torch.compile(model.forward_decode_static, mode="reduce-overhead",
                                                        fullgraph=True, dynamic=False)}
            pos = torch.tensor([start], dtype=torch.long, device=self.device)
            logits = self._graph_steps[key](tokens, pos, self.cache, kv_len, self.settings.attention).clone()
            self.cache.length = start + 1
            return logits
        except Exception as e:  # a compiler problem must not end the conversation
            import warnings
            warnings.warn(f"CUDA graph decode unavailable, running eager: {type(e).__name__}: {e}")
            self._graph_failed = True
            return model(tokens, start_pos=start, cache=self.cache, attention=self.settings.attention)


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
