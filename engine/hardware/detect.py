"""Measuring the device at hand: `detect_device()` gives a `DeviceSpec` (peak bandwidth and FLOP/s
from the datasheet table, NVML and a short benchmark, engine/hardware/spec.py)."""
from __future__ import annotations

import math
import os
import platform
import time
from typing import Any, Callable

import torch

from engine.context import EngineContext, default_context
from engine.hardware.nvml import _as_str, _import_pynvml, _nvml_call
from engine.hardware.spec import GB, DeviceSpec, HardwareError, dtype_name, lookup_gpu

# ---------------------------------------------------------------------------------------------
# Benchmarks

_CPU_BANDWIDTH_BYTES = 256 * 2**20  # well past any L3, so the sum streams from DRAM
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


def _nvml_index_for_cuda(nvml: Any, cuda_index: int) -> int:
    """NVML enumerates every GPU, CUDA only the visible ones, maybe in another order: match by UUID."""
    uuid = getattr(torch.cuda.get_device_properties(cuda_index), "uuid", None)
    count = _nvml_call(nvml, "nvmlDeviceGetCount")
    if uuid is not None and count:
        for index in range(count):
            handle = _nvml_call(nvml, "nvmlDeviceGetHandleByIndex", index)
            nvml_uuid = _nvml_call(nvml, "nvmlDeviceGetUUID", handle) if handle is not None else None
            if nvml_uuid is not None and _as_str(nvml_uuid).removeprefix("GPU-") == str(uuid):
                return index
    return cuda_index


# ---------------------------------------------------------------------------------------------
# Detection

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


def _detect_cpu(measure: bool, progress: Callable[[str], None]) -> DeviceSpec:
    name = f"{_cpu_model_name()} ({_cpu_core_count()} cores)"
    measured_bandwidth_gbs = None
    measured_flops: dict[str, float] = {}
    if measure:
        progress("measuring CPU memory bandwidth…")
        measured_bandwidth_gbs = measure_bandwidth_gbs("cpu", seconds=0.3)
        for dtype in ("fp32", "bf16"):
            progress(f"measuring CPU {dtype} matmul…")
            measured_flops[dtype] = measure_matmul_flops("cpu", dtype, seconds=0.2)
    return DeviceSpec(
        name=name,
        kind="cpu",
        # A CPU has no datasheet figure we can trust, so its "peak" is what it achieved.
        peak_bandwidth_gbs=measured_bandwidth_gbs or 0.0,
        peak_flops=dict(measured_flops),
        measured_bandwidth_gbs=measured_bandwidth_gbs,
        measured_flops=measured_flops,
        memory_total_bytes=_ram_total_bytes(),
        source="CPU — measured bandwidth" if measure else "CPU — not measured",
    )


def _nvml_bandwidth_gbs(nvml: Any, handle: Any) -> float | None:
    """Theoretical bandwidth from max memory clock and bus width (two transfers per clock)."""
    clock_mhz = _nvml_call(nvml, "nvmlDeviceGetMaxClockInfo", handle, nvml.NVML_CLOCK_MEM)
    bus_width_bits = _nvml_call(nvml, "nvmlDeviceGetMemoryBusWidth", handle)
    if not clock_mhz or not bus_width_bits:
        return None
    return clock_mhz * 1e6 * 2 * bus_width_bits / 8 / GB


def _detect_cuda(cuda_index: int, measure: bool, progress: Callable[[str], None]) -> DeviceSpec:
    name = torch.cuda.get_device_name(cuda_index)
    memory_total_bytes = torch.cuda.get_device_properties(cuda_index).total_memory
    nvml_answered, nvml_index, nvml_bandwidth_gbs = False, None, None
    try:
        nvml = _import_pynvml()
        nvml.nvmlInit()
    except Exception:
        nvml = None
    if nvml is not None:
        try:
            nvml_index = _nvml_index_for_cuda(nvml, cuda_index)
            handle = _nvml_call(nvml, "nvmlDeviceGetHandleByIndex", nvml_index)
            if handle is not None:
                nvml_answered = True
                memory = _nvml_call(nvml, "nvmlDeviceGetMemoryInfo", handle)
                memory_total_bytes = getattr(memory, "total", None) or memory_total_bytes
                nvml_bandwidth_gbs = _nvml_bandwidth_gbs(nvml, handle)
            else:
                nvml_index = None
        finally:
            _nvml_call(nvml, "nvmlShutdown")

    sheet = lookup_gpu(name)
    measured_bandwidth_gbs = None
    measured_flops: dict[str, float] = {}
    if measure:
        device = torch.device("cuda", cuda_index)
        progress(f"measuring {name} memory bandwidth…")
        measured_bandwidth_gbs = measure_bandwidth_gbs(device, seconds=0.3)
        for dtype in ("bf16", "fp32"):
            progress(f"measuring {name} {dtype} matmul…")
            measured_flops[dtype] = measure_matmul_flops(device, dtype, seconds=0.2)

    origins = []
    if sheet is not None:
        spec_bandwidth_gbs = sheet.bandwidth_gbs
        origins.append("spec table")
    elif nvml_bandwidth_gbs is not None:
        spec_bandwidth_gbs = nvml_bandwidth_gbs
        origins.append("NVML clocks × bus width")
    else:
        spec_bandwidth_gbs = None
    # Datasheet FLOP/s where published; measured rates stand in for the rest.
    peak_flops = {**measured_flops, **(sheet.flops if sheet else {})}
    if measure:
        origins.append("measured")
    return DeviceSpec(
        name=name,
        kind="cuda",
        peak_bandwidth_gbs=spec_bandwidth_gbs or measured_bandwidth_gbs or 0.0,
        peak_flops=peak_flops,
        spec_bandwidth_gbs=spec_bandwidth_gbs,
        measured_bandwidth_gbs=measured_bandwidth_gbs,
        measured_flops=measured_flops,
        memory_total_bytes=memory_total_bytes,
        source=" + ".join(origins) or "unknown GPU, not measured",
        nvml=nvml_answered,
        nvml_index=nvml_index,
    )


def detect_device(device: str = "auto", measure: bool = True, progress: Callable[[str], None] | None = None,
                  context: EngineContext | None = None) -> DeviceSpec:
    """The DeviceSpec for "auto" (a GPU if visible, else the CPU), "cpu", "cuda" or "cuda:N".
    Measured once per context (engine/context.py; None: the process's default); later calls return
    the spec kept there."""
    requested = device.strip().lower()
    kind, _, index_text = requested.partition(":")
    if requested == "auto":
        kind = "cuda" if torch.cuda.is_available() else "cpu"
    elif kind not in ("cpu", "cuda") or (index_text and not index_text.isdigit()) or (kind == "cpu" and index_text):
        raise HardwareError(f"unknown device {device!r}; expected auto, cpu, cuda or cuda:N")
    if kind == "cuda":
        if not torch.cuda.is_available():
            raise HardwareError(f"--device {device} asked for, but no CUDA GPU is visible "
                                "(torch.cuda.is_available() is False)")
        cuda_index = int(index_text) if index_text else torch.cuda.current_device()
        if cuda_index >= torch.cuda.device_count():
            raise HardwareError(f"--device {device} asked for, but only {torch.cuda.device_count()} "
                                "CUDA GPU(s) are visible")
    else:
        cuda_index = 0
    key = (kind, cuda_index, measure)
    context = context or default_context()
    with context.devices_lock:  # the GUI worker and the CLI may both ask; measure once
        if key not in context.devices:
            report = progress or (lambda message: None)
            context.devices[key] = (_detect_cuda(cuda_index, measure, report) if kind == "cuda"
                                    else _detect_cpu(measure, report))
        return context.devices[key]
