"""The Triton weight-only matmul kernels (INT8 per channel, INT4 group-wise) against their
pure-torch references, on awkward shapes. Without a GPU the Triton code itself runs under
TRITON_INTERPRET=1 on CPU tensors (set before kernels/ is imported); with one, compiled."""
import os
import platform

import pytest
import torch

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
if DEVICE == "cpu":
    os.environ.setdefault("TRITON_INTERPRET", "1")

if platform.system() != "Linux":  # Triton ships Linux wheels only (pyproject's test extra)
    pytest.skip("Triton is not installed off Linux", allow_module_level=True)
import triton  # noqa: E402, F401  (on Linux a missing Triton fails here)

from kernels.int4_matmul import int4_matmul, reference_int4_matmul  # noqa: E402
from kernels.int4_pack import pack_int4  # noqa: E402
from kernels.int8_matmul import int8_matmul, reference_int8_matmul  # noqa: E402
from kernels.tuning import Config  # noqa: E402

DTYPES = [torch.float32, torch.float16, torch.bfloat16]
# relative to the largest output: fp32 is exact but for summation order; 16-bit outputs are
# rounded once (and on a GPU the dequantised weights are rounded to the dtype for tensor cores)
TOLERANCE = {torch.float32: 1e-5, torch.float16: 4e-3, torch.bfloat16: 2e-2}


def errors(got: torch.Tensor, want: torch.Tensor) -> tuple[float, float]:
    """(max, mean) absolute error, relative to the largest |want|."""
    diff = (got.float() - want.float()).abs()
    scale = want.float().abs().max().clamp(min=1e-6)
    return (diff.max() / scale).item(), (diff.mean() / scale).item()


def assert_close(got, want, dtype, what):
    assert got.dtype == want.dtype and got.shape == want.shape, what
    worst, mean = errors(got, want)
    assert worst <= TOLERANCE[dtype], f"{what}: max error {worst:.2e}, mean {mean:.2e} (of max |y|)"


def int8_weight(n, k, gen):
    q = torch.randint(-127, 128, (n, k), generator=gen, dtype=torch.int8)
    scales = torch.rand(n, generator=gen) * 0.02 + 1e-3
    return q.to(DEVICE), scales.to(DEVICE)


def int4_weight(n, k, group, gen):
    codes = torch.randint(0, 16, (n, k), generator=gen, dtype=torch.uint8)
    scales = (torch.rand(n, k // group, generator=gen) * 0.02 + 1e-3).half()
    mins = (-torch.rand(n, k // group, generator=gen) * 0.15).half()
    return pack_int4(codes).to(DEVICE), scales.to(DEVICE), mins.to(DEVICE)


# M = 1 (decode), 3, 17 (past one 16-row tile); N and K not powers of two, K not a multiple of BLOCK_K
INT8_SHAPES = [(1, 37, 100), (3, 50, 160), (17, 24, 72)]


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("m,n,k", INT8_SHAPES)
@pytest.mark.parametrize("split_k", [1, 2])
def test_int8_kernel_matches_reference(m, n, k, dtype, split_k):
    gen = torch.Generator().manual_seed(m * 1000 + n + k)
    q, scales = int8_weight(n, k, gen)
    x = torch.randn(m, k, generator=gen).to(DEVICE, dtype)
    got = int8_matmul(x, q, scales, Config(block_m=16, block_n=16, block_k=32, split_k=split_k))
    assert_close(got, reference_int8_matmul(x, q, scales), dtype, f"int8 M={m} N={n} K={k}")


# (M, N, K, group, BLOCK_K): K spans several groups and ends inside a BLOCK_K tile
INT4_CASES = [(1, 37, 96, 32, 64), (3, 50, 160, 32, 128), (17, 24, 192, 64, 128), (1, 29, 384, 128, 256),
              (3, 21, 256, 128, 32)]


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("m,n,k,group,block_k", INT4_CASES)
def test_int4_kernel_matches_reference(m, n, k, group, block_k, dtype):
    gen = torch.Generator().manual_seed(m * 1000 + n + k)
    packed, scales, mins = int4_weight(n, k, group, gen)
    x = torch.randn(m, k, generator=gen).to(DEVICE, dtype)
    got = int4_matmul(x, packed, scales, mins, group, Config(block_m=16, block_n=16, block_k=block_k))
    want = reference_int4_matmul(x, packed, scales, mins, group)
    assert_close(got, want, dtype, f"int4 M={m} N={n} K={k} g={group}")


def test_split_k_int4_and_batched_input():
    gen = torch.Generator().manual_seed(7)
    packed, scales, mins = int4_weight(40, 192, 32, gen)
    x = torch.randn(2, 3, 192, generator=gen).to(DEVICE)  # (B, T, K): leading dims are kept
    got = int4_matmul(x, packed, scales, mins, 32, Config(16, 32, 64, split_k=3))
    assert got.shape == (2, 3, 40)
    assert_close(got, reference_int4_matmul(x, packed, scales, mins, 32), torch.float32, "int4 split-K")


def test_default_launch_path_picks_a_config():
    # no config: the tuner's choice (the first candidate without a GPU; timed on one)
    gen = torch.Generator().manual_seed(3)
    q, scales = int8_weight(48, 64, gen)
    x = torch.randn(1, 64, generator=gen).to(DEVICE)
    assert_close(int8_matmul(x, q, scales), reference_int8_matmul(x, q, scales), torch.float32, "int8 tuned")
    packed, s, mn = int4_weight(48, 64, 32, gen)
    assert_close(int4_matmul(x, packed, s, mn, 32), reference_int4_matmul(x, packed, s, mn, 32),
                 torch.float32, "int4 tuned")


def test_bad_inputs_get_one_line_errors():
    gen = torch.Generator().manual_seed(0)
    packed, scales, mins = int4_weight(16, 96, 32, gen)
    x = torch.randn(1, 96).to(DEVICE)
    with pytest.raises(ValueError, match="group size 64 does not divide K = 96"):
        int4_matmul(x, packed, scales[:, :1], mins[:, :1], 64)
    with pytest.raises(ValueError, match="group size must be one of"):
        int4_matmul(x, packed, scales, mins, 48)
    with pytest.raises(ValueError, match="x has 95 features"):
        int4_matmul(x[:, :95], packed, scales, mins, 32)
    with pytest.raises(ValueError, match="BLOCK_K must be >= 32"):
        int4_matmul(x, packed, scales, mins, 32, Config(16, 16, 16))
    q, s = int8_weight(16, 96, gen)
    with pytest.raises(ValueError, match="must be int8"):
        int8_matmul(x, q.float(), s)
    with pytest.raises(ValueError, match="activations must be"):
        int8_matmul(x.double(), q, s)
