"""The CPU decode step in C++ (kernels/cpu_decode.cpp): built once per machine and vector level with
the system's C++ compiler into ~/.cache/membound/, loaded with ctypes; `load()` returns it, or raises
`BuildError` (one line: what is missing).

The level is the compiler's target: the machine's own (`-march=native` / `-mcpu=native`) unless
MEMBOUND_CPU_ISA (EngineOptions.cpu_isa) asks for another this machine can run (avx512, avx2, scalar on x86; neon, scalar on
aarch64), so a laptop without AVX-512 can be reproduced here. `build_plan` chooses the compiler and
flags for Linux, macOS (Apple clang, with PyTorch's own libomp or on one thread) and Windows
(LLVM's clang-cl), `CXX` first (EngineOptions.compiler); the library goes to cpu_decode/ under
EngineOptions.cache_dir, keyed by the source, compiler, flags and the CPU's features.

The descriptors mirror the C structs; engine/model/cpu_step.py fills them from a model. The
reference that defines correctness is the model's own PyTorch forward (tests/kernels)."""
from __future__ import annotations

import ctypes
import hashlib
import os
import platform
import shutil
import subprocess
import tempfile
import threading
from dataclasses import dataclass
from pathlib import Path
from types import MappingProxyType
from typing import Callable

from engine.options import EngineOptions

SOURCE = Path(__file__).with_name("cpu_decode.cpp")
ISA_VARIABLE = "MEMBOUND_CPU_ISA"
ISAS = ("native", "avx512", "avx2", "neon", "scalar")
WARNINGS = ("-Wall", "-Wextra")
EXTRA_FLAGS: tuple[str, ...] = ()  # added to every build (tests: a library not in the cache)
# the plain native Linux build, for other sources built the same way (kernels/cpu_roof.py's probes)
FLAGS = ("-O3", "-march=native", "-fopenmp", "-shared", "-fPIC", "-std=c++17")
BUILD_TIMEOUT_S = 120

F32, BF16, INT8, INT4 = 0, 1, 2, 3  # struct Mat's formats
FORMAT_NAMES = MappingProxyType({F32: "fp32", BF16: "bf16", INT8: "int8", INT4: "int4"})
# how a product takes its input rows (membound_input_rounding)
X_EXACT, X_BF16, X_INT16, X_INT8 = 0, 1, 2, 3
# what a product so rounded multiplies with: the roof's kinds (engine/hardware/roof.py products_peak)
PRODUCT_KINDS = MappingProxyType({X_EXACT: "fp32", X_BF16: "bf16", X_INT16: "int16", X_INT8: "int8"})
# the phases of a step `membound_step` times when asked (its enum, in order)
PHASES = ("embedding", "norm + q/k/v", "k/v into the cache", "attention", "output projection",
          "norm + gate/up + SiLU", "down projection", "norm + head", "waiting at barriers")


class BuildError(RuntimeError):
    """The compiler is missing or failed: the engine keeps its PyTorch path (the reason says why)."""


class Mat(ctypes.Structure):
    _fields_ = [("fmt", ctypes.c_int64), ("n", ctypes.c_int64), ("k", ctypes.c_int64), ("group", ctypes.c_int64),
                ("w", ctypes.c_void_p), ("scale", ctypes.c_void_p), ("min", ctypes.c_void_p)]


class Layer(ctypes.Structure):
    _fields_ = [("attn_norm", ctypes.c_void_p), ("ffn_norm", ctypes.c_void_p), ("bqkv", ctypes.c_void_p),
                ("qk_norm", ctypes.c_void_p), ("wqkv", Mat), ("wo", Mat), ("w_gate_up", Mat), ("w_down", Mat),
                ("k_cache", ctypes.c_void_p), ("v_cache", ctypes.c_void_p)]


class Model(ctypes.Structure):
    _fields_ = [("dim", ctypes.c_int64), ("n_layers", ctypes.c_int64), ("n_heads", ctypes.c_int64),
                ("n_kv", ctypes.c_int64), ("head_dim", ctypes.c_int64), ("ffn_dim", ctypes.c_int64),
                ("vocab", ctypes.c_int64), ("max_len", ctypes.c_int64), ("act", ctypes.c_int64),
                ("eps", ctypes.c_float), ("embed", ctypes.c_void_p), ("norm", ctypes.c_void_p), ("head", Mat),
                ("layers", ctypes.POINTER(Layer)), ("kv_head_stride", ctypes.c_int64), ("block_size", ctypes.c_int64)]


class Row(ctypes.Structure):
    """One token row of a step: its token, position and where its K/V live (see the C struct)."""
    _fields_ = [("token", ctypes.c_int64), ("pos", ctypes.c_int64), ("kv_base", ctypes.c_int64),
                ("table", ctypes.c_void_p)]


@dataclass(frozen=True)
class BuildPlan:
    """How this machine builds the library: compiler, flags, file suffix, the level asked for, and a
    line to say when the build runs on one thread ("" otherwise)."""
    compiler: str
    flags: tuple[str, ...]
    suffix: str
    level: str
    note: str = ""


def requested_isa(asked: str = "") -> str:
    """The level MEMBOUND_CPU_ISA asks for (`asked`, EngineOptions.cpu_isa; "native" when unset);
    BuildError for a value it cannot be."""
    isa = asked.strip().lower() or "native"
    if isa not in ISAS:
        raise BuildError(f"{ISA_VARIABLE}={isa}: expected one of {', '.join(ISAS[1:])} (or unset: this CPU's own)")
    return isa


def build_plan(isa: str = "native", system: str | None = None, machine: str | None = None,
               which: Callable[[str], str | None] = shutil.which, compiler: str = "",
               cpu_features: str | None = None, torch_dir: Path | None = None,
               exists: Callable[[Path], bool] = Path.exists) -> BuildPlan:
    """The compiler and flags for `isa` on this platform (`compiler`: CXX, tried first; each input
    injectable: the tests mock the platform); BuildError, one line, where nothing here can build it."""
    system = system or platform.system()
    machine = (machine or platform.machine()).lower()
    arm = machine in ("arm64", "aarch64") or machine.startswith("armv8")
    x86 = machine in ("x86_64", "amd64", "x64")
    features = (cpu_features if cpu_features is not None else cpu_feature_line(system)).lower().split()
    if isa in ("avx512", "avx2") and not x86:
        raise BuildError(f"{ISA_VARIABLE}={isa} is an x86 level; this CPU is {machine}")
    if isa == "neon" and not arm:
        raise BuildError(f"{ISA_VARIABLE}=neon is an ARM level; this CPU is {machine}")
    if isa == "avx512" and system != "Darwin" and features and "avx512f" not in features:
        raise BuildError(f"{ISA_VARIABLE}=avx512: this CPU has no AVX-512 (its flags lack avx512f)")
    if isa == "avx2" and features and "avx2" not in features and system != "Darwin":
        raise BuildError(f"{ISA_VARIABLE}=avx2: this CPU has no AVX2 (its flags lack avx2)")
    if x86:
        target = {"native": ("-march=native",), "avx512": ("-march=native",),
                  "avx2": ("-march=x86-64-v3", "-mtune=native"), "scalar": ("-march=x86-64", "-mtune=native")}[isa]
    elif arm:
        target = ("-march=armv8-a+nosimd",) if isa == "scalar" else ("-mcpu=native",)
    else:
        target = () if isa in ("native", "scalar") else ("-march=native",)
    common = ("-O3", "-std=c++17", *WARNINGS, *EXTRA_FLAGS)

    if system == "Windows":
        cxx = compiler or "clang-cl"
        found_at = which(cxx) or (cxx if exists(Path(cxx)) else None)
        if not found_at:
            found = "only MSVC's cl, which lacks the GCC vector extensions it uses" if which("cl") else "no compiler"
            raise BuildError(f"the C++ decode step on Windows needs LLVM's clang-cl ({found}): PyTorch's step decodes")
        omp_lib = Path(found_at).parent.parent / "lib" / "libomp.lib"
        openmp = exists(omp_lib)
        flags = ("/O2", "/LD", "/EHsc", *(f"/clang:{f}" for f in (*target, *common)),
                 *(("/openmp",) if openmp else ("/clang:-Wno-unknown-pragmas",)))
        note = "" if openmp else "the C++ step runs on one thread (clang-cl found no LLVM libomp.lib for OpenMP)"
        return BuildPlan(cxx, flags, ".dll", isa, note)

    cxx = _compiler(which, compiler, ("clang++", "c++", "g++") if system == "Darwin" else ("g++", "c++", "clang++"))
    if system == "Darwin":  # Apple clang has no -fopenmp: PyTorch's wheel ships the runtime (torch/lib/libomp.dylib)
        torch_dir = torch_dir if torch_dir is not None else _torch_dir()
        lib = torch_dir / "lib" if torch_dir else None
        header = next((d for d in ((torch_dir / "include") if torch_dir else None, Path("/opt/homebrew/opt/libomp/include"),
                                   Path("/usr/local/opt/libomp/include")) if d is not None and exists(d / "omp.h")), None)
        if lib is not None and exists(lib / "libomp.dylib") and header is not None:
            openmp = ("-Xpreprocessor", "-fopenmp", f"-I{header}", f"-L{lib}", "-lomp", f"-Wl,-rpath,{lib}")
            note = ""
        else:
            openmp = ("-Wno-unknown-pragmas",)
            missing = "PyTorch's libomp.dylib" if lib is None or not exists(lib / "libomp.dylib") else "an omp.h for it"
            note = f"the C++ step runs on one thread (Apple clang without OpenMP: {missing} not found)"
        return BuildPlan(cxx, (*common, *target, *openmp, "-shared", "-fPIC"), ".dylib", isa, note)
    return BuildPlan(cxx, (*common, *target, "-fopenmp", "-shared", "-fPIC"), ".so", isa)


def _compiler(which, compiler: str, names: tuple[str, ...]) -> str:
    for name in (compiler, *names):
        if name and which(name):
            return name
    raise BuildError(f"no C++ compiler ({' or '.join(names[::2])}) on PATH")


def _torch_dir() -> Path | None:
    try:
        import torch
        return Path(torch.__file__).parent
    except ImportError:
        return None


_LOADED: dict[tuple, ctypes.CDLL] = {}
_LOCK = threading.Lock()


def load(isa: str | None = None, options: EngineOptions | None = None) -> ctypes.CDLL:
    """The compiled library for `isa` (default: the options' MEMBOUND_CPU_ISA, else this CPU's own
    level), built with the options' compiler into their cache on first use (seconds), then read from
    the cache. Its `.isa` says which vector level it runs, `.threads_note` a line when it runs on one
    thread. `options`: an engine's (default: the environment now)."""
    options = options if options is not None else EngineOptions.from_environ()
    plan = build_plan(requested_isa(options.cpu_isa) if isa is None else isa, compiler=options.compiler)
    key = (plan.compiler, plan.flags, options.cache_dir)
    with _LOCK:
        lib = _LOADED.get(key)
        if lib is None:
            import torch  # noqa: F401  (first: its OpenMP runtime is the one the library binds to)
            lib = bind(ctypes.CDLL(str(_build(plan, cache_dir=options.cache_dir))))
            lib.level = plan.level
            lib.threads_note = plan.note if not lib.membound_openmp() else ""
            _LOADED[key] = lib
        return lib


def bind(lib: ctypes.CDLL) -> ctypes.CDLL:
    """The library's entry points typed, and what it says of itself (`.isa`, `.max_rows`): a build of
    kernels/cpu_decode.cpp, `load`'s or a test's own for another target."""
    lib.membound_scratch_floats.argtypes = [ctypes.POINTER(Model), ctypes.c_int64, ctypes.c_int64, ctypes.c_int64]
    lib.membound_scratch_floats.restype = ctypes.c_int64
    lib.membound_step.argtypes = [ctypes.POINTER(Model), ctypes.POINTER(Row), ctypes.c_int64,
                                  ctypes.c_void_p, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_int64,
                                  ctypes.c_void_p, ctypes.c_void_p, ctypes.c_int64, ctypes.c_int64, ctypes.c_void_p]
    lib.membound_step.restype = ctypes.c_int
    lib.membound_profile_phases.restype = ctypes.c_int64
    lib.membound_max_rows.restype = ctypes.c_int64
    lib.membound_max_blocks.restype = ctypes.c_int64
    lib.membound_product_floats.argtypes = [ctypes.c_int64, ctypes.c_int64, ctypes.c_int64]
    lib.membound_product_floats.restype = ctypes.c_int64
    lib.membound_gemm.argtypes = [ctypes.POINTER(Mat), ctypes.c_void_p, ctypes.c_int64, ctypes.c_void_p,
                                  ctypes.c_void_p, ctypes.c_int64]
    lib.membound_gemm.restype = ctypes.c_int
    lib.membound_isa.restype = ctypes.c_char_p
    lib.membound_openmp.restype = ctypes.c_int
    lib.membound_input_rounding.argtypes = [ctypes.c_int64]
    lib.membound_input_rounding.restype = ctypes.c_int
    lib.membound_tempered.argtypes = [ctypes.c_void_p, ctypes.c_int64, ctypes.c_float, ctypes.c_int64,
                                      ctypes.c_void_p, ctypes.c_void_p]
    lib.membound_tempered.restype = ctypes.c_int
    lib.membound_top_p_token.argtypes = [ctypes.c_void_p, ctypes.c_int64, ctypes.c_double, ctypes.c_double,
                                         ctypes.c_double, ctypes.c_double, ctypes.c_void_p]
    lib.membound_top_p_token.restype = ctypes.c_int64
    lib.membound_sample_top_p.argtypes = [ctypes.c_void_p, ctypes.c_int64, ctypes.c_float, ctypes.c_int64,
                                          ctypes.c_double, ctypes.c_double, ctypes.c_double, ctypes.c_double,
                                          ctypes.c_void_p]
    lib.membound_sample_top_p.restype = ctypes.c_int64
    lib.isa = lib.membound_isa().decode()
    lib.max_rows = int(lib.membound_max_rows())
    return lib


def product_kind(lib, fmt: int) -> str:
    """What the library's products of a format-`fmt` matrix multiply with at its level: "fp32" FMAs
    (exact inputs), "bf16" (dot products where the level has them, else widened to fp32), "int16"
    or "int8" dot products (inputs quantised to such codes): membound_input_rounding."""
    return PRODUCT_KINDS[lib.membound_input_rounding(fmt)]


def gemm(lib, mat: Mat, x, threads: int):
    """y = x W^T for the rows of x ((m, k) fp32, m <= max_rows) through the step's own products (tests)."""
    import torch
    m = x.shape[0]
    x = x.float().contiguous()
    y = torch.full((m, mat.n), float("nan"))
    scratch = torch.empty(lib.membound_product_floats(mat.k, m, threads) + 64)
    if lib.membound_gemm(ctypes.byref(mat), x.data_ptr(), m, y.data_ptr(), scratch.data_ptr(), threads):
        raise ValueError(f"{m} rows: the C++ products take 1 to {lib.max_rows}")
    return y


def _build(plan: BuildPlan | tuple[str, ...], source_path: Path = SOURCE, cache_dir: Path | None = None) -> Path:
    """The library of `source_path` (the decode step; kernels/cpu_roof.cpp's probes too, with bare
    flags) under `cache_dir` (default: the environment's EngineOptions.cache_dir) / cpu_decode."""
    if cache_dir is None or not isinstance(plan, BuildPlan):
        options = EngineOptions.from_environ()
        cache_dir = options.cache_dir if cache_dir is None else cache_dir
        if not isinstance(plan, BuildPlan):
            plan = BuildPlan(build_plan(compiler=options.compiler).compiler, tuple(plan), ".so", "native")
    cxx = plan.compiler
    source = source_path.read_bytes()
    try:
        version = subprocess.run([cxx, "--version"], capture_output=True, text=True, timeout=30, check=False).stdout
    except (OSError, subprocess.SubprocessError) as e:
        raise BuildError(f"{cxx} --version failed: {e}") from None
    key = hashlib.sha256(source + repr((plan.flags, version, plan.level, cpu_feature_line())).encode()).hexdigest()[:16]
    cache = Path(cache_dir) / "cpu_decode"
    target = cache / f"{source_path.stem}-{plan.level}-{key}{plan.suffix}"
    if target.exists():
        return target
    cache.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=cache) as tmp:  # built aside, then renamed: never half a file
        out = Path(tmp) / target.name
        try:
            done = subprocess.run([cxx, *plan.flags, str(source_path), "-o", str(out)], capture_output=True,
                                  text=True, check=False, timeout=BUILD_TIMEOUT_S)
        except (OSError, subprocess.SubprocessError) as e:
            raise BuildError(f"{cxx} failed: {e}") from None
        if done.returncode != 0:
            first = next((line for line in done.stderr.splitlines() if "error" in line), done.stderr.strip()[:200])
            raise BuildError(f"{cxx} could not build kernels/{source_path.name}: {first}")
        os.replace(out, target)
    return target


def cpu_feature_line(system: str | None = None, cpuinfo: str = "/proc/cpuinfo") -> str:
    """The CPU's features, for the cache key: /proc/cpuinfo's `flags` (x86) or `Features` (ARM) line,
    macOS's sysctl, else the processor's name."""
    system = system or platform.system()
    if system == "Darwin":
        try:
            return subprocess.run(["sysctl", "-n", "machdep.cpu.brand_string", "machdep.cpu.features",
                                   "hw.optional.arm.FEAT_BF16", "hw.optional.arm.FEAT_DotProd"],
                                  capture_output=True, text=True, timeout=5, check=False).stdout
        except (OSError, subprocess.SubprocessError):
            return platform.processor()
    try:
        with open(cpuinfo) as f:
            return next((line for line in f if line.startswith(("flags", "Features"))), "")
    except OSError:
        return platform.processor() + os.environ.get("PROCESSOR_IDENTIFIER", "")
