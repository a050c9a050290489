"""GPU smoke checks that cannot lie: the CUDA-graph decode step against the eager one on logits with
the same tokens fed (teacher-forced, a tolerance per dtype), proof that the graph path ran (replays
counted, no skipped graph, cudaGraphLaunch seen), the cache written in place, the engine's figures
sane, and the batched path against each request alone. Each check runs in its own try; the exit
code is 1 if any failed. On a CPU the CUDA-only checks are reported as skipped, with the reason.
    python scripts/gpu_smoke.py [--device cuda|cpu] [--tiny]    (scripts/gpu_check.sh runs it)"""
from __future__ import annotations

import argparse
import math
import sys
import time
import traceback
from dataclasses import replace
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the engine from this source tree

import torch  # noqa: E402

from engine import dispatch  # noqa: E402
from engine.engine import Engine  # noqa: E402
from engine.graphs import CAPTURE_CALLS, GraphDecoder  # noqa: E402
from engine.io.byte_tokenizer import ByteTokenizer  # noqa: E402
from engine.io.loader import LoadedWeights, synthetic_weights  # noqa: E402
from engine.kv.cache import ContiguousKVCache  # noqa: E402
from engine.metrics import StepMetrics  # noqa: E402
from engine.model.config import ModelConfig  # noqa: E402
from engine.model.transformer import Transformer  # noqa: E402
from engine.serving.batch_forward import BatchRunner  # noqa: E402
from engine.serving.scheduler import Request  # noqa: E402
from engine.settings import SamplingParams, Settings  # noqa: E402

# relative L2 error of the logits, graph vs eager, with the same tokens fed. bf16: the graph runs
# SDPA and Inductor's fused kernels where eager runs the Triton kernel and unfused ops, so they
# round differently; a wrong position or a stale cache is off by far more (and the caches are
# compared too). fp32 runs with TF32 off.
LOGITS_TOLERANCE = {torch.float32: 1e-4, torch.float16: 1e-2, torch.bfloat16: 3e-2}
IN_PLACE_MAX_RATIO = 1.25  # graph step time, 32x the cache capacity over 1x: a per-step copy shows


class Skipped(Exception):
    """A check that cannot run here; its message is the reason."""


def needs_cuda() -> None:
    if not torch.cuda.is_available():
        raise Skipped("needs CUDA (torch.cuda.is_available() is False)")


def rel_error(got: torch.Tensor, want: torch.Tensor) -> float:
    got, want = got.double(), want.double()
    return float((got - want).norm() / want.norm().clamp(min=1e-30))


def small_config(tiny: bool, layers: int = 4, **changes) -> ModelConfig:
    """llama3-8b's width with a few layers: it compiles in seconds, and its kernels are the bench's
    (the compile caches then serve the 8B steps that follow); or a toy shape for CPU runs."""
    if tiny:
        cfg = ModelConfig(name="smoke-tiny", dim=64, n_layers=2, n_heads=4, n_kv_heads=2, ffn_dim=128,
                          vocab_size=256, tied_embeddings=True, max_seq_len=256)
    else:
        cfg = replace(ModelConfig.from_name("llama3-8b"), name=f"llama3-8b x{layers} layers", n_layers=layers,
                      max_seq_len=2048)
    return replace(cfg, **changes)


class Smoke:
    def __init__(self, device: str, tiny: bool):
        self.device = device
        self.tiny = tiny
        self.dtype = torch.float32 if device == "cpu" else torch.bfloat16
        self.results: dict[str, dict] = {}
        self._graph_run = None  # check 2's caches, for check 3

    # ---- the checks --------------------------------------------------------------------------
    def static_step_matches_forward(self) -> str:
        """The function the graph captures (forward_decode_static), run eagerly, against forward:
        same logits and the same cache contents, token by token (any device)."""
        cfg = small_config(True) if self.device == "cpu" else small_config(self.tiny)
        model = Transformer(cfg, synthetic_weights(cfg, self.dtype, self.device, seed=1))
        gen = torch.Generator().manual_seed(1)
        ids = torch.randint(1, cfg.vocab_size, (40,), generator=gen).to(self.device)
        a = ContiguousKVCache(cfg, 1, cfg.max_seq_len, self.dtype, self.device)
        b = ContiguousKVCache(cfg, 1, cfg.max_seq_len, self.dtype, self.device)
        worst = 0.0
        with torch.inference_mode():
            model(ids[None, :20], 0, a)
            model(ids[None, :20], 0, b)
            for p in range(20, 40):
                tok = ids[None, p:p + 1]
                want = model(tok, start_pos=p, cache=a)[0, -1]
                got = model.forward_decode_static(tok, torch.tensor([p], device=self.device), b)[0, -1]
                worst = max(worst, rel_error(got, want))
        cache_err = rel_error(b.k[:, :, :, :40], a.k[:, :, :, :40]) + rel_error(b.v[:, :, :, :40], a.v[:, :, :, :40])
        tol = LOGITS_TOLERANCE[self.dtype]
        assert worst <= tol, f"logits differ: relative error {worst:.2e} > {tol:.0e}"
        assert cache_err <= tol, f"caches differ: relative error {cache_err:.2e}"
        return f"{cfg.name}, {str(self.dtype)[6:]}, 20 steps: logits rel. error {worst:.1e}, caches {cache_err:.1e}"

    def graph_matches_eager(self) -> str:
        """Graph vs eager decode, teacher-forced on the same random tokens; the graph path must
        really have run: every step a replay, no skip, cudaGraphLaunch in a profiled step."""
        needs_cuda()
        cfg = small_config(self.tiny)
        model = Transformer(cfg, synthetic_weights(cfg, self.dtype, self.device, seed=2))
        gen = torch.Generator().manual_seed(2)
        n_prompt, n_steps = 100, 40
        ids = torch.randint(1, cfg.vocab_size, (n_prompt + n_steps + 1,), generator=gen).to(self.device)
        eager = ContiguousKVCache(cfg, 1, cfg.max_seq_len, self.dtype, self.device)
        graph = ContiguousKVCache(cfg, 1, cfg.max_seq_len, self.dtype, self.device)
        address = graph.k.data_ptr(), graph.v.data_ptr()
        decoder = GraphDecoder(self.device)
        before = dispatch.counts()
        errors, agree = [], 0
        t0 = time.perf_counter()
        with torch.inference_mode():
            model(ids[None, :n_prompt], 0, eager)
            model(ids[None, :n_prompt], 0, graph)
            for p in range(n_prompt, n_prompt + n_steps):
                tok = ids[None, p:p + 1]
                want = model(tok, start_pos=p, cache=eager)[0, -1]
                got = decoder.decode(model, graph, tok, p, "flash")[0, -1]
                assert not decoder.unavailable, f"graphs fell back to eager: {decoder.unavailable}"
                errors.append(rel_error(got, want))
                agree += int(got.argmax() == want.argmax())
        ran = dispatch.since(before).get("decode step", {})
        assert decoder.replays == n_steps, f"{decoder.replays} of {n_steps} steps through the graph path ({ran})"
        launches = _graph_launches(lambda: decoder.decode(model, graph, ids[None, -1:], n_prompt + n_steps, "flash"))
        assert not decoder.unavailable, f"graphs fell back to eager: {decoder.unavailable}"
        assert launches != 0, "a replayed step launched no CUDA graph (the profiler saw no cudaGraphLaunch)"
        seen = f"{launches} cudaGraphLaunch in a profiled step" if launches > 0 else \
            "the profiler did not run, so no cudaGraphLaunch was looked for"
        worst, tol = max(errors), LOGITS_TOLERANCE[self.dtype]
        assert worst <= tol, f"graph logits differ from eager: relative error {worst:.2e} > {tol:.0e} " \
                             f"(per step: {', '.join(f'{e:.1e}' for e in errors[:8])} ...)"
        self._graph_run = (eager, graph, address, n_prompt + n_steps)  # the profiled step wrote one more
        return (f"{cfg.name}, {str(self.dtype)[6:]}, {n_steps} teacher-forced steps: logits rel. error max "
                f"{worst:.1e} (tolerance {tol:.0e}), same argmax {agree}/{n_steps}; {decoder.captures} capture(s) "
                f"in {decoder.capture_s:.1f} s, {seen}; whole check "
                f"{time.perf_counter() - t0:.1f} s")

    def graph_writes_cache_in_place(self) -> str:
        """The captured step writes K/V into the engine's own cache (contents match eager, same
        address) and copies nothing per step: its time does not grow with the cache's capacity."""
        needs_cuda()
        if self._graph_run is None:
            raise Skipped("graph_matches_eager did not finish")
        eager, graph, address, n = self._graph_run
        assert (graph.k.data_ptr(), graph.v.data_ptr()) == address, "the cache tensors moved"
        err = max(rel_error(graph.k[:, :, :, :n], eager.k[:, :, :, :n]),
                  rel_error(graph.v[:, :, :, :n], eager.v[:, :, :, :n]))
        assert err <= LOGITS_TOLERANCE[self.dtype], f"the graph's K/V are not in the engine's cache (error {err:.1e})"
        # time against capacity: two layers, a small vocabulary, so a copy of the cache would dominate
        cfg = small_config(self.tiny, layers=2, vocab_size=8192, max_seq_len=1 << 16)
        model = Transformer(cfg, synthetic_weights(cfg, self.dtype, self.device, seed=3))
        times = {}
        for capacity in (2048, 1 << 16):
            cache = ContiguousKVCache(cfg, 1, capacity, self.dtype, self.device)
            times[capacity] = _graph_step_seconds(model, cache, start=100)
        small, big = times[2048], times[1 << 16]
        copy_gb = 2 * cache.reserved_bytes / 1e9  # read + write of the whole cache, were it copied
        assert big / small <= IN_PLACE_MAX_RATIO, (
            f"the graph step takes {big / small:.2f}x as long with 32x the cache capacity "
            f"({small * 1e3:.3f} vs {big * 1e3:.3f} ms): it copies the cache (~{copy_gb:.2f} GB a step)")
        return (f"K/V written in place (address kept, contents match eager: {err:.1e}); step {small * 1e3:.3f} ms "
                f"with 2k positions, {big * 1e3:.3f} ms with 64k ({big / small:.2f}x; a copy would move "
                f"{copy_gb:.2f} GB a step)")

    def engine_uses_graphs(self) -> str:
        """The engine's own reply loop: every decode step a graph replay, figures finite, MBU < 1."""
        needs_cuda()
        cfg = small_config(self.tiny)
        loaded = LoadedWeights(cfg, synthetic_weights(cfg, self.dtype, self.device, seed=4),
                               ByteTokenizer(cfg.vocab_size), "synthetic", cfg.name, "bf16")
        greedy = SamplingParams(greedy=True, temperature=0.0)
        eng = Engine(loaded, device=self.device,
                     settings=Settings(dtype="bf16", max_new_tokens=40, sampling=greedy, cuda_graphs=True))
        events = list(eng.generate(list(range(1, 100)), ignore_eos=True))
        steps = [e for e in events if isinstance(e, StepMetrics) and e.phase == "decode"]
        assert not eng.graphs.unavailable, f"graphs unavailable: {eng.graphs.unavailable}"
        assert eng.graphs.replays == len(steps), f"{eng.graphs.replays} graph steps of {len(steps)} decode steps"
        bad = [s for s in steps if not (math.isfinite(s.achieved_gbs) and 0 < s.mbu < 1.05)]
        assert not bad, f"{len(bad)} steps with impossible figures, e.g. MBU {bad[0].mbu:.2f}"
        timed = sorted(s.step_s for s in steps[CAPTURE_CALLS:])
        median = timed[len(timed) // 2]
        mbu = sorted(s.mbu for s in steps[CAPTURE_CALLS:])[len(timed) // 2]
        return (f"{len(steps)} decode steps, all through the graph; median step {median * 1e3:.3f} ms, "
                f"MBU {mbu:.0%} of {eng.hardware.peak_bandwidth_gbs:,.0f} GB/s")

    def batched_matches_solo(self) -> str:
        """Five ragged requests through BatchRunner on a pool small enough to pre-empt, against each
        run alone through the model's contiguous cache (fp32, weights scaled up: sharp logits, so
        TF32 rounding cannot flip a greedy token)."""
        cfg = ModelConfig(name="tiny", dim=64, n_layers=2, n_heads=4, n_kv_heads=2, ffn_dim=128, vocab_size=256,
                          tied_embeddings=True, max_seq_len=200)
        w = synthetic_weights(cfg, torch.float32, self.device, seed=3)
        model = Transformer(cfg, {k: v * 20 if "norm" not in k else v for k, v in w.items()})
        gen = torch.Generator().manual_seed(0)
        lengths = [(5, 8), (17, 6), (1, 9), (11, 7), (3, 5)]  # (prompt, new tokens)
        requests = [Request(i, torch.randint(1, cfg.vocab_size, (p,), generator=gen).tolist(), n)
                    for i, (p, n) in enumerate(lengths)]
        runner = BatchRunner(model, num_blocks=12, block_size=4, max_batch_size=4, token_budget=10, chunk_size=6)
        pending, steps = list(requests), 0
        before = dispatch.counts()
        while pending or runner.scheduler.has_unfinished:
            if pending and steps % 2 == 0:
                runner.scheduler.add_request(pending.pop(0))
            runner.step()
            steps += 1
        kernels = dispatch.since(before).get("attention decode", {})
        assert runner.scheduler.num_preemptions > 0 and runner.cache.manager.pool.num_free == 12
        for req in requests:
            cache = ContiguousKVCache(cfg, 1, len(req.prompt_ids) + req.max_new_tokens, torch.float32, self.device)
            with torch.inference_mode():
                logits = model(torch.tensor([req.prompt_ids], device=self.device), 0, cache)[0, -1]
                alone = []
                for _ in range(req.max_new_tokens):
                    alone.append(int(logits.argmax()))
                    logits = model(torch.tensor([[alone[-1]]], device=self.device), cache.length, cache)[0, -1]
            assert req.output_ids == alone, f"request {req.request_id}: batched {req.output_ids} != alone {alone}"
        return (f"{len(requests)} requests, {steps} steps, {runner.scheduler.num_preemptions} pre-emptions; "
                f"decode attention ran {', '.join(kernels) or 'nothing'}")

    def speculation_matches_plain(self) -> str:
        """Greedy speculative replies (prompt lookup, the oracle, an int8 draft of the model itself) on
        the contiguous and paged caches give the plain reply token for token: verify steps of k + 1
        tokens run eager, plain steps through the CUDA graph where there is one (fp32, sharp logits)."""
        cfg = ModelConfig(name="tiny", dim=64, n_layers=2, n_heads=4, n_kv_heads=2, ffn_dim=128, vocab_size=256,
                          tied_embeddings=True, max_seq_len=256)
        w = synthetic_weights(cfg, torch.float32, self.device, seed=5)
        loaded = LoadedWeights(cfg, {k: v * 20 if "norm" not in k else v for k, v in w.items()},
                               ByteTokenizer(cfg.vocab_size), "synthetic", cfg.name, "fp32")
        greedy = SamplingParams(greedy=True, temperature=0.0)
        prompt = list(range(3, 60)) * 2 + [3, 4, 5]
        eng = Engine(loaded, device=self.device, settings=Settings(max_new_tokens=32, sampling=greedy))
        runs = []
        for layout in ("contiguous", "paged"):
            plain = replace(eng.settings, kv_layout=layout, speculate="off")
            eng.apply(plain)
            eng.reset()
            want = [e.token_id for e in eng.generate(prompt) if getattr(e, "token_id", -1) >= 0]
            for source in ("ngram", "oracle", "draft"):
                eng.apply(replace(plain, speculate=source, draft_tokens=4, draft_weights="int8"))
                eng.take_settings(wait=True)
                eng.reset()
                events = list(eng.generate(prompt))
                got = [e.token_id for e in events if getattr(e, "token_id", -1) >= 0]
                assert got == want, f"{source} on {layout}: {got} != {want}"
                verifies = [e for e in events if isinstance(e, StepMetrics) and e.phase == "verify"]
                runs.append(f"{source}/{layout} {sum(v.accepted_tokens for v in verifies)}/"
                            f"{sum(v.draft_tokens for v in verifies)}")
        return "identical; guesses kept: " + ", ".join(runs)

    CHECKS = ("static_step_matches_forward", "graph_matches_eager", "graph_writes_cache_in_place",
              "engine_uses_graphs", "batched_matches_solo", "speculation_matches_plain")

    def run(self, checks: tuple[str, ...] = CHECKS) -> int:
        for name in checks:
            t0 = time.perf_counter()
            try:
                detail, status = getattr(self, name)(), "ok"
            except Skipped as why:
                detail, status = str(why), "skipped"
            except Exception as error:  # every check runs; the failure is reported, then the next one
                traceback.print_exc()
                detail, status = f"{type(error).__name__}: {str(error).strip() or 'failed'}", "FAILED"
            seconds = time.perf_counter() - t0
            self.results[name] = {"status": status, "detail": detail, "seconds": round(seconds, 2)}
            print(f"check {name}: {status} ({seconds:.1f} s): {detail}", flush=True)
        failed = [n for n, r in self.results.items() if r["status"] == "FAILED"]
        counts = {s: sum(r["status"] == s for r in self.results.values()) for s in ("ok", "FAILED", "skipped")}
        print(f"smoke: {counts['ok']} ok, {counts['FAILED']} failed, {counts['skipped']} skipped"
              + (f" (failed: {', '.join(failed)})" if failed else ""))
        return 1 if failed else 0


# scripts/gpu_check.sh's passes: the first compiles one small model (the graph checks share its
# compile); the second adds the in-place check, which compiles two more (two cache capacities)
PASS_CHECKS = {1: ("static_step_matches_forward", "graph_matches_eager", "engine_uses_graphs", "batched_matches_solo",
                   "speculation_matches_plain"),
               2: ("graph_matches_eager", "graph_writes_cache_in_place")}


def _graph_launches(step) -> int:
    """cudaGraphLaunch calls the profiler sees during `step()` (CUDA runtime calls are traced with
    the CUDA activity); -1 when the profiler itself cannot run here."""
    from torch.profiler import ProfilerActivity, profile
    try:
        with torch.inference_mode(), profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
            step()
            torch.cuda.synchronize()
        events = prof.key_averages()
    except Exception as error:
        print(f"profiler unavailable: {type(error).__name__}: {error}")
        return -1
    return sum(e.count for e in events if "cudaGraphLaunch" in e.key)


def _graph_step_seconds(model, cache, start: int, replays: int = 50) -> float:
    """Median seconds of a graph decode step over `cache` (CUDA events), after its capture."""
    decoder = GraphDecoder("cuda")
    tok = torch.ones((1, 1), dtype=torch.long, device="cuda")
    times = []
    with torch.inference_mode():
        for i in range(CAPTURE_CALLS + 3 + replays):
            begin, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            begin.record()
            decoder.decode(model, cache, tok, start, "flash")
            end.record()
            end.synchronize()
            assert not decoder.unavailable, decoder.unavailable
            if i >= CAPTURE_CALLS + 3:
                times.append(begin.elapsed_time(end) / 1e3)
    return sorted(times)[len(times) // 2]


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--device", choices=["cuda", "cpu"], default="cuda" if torch.cuda.is_available() else "cpu")
    p.add_argument("--tiny", action="store_true", help="toy shapes (the dry run)")
    p.add_argument("--pass", dest="pass_", type=int, choices=[1, 2], help="only that pass's checks (default: all)")
    args = p.parse_args(argv)
    torch.backends.cuda.matmul.allow_tf32 = False
    return Smoke(args.device, args.tiny).run(PASS_CHECKS[args.pass_] if args.pass_ else Smoke.CHECKS)


if __name__ == "__main__":
    sys.exit(main())
