"""scripts/gpu_check.sh, the prepared GPU run, in its dry-run mode on this CPU: every step runs on toy
shapes and writes its files, the CUDA-only checks say why they were skipped; and its deadline: a step
that hangs is cut at its share of the budget while the later steps still run."""
import json
import os
import subprocess
import sys
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
STEPS = ("env", "nvidia-smi", "nvml-probe", "kernel-tests", "smoke", "bench", "batch", "attention", "overhead",
         "speculative", "weights")
FILES = {"summary.txt", "gpu_check.log", "checks.json", "kernel-tests.xml", "bench-bf16.json", "sweep-batch.json",
         "sweep-attention.json", "sweep-weights.json"}
MAX_FILES_BACK = 8  # the device tool returns at most 8 files from $OUT


def gpu_check(out: Path, timeout_s: float, **env) -> tuple[int, str, dict[str, list[str]]]:
    """Run the dry run; (exit code, stdout, {step: its summary row's columns})."""
    run = subprocess.run(["bash", "scripts/gpu_check.sh", "--dry-run"], cwd=ROOT, capture_output=True, text=True,
                         timeout=timeout_s, env={**os.environ, "OUT": str(out), "PYTHON": sys.executable, **env})
    rows = {}
    for line in (out / "summary.txt").read_text().split("\nfigures")[0].splitlines():
        cols = line.split(None, 5)
        if cols and cols[0] in STEPS and not line[0].isspace():
            rows[cols[0]] = cols[1:]
    return run.returncode, run.stdout + run.stderr, rows


@pytest.fixture(scope="module")
def dry_run(tmp_path_factory):
    out = tmp_path_factory.mktemp("gpu-check")
    return out, *gpu_check(out, timeout_s=400, GPU_CHECK_BUDGET_S="300")


def test_dry_run_runs_every_step_and_lists_it(dry_run):
    out, code, output, rows = dry_run
    assert code == 0, output
    assert list(rows) == list(STEPS), output
    for step in ("env", "kernel-tests", "smoke", "bench", "batch", "attention", "overhead", "speculative", "weights"):
        assert rows[step][0] == "ok", (step, rows[step])
    for step, reason in (("nvidia-smi", "nvidia-smi not found"), ("nvml-probe", "NVML unavailable")):
        status, *_, note = rows[step]
        assert status == "ok" or (status == "skipped" and reason in note), (step, rows[step])
    assert "engine imports ok without gguf, PySide6, pyqtgraph" in rows["env"][-1]
    assert "3 skipped (needs CUDA" in rows["smoke"][-1]  # the graph checks, with their reason
    summary = (out / "summary.txt").read_text()
    assert "figures (measured in this run" in summary and "gpu_check: done in" in summary


def test_dry_run_writes_the_files_the_device_run_returns(dry_run):
    out = dry_run[0]
    files = {p.name for p in out.iterdir()}
    assert files == FILES and len(files) <= MAX_FILES_BACK  # flat: no folder, nothing the tool would drop
    checks = json.loads((out / "checks.json").read_text())
    assert set(checks) == {"env", "nvidia_smi", "nvml_probe", "smoke", "levers"}
    # the levers' sweeps (issue 12): eager vs captured at batch 1, oracle k = 4 vs k = 0, greedy and sampled
    overhead, speculative = checks["levers"]["overhead"], checks["levers"]["speculative"]
    assert overhead["command"].startswith("membound bench") and len(overhead["results"]) == 1
    assert {(r["source"], r["k"], r["sampling"]) for r in speculative["results"]} == {
        (s, k, m) for s, k in (("none", 0), ("oracle", 4)) for m in ("greedy", "sampled")}
    assert checks["smoke"]["static_step_matches_forward"]["status"] == "ok"
    assert checks["smoke"]["graph_matches_eager"]["status"] == "skipped"
    suite = ET.parse(out / "kernel-tests.xml").getroot().find("testsuite")
    assert int(suite.get("tests")) >= 2 and int(suite.get("failures")) == 0


@pytest.mark.parametrize("name", ["bench-bf16.json", "sweep-batch.json", "sweep-attention.json", "sweep-weights.json"])
def test_each_bench_json_says_which_path_ran(dry_run, name):
    data = json.loads((dry_run[0] / name).read_text())
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
    if name == "sweep-attention.json":
        assert data["kernel"][0]["skipped"] == "needs a GPU"


def test_a_hung_step_is_cut_at_its_cap_and_the_next_steps_still_run(tmp_path):
    # "stubborn" ignores SIGTERM: the kill 5 s later ends it
    code, output, rows = gpu_check(tmp_path, timeout_s=200, GPU_CHECK_STEPS="bench,batch",
                                   GPU_CHECK_FAULT="bench:stubborn", GPU_CHECK_CAPS="bench=2")
    assert code != 0  # a cut step makes the run fail
    status, rc, seconds, allowed, note = rows["bench"]
    assert (status, rc, allowed) == ("TIMED-OUT", "137", "2") and 2 <= float(seconds) < 15, rows["bench"]
    assert note.startswith("cut at 2 s")
    assert rows["batch"][0] == "ok", output
    assert json.loads((tmp_path / "sweep-batch.json").read_text())["complete"]
    assert "1 ok, 0 failed, 1 timed out" in (tmp_path / "summary.txt").read_text()


def test_a_short_budget_gives_a_step_what_is_left_and_skips_the_rest(tmp_path):
    # budget 22 s: 15 kept for the summary, 5 for the kill: the hung step gets 2 s, not its 130
    code, output, rows = gpu_check(tmp_path, timeout_s=60, GPU_CHECK_STEPS="bench,batch", GPU_CHECK_FAULT="bench:hang",
                                   GPU_CHECK_BUDGET_S="22", GPU_CHECK_MIN_STEP_S="1")
    status, rc, seconds, allowed, _ = rows["bench"]
    assert (status, rc) == ("TIMED-OUT", "124") and int(allowed) <= 2 and float(seconds) < 6, rows["bench"]
    assert rows["batch"][0] == "skipped" and "no time left" in rows["batch"][-1]
    assert (tmp_path / "summary.txt").exists() and (tmp_path / "gpu_check.log").exists()


def test_the_probe_samples_a_matmul_phase_then_a_copy_phase():
    sys.path.insert(0, str(ROOT / "scripts"))
    import gpu_steps
    from engine.hardware.nvml import HardwareSample

    class Sampler:
        def sample(self):
            return HardwareSample(t_s=0.0, sm_clock_mhz=1980.0)

    work = set()
    samples = gpu_steps.probe(Sampler(), work.add, seconds=0.3, interval_s=0.02)
    phases = [s["phase"] for s in samples]
    assert phases[0] == "matmul" and phases[-1] == "copy" and phases == sorted(phases, key=["matmul", "copy"].index)
    assert set(work) == {"matmul", "copy"} and samples[0]["sm_clock_mhz"] == 1980.0
