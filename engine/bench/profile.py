"""Where one decode step's time goes (`membound bench --profile`): the C++ CPU step's phases, each
with the bytes the cost model says it moves, the time those bytes take at the measured peak, and the
time it took; beside them the PyTorch step's biggest operators (torch.profiler), which it replaces."""
from __future__ import annotations

import time

import torch

from engine.bench.tables import side_by_side
from engine.kv.cache import ContiguousKVCache
from engine.metrics import phase_bytes

PROFILE_STEPS = 32  # decode steps averaged
TOP_OPERATORS = 6


@torch.inference_mode()
def profile_step(engine, settings, prompt_ids: list[int], steps: int = PROFILE_STEPS) -> dict:
    """The C++ step's phases (thread 0's view, ms per step) and bytes, and PyTorch's top operators,
    for `settings` on a fresh cache after `prompt_ids`. {"skipped": why} where the C++ step cannot run."""
    from engine.model import cpu_step
    from kernels.cpu_decode import PHASES

    model = engine.model_for(settings)
    cfg = model.cfg
    cache = ContiguousKVCache(cfg, 1, len(prompt_ids) + steps + 1, model.dtype, "cpu")
    token = torch.tensor([[prompt_ids[-1]]])
    why = cpu_step.refusal(model, token, cache, settings.attention) or cpu_step.unavailable_reason(engine.context)
    if why:
        return {"skipped": why}
    model(torch.tensor([prompt_ids]), start_pos=0, cache=cache)
    pos = len(prompt_ids)
    cpu_step.decode_step(model, token, pos, cache)  # builds the plan
    plan = cpu_step.plan_for(model, cache)
    seconds = torch.zeros(len(PHASES), dtype=torch.float64)
    t0 = time.perf_counter()
    for i in range(steps):
        plan.run([(int(token), pos + 1 + i, 0, None)], [0], seconds)
    wall_s = (time.perf_counter() - t0) / steps
    context = pos + 1 + steps // 2  # positions cached before the middle step
    bytes_by_phase = phase_bytes(model, context)
    phases = [{"phase": name, "ms": 1e3 * s / steps, "bytes": bytes_by_phase[name]}
              for name, s in zip(PHASES, seconds.tolist())]
    # PyTorch's step, the same workload: its biggest operators by their own time
    cache.truncate(pos)
    with cpu_step.pytorch_only():
        model(token, start_pos=pos, cache=cache)  # warm
        cache.truncate(pos)
        with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as prof:
            t1 = time.perf_counter()
            for i in range(steps // 4):
                model(token, start_pos=pos + i, cache=cache)
            eager_s = (time.perf_counter() - t1) / (steps // 4)
    ops = sorted(prof.key_averages(), key=lambda e: e.self_cpu_time_total, reverse=True)
    top = [{"operator": e.key, "ms": e.self_cpu_time_total / 1e3 / (steps // 4), "calls": e.count // (steps // 4)}
           for e in ops[:TOP_OPERATORS]]
    return {"label": settings.label, "step_ms": 1e3 * wall_s, "context": context, "phases": phases,
            "total_bytes": sum(p["bytes"] for p in phases), "pytorch_step_ms": 1e3 * eager_s,
            "pytorch_operators_per_step": sum(e.count for e in ops) // (steps // 4), "pytorch_top": top}


def format_profile(name: str, found: dict, peak_gbs: float) -> str:
    """One setting's profile as lines of text."""
    if "skipped" in found:
        return f"{name}: no C++ step profile ({found['skipped']})"
    peak = peak_gbs * 1e9
    rows = []
    for p in found["phases"]:
        at_peak_ms = 1e3 * p["bytes"] / peak
        rows.append((p["phase"], [f"{p['bytes'] / 1e6:,.2f}", f"{at_peak_ms:,.3f}", f"{p['ms']:,.3f}",
                                  f"{100 * at_peak_ms / p['ms']:.0f}%" if p["bytes"] and p["ms"] else ""]))
    total_at_peak_ms = 1e3 * found["total_bytes"] / peak
    rows.append(("step (wall)", [f"{found['total_bytes'] / 1e6:,.2f}", f"{total_at_peak_ms:,.3f}",
                                 f"{found['step_ms']:,.3f}", f"{100 * total_at_peak_ms / found['step_ms']:.0f}%"]))
    lines = [f"{name}: C++ step at {found['context']} positions, thread 0's phases (ms per step), peak {peak_gbs:.1f} GB/s"]
    lines += side_by_side("", ["MB moved", "ms at peak", "ms taken", "MBU"], rows, 26, 12)
    lines.append(f"  PyTorch's step instead: {found['pytorch_step_ms']:.2f} ms, "
                 f"{found['pytorch_operators_per_step']} operators; the biggest (own time per step): "
                 + ", ".join(f"{t['operator']} {t['ms']:.2f} ms x{t['calls']}" for t in found["pytorch_top"]))
    return "\n".join(lines)
