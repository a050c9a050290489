"""The steps of scripts/gpu_check.sh, one per call: `python scripts/gpu_steps.py STEP`. Each prints
its log, ends with one `RESULT: ...` line for the summary, and exits 0 (ok), 77 (skipped: the
reason is the RESULT, "needs CUDA: ..." for what only a GPU can run) or anything else (failed).
GPU_CHECK_DRY_RUN=1: tiny shapes on a CPU, so CI runs every step. Results go under $OUT:
checks.json (env, nvidia-smi, NVML probe, smoke, flash-decode, the levers' sweeps), kernel-tests.xml,
one JSON per bench; `summarize` adds the figures and what to run next to summary.txt.
Nothing here imports torch at module level: `nvidia-smi` and `summarize` run without it."""
from __future__ import annotations

import importlib
import importlib.util
import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))  # the engine from this source tree (nothing is installed there)

OUT = Path(os.environ.get("OUT", "/tmp/membound-gpu"))
DRY_RUN = os.environ.get("GPU_CHECK_DRY_RUN", "") not in ("", "0")
PASS = int(os.environ.get("GPU_CHECK_PASS", "1"))
SKIP = 77  # the exit code of a step that cannot run here (autotools' convention)
NEEDS_CUDA = "needs CUDA"  # how a skipped GPU-only check begins its reason
NOT_THERE = ("gguf", "PySide6", "pyqtgraph")  # absent on the GPU machine: the engine must not need them
COMMAND_MARGIN_S = 30  # a pass's device-tool timeout_s: its budget and this much (start-up, transfers)

# The benches: the device run and its dry-run twin (a toy shape registered below, same code paths).
DRY_SHAPE = "dry-run-tiny"
BENCHES = {
    # pass 1: llama3-8b, batch 1 (MBU against the datasheet and the measured copy); INT8/INT4 on the 1B
    # shape (three captured steps compile: the 8B's take over 40 s to quantise and compile, session 22);
    # batch 64 last, with what is left (pass 2's sweep has it whole)
    "bench": ("bench-bf16.json",
              "--model synthetic:llama3-8b --dtype bf16 --prompt-tokens 128 --decode-tokens 128 --repeats 2",
              "--prompt-tokens 8 --decode-tokens 4 --repeats 1"),
    "weights": ("sweep-weights.json",
                "--model synthetic:llama3.2-1b --dtype bf16 --sweep weights --prompt-tokens 128 --decode-tokens 64 "
                "--repeats 1 --eval-tokens 0",
                "--sweep weights --prompt-tokens 8 --decode-tokens 3 --repeats 1 --eval-tokens 0"),
    "batch": ("sweep-batch.json",
              "--model synthetic:llama3-8b --dtype bf16 --sweep batch --batch-sizes 1,64 --prompt-tokens 128 "
              "--decode-tokens 32",
              "--sweep batch --batch-sizes 1,2 --prompt-tokens 8 --decode-tokens 3"),
    # pass 2: the sweeps, and the 8B shape's weights (random weights: no perplexity)
    "batch-sweep": ("sweep-batch.json",
                    "--model synthetic:llama3-8b --dtype bf16 --sweep batch --batch-sizes 1,2,4,8,16,32,64 "
                    "--prompt-tokens 128 --decode-tokens 48",
                    "--sweep batch --batch-sizes 1,2,4 --prompt-tokens 8 --decode-tokens 3"),
    "attention": ("sweep-attention.json",
                  "--model synthetic:llama3-8b --dtype bf16 --sweep attention --contexts 1024,4096,8192 "
                  "--decode-tokens 32",
                  "--sweep attention --contexts 16,32 --decode-tokens 3"),
    "weights-8b": ("sweep-weights.json",
                   "--model synthetic:llama3-8b --dtype bf16 --sweep weights --prompt-tokens 128 "
                   "--decode-tokens 64 --repeats 1 --eval-tokens 0",
                   "--sweep weights --prompt-tokens 8 --decode-tokens 3 --repeats 1 --eval-tokens 48"),
}
# Issue 12's levers. Their figures go into checks.json (the device tool returns at most 8 files).
LEVERS = {
    # pass 1: 8B bf16, oracle k = 4 vs k = 0, greedy and sampled
    "speculative": (("--model synthetic:llama3-8b --dtype bf16 --sweep speculative --sources oracle "
                     "--draft-lengths 4 --prompts 2 --decode-tokens 64",),
                    "--sweep speculative --sources oracle --draft-lengths 4 --prompts 1 --decode-tokens 6"),
    # pass 2: eager vs CUDA graph at batch 1: the default model's shape and the 1B shape
    "overhead": (tuple(f"--model synthetic:{shape} --dtype bf16 --sweep overhead --prompt-tokens 128 "
                       "--decode-tokens 64" for shape in ("smollm2-135m", "llama3.2-1b")),
                 "--sweep overhead --prompt-tokens 8 --decode-tokens 4"),
}
# the flash-decoding kernel at long context: llama3-8b's heads, bf16, one sequence and eight
FLASH_CONTEXT = 32768
FLASH_BATCHES = (1, 8)
# Each pass's steps, as scripts/gpu_check.sh runs them (the summary's "next" reads this)
PASSES = {1: ("env", "nvidia-smi", "nvml-probe", "kernel-tests", "smoke", "bench", "weights", "flash-decode",
              "speculative", "batch"),
          2: ("smoke-2", "overhead", "batch-sweep", "attention", "weights-8b")}
# what the summary's figures name each step by
FIGURES = {"bench": "bench", "weights": "weights", "batch": "batch", "batch-sweep": "batch", "attention": "attention",
           "weights-8b": "weights"}


def result(line: str, code: int = 0) -> int:
    print(f"RESULT: {line}", flush=True)
    return code


def update_checks(section: str, data) -> None:
    """Merge one section into $OUT/checks.json (the steps run one after another)."""
    path = OUT / "checks.json"
    try:
        checks = json.loads(path.read_text())
    except (OSError, ValueError):
        checks = {}
    checks[section] = data
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(checks, indent=1, default=str))
    os.replace(tmp, path)


# ---- env ----------------------------------------------------------------------------------------
class _Refuse:
    """A meta-path finder that makes the named packages unimportable, as on the GPU machine."""

    def __init__(self, names):
        self.names = set(names)

    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] in self.names:
            raise ImportError(f"{name} is refused here (absent on the GPU machine)")
        return None


def step_env() -> int:
    info = {"dry_run": DRY_RUN, "python": sys.version.split()[0], "executable": sys.executable, "packages": {}}
    for name in ("torch", "triton", "pynvml", "tokenizers", "jinja2", "numpy", "pytest", "transformers",
                 *NOT_THERE):
        try:
            from importlib.metadata import version
            dist = {"pynvml": "nvidia-ml-py", "PySide6": "PySide6-Essentials"}.get(name, name)
            info["packages"][name] = version(dist) if importlib.util.find_spec(name) else None
        except Exception:
            info["packages"][name] = "importable" if importlib.util.find_spec(name) else None
    for name, ver in info["packages"].items():
        print(f"{name:14} {ver or 'not installed'}")
    problems = [f"{n} missing" for n in ("torch", "pytest", "pynvml") if not info["packages"][n]]
    sys.meta_path.insert(0, _Refuse(NOT_THERE))
    for mod in [m for m in sys.modules if m.split(".")[0] in NOT_THERE]:
        del sys.modules[mod]
    try:  # what every later step imports, with gguf / PySide6 / pyqtgraph refused
        for module in ("engine.engine", "engine.cli", "engine.bench.run", "engine.bench.batch",
                       "engine.bench.attention", "engine.hardware.nvml", "kernels.flash_decode",
                       "kernels.int8_matmul", "kernels.int4_matmul"):
            importlib.import_module(module)
        info["engine_imports"] = f"ok without {', '.join(NOT_THERE)}"
    except Exception as error:
        info["engine_imports"] = f"{type(error).__name__}: {error}"
        problems.insert(0, f"engine import failed: {info['engine_imports']}")
    import torch
    info["torch_cuda"] = torch.version.cuda
    info["cuda_available"] = torch.cuda.is_available()
    if torch.cuda.is_available():
        props = torch.cuda.get_device_properties(0)
        info["gpu"] = {"name": props.name, "capability": f"{props.major}.{props.minor}",
                       "multiprocessors": props.multi_processor_count, "memory_bytes": props.total_memory,
                       "visible": torch.cuda.device_count()}
    print(json.dumps(info, indent=1, default=str))
    update_checks("env", info)
    gpu = info.get("gpu", {}).get("name", "no GPU")
    line = (f"torch {info['packages']['torch']} (CUDA {info['torch_cuda']}), triton {info['packages']['triton']}, "
            f"{gpu}; engine imports {info['engine_imports']}")
    return result(line + ("; " + "; ".join(problems) if problems else ""), 1 if info["engine_imports"][:2] != "ok"
                  else 0)


# ---- nvidia-smi -----------------------------------------------------------------------------------
SMI_FIELDS = ("name", "driver_version", "pci.bus_id", "mig.mode.current", "mig.mode.pending", "persistence_mode",
              "compute_mode", "clocks.sm", "clocks.mem", "clocks.max.sm", "clocks.max.mem",
              "clocks.applications.graphics", "clocks.applications.memory", "power.draw", "power.limit",
              "temperature.gpu", "memory.total", "memory.used", "ecc.mode.current", "clocks_event_reasons.active")
SMI_CORE = ("name", "driver_version", "mig.mode.current", "clocks.sm", "clocks.mem", "clocks.max.sm",
            "clocks.max.mem", "power.draw", "power.limit", "memory.total")  # known to every driver


def smi_query(smi: str, fields: tuple[str, ...]) -> dict[str, str] | None:
    """One nvidia-smi call for all `fields` (GPU 0), or None if it failed (a field this driver lacks)."""
    run = subprocess.run([smi, f"--query-gpu={','.join(fields)}", "--format=csv,noheader", "-i", "0"],
                         capture_output=True, text=True, timeout=5)
    values = [v.strip() for v in run.stdout.strip().split(",")]
    if run.returncode != 0 or len(values) != len(fields):
        print(f"nvidia-smi --query-gpu ({len(fields)} fields): exit {run.returncode}, {run.stderr.strip()[:120]}")
        return None
    return dict(zip(fields, values))


def step_smi() -> int:
    """Two or three calls: every field at once (all but the core ones again if this driver refuses
    one), then the clock and power report."""
    smi = shutil.which("nvidia-smi")
    if smi is None:
        update_checks("nvidia_smi", {"skipped": f"{NEEDS_CUDA}: nvidia-smi not found"})
        return result(f"{NEEDS_CUDA}: nvidia-smi not found (no NVIDIA driver here)", SKIP)
    fields = smi_query(smi, SMI_FIELDS) or smi_query(smi, SMI_CORE) or {}
    for field in SMI_FIELDS:
        fields.setdefault(field, "unavailable")
        print(f"{field:30} {fields[field]}")
    detail = subprocess.run([smi, "-q", "-d", "CLOCK,PERFORMANCE,POWER", "-i", "0"], capture_output=True, text=True,
                            timeout=5)
    print(detail.stdout)
    update_checks("nvidia_smi", fields)
    return result(f"{fields['name']}, driver {fields['driver_version']}, MIG {fields['mig.mode.current']}, "
                  f"max clocks SM {fields['clocks.max.sm']} / memory {fields['clocks.max.mem']}, now SM "
                  f"{fields['clocks.sm']}, {fields['power.draw']} of {fields['power.limit']}")


# ---- NVML / GPM probe -----------------------------------------------------------------------------
def probe(sampler, work, seconds: float, interval_s: float = 0.1) -> list[dict]:
    """Samples of `sampler` every interval while `work(phase)` runs: the first 60% of the time
    phase "matmul", then "copy" (what the app's live plots read, against known loads)."""
    samples = []
    t0 = time.monotonic()
    next_sample = t0
    while (now := time.monotonic()) - t0 < seconds:
        phase = "matmul" if now - t0 < 0.6 * seconds else "copy"
        work(phase)
        if now >= next_sample:
            samples.append({"phase": phase, **sampler.sample().to_dict()})
            next_sample += interval_s
    return samples


def step_probe(seconds: float = 5.0) -> int:
    from engine.hardware.nvml import NvmlSampler
    sampler = NvmlSampler(0)
    if not sampler.available:
        update_checks("nvml_probe", {"skipped": f"{NEEDS_CUDA}: NVML unavailable: {sampler.unavailable_reason}"})
        return result(f"{NEEDS_CUDA}: NVML unavailable: {sampler.unavailable_reason}", SKIP)
    import torch
    if not torch.cuda.is_available():
        sampler.close()
        return result("NVML answers but torch sees no GPU", 1)
    a = torch.randn(8192, 8192, device="cuda", dtype=torch.bfloat16)
    src = torch.randn(1 << 28, device="cuda", dtype=torch.bfloat16)  # 512 MiB, past the L2
    dst = torch.empty_like(src)
    done = {"matmul": 0, "copy": 0}

    def work(phase):
        for _ in range(4):
            if phase == "matmul":
                torch.mm(a, a)
            else:
                dst.copy_(src)
        done[phase] += 4
        torch.cuda.synchronize()

    with sampler:
        clocks_before = sampler.clocks()
        samples = probe(sampler, work, seconds)
        clocks_after = sampler.clocks()
        gpm = sampler.gpm_supported

    def peak(key, phase):
        values = [s[key] for s in samples if s["phase"] == phase and s[key] is not None]
        return max(values) if values else None

    summary = {p: {k: peak(k, p) for k in ("sm_clock_mhz", "mem_clock_mhz", "power_w", "sm_util_pct",
                                            "mem_util_pct", "dram_bw_util_pct", "tensor_active_pct")}
               for p in ("matmul", "copy")}
    update_checks("nvml_probe", {"gpm_supported": gpm, "calls": done, "clocks_before": clocks_before,
                                 "clocks_after": clocks_after, "peaks": summary, "samples": samples})
    m, c = summary["matmul"], summary["copy"]
    return result(f"{len(samples)} samples, GPM {'yes' if gpm else 'no'}; matmul: SM {m['sm_clock_mhz']} MHz, "
                  f"tensor active {m['tensor_active_pct']}%, {m['power_w']} W; copy: DRAM bandwidth "
                  f"{c['dram_bw_util_pct']}%, memory busy {c['mem_util_pct']}%")


# ---- kernel tests ---------------------------------------------------------------------------------
def kernel_test_args(xml: Path, dry_run: bool, xdist: bool) -> list[str]:
    """pytest over tests/kernels without the C++ CPU step's tests (a g++ build on the GPU host would
    spend minutes on nothing GPU-related)."""
    args = [sys.executable, "-m", "pytest", "-v", "-rA", "--tb=short", "-p", "no:cacheprovider",
            f"--junitxml={xml}", "-o", "junit_family=xunit2", "--ignore-glob=tests/kernels/test_cpu_decode*",
            "tests/kernels"]
    if dry_run:  # the interpreter is slow: a few tests prove the step, the whole suite runs in make test
        args += ["-k", "bad_inputs or default_launch_path"]
    elif xdist:  # Triton compiles each variant: spread them over the CPUs
        args += ["-n", "8"]
    return args


def step_kernel_tests() -> int:
    if importlib.util.find_spec("pytest") is None:
        return result("pytest is not installed here", SKIP)
    xml = OUT / "kernel-tests.xml"
    args = kernel_test_args(xml, DRY_RUN, importlib.util.find_spec("xdist") is not None)
    code = subprocess.call(args, cwd=ROOT)
    try:
        import xml.etree.ElementTree as ET
        suite = ET.parse(xml).getroot()
        suite = suite if suite.tag == "testsuite" else suite.find("testsuite")
        n = {k: int(suite.get(k, 0)) for k in ("tests", "failures", "errors", "skipped")}
        line = (f"{n['tests'] - n['failures'] - n['errors'] - n['skipped']} passed, {n['failures']} failed, "
                f"{n['errors']} errors, {n['skipped']} skipped (kernel-tests.xml)")
    except Exception as error:
        line = f"pytest exit {code}; no JUnit XML ({type(error).__name__})"
    return result(line, code)


# ---- smoke --------------------------------------------------------------------------------------
def step_smoke() -> int:
    sys.path.insert(0, str(ROOT / "scripts"))
    import gpu_smoke
    import torch
    torch.backends.cuda.matmul.allow_tf32 = False
    smoke = gpu_smoke.Smoke("cuda" if torch.cuda.is_available() else "cpu", tiny=DRY_RUN)
    code = smoke.run(gpu_smoke.PASS_CHECKS[PASS])
    update_checks("smoke", smoke.results)
    counts = {s: sum(r["status"] == s for r in smoke.results.values()) for s in ("ok", "FAILED", "skipped")}
    failed = [n for n, r in smoke.results.items() if r["status"] == "FAILED"]
    why = {r["detail"] for r in smoke.results.values() if r["status"] == "skipped"}
    return result(f"{counts['ok']} ok, {counts['FAILED']} failed" + (f" ({', '.join(failed)})" if failed else "")
                  + f", {counts['skipped']} skipped" + (f" ({'; '.join(sorted(why))})" if why else ""), code)


# ---- the benches ----------------------------------------------------------------------------------
def register_dry_shape() -> None:
    """The dry run's toy shape, added to the table at run time (same loader, same bench code)."""
    from engine.model.config import NAMED_SHAPES
    NAMED_SHAPES[DRY_SHAPE] = dict(dim=64, n_layers=2, n_heads=4, n_kv_heads=2, ffn_dim=128, vocab_size=256,
                                   tied_embeddings=True, max_seq_len=1024)  # the speculative workload's prompts: ~400


def bench_args(device_args: str, dry_args: str) -> list[str]:
    if DRY_RUN:
        register_dry_shape()
        dry_args = dry_args if "--model" in dry_args else f"--model synthetic:{DRY_SHAPE} {dry_args}"
        return f"bench --device cpu --dtype bf16 {dry_args}".split()
    return f"bench --device cuda {device_args}".split()


def run_bench(args: list[str], path: Path) -> int:
    """`membound bench ARGS --json PATH` in this process; its exit code."""
    from engine.cli import main
    args = [*args, "--json", str(path)]
    print("membound " + " ".join(args), flush=True)
    sys.argv = ["membound", *args]  # what the JSON records as its command
    try:
        return main(["--debug", *args])  # --debug: a failure's traceback goes to the log
    except Exception as error:
        import traceback
        traceback.print_exc()
        print(f"membound: error: {type(error).__name__}: {error}", flush=True)
        return 1


def step_bench(name: str) -> int:
    out_name, device_args, dry_args = BENCHES[name]
    args = bench_args(device_args, dry_args)
    path = OUT / out_name
    code = run_bench(args, path)
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError):
        return result(f"exit {code}, no {out_name}", code or 1)
    line = describe_bench(FIGURES[name], data)
    return result(line if code == 0 else f"exit {code}: {line}", code)


def step_lever(name: str) -> int:
    """A lever's sweep (one bench per model); its JSON goes into checks.json as levers.NAME, each
    run's results added as it ends (.tmp files are not returned)."""
    device_runs, dry_args = LEVERS[name]
    if DRY_RUN and name == "overhead":  # Inductor's C++ compile takes a minute on a shared CPU: the dry
        os.environ["TORCHDYNAMO_DISABLE"] = "1"  # run checks the sweep's plumbing, its steps run eager
    runs = (dry_args,) if DRY_RUN else device_runs
    merged, code = None, 0
    for i, run_args in enumerate(runs):
        path = OUT / f"lever-{name}-{i}.tmp"
        run_code = run_bench(bench_args(run_args, run_args), path)
        code = code or run_code
        try:
            data = json.loads(path.read_text())
            path.unlink()
        except (OSError, ValueError):
            code = code or 1
            continue
        if merged is None:
            merged = data
        else:
            merged["results"] = merged.get("results", []) + data.get("results", [])
            merged.setdefault("commands", [merged["command"]]).append(data["command"])
        try:
            levers = json.loads((OUT / "checks.json").read_text()).get("levers", {})
        except (OSError, ValueError):
            levers = {}
        update_checks("levers", {**levers, name: merged})
    if merged is None:
        return result(f"exit {code}, no results", code or 1)
    line = ("dry run, compile off: " if DRY_RUN and name == "overhead" else "") + describe_lever(name, merged)
    return result(line if code == 0 else f"exit {code}: {line}", code)


def describe_lever(name: str, data: dict) -> str:
    rows = data.get("results", [])
    if name == "overhead" and rows:
        return "; ".join(f"{r['model'].removeprefix('synthetic:')} batch 1: eager {r['eager_step_ms']:.2f} ms, "
                         f"{r['captured']} {r['captured_step_ms']:.2f} ms a step = {r['gain']:.2f}x; bytes at "
                         f"peak {r['floor_ms']:.3f} ms; compile + capture {r.get('capture_s', 0):.1f} s"
                         for r in rows)
    if name == "speculative" and rows:
        parts = [f"{r['sampling']} {r['source']} k={r['k']}: {r['decode_tokens_per_s']:,.1f} tok/s "
                 f"({r['speedup']:.2f}x k=0; {_pct(r.get('in_steps'))} of the wall in steps, slowest "
                 f"{r.get('slowest_step_ms', float('nan')):.1f} ms)" for r in rows if r["k"]]
        base = {r["sampling"]: r["decode_tokens_per_s"] for r in rows if not r["k"]}
        return (f"{data.get('model', '?').split(' ')[0]}: k=0 greedy {base.get('greedy', float('nan')):,.1f} tok/s; "
                + "; ".join(parts))
    return "no results"


def _pct(x) -> str:
    return f"{100 * x:.0f}%" if x is not None else "?"


def describe_bench(name: str, data: dict) -> str:
    """One line of the figures the issue asks for, from a bench JSON (complete or not)."""
    device = data.get("device", {})
    peak, measured = device.get("peak_bandwidth_gbs"), device.get("measured_bandwidth_gbs")
    partial = "" if data.get("complete") else " [incomplete: the step was cut short]"
    paths = data.get("paths", {})
    if name == "bench" and data.get("results"):
        r = data["results"][0]
        vs_copy = f", {_pct(r['decode_achieved_gbs'] / measured)} of the measured copy {measured:,.0f} GB/s" \
            if measured else ""
        return (f"{data.get('model', '?').split(' ')[0]} {data.get('dtype')}: decode {r['decode_tokens_per_s']:,.1f} "
                f"tok/s, {r['decode_achieved_gbs']:,.0f} GB/s = MBU {_pct(r['mbu'])} of {peak:,.0f} GB/s{vs_copy}; "
                f"graphs {paths.get('cuda_graphs', '?')}; warm-up {data.get('seconds', {}).get('warmup', 0):.1f} s"
                + partial)
    if name == "batch" and data.get("results"):
        first, last = data["results"][0], data["results"][-1]
        single = data.get("single_stream", {})
        vs_single = (f", {last['aggregate_tokens_per_s'] / single['decode_tokens_per_s']:.1f}x 1 stream "
                     f"({single['path']})") if single.get("decode_tokens_per_s") else ""
        return (f"batch {last['batch_size']}: {last['aggregate_tokens_per_s']:,.0f} tok/s = "
                f"{last['aggregate_tokens_per_s'] / first['aggregate_tokens_per_s']:.1f}x batch "
                f"{first['batch_size']} (batched path, eager){vs_single}" + partial)
    if name == "attention":
        kernel = [k for k in data.get("kernel", []) if "kv_gbs" in k]
        points = data.get("points", [])
        decode = {(p["attention"], p["context"]): p["decode_tokens_per_s"] for p in points}
        ratios = [f"{c}: {decode[('flash', c)] / decode[('naive', c)]:.2f}x" for (a, c) in decode
                  if a == "flash" and ("naive", c) in decode]
        k = f"flash_decode {kernel[0]['kv_gbs']:,.0f} GB/s ({_pct(kernel[0]['fraction_of_peak'])} of peak)" \
            if kernel else (data.get("kernel") or [{}])[0].get("line", "no kernel figures")
        return f"decode flash/naive {', '.join(ratios) or '?'}; {k}" + partial
    if name == "weights" and data.get("results"):
        res = {r["name"]: r for r in data["results"]}
        base = data["results"][0]
        ratios = ", ".join(f"{n} {r['decode_tokens_per_s'] / base['decode_tokens_per_s']:.2f}x (MBU {_pct(r['mbu'])})"
                           for n, r in res.items() if r is not base)
        return (f"{data.get('model', '?').split(' ')[0]}: {base['name']} {base['decode_tokens_per_s']:,.1f} tok/s "
                f"(MBU {_pct(base['mbu'])}), {ratios}; graphs "
                f"{', '.join(sorted({str(p.get('cuda_graphs')) for p in paths.values()})) or '?'}" + partial)
    return "no results" + partial


# ---- flash-decode at long context -------------------------------------------------------------
def rel_error(got, want) -> float:
    got, want = got.double(), want.double()
    return float((got - want).norm() / want.norm().clamp(min=1e-30))


def flash_launch_grid(testing, flash_decode, q, k, v, lens, kv_bytes: int, want) -> list[dict]:
    """The kernel at other split counts and tile widths on the same keys (each timed briefly, its
    output against the default launch's `want`): which launch a batch-1 decode should take. A launch
    that fails is recorded, not raised."""
    from kernels.flash_decode import default_num_splits
    base = default_num_splits(q.shape[0] * k.shape[1], k.shape[2], q.device)
    runs = []
    for splits in sorted({base, 2 * base, 4 * base, 8 * base}):
        for block_n in (64, 128):
            run = {"num_splits": splits, "block_n": block_n}
            try:
                run["rel_error"] = rel_error(flash_decode(q, k, v, lens, num_splits=splits, block_n=block_n), want)
                ms = testing.do_bench(lambda: flash_decode(q, k, v, lens, num_splits=splits, block_n=block_n),
                                      warmup=5, rep=20, return_mode="median")
                run.update(kernel_ms=ms, kv_gbs=kv_bytes / ms / 1e6)
            except Exception as error:  # (a tile too wide for the chip's shared memory, say)
                run["error"] = f"{type(error).__name__}: {str(error).strip()[:120]}"
            runs.append(run)
    return runs


def step_flash_decode() -> int:
    """The flash-decoding kernel over a 32k context with llama3-8b's heads (bf16): its error against
    the fp32 reference, its KV bandwidth against the datasheet and a copy measured here, PyTorch's
    SDPA on the same keys; then the captured step's path: the op inside one CUDA graph over a longer
    buffer, replayed at two lengths (one graph serves every length, reading the live keys only).
    On a CPU the op's plumbing runs on a toy buffer and the GPU figures are skipped."""
    import torch
    import torch.nn.functional as F

    from engine.model.attention import decode_attention
    from engine.model.config import ModelConfig
    from kernels.flash_decode import reference_decode

    cfg = ModelConfig.from_name("llama3-8b")
    H, n_kv, hd = cfg.n_heads, cfg.n_kv_heads, cfg.head_dim
    if not torch.cuda.is_available():
        g = torch.Generator().manual_seed(0)
        q = torch.randn(1, H, 1, hd, generator=g)
        k, v = torch.randn(1, n_kv, 96, hd, generator=g), torch.randn(1, n_kv, 96, hd, generator=g)
        err = rel_error(decode_attention(q, k, v, torch.tensor([40]), "flash")[:, :, 0],
                        reference_decode(q[:, :, 0], k, v, [41]))
        assert err < 1e-5, f"the captured step's attention over a buffer: error {err:.1e}"
        update_checks("flash_decode", {"op_over_a_buffer_cpu": {"status": "ok", "rel_error": err},
                                       "kernel": {"status": "skipped", "detail": f"{NEEDS_CUDA}: no GPU here"}})
        return result(f"the op over a whole buffer (CPU, toy): error {err:.1e}; kernel figures skipped: {NEEDS_CUDA}")
    import triton.testing

    from engine.hardware.detect import measure_bandwidth_gbs
    from engine.hardware.spec import lookup_gpu
    from kernels.flash_decode import flash_decode

    device = torch.device("cuda")
    copy_gbs = measure_bandwidth_gbs(device)
    sheet = lookup_gpu(torch.cuda.get_device_name(device))
    sheet_gbs = sheet.bandwidth_gbs if sheet is not None else None
    out = {"context": FLASH_CONTEXT, "heads": [H, n_kv, hd], "dtype": "bf16", "measured_copy_gbs": copy_gbs,
           "datasheet_gbs": sheet_gbs, "runs": []}
    lines = []
    for batch in FLASH_BATCHES:
        q = torch.randn(batch, H, hd, device=device, dtype=torch.bfloat16)
        k = torch.randn(batch, n_kv, FLASH_CONTEXT, hd, device=device, dtype=torch.bfloat16)
        v = torch.randn_like(k)
        lens = torch.full((batch,), FLASH_CONTEXT, dtype=torch.int32, device=device)
        got = flash_decode(q, k, v, lens)
        err = rel_error(got[:1], reference_decode(q[:1].float(), k[:1].float(), v[:1].float(), [FLASH_CONTEXT]))
        ms = triton.testing.do_bench(lambda: flash_decode(q, k, v, lens), warmup=25, rep=100, return_mode="median")
        sdpa_ms = triton.testing.do_bench(
            lambda: F.scaled_dot_product_attention(q[:, :, None], k, v, enable_gqa=True), warmup=25, rep=100,
            return_mode="median")
        kv_bytes = 2 * k.numel() * k.element_size()
        run = {"batch": batch, "rel_error": err, "kernel_ms": ms, "sdpa_ms": sdpa_ms, "kv_bytes": kv_bytes,
               "kv_gbs": kv_bytes / ms / 1e6, "sdpa_gbs": kv_bytes / sdpa_ms / 1e6}
        run["of_copy"] = run["kv_gbs"] / copy_gbs
        run["of_datasheet"] = run["kv_gbs"] / sheet_gbs if sheet_gbs else None
        out["runs"].append(run)
        update_checks("flash_decode", out)
        lines.append(f"batch {batch}: {run['kv_gbs']:,.0f} GB/s = {_pct(run['of_copy'])} of the copy "
                     f"{copy_gbs:,.0f}, {_pct(run['of_datasheet'])} of the datasheet; SDPA {run['sdpa_gbs']:,.0f} "
                     f"GB/s; error {err:.1e}")
        assert err < 2e-2, f"batch {batch}: relative error {err:.2e} against the fp32 reference"
        if batch == 1:  # the first GPU run read 24% of the copy here (96% at batch 8): the launch knobs
            run["launches"] = flash_launch_grid(triton.testing, flash_decode, q, k, v, lens, kv_bytes, got)
            update_checks("flash_decode", out)
            best = max(run["launches"], key=lambda r: r.get("kv_gbs", 0.0))
            if "kv_gbs" in best:
                lines.append(f"batch 1 best of {len(run['launches'])} launches: {best['kv_gbs']:,.0f} GB/s at "
                             f"{best['num_splits']} splits, block_n {best['block_n']}")
        del q, k, v
    out["captured"] = captured_flash_check(torch, device)
    update_checks("flash_decode", out)
    c = out["captured"]
    lines.append(f"in one CUDA graph over {c['buffer']} positions: {c['short_ms']:.3f} ms at {c['short']} keys, "
                 f"{c['long_ms']:.3f} ms at {c['long']} (errors {c['short_error']:.1e}, {c['long_error']:.1e})")
    return result(f"{FLASH_CONTEXT // 1024}k context: " + "; ".join(lines))


def captured_flash_check(torch, device) -> dict:
    """decode_attention (the captured step's attention) in one CUDA graph over a 64k buffer, replayed
    with the position at 1k and at 32k: right at both, and the short replay reads only its keys."""
    from engine.model.attention import decode_attention
    from kernels.flash_decode import reference_decode
    H, n_kv, hd, buffer = 32, 8, 128, 2 * FLASH_CONTEXT
    q = torch.randn(1, H, 1, hd, device=device, dtype=torch.bfloat16)
    k = torch.randn(1, n_kv, buffer, hd, device=device, dtype=torch.bfloat16)
    v = torch.randn_like(k)
    pos = torch.zeros(1, dtype=torch.long, device=device)
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        for _ in range(2):  # the kernel compiles and its launch settles outside the capture
            decode_attention(q, k, v, pos, "flash")
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        y = decode_attention(q, k, v, pos, "flash")
    found = {"buffer": buffer}
    for label, live in (("short", 1024), ("long", FLASH_CONTEXT)):
        pos.fill_(live - 1)
        graph.replay()
        torch.cuda.synchronize()
        found[label] = live
        found[f"{label}_error"] = rel_error(y[:, :, 0], reference_decode(q[:, :, 0].float(), k.float(), v.float(),
                                                                         [live]))
        begin, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        times = []
        for _ in range(50):
            begin.record()
            graph.replay()
            end.record()
            end.synchronize()
            times.append(begin.elapsed_time(end))
        found[f"{label}_ms"] = sorted(times)[len(times) // 2]
    assert max(found["short_error"], found["long_error"]) < 2e-2, f"the graph's attention is off: {found}"
    return found


# ---- summary ------------------------------------------------------------------------------------
def read_rows(summary: str) -> dict[str, dict]:
    """The step rows gpu_check.sh wrote to summary.txt: {step: status, rc, seconds, allowed, note}."""
    steps = set(PASSES[1]) | set(PASSES[2])
    rows = {}
    for line in summary.splitlines():
        cols = line.split(None, 5)
        if len(cols) >= 5 and cols[0] in steps and not line[0].isspace():
            rows[cols[0]] = {"status": cols[1], "rc": cols[2], "seconds": float(cols[3]),
                             "allowed": int(cols[4]), "note": cols[5] if len(cols) > 5 else ""}
    return rows


def pass_command(n: int, steps=(), caps: dict | None = None, budget_s: int = 300) -> str:
    env = []
    if steps:
        env.append(f"GPU_CHECK_STEPS={','.join(steps)}")
    if caps:
        env.append("GPU_CHECK_CAPS=" + ",".join(f"{k}={v}" for k, v in caps.items()))
    if budget_s != 300:
        env.append(f"GPU_CHECK_BUDGET_S={budget_s}")
    return (" ".join(env) + " " if env else "") + f"bash scripts/gpu_check.sh --pass {n}   " \
        f"(device tool run: timeout_s {budget_s + COMMAND_MARGIN_S})"


def nominal_caps(n: int) -> dict[str, int]:
    """Pass n's caps in seconds at the nominal 300 s budget, as scripts/gpu_check.sh lists them."""
    text = (ROOT / "scripts" / "gpu_check.sh").read_text()
    table = text.split("STEPS=(")[n].split(")")[0].split()
    return {name: int(cap) for name, cap in (item.split(":") for item in table)}


def next_steps(n: int, rows: dict[str, dict]) -> list[str]:
    """What the next command of the loan should be, from this pass's rows. A cut step reruns with
    twice the time it had (a rerun is one step or two, so it fits); a failed one needs a fix first."""
    cut = {s: r for s, r in rows.items() if r["status"] == "TIMED-OUT"}
    failed = [s for s, r in rows.items() if r["status"] == "FAILED"]
    starved = [s for s, r in rows.items() if r["status"] == "skipped" and r["note"].startswith("no time left")]
    lines = ["", "next:"]
    again = list(cut) + starved
    nominal = nominal_caps(n)
    caps = {s: min(2 * cut[s]["allowed"], 280) if s in cut else nominal.get(s, 60) for s in again}
    budget = min(560, max(60, sum(caps.values()) + 15))  # the summary's reserve and a kill's grace
    if n == 1:
        lines.append(f"  pass 2: {pass_command(2)}; start it at once, while the machine is warm (a fresh start "
                     "costs a minute or more of the loan)")
    if again:
        lines.append(f"  {'then ' if n == 1 else ''}rerun what was cut or had no time: "
                     f"{pass_command(n, again, caps, budget)}")
    if failed:
        lines.append(f"  failed ({', '.join(failed)}): the cause is in gpu_check.log; after a fix, "
                     f"{pass_command(n, failed)}")
    if n == 2 and not (again or failed):
        lines.append("  nothing: both passes ran. Copy summary.txt's figures into docs/benchmarks.md (GPU section).")
    return lines


def step_summarize() -> int:
    """The figures of every file present, appended to summary.txt with what to run next (no torch:
    it runs last, always)."""
    summary_path = OUT / "summary.txt"
    rows = read_rows(summary_path.read_text() if summary_path.exists() else "")
    lines = ["", "figures (measured in this run; each JSON names the path it ran and its clocks):"]
    for name in PASSES[PASS]:
        if name in BENCHES:
            out_name = BENCHES[name][0]
            path = OUT / out_name
            try:
                lines.append(f"  {name:12} {describe_bench(FIGURES[name], json.loads(path.read_text()))}")
            except (OSError, ValueError):
                lines.append(f"  {name:12} no {out_name}")
            except Exception as error:  # a figure missing from a partial file must not lose the others
                lines.append(f"  {name:12} {out_name} unreadable: {type(error).__name__}: {error}")
    try:
        checks = json.loads((OUT / "checks.json").read_text())
    except (OSError, ValueError):
        checks = {}
    for name in LEVERS:
        if name in PASSES[PASS]:
            data = checks.get("levers", {}).get(name)
            try:
                lines.append(f"  {name:12} {describe_lever(name, data) if data else 'no results'}")
            except Exception as error:
                lines.append(f"  {name:12} unreadable: {type(error).__name__}: {error}")
    if "flash-decode" in PASSES[PASS]:
        lines.append(f"  {'flash-decode':12} {rows.get('flash-decode', {}).get('note') or 'no results'}")
    smoke = checks.get("smoke", {})
    if smoke:
        lines += ["", "smoke checks:"] + [f"  {n:30} {r['status']}: {r['detail']}" for n, r in smoke.items()]
    lines += next_steps(PASS, rows)
    files = sorted(p.name for p in OUT.iterdir() if p.is_file())
    lines += ["", f"files under $OUT ({len(files)}): {', '.join(files)}"]
    with open(summary_path, "a") as f:
        f.write("\n".join(lines) + "\n")
    print("\n".join(lines))
    return 0


STEPS = {"env": step_env, "nvidia-smi": step_smi, "nvml-probe": step_probe, "kernel-tests": step_kernel_tests,
         "smoke": step_smoke, "smoke-2": step_smoke, "flash-decode": step_flash_decode, "summarize": step_summarize,
         **{name: (lambda name=name: step_bench(name)) for name in BENCHES},
         **{name: (lambda name=name: step_lever(name)) for name in LEVERS}}


if __name__ == "__main__":
    if len(sys.argv) != 2 or sys.argv[1] not in STEPS:
        print(f"usage: gpu_steps.py {{{','.join(STEPS)}}}", file=sys.stderr)
        sys.exit(2)
    OUT.mkdir(parents=True, exist_ok=True)
    sys.exit(STEPS[sys.argv[1]]())
