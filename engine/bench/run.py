"""`membound bench`: a fixed workload (a prompt of N tokens, then M greedy decode steps that
ignore EOS), reported against the device's peak; `--compare hf` runs transformers' generate
on the same weights, prompt, dtype and device in the same run."""
from __future__ import annotations

import sys
import time
from dataclasses import asdict

import torch

from engine.bench.prompts import bench_prompt_ids
from engine.bench.record import JsonReport, device_clocks
from engine.bench.single import BenchResult, path_line, run_ours, timed_run, warm_up  # run_ours: app/gui_bench.py
from engine.bench.tables import rows_of, side_by_side

__all__ = ["BenchResult", "format_sweep", "format_table", "run_bench", "run_hf", "run_ours", "run_weight_sweep"]


def run_hf(engine, prompt_ids: list[int], decode_tokens: int, our_steps, progress) -> BenchResult:
    """transformers' generate, greedy, same weights/dtype/device. Prefill time = a 1-token
    generate; decode rate = extra tokens / extra time of a (1 + decode_tokens)-token generate.
    Bytes are charged by the same cost model as ours (the same model reads the same bytes)."""
    from engine.bench.hf_compare import build_hf_model
    from engine.engine import DTYPES

    progress(0.0, "building the transformers model")
    dtype = DTYPES[engine.settings.dtype]
    hf = build_hf_model(engine.cfg, engine.loaded.weights, dtype, engine.device)
    progress(1.0, "transformers model ready")
    ids = torch.tensor([prompt_ids], device=engine.device)
    sync = torch.cuda.synchronize if engine.device.startswith("cuda") else (lambda: None)

    def gen(n: int) -> float:
        sync()
        t0 = time.perf_counter()
        with torch.inference_mode():
            out = hf.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=n, min_new_tokens=n,
                              do_sample=False, pad_token_id=0, eos_token_id=None)
        sync()
        assert out.shape[1] == ids.shape[1] + n
        return time.perf_counter() - t0

    gen(4)  # warm-up
    t_first = min(gen(1) for _ in range(2))
    t_all = gen(1 + decode_tokens)
    decode_s = t_all - t_first
    prefill = [s for s in our_steps if s.phase == "prefill"]
    decode = [s for s in our_steps if s.phase == "decode"]
    d_bytes = sum(s.total_bytes for s in decode)
    d_flops = sum(s.flops for s in decode)
    n_prompt = len(prompt_ids)
    del hf
    return BenchResult(
        name="transformers", prompt_tokens=n_prompt, decode_tokens=decode_tokens,
        prefill_tokens_per_s=n_prompt / t_first, decode_tokens_per_s=decode_tokens / decode_s, ttft_s=t_first,
        decode_achieved_gbs=d_bytes / decode_s / 1e9, peak_gbs=engine.hardware.peak_bandwidth_gbs,
        mbu=d_bytes / decode_s / (engine.hardware.peak_bandwidth_gbs * 1e9),
        mfu=d_flops / decode_s / decode[-1].peak_flops,
        predicted_ceiling_tokens_per_s=len(decode) / sum(s.total_bytes / s.peak_bandwidth_bps for s in decode),
        decode_bytes_per_token=d_bytes / len(decode))


TABLE_ROWS = [
    ("prefill tok/s", lambda r: f"{r.prefill_tokens_per_s:,.1f}"),
    ("decode tok/s", lambda r: f"{r.decode_tokens_per_s:,.2f}"),
    ("TTFT", lambda r: f"{r.ttft_s * 1e3:,.1f} ms"),
    ("decode bytes/token", lambda r: f"{r.decode_bytes_per_token / 1e6:,.1f} MB"),
    ("achieved GB/s", lambda r: f"{r.decode_achieved_gbs:,.1f}"),
    ("peak GB/s", lambda r: f"{r.peak_gbs:,.1f}"),
    ("MBU", lambda r: f"{100 * r.mbu:.1f}%"),
    ("MFU", lambda r: f"{100 * r.mfu:.2f}%"),
    ("predicted ceiling tok/s", lambda r: f"{r.predicted_ceiling_tokens_per_s:,.1f}"),
]


def format_table(results: list[BenchResult]) -> str:
    rows = TABLE_ROWS
    names = [r.name for r in results]
    if len(results) == 2:
        names.append("ratio")
    width = max(12, *(len(n) for n in names))
    table = rows_of(results, rows)
    if len(results) == 2:
        for label, cells in table:
            ratio = ""
            if label in ("prefill tok/s", "decode tok/s", "achieved GB/s", "MBU"):
                a, b = _value(results[0], label), _value(results[1], label)
                ratio = f"{a / b:.2f}x" if b else ""
            cells.append(ratio)
    return "\n".join(side_by_side("", names, table, 24, width + 2))


def _value(r: BenchResult, label: str) -> float:
    return {"prefill tok/s": r.prefill_tokens_per_s, "decode tok/s": r.decode_tokens_per_s,
            "achieved GB/s": r.decode_achieved_gbs, "MBU": r.mbu}[label]


# ---- --sweep weights ------------------------------------------------------------------------
def run_weight_sweep(engine, variants: dict, prompt_ids: list[int], decode_tokens: int, repeats: int,
                     eval_tokens: int, progress, report: JsonReport | None = None) -> tuple[dict, dict, dict, dict]:
    """Every weight setting on one engine, in one process: (results, steps, quality, paths) by
    label. Each setting is warmed up with the whole workload first; repeats are interleaved across
    settings, so background load falls on each alike; the best run of each is kept. Quality:
    perplexity and top-1 agreement with the fp model."""
    from dataclasses import replace

    from engine.model.quality import weight_quality

    seconds = dict(report.payload.get("seconds", {})) if report is not None else {}
    seconds.update(quantise_and_warmup=0.0, warmup_by_setting={}, timed=0.0)
    for i, (label, s) in enumerate(variants.items()):  # make each copy, warm it up (kernels, graphs)
        progress(i / len(variants), f"preparing {label}")
        t0 = time.perf_counter()
        engine.apply(s)
        engine.model_for(s)  # quantised copies are made in the background: wait for this one
        seconds["warmup_by_setting"][label] = warm_up(engine, prompt_ids, decode_tokens)
        seconds["quantise_and_warmup"] += time.perf_counter() - t0
    seconds["warmup"] = sum(seconds["warmup_by_setting"].values())
    if report is not None:
        report.update(seconds=seconds)
    results, steps, paths = {}, {}, {}
    for r in range(repeats):
        for i, (label, s) in enumerate(variants.items()):
            progress((r * len(variants) + i) / (repeats * len(variants)),
                     f"decoding {decode_tokens} tokens with {label} (run {r + 1}/{repeats})")
            engine.apply(s)  # every copy is made by now: applies at the first step
            result, run_steps, run_paths = timed_run(engine, prompt_ids, decode_tokens)
            seconds["timed"] += run_paths["run_s"]
            if any(m.settings_label != s.label for m in run_steps):
                raise RuntimeError(f"the sweep asked for {label}, but a step ran other settings")
            if label not in results or result.decode_tokens_per_s > results[label].decode_tokens_per_s:
                results[label], steps[label], paths[label] = replace(result, name=label), run_steps, run_paths
        if report is not None:  # what is measured so far, in case the run is cut short
            report.update(results=[asdict(res) for res in results.values()], paths=paths, repeats_done=r + 1,
                          seconds=seconds)
    quality = {}
    if eval_tokens > 0:
        progress(0.0, "measuring perplexity and top-1 agreement")
        t0 = time.perf_counter()
        quality = weight_quality(engine, variants, eval_tokens)
        seconds["quality"] = time.perf_counter() - t0
    if report is not None:
        report.update(seconds=seconds)
    progress(1.0, "done")
    return results, steps, quality, paths


def format_sweep(results: list[BenchResult], quality: dict) -> str:
    """Settings side by side; speed-up and perplexity change are relative to the first (fp)."""
    base = results[0]
    rows = list(TABLE_ROWS[:2]) + [
        (f"speed-up vs {base.name}", lambda r: f"{r.decode_tokens_per_s / base.decode_tokens_per_s:.2f}x"),
    ] + list(TABLE_ROWS[2:])
    if quality:
        base_ppl = quality[base.name].perplexity
        rows += [
            ("perplexity", lambda r: f"{quality[r.name].perplexity:.3f}"),
            (f"perplexity vs {base.name}", lambda r: f"{100 * (quality[r.name].perplexity / base_ppl - 1):+.2f}%"),
            ("top-1 agreement", lambda r: f"{100 * quality[r.name].top1_agreement:.1f}%"),
        ]
    width = max(12, *(len(r.name) for r in results))
    return "\n".join(side_by_side("", [r.name for r in results], rows_of(results, rows), 24, width + 2))


def run_bench(args, progress) -> int:
    from engine.engine import Engine
    from engine.hardware.spec import describe
    from engine.protocol import default_dtype
    from engine.settings import SamplingParams, Settings

    if args.prompt_tokens < 1 or args.decode_tokens < 2:
        raise ValueError("bench needs --prompt-tokens >= 1 and --decode-tokens >= 2")
    dtype = args.dtype or default_dtype(args.device)
    weights, group_size = getattr(args, "weights", "fp"), getattr(args, "group_size", 32)
    sweep = getattr(args, "sweep", None)
    if args.compare and (sweep or weights != "fp"):
        raise ValueError("--compare hf runs transformers on floating-point weights: use it without --weights/--sweep")
    if sweep == "weights" and weights != "fp":
        raise ValueError("--sweep weights runs fp, int8 and int4 itself: drop --weights")
    if sweep == "batch" or getattr(args, "workload", None):  # the scheduler under load: engine/bench/batch.py
        from engine.bench.batch import run_batch_bench
        return run_batch_bench(args, progress)
    if sweep in ("attention", "kv"):
        from engine.bench.attention import run_sweep
        return run_sweep(args, progress)
    if sweep == "speculative":
        from engine.bench.speculative import run_speculative_sweep
        return run_speculative_sweep(args, progress)
    if sweep == "overhead":
        from engine.bench.overhead import run_overhead_sweep
        return run_overhead_sweep(args, progress)
    settings = Settings(dtype=dtype, kv_layout=args.kv_layout, attention=args.attention,
                        kv_cache=False if args.no_kv_cache else None, max_new_tokens=args.decode_tokens + 1,
                        sampling=SamplingParams(greedy=True, temperature=0.0), weights=weights,
                        group_size=group_size)
    need = args.prompt_tokens + args.decode_tokens + 1
    t0 = time.perf_counter()
    engine = Engine(args.model, device=args.device, dtype=dtype, max_context=max(args.max_context, need),
                    progress=progress, settings=settings)
    load_s = time.perf_counter() - t0
    if need > engine.max_context:
        raise ValueError(f"workload needs {need} positions; the model's context is {engine.max_context}")
    print(f"model: {engine.loaded.label}", file=sys.stderr)
    print(f"device: {describe(engine.hardware)}", file=sys.stderr)
    report = JsonReport(args.json, model=engine.loaded.label, device=engine.hardware.to_dict(), dtype=dtype,
                        workload={"prompt_tokens": args.prompt_tokens, "decode_tokens": args.decode_tokens,
                                  "repeats": args.repeats, "settings": settings.label},
                        seconds={"load": load_s})
    prompt_ids = bench_prompt_ids(engine.tokenizer, args.prompt_tokens)
    if sweep == "weights":
        return _print_weight_sweep(engine, settings, prompt_ids, args, progress, report)
    progress(0.0, "warming up")
    warmup_s = warm_up(engine, prompt_ids, args.decode_tokens)
    report.update(seconds={"load": load_s, "warmup": warmup_s})
    clocks_before = device_clocks(engine.hardware)
    best = steps = paths = None
    timed_s = 0.0
    for r in range(args.repeats):
        progress(r / args.repeats, f"decoding {args.decode_tokens} tokens (run {r + 1}/{args.repeats})")
        result, run_steps, run_paths = timed_run(engine, prompt_ids, args.decode_tokens)
        timed_s += run_paths["run_s"]
        if best is None or result.decode_tokens_per_s > best.decode_tokens_per_s:
            best, steps, paths = result, run_steps, run_paths
    clocks = {"before_timed": clocks_before, "after_timed": device_clocks(engine.hardware)}
    progress(1.0, "done")
    results = [best]
    if args.compare == "hf":
        results.append(run_hf(engine, prompt_ids, args.decode_tokens, steps, progress))
    print(f"\nworkload: batch 1, prompt {args.prompt_tokens} tokens, decode {args.decode_tokens} tokens, "
          f"greedy, {settings.label.replace(' · kv', ', KV cache')}")
    print(format_table(results))
    print(path_line(paths))
    report.finish(results=[asdict(r) for r in results], paths=paths, clocks=clocks,
                  seconds={"load": load_s, "warmup": warmup_s, "timed": timed_s},
                  steps=[s.to_dict() for s in steps])
    return 0


def _print_weight_sweep(engine, settings, prompt_ids: list[int], args, progress, report: JsonReport) -> int:
    from engine.model.quality import evaluation_ids, text_description, weight_variants

    variants = weight_variants(settings, args.group_size)
    clocks_before = device_clocks(engine.hardware)
    results, steps, quality, paths = run_weight_sweep(engine, variants, prompt_ids, args.decode_tokens,
                                                      args.repeats, args.eval_tokens, progress, report)
    clocks = {"before_timed": clocks_before, "after_timed": device_clocks(engine.hardware)}
    ordered = [results[label] for label in variants]
    print(f"\nworkload: batch 1, prompt {args.prompt_tokens} tokens, decode {args.decode_tokens} tokens, greedy, "
          f"{settings.dtype} activations, KV cache {'off' if args.no_kv_cache else 'on'}; int8 per output channel, "
          f"int4 asymmetric group {args.group_size}; the head is int8 in both (engine/model/quant.py)")
    print(format_sweep(ordered, quality))
    if quality:
        n = next(iter(quality.values())).n_tokens
        print(f"quality text: {text_description(evaluation_ids(engine.tokenizer, args.eval_tokens))}, "
              f"{n} tokens predicted")
    for label in variants:
        print(f"{label} {path_line(paths[label])}")
    report.finish(results=[asdict(r) for r in ordered], paths=paths, clocks=clocks,
                  quality={label: asdict(q) for label, q in quality.items()},
                  steps={label: [s.to_dict() for s in run_steps] for label, run_steps in steps.items()})
    return 0
