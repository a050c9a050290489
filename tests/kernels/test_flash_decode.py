"""The flash-decoding kernels against their torch references: contiguous and paged, GQA, ragged
context lengths that are not multiples of the tile or block size, 1 and 3 splits (with empty
splits), block sizes 16 and 32, fp32 and bf16. Without a GPU they run under TRITON_INTERPRET=1."""
import os
import platform

import pytest
import torch

if not torch.cuda.is_available():
    os.environ["TRITON_INTERPRET"] = "1"  # before the kernels are defined

if platform.system() != "Linux":  # Triton ships Linux wheels only (pyproject's test extra)
    pytest.skip("Triton is not installed off Linux", allow_module_level=True)
import triton  # noqa: E402, F401  (on Linux a missing Triton fails here)

from kernels.flash_decode import (  # noqa: E402
    flash_decode,
    paged_flash_decode,
    reference_decode,
    reference_paged_decode,
    split_kv_reference,
)

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
TOLERANCE = {torch.float32: 2e-5, torch.bfloat16: 2e-2}


def report(got: torch.Tensor, want: torch.Tensor) -> str:
    err = (got.float() - want.float()).abs()
    return f"max error {err.max().item():.3g}, mean {err.mean().item():.3g}"


def check(got, want, dtype):
    tol = TOLERANCE[dtype]
    assert got.dtype == want.dtype and got.shape == want.shape
    assert torch.allclose(got.float(), want.float(), rtol=tol, atol=tol), report(got, want)


def make(B, H, n_kv, hd, S, dtype, seed=0):
    g = torch.Generator().manual_seed(seed)
    q = torch.randn(B, H, hd, generator=g)
    k = torch.randn(B, n_kv, S + 3, hd, generator=g)[:, :, :S]  # a view of a longer cache buffer
    v = torch.randn(B, n_kv, S + 3, hd, generator=g)[:, :, :S]
    return [t.to(DEVICE, dtype) for t in (q, k, v)]


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("num_splits", [1, 3])
@pytest.mark.parametrize("B,H,n_kv,hd,lens", [
    (1, 4, 4, 32, [37]),  # no GQA, context not a multiple of the tile
    (3, 6, 2, 40, [50, 17, 1]),  # GQA 3:1, ragged rows, a row with one key, head dim not a power of two
])
def test_flash_decode_matches_the_reference(dtype, num_splits, B, H, n_kv, hd, lens):
    q, k, v = make(B, H, n_kv, hd, max(lens), dtype)
    context_lens = torch.tensor(lens, dtype=torch.int32, device=DEVICE)
    got = flash_decode(q, k, v, context_lens, num_splits=num_splits, block_n=16)
    check(got, reference_decode(q, k, v, lens), dtype)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("num_splits", [1, 3])
@pytest.mark.parametrize("block_size", [16, 32])
def test_paged_decode_reads_through_shuffled_block_tables(dtype, num_splits, block_size):
    B, H, n_kv, hd, num_blocks = 3, 6, 2, 24, 9
    lens = [2 * block_size + 5, 1, block_size]  # a partial last block, a single key, exactly one block
    g = torch.Generator().manual_seed(1)
    k_pool = torch.randn(n_kv, num_blocks * block_size, hd, generator=g).to(DEVICE, dtype)
    v_pool = torch.randn(n_kv, num_blocks * block_size, hd, generator=g).to(DEVICE, dtype)
    q = torch.randn(B, H, hd, generator=g).to(DEVICE, dtype)
    tables = torch.tensor([[7, 2, 5], [4, 0, 0], [8, 0, 0]], dtype=torch.int32, device=DEVICE)  # padded with 0
    context_lens = torch.tensor(lens, dtype=torch.int32, device=DEVICE)
    got = paged_flash_decode(q, k_pool, v_pool, tables, context_lens, block_size, num_splits=num_splits, block_n=16)
    check(got, reference_paged_decode(q, k_pool, v_pool, tables, lens, block_size), dtype)


@pytest.mark.parametrize("num_splits", [1, 2, 3, 7])
def test_split_kv_reference_is_the_plain_softmax(num_splits):
    """The two-stage algorithm the kernel implements, checked in torch (fp32), empty splits included."""
    g = torch.Generator().manual_seed(2)
    q = torch.randn(2, 4, 16, generator=g)
    k, v = torch.randn(2, 2, 29, 16, generator=g), torch.randn(2, 2, 29, 16, generator=g)
    lens = [29, 5]
    torch.testing.assert_close(split_kv_reference(q, k, v, lens, num_splits), reference_decode(q, k, v, lens),
                               rtol=1e-5, atol=1e-5)


def test_bad_inputs_are_refused_with_a_message():
    q, k, v = make(2, 4, 2, 16, 8, torch.float32)
    lens = torch.tensor([8, 8], dtype=torch.int32, device=DEVICE)
    with pytest.raises(ValueError, match="context_lens"):
        flash_decode(q, k, v, lens[:1])
    with pytest.raises(ValueError, match="multiple"):
        flash_decode(q[:, :3], k, v, lens)
    with pytest.raises(ValueError, match="block_tables"):
        paged_flash_decode(q, k[0], v[0], torch.zeros(2, 1, dtype=torch.int64, device=DEVICE), lens, 16)
    with pytest.raises(ValueError, match="no keys"):
        reference_decode(q, k, v, [8, 0])


@pytest.mark.parametrize("pos", [0, 70, 199])
def test_the_captured_steps_attention_reads_the_live_keys_of_the_whole_buffer(monkeypatch, pos):
    """engine/graphs.py's step hands attention the whole cache buffer and the position as a tensor
    (one graph for every length). On a GPU the op runs this kernel, whose loop stops at pos + 1:
    keys past it are NaN here and never read. Without the kernel the op masks the whole buffer and
    reads it (the NaN comes through): what the cost model is told (captured_reads_whole_buffer)."""
    from engine.model import attention
    monkeypatch.setattr(attention, "_on_gpu", lambda q: True)  # the GPU's branch, on these CPU tensors
    g = torch.Generator().manual_seed(pos)
    B, H, n_kv, S, hd = 1, 4, 2, 200, 16
    q = torch.randn(B, H, 1, hd, generator=g).to(DEVICE)
    k, v = torch.randn(B, n_kv, S, hd, generator=g).to(DEVICE), torch.randn(B, n_kv, S, hd, generator=g).to(DEVICE)
    k[:, :, pos + 1:], v[:, :, pos + 1:] = float("nan"), float("nan")
    at = torch.tensor([pos], device=DEVICE)
    got = attention.decode_attention(q, k, v, at, "flash")
    assert not attention.captured_reads_whole_buffer(True, "flash")
    check(got[:, :, 0], reference_decode(q[:, :, 0], k, v, [pos + 1]), torch.float32)
    assert attention.captured_reads_whole_buffer(True, "naive")
    assert pos == S - 1 or torch.isnan(attention.decode_attention(q, k, v, at, "naive")).all()
