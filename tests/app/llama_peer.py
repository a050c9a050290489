"""A real llama.cpp `llama-server` on loopback, serving the default model's GGUF with --metrics, for
the attach tests. The binary comes from scripts/llama_server.py's cache (built there if absent)."""
from __future__ import annotations

import importlib.util
import socket
from pathlib import Path

from engine.bench import llamacpp

ROOT = Path(__file__).resolve().parents[2]


def _builder():
    spec = importlib.util.spec_from_file_location("llama_server_build", ROOT / "scripts" / "llama_server.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class LlamaServer(llamacpp.LlamaServer):
    """The bench's llama-server with --metrics; start() / stop() keep one port, so a restart is the
    same URL."""

    # one thread: on a shared 2-core machine a second one waits at every barrier for a busy core
    def __init__(self, model: Path, threads: int = 1):
        binary = _builder().build(log=lambda message: print(message, flush=True))
        super().__init__(binary, model, threads, context=2048, extra_args=("--metrics",))
        self.url = f"http://127.0.0.1:{self.port}"
