"""The batch-1 workload every bench measures: a prompt, then greedy decode steps that ignore EOS,
through the engine's own reply loop (`run_ours`), summarised against the device's peak; its
warm-up and its timed run with the path each step took (engine/bench/record.py)."""
from __future__ import annotations

import time
from dataclasses import dataclass

from engine.bench.record import PathWatch


@dataclass
class BenchResult:
    name: str
    prompt_tokens: int
    decode_tokens: int
    prefill_tokens_per_s: float
    decode_tokens_per_s: float
    ttft_s: float
    decode_achieved_gbs: float  # cost-model bytes of the decode steps / their time
    peak_gbs: float
    mbu: float
    mfu: float
    predicted_ceiling_tokens_per_s: float
    decode_bytes_per_token: float
    roof: str = "memory"  # the roof its decode steps sit under: "memory", "cache" (their bytes fit it), or both
    read_beside_gbs: tuple[float, float] | None = None  # CPU: the memory read just before and after the run
    mbu_beside: float | None = None  # achieved GB/s over their mean (engine/bench/beside.py)


def roof_of(decode) -> tuple[float, str]:
    """(seconds the decode steps' bytes take at the roofs they sit under, which roof: "memory", "cache"
    or "memory + cache"): a step whose bytes fit the last-level cache is measured against its roof, as in
    the window (engine/hardware/roof.py Roof.level_for), so MBU and the ceiling use the same one."""
    return sum(s.total_bytes / s.peak_bandwidth_bps for s in decode), roof_levels(getattr(s, "roof", "memory") for s in decode)


def roof_levels(levels) -> str:
    """The roofs some steps sit under, in words: "memory", "cache" or "memory + cache"."""
    return " + ".join(sorted(set(levels), key=("memory", "cache").index))


def run_ours(engine, prompt_ids: list[int], decode_tokens: int) -> tuple[BenchResult, list]:
    from engine.events import DoneEvent, TokenEvent
    from engine.metrics import StepMetrics

    engine.reset()
    steps: list[StepMetrics] = []
    done = None
    t_first_token = t_done = 0.0
    for event in engine.generate(prompt_ids, max_new_tokens=decode_tokens + 1, ignore_eos=True):
        if isinstance(event, StepMetrics):
            steps.append(event)
        elif isinstance(event, TokenEvent) and event.index == 0:
            t_first_token = time.perf_counter()
        elif isinstance(event, DoneEvent):
            done, t_done = event, time.perf_counter()
    prefill = [s for s in steps if s.phase == "prefill"]
    decode = [s for s in steps if s.phase == "decode"]
    engine.reset()
    # decode time is wall-clock from the first token to the last, as for transformers (run.py):
    # it includes everything the loop does per token (sampling, detokenising), not only the steps
    return summarise("membound", prefill, decode, done.ttft_s, decode_wall_s=t_done - t_first_token), steps


def timed_run(engine, prompt_ids: list[int], decode_tokens: int, beside=None) -> tuple[BenchResult, list, dict]:
    """run_ours, with the path every step took (engine/bench/record.py) and the seconds it ran; with
    `beside` (engine/bench/beside.py ReadBeside), the memory read just before and after it."""
    from engine.bench.beside import step_bytes, with_read_beside
    watch = PathWatch(engine.graphs)
    size = step_bytes(engine) if beside is not None else 0
    before = beside.read_gbs(size) if beside is not None else None
    t0 = time.perf_counter()
    result, steps = run_ours(engine, prompt_ids, decode_tokens)
    paths = watch.report(steps, engine.model)
    paths["run_s"] = time.perf_counter() - t0
    if beside is not None:
        result = with_read_beside(result, before, beside.read_gbs(size))
    return result, steps, paths


def warm_up(engine, prompt_ids: list[int], decode_tokens: int) -> float:
    """The timed workload once, untimed: the prefill's shape, every CUDA-graph bucket and capture
    call, kernel tunings and compiles all happen here, not in a timed step. Returns its seconds."""
    t0 = time.perf_counter()
    run_ours(engine, prompt_ids, decode_tokens)
    return time.perf_counter() - t0


def warm_up_decode_tokens(args) -> int:
    """Decode steps of a warm-up: all of them on a GPU, where the flash-decoding kernel compiles a
    variant as the context grows (its split count); a few on a CPU, where nothing compiles."""
    return args.decode_tokens if args.device == "cuda" else min(args.decode_tokens, 3)


def summarise(name, prefill, decode, ttft_s, decode_wall_s: float | None = None) -> BenchResult:
    p_s = sum(s.step_s for s in prefill)
    d_s = decode_wall_s if decode_wall_s else sum(s.step_s for s in decode)
    d_bytes = sum(s.total_bytes for s in decode)
    d_flops = sum(s.flops for s in decode)
    n_prompt = sum(s.new_tokens for s in prefill)
    last = decode[-1]
    roof_s, level = roof_of(decode)
    return BenchResult(
        name=name, prompt_tokens=n_prompt, decode_tokens=len(decode),
        prefill_tokens_per_s=n_prompt / p_s, decode_tokens_per_s=len(decode) / d_s, ttft_s=ttft_s,
        decode_achieved_gbs=d_bytes / d_s / 1e9, peak_gbs=d_bytes / roof_s / 1e9, mbu=roof_s / d_s,
        mfu=d_flops / d_s / last.peak_flops, predicted_ceiling_tokens_per_s=len(decode) / roof_s,
        decode_bytes_per_token=d_bytes / len(decode), roof=level)


def path_line(paths: dict) -> str:
    """One line on what the figures above ran: graphs or eager, the attention kernel."""
    decode = paths["ops"].get("decode step", {})
    attention = paths["ops"].get("attention decode", {})
    return (f"path: CUDA graphs {paths['cuda_graphs']}; decode steps "
            + (", ".join(f"{n} {impl}" for impl, n in decode.items()) or "(their path not recorded)")
            + "; decode attention " + (", ".join(attention) or "none")
            + "; matmul " + ", ".join(f"{k} {v}" for k, v in paths.get("matmul", {}).items())
            + pages_note(paths.get("weight_pages")))


def pages_note(pages: dict | None) -> str:
    if pages is None:
        return ""
    return f"; weights {'' if pages['exact'] else 'at most '}{100 * pages['share']:.0f}% on 2 MiB pages"


def roof_peak(engine, results: list[BenchResult]) -> tuple[list[BenchResult], str]:
    """The results as measured against the device's one roof (engine/hardware/roof.py: the app and
    the terminal chat use the same), and one line saying which roof that is."""
    from engine.hardware.roof import ABOVE_ROOF, above_roof, roof_line
    line = roof_line(engine.hardware)
    if any(above_roof(r.mbu, r.mfu) for r in results):  # shown, never absorbed into the peak
        line += f"\n{ABOVE_ROOF}"
    return results, line
