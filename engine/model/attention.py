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

import functools
import math
import threading

import torch
import torch.nn.functional as F

from engine.context import EngineContext, default_context
from engine.dispatch import record
from engine.kv.cache import PagedKV
from engine.settings import ATTENTION_BACKENDS as BACKENDS


def attend(q: torch.Tensor, k, v, backend: str = "flash", kv_lens: torch.Tensor | None = None, *,
           scale: float | None = None, softcap: float = 0.0, window: int = 0,
           context: EngineContext | None = None) -> torch.Tensor:
    """q (B, H, T, hd) holds the last T positions of each row's keys; causal among them.
    `context`: the engine's (engine/context.py: a kernel it switched off is not taken; None: the default).
    kv_lens (B,) int tensor (ragged rows, or a captured step over a whole buffer): row b has kv_lens[b] valid
    keys and its queries sit at kv_lens[b] - T ...; None: every row has all S keys.
    scale: the query scale (None: hd ** -0.5); softcap: scores soft-capped at it (0: not);
    window: a query sees only keys fewer than `window` positions back (0: all).
    Returns (B, H, T, hd) in q's dtype."""
    if backend not in BACKENDS:
        raise ValueError(f"attention must be one of {', '.join(BACKENDS)}, got {backend!r}")
    extra = dict(scale=scale, softcap=softcap, window=window)
    if isinstance(k, PagedKV):
        return _attend_paged(q, k, v, backend, context=context, **extra)
    if softcap:  # no fused kernel takes soft-capped scores: they are written to memory
        return naive_attention(q, k, v, kv_lens, **extra)
    if backend == "flash":
        return flash_attention(q, k, v, kv_lens, scale=scale, window=window, context=context)
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


def flash_attention(q, k, v, kv_lens=None, *, scale: float | None = None, window: int = 0,
                    context: EngineContext | None = None) -> torch.Tensor:
    """Fused attention: the scores stay in registers / cache, never in memory."""
    B, H, T, hd = q.shape
    if window and T == 1 and kv_lens is None and k.shape[2] > window:  # one query: just its window's keys
        k, v = k[:, :, -window:], v[:, :, -window:]
        window = 0
    n_kv, S = k.shape[1], k.shape[2]
    # eager decode on a GPU: the Triton kernel. Inside a captured CUDA graph (torch.compile) the
    # fused SDPA stands in: the kernel's launch code is not traced (an untested path on our GPUs).
    if T == 1 and _use_kernel(q, "flash", context) and not torch.compiler.is_compiling() and scale is None and not window:
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
        # (reshape: on a GPU SDPA may hand back its output in another memory order, a view fails)
        return F.scaled_dot_product_attention(qg, k, v, attn_mask=mask, scale=scale).reshape(B, H, 1, hd)
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
                  window: int = 0, context: EngineContext | None = None) -> torch.Tensor:
    layout = k.layout
    B, H, T, hd = q.shape
    if scale is not None or softcap or window:  # Gemma's and Phi's layers: over the gathered keys
        lens = layout.context_lens
        kv_lens = None if len(set(lens)) == 1 else torch.tensor(lens, device=q.device)
        if B == 1 and len(layout.runs[0]) == 1:
            k_all, v_all = k.run_views(0)[0], v.run_views(0)[0]
        else:
            k_all, v_all = k.dense(), v.dense()
        return attend(q, k_all, v_all, backend, kv_lens, scale=scale, softcap=softcap, window=window,
                      context=context)
    if T == 1 and backend == "flash" and _use_kernel(q, "paged", context):
        from kernels.flash_decode import paged_flash_decode
        record("attention decode", "triton paged_flash_decode")
        tables, lens = layout.tensors(q.device)
        return paged_flash_decode(q[:, :, 0], k.pool, v.pool, tables, lens, layout.block_size).unsqueeze(2)
    if B == 1 and len(layout.runs[0]) == 1:  # one run of consecutive blocks: a plain view
        return attend(q, k.run_views(0)[0], v.run_views(0)[0], backend, context=context)
    if T == 1 and B == 1:  # several runs: read each in place, no gathered copy
        return _decode_over_runs(q, k.run_views(0), v.run_views(0))
    lens = layout.context_lens
    kv_lens = None if len(set(lens)) == 1 else torch.tensor(lens, device=q.device)
    return attend(q, k.dense(), v.dense(), backend, kv_lens, context=context)


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
    # traced once; a captured step's calls are counted by engine/graphs.py (the op below runs quiet)
    if not torch.compiler.is_compiling() and not _QUIET.active:
        record("attention decode" if T == 1 else "attention prefill", impl)


# ---- the captured decode step's attention (engine/graphs.py) --------------------------------------
# A captured step that depended on the context length would be compiled again for every new length.
# So it hands attention the whole cache buffer and the position as a tensor, and this op, opaque to
# torch.compile, reads the live keys only: on a GPU the flash-decoding kernel's loop stops at pos + 1
# (one CUDA graph serves every length); on a CPU, where nothing is captured, the op slices the buffer
# at pos + 1 each time it runs. A GPU without the kernel (naive attention, or the kernel failed its
# check) masks the whole buffer instead, and reads all of it: `captured_reads_whole_buffer` says so
# to the cost model.
class _Quiet(threading.local):
    active = False


_QUIET = _Quiet()


def captured_reads_whole_buffer(on_gpu: bool, backend: str, scale: float | None = None, softcap: float = 0.0,
                                window: int = 0, flash_on: bool = True) -> bool:
    """Whether a captured decode step's attention reads every position of the cache buffer (masked
    past the live ones) rather than the live keys alone: on a GPU, whatever the kernel does not take
    (naive attention, a failed check, a layer's own query scale, sliding window or soft cap)."""
    kernel = backend == "flash" and _kernels_available() and flash_on and scale is None \
        and not softcap and not window
    return on_gpu and not kernel


def captured_attention_path(on_gpu: bool, backend: str, flash_on: bool = True, **options) -> str:
    """What a captured decode step's attention runs, for the dispatch counts."""
    what = "SDPA" if backend == "flash" and not options.get("softcap") else "naive (scores in memory)"
    if not on_gpu:
        return f"torch {what} over the live keys (in the compiled step)"
    if not captured_reads_whole_buffer(on_gpu, backend, flash_on=flash_on, **options):
        return "triton flash_decode (in the CUDA graph)"
    return f"torch {what} over the whole cache, masked (in the CUDA graph)"


@torch.library.custom_op("membound::cache_write", mutates_args=("k_all", "v_all"))
def cache_write(k_all: torch.Tensor, v_all: torch.Tensor, pos: torch.Tensor, k: torch.Tensor,
                v: torch.Tensor) -> None:
    """The new token's K and V (B, n_kv, 1, hd) into the cache buffers (B, n_kv, S, hd) at position
    pos, in place. An op of its own because Inductor copies a whole buffer (in and back out) around
    an index_copy_ into a view of it, every step, and writes in place around a mutating op."""
    k_all.index_copy_(2, pos, k)
    v_all.index_copy_(2, pos, v)


@cache_write.register_fake
def _(k_all, v_all, pos, k, v):
    return None


@torch.library.custom_op("membound::decode_attention", mutates_args=())
def decode_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, pos: torch.Tensor, backend: str,
                     scale: float | None = None, softcap: float = 0.0, window: int = 0,
                     flash_on: bool = True) -> torch.Tensor:
    """q (B, H, 1, hd), the query at position pos[b] of row b; k, v (B, n_kv, S, hd): the whole cache
    buffer, its first pos[b] + 1 positions written; the layer's options as `attend` takes them;
    flash_on: the engine's flash kernel is not switched off (an op is handed values, not its context).
    Returns (B, H, 1, hd) in q's dtype."""
    on_gpu = _on_gpu(q)
    extra = dict(scale=scale, softcap=softcap, window=window)
    if on_gpu and not captured_reads_whole_buffer(on_gpu, backend, flash_on=flash_on, **extra):
        from kernels.flash_decode import flash_decode
        return flash_decode(q[:, :, 0], k, v, (pos + 1).to(torch.int32)).unsqueeze(2)
    _QUIET.active = True
    try:
        if on_gpu:  # no value read back from the GPU (a graph is being captured): the mask does it
            return attend(q, k, v, backend, kv_lens=pos + 1, context=None if flash_on else _FLASH_OFF, **extra)
        live = int(pos.max()) + 1  # a CPU tensor: no device sync
        return attend(q, k[:, :, :live], v[:, :, :live], backend, kv_lens=None if q.shape[0] == 1 else pos + 1,
                      **extra)
    finally:
        _QUIET.active = False


@decode_attention.register_fake
def _(q, k, v, pos, backend, scale=None, softcap=0.0, window=0, flash_on=True):
    return torch.empty_like(q)


def _use_kernel(q: torch.Tensor, name: str, context=None) -> bool:
    """Decode on a GPU takes Triton kernel `name` unless it failed its check at load."""
    return _on_gpu(q) and _kernels_available() and (context or default_context()).kernels.enabled(name)


def _on_gpu(q: torch.Tensor) -> bool:
    return q.is_cuda  # its own function: the dispatch tests take the GPU's branch with CPU tensors


@functools.cache  # a fact of the installed process, the same for every engine
def _kernels_available() -> bool:
    """Triton importable (checked once): the GPU decode kernels; else PyTorch's SDPA."""
    try:
        import triton  # noqa: F401
        return True
    except ImportError:
        return False


class _FlashOff:
    """What decode_attention hands attend when its engine switched the flash kernel off: switches
    that say so (immutable: it holds nothing)."""

    class kernels:
        @staticmethod
        def enabled(name: str) -> bool:
            return name != "flash"


_FLASH_OFF = _FlashOff()
