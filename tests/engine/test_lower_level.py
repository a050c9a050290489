"""PyTorch held to a lower vector level (how an AVX2 laptop is reproduced here, docs/benchmarks.md): the
engine's batched linears and its prompt attention still run, in a fresh process with the level set."""
from __future__ import annotations

import os
import platform
import subprocess
import sys

import pytest

pytestmark = pytest.mark.skipif(platform.machine().lower() not in ("x86_64", "amd64"),
                                reason="the levels reproduced are x86's")

# a bf16 Linear over 16 rows (the packed oneDNN path) against F.linear, and a bf16 prompt's SDPA
SCRIPT = """
import os, torch, torch.nn.functional as F
import engine
from engine.model.transformer import Linear, cpu_packed_weight
torch.manual_seed(0)
for dtype in (torch.float32, torch.bfloat16):
    w = torch.randn(64, 32, dtype=dtype)
    x = torch.randn(16, 32, dtype=dtype)
    y = Linear(w)(x)
    assert torch.allclose(y.float(), F.linear(x, w).float(), atol=0.1, rtol=0.02), dtype
    q = torch.randn(1, 6, 40, 16, dtype=dtype); k = torch.randn(1, 2, 40, 16, dtype=dtype)
    F.scaled_dot_product_attention(q, k, k, is_causal=True, enable_gqa=True)
print("packed bf16:", cpu_packed_weight(torch.randn(64, 32, dtype=torch.bfloat16)) is not None)
print("onednn:", os.environ.get("ONEDNN_MAX_CPU_ISA"))
"""


def run(env: dict) -> str:
    done = subprocess.run([sys.executable, "-c", SCRIPT], env={**os.environ, **env}, capture_output=True,
                          text=True, timeout=120, cwd=os.path.dirname(os.path.dirname(os.path.dirname(__file__))))
    assert done.returncode == 0, done.stderr[-2000:]
    return done.stdout


def test_bf16_linears_run_where_onednn_has_no_bf16_path():
    # oneDNN held to AVX2 is an AVX2 laptop's: its bf16 weight reorder raises ("bf16 path needs the cpu
    # support avx_ne_convert or avx512bw..."); the batched bf16 linears take PyTorch's plain matmul
    out = run({"ATEN_CPU_CAPABILITY": "avx2", "ONEDNN_MAX_CPU_ISA": "AVX2"})
    assert "packed bf16: False" in out


def test_holding_pytorch_to_avx2_holds_onednn_there_too():
    # PyTorch at AVX2 with oneDNN free: on an Intel Xeon with AMX, bf16 SDPA raised "pack_vnni2 is only
    # supported when avx512 is supported"; the engine holds oneDNN to the same level unless told
    out = run({"ATEN_CPU_CAPABILITY": "avx2"})
    assert "onednn: AVX2" in out
