"""The CPU's roofs probed in C++ (kernels/cpu_roof.cpp): a multi-threaded streaming read and FMA
loops, built once per machine like the decode step (kernels/cpu_decode.py's build) and loaded with
ctypes. Each call returns the best of its passes; engine/hardware/roof.py decides what to probe."""
from __future__ import annotations

import bisect
import ctypes
import mmap
import re
import threading
from pathlib import Path
from types import MappingProxyType

from kernels.cpu_decode import FLAGS, BuildError, _build  # noqa: F401  (BuildError: the callers' to catch)

SOURCE = Path(__file__).with_name("cpu_roof.cpp")
_LANES_X_CHAINS = 16 * 8  # floats a read block holds at the widest width (AVX-512); any width divides it
CHAINS = 8  # the C++ loops' independent accumulators

HUGE_PAGE_BYTES = 2 << 20  # a transparent huge page (x86-64 and most aarch64 kernels)

_lib: ctypes.CDLL | None = None
_lock = threading.Lock()


def load() -> ctypes.CDLL:
    global _lib
    with _lock:
        if _lib is None:
            import torch  # noqa: F401  (first: its OpenMP runtime is the one the library binds to)
            lib = ctypes.CDLL(str(_build(FLAGS, SOURCE)))
            for name in ("membound_read_best_s", "membound_fma_best_s", "membound_bf16_best_s"):
                getattr(lib, name).restype = ctypes.c_double
            lib.membound_read_best_s.argtypes = [ctypes.c_void_p, ctypes.c_int64, ctypes.c_int64, ctypes.c_int64,
                                                 ctypes.POINTER(ctypes.c_float)]
            for name in ("membound_fma_best_s", "membound_bf16_best_s"):
                getattr(lib, name).argtypes = [ctypes.c_int64, ctypes.c_int64, ctypes.c_int64,
                                               ctypes.POINTER(ctypes.c_float)]
            lib.membound_bf16_flops_per_iter.restype = ctypes.c_int64
            lib.membound_int_dot_best_s.restype = ctypes.c_double
            lib.membound_int_dot_best_s.argtypes = [ctypes.c_int64, ctypes.c_int64, ctypes.c_int64, ctypes.c_int64,
                                                    ctypes.POINTER(ctypes.c_float)]
            lib.membound_int_dot_flops_per_iter.restype = ctypes.c_int64
            lib.membound_int_dot_flops_per_iter.argtypes = [ctypes.c_int64]
            lib.membound_roof_lanes.restype = ctypes.c_int64
            _lib = lib
        return _lib


def lanes() -> int:
    """fp32 lanes of the vector width the library was built for (16 AVX-512, 8 AVX2, 4 NEON/SSE)."""
    return int(load().membound_roof_lanes())


def read_best_s(buffer, repeats: int, threads: int) -> float:
    """Best seconds of one pass reading `buffer` (a float32 CPU tensor, 64-byte aligned, its length a
    multiple of 128) with `threads` threads, over `repeats` passes after a first one."""
    n = buffer.numel() - buffer.numel() % _LANES_X_CHAINS
    sink = ctypes.c_float()
    return load().membound_read_best_s(buffer.data_ptr(), n, repeats, threads, ctypes.byref(sink))


def fma_flops(threads: int, iters: int = 2_000_000, repeats: int = 5) -> float:
    """FLOP/s of independent fp32 vector FMAs on `threads` threads (2 FLOPs each multiply-add)."""
    sink = ctypes.c_float()
    best_s = load().membound_fma_best_s(iters, repeats, threads, ctypes.byref(sink))
    return 2 * lanes() * CHAINS * iters * threads / best_s


def bf16_flops(threads: int, iters: int = 2_000_000, repeats: int = 5) -> float | None:
    """FLOP/s of bf16 dot-product instructions (AVX-512 BF16), None where the machine has none."""
    lib = load()
    per_iter = lib.membound_bf16_flops_per_iter()
    if per_iter <= 0:
        return None
    sink = ctypes.c_float()
    best_s = lib.membound_bf16_best_s(iters, repeats, threads, ctypes.byref(sink))
    return per_iter * iters * threads / best_s if best_s > 0 else None


INT_DOT_BITS = MappingProxyType({"int8": 8, "int16": 16})  # the integer products the decode step's formats run (cpu_roof.cpp)


def int_dot_flops(kind: str, threads: int, iters: int = 2_000_000, repeats: int = 5) -> float | None:
    """FLOP/s (2 a multiply-add) of the integer dot-product instructions `kind` names ("int8": bytes
    multiplied into int32 or int16 lanes, as INT4 runs everywhere and INT8 on Arm; "int16": int16
    pairs, as INT8 runs on x86), None where the machine has none."""
    lib = load()
    per_iter = lib.membound_int_dot_flops_per_iter(INT_DOT_BITS[kind])
    if per_iter <= 0:
        return None
    sink = ctypes.c_float()
    best_s = lib.membound_int_dot_best_s(INT_DOT_BITS[kind], iters, repeats, threads, ctypes.byref(sink))
    return per_iter * iters * threads / best_s if best_s > 0 else None


def huge_buffer(n_bytes: int):
    """A uint8 tensor of `n_bytes`, 2 MiB aligned, advised MADV_HUGEPAGE before its first touch, on an
    anonymous map of its own (Linux); None where the platform has no such advice. Not touched: the
    kernel backs each 2 MiB page with a huge page when it is first written, where it grants them."""
    import torch
    advice = getattr(mmap, "MADV_HUGEPAGE", None)
    anonymous = getattr(mmap, "MAP_ANONYMOUS", None)
    if advice is None or anonymous is None:
        return None
    region = mmap.mmap(-1, n_bytes + HUGE_PAGE_BYTES, flags=mmap.MAP_PRIVATE | anonymous)
    base = ctypes.addressof(ctypes.c_char.from_buffer(region))  # (the export ends with the statement)
    offset = -base % HUGE_PAGE_BYTES
    try:
        region.madvise(advice, offset, n_bytes)
    except OSError:  # a kernel without transparent huge pages: 4 KiB pages
        pass
    return torch.frombuffer(region, dtype=torch.uint8, offset=offset, count=n_bytes)  # keeps `region`


def read_buffer(n_bytes: int):
    """A float32 buffer of `n_bytes` for the read probe, every page touched, and the fraction of it on
    huge pages (None where that cannot be read). Linux: huge_buffer, so the probe streams memory
    rather than the page walks of 4 KiB pages (under a hypervisor each TLB miss walks two page
    tables: on this project's KVM machine 4 KiB pages read 20-33 GB/s, 2 MiB pages 35-61,
    docs/benchmarks.md). Elsewhere: a plain tensor."""
    import torch
    raw = huge_buffer(n_bytes)
    if raw is None:
        return torch.ones(n_bytes // 4, dtype=torch.float32), None
    buffer = raw[:n_bytes // 4 * 4].view(torch.float32)
    buffer.fill_(1.0)  # the first touch: the pages are faulted in here, not in a timed pass
    return buffer, huge_page_fraction(buffer.data_ptr(), n_bytes)


def huge_page_share(spans) -> tuple[float, bool] | None:
    """The share of the memory `spans` (address, bytes) — say, a model's weights — that the kernel
    backs with huge pages, from /proc/self/smaps, which counts them per mapping: a mapping's huge
    pages are charged to the spans inside it, at most their bytes. Exact where the spans fill their
    mappings (PyTorch maps each big tensor alone); where a mapping also holds other memory (the heap)
    its huge pages may be another's, so the share is an upper bound: (share, exact). None where smaps
    cannot be read or no mapping holds them."""
    maps, huge, rss = [], {}, {}
    try:
        with open("/proc/self/smaps") as smaps:
            for line in smaps:
                span = re.match(r"([0-9a-f]+)-([0-9a-f]+) ", line)
                if span:
                    maps.append((int(span[1], 16), int(span[2], 16)))
                elif line.startswith(("Rss:", "AnonHugePages:")):
                    (rss if line[0] == "R" else huge)[maps[-1]] = int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        return None
    starts, held = [a for a, _ in maps], {}
    for address, n_bytes in spans:
        i = bisect.bisect_right(starts, address) - 1
        if i >= 0 and address < maps[i][1]:
            held[maps[i]] = held.get(maps[i], 0) + min(n_bytes, maps[i][1] - address)
    total = sum(held.values())
    if not total:
        return None
    share = sum(min(huge.get(m, 0), n) for m, n in held.items()) / total
    return share, all(n >= 0.99 * rss.get(m, 0) for m, n in held.items())


def huge_page_fraction(address: int, n_bytes: int) -> float | None:
    """The fraction of `n_bytes` from `address` the kernel backs with huge pages (AnonHugePages of
    the mapping that holds it, /proc/self/smaps); None where smaps cannot be read."""
    try:
        with open("/proc/self/smaps") as smaps:
            inside = False
            for line in smaps:
                span = re.match(r"([0-9a-f]+)-([0-9a-f]+) ", line)
                if span:
                    inside = int(span[1], 16) <= address < int(span[2], 16)
                elif inside and line.startswith("AnonHugePages:"):
                    return min(1.0, int(line.split()[1]) * 1024 / n_bytes)
    except (OSError, ValueError):
        return None
    return None
