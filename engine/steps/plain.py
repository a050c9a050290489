"""The plain step: batch 1 on the engine's own KV cache (contiguous or paged), eager or captured;
also the verify step of speculative decoding (the context's tail plus the draft's guesses)."""
from __future__ import annotations

import time
from typing import Callable, Iterator

import torch

from engine.graphs import GraphDecoder
from engine.kv.cache import DEFAULT_BLOCK_SIZE, ContiguousKVCache, PagedKVCache
from engine.metrics import StepMetrics, calls_cost, measured, step_cost, weight_rows
from engine.model import cpu_step
from engine.model.config import ModelConfig
from engine.model.sampling import mask_tokens, row_sampled, sample, sample_row, uniform
from engine.serving.scheduler import common_prefix
from engine.serving.speculative import Draft, greedy_accept, verify
from engine.steps.reply import Reply, StepSetup
from engine.steps.timing import StepCounter, StepTimer, elem_bytes


class PlainSteps:
    """Owns the batch-1 KV cache (`cache`) and the ids whose K/V it holds (`cached_ids`); a later
    reply reuses whatever prefix of its context is cached."""

    def __init__(self, cfg: ModelConfig, device: str, graphs: GraphDecoder, counter: StepCounter,
                 on_capture_failed: Callable[[], None]):
        self.cfg = cfg
        self.device = device
        self.graphs = graphs
        self.counter = counter
        self.on_capture_failed = on_capture_failed  # a capture failed and decode went eager for good
        self.cache: ContiguousKVCache | PagedKVCache | None = None
        self.cached_ids: list[int] = []  # token ids whose K/V are in self.cache

    def step(self, reply: Reply, gen, setup: StepSetup) -> Iterator:
        (token,), metrics = self.run(reply.ids, produced=reply.n_new, gen=gen, setup=setup, masked=reply.masked)
        t_end = time.perf_counter()
        self.counter.advance()
        if reply.n_new == 0:
            reply.n_cached = metrics.context_len  # the first step ran the prompt after its cached prefix
        else:
            reply.decode_s += metrics.step_s
        yield metrics
        event = reply.add_token(token, t_end)
        if event is not None:
            yield event

    def reset(self) -> None:
        """Forget the cached context (a new conversation)."""
        self.cached_ids = []
        if self.cache is not None:
            self.cache.truncate(0)

    @torch.inference_mode()  # the cache's tensors are inference tensors (made in a step)
    def take_over(self, ids: list[int], k: torch.Tensor, v: torch.Tensor, layout: str, dtype: torch.dtype) -> None:
        """The conversation's K/V (L, n_kv, n, hd) for `ids` computed elsewhere (the batch's retained
        blocks, when the users have left) become this cache's context, if it holds less of `ids`:
        the next reply prefills only what is new, as it would have in the batch."""
        n = k.shape[2]
        if layout == "off" or common_prefix(self.cached_ids, ids) >= n:
            return
        if self.cache is None or self.cache.layout != layout:
            self.cache = self.new_cache(layout, dtype)
        self.cache.load(k, v)
        self.cached_ids = list(ids[:n])

    def astype(self, dtype: torch.dtype) -> None:
        """Keep the conversation across a precision switch: the cached K/V change precision."""
        if self.cache is not None:
            self.cache = self.cache.astype(dtype)

    def prepare(self, layout: str, dtype: torch.dtype) -> None:
        """The cache a reply in `layout` will use ("off": none), made now if it is not there."""
        if layout != "off" and (self.cache is None or self.cache.layout != layout):
            self.cache = self.new_cache(layout, dtype)
            self.cached_ids = []

    def new_cache(self, layout: str, dtype: torch.dtype):
        """An empty cache in `layout`. Paged: a pool of blocks for one full-length sequence (the
        same bytes as the contiguous buffer), filled on demand."""
        if layout == "paged":
            blocks = -(-self.cfg.max_seq_len // DEFAULT_BLOCK_SIZE)
            return PagedKVCache(self.cfg, blocks, DEFAULT_BLOCK_SIZE, dtype, self.device)
        return ContiguousKVCache(self.cfg, 1, self.cfg.max_seq_len, dtype, self.device)

    def run(self, ids: list[int], produced: int, gen, setup: StepSetup, draft: Draft | None = None,
            masked: tuple[int, ...] = ()) -> tuple[list[int], StepMetrics]:
        """Run the context's uncached tail (and the draft's guesses, if any) through the model;
        returns the tokens it produced (one; or the accepted guesses and the target's own) and the
        step's figures. Rejected guesses leave the KV cache (contiguous: its length; paged: their
        blocks). `masked` token ids are never sampled."""
        if produced > 0 and self.device == "cpu":
            done = self._rows_in_cpp(ids, gen, setup, draft, masked)
            if done is not None:
                return done
        return self._run(ids, produced, gen, setup, draft, masked)

    def _rows_in_cpp(self, ids: list[int], gen, setup: StepSetup, draft: Draft | None,
                     masked: tuple[int, ...]) -> tuple[list[int], StepMetrics] | None:
        """A decode step of one new token, or a greedy verify step, on the contiguous cache in C++, its
        logits taken as numpy rows: after a step has streamed the weights through the caches each
        PyTorch operator costs 20-100 us (cpu_step.decode_token), and a greedy token here takes none
        (a verify step one: its logits' buffer). A sampled token: sampling.sample_row, its uniform number
        drawn before the step (the same stream). None where it does not apply (nothing has run, the
        generator is untouched): `_run` takes the step."""
        settings = setup.settings
        cache = self.cache
        if not settings.kv_cache or settings.kv_layout != "contiguous" or cache is None \
                or cache.layout != "contiguous" or self.graphs.active(settings.cuda_graphs) \
                or not row_sampled(settings.sampling) or draft is not None and not settings.sampling.is_greedy:
            return None
        guesses = draft.tokens if draft is not None else []
        start = min(common_prefix(self.cached_ids, ids), len(ids) - 1)
        if draft is None and start != len(ids) - 1:  # more than one token is new: a prefill-shaped step
            return None
        plan = cpu_step.token_plan(setup.model, cache, settings.attention)
        if plan is None:
            return None
        feed = ids[start:] + guesses
        cache.truncate(start)
        timer = StepTimer(self.device)
        timer.start()
        if len(feed) == 1:
            u = uniform(gen, settings.sampling)  # (drawn before the step, while the caches are warm)
            rows = cpu_step.decode_token(setup.model, plan, feed[0], start, cache, settings.attention)[None]
        else:
            rows = cpu_step.decode_rows(setup.model, plan, feed, start, cache, settings.attention, len(guesses) + 1)
            if rows is None:
                return None
        if masked:
            rows[:, list(masked)] = float("-inf")  # (mask_tokens' rule)
        if draft is None:
            native = None if settings.sampling.is_greedy else cpu_step.sampler(setup.model)
            accepted, out = 0, [sample_row(rows[0], settings.sampling, u, native)]
        else:  # (greedy: the argmax of each row, greedy's rule)
            accepted, out = greedy_accept(rows.argmax(axis=-1).tolist(), guesses)
        step_s = timer.stop() + (draft.search_s if draft is not None else 0.0)
        self.cached_ids = list(ids) + guesses[:accepted]
        cache.truncate(len(self.cached_ids))  # the rejected guesses' K/V go
        return out, self._measured(setup, start=start, new_tokens=len(feed), tokens_out=len(out), step_s=step_s,
                                   draft=draft, accepted=accepted, captured=False,
                                   products=cpu_step.products(setup.model))

    @torch.inference_mode()
    def _run(self, ids: list[int], produced: int, gen, setup: StepSetup, draft: Draft | None,
             masked: tuple[int, ...]) -> tuple[list[int], StepMetrics]:
        settings = setup.settings
        model = setup.model
        use_cache = settings.kv_cache
        layout = settings.kv_layout
        attention = settings.attention
        guesses = draft.tokens if draft is not None else []
        if use_cache:
            self.prepare(layout, model.dtype)  # (a new layout: prefill into it)
            common = common_prefix(self.cached_ids, ids)
            start = min(common, len(ids) - 1)  # at least one token must run to get logits
            self.cache.truncate(start)
            feed = ids[start:] + guesses
        else:
            start = 0
            feed = ids + guesses
        phase = "verify" if draft is not None else "prefill" if produced == 0 else "decode"
        tokens = torch.tensor([feed], dtype=torch.long, device=self.device)
        captured = use_cache and layout == "contiguous" and len(feed) == 1 and \
            self.graphs.active(settings.cuda_graphs)
        timer = StepTimer(self.device)
        timer.start()
        if captured:
            replays = self.graphs.replays
            logits = self.graphs.decode(model, self.cache, tokens, start, attention)
            if self.graphs.replays == replays:  # fell back to eager this step: it read only the context
                captured = False
                self.on_capture_failed()
        else:
            logits = model(tokens, start_pos=start, cache=self.cache if use_cache else None,
                           attention=attention, logits_rows=len(guesses) + 1)
        accepted = 0
        mask_tokens(logits, masked)
        native = cpu_step.sampler(model) if self.device == "cpu" and not settings.sampling.is_greedy else None
        if draft is None:
            out = [int(sample(logits[:, -1], settings.sampling, gen, native).item())]
        else:
            accepted, out = verify(logits[0], draft, settings.sampling, gen, native)
        step_s = timer.stop() + (draft.search_s if draft is not None else 0.0)
        if use_cache:
            self.cached_ids = list(ids) + guesses[:accepted]
            self.cache.truncate(len(self.cached_ids))  # the rejected guesses' K/V go (paged: their blocks)
        products = None if captured else cpu_step.products(model)  # the C++ step's (its compute roof's kinds)
        return out, self._measured(setup, start=start, new_tokens=len(feed), tokens_out=len(out), step_s=step_s,
                                   draft=draft, accepted=accepted, captured=captured, products=products, phase=phase)

    def _measured(self, setup: StepSetup, *, start: int, new_tokens: int, tokens_out: int, step_s: float,
                  draft: Draft | None, accepted: int, captured: bool, products: tuple[str, str] | None,
                  phase: str | None = None) -> StepMetrics:
        """The step's figures: its cost (what it moved and computed) against the roof, and its time; a
        verify step's count the draft model's step before it. phase: "verify" or "decode" by default."""
        settings = setup.settings
        model = setup.model
        guesses = len(draft.tokens) if draft is not None else 0
        phase = phase or ("verify" if draft is not None else "decode")
        cpp = products is not None  # the C++ step: each weight once, whatever its rows
        # a captured step without the flash kernel reads the whole cache buffer, masked (engine/graphs.py)
        kv_read_tokens = self.graphs.kv_read_tokens(model, start, self.cache.max_len, settings.attention) \
            if captured else None
        common = dict(kv_elem_bytes=elem_bytes(model.dtype), act_elem_bytes=elem_bytes(model.dtype),
                      kv_cache=settings.kv_cache, attention=settings.attention, kv_layout=settings.kv_layout,
                      block_size=getattr(self.cache, "block_size", DEFAULT_BLOCK_SIZE))
        calls = cpu_step.chunks(model) if cpp else ()
        if calls:  # a prompt in chunks: each call's weights and context
            cost = calls_cost(model, calls, context_len=start, logits_rows=guesses + 1, **common)
        else:
            cost = step_cost(self.cfg, batch_size=1, new_tokens=new_tokens, context_len=start,
                             weight_bytes=model.linear_weight_bytes(rows=weight_rows(new_tokens, cpp)),
                             logits_rows=guesses + 1, kv_read_tokens=kv_read_tokens, captured=captured, cpp_step=cpp,
                             **common)
        metrics = measured(
            cost, setup.roof, settings.dtype, products, step=self.counter.value, phase=phase, batch_size=1,
            new_tokens=new_tokens, tokens_out=tokens_out, context_len=start, step_s=step_s, t_s=time.monotonic(),
            settings_label=settings.label, draft_tokens=guesses, accepted_tokens=accepted,
            captured=captured)
        if draft is not None and draft.metrics is not None:  # the round's figures count the draft model's step
            metrics = metrics.with_draft(draft.metrics)
        return metrics
