"""Build llama.cpp's `llama-server`, `llama-batched-bench` and `llama-bench` (CPU only) from the
llama.cpp source vendored in the `llama-cpp-python` sdist, once per machine, into
~/.cache/membound/llama-server/VERSION[-noamx]/.

`python scripts/llama_server.py` builds what is absent and prints the server's path; `binary_path()`
says where a tool is (or will be). The attach tests serve the default model with the server; `membound
bench --compare llamacpp` measures llama.cpp with its own benchmarks too. Nothing here is committed:
the source comes from PyPI with pip, the binaries stay in the cache."""
from __future__ import annotations

import os
import platform
import shutil
import subprocess
import sys
import tarfile
import tempfile
import time
from pathlib import Path

from engine.options import EngineOptions

VERSION = "0.3.36"  # llama-cpp-python's version; its sdist vendors llama.cpp's source
CACHE_ROOT = EngineOptions.from_environ().cache_dir / "llama-server"
# the server and llama.cpp's own benchmarks: the batched one (parallel sequences' aggregate tok/s) and
# llama-bench (one sequence's prompt and generation speed)
TOOLS = ("llama-server", "llama-batched-bench", "llama-bench")
# only the tools, on the CPU, with no network at build time (no prebuilt web UI, no HTTPS)
CMAKE_OPTIONS = ("-DCMAKE_BUILD_TYPE=Release", "-DBUILD_SHARED_LIBS=OFF", "-DGGML_NATIVE=ON",
                 "-DLLAMA_BUILD_TESTS=OFF", "-DLLAMA_BUILD_EXAMPLES=OFF", "-DLLAMA_BUILD_APP=OFF",
                 "-DLLAMA_BUILD_SERVER=ON", "-DLLAMA_BUILD_UI=OFF", "-DLLAMA_USE_PREBUILT_UI=OFF",
                 "-DLLAMA_OPENSSL=OFF", "-DGGML_CUDA=OFF", "-DGGML_METAL=OFF", "-DGGML_VULKAN=OFF")
# x86: no AMX. Built for the CPU (-march=native) on an Intel Xeon with AMX (a KVM guest), llama.cpp
# 0.3.36's AMX matmul segfaults on the default GGUF at its first step (ggml_backend_amx_mul_mat, seen
# 2026-12-02 with llama-bench and llama-server alike); without it the tools run the AVX-512 kernels.
# GCC and clang let an explicit -mno-* win over -march=native's, whatever their order.
NO_AMX = "-mno-amx-tile -mno-amx-int8 -mno-amx-bf16"
X86 = platform.machine().lower() in ("x86_64", "amd64", "i386", "i686")
BUILD_OPTIONS = CMAKE_OPTIONS + ((f"-DCMAKE_C_FLAGS={NO_AMX}", f"-DCMAKE_CXX_FLAGS={NO_AMX}") if X86 else ())
# the cache's folder names the build: a change of options builds again beside the old binaries
# (engine/bench/llamacpp.py takes the newest)
BUILD_SUFFIX = "-noamx" if X86 else ""


def binary_path(version: str = VERSION, tool: str = "llama-server") -> Path:
    return CACHE_ROOT / (version + BUILD_SUFFIX) / tool


def _built(path: Path) -> bool:
    return path.is_file() and os.access(path, os.X_OK)


def build(version: str = VERSION, jobs: int | None = None, log=print) -> Path:
    """The server's path, building first whichever of TOOLS is not in the cache (minutes on 2 cores;
    a cache from before the benchmarks were added gets only those)."""
    target = binary_path(version)
    missing = [tool for tool in TOOLS if not _built(binary_path(version, tool))]
    if not missing:
        return target
    for tool in ("cmake", "c++"):
        if shutil.which(tool) is None:
            raise SystemExit(f"llama_server: {tool} not found: install cmake and a C++ compiler "
                             "(Debian: apt-get install cmake g++)")
    jobs = jobs or os.cpu_count() or 2
    started = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="llama-server-build-") as work:
        work = Path(work)
        log(f"llama_server: downloading the llama-cpp-python {version} sdist (its vendored llama.cpp)")
        subprocess.run([sys.executable, "-m", "pip", "download", "--disable-pip-version-check", "-q", "--no-deps",
                        "--no-binary", ":all:", f"llama-cpp-python=={version}", "-d", str(work)], check=True)
        sdist = next(work.glob("llama_cpp_python-*.tar.gz"))
        prefix = f"{sdist.name[:-len('.tar.gz')]}/vendor/llama.cpp/"
        with tarfile.open(sdist) as archive:
            members = [m for m in archive.getmembers() if m.name.startswith(prefix)]
            safe = {"filter": "data"} if hasattr(tarfile, "data_filter") else {}  # (Python 3.11.4+)
            archive.extractall(work, members=members, **safe)
        source, build_dir = work / prefix, work / "build"
        build_log = binary_path(version).with_name("build.log")
        build_log.parent.mkdir(parents=True, exist_ok=True)
        log(f"llama_server: building {', '.join(missing)} with {jobs} jobs (CPU only; compiler output in {build_log})")
        with open(build_log, "w") as output:
            for command in (["cmake", "-S", str(source), "-B", str(build_dir), *BUILD_OPTIONS],
                            ["cmake", "--build", str(build_dir), "--target", *missing, "-j", str(jobs)]):
                if subprocess.run(command, stdout=output, stderr=subprocess.STDOUT, check=False).returncode != 0:
                    tail = build_log.read_text(errors="replace").splitlines()[-30:]
                    raise SystemExit("\n".join(tail) + f"\nllama_server: {command[:2]} failed; the whole log: {build_log}")
        for tool in missing:
            installed = binary_path(version, tool)
            installed.parent.mkdir(parents=True, exist_ok=True)
            partial = installed.with_name(tool + ".partial")
            shutil.copy2(build_dir / "bin" / tool, partial)
            partial.replace(installed)  # whole or not at all: an interrupted build leaves no binary behind
    log(f"llama_server: built {', '.join(missing)} into {target.parent} in {time.monotonic() - started:.0f} s")
    return target


if __name__ == "__main__":
    print(build(log=lambda message: print(message, file=sys.stderr)))
