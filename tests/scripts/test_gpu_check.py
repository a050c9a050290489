"""scripts/gpu_check.sh, the prepared GPU run, in its dry-run mode on this CPU: both passes run every
step on toy shapes and write their files; each step's status is asserted by name (so a step that
silently stops running fails here), and so is each CUDA-only check's "skipped: needs CUDA"; the
summary says what to run next. And its deadline: a planted hang is cut at its share of the budget
while the later steps still run; the nvidia-smi step makes few calls; no C++ build on the GPU host."""
import json
import os
import stat
import subprocess
import sys
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "scripts"))
import gpu_steps  # noqa: E402

# What each step must say on a CPU. "ok": it ran (on toy shapes); "skipped: needs CUDA": only a GPU
# can run it. In the order the pass runs them.
PASS_1 = {"env": "ok", "nvidia-smi": "skipped: needs CUDA", "nvml-probe": "skipped: needs CUDA", "kernel-tests": "ok",
          "smoke": "ok", "bench": "ok", "weights": "ok", "flash-decode": "ok", "speculative": "ok", "batch": "ok"}
PASS_2 = {"smoke-2": "ok", "overhead": "ok", "batch-sweep": "ok", "attention": "ok", "weights-8b": "ok"}
# the checks inside the steps, by name: what a CPU runs and what it leaves to a GPU
SMOKE_1 = {"static_step_matches_forward": "ok", "graph_matches_eager": "skipped: needs CUDA",
           "engine_uses_graphs": "skipped: needs CUDA", "batched_matches_solo": "ok", "speculation_matches_plain": "ok"}
SMOKE_2 = {"graph_matches_eager": "skipped: needs CUDA", "graph_writes_cache_in_place": "skipped: needs CUDA"}
FILES_1 = {"summary.txt", "gpu_check.log", "checks.json", "kernel-tests.xml", "bench-bf16.json", "sweep-weights.json",
           "sweep-batch.json"}
FILES_2 = {"summary.txt", "gpu_check.log", "checks.json", "sweep-batch.json", "sweep-attention.json",
           "sweep-weights.json"}
MAX_FILES_BACK = 8  # the device tool returns at most 8 files from $OUT
# A CPU shared by several sessions runs the toy steps far slower than a GPU host runs the real ones:
# the dry run's caps are the pass's shares of a larger budget (the deadline tests below use small ones)
DRY_BUDGET_S = "1500"


def gpu_check(out: Path, timeout_s: float, *args: str, **env) -> tuple[int, str, dict[str, dict]]:
    """Run the dry run; (exit code, output, {step: its summary row})."""
    run = subprocess.run(["bash", "scripts/gpu_check.sh", "--dry-run", *args], cwd=ROOT, capture_output=True, text=True,
                         timeout=timeout_s, env={**os.environ, "OUT": str(out), "PYTHON": sys.executable, **env})
    return run.returncode, run.stdout + run.stderr, gpu_steps.read_rows((out / "summary.txt").read_text())


def said(row: dict) -> str:
    """A row as the tables above spell it: "ok", or "skipped: " and the reason's first words."""
    if row["status"] == "skipped" and row["note"].startswith(gpu_steps.NEEDS_CUDA):
        return f"skipped: {gpu_steps.NEEDS_CUDA}"
    return row["status"] if row["status"] != "skipped" else f"skipped: {row['note']}"


@pytest.fixture(scope="module")
def pass_1(tmp_path_factory):
    out = tmp_path_factory.mktemp("gpu-check-1")
    return out, *gpu_check(out, 1800, "--pass", "1", GPU_CHECK_BUDGET_S=DRY_BUDGET_S)


@pytest.fixture(scope="module")
def pass_2(tmp_path_factory):
    out = tmp_path_factory.mktemp("gpu-check-2")
    return out, *gpu_check(out, 1800, "--pass", "2", GPU_CHECK_BUDGET_S=DRY_BUDGET_S)


def test_pass_1_runs_every_step_in_order_and_says_which_need_cuda(pass_1):
    out, code, output, rows = pass_1
    assert code == 0, output
    assert {step: said(row) for step, row in rows.items()} == PASS_1, output
    assert list(rows) == list(PASS_1) == list(gpu_steps.PASSES[1])
    assert "engine imports ok without gguf, PySide6, pyqtgraph" in rows["env"]["note"]
    assert "kernel figures skipped: needs CUDA" in rows["flash-decode"]["note"]
    checks = json.loads((out / "checks.json").read_text())
    assert {n: r["status"] + (f": {gpu_steps.NEEDS_CUDA}" if r["detail"].startswith(gpu_steps.NEEDS_CUDA) else "")
            for n, r in checks["smoke"].items()} == SMOKE_1
    assert checks["flash_decode"]["kernel"] == {"status": "skipped", "detail": "needs CUDA: no GPU here"}
    assert checks["nvidia_smi"]["skipped"].startswith(gpu_steps.NEEDS_CUDA)


def test_pass_1_writes_the_files_the_device_run_returns_and_says_what_is_next(pass_1):
    out = pass_1[0]
    files = {p.name for p in out.iterdir()}
    assert files == FILES_1 and len(files) <= MAX_FILES_BACK  # flat: no folder, nothing the tool would drop
    summary = (out / "summary.txt").read_text()
    assert "figures (measured in this run" in summary and "gpu_check pass 1: steps done in" in summary
    nexts = summary.split("\nnext:\n")[1].split("\n\n")[0].splitlines()
    assert nexts == ["  pass 2: bash scripts/gpu_check.sh --pass 2   (device tool run: timeout_s 330); start it at "
                     "once, while the machine is warm (a fresh start costs a minute or more of the loan)"]
    checks = json.loads((out / "checks.json").read_text())
    assert set(checks) == {"env", "nvidia_smi", "nvml_probe", "smoke", "flash_decode", "levers"}
    speculative = checks["levers"]["speculative"]  # oracle k = 4 vs k = 0, greedy and sampled
    assert {(r["source"], r["k"], r["sampling"]) for r in speculative["results"]} == {
        (s, k, m) for s, k in (("none", 0), ("oracle", 4)) for m in ("greedy", "sampled")}
    suite = ET.parse(out / "kernel-tests.xml").getroot().find("testsuite")
    assert int(suite.get("tests")) >= 2 and int(suite.get("failures")) == 0
    assert not [c for c in suite.iter("testcase") if "cpu_decode" in c.get("classname", "")]


@pytest.mark.parametrize("name", ["bench-bf16.json", "sweep-batch.json", "sweep-weights.json"])
def test_each_bench_json_says_which_path_ran(pass_1, name):
    data = json.loads((pass_1[0] / name).read_text())
    assert data["complete"] and data["torch"] and data["command"].startswith("membound bench")
    assert {"load", "warmup"} <= set(data["seconds"])  # compile and tuning time apart from the timed part
    assert data["clocks"]["before_timed"] == {"available": False, "reason": "not a GPU"}
    paths = data["paths"]
    for region in (paths.values() if "cuda_graphs" not in paths else [paths]):
        assert region["cuda_graphs"] and region["matmul"] and region["ops"]
        assert region["compiled_in_region"]["graph_captures"] == 0
        # on this CPU dry run: PyTorch's ops, or the C++ CPU decode step (engine/model/cpu_step.py)
        assert all(impl.startswith(("torch", "C++ CPU step")) for op in region["ops"].values() for impl in op
                   if impl != "eager")
    if name == "sweep-batch.json":  # batch 1 on the plain path too: the ratios against it
        assert data["single_stream"]["path"] == "eager: not on a GPU" and set(data["vs_single_stream"]) == {"1", "2"}
    if name == "sweep-weights.json":  # pass 1: INT8 and INT4 beside bf16 (the 1B shape), no perplexity
        assert [r["name"] for r in data["results"]] == ["bf16", "int8", "int4 g32"]


def test_pass_2_runs_the_sweeps_and_the_8b_weights(pass_2):
    out, code, output, rows = pass_2
    assert code == 0, output
    assert {step: said(row) for step, row in rows.items()} == PASS_2, output
    assert list(rows) == list(gpu_steps.PASSES[2])
    files = {p.name for p in out.iterdir()}
    assert files == FILES_2 and len(files) <= MAX_FILES_BACK
    checks = json.loads((out / "checks.json").read_text())
    assert {n: r["status"] + (f": {gpu_steps.NEEDS_CUDA}" if r["detail"].startswith(gpu_steps.NEEDS_CUDA) else "")
            for n, r in checks["smoke"].items()} == SMOKE_2
    overhead = checks["levers"]["overhead"]  # eager vs captured at batch 1
    assert overhead["command"].startswith("membound bench") and len(overhead["results"]) == 1
    assert json.loads((out / "sweep-attention.json").read_text())["kernel"][0]["skipped"] == "needs a GPU"
    summary = (out / "summary.txt").read_text()
    assert "nothing: both passes ran" in summary.split("\nnext:\n")[1]


def test_the_passes_fit_the_loan():
    """Each pass's caps add up to its budget less the summary's reserve and one kill's grace; two
    passes and a machine start fit 15 minutes with room to spare."""
    for n in (1, 2):
        caps = gpu_steps.nominal_caps(n)
        assert tuple(caps) == gpu_steps.PASSES[n]
        assert sum(caps.values()) <= 300 - 10 - 5
    start_s = 120  # a machine start: "a minute or more"
    assert start_s + 2 * (300 + gpu_steps.COMMAND_MARGIN_S) <= 15 * 60


def test_a_hung_step_is_cut_at_its_share_of_the_budget_and_the_next_steps_still_run(tmp_path):
    # budget 60 s: bench's share is 45/300 of it, 9 s
    code, output, rows = gpu_check(tmp_path, 200, GPU_CHECK_STEPS="bench,batch", GPU_CHECK_FAULT="bench:hang",
                                   GPU_CHECK_BUDGET_S="60", GPU_CHECK_CAPS="batch=120")
    assert code != 0  # a cut step makes the run fail
    bench = rows["bench"]
    assert (bench["status"], bench["rc"], bench["allowed"]) == ("TIMED-OUT", "124", 9), rows
    assert 9 <= bench["seconds"] < 14 and bench["note"].startswith("cut at 9 s")
    assert rows["batch"]["status"] in ("ok", "TIMED-OUT", "skipped"), output  # what the 60 s left it
    summary = (tmp_path / "summary.txt").read_text()
    assert "GPU_CHECK_STEPS=bench" in summary and "GPU_CHECK_CAPS=bench=18" in summary  # rerun with twice the time


def test_a_step_that_ignores_sigterm_is_killed_and_the_next_one_runs(tmp_path):
    code, output, rows = gpu_check(tmp_path, 300, GPU_CHECK_STEPS="bench,batch", GPU_CHECK_FAULT="bench:stubborn",
                                   GPU_CHECK_CAPS="bench=2,batch=200", GPU_CHECK_BUDGET_S="300")
    bench = rows["bench"]
    assert (bench["status"], bench["rc"], bench["allowed"]) == ("TIMED-OUT", "137", 2) and bench["seconds"] < 15
    assert rows["batch"]["status"] == "ok", output
    assert json.loads((tmp_path / "sweep-batch.json").read_text())["complete"]
    assert "1 ok, 0 failed, 1 timed out" in (tmp_path / "summary.txt").read_text()


def test_a_short_budget_gives_a_step_what_is_left_and_skips_the_rest(tmp_path):
    # budget 20 s: 10 kept for the summary, 5 for the kill: the hung step gets 5 s, not its share
    code, output, rows = gpu_check(tmp_path, 60, GPU_CHECK_STEPS="bench,batch", GPU_CHECK_FAULT="bench:hang",
                                   GPU_CHECK_BUDGET_S="20", GPU_CHECK_CAPS="bench=100", GPU_CHECK_MIN_STEP_S="1")
    bench = rows["bench"]
    assert (bench["status"], bench["rc"]) == ("TIMED-OUT", "124") and bench["allowed"] <= 5 and bench["seconds"] < 8
    assert said(rows["batch"]).startswith("skipped: no time left")
    assert "rerun what was cut or had no time: GPU_CHECK_STEPS=bench,batch" in (tmp_path / "summary.txt").read_text()


def test_the_nvidia_smi_step_makes_few_calls(tmp_path, monkeypatch):
    calls = tmp_path / "calls"
    fake = tmp_path / "bin" / "nvidia-smi"
    fake.parent.mkdir()
    fake.write_text(f'#!/bin/sh\necho "$@" >> {calls}\n'
                    'case "$1" in --query-gpu=*) n=$(echo "$1" | tr -cd , | wc -c); '
                    'i=0; line=""; while [ $i -le $n ]; do line="$line${line:+, }v$i"; i=$((i+1)); done; '
                    'echo "$line" ;; *) echo "Clocks: fine" ;; esac\n')
    fake.chmod(fake.stat().st_mode | stat.S_IEXEC)
    run = subprocess.run([sys.executable, "scripts/gpu_steps.py", "nvidia-smi"], cwd=ROOT, capture_output=True,
                         text=True, timeout=60, env={**os.environ, "OUT": str(tmp_path),
                                                     "PATH": f"{fake.parent}:{os.environ['PATH']}"})
    assert run.returncode == 0, run.stdout + run.stderr
    assert len(calls.read_text().splitlines()) == 2  # every field in one call, then the clock report
    assert json.loads((tmp_path / "checks.json").read_text())["nvidia_smi"]["name"] == "v0"


def test_a_rerun_gives_a_cut_step_twice_its_time_and_a_starved_one_its_own_cap():
    rows = {"bench": {"status": "TIMED-OUT", "rc": "124", "seconds": 55.2, "allowed": 55, "note": "cut at 55 s"},
            "weights": {"status": "ok", "rc": "0", "seconds": 60.0, "allowed": 65, "note": ""},
            "speculative": {"status": "skipped", "rc": "-", "seconds": 0.0, "allowed": 2, "note": "no time left (2 s)"}}
    lines = gpu_steps.next_steps(1, rows)
    assert lines[2].startswith("  pass 2: bash scripts/gpu_check.sh --pass 2")
    assert lines[3] == ("  then rerun what was cut or had no time: GPU_CHECK_STEPS=bench,speculative "
                        "GPU_CHECK_CAPS=bench=110,speculative=41 GPU_CHECK_BUDGET_S=166 bash scripts/gpu_check.sh "
                        "--pass 1   (device tool run: timeout_s 196)")


def test_the_kernel_tests_on_the_gpu_host_build_no_cpp():
    args = gpu_steps.kernel_test_args(Path("x.xml"), dry_run=False, xdist=True)
    assert "--ignore-glob=tests/kernels/test_cpu_decode*" in args and "-n" in args


def test_the_probe_samples_a_matmul_phase_then_a_copy_phase():
    from engine.hardware.nvml import HardwareSample

    class Sampler:
        def sample(self):
            return HardwareSample(t_s=0.0, sm_clock_mhz=1980.0)

    work = set()
    samples = gpu_steps.probe(Sampler(), work.add, seconds=0.3, interval_s=0.02)
    phases = [s["phase"] for s in samples]
    assert phases[0] == "matmul" and phases[-1] == "copy" and phases == sorted(phases, key=["matmul", "copy"].index)
    assert set(work) == {"matmul", "copy"} and samples[0]["sm_clock_mhz"] == 1980.0


def test_the_flash_launch_grid_times_each_launch_and_records_a_failure():
    # the GPU-only part of the flash-decode step, run here by the interpreter on a toy shape (a
    # subprocess: the interpreter must be chosen before the kernels are imported)
    code = """
import os, sys
os.environ["TRITON_INTERPRET"] = "1"
sys.path.insert(0, "scripts")
import torch, gpu_steps
from kernels.flash_decode import flash_decode
g = torch.Generator().manual_seed(0)
q, k, v = torch.randn(1, 4, 16, generator=g), torch.randn(1, 2, 300, 16, generator=g), torch.randn(1, 2, 300, 16, generator=g)
lens = torch.tensor([300], dtype=torch.int32)
class Testing:
    @staticmethod
    def do_bench(fn, **kw):
        fn()
        return 0.5
def picky(q, k, v, lens, num_splits=None, block_n=None):
    if block_n == 128:
        raise RuntimeError("out of resources: shared memory")
    return flash_decode(q, k, v, lens, num_splits=num_splits, block_n=block_n)
runs = gpu_steps.flash_launch_grid(Testing, picky, q, k, v, lens, 1000, flash_decode(q, k, v, lens, num_splits=1))
assert [(r["num_splits"], r["block_n"]) for r in runs] == [(s, b) for s in (1, 2, 4, 8) for b in (64, 128)], runs
assert all(r["kv_gbs"] == 1000 / 0.5 / 1e6 and r["rel_error"] < 1e-5 for r in runs if r["block_n"] == 64), runs
assert all(r["error"].startswith("RuntimeError: out of resources") for r in runs if r["block_n"] == 128), runs
print("ok")
"""
    run = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=600,
                         env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert run.stdout.strip().endswith("ok"), run.stdout + run.stderr
