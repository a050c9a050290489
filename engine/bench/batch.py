"""`membound bench --sweep batch` and `--workload mixed`: the scheduler and the batched forward
(engine/serving/batch_forward.py) under load. The sweep runs B identical requests together for B = 1, 2,
4, ...: aggregate vs per-request decode tok/s, arithmetic intensity, MBU, MFU, and where the
step turns compute-bound (cost model). The mixed workload has simulated users (engine/serving/users.py)
send varied requests; static and continuous batching serve the same requests."""
from __future__ import annotations

import statistics
import sys
import time
from dataclasses import asdict, dataclass
from pathlib import Path

from engine.bench.tables import rows_of, side_by_side
from engine.hardware.roof import Roof
from engine.serving.users import SimulatedUsers, Workload, bundled_prompts

# no torch at import: engine/cli.py imports this module to build its parser (the app's process too)

DEFAULT_BATCH_SIZES = (1, 2, 4, 8, 16, 32, 64)
BATCHED_GRAPHS = "not used: batched steps run eager"
BLOCK_SIZE = 16
# --workload mixed sends this many requests per user unless --requests says otherwise. The run ends
# on a drain: once the last request is sent, the batch empties as replies end, the longest last
# (about one longest reply's worth of steps at falling occupancy). A continuous run pays it once,
# where a static one pays it in every batch; at 4 requests a user it was a quarter of a continuous
# run (docs/benchmarks.md, "Batching"), measuring the run's end more than the policy.
REQUESTS_PER_USER = 16
# a CPU's warm-up of a batch size stops after this many decode steps of the whole batch
CPU_WARMUP_FULL_BATCH_STEPS = 3


def add_batch_args(bench) -> None:
    """The batching options of `membound bench` (engine/cli.py calls this)."""
    bench.add_argument("--batch-sizes", metavar="N,N,...", help="batch sizes for --sweep batch (default 1,2,4,...,64)")
    bench.add_argument("--workload", choices=["mixed"], help="mixed: simulated users send the bundled chat prompts; "
                       "replies end at EOS or a cap drawn from --decode-tokens/4 .. 2x (with --policy; both "
                       "policies when it is not given)")
    bench.add_argument("--policy", choices=["continuous", "static"], help="batching policy for --workload mixed")
    bench.add_argument("--users", type=int, default=8, help="simulated users for --workload mixed (default 8)")
    bench.add_argument("--requests", type=int, help=f"requests the users send in all (default {REQUESTS_PER_USER} per "
                       "user: a run of few requests per user measures mostly its own end, where the last replies "
                       "decode with the batch emptying)")


@dataclass
class BatchPoint:
    batch_size: int
    decode_steps: int
    aggregate_tokens_per_s: float  # every sequence's decode tokens / decode time
    per_request_tokens_per_s: float  # what one user sees
    decode_step_ms: float
    arithmetic_intensity: float  # FLOPs per byte (cost model)
    achieved_gbs: float
    mbu: float
    mfu: float
    bound: str  # "memory" | "compute" (cost model against the device's ridge point)
    ridge_flop_per_byte: float = float("nan")  # that ridge: its steps' compute roof (their products') / bandwidth roof
    peak_kind: str = ""  # what the compute roof is of ("fp32", "int8/int16 dots + fp32": engine/metrics.py StepMetrics)
    roofline_tokens_per_s: float = float("nan")  # the lower roof (bytes at peak GB/s, FLOPs at peak FLOP/s)
    of_roofline: float = float("nan")  # aggregate / roofline
    read_beside_gbs: tuple[float, float] | None = None  # CPU: a read of a step's bytes before and after the run
    of_roofline_beside: float | None = None  # aggregate / the roofline with that read as the bandwidth roof


def _runner(model, hardware, dtype: str, num_blocks: int, **kw):
    from engine.serving.batch_forward import BatchRunner
    return BatchRunner(model, num_blocks, BLOCK_SIZE, roof=Roof.of(hardware), **kw)


def run_batch_point(model, hardware, dtype: str, batch_size: int, prompt_ids: list[int], decode_tokens: int,
                    attention: str = "flash", full_batch_steps: int | None = None, beside=None,
                    beside_bytes: int = 0) -> BatchPoint:
    """B copies of one request, started together; the decode steps that run all B are measured.
    The prompts are prefilled `token_budget` tokens a step, so the first requests decode while the
    last ones' prompts go in: all B decode together only once every prompt is in. `full_batch_steps`
    (a warm-up) stops the run after that many steps of the whole batch: the same prefill chunks and
    decode shape as the full run, without its length. With `beside` (engine/bench/beside.py), a read
    of `beside_bytes` (a step's, from the warm-up) just before and after the run, and the share of the
    roofline that read allows."""
    per_seq = -(-(len(prompt_ids) + decode_tokens) // BLOCK_SIZE)
    token_budget = max(512, batch_size)
    runner = _runner(model, hardware, dtype, batch_size * per_seq, max_batch_size=batch_size,
                     token_budget=token_budget, attention=attention)
    for i in range(batch_size):
        runner.scheduler.add_request(_request(i, prompt_ids, decode_tokens))
    before = beside.read_gbs(beside_bytes) if beside is not None else None
    steps, prefill_steps = [], 0
    while runner.scheduler.has_unfinished and (full_batch_steps is None or len(steps) < full_batch_steps):
        _, _, m = runner.step()
        if m is not None and m.phase == "decode" and m.batch_size == batch_size:
            steps.append(m)
        elif m is not None and m.phase != "decode":
            prefill_steps += 1
    if not steps:
        raise ValueError(f"no decode step ran the whole batch of {batch_size}: its prompts took {prefill_steps} "
                         f"steps to go in ({token_budget} tokens a step), and the first replies ended before "
                         f"the last prompt was in: use --decode-tokens > {prefill_steps}")
    step_s = sum(m.step_s for m in steps)
    moved = sum(m.total_bytes for m in steps)
    flops = sum(m.flops for m in steps)
    tokens = sum(m.tokens_out for m in steps)
    aggregate = tokens / step_s
    # each step's least time under the roofline: its bytes at the peak bandwidth or its FLOPs at the peak
    roof_s = sum(m.tokens_out / m.predicted_ceiling_tokens_per_s for m in steps)
    ridge = steps[0].peak_flops / steps[0].peak_bandwidth_bps
    from engine.bench.beside import mean_read
    after = beside.read_gbs(beside_bytes) if before is not None else None
    reads = beside_share = None
    if (mean := mean_read(before, after)) is not None:
        reads = (round(before, 2), round(after, 2))
        bps = 1e9 * mean  # each step's least time with that read as its bandwidth roof
        beside_share = sum(max(m.total_bytes / bps, m.flops / m.peak_flops) for m in steps) / step_s
    return BatchPoint(batch_size=batch_size, decode_steps=len(steps), aggregate_tokens_per_s=aggregate,
                      per_request_tokens_per_s=aggregate / batch_size, decode_step_ms=1e3 * step_s / len(steps),
                      arithmetic_intensity=flops / moved, achieved_gbs=moved / step_s / 1e9,
                      mbu=moved / step_s / steps[0].peak_bandwidth_bps, mfu=flops / step_s / steps[0].peak_flops,
                      bound="compute" if flops / moved >= ridge else "memory", ridge_flop_per_byte=ridge,
                      peak_kind=steps[0].peak_kind,
                      roofline_tokens_per_s=tokens / roof_s, of_roofline=roof_s / step_s,
                      read_beside_gbs=reads, of_roofline_beside=beside_share)


def step_bytes_of(point: BatchPoint) -> int:
    """The bytes one decode step of a point moves (the cost model's, its mean)."""
    return round(point.achieved_gbs * 1e9 * point.decode_step_ms / 1e3)


PROFILE_STEPS = 4  # full-batch decode steps under torch.profiler, per batch size
PROFILE_TOP = 6


def profile_batch_step(model, hardware, dtype: str, batch_size: int, prompt_ids: list[int],
                       attention: str = "flash", steps: int = PROFILE_STEPS) -> dict:
    """Where a decode step of the whole batch spends its time: B copies of the request are prefilled
    (every prompt in), then `steps` steps of all B run under torch.profiler. Each operator's own CPU
    time per step, the biggest first, beside the step's wall time and its bytes at the peak."""
    import torch

    token_budget = max(512, batch_size)
    # the first requests decode while the last prompts go in: enough tokens that none ends before the profile does
    decode_tokens = steps + 2 + -(-batch_size * len(prompt_ids) // token_budget)
    per_seq = -(-(len(prompt_ids) + decode_tokens) // BLOCK_SIZE)
    runner = _runner(model, hardware, dtype, batch_size * per_seq, max_batch_size=batch_size,
                     token_budget=token_budget, attention=attention)
    for i in range(batch_size):
        runner.scheduler.add_request(_request(i, prompt_ids, decode_tokens))
    while True:  # until every prompt is in and a step of the whole batch has run (warm)
        _, _, m = runner.step()
        if m.phase == "decode" and m.batch_size == batch_size:
            break
    metrics = []
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as prof:
        for _ in range(steps):
            metrics.append(runner.step()[2])
    if any(m.phase != "decode" or m.batch_size != batch_size for m in metrics):
        raise RuntimeError("a profiled step did not run the whole batch")
    ops = sorted(prof.key_averages(), key=lambda e: e.self_cpu_time_total, reverse=True)
    step_ms = 1e3 * sum(m.step_s for m in metrics) / steps
    return {"batch_size": batch_size, "step_ms": step_ms, "steps": steps,
            "bytes_at_peak_ms": 1e3 * sum(m.floor_s for m in metrics) / steps,
            "roofline_ms": 1e3 * sum(m.tokens_out / m.predicted_ceiling_tokens_per_s for m in metrics) / steps,
            "operators_per_step": sum(e.count for e in ops) // steps,
            "operators_ms": sum(e.self_cpu_time_total for e in ops) / 1e3 / steps,
            "top": [{"operator": e.key, "ms": e.self_cpu_time_total / 1e3 / steps, "calls": e.count // steps}
                    for e in ops[:PROFILE_TOP]]}


def format_batch_profile(found: list[dict]) -> str:
    lines = ["profile: decode steps of the whole batch under torch.profiler: each step's wall time beside what "
             "the roofline allows, its operators' own time (on the calling thread; the rest is Python between "
             "them) and the biggest operators"]
    for f in found:
        lines.append(f"  batch {f['batch_size']}: {f['step_ms']:,.1f} ms a step (roofline {f['roofline_ms']:,.1f} ms, "
                     f"bytes at peak {f['bytes_at_peak_ms']:,.1f} ms), {f['operators_per_step']} operators "
                     f"{f['operators_ms']:,.1f} ms: "
                     + ", ".join(f"{t['operator']} {t['ms']:,.1f} ms x{t['calls']}" for t in f["top"]))
    return "\n".join(lines)


def _request(i: int, prompt_ids: list[int], decode_tokens: int):
    from engine.serving.scheduler import Request
    return Request(i, list(prompt_ids), decode_tokens)  # no EOS: every request decodes in full


@dataclass
class MixedResult:
    policy: str
    users: int
    requests: int
    output_tokens: int
    wall_s: float
    aggregate_tokens_per_s: float
    median_ttft_s: float
    p90_ttft_s: float
    median_itl_s: float  # inter-token latency, all requests' gaps pooled
    mean_batch: float
    preemptions: int
    drain_s: float  # from the last request's arrival to the end of the run
    prompt_tokens: int = 0  # the requests' prompts together
    reused_tokens: int = 0  # of them, taken from earlier requests' prompts (engine/serving/prefix_store.py)


def run_mixed(model, hardware, dtype: str, policy: str, n_users: int, n_requests: int, workload: Workload,
              attention: str = "flash", seed: int = 0, num_blocks: int | None = None,
              token_budget: int | None = None, chunk_size: int | None = 128,
              prefix_bytes: int | None = None) -> MixedResult:
    """Closed loop: each user sends its next request when the last one ends (after think time).
    `prefix_bytes` None: the app's room for prompts kept across requests (server.py prefix_store_bytes;
    none under MEMBOUND_PREFIX_CACHE=0); 0: none.
    `token_budget` None: what the app's serving plans (engine/serving/server.py): on a CPU within the
    C++ step's rows where it runs (cpu_token_budget), else 256; prompt chunks no longer than that."""
    if token_budget is None:
        from engine.serving.server import CPU_TOKEN_BUDGET, cpu_token_budget
        token_budget = cpu_token_budget(model) if model.device.type == "cpu" else CPU_TOKEN_BUDGET
        chunk_size = None if chunk_size is None else min(chunk_size, token_budget)
    longest = (max(map(len, workload.prompts)) if workload.prompt_lens is None else workload.prompt_lens[1]) \
        + workload.output_lens[1]
    num_blocks = num_blocks or n_users * -(-longest // BLOCK_SIZE)
    if prefix_bytes is None:
        from engine.options import EngineOptions
        from engine.serving.server import kv_budget_bytes, prefix_store_bytes
        prefix_bytes = prefix_store_bytes(kv_budget_bytes(str(model.device), getattr(hardware, "memory_total_bytes", None))) \
            if EngineOptions.from_environ().prefix_cache else 0
    runner = _runner(model, hardware, dtype, num_blocks, max_batch_size=n_users, token_budget=token_budget,
                     policy=policy, chunk_size=chunk_size, attention=attention, prefix_bytes=prefix_bytes)
    users = SimulatedUsers(n_users, workload, seed=seed, max_requests=n_requests, start_s=time.perf_counter())
    done, batches = [], []
    t0 = time.perf_counter()
    while not users.done:
        for req in users.due(time.perf_counter()):
            runner.scheduler.add_request(req)
        plan, _, m = runner.step()
        if m is not None:
            batches.append(m.batch_size)
        for req in runner.scheduler.take_finished():
            users.finished(req, time.perf_counter())
            done.append(req)
        if m is None:
            time.sleep(0.001)  # everyone is thinking
    wall_s = time.perf_counter() - t0
    ttfts = sorted(r.ttft_s for r in done)
    gaps = [b - a for r in done for a, b in zip(r.token_times_s, r.token_times_s[1:])]
    out_tokens = sum(len(r.output_ids) for r in done)
    return MixedResult(policy=policy, users=n_users, requests=len(done), output_tokens=out_tokens, wall_s=wall_s,
                       aggregate_tokens_per_s=out_tokens / wall_s, median_ttft_s=statistics.median(ttfts),
                       p90_ttft_s=ttfts[min(len(ttfts) - 1, int(0.9 * len(ttfts)))],
                       median_itl_s=statistics.median(gaps) if gaps else float("nan"),
                       mean_batch=statistics.fmean(batches), preemptions=runner.scheduler.num_preemptions,
                       drain_s=t0 + wall_s - max(r.arrival_s for r in done),
                       prompt_tokens=sum(len(r.prompt_ids) for r in done),
                       reused_tokens=sum(r.num_reused_tokens for r in done))


def format_batch_table(points: list[BatchPoint], ridge: float, single_stream: dict | None = None,
                       peer: dict | None = None) -> str:
    """single_stream: the plain batch-1 path's figure (CUDA graphs where they run), for a second
    ratio: the batched path runs eager, so its own batch 1 is launch-bound on a GPU. peer: llama.cpp's
    figures by batch size (llama-batched-bench), as rows beside ours."""
    base = points[0]
    rows = [
        ("aggregate tok/s", lambda p: f"{p.aggregate_tokens_per_s:,.1f}"),
        (f"vs batch {base.batch_size}", lambda p: f"{p.aggregate_tokens_per_s / base.aggregate_tokens_per_s:.2f}x"),
    ]
    if single_stream:
        rows.append(("vs 1 stream",  # the plain path's batch 1 (its path: the "1 stream" line below)
                     lambda p: f"{p.aggregate_tokens_per_s / single_stream['decode_tokens_per_s']:.2f}x"))
    rows += [
        ("per-request tok/s", lambda p: f"{p.per_request_tokens_per_s:,.1f}"),
        ("decode step", lambda p: f"{p.decode_step_ms:,.1f} ms"),
        ("FLOP/byte (model)", lambda p: f"{p.arithmetic_intensity:,.1f}"),
        ("achieved GB/s", lambda p: f"{p.achieved_gbs:,.1f}"),
        ("MBU", lambda p: f"{100 * p.mbu:.1f}%"),
        ("MFU", lambda p: f"{100 * p.mfu:.2f}%"),
        ("bound (model)", lambda p: p.bound),
        ("roofline tok/s", lambda p: f"{p.roofline_tokens_per_s:,.1f}"),
        ("of the roofline", lambda p: f"{100 * p.of_roofline:.0f}%"),
    ]
    if any(p.read_beside_gbs for p in points):  # CPU: the read of a step's bytes around each run
        rows += [
            ("read before / after GB/s", lambda p: f"{p.read_beside_gbs[0]:,.0f}/{p.read_beside_gbs[1]:,.0f}"
             if p.read_beside_gbs else ""),
            ("of the roofline beside", lambda p: f"{100 * p.of_roofline_beside:.0f}%"
             if p.of_roofline_beside is not None else ""),
        ]
    if peer:
        rows += [
            # named by the tool that measured them (llama-batched-bench's S_TG), bytes by our cost model
            ("llama-batched-bench tok/s", lambda p: f"{peer[p.batch_size].aggregate_tokens_per_s:,.1f}"),
            ("llama-batched-bench MBU", lambda p: f"{100 * peer[p.batch_size].mbu:.1f}%"),
            ("  of its roofline", lambda p: f"{100 * peer[p.batch_size].of_roofline:.0f}%"),
            ("membound/llama-batched", lambda p: f"{p.aggregate_tokens_per_s / peer[p.batch_size].aggregate_tokens_per_s:.2f}x"),
        ]
    lines = side_by_side("batch", [str(p.batch_size) for p in points], rows_of(points, rows), 26, 11)
    turn = next((p.batch_size for p in points if p.bound == "compute"), None)
    kind = f" ({points[-1].peak_kind})" if points[-1].peak_kind else ""
    lines.append(f"ridge point {ridge:,.1f} FLOP/byte{kind}: " + (f"compute-bound from batch {turn} (cost model)"
                 if turn else f"memory-bound up to batch {points[-1].batch_size} (cost model)"))
    return "\n".join(lines)


def format_mixed_table(results: list[MixedResult]) -> str:
    rows = [
        ("aggregate tok/s", lambda r: f"{r.aggregate_tokens_per_s:,.1f}"),
        ("median TTFT", lambda r: f"{r.median_ttft_s * 1e3:,.0f} ms"),
        ("p90 TTFT", lambda r: f"{r.p90_ttft_s * 1e3:,.0f} ms"),
        ("median inter-token", lambda r: f"{r.median_itl_s * 1e3:,.1f} ms"),
        ("mean batch", lambda r: f"{r.mean_batch:.1f}"),
        ("pre-emptions", lambda r: f"{r.preemptions}"),
        ("wall time", lambda r: f"{r.wall_s:,.1f} s"),
        ("last arrival → end", lambda r: f"{r.drain_s:,.1f} s"),
        ("requests / tokens", lambda r: f"{r.requests} / {r.output_tokens}"),
        ("prompt tokens reused", lambda r: f"{r.reused_tokens} / {r.prompt_tokens}"),
    ]
    lines = side_by_side("", [r.policy for r in results], rows_of(results, rows), 20, 14)
    if len(results) == 2 and results[1].aggregate_tokens_per_s:
        a, b = results
        lines.append(f"{a.policy} / {b.policy}: {a.aggregate_tokens_per_s / b.aggregate_tokens_per_s:.2f}x aggregate tok/s")
    return "\n".join(lines)


def mixed_workload(tokenizer, decode_tokens: int) -> Workload:
    """What the app's simulated users send: the bundled prompts (assets/user_prompts.txt), each a
    one-message chat in the model's template, at their own lengths; a reply ends at the model's
    end-of-sequence token or at its token cap, drawn from decode_tokens / 4 .. 2 x decode_tokens.
    The spread of reply lengths is what a static batch pays for (it runs until its longest member
    ends). Before issue 6's measurements the bench cut one fixed text to 1/4 .. 2x --prompt-tokens
    and ignored EOS: replies uniform in 32..256 tokens and 4x the prompt tokens to prefill, work
    both policies do alike (docs/benchmarks.md has both workloads' figures)."""
    prompts = tuple(tuple(tokenizer.encode_chat([{"role": "user", "content": text}], add_generation_prompt=True))
                    for text in bundled_prompts())
    return Workload(prompts=tuple(p for p in prompts if p), prompt_lens=None,
                    output_lens=(max(2, decode_tokens // 4), 2 * decode_tokens),
                    eos_ids=frozenset(getattr(tokenizer, "eos_ids", ())))


def run_batch_bench(args, progress) -> int:
    from engine.bench.prompts import bench_prompt_ids
    from engine.bench.record import JsonReport, PathWatch, device_clocks
    from engine.engine import Engine
    from engine.hardware.spec import describe
    from engine.protocol import default_dtype
    from engine.settings import SamplingParams, Settings, weights_label

    dtype = args.dtype or default_dtype(args.device)
    if args.prompt_tokens < 1 or args.decode_tokens < 2:
        raise ValueError("bench needs --prompt-tokens >= 1 and --decode-tokens >= 2")
    sizes = _batch_sizes(args.batch_sizes)  # a bad option fails before the model loads
    if args.workload == "mixed" and args.requests is None:
        args.requests = REQUESTS_PER_USER * args.users
    if args.workload == "mixed" and (args.users < 1 or args.requests < 1):
        raise ValueError("--users and --requests must be >= 1")
    need = 2 * (args.prompt_tokens + args.decode_tokens)
    if args.workload == "mixed":  # the bundled chat prompts: under 256 tokens even byte by byte
        need = max(need, 256 + 2 * args.decode_tokens)
    settings = Settings(dtype=dtype, attention=args.attention, sampling=SamplingParams(greedy=True, temperature=0.0),
                        weights=getattr(args, "weights", "fp"), group_size=getattr(args, "group_size", 32))
    gguf = None
    if getattr(args, "compare", None) == "llamacpp":
        from engine.bench.llamacpp import peer_model
        gguf = peer_model(args.model, args.sweep, args.workload, args.device)
    elif getattr(args, "compare", None):
        raise ValueError(f"--compare {args.compare} runs batch 1 on floating-point weights, not --sweep batch")
    t0 = time.perf_counter()
    engine = Engine(args.model, device=args.device, dtype=dtype, max_context=max(args.max_context, need),
                    progress=progress, settings=settings)
    model, hw = engine.model_for(settings), engine.hardware  # int8/int4: the quantised copy
    seconds = {"load": time.perf_counter() - t0}
    print(f"model: {engine.loaded.label}", file=sys.stderr)
    print(f"device: {describe(hw)}", file=sys.stderr)
    weights = "" if settings.weights == "fp" else f" · {weights_label(settings.weights, settings.group_size)}"
    report = JsonReport(args.json, model=engine.loaded.label, device=hw.to_dict(), dtype=dtype,
                        weights=settings.weights, group_size=settings.group_size, seconds=seconds)
    if args.workload == "mixed":
        workload = mixed_workload(engine.tokenizer, args.decode_tokens)
        policies = [args.policy] if args.policy else ["continuous", "static"]
        t0 = time.perf_counter()
        run_mixed(model, hw, dtype, policies[0], args.users, args.users, workload, args.attention)  # warm-up
        seconds["warmup"] = time.perf_counter() - t0
        clocks_before, watch = device_clocks(hw), PathWatch()
        results = []
        for i, policy in enumerate(policies):
            progress(i / len(policies), f"serving {args.requests} requests from {args.users} users ({policy})")
            results.append(run_mixed(model, hw, dtype, policy, args.users, args.requests, workload, args.attention))
            report.update(results=[asdict(r) for r in results])
        paths = watch.report(model=model, cuda_graphs=BATCHED_GRAPHS)
        clocks = {"before_timed": clocks_before, "after_timed": device_clocks(hw)}
        progress(1.0, "done")
        lens = sorted(map(len, workload.prompts))
        print(f"\nworkload: {args.users} simulated users, {args.requests} requests: the {len(lens)} bundled chat "
              f"prompts ({lens[0]}..{lens[-1]} tokens), replies to EOS or a cap of {workload.output_lens[0]}.."
              f"{workload.output_lens[1]} tokens, greedy, no think time, {dtype}{weights}, paged KV")
        print(format_mixed_table(results))
        report.finish(results=[asdict(r) for r in results], paths=paths, clocks=clocks, seconds=seconds)
        return 0
    from engine.bench.single import path_line, timed_run, warm_up

    prompt_ids = bench_prompt_ids(engine.tokenizer, args.prompt_tokens)
    # a GPU warms up on the whole run (flash-decoding compiles a variant as the context grows);
    # a CPU, where nothing compiles, on the prefill chunks and a few steps of the whole batch
    warm_up_steps = None if args.device == "cuda" else CPU_WARMUP_FULL_BATCH_STEPS
    t0 = time.perf_counter()
    warm = {}
    for i, b in enumerate(sizes):  # every batch size once, untimed: its prefill chunks, M buckets and kernels
        progress(i / len(sizes), f"warming up batch {b}")
        warm[b] = run_batch_point(model, hw, dtype, b, prompt_ids, args.decode_tokens, args.attention,
                                  full_batch_steps=warm_up_steps)
    seconds["warmup"] = time.perf_counter() - t0
    report.update(seconds=seconds)
    from engine.bench.beside import ReadBeside
    beside = ReadBeside.for_engine(engine)
    clocks_before, watch = device_clocks(hw), PathWatch()
    # --repeats: every batch size in turn, round after round (a slow spell of a shared host falls on each
    # alike), the best run of each kept, as the other sweeps keep theirs
    repeats = max(1, getattr(args, "repeats", 1))
    best: dict[int, BatchPoint] = {}
    for r in range(repeats):
        for i, b in enumerate(sizes):
            progress((r * len(sizes) + i) / (repeats * len(sizes)),
                     f"batch {b}: {b} x ({args.prompt_tokens} prompt + {args.decode_tokens} decode)"
                     + (f" (run {r + 1}/{repeats})" if repeats > 1 else ""))
            point = run_batch_point(model, hw, dtype, b, prompt_ids, args.decode_tokens, args.attention,
                                    beside=beside, beside_bytes=step_bytes_of(warm[b]))
            if b not in best or point.aggregate_tokens_per_s > best[b].aggregate_tokens_per_s:
                best[b] = point
            report.update(results=[asdict(p) for p in best.values()], repeats_done=r + (i + 1) // len(sizes))
    points = [best[b] for b in sizes]
    paths = {"batched": watch.report(model=model, cuda_graphs=BATCHED_GRAPHS)}
    # the plain batch-1 path (CUDA graphs on a GPU) in the same run: the single-stream figure
    # the bench reports, so "batch 64 vs batch 1" is also given against the fast batch 1
    progress(0.95, "batch 1 on the plain path")
    t0 = time.perf_counter()
    warm_up(engine, prompt_ids, args.decode_tokens)
    seconds["single_stream_warmup"] = time.perf_counter() - t0
    single, _, paths["single_stream"] = timed_run(engine, prompt_ids, args.decode_tokens)
    graphs = paths["single_stream"]["cuda_graphs"]
    single_stream = {"decode_tokens_per_s": single.decode_tokens_per_s,
                     "path": "CUDA graph" if graphs == "used" else f"eager: {graphs}"}
    clocks = {"before_timed": clocks_before, "after_timed": device_clocks(hw)}
    profiles = []
    if getattr(args, "profile", False):
        for b in sizes:
            progress(0.96, f"profiling a decode step of batch {b}")
            profiles.append(profile_batch_step(model, hw, dtype, b, prompt_ids, args.attention))
    peer = None
    if gguf is not None:
        progress(0.97, "llama.cpp: llama-batched-bench and llama-bench on the same GGUF")
        t0 = time.perf_counter()
        peer = run_llamacpp_batch(engine, gguf, sizes, args.prompt_tokens, args.decode_tokens)
        seconds["llamacpp"] = time.perf_counter() - t0
    progress(1.0, "done")
    ridge = points[-1].ridge_flop_per_byte  # the steps' own compute roof (an integer step's: its dot products')
    print(f"\nworkload: B requests together, prompt {args.prompt_tokens} tokens, decode {args.decode_tokens} "
          f"tokens each, greedy, {dtype}{weights}, paged KV, {args.attention} attention"
          + (f"; the best of {repeats} runs each, the batch sizes in turn" if repeats > 1 else ""))
    print(format_batch_table(points, ridge, single_stream, peer["batched"] if peer else None))
    if above := above_roof_line(points):
        print(above)
    print(f"batched steps: {path_line(paths['batched'])}")
    print(f"1 stream: {single.decode_tokens_per_s:,.1f} tok/s, {path_line(paths['single_stream'])}")
    if peer:
        print(format_llamacpp_lines(peer, points, single.decode_tokens_per_s))
    if profiles:
        print(format_batch_profile(profiles))
    report.finish(results=[asdict(p) for p in points], ridge_flop_per_byte=ridge, paths=paths, clocks=clocks,
                  seconds=seconds, single_stream={**single_stream, "result": asdict(single)}, profile=profiles,
                  vs_single_stream={p.batch_size: p.aggregate_tokens_per_s / single.decode_tokens_per_s
                                    for p in points},
                  **({"llamacpp": {**peer, "batched": {n: asdict(q) for n, q in peer["batched"].items()},
                                   "llama_bench": asdict(peer["llama_bench"])}} if peer else {}))
    return 0


def above_roof_line(points: list[BatchPoint]) -> str:
    """The batches whose MBU or MFU beat the measured roof, said as the single bench says it (shown,
    never absorbed into the peak: engine/hardware/roof.py); "" when none does."""
    from engine.hardware.roof import ABOVE_ROOF, above_roof
    over = [str(p.batch_size) for p in points if above_roof(p.mbu, p.mfu)]
    return f"batch {', '.join(over)}: {ABOVE_ROOF}" if over else ""


def run_llamacpp_batch(engine, gguf, sizes: list[int], prompt_tokens: int, decode_tokens: int) -> dict:
    """llama.cpp on the sweep's workload, same GGUF and threads, with its own benchmarks:
    llama-batched-bench at each batch size (N parallel sequences of `prompt_tokens` + `decode_tokens`)
    and llama-bench for one sequence (generation after `prompt_tokens` of context)."""
    import torch

    from engine.bench.llamacpp import (batched_bench_traffic, find_tool, gguf_matmul_bytes,
                                       run_batched_bench, run_llama_bench)
    from engine.hardware.roof import Roof

    threads = torch.get_num_threads()
    batched, batched_command = run_batched_bench(find_tool("llama-batched-bench"), gguf, threads, prompt_tokens,
                                                 decode_tokens, sizes)
    batched_bench_traffic(batched, engine.cfg, prompt_tokens, decode_tokens, gguf_matmul_bytes(gguf),
                          Roof.of(engine.hardware))
    single = run_llama_bench(find_tool("llama-bench"), gguf, threads, prompt_tokens, decode_tokens)
    return {"model": str(gguf), "threads": threads, "batched": batched, "batched_command": batched_command,
            "llama_bench": single}


def format_llamacpp_lines(peer: dict, points: list[BatchPoint], single_tokens_per_s: float) -> str:
    """Which tool each llama.cpp figure came from, and ours against it at batch 1 and at the largest batch."""
    bench, batched = peer["llama_bench"], peer["batched"]
    largest = points[-1]
    theirs = batched[largest.batch_size]
    tool = Path(peer["batched_command"].split()[0]).name
    return "\n".join([
        f"llama.cpp ({Path(peer['model']).name}, {peer['threads']} threads, fp16 KV cache): the llama-batched-bench "
        f"rows are its S_TG (`{tool} -npp {bench.prompt_tokens} -ntg {bench.decode_tokens} -npl "
        f"{','.join(map(str, batched))}`: random tokens, no sampling), their MBU and roofline our cost model's "
        "for what it reads (the GGUF's tensors as stored, an f16 KV cache)",
        f"llama.cpp 1 sequence, llama-bench tg{bench.decode_tokens} at depth {bench.depth}: "
        f"{bench.decode_tokens_per_s:,.1f} tok/s (pp{bench.prompt_tokens}: {bench.prefill_tokens_per_s:,.1f} tok/s); "
        f"membound's 1 stream / llama-bench: {single_tokens_per_s / bench.decode_tokens_per_s:.2f}x",
        f"batch {largest.batch_size}: membound {largest.aggregate_tokens_per_s:,.1f} / llama-batched-bench "
        f"{theirs.aggregate_tokens_per_s:,.1f} tok/s aggregate = "
        f"{largest.aggregate_tokens_per_s / theirs.aggregate_tokens_per_s:.2f}x",
    ])


def _batch_sizes(text: str | None) -> list[int]:
    if not text:
        return list(DEFAULT_BATCH_SIZES)
    try:
        sizes = [int(x) for x in text.split(",") if x.strip()]
    except ValueError:
        raise ValueError(f"--batch-sizes takes numbers like 1,2,4: got {text!r}") from None
    if not sizes or min(sizes) < 1:
        raise ValueError(f"--batch-sizes must be >= 1: got {text!r}")
    return sizes
