"""Weight-only INT8 matmul: y = x @ (q * scale[:, None]).T, q int8 (N, K) with one scale per
output channel, dequantised in registers. `reference_int8_matmul` defines correctness.

Imports without a GPU (and without triton); the Triton wrapper itself needs CUDA tensors, or
CPU tensors under TRITON_INTERPRET=1 (tests only: the engine uses PyTorch's packed CPU kernel)."""
from __future__ import annotations

import torch

from kernels.triton_common import check_device, dot_dtype, dot_precision, tl, triton, weight_matmul
from kernels.tuning import Config


def reference_int8_matmul(x: torch.Tensor, q: torch.Tensor, scales: torch.Tensor) -> torch.Tensor:
    """x (..., K) · dequantised W (N, K)ᵀ, computed in fp32, returned in x's dtype."""
    return (x.float() @ (q.float() * scales.float()[:, None]).T).to(x.dtype)


if triton is not None:
    @triton.jit
    def _int8_matmul_kernel(
            # pointers
            x_ptr, w_ptr, scale_ptr, y_ptr,
            # sizes (K is a constexpr: the loop bound must be a Python int under the interpreter,
            # whose runtime-bound loops fail with numpy >= 2.4 in triton 3.6, triton-lang/triton#9171;
            # on a GPU it costs one compile per distinct K, two or three per model)
            M, N, K: tl.constexpr,
            # strides
            stride_xm, stride_xk, stride_wn, stride_wk, stride_ym, stride_yn,
            # meta
            BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, SPLIT_K: tl.constexpr,
            DOT_DTYPE: tl.constexpr, PRECISION: tl.constexpr):
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
            offs_k = k0 + tl.arange(0, BLOCK_K)
            mask_k = offs_k < K
            x = tl.load(x_ptr + offs_m[:, None] * stride_xm + offs_k[None, :] * stride_xk,
                        mask=mask_m[:, None] & mask_k[None, :], other=0.0)
            # W tile read as (BLOCK_K, BLOCK_N): W is (N, K) row-major, so K is the contiguous side
            w = tl.load(w_ptr + offs_k[:, None] * stride_wk + offs_n[None, :] * stride_wn,
                        mask=mask_k[:, None] & mask_n[None, :], other=0)
            # |q| <= 127 is exact in bf16/fp16: the per-channel scale is applied once, after the sum
            acc += tl.dot(x.to(tl.float32).to(DOT_DTYPE), w.to(tl.float32).to(DOT_DTYPE), input_precision=PRECISION)
        scale = tl.load(scale_ptr + offs_n, mask=mask_n, other=0.0).to(tl.float32)
        acc = acc * scale[None, :]
        y_ptrs = y_ptr + offs_m[:, None] * stride_ym + offs_n[None, :] * stride_yn
        mask = mask_m[:, None] & mask_n[None, :]
        if SPLIT_K == 1:
            tl.store(y_ptrs, acc.to(y_ptr.dtype.element_ty), mask=mask)
        else:
            tl.atomic_add(y_ptrs, acc, mask=mask)


def int8_matmul(x: torch.Tensor, q: torch.Tensor, scales: torch.Tensor, config: Config | None = None) -> torch.Tensor:
    """x (..., K) fp16/bf16/fp32; q (N, K) int8; scales (N,) → y (..., N) in x's dtype.
    config: a fixed launch configuration (tests); None tunes once per shape on the GPU."""
    check_device(x, "INT8")
    if q.dtype != torch.int8 or q.dim() != 2:
        raise ValueError(f"int8_matmul: weight must be int8 (N, K), got {q.dtype} {tuple(q.shape)}")
    n, k = q.shape
    if x.shape[-1] != k:
        raise ValueError(f"int8_matmul: x has {x.shape[-1]} features, the weight takes {k}")
    if scales.shape != (n,):
        raise ValueError(f"int8_matmul: scales must be ({n},), got {tuple(scales.shape)}")

    def start(grid, x2, out, c: Config) -> None:
        _int8_matmul_kernel[grid](
            x2, q, scales, out, x2.shape[0], n, k,
            x2.stride(0), x2.stride(1), q.stride(0), q.stride(1), out.stride(0), out.stride(1),
            BLOCK_M=c.block_m, BLOCK_N=c.block_n, BLOCK_K=c.block_k, SPLIT_K=c.split_k,
            DOT_DTYPE=dot_dtype(x), PRECISION=dot_precision(x), num_warps=c.num_warps, num_stages=c.num_stages)

    return weight_matmul(x, n, k, "int8_matmul", start, ("int8", n, k, x.dtype), config)
