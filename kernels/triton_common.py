"""What the Triton kernels here share: triton itself where it is installed (None elsewhere: the
references still work), whether triton interprets (TRITON_INTERPRET=1, the tests), the device check,
the dot's operand type and precision, and the weight-only matmuls' launch (split-K, tuning)."""
from __future__ import annotations

import os
from typing import Callable

import torch

from kernels.tuning import TUNED, Config

try:
    import triton
    import triton.language as tl
except ImportError:  # a CPU-only install: the references still work
    triton = tl = None

ACTIVATION_DTYPES = (torch.float16, torch.bfloat16, torch.float32)


def interpreting() -> bool:
    """Triton runs kernels in its interpreter (TRITON_INTERPRET=1: CPU tensors, the tests)."""
    return os.environ.get("TRITON_INTERPRET", "0") not in ("", "0")


def check_device(x: torch.Tensor, what: str) -> None:
    """The kernels run on CUDA tensors; CPU tensors only under TRITON_INTERPRET=1 (the tests)."""
    if triton is None:
        raise RuntimeError(f"triton is not installed: the {what} Triton kernel cannot run here")
    if not x.is_cuda and not interpreting():
        raise RuntimeError(f"the {what} Triton kernel needs CUDA tensors, got {x.device} "
                           "(CPU tensors only under TRITON_INTERPRET=1, for tests)")


def dot_dtype(x: torch.Tensor):
    """fp32 dots on CPU tensors (the interpreter mishandles bf16 arithmetic) and for fp32
    activations; the activation's own 16-bit type on a GPU (tensor cores)."""
    if x.device.type == "cpu" or x.dtype == torch.float32:
        return tl.float32
    return tl.bfloat16 if x.dtype == torch.bfloat16 else tl.float16


def dot_precision(x: torch.Tensor) -> str:
    """fp32 activations get exact fp32 dots ("ieee"), not TF32: PyTorch's fp32 matmul does not
    use TF32 by default, and the kernel should match it. Ignored for 16-bit operands."""
    return "ieee" if x.dtype == torch.float32 else "tf32"


def weight_matmul(x: torch.Tensor, n: int, k: int, what: str, start: Callable, key: tuple,
                  config: Config | None, allowed: Callable[[Config], bool] = lambda c: True) -> torch.Tensor:
    """A weight-only matmul's launch: x (..., K) → y (..., N) in x's dtype. `start(grid, x2, out, c)`
    launches the kernel on x2 (M, K) into out (M, N); with SPLIT_K > 1 the programs add into an fp32
    buffer (atomics) cast at the end. `config` None: the tuned one for `key` (kernels/tuning.py)."""
    if x.dtype not in ACTIVATION_DTYPES:
        raise ValueError(f"{what}: activations must be fp16, bf16 or fp32, got {x.dtype}")
    x2 = x.reshape(-1, k)
    m = x2.shape[0]

    def launch(c: Config) -> torch.Tensor:
        y = torch.empty if c.split_k == 1 else torch.zeros
        out = y((m, n), device=x.device, dtype=x.dtype if c.split_k == 1 else torch.float32)
        start((triton.cdiv(m, c.block_m), triton.cdiv(n, c.block_n), c.split_k), x2, out, c)
        return out if c.split_k == 1 else out.to(x.dtype)

    if config is None:
        config = TUNED.pick(key, m, launch, on_gpu=x.is_cuda, allowed=allowed)
    return launch(config).reshape(*x.shape[:-1], n)
