"""`membound bench`: a fixed workload (a prompt of N tokens, then M greedy decode steps that
ignore EOS), reported against the device's peak; `--compare hf` runs transformers' generate
on the same weights, prompt, dtype and device in the same run; `--compare llamacpp` llama.cpp's
server on the same GGUF file and threads, its runs interleaved with ours."""
from __future__ import annotations

import contextlib
import sys
import time
from dataclasses import asdict, replace

import torch

from engine.bench.prompts import bench_prompt_ids
from engine.bench.record import JsonReport, device_clocks
# run_ours: for app/gui_bench.py
from engine.bench.beside import ReadBeside, beside_rows
from engine.bench.single import BenchResult, path_line, roof_of, roof_peak, run_ours, timed_run, warm_up
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
    roof_s, level = roof_of(decode)  # its steps' bytes as ours are charged, so under the same roofs
    return BenchResult(
        name="transformers", prompt_tokens=n_prompt, decode_tokens=decode_tokens,
        prefill_tokens_per_s=n_prompt / t_first, decode_tokens_per_s=decode_tokens / decode_s, ttft_s=t_first,
        decode_achieved_gbs=d_bytes / decode_s / 1e9, peak_gbs=d_bytes / roof_s / 1e9,
        mbu=roof_s / decode_s,
        mfu=d_flops / decode_s / decode[-1].peak_flops, predicted_ceiling_tokens_per_s=len(decode) / roof_s,
        decode_bytes_per_token=d_bytes / len(decode), roof=level)


TABLE_ROWS = [
    ("prefill tok/s", lambda r: f"{r.prefill_tokens_per_s:,.1f}"),
    ("decode tok/s", lambda r: f"{r.decode_tokens_per_s:,.2f}"),
    ("TTFT", lambda r: f"{r.ttft_s * 1e3:,.1f} ms"),
    ("decode bytes/token", lambda r: f"{r.decode_bytes_per_token / 1e6:,.1f} MB"),
    ("achieved GB/s", lambda r: f"{r.decode_achieved_gbs:,.1f}"),
    ("peak GB/s", lambda r: f"{r.peak_gbs:,.1f}" + ("" if r.roof == "memory" else f" ({r.roof})")),
    ("MBU", lambda r: f"{100 * r.mbu:.1f}%"),
    ("MFU", lambda r: f"{100 * r.mfu:.2f}%"),
    ("predicted ceiling tok/s", lambda r: f"{r.predicted_ceiling_tokens_per_s:,.1f}"),
]


def format_table(results: list[BenchResult]) -> str:
    """Results side by side; with two or more, a last column: the first's figure over the second's."""
    rows = [*TABLE_ROWS, *beside_rows(results)]
    names = [r.name for r in results]
    if len(results) >= 2:
        names.append("ratio")
    width = max(12, *(len(n) for n in names))
    table = rows_of(results, rows)
    if len(results) >= 2:
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
                     eval_tokens: int, progress, report: JsonReport | None = None,
                     peer=None) -> tuple[dict, dict, dict, dict]:
    """Every weight setting on one engine, in one process: (results, steps, quality, paths) by
    label. Each setting is warmed up with the whole workload first; repeats are interleaved across
    settings, so background load falls on each alike; the best run of each is kept. Quality:
    perplexity and top-1 agreement with the first setting. `peer` (a callable returning a
    BenchResult, or a list of them: llama.cpp's runs of the same workload) runs after the settings in
    each repeat."""
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
    if peer is not None:
        t0 = time.perf_counter()
        peer()
        seconds["warmup_by_setting"]["peer"] = time.perf_counter() - t0
    seconds["warmup"] = sum(seconds["warmup_by_setting"].values())
    if report is not None:
        report.update(seconds=seconds)
    results, steps, paths = {}, {}, {}
    beside = ReadBeside.for_engine(engine)
    for r in range(repeats):
        for i, (label, s) in enumerate(variants.items()):
            progress((r * len(variants) + i) / (repeats * len(variants)),
                     f"decoding {decode_tokens} tokens with {label} (run {r + 1}/{repeats})")
            engine.apply(s)  # every copy is made by now: applies at the first step
            result, run_steps, run_paths = timed_run(engine, prompt_ids, decode_tokens, beside)
            seconds["timed"] += run_paths["run_s"]
            if any(m.settings_label != s.label for m in run_steps):
                raise RuntimeError(f"the sweep asked for {label}, but a step ran other settings")
            if label not in results or result.decode_tokens_per_s > results[label].decode_tokens_per_s:
                results[label], steps[label], paths[label] = replace(result, name=label), run_steps, run_paths
        if peer is not None:
            progress((r + 1) / repeats, f"decoding {decode_tokens} tokens with the peer (run {r + 1}/{repeats})")
            found = peer()
            for other in found if isinstance(found, list) else [found]:
                if other.name not in results or other.decode_tokens_per_s > results[other.name].decode_tokens_per_s:
                    results[other.name] = other
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


def format_sweep(results: list[BenchResult], quality: dict, chain: bool = False, quality_base: str | None = None,
                 peers: int = 0) -> str:
    """Settings side by side, then `peers` columns of another engine. Speed-up: relative to the
    first column, or with `chain` to the column before it; perplexity change: relative to
    `quality_base` (default the first). A column without quality figures (a peer's) shows none."""
    base = results[0]
    ours = results[:len(results) - peers]
    if chain:
        before = {r.name: p for p, r in zip(ours, ours[1:])}
        speed_up = ("speed-up vs column before", lambda r: f"{r.decode_tokens_per_s / before[r.name].decode_tokens_per_s:.2f}x"
                    if r.name in before else "")
    else:
        speed_up = (f"speed-up vs {base.name}", lambda r: f"{r.decode_tokens_per_s / base.decode_tokens_per_s:.2f}x"
                    if r in ours else "")
    rows = list(TABLE_ROWS[:2]) + [speed_up] + list(TABLE_ROWS[2:]) + list(beside_rows(results))
    if quality:
        ref = quality_base or base.name
        base_ppl = quality[ref].perplexity
        rows += [
            ("perplexity", lambda r: f"{quality[r.name].perplexity:.3f}" if r.name in quality else ""),
            (f"perplexity vs {ref}", lambda r: f"{100 * (quality[r.name].perplexity / base_ppl - 1):+.2f}%"
             if r.name in quality else ""),
            (f"top-1 agreement ({base.name})", lambda r: f"{100 * quality[r.name].top1_agreement:.1f}%"
             if r.name in quality else ""),
        ]
    width = max(12, *(len(r.name) for r in results))
    return "\n".join(side_by_side("", [r.name for r in results], rows_of(results, rows), 26, width + 2))


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
    if args.compare == "hf" and (sweep or weights != "fp"):
        raise ValueError("--compare hf runs transformers on floating-point weights: use it without --weights/--sweep")
    gguf = None
    if args.compare == "llamacpp":
        from engine.bench.llamacpp import peer_model
        gguf = peer_model(args.model, sweep, getattr(args, "workload", None), args.device)
    if sweep in ("weights", "precision") and weights != "fp":
        raise ValueError(f"--sweep {sweep} runs fp, int8 and int4 itself: drop --weights")
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
    if engine.device == "cpu":
        from engine.model.cpu_step import fallback_line
        if line := fallback_line(engine.context):
            print(line, file=sys.stderr)
    report = JsonReport(args.json, model=engine.loaded.label, device=engine.hardware.to_dict(), dtype=dtype,
                        workload={"prompt_tokens": args.prompt_tokens, "decode_tokens": args.decode_tokens,
                                  "repeats": args.repeats, "settings": settings.label},
                        seconds={"load": load_s})
    prompt_ids = bench_prompt_ids(engine.tokenizer, args.prompt_tokens)
    if sweep in ("weights", "precision"):
        return _print_weight_sweep(engine, settings, prompt_ids, args, progress, report, gguf)
    if gguf is not None:
        return _run_against_llamacpp(engine, gguf, settings, prompt_ids, args, progress, report, load_s)
    progress(0.0, "warming up")
    warmup_s = warm_up(engine, prompt_ids, args.decode_tokens)
    report.update(seconds={"load": load_s, "warmup": warmup_s})
    clocks_before = device_clocks(engine.hardware)
    best = steps = paths = None
    timed_s = 0.0
    beside = ReadBeside.for_engine(engine)
    for r in range(args.repeats):
        progress(r / args.repeats, f"decoding {args.decode_tokens} tokens (run {r + 1}/{args.repeats})")
        result, run_steps, run_paths = timed_run(engine, prompt_ids, args.decode_tokens, beside)
        timed_s += run_paths["run_s"]
        if best is None or result.decode_tokens_per_s > best.decode_tokens_per_s:
            best, steps, paths = result, run_steps, run_paths
    clocks = {"before_timed": clocks_before, "after_timed": device_clocks(engine.hardware)}
    progress(1.0, "done")
    results = [best]
    if args.compare == "hf":
        results.append(run_hf(engine, prompt_ids, args.decode_tokens, steps, progress))
    results, peak_line = roof_peak(engine, results)
    print(f"\nworkload: batch 1, prompt {args.prompt_tokens} tokens, decode {args.decode_tokens} tokens, "
          f"greedy, {settings.label.replace(' · kv', ', KV cache')}")
    print(format_table(results))
    if peak_line:
        print(peak_line)
    print(path_line(paths))
    profiles = _profiles(engine, {settings.label: settings}, prompt_ids, args, progress)
    report.finish(peak=peak_line, peak_bandwidth_gbs=engine.hardware.peak_bandwidth_gbs,
                  results=[asdict(r) for r in results], paths=paths, clocks=clocks, profile=profiles,
                  seconds={"load": load_s, "warmup": warmup_s, "timed": timed_s},
                  steps=[s.to_dict() for s in steps])
    return 0


def precision_variants(settings, group_size: int = 32) -> dict:
    """label -> settings for fp32, bf16, then int8 and int4 with bf16 activations: each halves (about)
    the bytes of the one before."""
    from dataclasses import replace
    bf16 = replace(settings, dtype="bf16", weights="fp")
    return {"fp32": replace(settings, dtype="fp32", weights="fp"), "bf16": bf16,
            "int8": replace(bf16, weights="int8"), f"int4 g{group_size}": replace(bf16, weights="int4",
                                                                                  group_size=group_size)}


def _print_weight_sweep(engine, settings, prompt_ids: list[int], args, progress, report: JsonReport,
                        gguf=None) -> int:
    from engine.model.quality import evaluation_ids, text_description, weight_variants

    precision = args.sweep == "precision"
    variants = precision_variants(settings, args.group_size) if precision else weight_variants(settings, args.group_size)
    clocks_before = device_clocks(engine.hardware)
    with contextlib.ExitStack() as stack:
        peer = _llamacpp_peer(stack, engine, gguf, prompt_ids, args) if gguf is not None else None
        results, steps, quality, paths = run_weight_sweep(engine, variants, prompt_ids, args.decode_tokens,
                                                          args.repeats, args.eval_tokens, progress, report, peer)
    clocks = {"before_timed": clocks_before, "after_timed": device_clocks(engine.hardware)}
    ordered = [results[label] for label in variants] + [r for label, r in results.items() if label not in variants]
    ordered, peak_line = roof_peak(engine, ordered)
    activations = "fp32 and bf16 weights, then bf16" if precision else settings.dtype
    print(f"\nworkload: batch 1, prompt {args.prompt_tokens} tokens, decode {args.decode_tokens} tokens, greedy, "
          f"{torch.get_num_threads()} threads, {activations} activations, KV cache "
          f"{'off' if args.no_kv_cache else 'on'}; int8 per output channel, int4 asymmetric group {args.group_size}; "
          "the head is int8 in both (engine/model/quant.py)")
    print(format_sweep(ordered, quality, chain=precision, quality_base="bf16" if precision else None,
                       peers=len(ordered) - len(variants)))
    if peak_line:
        print(peak_line)
    if quality:
        n = next(iter(quality.values())).n_tokens
        print(f"quality text: {text_description(evaluation_ids(engine.tokenizer, args.eval_tokens))}, "
              f"{n} tokens predicted")
    for label in variants:
        print(f"{label} {path_line(paths[label])}")
    profiles = _profiles(engine, variants, prompt_ids, args, progress)
    if gguf is not None:
        int4 = ordered[len(variants) - 1]
        ratios = ", ".join(f"{r.name} {int4.decode_tokens_per_s / r.decode_tokens_per_s:.2f}x"
                           for r in ordered[len(variants):])
        print(f"llama.cpp: {gguf.name}, {torch.get_num_threads()} threads; {PEER_SOURCES}")
        print(f"{int4.name} / llama.cpp decode tok/s: {ratios}")
    report.finish(peak=peak_line, peak_bandwidth_gbs=engine.hardware.peak_bandwidth_gbs,
                  results=[asdict(r) for r in ordered], paths=paths, clocks=clocks, profile=profiles,
                  quality={label: asdict(q) for label, q in quality.items()},
                  steps={label: [s.to_dict() for s in run_steps] for label, run_steps in steps.items()})
    return 0


def _profiles(engine, variants: dict, prompt_ids: list[int], args, progress) -> dict:
    """--profile: each setting's decode step profiled and printed (engine/bench/profile.py)."""
    if not getattr(args, "profile", False):
        return {}
    if engine.device != "cpu":
        print("profile: the C++ step's profile is for a CPU (on a GPU: nsys or torch.profiler)")
        return {}
    from engine.bench.profile import format_profile, profile_step
    found = {}
    for label, s in variants.items():
        progress(0.0, f"profiling a decode step of {label}")
        found[label] = profile_step(engine, s, prompt_ids)
        print(format_profile(label, found[label], engine.hardware.peak_bandwidth_gbs))
    return found


# ---- --compare llamacpp -----------------------------------------------------------------------
PEER_SOURCES = ("llama-bench: its own timing of prompt processing and of generation after the prompt's context "
                "(no sampling); llama-server: its /completion timings over HTTP (prompt_ms, predicted_ms: "
                "sampling and the server's loop included)")


def _llamacpp_peer(stack: contextlib.ExitStack, engine, gguf, prompt_ids: list[int], args):
    """A callable running llama.cpp on the workload: llama-bench, then its server (started now,
    stopped with `stack`); a BenchResult of each, named by the tool."""
    from engine.bench.llamacpp import (LlamaServer, find_server, find_tool, gguf_matmul_bytes,
                                       llama_bench_result, result_of, run_llama_bench)
    from engine.hardware.roof import Roof

    threads = torch.get_num_threads()
    n_predict = args.decode_tokens + 1  # as ours: the first token, then decode_tokens decode steps
    server = stack.enter_context(LlamaServer(find_server(), gguf, threads, len(prompt_ids) + n_predict + 16))
    weight_bytes = gguf_matmul_bytes(gguf)
    roof = Roof.of(engine.hardware)  # its steps under the same roofs as ours

    def run() -> list[BenchResult]:
        bench = run_llama_bench(find_tool("llama-bench"), gguf, threads, len(prompt_ids), args.decode_tokens)
        timings = server.complete(prompt_ids, n_predict)
        return [llama_bench_result("llama-bench", bench, engine.cfg, weight_bytes, roof),
                result_of("llama-server", timings, engine.cfg, len(prompt_ids), weight_bytes, roof)]
    return run


def _run_against_llamacpp(engine, gguf, settings, prompt_ids: list[int], args, progress, report: JsonReport,
                          load_s: float) -> int:
    """Ours and llama.cpp (llama-bench, then its server), warmed up, then their runs interleaved
    (ours, then llama.cpp's, each repeat): load on a shared machine falls on all alike. The best run
    of each is kept; the ratio is ours over llama-bench's (llama.cpp's own measure)."""
    from engine.bench.llamacpp import find_server, find_tool, gguf_matmul_bytes

    threads = torch.get_num_threads()
    with contextlib.ExitStack() as stack:
        peer = _llamacpp_peer(stack, engine, gguf, prompt_ids, args)
        progress(0.0, "warming up membound and llama.cpp")
        t0 = time.perf_counter()
        warm_up(engine, prompt_ids, args.decode_tokens)
        peer()
        warmup_s = time.perf_counter() - t0
        ours = steps = paths = None
        theirs: dict[str, BenchResult] = {}
        runs = []
        beside = ReadBeside.for_engine(engine)
        for r in range(args.repeats):
            progress(r / args.repeats, f"decoding {args.decode_tokens} tokens, membound then llama.cpp "
                                       f"(run {r + 1}/{args.repeats})")
            result, run_steps, run_paths = timed_run(engine, prompt_ids, args.decode_tokens, beside)
            found = peer()
            runs.append({"membound_decode_tokens_per_s": result.decode_tokens_per_s,
                         **{f"{p.name}_decode_tokens_per_s": p.decode_tokens_per_s for p in found}})
            if ours is None or result.decode_tokens_per_s > ours.decode_tokens_per_s:
                ours, steps, paths = result, run_steps, run_paths
            for p in found:
                if p.name not in theirs or p.decode_tokens_per_s > theirs[p.name].decode_tokens_per_s:
                    theirs[p.name] = p
            report.update(runs=runs)
    progress(1.0, "done")
    ours = replace(ours, name=f"membound {settings.weights if settings.weights != 'fp' else settings.dtype}")
    results, peak_line = roof_peak(engine, [ours, *theirs.values()])
    print(f"\nworkload: batch 1, prompt {args.prompt_tokens} tokens, decode {args.decode_tokens} tokens, greedy, "
          f"{threads} threads; membound {settings.label.replace(' · kv', ', KV cache')}; llama.cpp "
          f"({find_server().parent}) on {gguf.name}, fp16 KV cache")
    print(format_table(results))
    print(f"ratio: {results[0].name} / {results[1].name}")
    if peak_line:
        print(peak_line)
    print(path_line(paths))
    profiles = _profiles(engine, {settings.label: settings}, prompt_ids, args, progress)
    print(f"llama.cpp's times: {PEER_SOURCES}; its bytes are the cost model's for what it reads: the GGUF's "
          "tensors as stored")
    report.finish(peak=peak_line, peak_bandwidth_gbs=engine.hardware.peak_bandwidth_gbs,
                  results=[asdict(r) for r in results], paths=paths, runs=runs, threads=threads, profile=profiles,
                  llamacpp={"server": str(find_server()), "llama_bench": str(find_tool("llama-bench")),
                            "model": str(gguf), "weight_bytes": gguf_matmul_bytes(gguf)},
                  seconds={"load": load_s, "warmup": warmup_s}, steps=[s.to_dict() for s in steps])
    return 0
