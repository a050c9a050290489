"""`membound bench --sweep overhead`: eager vs captured batch-1 decode steps (a CUDA graph on a GPU,
a torch.compile'd step on a CPU) for a few model shapes, in one run: step time, the time the step's
bytes take at peak bandwidth (its floor), and the overhead beyond it (launches, dispatch, Python).
On a CPU it also profiles the eager step: how much of it is matrix multiplication (weight streaming).

The two engines of a shape share its weights and take their steps in turn (load from elsewhere falls
on both alike); a step's time is the median of its decode steps."""
from __future__ import annotations

import json
import platform
import statistics
import sys
from dataclasses import asdict, dataclass, replace

from engine.bench.tables import rows_of, side_by_side

CPU_SHAPES = ("default", "synthetic:smollm2-360m")
GPU_SHAPES = ("default", "synthetic:smollm2-360m", "synthetic:llama3.2-1b", "synthetic:llama3-8b")


@dataclass
class OverheadPoint:
    model: str
    eager_step_ms: float
    captured_step_ms: float  # nan when the capture failed
    gain: float  # eager / captured step time
    floor_ms: float  # the step's bytes at the peak bandwidth (eager's; the captured step reads a bucket)
    eager_overhead_ms: float  # step time beyond the floor
    captured_overhead_ms: float
    captured: str  # "CUDA graph", "compiled step", or why the capture did not run
    matmul_share: float = float("nan")  # CPU: fraction of the eager step in matmul kernels (profiler)
    bytes_per_step: int = 0
    capture_s: float = 0.0  # seconds of the calls that compiled and captured the step (the warm-up's)


def run_overhead_sweep(args, progress) -> int:
    import torch

    from engine.bench.prompts import bench_prompt_ids
    from engine.engine import DTYPES, Engine
    from engine.graphs import GraphDecoder
    from engine.hardware.spec import describe
    from engine.io.loader import load_model
    from engine.protocol import default_dtype
    from engine.settings import SamplingParams, Settings

    dtype = args.dtype or default_dtype(args.device)
    shapes = (args.model,) if args.model != "default" else (GPU_SHAPES if args.device == "cuda" else CPU_SHAPES)
    if args.decode_tokens < 4:
        raise ValueError("the sweep needs --decode-tokens >= 4")
    base = Settings(dtype=dtype, sampling=SamplingParams(greedy=True, temperature=0.0),
                    max_new_tokens=args.decode_tokens + 1)
    points, hardware = [], None
    for i, shape in enumerate(shapes):
        progress(i / len(shapes), f"loading {shape}")
        need = args.prompt_tokens + args.decode_tokens + 2
        loaded = load_model(shape, DTYPES[dtype], args.device, progress, max(need, 256))
        eager = Engine(loaded, device=args.device, hardware=hardware, settings=replace(base, cuda_graphs=False),
                       progress=progress if hardware is None else None)
        hardware = eager.hardware
        captured = Engine(loaded, device=args.device, hardware=hardware, settings=base)
        # compiled on a CPU too: this is what is measured
        captured.graphs = GraphDecoder(args.device, cpu_compile=True, kernels=captured.context.kernels)
        captured.apply(base)
        prompt = bench_prompt_ids(eager.tokenizer, args.prompt_tokens)
        progress(i / len(shapes), f"{shape}: compiling and warming up the captured step")
        _decode_steps(captured, prompt, 3)
        _decode_steps(eager, prompt, 3)
        progress((i + 0.5) / len(shapes), f"{shape}: eager and captured steps in turn")
        eager_steps, captured_steps = _interleaved(eager, captured, prompt, args.decode_tokens)
        share = _matmul_share(eager, prompt) if args.device == "cpu" else float("nan")
        points.append(_point(shape, eager_steps, captured_steps, captured, share))
        del eager, captured, loaded
        if args.device == "cuda":
            torch.cuda.empty_cache()
    progress(1.0, "done")
    print(f"device: {describe(hardware)}", file=sys.stderr)
    print(f"\nworkload: batch 1, prompt {args.prompt_tokens} tokens, {args.decode_tokens} greedy decode steps each, "
          f"{dtype}, KV cache contiguous; captured = "
          f"{'CUDA graph (torch.compile reduce-overhead)' if args.device == 'cuda' else 'torch.compile (inductor C++)'}")
    print(format_overhead(points))
    if args.json:
        payload = {"command": "membound " + " ".join(sys.argv[1:]), "device": hardware.to_dict(), "dtype": dtype,
                   "machine": platform.platform(), "torch": torch.__version__, "threads": torch.get_num_threads(),
                   "results": [asdict(p) for p in points]}
        with open(args.json, "w") as f:
            json.dump(payload, f, indent=1)
        print(f"wrote {args.json}", file=sys.stderr)
    return 0


def _decode_steps(engine, prompt: list[int], n: int) -> list:
    from engine.metrics import StepMetrics
    engine.reset()
    steps = [e for e in engine.generate(prompt, max_new_tokens=n + 1, ignore_eos=True) if isinstance(e, StepMetrics)]
    return [s for s in steps if s.phase == "decode"]


def _interleaved(eager, captured, prompt: list[int], n: int) -> tuple[list, list]:
    from engine.metrics import StepMetrics
    out = ([], [])
    gens = []
    for engine in (eager, captured):
        engine.reset()
        gens.append(engine.generate(prompt, max_new_tokens=n + 1, ignore_eos=True))
    for _ in range(n + 1):
        for steps, gen in zip(out, gens):
            for event in gen:
                if isinstance(event, StepMetrics):
                    if event.phase == "decode":
                        steps.append(event)
                    break
    for gen in gens:
        gen.close()
    return out


def _matmul_share(engine, prompt: list[int]) -> float:
    """Of the eager decode steps' operator time, the share in matmul kernels (torch.profiler)."""
    from torch.profiler import ProfilerActivity, profile

    engine.reset()
    gen = engine.generate(prompt, max_new_tokens=12, ignore_eos=True)
    next(e for e in gen if type(e).__name__ == "StepMetrics")  # the prefill, outside the profile
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        for _ in gen:
            pass
    matmul = total = 0.0
    for event in prof.key_averages():
        if event.key.startswith("aten::") and not any(c in event.key for c in ("aten::to", "aten::copy")):
            self_us = event.self_cpu_time_total
            total += self_us
            if any(m in event.key for m in ("mm", "linear", "matmul", "int4pack", "int8pack", "_linear_pointwise")):
                matmul += self_us
    return matmul / total if total else float("nan")


def _point(shape: str, eager_steps: list, captured_steps: list, captured_engine, share: float) -> OverheadPoint:
    e = statistics.median(s.step_s for s in eager_steps)
    ran = [s for s in captured_steps if s.captured]
    c = statistics.median(s.step_s for s in ran) if ran else float("nan")
    floor = statistics.median(s.floor_s for s in eager_steps)
    c_floor = statistics.median(s.floor_s for s in ran) if ran else float("nan")
    return OverheadPoint(
        model=shape, eager_step_ms=1e3 * e, captured_step_ms=1e3 * c, gain=e / c, floor_ms=1e3 * floor,
        eager_overhead_ms=1e3 * max(0.0, e - floor), captured_overhead_ms=1e3 * max(0.0, c - c_floor),
        captured=captured_engine.graphs.kind if ran else captured_engine.graphs.unavailable or "did not run",
        matmul_share=share, bytes_per_step=int(statistics.median(s.total_bytes for s in eager_steps)),
        capture_s=captured_engine.graphs.capture_s)


def format_overhead(points: list[OverheadPoint]) -> str:
    rows = [
        ("eager step", lambda p: f"{p.eager_step_ms:.2f} ms"),
        ("captured step", lambda p: f"{p.captured_step_ms:.2f} ms"),
        ("captured / eager speed", lambda p: f"{p.gain:.2f}x"),
        ("bytes at peak (floor)", lambda p: f"{p.floor_ms:.2f} ms"),
        ("overhead, eager", lambda p: f"{p.eager_overhead_ms:.2f} ms"),
        ("overhead, captured", lambda p: f"{p.captured_overhead_ms:.2f} ms"),
        ("bytes a step", lambda p: f"{p.bytes_per_step / 1e6:,.1f} MB"),
        ("compile + capture", lambda p: f"{p.capture_s:.1f} s"),
    ]
    if any(p.matmul_share == p.matmul_share for p in points):
        rows.append(("eager: matmul share", lambda p: f"{100 * p.matmul_share:.0f}%"))
    names = [p.model.removeprefix("synthetic:").rsplit("/", 1)[-1] for p in points]  # a file: its name
    lines = side_by_side("", names, rows_of(points, rows), 24, max(14, *(len(n) + 2 for n in names)))
    lines += [f"captured ({p.model}): {p.captured}" for p in points if p.captured not in ("CUDA graph", "compiled step")]
    return "\n".join(lines)
