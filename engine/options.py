"""The environment, read in one place into typed options (torch-free: both processes read it).

`EngineOptions.from_environ()` is read when an engine's context is made (engine/context.py), so an
engine process spawned by the app sees what its parent's environment held then. The variables:

    MEMBOUND_CPU_STEP=0                  the C++ CPU decode step off: PyTorch's step decodes
    MEMBOUND_CPU_ISA=LEVEL               the C++ step built for another vector level this CPU runs
                                         (avx512, avx2, neon, scalar: kernels/cpu_decode.py)
    MEMBOUND_FAULTS=POINT[:KIND],...     fault injection for the reliability tests (engine/faults.py)
    MEMBOUND_ENGINE_OMP_WAIT_POLICY=...  OpenMP's waiting in the engine process the app spawns alone
    MEMBOUND_USER_THINK_S=LO,HI          the simulated users' think time between requests, seconds
                                         (default 0.2,1.5; 0,0: always a request in flight)
    MEMBOUND_PREFIX_CACHE=0              the users' prompts are not kept across requests: each one
                                         computes its whole prompt (engine/serving/prefix_store.py)
    MEMBOUND_LLAMA_SERVER=PATH           the llama-server `bench --compare llamacpp` runs
    MEMBOUND_CACHE=DIR                   where built and measured things are kept (default
                                         $XDG_CACHE_HOME/membound, ~/.cache/membound): the llama-server
                                         build, the C++ step, the measured roofs
    MEMBOUND_ROOF_CACHE=FILE             the measured roofs' file (default roof.json there)
    CXX                                  the C++ compiler for the CPU step (else g++, c++, clang++)

Read elsewhere, each by what it belongs to: OMP_WAIT_POLICY by OpenMP itself (set for it by
`passive_openmp_waits` and `openmp_wait_policy` below), THP_MEM_ALLOC_ENABLE by PyTorch's CPU allocator
(set for it by `huge_page_tensors` below), TRITON_INTERPRET by triton (kernels ask it
through kernels/triton_common.py), DISPLAY / WAYLAND_DISPLAY / QT_QPA_PLATFORM by Qt (the app asks
app/launcher.py), and the model caches of other tools (HF_HOME, LLAMA_CACHE, …) by engine/io/discovery.py,
which takes the environment as an argument."""
from __future__ import annotations

import contextlib
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Iterator, Mapping


@dataclass(frozen=True)
class EngineOptions:
    cpu_step: bool = True  # MEMBOUND_CPU_STEP != "0"
    cpu_isa: str = ""  # MEMBOUND_CPU_ISA, unchecked ("": this CPU's own level; kernels/cpu_decode.py checks it)
    faults: str = ""  # MEMBOUND_FAULTS, unparsed (engine/faults.py parses it)
    engine_omp_wait_policy: str = ""  # MEMBOUND_ENGINE_OMP_WAIT_POLICY ("": OpenMP's default)
    user_think_s: str = ""  # MEMBOUND_USER_THINK_S, unparsed (engine/serving/server.py think_range)
    prefix_cache: bool = True  # MEMBOUND_PREFIX_CACHE != "0"
    llama_server: str = ""  # MEMBOUND_LLAMA_SERVER ("": the one `make peers` built, else PATH)
    llama_batched_bench: str = ""  # MEMBOUND_LLAMA_BATCHED_BENCH (likewise)
    llama_bench: str = ""  # MEMBOUND_LLAMA_BENCH (likewise)
    cache_dir: Path = Path.home() / ".cache" / "membound"  # MEMBOUND_CACHE
    compiler: str = ""  # CXX
    roof_cache: Path = Path.home() / ".cache" / "membound" / "roof.json"  # MEMBOUND_ROOF_CACHE

    @classmethod
    def from_environ(cls, environ: Mapping[str, str] | None = None) -> "EngineOptions":
        env = os.environ if environ is None else environ
        xdg = env.get("XDG_CACHE_HOME")
        cache = env.get("MEMBOUND_CACHE") or (Path(xdg) / "membound" if xdg else Path.home() / ".cache" / "membound")
        return cls(cpu_step=env.get("MEMBOUND_CPU_STEP", "1") != "0",
                   cpu_isa=env.get("MEMBOUND_CPU_ISA", ""),
                   faults=env.get("MEMBOUND_FAULTS", ""),
                   engine_omp_wait_policy=env.get("MEMBOUND_ENGINE_OMP_WAIT_POLICY", ""),
                   user_think_s=env.get("MEMBOUND_USER_THINK_S", ""),
                   prefix_cache=env.get("MEMBOUND_PREFIX_CACHE", "1") != "0",
                   llama_server=env.get("MEMBOUND_LLAMA_SERVER", ""),
                   llama_batched_bench=env.get("MEMBOUND_LLAMA_BATCHED_BENCH", ""),
                   llama_bench=env.get("MEMBOUND_LLAMA_BENCH", ""),
                   cache_dir=Path(cache),
                   compiler=env.get("CXX", ""),
                   roof_cache=Path(env.get("MEMBOUND_ROOF_CACHE") or Path(cache) / "roof.json"))


def passive_openmp_waits() -> None:
    """OpenMP threads that sleep at a barrier rather than spin (OMP_WAIT_POLICY=PASSIVE), unless the
    user chose; it must be set before torch loads. For an engine that shares its process with a GUI."""
    os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")


def huge_page_tensors() -> None:
    """PyTorch's CPU allocator advises every tensor of 2 MiB or more onto 2 MiB pages
    (THP_MEM_ALLOC_ENABLE=1, where the kernel grants transparent huge pages on advice), unless the
    user chose. Decoding streams every weight once a token: on 4 KiB pages a KVM guest walks two page
    tables at each TLB miss, and the step reads its weights slower than the roof probe reads its own
    2 MiB-page buffer (docs/benchmarks.md, issue 24). PyTorch reads the variable at its first CPU
    allocation, so this runs before torch loads: at the `membound` command's start, and the app's
    engine process inherits it."""
    os.environ.setdefault("THP_MEM_ALLOC_ENABLE", "1")


@contextlib.contextmanager
def openmp_wait_policy(policy: str) -> Iterator[None]:
    """OMP_WAIT_POLICY=policy meanwhile (a process spawned inside inherits it), then as it was;
    "" leaves it alone."""
    saved = os.environ.get("OMP_WAIT_POLICY")
    if policy:
        os.environ["OMP_WAIT_POLICY"] = policy
    try:
        yield
    finally:
        if policy:
            os.environ.pop("OMP_WAIT_POLICY", None) if saved is None else os.environ.update(OMP_WAIT_POLICY=saved)
