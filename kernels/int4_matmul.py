"""Weight-only INT4 matmul, group-wise asymmetric: w[n, k] = code * scale[n, g] + min[n, g]
with g = k // group and codes 0..15 packed two per byte along K (low nibble = even k). The
nibbles are unpacked and dequantised in registers. `reference_int4_matmul` defines correctness.

Imports without a GPU (and without triton); the Triton wrapper itself needs CUDA tensors, or
CPU tensors under TRITON_INTERPRET=1 (tests only: the engine uses PyTorch's packed CPU kernel)."""
from __future__ import annotations

import torch

from kernels.int4_pack import unpack_int4
from kernels.triton_common import check_device, dot_dtype, dot_precision, tl, triton, weight_matmul
from kernels.tuning import Config


def reference_int4_matmul(x: torch.Tensor, packed: torch.Tensor, scales: torch.Tensor, mins: torch.Tensor,
                          group_size: int) -> torch.Tensor:
    """x (..., K) · dequantised W (N, K)ᵀ, computed in fp32, returned in x's dtype."""
    codes = unpack_int4(packed).float()
    w = codes * scales.float().repeat_interleave(group_size, 1) + mins.float().repeat_interleave(group_size, 1)
    return (x.float() @ w.T).to(x.dtype)


if triton is not None:
    @triton.jit
    def _int4_matmul_kernel(
            # pointers
            x_ptr, w_ptr, scale_ptr, min_ptr, y_ptr,
            # sizes (K is a constexpr: the loop bound must be a Python int under the interpreter,
            # whose runtime-bound loops fail with numpy >= 2.4 in triton 3.6, triton-lang/triton#9171;
            # on a GPU it costs one compile per distinct K, two or three per model)
            M, N, K: tl.constexpr,
            # strides
            stride_xm, stride_xk, stride_wn, stride_wk, stride_sn, stride_sg, stride_ym, stride_yn,
            # meta
            GROUP: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
            SPLIT_K: tl.constexpr, DOT_DTYPE: tl.constexpr, PRECISION: tl.constexpr):
        pid_m = tl.program_id(0)
        pid_n = tl.program_id(1)
        pid_k = tl.program_id(2)
        offs_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
        offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
        mask_m = offs_m < M
        mask_n = offs_n < N
        acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
        # split-K: program pid_k takes every SPLIT_K-th BLOCK_K slice of K
        for k_start in range(0, K, BLOCK_K * SPLIT_K):
            k0 = k_start + pid_k * BLOCK_K
            # byte j of a row holds k = 2j and 2j + 1: the even and odd halves of the K tile are
            # multiplied separately, so the nibbles never need interleaving
            offs_byte = k0 // 2 + tl.arange(0, BLOCK_K // 2)
            k_even = 2 * offs_byte
            mask_k = k_even < K  # K is a multiple of GROUP, hence even
            mask_w = mask_k[:, None] & mask_n[None, :]
            packed = tl.load(w_ptr + offs_byte[:, None] * stride_wk + offs_n[None, :] * stride_wn,
                             mask=mask_w, other=0)  # (BLOCK_K/2, BLOCK_N) uint8
            # both nibbles of a byte share a group (GROUP is even)
            sg = offs_n[None, :] * stride_sn + (k_even // GROUP)[:, None] * stride_sg
            scale = tl.load(scale_ptr + sg, mask=mask_w, other=0.0).to(tl.float32)
            low = tl.load(min_ptr + sg, mask=mask_w, other=0.0).to(tl.float32)
            w_even = (packed & 0xF).to(tl.float32) * scale + low
            w_odd = (packed >> 4).to(tl.float32) * scale + low
            x_rows = x_ptr + offs_m[:, None] * stride_xm
            mask_x = mask_m[:, None] & mask_k[None, :]
            x_even = tl.load(x_rows + k_even[None, :] * stride_xk, mask=mask_x, other=0.0).to(tl.float32)
            x_odd = tl.load(x_rows + (k_even + 1)[None, :] * stride_xk, mask=mask_x, other=0.0).to(tl.float32)
            acc += tl.dot(x_even.to(DOT_DTYPE), w_even.to(DOT_DTYPE), input_precision=PRECISION)
            acc += tl.dot(x_odd.to(DOT_DTYPE), w_odd.to(DOT_DTYPE), input_precision=PRECISION)
        y_ptrs = y_ptr + offs_m[:, None] * stride_ym + offs_n[None, :] * stride_yn
        mask = mask_m[:, None] & mask_n[None, :]
        if SPLIT_K == 1:
            tl.store(y_ptrs, acc.to(y_ptr.dtype.element_ty), mask=mask)
        else:
            tl.atomic_add(y_ptrs, acc, mask=mask)


GROUP_SIZES = (32, 64, 128)


def int4_matmul(x: torch.Tensor, packed: torch.Tensor, scales: torch.Tensor, mins: torch.Tensor,
                group_size: int, config: Config | None = None) -> torch.Tensor:
    """x (..., K) fp16/bf16/fp32; packed (N, K/2) uint8; scales, mins (N, K/group) → y (..., N)
    in x's dtype. config: a fixed launch configuration (tests); None tunes once per shape on the GPU."""
    check_device(x, "INT4")
    if group_size not in GROUP_SIZES:
        raise ValueError(f"int4_matmul: group size must be one of {GROUP_SIZES}, got {group_size}")
    if packed.dtype != torch.uint8 or packed.dim() != 2:
        raise ValueError(f"int4_matmul: weight must be packed uint8 (N, K/2), got {packed.dtype} {tuple(packed.shape)}")
    n, k = packed.shape[0], 2 * packed.shape[1]
    if x.shape[-1] != k:
        raise ValueError(f"int4_matmul: x has {x.shape[-1]} features, the packed weight takes {k}")
    if k % group_size:
        raise ValueError(f"int4_matmul: group size {group_size} does not divide K = {k}")
    if scales.shape != (n, k // group_size) or mins.shape != scales.shape:
        raise ValueError(f"int4_matmul: scales and mins must be ({n}, {k // group_size}), "
                         f"got {tuple(scales.shape)} and {tuple(mins.shape)}")
    if config is not None and config.block_k < 32:
        raise ValueError(f"int4_matmul: BLOCK_K must be >= 32 (each half feeds tl.dot), got {config.block_k}")

    def start(grid, x2, out, c: Config) -> None:
        _int4_matmul_kernel[grid](
            x2, packed, scales, mins, out, x2.shape[0], n, k,
            x2.stride(0), x2.stride(1), packed.stride(0), packed.stride(1), scales.stride(0), scales.stride(1),
            out.stride(0), out.stride(1),
            GROUP=group_size, BLOCK_M=c.block_m, BLOCK_N=c.block_n, BLOCK_K=c.block_k, SPLIT_K=c.split_k,
            DOT_DTYPE=dot_dtype(x), PRECISION=dot_precision(x), num_warps=c.num_warps, num_stages=c.num_stages)

    # the unpacked halves of a K tile feed tl.dot, whose sides must be >= 16
    return weight_matmul(x, n, k, "int4_matmul", start, ("int4", n, k, group_size, x.dtype), config,
                         allowed=lambda c: c.block_k >= 32)
