"""`membound bench --sweep attention` and `--sweep kv`: attention backends and KV-cache layouts over
context lengths, in one process on one engine, so the ratios compare like with like.

Each configuration runs on its own engine and the engines take their steps in turn, so bursts of
load from elsewhere hit them alike; prefill is the best of --repeats runs, decode tok/s is 1 / the
median decode step; bytes per token come from the cost model (engine/metrics.py), split into
weights, KV cache and naive attention's score matrix. On a GPU the steps run eager (no CUDA graphs:
launch overhead is in every row alike) and `--sweep attention` also times the flash-decoding kernel
alone on a 32k-token context and reports the KV bandwidth it reaches against the peak."""
from __future__ import annotations

import sys
import time
from dataclasses import asdict, dataclass, replace

import torch

CPU_ATTENTION_CONTEXTS = (1024, 4096)
GPU_ATTENTION_CONTEXTS = (1024, 4096, 8192)
KV_CONTEXTS = (128, 256, 512, 1024, 2048, 4096)
KERNEL_CONTEXT = 32768  # the GPU kernel check: batch 1, 32k tokens of context
# naive prefill materialises (H, T, T) scores (twice: scores and probabilities); above this many
# bytes a point prefills with flash and switches to naive for its decode steps
NAIVE_PREFILL_BUDGET = {"cpu": 4 << 30, "cuda": 24 << 30}


@dataclass
class SweepPoint:
    attention: str
    kv_layout: str
    context: int  # prompt tokens before the first decode step
    prefill_attention: str  # the backend that ran the prefill
    prefill_s: float
    prefill_tokens_per_s: float
    decode_steps: int
    decode_tokens_per_s: float  # 1 / median decode step
    weight_bytes_per_token: float
    kv_bytes_per_token: float  # K/V read + written (+ block tables, paged)
    attention_bytes_per_token: float  # score matrix written and read (naive)
    total_bytes_per_token: float
    achieved_gbs: float
    mbu: float


def _next_step(gen):
    from engine.metrics import StepMetrics
    for event in gen:
        if isinstance(event, StepMetrics):
            return event
    return None


def measure_interleaved(engines: dict, prompt_ids: list[int], decode_tokens: dict, repeats: int = 1,
                        prefill_attention: dict | None = None) -> dict:
    """Run the same prompt on several engines (one per configuration) one step at a time in turn,
    so every configuration sees the same machine (a 2-core machine shared with others is noisy in
    bursts of seconds): returns name -> (prefill steps, decode steps). `decode_tokens[name]`: decode
    steps for that engine (fewer without a cache); `prefill_attention[name]`: a backend to prefill
    with before switching to the engine's own (naive where its score matrix would not fit)."""
    steps = {name: ([], []) for name in engines}
    for _ in range(repeats):
        gens = {}
        for name, engine in engines.items():
            engine.reset()
            own = engine.settings
            if prefill_attention and prefill_attention.get(name):
                engine.apply(replace(own, attention=prefill_attention[name]))
            gens[name] = (engine, own, engine.generate(prompt_ids, max_new_tokens=decode_tokens[name] + 1,
                                                       ignore_eos=True))
        for i in range(max(decode_tokens.values()) + 1):
            for name, (engine, own, gen) in gens.items():
                if i > decode_tokens[name]:
                    continue
                step = _next_step(gen)
                if i == 0:
                    steps[name][0].append(step)
                    if engine.settings != own:
                        engine.apply(own)  # same layout: no re-prefill, the next step decodes with it
                else:
                    steps[name][1].append(step)
        for engine, _, gen in gens.values():
            gen.close()
            engine.reset()
    return steps


def summarise_point(attention: str, kv_layout: str, context: int, prefill_attention: str, prefill: list,
                    decode: list) -> SweepPoint:
    best = min(prefill, key=lambda s: s.step_s)  # interference only ever adds time
    mid = sorted(decode, key=lambda s: s.step_s)[len(decode) // 2]
    n = len(decode)
    return SweepPoint(
        attention=attention, kv_layout=kv_layout, context=context, prefill_attention=prefill_attention,
        prefill_s=best.step_s, prefill_tokens_per_s=best.new_tokens / best.step_s,
        decode_steps=n, decode_tokens_per_s=1.0 / mid.step_s,
        weight_bytes_per_token=sum(s.weight_bytes for s in decode) / n,
        kv_bytes_per_token=sum(s.kv_bytes for s in decode) / n,
        attention_bytes_per_token=sum(s.attention_bytes for s in decode) / n,
        total_bytes_per_token=sum(s.total_bytes for s in decode) / n,
        achieved_gbs=mid.achieved_gbs, mbu=mid.mbu)


def run_sweep(args, progress) -> int:
    from engine.bench.prompts import bench_prompt_ids
    from engine.bench.record import JsonReport, PathWatch, device_clocks
    from engine.bench.single import path_line, warm_up_decode_tokens
    from engine.engine import DTYPES, Engine
    from engine.hardware.spec import describe
    from engine.io.loader import load_model
    from engine.protocol import default_dtype
    from engine.settings import SamplingParams, Settings

    sweep = args.sweep
    on_gpu = args.device == "cuda"
    if args.contexts:
        contexts = tuple(int(c) for c in args.contexts.split(","))
    elif sweep == "kv":
        contexts = KV_CONTEXTS
    else:
        contexts = GPU_ATTENTION_CONTEXTS if on_gpu else CPU_ATTENTION_CONTEXTS
    if min(contexts) < 1 or args.decode_tokens < 2:
        raise ValueError("the sweep needs contexts >= 1 and --decode-tokens >= 2")
    dtype = args.dtype or default_dtype(args.device)
    # eager steps on a GPU (no CUDA graphs) in both sweeps: flash decode is then the Triton kernel
    # (a captured graph runs SDPA instead) and a paged step (always eager) compares like with like
    base = Settings(dtype=dtype, weights=getattr(args, "weights", "fp"), max_new_tokens=args.decode_tokens + 1,
                    sampling=SamplingParams(greedy=True, temperature=0.0), cuda_graphs=False)
    if sweep == "attention":
        layout = args.kv_layout if args.kv_layout != "off" else "contiguous"
        configs = {a: replace(base, attention=a, kv_layout=layout) for a in ("naive", "flash")}
    else:
        configs = {lay: replace(base, attention=args.attention, kv_layout=lay)
                   for lay in ("contiguous", "paged", "off")}
    need = max(contexts) + args.decode_tokens + 1
    t0 = time.perf_counter()
    loaded = load_model(args.model, DTYPES[dtype], args.device, progress, max(args.max_context, need))
    engines, hardware = {}, None
    for name, settings in configs.items():  # one engine per configuration: each keeps its own cache
        engines[name] = Engine(loaded, device=args.device, hardware=hardware, settings=settings,
                               progress=progress if hardware is None else None)
        hardware = engines[name].hardware
    first = next(iter(engines.values()))
    fit = first.max_context - args.decode_tokens - 1
    if any(c > fit for c in contexts):
        print(f"note: the model's context is {first.max_context}: contexts above {fit} run at {fit}", file=sys.stderr)
        contexts = tuple(sorted({min(c, fit) for c in contexts}))
    seconds = {"load": time.perf_counter() - t0, "warmup": 0.0, "timed": 0.0}
    print(f"model: {loaded.label}", file=sys.stderr)
    print(f"device: {describe(hardware)}", file=sys.stderr)
    report = JsonReport(args.json, sweep=sweep, model=loaded.label, device=hardware.to_dict(), dtype=dtype,
                        seconds=seconds)
    elem = torch.tensor([], dtype=first.model.dtype).element_size()
    off_tokens = max(2, args.decode_tokens // 4)  # without a cache every decode step is a whole prefill
    decode = {name: off_tokens if name == "off" else args.decode_tokens for name in engines}

    clocks_before = device_clocks(hardware)
    points, paths = [], {}
    for i, context in enumerate(contexts):
        progress(i / len(contexts), f"{sweep} sweep: {context} tokens of context")
        prompt = bench_prompt_ids(first.tokenizer, context)
        score_bytes = 2 * first.cfg.n_heads * context * context * elem
        too_big = score_bytes > NAIVE_PREFILL_BUDGET["cuda" if on_gpu else "cpu"]
        prefill_with = {"naive": "flash"} if too_big and "naive" in engines else {}
        t0 = time.perf_counter()  # this context's work once, untimed: its prefill shape, kernel variants
        measure_interleaved(engines, prompt, {name: min(n, warm_up_decode_tokens(args)) for name, n in decode.items()},
                            1, prefill_with)
        seconds["warmup"] += time.perf_counter() - t0
        t0, watch = time.perf_counter(), PathWatch()
        steps = measure_interleaved(engines, prompt, decode, args.repeats, prefill_with)
        seconds["timed"] += time.perf_counter() - t0
        for name, (prefill, decode_steps) in steps.items():
            settings = configs[name]
            points.append(summarise_point(settings.attention, settings.kv_layout, context,
                                          prefill_with.get(name, settings.attention), prefill, decode_steps))
        paths[context] = watch.report([s for _, d in steps.values() for s in d], first.model,
                                      cuda_graphs="off: eager steps compare the kernels like with like")
        report.update(points=[asdict(p) for p in points], paths=paths, seconds=seconds)
    clocks = {"before_timed": clocks_before, "after_timed": device_clocks(hardware)}
    kernel = kernel_microbench(first, progress) if sweep == "attention" and on_gpu else \
        [{"name": "kernel micro-benchmark", "skipped": "needs a GPU" if sweep == "attention" else "not in this sweep",
          "line": "kernel micro-benchmark: skipped (" + ("needs a GPU" if sweep == "attention" else "kv sweep") + ")"}]
    progress(1.0, "done")

    fewer = f" ({off_tokens} with the cache off)" if "off" in engines else ""
    print(f"\nsweep {sweep}: batch 1, greedy, {dtype}; after each context {args.decode_tokens} decode steps"
          f"{fewer}, configurations interleaved step by step, {args.repeats} run(s); "
          f"prefill = best run, decode tok/s = 1 / median step; bytes per token from the cost model; "
          f"peak {hardware.peak_bandwidth_gbs:,.1f} GB/s")
    print(format_points(points))
    for line in summary_lines(sweep, points):
        print(line)
    for row in kernel:
        print(row["line"])
    print(f"context {contexts[-1]}: {path_line(paths[contexts[-1]])}")
    report.finish(points=[asdict(p) for p in points], paths=paths, clocks=clocks, seconds=seconds, kernel=kernel)
    return 0


def format_points(points: list[SweepPoint]) -> str:
    head = (f"{'attention':<10}{'kv':<12}{'context':>8}{'prefill tok/s':>15}{'decode tok/s':>14}"
            f"{'weights MB/tok':>16}{'KV MB/tok':>11}{'scores MB/tok':>15}{'GB/s':>9}{'MBU':>8}")
    lines = [head]
    for p in points:
        prefill = f"{p.prefill_tokens_per_s:,.0f}" + ("*" if p.prefill_attention != p.attention else "")
        lines.append(f"{p.attention:<10}{p.kv_layout:<12}{p.context:>8}{prefill:>15}{p.decode_tokens_per_s:>14,.2f}"
                     f"{p.weight_bytes_per_token / 1e6:>16,.1f}{p.kv_bytes_per_token / 1e6:>11,.2f}"
                     f"{p.attention_bytes_per_token / 1e6:>15,.2f}{p.achieved_gbs:>9,.1f}{100 * p.mbu:>7.1f}%")
    if any(p.prefill_attention != p.attention for p in points):
        lines.append("* prefilled with flash (naive's score matrix would not fit), then decoded with naive")
    return "\n".join(lines)


def summary_lines(sweep: str, points: list[SweepPoint]) -> list[str]:
    """The ratios the issue asks about, from this run's points."""
    at = {(p.attention, p.kv_layout, p.context): p for p in points}
    lines = []
    for context in sorted({p.context for p in points}):
        if sweep == "attention":
            layout = next(p.kv_layout for p in points)
            naive, flash = at.get(("naive", layout, context)), at.get(("flash", layout, context))
            if naive and flash:
                prefill = (f"prefill flash/naive {flash.prefill_tokens_per_s / naive.prefill_tokens_per_s:.2f}x"
                           if naive.prefill_attention == "naive" else "prefill: naive ran with flash")
                lines.append(f"context {context}: {prefill}, decode flash/naive "
                             f"{flash.decode_tokens_per_s / naive.decode_tokens_per_s:.2f}x")
        else:
            attention = points[0].attention
            cont, paged, off = (at.get((attention, lay, context)) for lay in ("contiguous", "paged", "off"))
            if cont and paged and off:
                on_off = cont.decode_tokens_per_s / off.decode_tokens_per_s
                lines.append(f"context {context}: decode cache on/off {on_off:.1f}x, "
                             f"paged/contiguous {paged.decode_tokens_per_s / cont.decode_tokens_per_s:.3f}")
    return lines


def kernel_microbench(engine, progress, context: int = KERNEL_CONTEXT, repeats: int = 10) -> list[dict]:
    """The flash-decoding kernel alone (GPU): one query per KV head group over `context` cached
    positions in every layer (the model's KV shape and dtype). The 32-layer loop is captured once
    in a CUDA graph and its replays are timed with CUDA events, so the host's per-call work
    (allocation, launch) stays out of the figure; achieved GB/s = K and V bytes read / time. Also
    the paged kernel over a shuffled block table, and PyTorch's SDPA on the same tensors."""
    import torch.nn.functional as F

    from kernels.flash_decode import flash_decode, paged_flash_decode, reference_decode

    cfg = engine.cfg
    dtype = engine.model.dtype
    dev = engine.device
    L, H, n_kv, hd = cfg.n_layers, cfg.n_heads, cfg.n_kv_heads, cfg.head_dim
    progress(0.95, f"flash-decoding kernel alone, {context} tokens of context")
    k = torch.randn(L, 1, n_kv, context, hd, dtype=dtype, device=dev)
    v = torch.randn_like(k)
    q = torch.randn(1, H, hd, dtype=dtype, device=dev)
    lens = torch.full((1,), context, dtype=torch.int32, device=dev)
    block_size = 16
    table = torch.randperm(context // block_size, device=dev).to(torch.int32)[None]  # scattered blocks
    kv_bytes = 2 * L * n_kv * context * hd * k.element_size()
    peak = engine.hardware.peak_bandwidth_gbs
    err = (flash_decode(q, k[0], v[0], lens).float() - reference_decode(q, k[0], v[0], lens).float()).abs().max()

    def timed(fn) -> tuple[float, str]:
        """Seconds per L-layer step, and how it was timed."""
        def step():
            for layer in range(L):
                fn(layer)

        step()  # compiles the kernel variants before the capture
        torch.cuda.synchronize()
        try:
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graph):
                step()
            run, how = graph.replay, f"CUDA graph of {L} layer calls, {repeats} replays"
        except Exception as e:  # time the launches instead, and say so
            torch.cuda.synchronize()
            run, how = step, f"eager launches ({L} x {repeats}; capture failed: {type(e).__name__})"
        run()
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        for _ in range(repeats):
            run()
        end.record()
        end.synchronize()
        return start.elapsed_time(end) / 1e3 / repeats, how

    qg = q.view(1, n_kv, H // n_kv, hd)
    variants = [("flash_decode (auto splits)", lambda l: flash_decode(q, k[l], v[l], lens))]
    for block_n in (32, 128):
        variants.append((f"flash_decode block_n={block_n}",
                         lambda l, b=block_n: flash_decode(q, k[l], v[l], lens, block_n=b)))
    variants.append(("paged_flash_decode (shuffled blocks of 16)",
                     lambda l: paged_flash_decode(q, k[l, 0], v[l, 0], table, lens, block_size)))
    variants.append(("torch SDPA (for comparison)", lambda l: F.scaled_dot_product_attention(qg, k[l], v[l])))
    rows = []
    for name, fn in variants:
        try:
            s, how = timed(fn)
        except Exception as e:  # one variant failing must not lose the others
            rows.append({"name": name, "error": f"{type(e).__name__}: {e}",
                         "line": f"kernel {name}: failed: {type(e).__name__}: {e}"})
            continue
        gbs = kv_bytes / s / 1e9
        rows.append({"name": name, "context": context, "layers": L, "seconds_per_step": s, "kv_gbs": gbs,
                     "fraction_of_peak": gbs / peak, "max_abs_error_vs_reference": float(err), "timing": how,
                     "line": f"kernel {name}: batch 1, {context} tokens x {L} layers, {dtype}: "
                             f"{s * 1e3:.3f} ms/step, KV read at {gbs:,.0f} GB/s = {100 * gbs / peak:.0f}% of "
                             f"{peak:,.0f} GB/s peak ({how})"})
    rows.append({"name": "check", "line": f"kernel check: max |flash_decode - reference| = {float(err):.2e} ({dtype})"})
    del k, v
    torch.cuda.empty_cache()
    return rows
