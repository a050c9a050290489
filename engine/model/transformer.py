"""One Llama-family transformer (RMSNorm, RoPE with scaling, GQA, SwiGLU, tied or untied head; the
Qwen2 q/k/v bias and the Qwen3 per-head q/k RMSNorm where the config has them; Gemma 2/3's scaled
embeddings, GeGLU, four norms a layer, query scale, soft-capping and sliding-window layers with a RoPE
base of their own; Phi's partial rotary).

`Transformer.forward(tokens, start_pos, cache)` returns logits; linear layers go through
`Linear` so later settings (quantisation) can swap them between steps."""
from __future__ import annotations

import functools
import os
import time

import torch
import torch.nn as nn
import torch.nn.functional as F

from engine.context import EngineContext, default_context
from engine.model import cpu_step, huge_pages
from engine.model.attention import attend, cache_write, decode_attention
from engine.model.config import ModelConfig
from engine.model.rope import rope_tables

# Decode on a CPU is a matrix-vector product per weight, and which PyTorch call streams it
# fastest depends on the CPU: on a 2-core AMD EPYC, plain F.linear (one GEMV on (N, K) weights)
# streamed ~11 GB/s and the same weight viewed as (n_chunks, N / n_chunks, K), one bmm per
# chunk (a row block per thread), 28 GB/s; on a 2-core Intel Xeon (torch 2.13) F.linear streams
# 54-87 GB/s and the chunked bmm 14-25. So the first fp32 GEMV times both once and keeps the
# faster (`chunked_gemv_is_faster`). (The C++ CPU step, when it runs, takes decode from both.)
CPU_GEMV_MAX_ROWS = 1
# Above that (a batched decode step, a prefill) the rows share each weight read, and F.linear
# (MKL's sgemm on this AMD CPU) grows almost linearly with the rows. oneDNN's matmul on a copy of
# the weight reordered once into its blocked layout does not: SmolLM2-135M's 120 layer matmuls,
# weights out of cache, 2-core AMD EPYC, fp32, ms: rows 2: F.linear 56.8, chunked bmm 14.9-30,
# packed 20.0; rows 4: 46.4 / 19.5 / 14.0; rows 8: 48.6 / 32.6 / 17.9; rows 64: 125 / 92.9 / 75.4
# (bf16 rows 8: F.linear 21.6, packed 10.7). oneDNN's kernel for 2 or 3 rows is slower than for 4
# (packed, fp32: 23.1, 18.4, 17.5 ms), so fewer rows are zero-padded to CPU_PACKED_MIN_ROWS.
# The packed copy doubles the weight memory, so it is made lazily (the first matmul of that many
# rows) and only while the machine has room for it.
CPU_PACKED_MIN_ROWS = 4
CPU_PACKED_DTYPES = (torch.float32, torch.bfloat16)


def cpu_gemv_chunks() -> int:
    return max(1, torch.get_num_threads())


def chunked_gemv_is_faster(chunks: int, context: EngineContext | None = None) -> bool:
    """Whether the chunked bmm streams an fp32 GEMV faster than F.linear here: both timed once on a
    32 MiB weight (best of 5 after a warm-up, ~20 ms in all), the answer kept per thread count (in
    the engine's context, engine/context.py)."""
    known = (context or default_context()).chunked_gemv_faster
    faster = known.get(chunks)
    if faster is None:
        n, k = chunks * (8192 // chunks), 1024
        w, x = torch.randn(n, k), torch.randn(1, k)
        chunked = w.view(chunks, n // chunks, k)
        xt = x.t().unsqueeze(0).expand(chunks, k, 1)

        def best_s(run) -> float:
            run()
            times = []
            for _ in range(5):
                t0 = time.perf_counter()
                run()
                times.append(time.perf_counter() - t0)
            return min(times)
        faster = best_s(lambda: torch.bmm(chunked, xt)) < best_s(lambda: F.linear(x, w))
        known[chunks] = faster
    return faster


class Linear(nn.Module):
    """y = x @ W.T with W stored (out_features, in_features); no bias (Llama has none)."""

    def __init__(self, weight: torch.Tensor):
        super().__init__()
        self.weight = nn.Parameter(weight, requires_grad=False)
        self.out_features, self.in_features = weight.shape
        self.context: EngineContext | None = None  # its engine's (Transformer.bind); None: the default

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        rows = x.numel() // x.shape[-1]
        if rows > CPU_GEMV_MAX_ROWS and x.device.type == "cpu":  # batched rows: the packed copy
            packed = cpu_packed_weight(self.weight, self.context)
            if packed is not None:
                x2 = x.reshape(rows, x.shape[-1])
                if rows < CPU_PACKED_MIN_ROWS:
                    x2 = torch.cat([x2, x2.new_zeros(CPU_PACKED_MIN_ROWS - rows, x2.shape[1])])
                y = torch.ops.mkldnn._linear_pointwise(x2, packed, None, "none", [], "")[:rows]
                return y.view(*x.shape[:-1], self.out_features)
        return linear(x, self.weight, self.context)

    @property
    def weight_bytes(self) -> int:
        return self.weight.numel() * self.weight.element_size()

    def first_rows(self, n: int) -> "Linear":
        """The first n output rows as a module (the same storage: a head cut short to time it)."""
        return Linear(self.weight.detach()[:n])

    def cpu_matrix(self) -> tuple | None:
        """This weight for the C++ CPU decode step (engine/model/cpu_step.py); None: it cannot."""
        fmt = {torch.float32: 0, torch.bfloat16: 1}.get(self.weight.dtype)
        return None if fmt is None else cpu_step.matrix(fmt, self.weight)


def linear(x: torch.Tensor, weight: torch.Tensor, context: EngineContext | None = None) -> torch.Tensor:
    rows = x.numel() // x.shape[-1]
    if x.device.type == "cpu" and weight.dtype == torch.float32 and rows <= CPU_GEMV_MAX_ROWS \
            and not torch.compiler.is_compiling():  # (a compiled step leaves the matmul to inductor)
        chunks = cpu_gemv_chunks()
        n, k = weight.shape
        if chunks > 1 and n % chunks == 0 and chunked_gemv_is_faster(chunks, context):
            w = weight.view(chunks, n // chunks, k)  # (C, N/C, K), a view: no copy
            xt = x.reshape(rows, k).t().unsqueeze(0).expand(chunks, k, rows)  # (C, K, M)
            y = torch.bmm(w, xt)  # (C, N/C, M)
            y = y.reshape(n, rows).t() if rows > 1 else y.view(1, n)
            return y.reshape(*x.shape[:-1], n)
    return F.linear(x, weight)


def cpu_packed_weight(weight: torch.Tensor, context: EngineContext | None = None) -> torch.Tensor | None:
    """`weight` (N, K) reordered once into oneDNN's blocked layout for `_linear_pointwise`; None
    where that path is missing, the dtype has no fast oneDNN kernel here, we are being compiled,
    or the machine lacks the memory for a second copy (the caller keeps the plain path). The copy
    is kept in the engine's context, weakly keyed by the weight (by identity: tensors compare
    elementwise): a dropped model frees its copies, and the modules hold nothing extra (copies,
    state dicts and pickles see plain weights)."""
    if torch.compiler.is_compiling() or weight.dtype not in CPU_PACKED_DTYPES or weight.dim() != 2 \
            or not _onednn_packs(weight.dtype):
        return None
    context = context or default_context()
    hit = context.packed_weights.get(weight)
    version = _version_of(weight)
    if hit is not None and hit[0] == version:
        return hit[1]
    with context.packed_lock:
        nbytes = weight.numel() * weight.element_size()
        if hit is None and not _memory_allows(nbytes):
            return None
        packed = torch.ops.mkldnn._reorder_linear_weight(weight.detach(), 64)  # 64: the batch hint; 8 packs alike
        context.packed_weights[weight] = (version, packed)
        return packed


def _version_of(t: torch.Tensor) -> int:
    try:
        return t._version  # bumped by every in-place write: a stale copy is packed again
    except RuntimeError:  # an inference tensor keeps no version counter (and cannot be written outside one)
        return -1


def packed_weight_bytes(context: EngineContext | None = None) -> int:
    """Bytes held in packed copies (the price of the fast batched path), for reports and tests."""
    return sum(w.numel() * w.element_size() for w in list((context or default_context()).packed_weights.keys()))


@functools.cache  # a fact of this torch build, the same for every engine
def _onednn_available() -> bool:
    return bool(torch.backends.mkldnn.is_available()) and hasattr(torch.ops.mkldnn, "_linear_pointwise") \
        and hasattr(torch.ops.mkldnn, "_reorder_linear_weight")


@functools.cache  # a fact of this torch build and this CPU
def _onednn_packs(dtype: torch.dtype) -> bool:
    """Whether oneDNN reorders (and so runs) a `dtype` linear weight here: its bf16 path needs
    AVX-512 (BW, VL, DQ) or AVX-NE-CONVERT, which an AVX2 laptop lacks (the reorder raises there);
    asked once of a small weight."""
    if not _onednn_available():
        return False
    try:
        packed = torch.ops.mkldnn._reorder_linear_weight(torch.zeros(16, 16, dtype=dtype), 64)
        torch.ops.mkldnn._linear_pointwise(torch.zeros(2, 16, dtype=dtype), packed, None, "none", [], "")
    except RuntimeError:
        return False
    return True


def _memory_allows(nbytes: int) -> bool:
    """Room for nbytes more with a margin (1 GiB, and as much again as the copy): MemAvailable
    where /proc/meminfo has it, else the free pages; unknown means no."""
    try:
        with open("/proc/meminfo") as f:
            avail = next(int(line.split()[1]) * 1024 for line in f if line.startswith("MemAvailable:"))
    except (OSError, StopIteration, ValueError):
        try:
            avail = os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
        except (OSError, ValueError, AttributeError):
            return False
    return avail >= 2 * nbytes + (1 << 30)


def apply_rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    # x: (B, T, H, hd); cos/sin: (T, rd) or (B, T, rd) for per-sequence positions; rd < hd: partial
    # rotary, the first rd dimensions of each head rotated and the rest passed through
    if cos.dim() == 2:
        cos, sin = cos[None, :, None, :], sin[None, :, None, :]
    else:
        cos, sin = cos[:, :, None, :], sin[:, :, None, :]
    rd = cos.shape[-1]
    if rd < x.shape[-1]:
        return torch.cat([apply_rope(x[..., :rd], cos[:, :, 0], sin[:, :, 0]), x[..., rd:]], dim=-1)
    half = x.shape[-1] // 2
    rotated = torch.cat([-x[..., half:], x[..., :half]], dim=-1)
    return (x.float() * cos + rotated.float() * sin).to(x.dtype)


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float, gemma: bool = False) -> torch.Tensor:
    """RMSNorm over the last dimension. Gemma's (weights stored as 1 + w) normalise and scale in
    fp32 and round once; Llama's round the normalised x to its dtype before the scale."""
    if gemma and x.dtype != torch.float32:
        return F.rms_norm(x.float(), (x.shape[-1],), weight.float(), eps).to(x.dtype)
    return F.rms_norm(x, (x.shape[-1],), weight, eps)


def gated(gate: torch.Tensor, up: torch.Tensor, activation: str) -> torch.Tensor:
    """The gated MLP's product: SwiGLU (silu) or GeGLU (GELU, tanh approximation)."""
    if activation == "gelu_tanh":
        return F.gelu(gate, approximate="tanh") * up
    return F.silu(gate) * up


def softcap(x: torch.Tensor, cap: float) -> torch.Tensor:
    return torch.tanh(x / cap) * cap if cap else x


def fused(weights: dict[str, torch.Tensor], name: str, parts: tuple[str, ...]) -> torch.Tensor:
    """weights[name] if the loader fused it, else the parts concatenated along the rows."""
    if name in weights:
        return weights[name]
    return torch.cat([weights[p] for p in parts], dim=0)


class Block(nn.Module):
    def __init__(self, cfg: ModelConfig, weights: dict[str, torch.Tensor], layer: int = 0):
        super().__init__()
        self.cfg = cfg
        self.gemma = cfg.post_norms  # Gemma 2/3's norms (fp32 scale) and their output norms
        # this layer's attention: its window (sliding layers), the query scale, Gemma 2's soft cap
        self.attend_options = dict(scale=cfg.attn_scale or None, softcap=cfg.attn_softcap,
                                   window=cfg.layer_window(layer))
        self.context: EngineContext | None = None  # its engine's (Transformer.bind); None: the default
        self.attn_norm = nn.Parameter(weights["attn_norm"], requires_grad=False)
        self.ffn_norm = nn.Parameter(weights["ffn_norm"], requires_grad=False)
        self.post_attn_norm = nn.Parameter(weights["post_attn_norm"], requires_grad=False) if cfg.post_norms else None
        self.post_ffn_norm = nn.Parameter(weights["post_ffn_norm"], requires_grad=False) if cfg.post_norms else None
        # q, k and v are one matmul; gate and up are one matmul (fewer launches per step). The
        # loaders hand them over fused already (engine/io/loader.py: fuse_layers), so no copy here.
        self.wqkv = Linear(fused(weights, "wqkv", ("wq", "wk", "wv")))
        self.wo = Linear(weights["wo"])
        self.w_gate_up = Linear(fused(weights, "w_gate_up", ("w_gate", "w_up")))
        self.w_down = Linear(weights["w_down"])
        # None for Llama and Mistral: their step runs no extra op
        self.bqkv = nn.Parameter(fused(weights, "bqkv", ("bq", "bk", "bv")), requires_grad=False) \
            if cfg.qkv_bias else None
        self.qk_norm = nn.Parameter(torch.cat([weights["q_norm"].expand(cfg.n_heads, cfg.head_dim),
                                               weights["k_norm"].expand(cfg.n_kv_heads, cfg.head_dim)]),
                                    requires_grad=False) if cfg.qk_norm else None  # (n_heads + n_kv, hd)

    def forward(self, x, cos, sin, layer: int, cache, start_pos: int, attention: str = "flash"):
        q, k, v = self.qkv(x, cos, sin)
        if cache is not None:  # (B, n_kv, start_pos + T, hd) views, or PagedKV handles (paged cache)
            k, v = cache.update(layer, start_pos, k, v)
        # engine/model/attention.py: "naive" or "flash"; the context: a kernel its engine switched off
        y = attend(q, k, v, attention, context=self.context, **self.attend_options)
        return self.out_and_ffn(x, y)

    def forward_static(self, x, cos, sin, layer: int, cache, pos: torch.Tensor, attention: str = "flash"):
        """One decode token per sequence at tensor position `pos` (B == 1): no Python value
        depends on the data or the context length, so one compiled step (one CUDA graph) serves
        every position. Attention gets the whole cache buffer and reads its live keys
        (engine/model/attention.py: decode_attention)."""
        q, k, v = self.qkv(x, cos, sin)
        k_all = cache.k[layer]  # (B, n_kv, S, hd)
        v_all = cache.v[layer]
        cache_write(k_all, v_all, pos, k, v)  # in place (an op: see engine/model/attention.py)
        y = decode_attention(q, k_all, v_all, pos, attention, **self.attend_options,
                             flash_on=(self.context or default_context()).kernels.enabled("flash"))
        return self.out_and_ffn(x, y)

    def qkv(self, x, cos, sin):
        cfg = self.cfg
        B, T, _ = x.shape
        h = rms_norm(x, self.attn_norm, cfg.norm_eps, self.gemma)
        qkv = self.wqkv(h)
        if self.bqkv is not None:
            qkv = qkv + self.bqkv
        qk = qkv[..., : cfg.q_dim + cfg.kv_dim].view(B, T, cfg.n_heads + cfg.n_kv_heads, cfg.head_dim)
        if self.qk_norm is not None and self.gemma:  # Gemma 3: normalised and scaled in fp32
            qk = (F.rms_norm(qk.float(), (cfg.head_dim,), None, cfg.norm_eps) * self.qk_norm.float()).to(qk.dtype)
        elif self.qk_norm is not None:  # each head of q and k normalised over head_dim, before RoPE
            qk = F.rms_norm(qk, (cfg.head_dim,), None, cfg.norm_eps) * self.qk_norm
        qk = apply_rope(qk, cos, sin)  # q and k rotated together: one op instead of two
        q = qk[:, :, : cfg.n_heads].transpose(1, 2)  # (B, n_heads, T, hd)
        k = qk[:, :, cfg.n_heads:].transpose(1, 2)  # (B, n_kv, T, hd)
        v = qkv[..., cfg.q_dim + cfg.kv_dim:].view(B, T, cfg.n_kv_heads, cfg.head_dim).transpose(1, 2)
        return q, k, v

    def out_and_ffn(self, x, y):
        cfg = self.cfg
        B, _, T, _ = y.shape
        y = y.transpose(1, 2).reshape(B, T, cfg.q_dim)
        out = self.wo(y)
        if self.post_attn_norm is not None:
            out = rms_norm(out, self.post_attn_norm, cfg.norm_eps, True)
        x = x + out
        h = rms_norm(x, self.ffn_norm, cfg.norm_eps, self.gemma)
        gate, up = self.w_gate_up(h).split(cfg.ffn_dim, dim=-1)
        out = self.w_down(gated(gate, up, cfg.activation))
        if self.post_ffn_norm is not None:
            out = rms_norm(out, self.post_ffn_norm, cfg.norm_eps, True)
        return x + out


def attention(q, k, v, gqa: bool) -> torch.Tensor:
    """q (B, H, T, hd) holds the last T of k's/v's S positions; causal among them."""
    T, S = q.shape[2], k.shape[2]
    if T == 1:  # one query sees every cached key: no mask
        return F.scaled_dot_product_attention(q, k, v, enable_gqa=gqa)
    if T == S:
        return F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=gqa)
    # a prompt appended to cached context: query i sits at position S - T + i
    q_pos = torch.arange(S - T, S, device=q.device)[:, None]
    mask = torch.arange(S, device=q.device)[None, :] <= q_pos
    return F.scaled_dot_product_attention(q, k, v, attn_mask=mask, enable_gqa=gqa)


def _share_fused(weights: dict[str, torch.Tensor], prefix: str, block: Block) -> None:
    """Rebind the caller's q/k/v and gate/up entries to views of the block's fused weights, so the
    originals are freed and the model and the caller's dict hold one copy (an 8B model: 16 GB, not 25)."""
    cfg = block.cfg
    for fused, names, rows in ((block.wqkv.weight, ("wq", "wk", "wv"), (cfg.q_dim, cfg.kv_dim, cfg.kv_dim)),
                               (block.w_gate_up.weight, ("w_gate", "w_up"), (cfg.ffn_dim, cfg.ffn_dim))):
        for name, part in zip(names, fused.detach().split(rows)):
            weights[prefix + name] = part


class Transformer(nn.Module):
    def __init__(self, cfg: ModelConfig, weights: dict[str, torch.Tensor], context: EngineContext | None = None):
        """`weights` is shared, not copied: its q/k/v and gate/up entries become views of the fused
        matmul weights (same values, one copy in memory). `context`: its engine's (None: the default)."""
        super().__init__()
        self.cfg = cfg
        self.embed = nn.Parameter(weights["embed"], requires_grad=False)  # (vocab, dim)
        layers = []
        for i in range(cfg.n_layers):
            prefix = f"layers.{i}."
            layers.append(Block(cfg, {k[len(prefix):]: v for k, v in weights.items() if k.startswith(prefix)}, i))
            _share_fused(weights, prefix, layers[-1])  # layer by layer: the peak is one layer over the model
        self.layers = nn.ModuleList(layers)
        self.norm = nn.Parameter(weights["norm"], requires_grad=False)
        self.head = Linear(weights["embed"] if cfg.tied_embeddings else weights["head"])
        if cfg.tied_embeddings:
            self.head.weight = self.embed  # one tensor: read once by the head per step
        cos, sin = rope_tables(cfg, cfg.max_seq_len, device=self.embed.device)
        self.register_buffer("rope_cos", cos, persistent=False)
        self.register_buffer("rope_sin", sin, persistent=False)
        if cfg.rope_local_theta:  # Gemma 3's sliding layers: their own base, unscaled
            cos, sin = rope_tables(cfg, cfg.max_seq_len, device=self.embed.device, local=True)
            self.register_buffer("rope_cos_local", cos, persistent=False)
            self.register_buffer("rope_sin_local", sin, persistent=False)
        self.layer_local_rope = [cfg.layer_rope_local(i) for i in range(cfg.n_layers)]
        self.bind(context)
        if self.embed.device.type == "cpu":  # before any plan or thread holds a pointer into them
            huge_pages.pack(huge_pages.model_tensors(self), aliases=weights)

    def bind(self, context: EngineContext | None) -> "Transformer":
        """This model, and every module in it that reads an engine's state (a kernel switched off,
        a packed weight), belong to `context` from now on (engine/context.py)."""
        for module in self.modules():
            if "context" in module.__dict__:
                module.context = context
        self.context = context
        return self

    def rope_rows(self, index) -> list[tuple[torch.Tensor, torch.Tensor]]:
        """(cos, sin) rows at `index` (a slice or a tensor of positions) for each layer in turn."""
        rows = (self.rope_cos[index], self.rope_sin[index])
        if not self.cfg.rope_local_theta:
            return [rows] * self.cfg.n_layers
        local = (self.rope_cos_local[index], self.rope_sin_local[index])
        return [local if is_local else rows for is_local in self.layer_local_rope]

    def embed_tokens(self, tokens: torch.Tensor) -> torch.Tensor:
        """(B, T) ids -> (B, T, dim); Gemma's scaled by sqrt(dim), rounded to the weights' dtype as it does."""
        x = F.embedding(tokens, self.embed)
        if self.cfg.embed_scale != 1.0:
            x = x * torch.tensor(self.cfg.embed_scale, dtype=x.dtype)
        return x

    def logits(self, x: torch.Tensor) -> torch.Tensor:
        """The final norm, the head (fp32 logits) and Gemma 2's soft cap on them."""
        x = rms_norm(x, self.norm, self.cfg.norm_eps, self.cfg.post_norms)
        return softcap(self.head(x).float(), self.cfg.final_softcap)

    @property
    def dtype(self) -> torch.dtype:
        return self.embed.dtype

    @property
    def device(self) -> torch.device:
        return self.embed.device

    def forward(self, tokens: torch.Tensor, start_pos: int = 0, cache=None,
                last_only: bool = True, attention: str = "flash", logits_rows: int | None = None) -> torch.Tensor:
        """tokens (B, T) at positions start_pos .. start_pos+T-1 → logits (B, 1 or T, vocab), fp32;
        `logits_rows`: for the last that many positions only (a speculative step's guesses)."""
        B, T = tokens.shape
        if start_pos + T > self.cfg.max_seq_len:
            raise ValueError(f"context of {start_pos + T} tokens exceeds the model's {self.cfg.max_seq_len}")
        if tokens.device.type == "cpu":
            cpu_step.mark_pytorch_step(self)  # (until the C++ step takes it: cpu_step.ran_in_cpp)
            if cache is not None:  # one sequence's step: one C++ call (T <= 64 rows) or a prompt in chunks
                logits = cpu_step.sequence_step(self, tokens, start_pos, cache, attention, last_only, logits_rows)
                if logits is not None:
                    return logits
        x = self.embed_tokens(tokens)
        for i, (layer, (cos, sin)) in enumerate(zip(self.layers, self.rope_rows(slice(start_pos, start_pos + T)))):
            x = layer(x, cos, sin, i, cache, start_pos, attention)
        if logits_rows is not None:
            x = x[:, -logits_rows:]
        elif last_only:
            x = x[:, -1:]
        return self.logits(x)

    def forward_decode_static(self, tokens: torch.Tensor, pos: torch.Tensor, cache,
                              attention: str = "flash") -> torch.Tensor:
        """Decode one token at tensor position pos (shape (1,)); the graph-capturable twin of
        forward(tokens, start_pos, cache), the same step at every position."""
        x = self.embed_tokens(tokens)
        for i, (layer, (cos, sin)) in enumerate(zip(self.layers, self.rope_rows(pos))):
            x = layer.forward_static(x, cos[None], sin[None], i, cache, pos, attention)  # cos (1, 1, rd)
        return self.logits(x)

    def linear_weight_bytes(self, rows: int = 1, head_rows: int = 1) -> int:
        """Bytes of every matmul weight one forward step reads, the layers over `rows` rows (all
        sequences' new tokens) and the head over `head_rows`: as stored (each module's `weight_bytes`),
        plus any dequantised copy a module's path for that many rows writes and reads back
        (`bytes_read(rows)`, where it has one)."""
        context = self.context or default_context()
        counted = context.bytes_read.get(self)  # (not an attribute: quantize_model's shallow copies would share it)
        if counted is None:  # asked every step: the walk over the modules (~0.5 ms) is made once
            seen, counted = set(), {"modules": [], "by_rows": {}}
            for m in self.modules():
                if hasattr(type(m), "weight_bytes") and id(m) not in seen:
                    seen.add(id(m))
                    counted["modules"].append(m)
            context.bytes_read[self] = counted
        key = (rows, head_rows, tuple(sorted(context.kernels.disabled())))  # a switched-off kernel: another path
        total = counted["by_rows"].get(key)
        if total is None:
            total = int(sum(0 if m is self.head and head_rows == 0 else  # no row samples: the head does not run
                            m.bytes_read(head_rows if m is self.head else rows) if hasattr(m, "bytes_read")
                            else m.weight_bytes for m in counted["modules"]))
            if len(counted["by_rows"]) < 256:
                counted["by_rows"][key] = total
        return total
