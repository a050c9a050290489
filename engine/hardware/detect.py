"""Measuring the device at hand: `detect_device()` gives a `DeviceSpec` (peak bandwidth and FLOP/s
from the datasheet table, NVML and a short benchmark, engine/hardware/spec.py)."""
from __future__ import annotations

from typing import Any, Callable

import torch

from engine.context import EngineContext, default_context
from engine.hardware.nvml import _as_str, _import_pynvml, _nvml_call
from engine.hardware.probe import (  # noqa: F401  (the benchmarks lived here; callers still find them here)
    _best_seconds_per_call,
    _cpu_core_count,
    _cpu_model_name,
    _ram_total_bytes,
    cpu_roof,
    measure_bandwidth_gbs,
    measure_matmul_flops,
)
from engine.hardware.spec import GB, DeviceSpec, HardwareError, lookup_gpu


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



def _detect_cpu(measure: bool, progress: Callable[[str], None], remeasure: bool = False) -> DeviceSpec:
    """A CPU's roof comes from engine/hardware/roof.py: measured once per machine and cached."""
    name = f"{_cpu_model_name()} ({_cpu_core_count()} cores)"
    if not measure:
        return DeviceSpec(name=name, kind="cpu", peak_bandwidth_gbs=0.0, memory_total_bytes=_ram_total_bytes(),
                          source="CPU — not measured")
    roof = cpu_roof(remeasure=remeasure, progress=progress)
    return DeviceSpec(
        name=name,
        kind="cpu",
        # A CPU has no datasheet figure we can trust, so its "peak" is what its probe achieved.
        peak_bandwidth_gbs=roof.read_gbs,
        peak_flops=dict(roof.flops),
        measured_bandwidth_gbs=roof.read_gbs,
        measured_flops=dict(roof.flops),
        memory_total_bytes=_ram_total_bytes(),
        source=f"CPU — measured roof ({roof.method})",
        # a cache roof only where some size read faster than memory, and only for steps that fit that size
        cache_bandwidth_gbs=roof.cache_read_gbs if roof.cache_read_bytes else None,
        cache_bytes=roof.cache_read_bytes,
        cache_knee=tuple(roof.cache_knee()) if roof.cache_read_bytes else (),
        measured_at=roof.measured_at,
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
