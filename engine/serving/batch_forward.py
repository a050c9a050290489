"""One forward pass for a whole scheduler plan (engine/serving/scheduler.py): ragged sequences, each at
its own positions, K/V in a paged cache whose slots the scheduler has already allocated.

The step's tokens are packed into one row (1, N) so every weight is read once for the whole batch
(the point of batching: decode is a matrix-vector product per weight; a batch of B makes it
matrix-matrix). Only attention is per sequence: the decode rows together (on a GPU the Triton
paged kernel reads their block tables; on a CPU their blocks are gathered once per layer, padded
and masked by length), each prefill chunk on its own. On a CPU the matmuls of more than one row
take oneDNN's packed weights (engine/model/transformer.py: Linear)."""
from __future__ import annotations

import time

import torch

from engine.dispatch import record
from engine.kv.cache import PagedKV, PagedKVCache, PageLayout
from engine.hardware.roof import Roof
from engine.hardware.spec import dtype_name
from engine.metrics import KVCopy, measured, plan_cost, weight_rows
from engine.model import cpu_step
from engine.model.attention import attend
from engine.model.sampling import greedy
from engine.model.transformer import Transformer
from engine.serving.prefix_store import PrefixStore
from engine.serving.scheduler import Request, ScheduledSeq, Scheduler

PYTORCH_ROWS_LABEL = "PyTorch's batched step"  # decode rows through the forward below (GPU, or no C++ step)

# the decode rows' keys on a CPU: gathered block by block (True), or read through PagedKV as on a
# GPU (False: tests flip it to run the GPU's layout plumbing here)
CPU_GATHER_DECODE_KEYS = True


def forward_plan(model: Transformer, cache: PagedKVCache, seqs: tuple[ScheduledSeq, ...] | list[ScheduledSeq],
                 attention: str = "flash", moved: dict | None = None) -> tuple[list[int], torch.Tensor]:
    """Run every planned token; return (request ids that sample, their next-token logits
    (n, vocab) fp32), in plan order. The plan's block tables index `cache`'s pool: the scheduler
    that made it must run on `cache.manager`. `moved`, if given, is told what the step copied for the
    cost model (engine/metrics.py plan_cost): "kv_copy" (a KVCopy), "decode_width" (the padded width
    the decode rows' attention ran over, or None: each row over its own keys)."""
    if not seqs:
        return [], torch.empty(0, model.cfg.vocab_size)
    routed = cpu_step.plan_step(model, cache, seqs, attention)  # on a CPU: the whole plan in one C++ step
    if routed is not None:
        if moved is not None:  # it reads the pool in place and each weight once (engine/metrics.py weight_rows)
            moved["cpp_products"] = cpu_step.products(model)  # (the compute roof's kinds)
        return routed
    bs = cache.block_size
    # one-token rows first (decodes: attended together), then prefill chunks, each on its own
    decodes = [s for s in seqs if len(s.token_ids) == 1]
    prefills = [s for s in seqs if len(s.token_ids) > 1]
    if decodes:  # (the bench's path line: which step ran the decode rows)
        record("decode step", PYTORCH_ROWS_LABEL)
    packed = decodes + prefills
    device = model.device
    tokens = torch.tensor([t for s in packed for t in s.token_ids], device=device)[None]  # (1, N)
    positions = [s.start_pos + i for s in packed for i in range(len(s.token_ids))]
    if max(positions) >= model.cfg.max_seq_len:
        raise ValueError(f"context of {max(positions) + 1} tokens exceeds the model's {model.cfg.max_seq_len}")
    pos = torch.tensor(positions, device=device)
    slots = torch.tensor([_slot(s.block_table, p, bs) for s in packed
                          for p in range(s.start_pos, s.start_pos + len(s.token_ids))], device=device)
    # decode rows' keys: on a GPU through their block tables (the paged kernel reads the pool in
    # place); on a CPU gathered by one index_select per layer and tensor, its indices built once
    # for the step (PagedKV.dense()'s per-run copies into a zeroed buffer: ~40 ops a layer at batch 8)
    gather = _decode_gather(decodes, bs, cache.k.shape[1], cache.k.shape[2] // bs, device) \
        if decodes and device.type == "cpu" and CPU_GATHER_DECODE_KEYS else None
    decode_layout = _layout(decodes, bs) if decodes and gather is None else None
    prefill_layouts = [_layout([s], bs) for s in prefills]
    if moved is not None:
        moved.update(_kv_moved(decodes, prefill_layouts, gather, decode_layout, attention, device, bs,
                               paged_kernel_enabled(model.context)))

    x = model.embed_tokens(tokens)  # (1, N, dim)
    n_dec = len(decodes)
    # (N, rd) rows per layer: each token at its own position (Gemma 3's sliding layers: their own base)
    for i, (layer, (cos, sin)) in enumerate(zip(model.layers, model.rope_rows(pos))):
        options = layer.attend_options  # the layer's window, query scale, soft cap
        q, k, v = layer.qkv(x, cos, sin)  # q (1, H, N, hd); k, v (1, n_kv, N, hd)
        cache.k[i].index_copy_(1, slots, k[0])  # pool (n_kv, slots, hd)
        cache.v[i].index_copy_(1, slots, v[0])
        parts = []
        if n_dec:
            qd = q[0, :, :n_dec].transpose(0, 1)[:, :, None]  # (B_dec, H, 1, hd)
            if gather is not None:
                blocks, kv_lens, width = gather
                kd = _gather_blocks(cache.k[i], blocks, n_dec, width, bs)  # (B_dec, n_kv, S, hd)
                vd = _gather_blocks(cache.v[i], blocks, n_dec, width, bs)
                # padded keys past each row's length masked; the model's context: its engine's kernel switches
                yd = attend(qd, kd, vd, attention, kv_lens, context=model.context, **options)
            else:
                yd = attend(qd.contiguous(), PagedKV(cache.k[i], decode_layout), PagedKV(cache.v[i], decode_layout),
                            attention, context=model.context, **options)
            parts.append(yd[:, :, 0].transpose(0, 1)[None])  # (1, H, B_dec, hd)
        offset = n_dec
        for s, lay in zip(prefills, prefill_layouts):
            T = len(s.token_ids)
            parts.append(attend(q[:, :, offset:offset + T], PagedKV(cache.k[i], lay), PagedKV(cache.v[i], lay),
                                attention, context=model.context, **options))  # (1, H, T, hd)
            offset += T
        y = torch.cat(parts, dim=2) if len(parts) > 1 else parts[0]
        x = layer.out_and_ffn(x, y)

    # next-token logits only where a request samples (its chunk reaches its last token)
    ends, offset = {}, 0
    for s in packed:
        offset += len(s.token_ids)
        ends[s.request_id] = offset - 1
    ids = [s.request_id for s in seqs if s.samples]
    if not ids:
        return [], torch.empty(0, model.cfg.vocab_size, device=device)
    last = x[0, [ends[r] for r in ids]]  # (n, dim)
    return ids, model.logits(last[None])[0]


def _kv_moved(decodes, prefill_layouts, gather, decode_layout, attention: str, device, block_size: int,
              paged_kernel: bool) -> dict:
    """What forward_plan's attention copies out of the pool, per layer, as positions (the cost model
    charges them: engine/metrics.py KVCopy), and the width the decode rows' attention runs over."""
    copy, width = KVCopy(), None
    live = sum(s.start_pos for s in decodes)  # what the KV charge counts as read for the decode rows
    if gather is not None:  # whole blocks by index_select into a new buffer; attention reads `width` of it
        _, _, width = gather
        blocks = len(decodes) * -(-width // block_size)
        copy += KVCopy(read=blocks * block_size - live, written=blocks * block_size, read_back=len(decodes) * width)
    elif decode_layout is not None and len(decodes) > 1 and not (
            attention == "flash" and device.type == "cuda" and paged_kernel):  # PagedKV.dense()
        width = max(decode_layout.context_lens)
        copy += KVCopy(written=len(decodes) * width + sum(decode_layout.context_lens), read_back=len(decodes) * width)
    for layout in prefill_layouts:  # a chunk whose blocks are not consecutive: PagedKV.dense() too
        if len(layout.runs[0]) > 1:
            n = layout.context_lens[0]
            copy += KVCopy(written=2 * n, read_back=n)
    return {"kv_copy": copy, "decode_width": width}


def paged_kernel_enabled(context=None) -> bool:
    """The GPU's paged flash-decoding kernel reads the pool in place (engine/model/attention.py), unless
    `context`'s engine (None: the default) switched it off at load."""
    from engine.context import default_context
    from engine.model.attention import _kernels_available
    return _kernels_available() and (context or default_context()).kernels.enabled("paged")


def _slot(table, pos: int, block_size: int) -> int:
    return table[pos // block_size] * block_size + pos % block_size


def _decode_gather(seqs: list[ScheduledSeq], block_size: int, n_kv: int, num_blocks: int, device
                   ) -> tuple[torch.Tensor, torch.Tensor | None, int]:
    """Which rows of a layer's pool, viewed (n_kv * num_blocks, block_size * hd), hold every decode
    row's keys (this step's token included), padded to the longest row: (row index (B * n_kv *
    n_blocks,), kv_lens (B,) or None when every row is `width` long, width). Whole blocks by one
    index_select over dim 0: one index per position, or per block over dim 1, was 2-16x slower
    (2-core EPYC, batch 8: 3.4 ms a step against 5.9-6.9). Padding reads block 0; it is masked."""
    lens = [s.start_pos + 1 for s in seqs]
    width = max(lens)
    n_blocks = -(-width // block_size)
    blocks = torch.tensor([(list(s.block_table[:n_blocks]) + [0] * n_blocks)[:n_blocks] for s in seqs])  # (B, nb)
    rows = torch.arange(n_kv)[None, :, None] * num_blocks + blocks[:, None]  # (B, n_kv, nb): the copy comes
    # out in SDPA's (B, n_kv, S, hd) order (a transposed view of (n_kv, B, ...) cost SDPA ~1.4x)
    kv_lens = torch.tensor(lens, device=device) if min(lens) != width else None
    return rows.view(-1).to(device), kv_lens, width


def _gather_blocks(pool: torch.Tensor, rows: torch.Tensor, n_seqs: int, width: int, block_size: int) -> torch.Tensor:
    """pool (n_kv, slots, hd) -> (B, n_kv, width, hd): a copy of the sequences' blocks, in order."""
    n_kv, slots, hd = pool.shape
    out = pool.view(n_kv * (slots // block_size), block_size * hd).index_select(0, rows)  # (B * n_kv * nb, bs * hd)
    return out.view(n_seqs, n_kv, -1, hd)[:, :, :width]


def _layout(seqs: list[ScheduledSeq], block_size: int) -> PageLayout:
    """Where the rows' keys live once this step's tokens are written (their whole context)."""
    lens = [s.start_pos + len(s.token_ids) for s in seqs]
    tables = [list(s.block_table) for s in seqs]
    runs = []
    for table, n in zip(tables, lens):
        row: list[tuple[int, int]] = []
        for j, block in enumerate(table[: -(-n // block_size)]):
            take = min(block_size, n - j * block_size)
            if row and row[-1][0] + row[-1][1] == block * block_size:
                row[-1] = (row[-1][0], row[-1][1] + take)
            else:
                row.append((block * block_size, take))
        runs.append(row)
    return PageLayout(block_size=block_size, block_tables=tables, context_lens=lens, runs=runs, write_runs=[])


def plan_phase(seqs) -> str:
    """"decode" (every row one token, sampled), "prefill" (prompt chunks only) or "mixed" (both in
    one step: continuous batching's arrivals ride along with the running decodes)."""
    decodes = sum(not s.is_prefill for s in seqs)
    return "decode" if decodes == len(seqs) else "prefill" if decodes == 0 else "mixed"


class BatchRunner:
    """A model, a paged KV cache and a scheduler over it: `step()` schedules a plan, runs it as
    one forward, samples (greedy unless `sample` is given) and updates the scheduler.
    Returns (plan, {request_id: token}, StepMetrics or None for an empty plan)."""

    def __init__(self, model: Transformer, num_blocks: int, block_size: int = 16, *, max_batch_size: int = 8,
                 token_budget: int = 512, policy: str = "continuous", chunk_size: int | None = None,
                 attention: str = "flash", roof: Roof | None = None, peak_bandwidth_bps: float = float("nan"),
                 peak_flops: float = float("nan"), sample=None, settings_label: str = "",
                 prefix_bytes: int = 0):
        self.model = model
        self.cache = PagedKVCache(model.cfg, num_blocks=num_blocks, block_size=block_size, dtype=model.dtype,
                                  device=model.device)
        self.scheduler = Scheduler(self.cache.manager, max_batch_size=max_batch_size, token_budget=token_budget,
                                   policy=policy, chunk_size=chunk_size)
        self.attention = attention
        # the roof its steps are measured against (engine/hardware/roof.py); bare peaks for the bench's runners
        self.roof = roof if roof is not None else Roof(peak_bandwidth_bps, {"fp32": peak_flops})
        self.sample = sample or greedy  # (engine/model/sampling.py: numpy's argmax on a CPU)
        self.settings_label = settings_label
        self.step_count = 0
        self._elem_bytes = model.embed.element_size()
        # prompts' K/V kept for later requests that start the same way (engine/serving/prefix_store.py);
        # the person's conversation keeps its own (Request.retain_kv), so only other requests use it
        self.prefixes = PrefixStore(prefix_bytes) if prefix_bytes > 0 else None
        self._looked_up: set[tuple[int, int]] = set()  # (request id, its pre-emptions) already offered one
        # positions copied in from the store and the seconds it took, charged to the next step that runs
        self._copied = (0, 0.0)

    @torch.inference_mode()
    def take_computed(self, request: Request, k: torch.Tensor, v: torch.Tensor) -> int:
        """K/V (L, n_kv, n, hd) of the request's first n tokens, computed elsewhere, into the pool
        where it has room; returns the tokens it now holds that way (0: it computes them)."""
        start = self.scheduler.take_computed(request, k.shape[2])
        if start is None:
            return 0
        end = request.num_computed_tokens
        self.cache.write(request.request_id, start, k[:, :, start:end], v[:, :, start:end])
        return end

    def _offer_prefixes(self) -> None:
        """Each newly waiting request (a pre-empted one again) takes the longest stored prefix of its prompt."""
        if len(self._looked_up) > 4 * len(self.scheduler.requests) + 64:  # (cancelled while waiting)
            self._looked_up = {key for key in self._looked_up if key[0] in self.scheduler.requests}
        for req in self.scheduler.waiting:
            key = (req.request_id, req.num_preemptions)
            if req.retain_kv or req.num_computed_tokens or key in self._looked_up:
                continue
            self._looked_up.add(key)
            kv = self.prefixes.lookup(req)
            if kv is not None:
                t0 = time.perf_counter()
                n = self.take_computed(req, *kv)
                if self.model.device.type == "cuda":
                    torch.cuda.synchronize()
                self.prefixes.taken(n)
                positions, seconds = self._copied
                self._copied = (positions + n, seconds + time.perf_counter() - t0)

    def _keep_prompts(self, plan) -> None:
        """The prompts this step completed, into the store (copied out of the pool)."""
        for s in plan.seqs:
            req = self.scheduler.requests.get(s.request_id)
            if req is None or req.retain_kv or req.is_finished or not s.is_prefill:
                continue
            self._looked_up.discard((req.request_id, req.num_preemptions))
            n = len(req.prompt_ids)
            if req.num_computed_tokens >= n and not self.prefixes.covers(req.prompt_ids):
                self.prefixes.put(req.prompt_ids, *self.cache.prefix(n, seq=req.request_id))

    def step(self):
        if self.prefixes is not None:
            self._offer_prefixes()
        plan = self.scheduler.schedule()
        if plan.is_empty:
            return plan, {}, None
        sync = torch.cuda.synchronize if self.model.device.type == "cuda" else (lambda: None)
        sync()
        t0 = time.perf_counter()
        with torch.inference_mode():
            moved: dict = {}
            ids, logits = forward_plan(self.model, self.cache, plan.seqs, self.attention, moved)
            tokens = self.sample(logits).tolist() if ids else []
        sync()
        step_s = time.perf_counter() - t0
        if self._copied[0]:  # the prefixes copied in for this plan: their time and bytes are the step's
            positions, seconds = self._copied
            step_s += seconds
            moved["kv_copy"] = moved.get("kv_copy", KVCopy()) + KVCopy(read=positions, written=positions)
            self._copied = (0, 0.0)
        sampled = dict(zip(ids, tokens))
        self.scheduler.update_from_output(plan, sampled)
        if self.prefixes is not None:
            self._keep_prompts(plan)
        products = moved.pop("cpp_products", None)  # the C++ step ran it: no dequantised copy (engine/metrics.py weight_rows)
        cpp = products is not None
        weight_bytes = self.model.linear_weight_bytes(rows=weight_rows(plan.total_num_scheduled_tokens, cpp),
                                                      head_rows=weight_rows(sum(s.samples for s in plan.seqs), cpp))
        cost = plan_cost(self.model.cfg, plan.seqs, weight_bytes=weight_bytes, elem_bytes=self._elem_bytes,
                         attention=self.attention, block_size=self.cache.block_size, cpp_step=cpp, **moved)
        n = len(plan.seqs)
        metrics = measured(
            cost, self.roof, dtype_name(self.model.dtype), products, step=self.step_count, phase=plan_phase(plan.seqs),
            batch_size=n, new_tokens=max(1, round(plan.total_num_scheduled_tokens / n)), tokens_out=len(ids),
            context_len=round(sum(s.start_pos for s in plan.seqs) / n), step_s=step_s, t_s=time.monotonic(),
            settings_label=self.settings_label, tokens_in=plan.total_num_scheduled_tokens)
        self.step_count += 1
        return plan, sampled, metrics

    def set_model(self, model: Transformer) -> None:
        """Swap the weights between steps (fp <-> int8/int4 of one dtype): the cached K/V stay.
        A dtype change needs a new pool (engine/serving/server.py re-queues everything to recompute)."""
        if model.dtype != self.cache.k.dtype:
            raise ValueError(f"the KV pool is {self.cache.k.dtype}, the model {model.dtype}: make a new runner")
        if model is not self.model and self.prefixes is not None:
            self.prefixes.clear()  # what new requests take must be what these weights compute
        self.model = model
