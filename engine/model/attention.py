"""Attention backends behind one call: `attend(q, k, v, backend, kv_lens=None)`.

`naive` materialises the score matrix (B, H, T, S) in memory, masks it, softmaxes it and multiplies
by V: what attention costs without fusion (the cost model charges its bytes). `flash` never writes
it: on a GPU, decode runs the Triton flash-decoding kernel (kernels/flash_decode.py, over a cache
view or through the paged block tables; unless it failed its check at load, kernels/registry.py)
and prefill PyTorch's fused SDPA; on a CPU, SDPA's fused kernel. k and v are (B, n_kv, S, hd)
tensors, or `PagedKV` handles from a paged cache. Gemma's and Phi's layers add a query scale of their
own, a sliding window (a query sees the `window` latest keys) and Gemma 2's soft-capped scores
(`cap * tanh(scores / cap)`, which no fused kernel here takes: those scores are written to memory)."""
from __future__ import annotations

import math

import torch
import torch.nn.functional as F

from engine.dispatch import record
from engine.kv.cache import PagedKV
from engine.settings import ATTENTION_BACKENDS as BACKENDS
from kernels import registry as kernel_registry


def attend(q: torch.Tensor, k, v, backend: str = "flash", kv_lens: torch.Tensor | None = None, *,
           scale: float | None = None, softcap: float = 0.0, window: int = 0) -> torch.Tensor:
    """q (B, H, T, hd) holds the last T positions of each row's keys; causal among them.
    kv_lens (B,) int tensor (ragged rows, or a CUDA-graph bucket): row b has kv_lens[b] valid
    keys and its queries sit at kv_lens[b] - T ...; None: every row has all S keys.
    scale: the query scale (None: hd ** -0.5); softcap: scores soft-capped at it (0: not);
    window: a query sees only keys fewer than `window` positions back (0: all).
    Returns (B, H, T, hd) in q's dtype."""
    if backend not in BACKENDS:
        raise ValueError(f"attention must be one of {', '.join(BACKENDS)}, got {backend!r}")
    extra = dict(scale=scale, softcap=softcap, window=window)
    if isinstance(k, PagedKV):
        return _attend_paged(q, k, v, backend, **extra)
    if softcap:  # no fused kernel takes soft-capped scores: they are written to memory
        return naive_attention(q, k, v, kv_lens, **extra)
    if backend == "flash":
        return flash_attention(q, k, v, kv_lens, scale=scale, window=window)
    return naive_attention(q, k, v, kv_lens, **extra)


def naive_attention(q, k, v, kv_lens=None, *, scale: float | None = None, softcap: float = 0.0,
                    window: int = 0) -> torch.Tensor:
    """Scores written to memory in q's dtype, masked in place, softmaxed (read, written), then
    read again by the value product. GQA without copying K/V: the query heads that share a KV
    head are stacked as extra query rows."""
    B, H, T, hd = q.shape
    n_kv, S = k.shape[1], k.shape[2]
    _record(T, "torch naive (scores in memory)" if not softcap else "torch, soft-capped scores in memory")
    group = H // n_kv
    qg = (q * (1.0 / math.sqrt(hd) if scale is None else scale)).reshape(B, n_kv, group * T, hd)
    scores = qg @ k.transpose(-2, -1)  # (B, n_kv, group * T, S): the score matrix, materialised
    if softcap:
        scores = torch.tanh(scores / softcap) * softcap
    allowed = _allowed(B, T, S, kv_lens, q.device, window)
    if allowed is not None:
        scores.view(B, n_kv, group, T, S).masked_fill_(~allowed[:, None, None], float("-inf"))
    probs = torch.softmax(scores, dim=-1)
    return (probs @ v).view(B, H, T, hd)


def flash_attention(q, k, v, kv_lens=None, *, scale: float | None = None, window: int = 0) -> torch.Tensor:
    """Fused attention: the scores stay in registers / cache, never in memory."""
    B, H, T, hd = q.shape
    if window and T == 1 and kv_lens is None and k.shape[2] > window:  # one query: just its window's keys
        k, v = k[:, :, -window:], v[:, :, -window:]
        window = 0
    n_kv, S = k.shape[1], k.shape[2]
    # eager decode on a GPU: the Triton kernel. Inside a captured CUDA graph (torch.compile) the
    # fused SDPA stands in: the kernel's launch code is not traced (an untested path on our GPUs).
    if T == 1 and _use_kernel(q, "flash") and not torch.compiler.is_compiling() and scale is None and not window:
        from kernels.flash_decode import flash_decode
        record("attention decode", "triton flash_decode")
        lens = kv_lens.to(torch.int32) if kv_lens is not None else \
            torch.full((B,), S, dtype=torch.int32, device=q.device)
        return flash_decode(q[:, :, 0], k, v, lens).unsqueeze(2)
    gqa = n_kv != H
    _record(T, "torch SDPA")
    if kv_lens is None and T == S > 1 and not window:  # a whole prompt: SDPA's causal path skips the masked half
        return F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=gqa, scale=scale)
    allowed = _allowed(B, T, S, kv_lens, q.device, window)
    if T == 1:
        # one query per row: its query heads stacked as rows of their KV head (no K/V repeat;
        # 20% faster than enable_gqa on a 2-core CPU at 1-4k keys)
        qg = q.reshape(B, n_kv, H // n_kv, hd)
        mask = None if allowed is None else allowed[:, None]  # (B, 1, 1, S)
        return F.scaled_dot_product_attention(qg, k, v, attn_mask=mask, scale=scale).view(B, H, 1, hd)
    # a chunk after cached context, or ragged rows: an explicit mask (B or 1, 1, T, S)
    return F.scaled_dot_product_attention(q, k, v, attn_mask=allowed[:, None], enable_gqa=gqa, scale=scale)


def _allowed(B: int, T: int, S: int, kv_lens, device, window: int = 0) -> torch.Tensor | None:
    """Boolean (B or 1, T, S): may query i see key j (causal; within `window` positions when it
    is set). None when every query sees every key."""
    if kv_lens is None:
        if T == 1 and not (window and S > window):
            return None
        q_pos = torch.arange(S - T, S, device=device)[:, None]  # (T, 1)
        keys = torch.arange(S, device=device)[None, :]
        allowed = keys <= q_pos
        if window:
            allowed &= keys > q_pos - window
        return allowed[None]
    q_pos = kv_lens.to(device=device, dtype=torch.long)[:, None] - T + torch.arange(T, device=device)[None, :]
    keys = torch.arange(S, device=device)[None, None, :]
    allowed = keys <= q_pos[:, :, None]  # (B, T, S)
    if window:
        allowed &= keys > q_pos[:, :, None] - window
    return allowed


def _attend_paged(q, k: PagedKV, v: PagedKV, backend: str, *, scale: float | None = None, softcap: float = 0.0,
                  window: int = 0) -> torch.Tensor:
    layout = k.layout
    B, H, T, hd = q.shape
    if scale is not None or softcap or window:  # Gemma's and Phi's layers: over the gathered keys
        lens = layout.context_lens
        kv_lens = None if len(set(lens)) == 1 else torch.tensor(lens, device=q.device)
        if B == 1 and len(layout.runs[0]) == 1:
            k_all, v_all = k.run_views(0)[0], v.run_views(0)[0]
        else:
            k_all, v_all = k.dense(), v.dense()
        return attend(q, k_all, v_all, backend, kv_lens, scale=scale, softcap=softcap, window=window)
    if T == 1 and backend == "flash" and _use_kernel(q, "paged"):
        from kernels.flash_decode import paged_flash_decode
        record("attention decode", "triton paged_flash_decode")
        tables, lens = layout.tensors(q.device)
        return paged_flash_decode(q[:, :, 0], k.pool, v.pool, tables, lens, layout.block_size).unsqueeze(2)
    if B == 1 and len(layout.runs[0]) == 1:  # one run of consecutive blocks: a plain view
        return attend(q, k.run_views(0)[0], v.run_views(0)[0], backend)
    if T == 1 and B == 1:  # several runs: read each in place, no gathered copy
        return _decode_over_runs(q, k.run_views(0), v.run_views(0))
    lens = layout.context_lens
    kv_lens = None if len(set(lens)) == 1 else torch.tensor(lens, device=q.device)
    return attend(q, k.dense(), v.dense(), backend, kv_lens)


def _decode_over_runs(q, k_runs: list[torch.Tensor], v_runs: list[torch.Tensor]) -> torch.Tensor:
    """One query over keys scattered in several runs of the pool: scores per run (one row per
    head: small at decode), one softmax over them all, then the value product run by run."""
    B, H, _, hd = q.shape
    n_kv = k_runs[0].shape[1]
    _record(1, "torch, block runs read in place")
    qg = (q * (1.0 / math.sqrt(hd))).reshape(B, n_kv, H // n_kv, hd)
    scores = torch.cat([qg @ kr.transpose(-2, -1) for kr in k_runs], dim=-1)  # (B, n_kv, group, S)
    probs = torch.softmax(scores, dim=-1)
    out = None
    pos = 0
    for vr in v_runs:
        n = vr.shape[2]
        part = probs[..., pos:pos + n] @ vr
        out = part if out is None else out + part
        pos += n
    return out.reshape(B, H, 1, hd)


def _record(T: int, impl: str) -> None:
    if not torch.compiler.is_compiling():  # traced once; a graph's replays are counted by engine/graphs.py
        record("attention decode" if T == 1 else "attention prefill", impl)


_KERNELS: bool | None = None


def _use_kernel(q: torch.Tensor, name: str) -> bool:
    """Decode on a GPU takes Triton kernel `name` unless it failed its check at load."""
    return _on_gpu(q) and _kernels_available() and kernel_registry.enabled(name)


def _on_gpu(q: torch.Tensor) -> bool:
    return q.is_cuda  # its own function: the dispatch tests take the GPU's branch with CPU tensors


def _kernels_available() -> bool:
    """Triton importable (checked once): the GPU decode kernels; else PyTorch's SDPA."""
    global _KERNELS
    if _KERNELS is None:
        try:
            import triton  # noqa: F401
            _KERNELS = True
        except ImportError:
            _KERNELS = False
    return _KERNELS
