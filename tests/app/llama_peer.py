"""A real llama.cpp `llama-server` on loopback, serving the default model's GGUF with --metrics, for
the attach tests. The binary comes from scripts/llama_server.py's cache (built there if absent)."""
from __future__ import annotations

import http.client
import importlib.util
import os
import socket
import subprocess
import time
from pathlib import Path

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


class LlamaServer:
    """start() / stop() on one fixed port, so a restart is the same URL."""

    # one thread: on a shared 2-core machine a second one waits at every barrier for a busy core
    def __init__(self, model: Path, threads: int = 1):
        self.binary = _builder().build(log=lambda message: print(message, flush=True))
        self.model = model
        self.threads = threads
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.process: subprocess.Popen | None = None
        self.log = Path(os.environ.get("TMPDIR", "/tmp")) / f"membound-llama-server-{self.port}.log"

    def start(self, timeout_s: float = 90.0) -> None:
        args = [str(self.binary), "-m", str(self.model), "--host", "127.0.0.1", "--port", str(self.port),
                "--metrics", "-c", "2048", "-np", "1", "-t", str(self.threads), "--no-webui", "-cram", "0"]
        with open(self.log, "ab") as log:
            self.process = subprocess.Popen(args, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise RuntimeError(f"llama-server exited ({self.process.returncode}); see {self.log}")
            if self._healthy():
                return
            time.sleep(0.2)
        self.stop()
        raise RuntimeError(f"llama-server not healthy within {timeout_s:.0f} s; see {self.log}")

    def _healthy(self) -> bool:
        connection = http.client.HTTPConnection("127.0.0.1", self.port, timeout=1.0)
        try:
            connection.request("GET", "/health")
            return connection.getresponse().status == 200
        except OSError:
            return False
        finally:
            connection.close()

    def stop(self) -> None:
        if self.process is not None and self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(10)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()
        self.process = None
