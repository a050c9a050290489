"""llama.cpp as the bench's peer (`membound bench --compare llamacpp`): its `llama-server` on the same
GGUF file, the same threads, prompt ids and decode tokens; figures from the server's own timings.

The binary is the one `make peers` builds (scripts/llama_server.py, ~/.cache/membound/llama-server/),
or MEMBOUND_LLAMA_SERVER, or a `llama-server` on PATH. Its bytes per token are the cost model's for
what it reads: every matmul tensor of the GGUF at its stored size, and an fp16 KV cache."""
from __future__ import annotations

import http.client
import json
import shutil
import socket
import subprocess
import tempfile
import time
from pathlib import Path

from engine.bench.single import BenchResult
from engine.options import EngineOptions

SERVER_ENV = "MEMBOUND_LLAMA_SERVER"
HOW_TO_GET = ("--compare llamacpp needs llama.cpp's llama-server: run `make peers` (builds it once into "
              "~/.cache/membound/llama-server/, minutes) or set MEMBOUND_LLAMA_SERVER to one")
KV_ELEM_BYTES = 2  # llama-server's default KV cache type is f16
START_TIMEOUT_S = 120.0


def find_server() -> Path | None:
    """The llama-server to run: $MEMBOUND_LLAMA_SERVER, else the newest one `make peers` built, else PATH."""
    options = EngineOptions.from_environ()
    named = options.llama_server
    if named:
        return Path(named) if Path(named).is_file() else None
    root = options.cache_dir / "llama-server"
    built = sorted(root.glob("*/llama-server"), key=lambda p: p.stat().st_mtime, reverse=True)
    if built:
        return built[0]
    on_path = shutil.which("llama-server")
    return Path(on_path) if on_path else None


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


def result_of(name: str, timings: dict, cfg, prompt_tokens: int, weight_bytes: int, peak_gbs: float,
              peak_flops: float) -> BenchResult:
    """llama.cpp's figures as a BenchResult: its own times; bytes and FLOPs from our cost model for
    what it reads (weight_bytes from the file, an fp16 KV cache), step by step as ours are counted."""
    from engine.metrics import step_cost

    decode_steps = timings["predicted_n"] - 1  # the first token comes from the prompt's logits
    decode_s = timings["predicted_ms"] / 1e3
    costs = [step_cost(cfg, batch_size=1, new_tokens=1, context_len=prompt_tokens + i, weight_bytes=weight_bytes,
                       kv_elem_bytes=KV_ELEM_BYTES, act_elem_bytes=4) for i in range(decode_steps)]
    d_bytes = sum(c.total_bytes for c in costs)
    d_flops = sum(c.flops for c in costs)
    peak_bps = peak_gbs * 1e9
    return BenchResult(
        name=name, prompt_tokens=timings["prompt_n"], decode_tokens=decode_steps,
        prefill_tokens_per_s=timings["prompt_per_second"], decode_tokens_per_s=decode_steps / decode_s,
        ttft_s=timings["prompt_ms"] / 1e3, decode_achieved_gbs=d_bytes / decode_s / 1e9, peak_gbs=peak_gbs,
        mbu=d_bytes / decode_s / peak_bps, mfu=d_flops / decode_s / peak_flops,
        predicted_ceiling_tokens_per_s=decode_steps / sum(c.total_bytes / peak_bps for c in costs),
        decode_bytes_per_token=d_bytes / decode_steps)
