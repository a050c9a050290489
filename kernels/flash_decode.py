"""Flash-decoding: one new query per sequence attends over its cached K/V, split over the context.

Stage 1 (`_split_kv_kernel`): a program takes one sequence, one KV head with all the query heads
that share it (GQA), and one slice of the context; it streams the slice's keys and values once,
keeps the scores on chip (online softmax) and writes its partial output with the log-sum-exp of
its scores. Stage 2 (`_reduce_kernel`): weights each slice's partial by exp(lse - max) and sums.
The same kernel reads a contiguous cache (B, n_kv, S, hd) or, with PAGED, a block pool through
per-sequence block tables. `reference_decode` / `reference_paged_decode` define correctness;
`split_kv_reference` is the two-stage algorithm in torch.

Imports without triton or a GPU (the references still work); the Triton wrappers need CUDA
tensors, or CPU tensors under TRITON_INTERPRET=1 (tests only)."""
from __future__ import annotations

import math

import torch

from kernels.triton_common import dot_dtype, dot_precision, interpreting, tl, triton

LOG2E = 1.4426950408889634


# ---- references (torch) -----------------------------------------------------------------------
def reference_decode(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, context_lens) -> torch.Tensor:
    """q (B, H, hd); k, v (B, n_kv, S, hd); row b attends over its first context_lens[b] keys.
    Plain softmax attention in fp32; the result in q's dtype."""
    B, H, hd = q.shape
    group = H // k.shape[1]
    out = torch.empty_like(q)
    for b, n in enumerate(_as_list(context_lens)):
        if n < 1:
            raise ValueError(f"sequence {b} has no keys to attend over")
        kb = k[b, :, :n].float().repeat_interleave(group, 0)  # (H, n, hd)
        vb = v[b, :, :n].float().repeat_interleave(group, 0)
        scores = torch.einsum("hd,hnd->hn", q[b].float(), kb) / math.sqrt(hd)
        out[b] = torch.einsum("hn,hnd->hd", scores.softmax(-1), vb).to(q.dtype)
    return out


def gather_pages(pool: torch.Tensor, block_table, n: int, block_size: int) -> torch.Tensor:
    """The first n positions of one sequence from a pool (n_kv, slots, hd) → (n_kv, n, hd)."""
    pos = torch.arange(n)
    table = torch.as_tensor(_as_list(block_table)[: -(-n // block_size)], dtype=torch.long)
    slots = table[pos // block_size] * block_size + pos % block_size
    return pool[:, slots.to(pool.device)]


def reference_paged_decode(q, k_pool, v_pool, block_tables, context_lens, block_size: int) -> torch.Tensor:
    """As `reference_decode`, with each row's keys gathered from the pools through its block table."""
    lens = _as_list(context_lens)
    tables = block_tables.tolist() if torch.is_tensor(block_tables) else block_tables
    out = torch.empty_like(q)
    for b, n in enumerate(lens):
        k = gather_pages(k_pool, tables[b], n, block_size)[None]
        v = gather_pages(v_pool, tables[b], n, block_size)[None]
        out[b:b + 1] = reference_decode(q[b:b + 1], k, v, [n])
    return out


def split_kv_reference(q, k, v, context_lens, num_splits: int) -> torch.Tensor:
    """Flash-decoding in torch: per slice, softmax partials and their log-sum-exp; then the
    reduction. Equal to `reference_decode` (the test checks it); the kernel does the same."""
    B, H, hd = q.shape
    group = H // k.shape[1]
    out = torch.empty_like(q)
    for b, n in enumerate(_as_list(context_lens)):
        split_len = -(-n // num_splits)
        partials, lses = [], []
        for s in range(num_splits):
            lo, hi = s * split_len, min((s + 1) * split_len, n)
            if lo >= hi:
                continue  # an empty slice: lse = -inf, weight 0
            kb = k[b, :, lo:hi].float().repeat_interleave(group, 0)
            vb = v[b, :, lo:hi].float().repeat_interleave(group, 0)
            scores = torch.einsum("hd,hnd->hn", q[b].float(), kb) / math.sqrt(hd)
            lse = torch.logsumexp(scores, -1)  # (H,)
            partials.append(torch.einsum("hn,hnd->hd", (scores - lse[:, None]).exp(), vb))
            lses.append(lse)
        lse_all = torch.stack(lses)  # (splits, H)
        weights = (lse_all - lse_all.max(0).values).exp()  # each slice's share of the softmax mass
        out[b] = ((weights[..., None] * torch.stack(partials)).sum(0) / weights.sum(0)[:, None]).to(q.dtype)
    return out


def _as_list(lens) -> list[int]:
    return [int(n) for n in (lens.tolist() if torch.is_tensor(lens) else lens)]


# ---- Triton ---------------------------------------------------------------------------------
if triton is not None:
    @triton.jit
    def _attend_tile(q, k_base, v_base, table_ptr, n0, end, m_i, l_i, acc, qk_scale,
                     stride_kn, stride_kd, stride_vn, stride_vd, offs_d, mask_d,
                     BLOCK_N: tl.constexpr, PAGED: tl.constexpr, PAGE_SIZE: tl.constexpr, DOT_DTYPE: tl.constexpr,
                     DOT_PRECISION: tl.constexpr):
        """One tile of BLOCK_N keys (positions n0.. < end) folded into the running softmax."""
        offs_n = n0 + tl.arange(0, BLOCK_N)
        mask_n = offs_n < end
        if PAGED:  # position → (block from the table, offset in it) → slot of the pool
            blocks = tl.load(table_ptr + offs_n // PAGE_SIZE, mask=mask_n, other=0)
            rows = blocks * PAGE_SIZE + offs_n % PAGE_SIZE
        else:
            rows = offs_n
        mask_nd = mask_n[:, None] & mask_d[None, :]
        k = tl.load(k_base + rows[:, None] * stride_kn + offs_d[None, :] * stride_kd,
                    mask=mask_nd, other=0.0).to(tl.float32)  # (BLOCK_N, BLOCK_D)
        # scores (BLOCK_G, BLOCK_N) in log2 units: qk_scale folds log2(e) / sqrt(head_dim)
        s = tl.dot(q.to(DOT_DTYPE), tl.trans(k.to(DOT_DTYPE)), input_precision=DOT_PRECISION) * qk_scale
        s = tl.where(mask_n[None, :], s, float("-inf"))
        m_new = tl.maximum(m_i, tl.max(s, 1))  # finite: the tile holds at least one key
        alpha = tl.exp2(m_i - m_new)
        p = tl.exp2(s - m_new[:, None])
        l_i = l_i * alpha + tl.sum(p, 1)
        v = tl.load(v_base + rows[:, None] * stride_vn + offs_d[None, :] * stride_vd,
                    mask=mask_nd, other=0.0).to(tl.float32)
        acc = acc * alpha[:, None] + tl.dot(p.to(DOT_DTYPE), v.to(DOT_DTYPE), input_precision=DOT_PRECISION)
        return m_new, l_i, acc

    @triton.jit
    def _split_kv_kernel(
            # pointers
            q_ptr, k_ptr, v_ptr, block_table_ptr, context_lens_ptr, o_part_ptr, lse_part_ptr,
            # sizes
            split_len, qk_scale,
            # strides
            stride_qb, stride_qh, stride_qd,
            stride_kb, stride_kh, stride_kn, stride_kd,
            stride_vb, stride_vh, stride_vn, stride_vd,
            stride_btb,
            stride_ob, stride_oh, stride_os, stride_od,
            stride_lb, stride_lh, stride_ls,
            # meta
            GROUP: tl.constexpr, BLOCK_G: tl.constexpr, HEAD_DIM: tl.constexpr, BLOCK_D: tl.constexpr,
            BLOCK_N: tl.constexpr, PAGED: tl.constexpr, PAGE_SIZE: tl.constexpr, DOT_DTYPE: tl.constexpr,
            DOT_PRECISION: tl.constexpr, INTERPRETED: tl.constexpr):
        pid_b = tl.program_id(0)
        pid_kvh = tl.program_id(1)
        pid_s = tl.program_id(2)
        context_len = tl.load(context_lens_ptr + pid_b)
        start = pid_s * split_len
        end = tl.minimum(start + split_len, context_len)

        offs_g = tl.arange(0, BLOCK_G)  # query heads of this KV head (padded to a dot-sized tile)
        offs_d = tl.arange(0, BLOCK_D)
        mask_g = offs_g < GROUP
        mask_d = offs_d < HEAD_DIM
        heads = pid_kvh * GROUP + offs_g
        q = tl.load(q_ptr + pid_b * stride_qb + heads[:, None] * stride_qh + offs_d[None, :] * stride_qd,
                    mask=mask_g[:, None] & mask_d[None, :], other=0.0).to(tl.float32)

        m_i = tl.full([BLOCK_G], float("-inf"), dtype=tl.float32)  # running max (log2 units)
        l_i = tl.zeros([BLOCK_G], dtype=tl.float32)  # running sum of exp2(s - m_i)
        acc = tl.zeros([BLOCK_G, BLOCK_D], dtype=tl.float32)
        k_base = k_ptr + pid_kvh * stride_kh
        v_base = v_ptr + pid_kvh * stride_vh
        if not PAGED:
            k_base += pid_b * stride_kb
            v_base += pid_b * stride_vb
        # The same tile step in both loops: a `for` with run-time bounds on a GPU (pipelined loads);
        # a `while` under the interpreter, whose scalars are 1-element arrays that `range` rejects.
        if INTERPRETED:
            n0 = start
            while n0 < end:
                m_i, l_i, acc = _attend_tile(q, k_base, v_base, block_table_ptr + pid_b * stride_btb, n0, end,
                                             m_i, l_i, acc, qk_scale, stride_kn, stride_kd, stride_vn, stride_vd,
                                             offs_d, mask_d, BLOCK_N, PAGED, PAGE_SIZE, DOT_DTYPE,
                                             DOT_PRECISION)
                n0 += BLOCK_N
        else:
            for n0 in range(start, end, BLOCK_N):
                m_i, l_i, acc = _attend_tile(q, k_base, v_base, block_table_ptr + pid_b * stride_btb, n0, end,
                                             m_i, l_i, acc, qk_scale, stride_kn, stride_kd, stride_vn, stride_vd,
                                             offs_d, mask_d, BLOCK_N, PAGED, PAGE_SIZE, DOT_DTYPE,
                                             DOT_PRECISION)

        has_keys = l_i > 0.0  # an empty slice (past this row's context) contributes nothing
        out = acc / tl.where(has_keys, l_i, 1.0)[:, None]
        lse = tl.where(has_keys, m_i + tl.log2(tl.where(has_keys, l_i, 1.0)), float("-inf"))
        o_ptrs = o_part_ptr + pid_b * stride_ob + heads[:, None] * stride_oh + pid_s * stride_os + \
            offs_d[None, :] * stride_od
        tl.store(o_ptrs, out, mask=mask_g[:, None] & mask_d[None, :])
        tl.store(lse_part_ptr + pid_b * stride_lb + heads * stride_lh + pid_s * stride_ls, lse, mask=mask_g)

    @triton.jit
    def _reduce_kernel(
            # pointers
            o_part_ptr, lse_part_ptr, out_ptr,
            # sizes
            num_splits,
            # strides
            stride_ob, stride_oh, stride_os, stride_od,
            stride_lb, stride_lh, stride_ls,
            stride_yb, stride_yh, stride_yd,
            # meta
            HEAD_DIM: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_S: tl.constexpr):
        pid_b = tl.program_id(0)
        pid_h = tl.program_id(1)
        offs_s = tl.arange(0, BLOCK_S)
        offs_d = tl.arange(0, BLOCK_D)
        mask_s = offs_s < num_splits
        mask_d = offs_d < HEAD_DIM
        lse = tl.load(lse_part_ptr + pid_b * stride_lb + pid_h * stride_lh + offs_s * stride_ls,
                      mask=mask_s, other=float("-inf"))
        weights = tl.exp2(lse - tl.max(lse, 0))  # slice 0 always has keys: the max is finite
        o = tl.load(o_part_ptr + pid_b * stride_ob + pid_h * stride_oh + offs_s[:, None] * stride_os +
                    offs_d[None, :] * stride_od, mask=mask_s[:, None] & mask_d[None, :], other=0.0)
        y = tl.sum(weights[:, None] * o, 0) / tl.sum(weights, 0)
        tl.store(out_ptr + pid_b * stride_yb + pid_h * stride_yh + offs_d * stride_yd,
                 y.to(out_ptr.dtype.element_ty), mask=mask_d)


BLOCK_N = 64  # keys per tile: a 64 x 128 bf16 tile is 16 KiB, streamed once


def default_num_splits(programs: int, max_context: int, device: torch.device) -> int:
    """Enough slices that B * n_kv * splits programs fill the GPU about twice over, but no slice
    shorter than a few tiles (each slice costs a partial write and a share of the reduction)."""
    if device.type != "cuda":
        return 1
    sms = torch.cuda.get_device_properties(device).multi_processor_count
    by_occupancy = -(-2 * sms // max(programs, 1))
    by_length = max(1, max_context // (4 * BLOCK_N))
    return max(1, min(by_occupancy, by_length, 64))


def _launch(q, k, v, block_tables, context_lens, max_context: int, num_splits: int | None,
            block_n: int | None, page_size: int, paged: bool) -> torch.Tensor:
    if triton is None:
        raise RuntimeError("triton is not installed: the flash-decoding kernel cannot run here")
    B, H, hd = q.shape
    n_kv = k.shape[-3]
    if H % n_kv:
        raise ValueError(f"flash_decode: {H} query heads is not a multiple of {n_kv} KV heads")
    if k.shape[-1] != hd or v.shape != k.shape:
        raise ValueError(f"flash_decode: q {tuple(q.shape)}, k {tuple(k.shape)}, v {tuple(v.shape)} disagree")
    if context_lens.shape != (B,) or context_lens.device != q.device:
        raise ValueError(f"flash_decode: context_lens must be ({B},) on {q.device}")
    block_n = block_n or BLOCK_N
    group = H // n_kv
    splits = num_splits or default_num_splits(B * n_kv, max_context, q.device)
    split_len = triton.cdiv(triton.cdiv(max_context, splits), block_n) * block_n
    o_part = torch.empty((B, H, splits, hd), device=q.device, dtype=torch.float32)
    lse_part = torch.empty((B, H, splits), device=q.device, dtype=torch.float32)
    out = torch.empty_like(q)
    if paged:  # pools (n_kv, slots, hd): no batch dimension, rows come from the block table
        stride_kb = stride_vb = 0
        kh, kn, kd = k.stride()
        vh, vn, vd = v.stride()
        stride_btb = block_tables.stride(0)
    else:  # (B, n_kv, S, hd), any strides: a view of a longer cache buffer is fine
        stride_kb, kh, kn, kd = k.stride()
        stride_vb, vh, vn, vd = v.stride()
        block_tables, stride_btb = context_lens, 0  # unused
    _split_kv_kernel[(B, n_kv, splits)](
        q, k, v, block_tables, context_lens, o_part, lse_part,
        split_len, LOG2E / math.sqrt(hd),
        q.stride(0), q.stride(1), q.stride(2),
        stride_kb, kh, kn, kd,
        stride_vb, vh, vn, vd,
        stride_btb,
        o_part.stride(0), o_part.stride(1), o_part.stride(2), o_part.stride(3),
        lse_part.stride(0), lse_part.stride(1), lse_part.stride(2),
        GROUP=group, BLOCK_G=max(16, triton.next_power_of_2(group)), HEAD_DIM=hd,
        BLOCK_D=max(16, triton.next_power_of_2(hd)), BLOCK_N=block_n, PAGED=paged, PAGE_SIZE=page_size,
        DOT_DTYPE=dot_dtype(q), DOT_PRECISION=dot_precision(q), INTERPRETED=interpreting(),
        num_warps=4, num_stages=2)
    _reduce_kernel[(B, H)](
        o_part, lse_part, out, splits,
        o_part.stride(0), o_part.stride(1), o_part.stride(2), o_part.stride(3),
        lse_part.stride(0), lse_part.stride(1), lse_part.stride(2),
        out.stride(0), out.stride(1), out.stride(2),
        HEAD_DIM=hd, BLOCK_D=max(16, triton.next_power_of_2(hd)), BLOCK_S=max(2, triton.next_power_of_2(splits)),
        num_warps=4)
    return out


def flash_decode(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, context_lens: torch.Tensor, *,
                 num_splits: int | None = None, block_n: int | None = None) -> torch.Tensor:
    """q (B, H, hd); k, v (B, n_kv, S, hd), e.g. a view of the contiguous cache; context_lens
    (B,) int32 on q's device: row b attends over keys 0..context_lens[b]-1 (each >= 1, <= S).
    num_splits: slices of the context (default: fill the GPU). Returns (B, H, hd) in q's dtype."""
    if k.dim() != 4 or q.dim() != 3:
        raise ValueError(f"flash_decode: q must be (B, H, hd) and k (B, n_kv, S, hd), got {tuple(q.shape)}, "
                         f"{tuple(k.shape)}")
    return _launch(q, k, v, None, context_lens, k.shape[2], num_splits, block_n, 1, paged=False)


def paged_flash_decode(q: torch.Tensor, k_pool: torch.Tensor, v_pool: torch.Tensor, block_tables: torch.Tensor,
                       context_lens: torch.Tensor, block_size: int, *, num_splits: int | None = None,
                       block_n: int | None = None) -> torch.Tensor:
    """q (B, H, hd); k_pool, v_pool (n_kv, num_blocks * block_size, hd): position p of row b is
    slot block_tables[b, p // block_size] * block_size + p % block_size; block_tables (B, max_blocks)
    int32; context_lens (B,) int32. Returns (B, H, hd) in q's dtype."""
    if k_pool.dim() != 3 or q.dim() != 3:
        raise ValueError(f"paged_flash_decode: q must be (B, H, hd) and pools (n_kv, slots, hd), got "
                         f"{tuple(q.shape)}, {tuple(k_pool.shape)}")
    if block_tables.dim() != 2 or block_tables.shape[0] != q.shape[0] or block_tables.dtype != torch.int32:
        raise ValueError(f"paged_flash_decode: block_tables must be int32 ({q.shape[0]}, max_blocks)")
    max_context = block_tables.shape[1] * block_size
    return _launch(q, k_pool, v_pool, block_tables, context_lens, max_context, num_splits, block_n, block_size,
                   paged=True)
