"""The load checks on a working and a broken kernel, and the dispatch around a kernel switched
off: the quantised linears and attention take their PyTorch path. Without a GPU the Triton code
runs under TRITON_INTERPRET=1 on CPU tensors (set before kernels/ is imported), on tiny shapes."""
import os

import pytest
import torch

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
if DEVICE == "cpu":
    os.environ.setdefault("TRITON_INTERPRET", "1")

triton = pytest.importorskip("triton")

import kernels.flash_decode as flash_module  # noqa: E402
import kernels.int4_matmul as int4_module  # noqa: E402
import kernels.int8_matmul as int8_module  # noqa: E402
from engine.kernel_checks import CHECKS, check_flash, check_int4, check_int8, check_paged, run_check  # noqa: E402
from engine.model import attention, quant  # noqa: E402
from engine.model.config import ModelConfig  # noqa: E402
from engine.model.quant import Int4Linear, Int8Linear  # noqa: E402
from engine.context import EngineContext  # noqa: E402
from engine.kv.cache import PagedKV  # noqa: E402
from tests.engine.test_attention import paged_handles, qkv  # noqa: E402

# the shapes the checks take from a model: its heads, head size and a layer's weight (w_down)
CFG = ModelConfig(name="tiny", dim=48, n_layers=1, n_heads=6, n_kv_heads=2, ffn_dim=96, vocab_size=64,
                  max_seq_len=256)


def weight(dtype=torch.float32):
    return torch.randn(CFG.dim, CFG.ffn_dim, generator=torch.Generator().manual_seed(1)).to(DEVICE, dtype)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=str)
def test_working_kernels_pass_their_checks(dtype):
    assert check_int8(weight(dtype)) == ""
    assert check_int4(weight(dtype), 32) == ""
    assert check_flash(CFG, dtype, DEVICE) == ""
    assert check_paged(CFG, dtype, DEVICE) == ""


def off_by_a_little(kernel):
    """A kernel whose every output is 5% too large: a wrong scale, say."""
    return lambda *args, **kwargs: kernel(*args, **kwargs) * 1.05


def test_a_wrong_kernel_fails_its_check_with_its_error(monkeypatch):
    monkeypatch.setattr(int8_module, "int8_matmul", off_by_a_little(int8_module.int8_matmul))
    assert check_int8(weight()) == "1 rows: max error 0.05 of the largest output, allowed 0.0001"
    monkeypatch.setattr(int4_module, "int4_matmul", off_by_a_little(int4_module.reference_int4_matmul))
    assert check_int4(weight(), 32).startswith("1 rows, group 32: max error 0.05")
    # attention that forgets the masked tail: the short row reads keys past its length
    monkeypatch.setattr(flash_module, "flash_decode",
                        lambda q, k, v, lens: flash_module.reference_decode(q, k, v, [k.shape[2]] * q.shape[0]))
    assert check_flash(CFG, torch.float32, DEVICE).startswith("max error")


def test_a_kernel_that_raises_fails_its_check_in_one_line(monkeypatch):
    def broken(*args, **kwargs):
        raise RuntimeError("PassManager::run failed\nwith a long compiler log")
    monkeypatch.setattr(flash_module, "paged_flash_decode", broken)
    paged = next(c for c in CHECKS if c.kernel == "paged")
    engine = type("Engine", (), {"cfg": CFG, "device": DEVICE, "progress": None, "context": EngineContext(),
                                 "model": type("Model", (), {"dtype": torch.float32})()})()
    result = run_check(paged, engine)
    assert result.ran and result.problem == "RuntimeError: PassManager::run failed" and result.seconds >= 0


# ---- the dispatch: a switched-off kernel is not launched ----------------------------------------
def spy(monkeypatch, module, name):
    calls = []
    kernel = getattr(module, name)
    monkeypatch.setattr(module, name, lambda *args, **kwargs: calls.append(name) or kernel(*args, **kwargs))
    return calls


@pytest.mark.parametrize("kind", ["int8", "int4"])
def test_a_switched_off_matmul_kernel_leaves_the_layer_on_its_reference(monkeypatch, kind):
    w = torch.randn(40, 64, generator=torch.Generator().manual_seed(2)).to(DEVICE)
    calls = []
    # the layer's torch custom op, straight to the kernel (the op's first call imports torch._dynamo: seconds)
    if kind == "int8":
        layer = Int8Linear.from_weight(w)
        monkeypatch.setattr(quant, "_int8_op", lambda *args: calls.append(kind) or int8_module.int8_matmul(*args))
    else:
        layer = Int4Linear.from_weight(w, 32)
        monkeypatch.setattr(quant, "_int4_op", lambda *args: calls.append(kind) or int4_module.int4_matmul(*args))
    layer.backend = "triton"  # what a CUDA device chooses; the kernel runs interpreted here
    layer.context = EngineContext()  # its engine's (Transformer.bind does this for a model's layers)
    x = torch.randn(3, 64, generator=torch.Generator().manual_seed(3)).to(DEVICE)
    torch.testing.assert_close(layer(x), layer.reference(x), rtol=1e-4, atol=1e-4)
    assert calls == [kind]
    layer.context.kernels.disable(kind, "failed its check")
    assert torch.equal(layer(x), layer.reference(x)) and calls == [kind]


def test_a_switched_off_flash_kernel_leaves_decode_to_sdpa(monkeypatch):
    monkeypatch.setattr(attention, "_on_gpu", lambda q: True)  # the GPU's branch, with CPU tensors
    calls = spy(monkeypatch, flash_module, "flash_decode")
    q, k, v = (t.to(DEVICE) for t in qkv(2, 6, 2, 1, 23))  # a compiled kernel takes only the GPU's tensors
    context = EngineContext()
    with_kernel = attention.attend(q, k, v, "flash", context=context)
    assert calls == ["flash_decode"]
    context.kernels.disable("flash", "failed its check")
    assert attention.attend(q, k, v, "flash", context=EngineContext()) is not None and len(calls) == 2  # another's
    without = attention.attend(q, k, v, "flash", context=context)
    assert calls == ["flash_decode", "flash_decode"]
    torch.testing.assert_close(without, with_kernel, rtol=1e-5, atol=1e-5)


def test_a_switched_off_paged_kernel_leaves_decode_to_the_gathered_keys(monkeypatch):
    monkeypatch.setattr(attention, "_on_gpu", lambda q: True)
    paged_calls = spy(monkeypatch, flash_module, "paged_flash_decode")
    k, v = (PagedKV(h.pool.to(DEVICE), h.layout) for h in paged_handles([21, 7, 13], block_size=16)[:2])
    q = torch.randn(3, 6, 1, 24, generator=torch.Generator().manual_seed(4)).to(DEVICE)
    context = EngineContext()
    with_kernel = attention.attend(q, k, v, "flash", context=context)
    assert paged_calls == ["paged_flash_decode"]
    context.kernels.disable("paged", "failed its check")
    flash_calls = spy(monkeypatch, flash_module, "flash_decode")
    without = attention.attend(q, k, v, "flash", context=context)
    assert paged_calls == ["paged_flash_decode"] and flash_calls == ["flash_decode"]  # the dense keys' kernel
    torch.testing.assert_close(without, with_kernel, rtol=1e-5, atol=1e-5)
