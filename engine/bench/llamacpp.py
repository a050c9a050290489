"""llama.cpp as the bench's peer (`membound bench --compare llamacpp`), on the same GGUF file and
threads: its own benchmarks, `llama-bench` (one sequence: prompt processing, then generation after
the prompt's context) and `llama-batched-bench` (N parallel sequences' aggregate generation speed),
and its `llama-server` over HTTP (the same prompt ids, greedy, its own `timings`: sampling and the
server's loop included, so not llama.cpp's own speed). Every figure says which tool it came from.

The binaries are the ones `make peers` builds (scripts/llama_server.py, ~/.cache/membound/llama-server/),
or $MEMBOUND_LLAMA_SERVER / $MEMBOUND_LLAMA_BATCHED_BENCH / $MEMBOUND_LLAMA_BENCH, or on PATH. Bytes
per token are the cost model's for what llama.cpp reads: every matmul tensor of the GGUF at its
stored size, and an fp16 KV cache."""
from __future__ import annotations

import http.client
import json
import shutil
import socket
import subprocess
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

from engine.bench.single import BenchResult, roof_levels
from engine.hardware.roof import Roof
from engine.options import EngineOptions

TOOLS = ("llama-server", "llama-batched-bench", "llama-bench")
KV_ELEM_BYTES = 2  # llama.cpp's default KV cache type is f16
# what llama.cpp's matmuls are held to: a quantised GGUF (the default model's Q4_1, its Q8 head) multiplies
# int8 blocks, the activations quantised to Q8, so its layers' and head's products are int8 dot products
# (Roof.step_flops_peak, as our C++ step's are: the rest of a step at fp32's rate; where a machine has no
# int8 figure, fp32's). An F16/F32 GGUF is held to the same roof: a simplification (its compute roof then too
# high, its MFU too low)
PEER_PRODUCTS = ("int8", "int8")
START_TIMEOUT_S = 120.0
BENCH_TIMEOUT_S = 1800.0  # one llama-bench or llama-batched-bench run, at most


def tool_env(tool: str) -> str:
    """The environment variable naming a tool's binary: MEMBOUND_LLAMA_SERVER, ... (engine/options.py)."""
    return "MEMBOUND_" + tool.upper().replace("-", "_")


def how_to_get(missing: list[str]) -> str:
    return (f"--compare llamacpp needs llama.cpp's {', '.join(missing)}: run `make peers` (builds llama-server, "
            "llama-batched-bench and llama-bench once into ~/.cache/membound/llama-server/, minutes) or set "
            + ", ".join(map(tool_env, missing)))


def find_tool(tool: str) -> Path | None:
    """A llama.cpp binary: $MEMBOUND_<TOOL>, else the newest one `make peers` built, else PATH."""
    options = EngineOptions.from_environ()
    named = getattr(options, tool.replace("-", "_"))  # llama_server, llama_batched_bench, llama_bench
    if named:
        return Path(named) if Path(named).is_file() else None
    root = options.cache_dir / "llama-server"
    built = sorted(root.glob(f"*/{tool}"), key=lambda p: p.stat().st_mtime, reverse=True)
    if built:
        return built[0]
    on_path = shutil.which(tool)
    return Path(on_path) if on_path else None


def find_server() -> Path | None:
    return find_tool("llama-server")


def missing_tools() -> list[str]:
    return [tool for tool in TOOLS if find_tool(tool) is None]


def peer_model(model: str, sweep: str | None, workload: str | None = None, device: str = "cpu") -> Path:
    """The GGUF file llama.cpp reads, or ValueError (one line) saying why it cannot compare."""
    if device != "cpu":  # ours on a GPU against llama.cpp on the CPU, at the GPU's peaks, would be no comparison
        raise ValueError("--compare llamacpp runs on --device cpu: `make peers` builds llama.cpp for the CPU")
    if workload or sweep not in (None, "weights", "precision", "batch"):
        what = f"--workload {workload}" if workload else f"--sweep {sweep}"
        raise ValueError(f"--compare llamacpp runs with one setting, --sweep weights/precision or --sweep batch, "
                         f"not {what}")
    if model == "default":
        from engine.io.default_model import find_default_model
        path = find_default_model()
    else:
        path = Path(model).expanduser()
        if path.suffix.lower() != ".gguf" or not path.is_file():
            raise ValueError(f"--compare llamacpp needs a .gguf file llama.cpp can read, got {model}")
    if missing := missing_tools():
        raise ValueError(how_to_get(missing))
    return path


def _run_tool(args: list[str]) -> str:
    """A llama.cpp benchmark's standard output; RuntimeError (with its last lines) if it fails."""
    try:
        done = subprocess.run(args, capture_output=True, text=True, timeout=BENCH_TIMEOUT_S, stdin=subprocess.DEVNULL)
    except subprocess.TimeoutExpired:
        raise RuntimeError(f"{Path(args[0]).name} did not finish within {BENCH_TIMEOUT_S:.0f} s") from None
    if done.returncode != 0:
        tail = " | ".join((done.stderr or done.stdout).strip().splitlines()[-3:])
        raise RuntimeError(f"{Path(args[0]).name} exited with {done.returncode}: {tail}")
    return done.stdout


@dataclass
class LlamaBench:
    """llama-bench's figures for one sequence: pp (a prompt from an empty cache) and tg (tokens
    generated one at a time after `depth` tokens of context), each its mean over repetitions."""
    prompt_tokens: int
    prefill_tokens_per_s: float
    decode_tokens: int
    depth: int
    decode_tokens_per_s: float
    command: str


def run_llama_bench(binary: Path, model: Path, threads: int, prompt_tokens: int, decode_tokens: int,
                    repetitions: int = 1) -> LlamaBench:
    """`llama-bench -p P -n D -d 0,P`: prompt processing of P tokens from empty and generation of D
    tokens at depth P (after the prompt's context, as our decode runs), its own warm-up first."""
    args = [str(binary), "-m", str(model), "-t", str(threads), "-p", str(prompt_tokens), "-n", str(decode_tokens),
            "-d", f"0,{prompt_tokens}", "-r", str(max(1, repetitions)), "-o", "json"]
    rows = json.loads(_run_tool(args))

    def find(n_prompt: int, n_gen: int, depth: int) -> dict:
        for row in rows:
            if (row["n_prompt"], row["n_gen"], row["n_depth"]) == (n_prompt, n_gen, depth):
                return row
        raise RuntimeError(f"llama-bench gave no test of {n_prompt} prompt and {n_gen} generated tokens at "
                           f"depth {depth}")

    pp, tg = find(prompt_tokens, 0, 0), find(0, decode_tokens, prompt_tokens)
    return LlamaBench(prompt_tokens=prompt_tokens, prefill_tokens_per_s=pp["avg_ts"], decode_tokens=decode_tokens,
                      depth=prompt_tokens, decode_tokens_per_s=tg["avg_ts"], command=" ".join(args))


@dataclass
class BatchedBenchPoint:
    """llama-batched-bench at one number of parallel sequences: `pl` prompts of `pp` tokens
    prefilled, then `tg` steps generating one token for each sequence."""
    batch_size: int
    prefill_tokens_per_s: float  # S_PP
    aggregate_tokens_per_s: float  # S_TG: pl * tg / t_tg
    decode_step_ms: float
    achieved_gbs: float = float("nan")  # cost model bytes of its decode steps / their time
    mbu: float = float("nan")
    roofline_tokens_per_s: float = float("nan")  # the cost model's roofline for what it reads
    of_roofline: float = float("nan")


def run_batched_bench(binary: Path, model: Path, threads: int, prompt_tokens: int, decode_tokens: int,
                      parallel: list[int]) -> tuple[dict[int, BatchedBenchPoint], str]:
    """`llama-batched-bench -npp P -ntg D -npl 1,8,...`, with a context that holds the largest batch
    (a row that does not fit is skipped by the tool: here that is an error). By batch size."""
    context = max(parallel) * (prompt_tokens + decode_tokens)
    args = [str(binary), "-m", str(model), "-c", str(context), "-b", "2048", "-ub", "512", "-npp", str(prompt_tokens),
            "-ntg", str(decode_tokens), "-npl", ",".join(map(str, parallel)), "-t", str(threads), "-tb", str(threads),
            "--output-format", "jsonl"]
    out = {}
    for line in _run_tool(args).splitlines():
        if line.startswith("{") and '"speed_tg"' in line:
            row = json.loads(line)
            out[row["pl"]] = BatchedBenchPoint(batch_size=row["pl"], prefill_tokens_per_s=row["speed_pp"],
                                               aggregate_tokens_per_s=row["speed_tg"],
                                               decode_step_ms=1e3 * row["t_tg"] / row["tg"])
    if missing := [n for n in parallel if n not in out]:
        raise RuntimeError(f"llama-batched-bench gave no figure for {missing} parallel sequences")
    return out, " ".join(args)


def batched_bench_traffic(points: dict[int, BatchedBenchPoint], cfg, prompt_tokens: int, decode_tokens: int,
                          weight_bytes: int, roof) -> None:
    """Each point's achieved GB/s, MBU and roofline from the cost model, as ours are counted: its
    weights once a step for all the sequences, each sequence's f16 KV cache read from `prompt_tokens`
    on; each step against the roof it sits under (engine/hardware/roof.py Roof), its roofline time the
    longer of its bytes at that bandwidth and its FLOPs at their peak (PEER_PRODUCTS)."""
    from engine.metrics import step_cost

    for p in points.values():
        costs = [step_cost(cfg, batch_size=p.batch_size, new_tokens=1, context_len=prompt_tokens + i,
                           weight_bytes=weight_bytes, kv_elem_bytes=KV_ELEM_BYTES, act_elem_bytes=4)
                 for i in range(decode_tokens)]
        moved = sum(c.total_bytes for c in costs)
        decode_s = decode_tokens * p.decode_step_ms / 1e3
        p.achieved_gbs = moved / decode_s / 1e9
        p.mbu = sum(c.total_bytes / roof.bandwidth_for(c.total_bytes) for c in costs) / decode_s
        roof_s = sum(max(c.total_bytes / roof.bandwidth_for(c.total_bytes),
                         c.flops / peer_peak(roof, c)) for c in costs)
        p.roofline_tokens_per_s = p.batch_size * decode_tokens / roof_s
        p.of_roofline = roof_s / decode_s


class LlamaServer:
    """One llama-server process on a free loopback port; `complete()` decodes and returns its timings."""

    def __init__(self, binary: Path, model: Path, threads: int, context: int, extra_args: tuple[str, ...] = ()):
        self.binary, self.model, self.threads, self.context = binary, model, threads, context
        self.extra_args = extra_args  # e.g. --metrics, for the attach tests (tests/app/llama_peer.py)
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            self.port = s.getsockname()[1]
        self.log = Path(tempfile.gettempdir()) / f"membound-bench-llama-server-{self.port}.log"
        self.process: subprocess.Popen | None = None

    def __enter__(self) -> "LlamaServer":
        self.start()
        return self

    def __exit__(self, *exc) -> None:
        self.stop()

    def start(self) -> None:
        # -t / -tb: the same threads as ours for decode and for the prompt; one slot; no prompt cache
        args = [str(self.binary), "-m", str(self.model), "--host", "127.0.0.1", "--port", str(self.port),
                "-c", str(self.context), "-np", "1", "-t", str(self.threads), "-tb", str(self.threads),
                "--no-webui", "-cram", "0", *self.extra_args]
        with open(self.log, "ab") as log:  # a restart on the same port adds to the same log
            self.process = subprocess.Popen(args, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
        deadline = time.monotonic() + START_TIMEOUT_S
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise RuntimeError(f"llama-server exited with {self.process.returncode} (its log: {self.log})")
            if self._get("/health") == 200:
                return
            time.sleep(0.2)
        self.stop()
        raise RuntimeError(f"llama-server was not ready within {START_TIMEOUT_S:.0f} s (its log: {self.log})")

    def stop(self) -> None:
        if self.process is not None and self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(10)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()
        self.process = None

    def _get(self, path: str) -> int | None:
        connection = http.client.HTTPConnection("127.0.0.1", self.port, timeout=2.0)
        try:
            connection.request("GET", path)
            return connection.getresponse().status
        except OSError:
            return None
        finally:
            connection.close()

    def complete(self, prompt_ids: list[int], n_predict: int) -> dict:
        """Greedy decode of n_predict tokens after `prompt_ids`, end-of-sequence ignored, nothing cached
        from the last request: the server's `timings` (prompt_ms, predicted_n, predicted_ms, ...)."""
        body = json.dumps({"prompt": prompt_ids, "n_predict": n_predict, "ignore_eos": True, "top_k": 1,
                           "cache_prompt": False, "stream": False})
        connection = http.client.HTTPConnection("127.0.0.1", self.port, timeout=600)
        try:
            connection.request("POST", "/completion", body, {"Content-Type": "application/json"})
            response = connection.getresponse()
            payload = response.read()
        finally:
            connection.close()
        if response.status != 200:
            raise RuntimeError(f"llama-server answered {response.status}: {payload[:200]!r}")
        reply = json.loads(payload)
        timings = reply["timings"]
        if reply.get("tokens_predicted") != n_predict or timings.get("predicted_n") != n_predict:
            raise RuntimeError(f"llama-server decoded {reply.get('tokens_predicted')} tokens, asked for {n_predict}")
        return timings


def gguf_matmul_bytes(path: Path) -> int:
    """Bytes one llama.cpp decode step reads of the file's weights: every 2-D tensor at its stored
    size (the token embedding only where it doubles as the output matrix: else one row is gathered),
    plus the 1-D ones (norms, biases)."""
    from engine.io.file_headers import read_gguf_header, tensor_nbytes

    tensors = read_gguf_header(path).tensors
    names = {t.name for t in tensors}
    total = 0
    for t in tensors:
        if t.name == "token_embd.weight" and "output.weight" in names:
            continue
        if t.name == "rope_freqs.weight":
            continue
        total += tensor_nbytes(t)
    return total


def peer_peak(roof: Roof, cost) -> float:
    """The FLOP/s llama.cpp's step of `cost` could run at, at most (PEER_PRODUCTS)."""
    return roof.step_flops_peak(cost, "fp32", PEER_PRODUCTS)


def result_of(name: str, timings: dict, cfg, prompt_tokens: int, weight_bytes: int, roof: Roof) -> BenchResult:
    """llama-server's figures (its `timings`) as a BenchResult: the first token comes from the
    prompt's logits, the rest are decode steps."""
    return peer_result(name, cfg, prompt_tokens=timings["prompt_n"], prefill_s=timings["prompt_ms"] / 1e3,
                       decode_steps=timings["predicted_n"] - 1, decode_s=timings["predicted_ms"] / 1e3,
                       weight_bytes=weight_bytes, roof=roof, context_start=prompt_tokens)


def llama_bench_result(name: str, bench: LlamaBench, cfg, weight_bytes: int, roof: Roof) -> BenchResult:
    return peer_result(name, cfg, prompt_tokens=bench.prompt_tokens,
                       prefill_s=bench.prompt_tokens / bench.prefill_tokens_per_s, decode_steps=bench.decode_tokens,
                       decode_s=bench.decode_tokens / bench.decode_tokens_per_s, weight_bytes=weight_bytes,
                       roof=roof, context_start=bench.depth)


def peer_result(name: str, cfg, *, prompt_tokens: int, prefill_s: float, decode_steps: int, decode_s: float,
                weight_bytes: int, roof: Roof, context_start: int | None = None) -> BenchResult:
    """llama.cpp's times as a BenchResult; bytes and FLOPs from our cost model for what it reads
    (weight_bytes from the file, an fp16 KV cache), step by step from `context_start` (default: after
    the prompt) as ours are counted."""
    from engine.metrics import step_cost

    start = prompt_tokens if context_start is None else context_start
    costs = [step_cost(cfg, batch_size=1, new_tokens=1, context_len=start + i, weight_bytes=weight_bytes,
                       kv_elem_bytes=KV_ELEM_BYTES, act_elem_bytes=4) for i in range(decode_steps)]
    d_bytes = sum(c.total_bytes for c in costs)
    compute_s = sum(c.flops / peer_peak(roof, c) for c in costs)  # its FLOPs at their peak (PEER_PRODUCTS)
    # each step under the roof its bytes sit under, as ours are (engine/bench/single.py roof_of)
    roof_s = sum(c.total_bytes / roof.bandwidth_for(c.total_bytes) for c in costs)
    return BenchResult(
        name=name, prompt_tokens=prompt_tokens, decode_tokens=decode_steps,
        prefill_tokens_per_s=prompt_tokens / prefill_s, decode_tokens_per_s=decode_steps / decode_s,
        ttft_s=prefill_s, decode_achieved_gbs=d_bytes / decode_s / 1e9, peak_gbs=d_bytes / roof_s / 1e9,
        mbu=roof_s / decode_s, mfu=compute_s / decode_s,
        predicted_ceiling_tokens_per_s=decode_steps / roof_s,
        roof=roof_levels(roof.level_for(c.total_bytes) for c in costs),
        decode_bytes_per_token=d_bytes / decode_steps)
