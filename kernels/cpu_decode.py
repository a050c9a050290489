"""The CPU decode step in C++ (kernels/cpu_decode.cpp): built once per machine with the system's C++
compiler into ~/.cache/membound/, loaded with ctypes; `load()` returns it, or raises `BuildError`.

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
from pathlib import Path

SOURCE = Path(__file__).with_name("cpu_decode.cpp")
# -march=native: the machine's own vector units (AVX-512 with bf16 dot products where it has them,
# AVX2 on most laptops); the library is cached per source, compiler, flags and CPU
FLAGS = ("-O3", "-march=native", "-fopenmp", "-shared", "-fPIC", "-std=c++17")
BUILD_TIMEOUT_S = 120

F32, BF16, INT8, INT4 = 0, 1, 2, 3  # struct Mat's formats
# the phases of a step `membound_decode_step` times when asked (its enum, in order)
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
                ("layers", ctypes.POINTER(Layer))]


_LOADED: dict[tuple[str, ...], ctypes.CDLL] = {}
_LOCK = threading.Lock()


def load(flags: tuple[str, ...] | None = None) -> ctypes.CDLL:
    """The compiled library (built on first use, seconds; then read from the cache); `flags`
    default to FLAGS."""
    flags = FLAGS if flags is None else flags
    with _LOCK:
        lib = _LOADED.get(flags)
        if lib is None:
            import torch  # noqa: F401  (first: its OpenMP runtime is the one the library binds to)
            lib = ctypes.CDLL(str(_build(flags)))
            lib.membound_scratch_floats.argtypes = [ctypes.POINTER(Model), ctypes.c_int64]
            lib.membound_scratch_floats.restype = ctypes.c_int64
            lib.membound_decode_step.argtypes = [ctypes.POINTER(Model), ctypes.c_int64, ctypes.c_int64,
                                                 ctypes.c_void_p, ctypes.c_void_p, ctypes.c_void_p,
                                                 ctypes.c_void_p, ctypes.c_int64, ctypes.c_void_p]
            lib.membound_decode_step.restype = None
            lib.membound_profile_phases.restype = ctypes.c_int64
            lib.membound_gemv.argtypes = [ctypes.POINTER(Mat), ctypes.c_void_p, ctypes.c_void_p, ctypes.c_int64]
            lib.membound_gemv.restype = None
            _LOADED[flags] = lib
        return lib


def _compiler() -> str:
    for name in (os.environ.get("CXX", ""), "g++", "c++", "clang++"):
        if name and shutil.which(name):
            return name
    raise BuildError("no C++ compiler (g++ or clang++) on PATH")


def _build(flags: tuple[str, ...], source_path: Path = SOURCE) -> Path:
    """The library of `source_path` (the decode step; kernels/cpu_roof.cpp's probes too)."""
    if platform.system() != "Linux":
        raise BuildError(f"the C++ decode step is built on Linux only (this is {platform.system()})")
    cxx = _compiler()
    source = source_path.read_bytes()
    try:
        version = subprocess.run([cxx, "--version"], capture_output=True, text=True, timeout=30, check=False).stdout
    except (OSError, subprocess.SubprocessError) as e:
        raise BuildError(f"{cxx} --version failed: {e}") from None
    key = hashlib.sha256(source + repr((flags, version, _cpu_flags())).encode()).hexdigest()[:16]
    cache = Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache")) / "membound" / "cpu_decode"
    target = cache / f"{source_path.stem}-{key}.so"
    if target.exists():
        return target
    cache.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=cache) as tmp:  # built aside, then renamed: never half a file
        out = Path(tmp) / target.name
        try:
            done = subprocess.run([cxx, *flags, str(source_path), "-o", str(out)], capture_output=True, text=True, check=False,
                                  timeout=BUILD_TIMEOUT_S)
        except (OSError, subprocess.SubprocessError) as e:
            raise BuildError(f"{cxx} failed: {e}") from None
        if done.returncode != 0:
            first = next((line for line in done.stderr.splitlines() if "error" in line), done.stderr.strip()[:200])
            raise BuildError(f"{cxx} could not build kernels/{source_path.name}: {first}")
        os.replace(out, target)
    return target


def _cpu_flags() -> str:
    try:
        with open("/proc/cpuinfo") as f:
            return next((line for line in f if line.startswith("flags")), "")
    except OSError:
        return platform.processor()
