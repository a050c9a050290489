"""Probing a device's roofs: the benchmarks (moved from engine/hardware/detect.py), and a CPU's roof
measured once per machine and cached with its date and method (`cpu_roof`).

Read bandwidth by a multi-threaded streaming read in C++ (kernels/cpu_roof.cpp) over two sizes
of 16x and 32x the last-level cache, on 2 MiB pages touched before the clock starts, best of N passes
in each of several rounds spread over a second or two (a shared host's neighbours slow some rounds
down; the best round is the roof), on the threads the decode step uses; the read of a buffer that fits that cache
beside it; FLOP/s by FMA loops per dtype or PyTorch's GEMM, whichever is higher. A new machine
(another CPU, core count, thread count, memory or cache), a new probe method or `membound roof
--measure` measures again."""
from __future__ import annotations

import hashlib
import json
import math
import os
import platform
import tempfile
import time
from pathlib import Path
from typing import Any, Callable

import torch

from engine.hardware.roof import ABOVE_ROOF_TOLERANCE, CACHE_FASTER, MeasuredRoof
from engine.hardware.spec import GB, INT_DOT_KINDS, dtype_name
from engine.options import EngineOptions

# ---------------------------------------------------------------------------------------------
# Benchmarks (the GPU's copy, the CPU's fallback and its GEMM)

_CPU_BANDWIDTH_BYTES = 256 * 2**20  # the fallback probe (no C++ compiler): past most L3s
_GPU_BANDWIDTH_BYTES = 1 * 2**30  # past the 50-60 MB L2 of current parts
_CPU_MATMUL_MAX_N = 2048
_GPU_MATMUL_N = 8192
_MIN_REPEATS = 3


def _best_seconds_per_call(run: Callable[[], Any], device: torch.device, seconds: float,
                           calls_per_timing: int = 1) -> float:
    """Best (least) seconds per call of `run` over repeated timings, within about `seconds`.

    Best-of rather than mean: interference only ever slows a run down."""
    run()  # warm-up: allocator, kernel selection, page faults
    best_s = math.inf
    deadline = time.perf_counter() + seconds
    repeats = 0
    while repeats < _MIN_REPEATS or time.perf_counter() < deadline:
        if device.type == "cuda":
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            for _ in range(calls_per_timing):
                run()
            end.record()
            end.synchronize()
            elapsed_s = start.elapsed_time(end) / 1e3
        else:
            t0 = time.perf_counter()
            for _ in range(calls_per_timing):
                run()
            elapsed_s = time.perf_counter() - t0
        best_s = min(best_s, elapsed_s / calls_per_timing)
        repeats += 1
    return best_s


def measure_bandwidth_gbs(device: str | torch.device = "cpu", seconds: float = 0.5) -> float:
    """Achieved memory bandwidth, GB/s. CPU: read bandwidth of a sum over 256 MiB of fp32.
    CUDA: a 1 GiB device-to-device copy, counting bytes read + written."""
    device = torch.device(device)
    if device.type == "cuda":
        free_bytes, _ = torch.cuda.mem_get_info(device)
        n_bytes = min(_GPU_BANDWIDTH_BYTES, free_bytes // 4)
        src = torch.empty(n_bytes // 4, dtype=torch.float32, device=device)
        dst = torch.empty_like(src)
        # Several copies per event pair, so launch gaps don't count against the memory system.
        best_s = _best_seconds_per_call(lambda: dst.copy_(src), device, seconds, calls_per_timing=10)
        moved_bytes = 2 * src.nbytes
        del src, dst
        torch.cuda.empty_cache()
    else:
        data = torch.ones(_CPU_BANDWIDTH_BYTES // 4, dtype=torch.float32)
        best_s = _best_seconds_per_call(data.sum, device, seconds)
        moved_bytes = data.nbytes
        del data
    return moved_bytes / best_s / GB


def measure_matmul_flops(device: str | torch.device = "cpu", dtype: str | torch.dtype = "fp32",
                         seconds: float = 0.3) -> float:
    """Achieved FLOP/s of a square matmul (2 n^3 per call): n = 8192 on a GPU; on a CPU n doubles
    from 256 up to 2048 while a call stays short, so a slow dtype (fp16 on most CPUs) keeps to budget."""
    device = torch.device(device)
    torch_dtype = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}.get(dtype_name(dtype))
    if torch_dtype is None:
        raise ValueError(f"matmul benchmark: {dtype} is not measured (int8 needs a separate kernel)")
    if device.type == "cuda":
        n = _GPU_MATMUL_N
    else:
        # fp32/bf16 start at 1024: a smaller product measures call overhead, not arithmetic (under
        # load a 256 probe read 2.8 GFLOP/s, which put MFU over 100%); slow fp16 starts small
        n = 1024 if dtype_name(dtype) in ("fp32", "bf16") else 256
        while n < _CPU_MATMUL_MAX_N:
            probe = torch.randn(n, n).to(torch_dtype)
            call_s = _best_seconds_per_call(lambda: probe @ probe, device, seconds=0.0)
            # Doubling n costs 8x a call; keep a warm-up and three repeats inside the budget.
            if call_s * 8 * (1 + _MIN_REPEATS) > seconds:
                break
            n *= 2
    a = torch.randn(n, n, device=device).to(torch_dtype)
    b = torch.randn(n, n, device=device).to(torch_dtype)
    if device.type == "cuda":
        # The datasheet fp32 figure is the non-tensor-core rate, so keep TF32 off while measuring.
        allow_tf32 = torch.backends.cuda.matmul.allow_tf32
        torch.backends.cuda.matmul.allow_tf32 = False
        try:
            best_s = _best_seconds_per_call(lambda: a @ b, device, seconds)
        finally:
            torch.backends.cuda.matmul.allow_tf32 = allow_tf32
    else:
        best_s = _best_seconds_per_call(lambda: a @ b, device, seconds)
    del a, b
    if device.type == "cuda":
        torch.cuda.empty_cache()
    return 2 * n**3 / best_s



def _cpu_model_name() -> str:
    try:
        with open("/proc/cpuinfo") as cpuinfo:
            for line in cpuinfo:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine() or "unknown CPU"


def _cpu_core_count() -> int:
    try:
        return len(os.sched_getaffinity(0))  # the cores this process may use, not the whole host
    except AttributeError:
        return os.cpu_count() or 1


def _ram_total_bytes() -> int | None:
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError, AttributeError):
        return None



# ---------------------------------------------------------------------------------------------
# A CPU's roof, measured once per machine and cached

# Read buffers of 16x and 32x the last-level cache sysfs reports: a virtual machine's sysfs can name a
# smaller cache than the one its reads go through (here 32 MiB reported, and 64-128 MiB buffers on
# 2 MiB pages read 57-75 GB/s where 256 MiB-1 GiB read 21-37: docs/benchmarks.md, issue 24)
READ_SIZE_FACTORS = (16, 32)
MAX_READ_BYTES = 4 << 30  # (a 260 MiB L3 reads 4 GiB buffers: past it 15x)
READ_PASSES = 7  # best of N passes a size, a round
READ_ROUNDS = 5  # rounds over the sizes, READ_ROUND_GAP_S apart: the best round is the roof
READ_ROUND_GAP_S = 0.25
PROBE_METHOD = "read v6"  # in the fingerprint: a roof cached by an older probe is measured again
MIN_READ_BYTES = 256 * 2**20
FALLBACK_LLC_BYTES = 32 * 2**20  # where the cache size cannot be read


def read_sizes(llc: int, ram: int | None) -> list[int]:
    """The read probe's buffer sizes: READ_SIZE_FACTORS times the last-level cache, each at least
    MIN_READ_BYTES and at most MAX_READ_BYTES, held at once within an eighth of the RAM. Where that cap
    makes them one size (a 480 MiB L3 in 24 GiB: 7.5 and 15 GiB wanted), one buffer takes the whole
    eighth, the furthest past the cache the RAM allows (3 GiB: 6.4x that L3, where two of 1.5 GiB
    would read 3.2x)."""
    wanted = sorted({max(MIN_READ_BYTES, factor * llc) for factor in READ_SIZE_FACTORS})
    share = ram // (8 * len(wanted)) if ram else MAX_READ_BYTES
    sizes = sorted({min(MAX_READ_BYTES, share, n) for n in wanted})
    if len(sizes) < len(wanted):
        sizes = [min(MAX_READ_BYTES, ram // 8 if ram else MAX_READ_BYTES, wanted[-1])]
    return sizes


# The last-level cache's read: buffers of 1/2 to 1/16 of the size sysfs names, never within twice the L2s
# (a 2 MiB buffer read 326 GB/s from this Intel guest's L2). A guest's sysfs can name the host's whole
# L3: here 480 MiB, where 30-128 MiB buffers read 54-57 GB/s and 240 MiB read 31-33, the memory's rate.
CACHE_SIZE_SHIFTS = (1, 2, 3, 4)
CACHE_NEAR_BEST = 0.8  # ... and within this of the best cache read


def cache_sizes(llc: int, l2: int) -> list[int]:
    """The cache probe's buffer sizes, largest first (at least one: half the LLC, or 1 MiB)."""
    floor = 2 * l2
    sizes = sorted({llc >> shift for shift in CACHE_SIZE_SHIFTS if (llc >> shift) >= max(floor, 2**20)}, reverse=True)
    return sizes or [max(llc // 2, 2**20)]


KNEE_STEPS = 8  # between the largest size that read at the cache's rate and the next, sizes 2^(1/8) apart


def knee_sizes(reads: dict[int, float], memory_gbs: float) -> list[int]:
    """Sizes between the largest buffer that read at the cache's rate and the next size the ladder read
    (at the memory's): where the cache gives out, the ladder's halvings are too coarse to tell. On this
    Intel guest 120 MiB read 59 GB/s and 240 MiB 37, while 130 MiB read 58 and 140 MiB 53: the int8
    step's 131 MiB sat under the 31 GB/s memory roof and read "above" it. 2 MiB multiples; the roof of a
    step between them is the read of the largest no bigger than it (engine/hardware/roof.py Roof)."""
    _, fit = cache_roof(reads, memory_gbs)
    above = min((n for n in reads if fit is not None and n > fit), default=None)
    if above is None:
        return []
    sizes = {int(fit * 2 ** (k / KNEE_STEPS)) >> 21 << 21 for k in range(1, KNEE_STEPS)}
    return sorted(n for n in sizes if fit < n < above)


def next_past_size(reads: dict[int, float], memory_gbs: float, top: int) -> int | None:
    """Twice the largest size read so far, while that one still read faster than memory (beyond
    ABOVE_ROOF_TOLERANCE) and the double is no bigger than the read probe's own buffer (`top`): a step
    that large streams part of its bytes from the cache, and its roof is a read of its size. On this
    Intel guest 240 MiB read 36.6 GB/s against the memory's 31.7, and the bf16 step (274 MB) read 107%
    of the memory roof. Only where a cache roof was found (engine/hardware/roof.py knee_curve)."""
    _, fit = cache_roof(reads, memory_gbs)
    if fit is None or reads[max(reads)] < ABOVE_ROOF_TOLERANCE * memory_gbs or 2 * max(reads) > top:
        return None
    return 2 * max(reads)


def cache_roof(reads: dict[int, float], memory_gbs: float) -> tuple[float | None, int | None]:
    """(the cache roof in GB/s, the largest size that read at it) from the cache probe's reads (bytes ->
    GB/s): the best read, and the largest buffer within CACHE_NEAR_BEST of it and CACHE_FASTER past the
    memory roof; (best, None) where no size read faster than memory (no cache roof a step can be under)."""
    if not reads:
        return None, None
    best = max(reads.values())
    fits = [n for n, gbs in reads.items() if gbs >= CACHE_NEAR_BEST * best and gbs >= CACHE_FASTER * memory_gbs]
    return best, (max(fits) if fits else None)


def l2_bytes() -> int:
    """Every core's L2 together (sysfs: cpu0's level-2 size times the cores this process may use), else 0."""
    return max((size for level, size in _sysfs_caches() if level == 2), default=0) * _cpu_core_count()


def _sysfs_caches() -> list[tuple[int, int]]:
    """(level, bytes) of each data or unified cache sysfs lists for cpu0; [] where it cannot be read."""
    found = []
    try:
        for index in Path("/sys/devices/system/cpu/cpu0/cache").glob("index*"):
            if (index / "type").read_text().strip() not in ("Unified", "Data"):
                continue
            text = (index / "size").read_text().strip()
            size = int(text[:-1]) * {"K": 2**10, "M": 2**20, "G": 2**30}[text[-1]] if text[-1] in "KMG" else int(text)
            found.append((int((index / "level").read_text()), size))
    except (OSError, ValueError, KeyError):
        return []
    return found


def cache_file() -> Path:
    """Where the roofs are kept: MEMBOUND_ROOF_CACHE, else the user's cache dir (membound/roof.json);
    the environment is read at each call (engine/options.py), so a test's temporary file is seen."""
    return EngineOptions.from_environ().roof_cache


def llc_bytes() -> int:
    """The last-level cache's size (the largest level sysfs lists for cpu0), else a guess of 32 MiB."""
    best_size = max(_sysfs_caches(), default=(-1, 0))[1]  # the highest level, its largest
    if not best_size:
        try:
            best_size = os.sysconf("SC_LEVEL3_CACHE_SIZE") or os.sysconf("SC_LEVEL2_CACHE_SIZE")
        except (ValueError, OSError, AttributeError):
            best_size = 0
    return best_size if best_size and best_size > 0 else FALLBACK_LLC_BYTES


def machine_fingerprint(threads: int) -> str:
    """What a roof depends on: the CPU (its model and flags), the cores this process may use, the
    decode step's threads, the memory installed and the cache size. Any change: measure again."""
    try:
        with open("/proc/cpuinfo") as cpuinfo:
            flags = next((line for line in cpuinfo if line.startswith(("flags", "Features"))), "")
    except OSError:
        flags = platform.processor()
    parts = (_cpu_model_name(), platform.machine(), hashlib.sha256(flags.encode()).hexdigest()[:12],
             f"{_cpu_core_count()} cores", f"{threads} threads", f"{(_ram_total_bytes() or 0) >> 20} MiB",
             f"LLC {llc_bytes() >> 10} KiB", PROBE_METHOD)
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


# A roof probed while other work ran reads low (seen: 8.9 GB/s cached while other jobs ran on 2 cores,
# where the machine alone reads 35-59), and every MBU after it reads high. Such a record is kept (the
# best there is while the machine stays busy: a busy run does not probe at every start) but measured
# again at the first start that finds the machine quiet, and the CLI's `roof` says so. Busy: other
# processes used a quarter of a core or more during the read probe (the CPU time /proc/stat counts
# beyond this process's own); where that cannot be read, the 1-minute load average before it.
BUSY_OTHER_CORES = 0.25
BUSY_LOAD_PER_CORE = 0.5


def busy(load: float | None, cores: int | None = None) -> bool:
    return load is not None and load > BUSY_LOAD_PER_CORE * (cores or os.cpu_count() or 1)


def load_now() -> float | None:
    try:
        return os.getloadavg()[0]
    except (OSError, AttributeError):
        return None


def measured_busy(record: MeasuredRoof) -> bool:
    if record.other_cores is not None:
        return record.other_cores >= BUSY_OTHER_CORES
    return busy(record.load_average)


def quiet_now(seconds: float = 0.2) -> bool:
    """Whether other processes use less than BUSY_OTHER_CORES now (a short look at /proc/stat; the
    load average where that cannot be read)."""
    before = cpu_ticks()
    time.sleep(seconds)
    others = other_cores_between(before, cpu_ticks())
    return others < BUSY_OTHER_CORES if others is not None else not busy(load_now())


def cpu_ticks() -> tuple[int, int, int] | None:
    """(the machine's busy ticks, all its ticks, this process's own ticks), or None off Linux."""
    try:
        with open("/proc/stat") as stat:
            fields = [int(v) for v in stat.readline().split()[1:9]]  # user nice system idle iowait irq softirq steal
        with open("/proc/self/stat") as own:
            mine = own.read().rsplit(")", 1)[1].split()
    except (OSError, ValueError):
        return None
    idle = fields[3] + fields[4]
    return sum(fields) - idle, sum(fields), int(mine[11]) + int(mine[12])  # utime + stime, every thread


def other_cores_between(before, after) -> float | None:
    """Cores' worth of CPU time other processes used between two cpu_ticks() readings (the steal
    of a hypervisor's other guests counts as theirs)."""
    if before is None or after is None or after[1] <= before[1]:
        return None
    others = (after[0] - before[0]) - (after[2] - before[2])
    return max(0.0, others) / (after[1] - before[1]) * (os.cpu_count() or 1)


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
    """This machine's roof: from the cache, or measured now (seconds) and cached; a cached one
    measured while the machine was busy is measured again once it is quiet."""
    threads = _decode_threads()
    if not remeasure:
        cached = cached_cpu_roof(threads)
        if cached is not None and not (measured_busy(cached) and quiet_now()):
            return cached
    record = measure_cpu_roof(threads, progress or (lambda message: None))
    _write_cache(record)
    return record


def _decode_threads() -> int:
    # the C++ step runs torch.get_num_threads() threads (engine/model/cpu_step.py)
    return torch.get_num_threads()


def measure_cpu_roof(threads: int, progress: Callable[[str], None]) -> MeasuredRoof:
    """Probe this CPU now: the C++ read and FMA loops where the library builds, PyTorch's sum and
    matmul otherwise (the method says which)."""
    llc = llc_bytes()
    fingerprint = machine_fingerprint(threads)
    load = load_now()  # before the probe's own work counts in it
    try:
        from kernels import cpu_roof as probe
        probe.load()
    except Exception as error:  # no compiler, a failed build: PyTorch's probes, said so
        probe, why = None, str(error).splitlines()[0] if str(error) else type(error).__name__
    ram = _ram_total_bytes()
    by_size: dict[str, float] = {}
    cache_gbs = cache_fit = cache_reads = None
    flops: dict[str, float] = {}
    flops_method: dict[str, str] = {}
    rounds: list[float] = []
    others = None
    if probe is not None:
        sizes = read_sizes(llc, ram)
        progress(f"measuring CPU read bandwidth ({', '.join(f'{n >> 20}' for n in sizes)} MiB, {threads} threads, "
                 f"{READ_ROUNDS} rounds)…")
        buffers = [probe.read_buffer(n) for n in sizes]
        ticks = cpu_ticks()
        huge = [fraction for _, fraction in buffers]
        for round_ in range(READ_ROUNDS):  # the sizes interleaved, so a slow spell of the host hits both
            if round_:
                time.sleep(READ_ROUND_GAP_S)
            best = 0.0
            for buffer, _ in buffers:
                gbs = buffer.nbytes / probe.read_best_s(buffer, READ_PASSES, threads) / GB
                label = f"{buffer.nbytes >> 20} MiB"
                by_size[label] = max(by_size.get(label, 0.0), gbs)
                best = max(best, gbs)
            rounds.append(round(best, 2))
        del buffers
        others = other_cores_between(ticks, cpu_ticks())
        progress("measuring CPU last-level cache read…")
        cache_by_size: dict[int, float] = {}

        def read_resident(n: int) -> None:
            resident, _ = probe.read_buffer(n)
            passes = max(READ_PASSES, int(2**30 // resident.nbytes))  # about a GiB read in all
            cache_by_size[n] = resident.nbytes / probe.read_best_s(resident, passes, threads) / GB
            del resident

        for n in cache_sizes(llc, l2_bytes()):
            read_resident(n)
        for n in knee_sizes(cache_by_size, max(by_size.values())):
            read_resident(n)
        while (n := next_past_size(cache_by_size, max(by_size.values()), max(sizes))) is not None:
            read_resident(n)
        cache_gbs, cache_fit = cache_roof(cache_by_size, max(by_size.values()))
        cache_reads = [[n, round(gbs, 2)] for n, gbs in sorted(cache_by_size.items())]
        progress("measuring CPU FMA and dot-product rates…")
        flops["fp32"], flops_method["fp32"] = probe.fma_flops(threads), "FMA loop"
        bf16 = probe.bf16_flops(threads)
        flops["bf16"], flops_method["bf16"] = (bf16, "bf16 dot loop") if bf16 else (flops["fp32"], "FMA loop")
        for kind in INT_DOT_KINDS:  # the quantised formats' products (Roof.products_peak); none: the float rate
            if rate := probe.int_dot_flops(kind, threads):
                flops[kind], flops_method[kind] = rate, f"{kind} dot loop"
        pages = "2 MiB pages" if None not in huge and min(huge) >= 0.99 else \
            "4 KiB pages" if None not in huge and max(huge) == 0 else \
            f"2 MiB pages ({'?' if None in huge else f'{100 * min(huge):.0f}%'} granted)"
        method = (f"C++ streaming read (kernels/cpu_roof.cpp, {probe.lanes() * 32}-bit vectors) on {pages}, "
                  f"best of {READ_ROUNDS} rounds of {READ_PASSES} passes a size")
    else:
        progress("measuring CPU memory bandwidth (PyTorch)…")
        by_size["256 MiB"] = measure_bandwidth_gbs("cpu", seconds=0.5)
        method = f"PyTorch sum over 256 MiB, best of its repeats (the C++ probe did not build: {why})"
    for dtype in ("fp32", "bf16"):
        progress(f"measuring CPU {dtype} matmul…")
        gemm = measure_matmul_flops("cpu", dtype, seconds=0.2)
        if gemm > flops.get(dtype, 0.0):
            flops[dtype], flops_method[dtype] = gemm, "GEMM"
    return MeasuredRoof(machine=fingerprint, measured_at=time.strftime("%Y-%m-%d %H:%M"), method=method,
                        threads=threads, llc_bytes=llc, read_gbs=max(by_size.values()),
                        read_gbs_by_size=by_size, cache_read_gbs=cache_gbs, cache_read_bytes=cache_fit,
                        cache_reads=cache_reads, flops=flops,
                        flops_method=flops_method, load_average=load, read_gbs_rounds=rounds or None,
                        other_cores=others)
