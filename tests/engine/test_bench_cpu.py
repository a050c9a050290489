"""The bench's CPU additions: `--sweep precision` (each precision against the one before, a peer's
column beside them), `--profile` (the C++ step's phases, whose bytes add up to the cost model's),
and `--compare llamacpp` against the llama-server `make peers` builds (or one line saying how)."""
import json

import pytest
import torch

from engine.bench.llamacpp import (find_server, find_tool, gguf_matmul_bytes, missing_tools, run_batched_bench,
                                   run_llama_bench)
from engine.bench.profile import PROFILE_STEPS, format_profile, profile_step
from engine.bench.run import format_sweep, precision_variants, run_weight_sweep
from engine.bench.single import BenchResult
from engine.io.default_model import find_default_model
from engine.io.file_headers import read_gguf_header, tensor_nbytes
from engine.metrics import phase_bytes, step_cost
from kernels.cpu_decode import PHASES
from tests.engine.test_cli import assert_one_line_error, run_cli
from tests.engine.test_quant import tiny_engine


def fake_peer(tokens_per_s: float):
    return lambda: BenchResult("llama.cpp", 16, 4, 100.0, tokens_per_s, 0.01, 1.0, 2.0, 0.5, 0.01, 10.0, 1e6)


def test_precision_sweep_runs_each_precision_and_says_each_against_the_one_before():
    eng = tiny_engine()
    variants = precision_variants(eng.settings, 32)
    assert list(variants) == ["fp32", "bf16", "int8", "int4 g32"]
    assert [(s.dtype, s.weights) for s in variants.values()] == [("fp32", "fp"), ("bf16", "fp"), ("bf16", "int8"),
                                                                 ("bf16", "int4")]
    results, steps, quality, paths = run_weight_sweep(eng, variants, list(range(1, 17)), decode_tokens=4, repeats=1,
                                                      eval_tokens=64, progress=lambda f, m: None, peer=fake_peer(7.0))
    assert {s.settings_label for s in steps["bf16"]} == {variants["bf16"].label}
    ordered = [results[k] for k in variants] + [results["llama.cpp"]]
    table = format_sweep(ordered, quality, chain=True, quality_base="bf16", peers=1)
    rows = {line[:26].strip(): line[26:].split() for line in table.splitlines()[1:]}
    want = [f"{b.decode_tokens_per_s / a.decode_tokens_per_s:.2f}x" for a, b in zip(ordered[:3], ordered[1:4])]
    assert rows["speed-up vs column before"] == want  # the first column and the peer's have none
    assert rows["perplexity vs bf16"][1] == "+0.00%" and len(rows["perplexity"]) == 4  # none for the peer
    assert rows["decode tok/s"][-1] == "7.00"


def test_profile_phases_add_up_to_the_cost_models_bytes():
    eng = tiny_engine()
    for settings in precision_variants(eng.settings, 32).values():
        found = profile_step(eng, settings, list(range(1, 9)), steps=8)
        model = eng.model_for(settings)
        assert [p["phase"] for p in found["phases"]] == list(PHASES)
        cost = step_cost(eng.cfg, batch_size=1, new_tokens=1, context_len=found["context"],
                         weight_bytes=model.linear_weight_bytes(), kv_elem_bytes=model.embed.element_size(),
                         act_elem_bytes=model.embed.element_size())
        assert found["total_bytes"] == cost.total_bytes == sum(phase_bytes(model, found["context"]).values())
        assert found["step_ms"] > 0 and found["pytorch_operators_per_step"] > 50 and found["pytorch_top"]
        text = format_profile(settings.label, found, 10.0)
        assert "step (wall)" in text and "PyTorch's step instead" in text
    assert PROFILE_STEPS >= 8


def test_compare_llamacpp_without_the_server_says_how_to_get_it(capsys, monkeypatch, tmp_path):
    monkeypatch.setenv("MEMBOUND_LLAMA_SERVER", str(tmp_path / "no-such-llama-server"))
    code, _, err = run_cli(capsys, "bench", "--compare", "llamacpp", "--decode-tokens", "4")
    assert_one_line_error(code, err, "make peers")
    code, _, err = run_cli(capsys, "bench", "--compare", "llamacpp", "--model", "synthetic:smollm2-135m")
    assert_one_line_error(code, err, "needs a .gguf file")


def test_llamacpp_reads_the_gguf_tensors_as_stored():
    path = find_default_model()
    tensors = read_gguf_header(path).tensors
    assert "output.weight" not in {t.name for t in tensors}  # tied: token_embd is the output matrix
    assert gguf_matmul_bytes(path) == sum(tensor_nbytes(t) for t in tensors)


def test_compare_llamacpp_interleaves_both_on_the_same_gguf(capsys, tmp_path):
    assert find_server() is not None, "llama-server is built by `make peers` (part of `make test`)"
    path = tmp_path / "c.json"
    code, out, err = run_cli(capsys, "bench", "--compare", "llamacpp", "--prompt-tokens", "8", "--decode-tokens", "4",
                             "--repeats", "2", "--max-context", "64", "--json", str(path))
    assert code == 0, err
    header = next(line for line in out.splitlines() if line.split()[:1] == ["membound"])
    assert header.split() == ["membound", "fp32", "llama-bench", "llama-server", "ratio"]  # each figure's tool
    assert "ratio: membound fp32 / llama-bench" in out and "over HTTP" in out
    decode = next(line for line in out.splitlines() if line.startswith("decode tok/s")).split()
    # the ratio as printed (2 decimals) of the figures as printed: a rounding's worth apart at most
    ratio = float(decode[2].replace(",", "")) / float(decode[3].replace(",", ""))
    assert decode[-1].endswith("x") and float(decode[-1][:-1]) == pytest.approx(ratio, rel=0.02, abs=0.006)
    data = json.loads(path.read_text())
    assert len(data["runs"]) == 2 and data["threads"] == torch.get_num_threads()
    assert all(r["membound_decode_tokens_per_s"] > 0 and r["llama-bench_decode_tokens_per_s"] > 0
               and r["llama-server_decode_tokens_per_s"] > 0 for r in data["runs"])
    ours, bench, server = data["results"]
    assert ours["decode_tokens"] == bench["decode_tokens"] == server["decode_tokens"] == 4
    assert bench["prompt_tokens"] == server["prompt_tokens"] == 8


def test_llamacpp_own_benchmarks_on_the_default_gguf():
    """llama-bench (one sequence) and llama-batched-bench (parallel sequences), as `make peers` builds them."""
    assert not missing_tools(), "make peers (part of make test) builds llama.cpp's tools"
    bench = run_llama_bench(find_tool("llama-bench"), find_default_model(), 1, prompt_tokens=8, decode_tokens=4)
    assert bench.depth == 8 and bench.prefill_tokens_per_s > 0 and bench.decode_tokens_per_s > 0
    points, command = run_batched_bench(find_tool("llama-batched-bench"), find_default_model(), 1, 8, 4, [1, 3])
    assert sorted(points) == [1, 3] and "-npl 1,3" in command
    assert all(p.aggregate_tokens_per_s > 0 and p.decode_step_ms > 0 for p in points.values())
    one = points[1]
    assert one.aggregate_tokens_per_s == pytest.approx(1e3 / one.decode_step_ms, rel=1e-3)


@pytest.mark.parametrize("bad", [["--sweep", "kv"], ["--workload", "mixed"], ["--device", "cuda"],
                                 ["--sweep", "batch", "--device", "cuda"]])
def test_compare_llamacpp_refuses_what_it_cannot_compare(capsys, bad):
    code, _, err = run_cli(capsys, "bench", "--compare", "llamacpp", *bad)
    assert_one_line_error(code, err, "--compare llamacpp")


def test_the_bench_keeps_the_one_measured_roof(monkeypatch):
    """No probe after the runs re-decides the peak (it once did, a different peak than the app's): the
    results stay as measured against the device's cached roof, and the line names it."""
    from engine.bench.single import roof_peak
    from engine.hardware import detect
    eng = tiny_engine()
    start = eng.hardware.peak_bandwidth_gbs
    result = BenchResult("a", 16, 4, 100.0, 50.0, 0.01, 0.5 * start, start, 0.5, 0.01, 10.0, 1e6)
    monkeypatch.setattr(detect, "measure_bandwidth_gbs", lambda device, seconds: 2 * start)
    (same,), line = roof_peak(eng, [result])
    assert same == result and eng.hardware.peak_bandwidth_gbs == start
    assert line.startswith("peak: ") and f"{start:.1f} GB/s" in line

def test_a_timed_region_on_a_cpu_does_not_import_torch_compile():
    """PathWatch counts torch.compile's graphs only where dynamo is loaded: importing it to read zero
    cost every bench ~1 s before its first measurement (a fresh process: nothing else loaded it)."""
    import subprocess
    import sys
    code = ("import sys; from engine.bench.record import PathWatch; w = PathWatch(); w.report(); "
            "assert 'torch._dynamo' not in sys.modules, 'dynamo imported'; assert w.dynamo_graphs == 0")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-800:]
