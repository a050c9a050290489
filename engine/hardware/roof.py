"""The roofs a step is measured against, and the one policy that picks them (`Roof`).

A CPU's roofs are measured once per machine and cached with their date and method (`cpu_roof`):
read bandwidth by a multi-threaded streaming read in C++ (kernels/cpu_roof.cpp) over several sizes
of at least 4x the last-level cache, best of N passes, on the threads the decode step uses; the
read of a buffer that fits that cache beside it; FLOP/s by FMA loops per dtype or PyTorch's GEMM,
whichever is higher. A new machine (another CPU, core count, thread count or memory) or
`membound roof --measure` measures again. A GPU's roof is its datasheet, beside a measured copy.
Nothing here raises a roof from what a step did: a step above its roof is shown as such.
Torch-free at import (the GUI process imports `Roof`); measuring imports torch lazily."""
from __future__ import annotations

import hashlib
import json
import os
import platform
import tempfile
import time
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path
from typing import Callable

from engine.hardware.spec import GB, DeviceSpec, dtype_name

# ---------------------------------------------------------------------------------------------
# The policy

ABOVE_ROOF = "above the measured roof: the cost model or the probe is wrong"
ABOVE_ROOF_TOLERANCE = 1.02  # a probe's best-of-N repeats within a few %: beyond this a step is above


@dataclass(frozen=True)
class Roof:
    """The peaks one device offers a step: memory (DRAM/HBM) bandwidth, and where the machine has a
    measured last-level cache roof, the bandwidth of reads that fit it; FLOP/s per dtype. Every front
    end (app, bench, terminal, replay, attach) takes a step's roof from here."""
    bandwidth_bps: float
    flops: dict[str, float] = field(default_factory=dict)
    cache_bandwidth_bps: float | None = None
    cache_bytes: int | None = None

    @classmethod
    def of(cls, spec: DeviceSpec) -> "Roof":
        cache_bps = spec.cache_bandwidth_gbs * GB if spec.cache_bandwidth_gbs else None
        return cls(spec.peak_bandwidth_gbs * GB, dict(spec.peak_flops), cache_bps, spec.cache_bytes)

    def level_for(self, step_bytes: float) -> str:
        """'cache' when the step's bytes fit the last-level cache and it has a measured roof (a step
        that reads the same weights every time then streams them from the cache), else 'memory'."""
        if self.cache_bandwidth_bps and self.cache_bytes and 0 < step_bytes <= self.cache_bytes:
            return "cache"
        return "memory"

    def bandwidth_for(self, step_bytes: float) -> float:
        """Bytes/s of the roof a step moving `step_bytes` sits under."""
        return self.cache_bandwidth_bps if self.level_for(step_bytes) == "cache" else self.bandwidth_bps

    def flops_for(self, dtype) -> float:
        """Peak FLOP/s for a dtype (fp16 <-> bf16, then fp32 stand in); nan when nothing is known."""
        name = dtype_name(dtype)
        for candidate in {"fp32": ("fp32",), "bf16": ("bf16", "fp16", "fp32"), "fp16": ("fp16", "bf16", "fp32"),
                          "int8": ("int8", "bf16", "fp16", "fp32")}[name]:
            if candidate in self.flops:
                return self.flops[candidate]
        return float("nan")


def above_roof(mbu: float, mfu: float) -> bool:
    """A step whose bytes or FLOPs at its measured time beat the roof (beyond the probe's noise)."""
    return any(x == x and x > ABOVE_ROOF_TOLERANCE for x in (mbu, mfu))


def roof_line(spec: DeviceSpec) -> str:
    """One line naming the roof every figure is measured against (the bench prints it)."""
    if spec.kind == "cpu":
        if not spec.measured_bandwidth_gbs:
            return "peak: not measured"
        cache = f", last-level cache read {spec.cache_bandwidth_gbs:.1f} GB/s" if spec.cache_bandwidth_gbs else ""
        when = f", measured {spec.measured_at}" if spec.measured_at else ""
        return (f"peak: the measured roof, read {spec.peak_bandwidth_gbs:.1f} GB/s{cache}{when} "
                f"({spec.source.removeprefix('CPU — ')}; `membound roof`)")
    measured = f", measured copy {spec.measured_bandwidth_gbs:.0f} GB/s" if spec.measured_bandwidth_gbs else ""
    return f"peak: {spec.peak_bandwidth_gbs:.0f} GB/s ({spec.source}){measured}"


# ---------------------------------------------------------------------------------------------
# The measured CPU roof, cached per machine

READ_SIZE_FACTORS = (4, 8)  # read buffers of 4x and 8x the last-level cache: no pass of them fits it
READ_PASSES = 7  # best of N passes a size
MIN_READ_BYTES = 64 * 2**20
FALLBACK_LLC_BYTES = 32 * 2**20  # where the cache size cannot be read


@dataclass(frozen=True)
class MeasuredRoof:
    """One machine's probed roofs, as cached (plain data, JSON)."""
    machine: str  # the fingerprint it was measured on (CPU, cores, threads, memory)
    measured_at: str  # local date and time, "2025-01-31 14:05"
    method: str  # how, in words
    threads: int
    llc_bytes: int
    read_gbs: float  # the memory roof: best over the sizes
    read_gbs_by_size: dict[str, float]  # "256 MiB" -> best pass
    cache_read_gbs: float | None  # a buffer of half the last-level cache, read again and again
    flops: dict[str, float]  # dtype -> FLOP/s
    flops_method: dict[str, str]  # dtype -> "FMA loop" | "bf16 dot loop" | "GEMM"
    load_average: float | None = None  # the 1-minute load when measured (a busy machine reads low)

    def to_dict(self) -> dict:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict) -> "MeasuredRoof":
        names = {f.name for f in fields(cls)}
        return cls(**{k: v for k, v in data.items() if k in names})

    def describe(self) -> str:
        sizes = ", ".join(f"{size} {gbs:.1f}" for size, gbs in self.read_gbs_by_size.items())
        flops = ", ".join(f"{dtype} {value / 1e12:.3f} TFLOP/s ({self.flops_method.get(dtype, '?')})"
                          for dtype, value in self.flops.items())
        cache = f"; last-level cache ({self.llc_bytes / 2**20:.0f} MiB) read {self.cache_read_gbs:.1f} GB/s" \
            if self.cache_read_gbs else ""
        return (f"read {self.read_gbs:.1f} GB/s ({sizes} GB/s){cache}; {flops}; {self.threads} threads; "
                f"measured {self.measured_at} by {self.method}")


def cache_file() -> Path:
    """Where the roofs are kept: MEMBOUND_ROOF_CACHE, else the user's cache dir (membound/roof.json)."""
    override = os.environ.get("MEMBOUND_ROOF_CACHE")
    if override:
        return Path(override)
    return Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache")) / "membound" / "roof.json"


def llc_bytes() -> int:
    """The last-level cache's size (the largest level sysfs lists for cpu0), else a guess of 32 MiB."""
    best_level, best_size = -1, 0
    base = Path("/sys/devices/system/cpu/cpu0/cache")
    try:
        for index in base.glob("index*"):
            kind = (index / "type").read_text().strip()
            if kind not in ("Unified", "Data"):
                continue
            level = int((index / "level").read_text())
            text = (index / "size").read_text().strip()
            size = int(text[:-1]) * {"K": 2**10, "M": 2**20, "G": 2**30}[text[-1]] if text[-1] in "KMG" else int(text)
            if level > best_level or (level == best_level and size > best_size):
                best_level, best_size = level, size
    except (OSError, ValueError, KeyError):
        best_size = 0
    if not best_size:
        try:
            best_size = os.sysconf("SC_LEVEL3_CACHE_SIZE") or os.sysconf("SC_LEVEL2_CACHE_SIZE")
        except (ValueError, OSError, AttributeError):
            best_size = 0
    return best_size if best_size and best_size > 0 else FALLBACK_LLC_BYTES


def machine_fingerprint(threads: int) -> str:
    """What a roof depends on: the CPU (its model and flags), the cores this process may use, the
    decode step's threads, the memory installed and the cache size. Any change: measure again."""
    from engine.hardware.detect import _cpu_core_count, _cpu_model_name, _ram_total_bytes
    try:
        with open("/proc/cpuinfo") as cpuinfo:
            flags = next((line for line in cpuinfo if line.startswith(("flags", "Features"))), "")
    except OSError:
        flags = platform.processor()
    parts = (_cpu_model_name(), platform.machine(), hashlib.sha256(flags.encode()).hexdigest()[:12],
             f"{_cpu_core_count()} cores", f"{threads} threads", f"{(_ram_total_bytes() or 0) >> 20} MiB",
             f"LLC {llc_bytes() >> 10} KiB")
    return " | ".join(parts)


def _read_cache() -> dict:
    try:
        data = json.loads(cache_file().read_text())
    except (OSError, ValueError):
        return {}
    return data if isinstance(data, dict) else {}


def _write_cache(record: MeasuredRoof) -> None:
    path = cache_file()
    data = _read_cache()
    data[record.machine] = record.to_dict()
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        with tempfile.NamedTemporaryFile("w", dir=path.parent, delete=False, suffix=".tmp") as tmp:
            json.dump(data, tmp, indent=1)
        os.replace(tmp.name, path)  # never half a file
    except OSError:
        pass  # an unwritable cache: measured again next time, nothing lost


def cached_cpu_roof(threads: int | None = None) -> MeasuredRoof | None:
    """This machine's cached roof, or None (never measured here, or the hardware changed)."""
    threads = threads or _decode_threads()
    entry = _read_cache().get(machine_fingerprint(threads))
    if not isinstance(entry, dict):
        return None
    try:
        return MeasuredRoof.from_dict(entry)
    except TypeError:
        return None


def cpu_roof(remeasure: bool = False, progress: Callable[[str], None] | None = None) -> MeasuredRoof:
    """This machine's roof: from the cache, or measured now (seconds) and cached."""
    threads = _decode_threads()
    if not remeasure:
        cached = cached_cpu_roof(threads)
        if cached is not None:
            return cached
    record = measure_cpu_roof(threads, progress or (lambda message: None))
    _write_cache(record)
    return record


def _decode_threads() -> int:
    import torch  # the C++ step runs torch.get_num_threads() threads (engine/model/cpu_step.py)
    return torch.get_num_threads()


def measure_cpu_roof(threads: int, progress: Callable[[str], None]) -> MeasuredRoof:
    """Probe this CPU now: the C++ read and FMA loops where the library builds, PyTorch's sum and
    matmul otherwise (the method says which)."""
    import torch

    from engine.hardware.detect import _ram_total_bytes, measure_bandwidth_gbs, measure_matmul_flops

    llc = llc_bytes()
    fingerprint = machine_fingerprint(threads)
    try:
        from kernels import cpu_roof as probe
        probe.load()
    except Exception as error:  # no compiler, a failed build: PyTorch's probes, said so
        probe, why = None, str(error).splitlines()[0] if str(error) else type(error).__name__
    ram = _ram_total_bytes()
    by_size: dict[str, float] = {}
    cache_gbs = None
    flops: dict[str, float] = {}
    flops_method: dict[str, str] = {}
    if probe is not None:
        for factor in READ_SIZE_FACTORS:
            n_bytes = max(MIN_READ_BYTES, factor * llc)
            if ram and n_bytes > ram // 8:
                continue
            progress(f"measuring CPU read bandwidth ({n_bytes >> 20} MiB, {threads} threads)…")
            buffer = torch.ones(n_bytes // 4, dtype=torch.float32)
            by_size[f"{n_bytes >> 20} MiB"] = buffer.nbytes / probe.read_best_s(buffer, READ_PASSES, threads) / GB
            del buffer
        progress("measuring CPU last-level cache read…")
        resident = torch.ones(max(llc // 2, 2**20) // 4, dtype=torch.float32)
        passes = max(READ_PASSES, int(2**30 // resident.nbytes))  # about a GiB read in all
        cache_gbs = resident.nbytes / probe.read_best_s(resident, passes, threads) / GB
        del resident
        progress("measuring CPU FMA rate…")
        flops["fp32"], flops_method["fp32"] = probe.fma_flops(threads), "FMA loop"
        bf16 = probe.bf16_flops(threads)
        flops["bf16"], flops_method["bf16"] = (bf16, "bf16 dot loop") if bf16 else (flops["fp32"], "FMA loop")
        method = (f"C++ streaming read (kernels/cpu_roof.cpp, {probe.lanes() * 32}-bit vectors), "
                  f"best of {READ_PASSES} passes a size")
    else:
        progress("measuring CPU memory bandwidth (PyTorch)…")
        by_size["256 MiB"] = measure_bandwidth_gbs("cpu", seconds=0.5)
        method = f"PyTorch sum over 256 MiB, best of its repeats (the C++ probe did not build: {why})"
    for dtype in ("fp32", "bf16"):
        progress(f"measuring CPU {dtype} matmul…")
        gemm = measure_matmul_flops("cpu", dtype, seconds=0.2)
        if gemm > flops.get(dtype, 0.0):
            flops[dtype], flops_method[dtype] = gemm, "GEMM"
    try:
        load = os.getloadavg()[0]
    except (OSError, AttributeError):
        load = None
    return MeasuredRoof(machine=fingerprint, measured_at=time.strftime("%Y-%m-%d %H:%M"), method=method,
                        threads=threads, llc_bytes=llc, read_gbs=max(by_size.values()),
                        read_gbs_by_size=by_size, cache_read_gbs=cache_gbs, flops=flops,
                        flops_method=flops_method, load_average=load)
