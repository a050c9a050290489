"""What the chip can do: `detect_device()` gives a `DeviceSpec` (peak bandwidth and FLOP/s from a
datasheet table, NVML and a short benchmark); `NvmlSampler.sample()` gives live `HardwareSample`s."""
from __future__ import annotations

import math
import os
import platform
import threading
import time
from dataclasses import asdict, dataclass, field, fields
from typing import Any, Callable

import torch

GB = 1e9  # bandwidths are decimal GB/s, as on datasheets
TERA = 1e12
DTYPE_NAMES = ("fp32", "bf16", "fp16", "int8")


class HardwareError(ValueError):
    """The device asked for is not there (one-line message for the user)."""


# ---------------------------------------------------------------------------------------------
# Datasheet table


@dataclass(frozen=True)
class GpuDatasheet:
    label: str
    match_tokens: tuple[str, ...]  # all must appear among the device name's words
    bandwidth_gbs: float
    flops: dict[str, float]  # dense (no 2:4 sparsity), FLOP/s; a dtype absent = not published
    reject_tokens: tuple[str, ...] = ()  # any of these in the name = a different chip


def _tflops(**per_dtype: float) -> dict[str, float]:
    return {dtype: tflops * TERA for dtype, tflops in per_dtype.items()}


# Dense figures from NVIDIA's datasheets and whitepapers. fp32 is the non-tensor-core rate (TF32
# off); bf16/fp16 are tensor-core rates with fp32 accumulate. Order matters: the first entry whose
# tokens all match wins, so the more specific names come first.
KNOWN_GPUS: tuple[GpuDatasheet, ...] = (
    GpuDatasheet("H200 NVL", ("h200", "nvl"), 4800, _tflops(fp32=60, bf16=835.5, fp16=835.5, int8=1670.5)),
    GpuDatasheet("H200 SXM", ("h200",), 4800, _tflops(fp32=67, bf16=989.4, fp16=989.4, int8=1978.9)),
    GpuDatasheet("H100 PCIe", ("h100", "pcie"), 2000, _tflops(fp32=51.2, bf16=756.5, fp16=756.5, int8=1513)),
    GpuDatasheet("H100 NVL", ("h100", "nvl"), 3900, _tflops(fp32=60, bf16=835.5, fp16=835.5, int8=1670.5)),
    # NVML calls the SXM part "NVIDIA H100 80GB HBM3".
    GpuDatasheet("H100 SXM", ("h100",), 3350, _tflops(fp32=67, bf16=989.4, fp16=989.4, int8=1978.9)),
    GpuDatasheet("A100 80GB PCIe", ("a100", "80gb", "pcie"), 1935, _tflops(fp32=19.5, bf16=312, fp16=312, int8=624)),
    GpuDatasheet("A100 80GB SXM", ("a100", "80gb"), 2039, _tflops(fp32=19.5, bf16=312, fp16=312, int8=624)),
    # The 40GB part has the same bandwidth in both form factors.
    GpuDatasheet("A100 40GB", ("a100",), 1555, _tflops(fp32=19.5, bf16=312, fp16=312, int8=624)),
    GpuDatasheet("L40S", ("l40s",), 864, _tflops(fp32=91.6, bf16=362.05, fp16=362.05, int8=733)),
    GpuDatasheet("L40", ("l40",), 864, _tflops(fp32=90.5, bf16=181.05, fp16=181.05, int8=362.1)),
    GpuDatasheet("L4", ("l4",), 300, _tflops(fp32=30.3, bf16=121, fp16=121, int8=242.5)),
    GpuDatasheet("A10", ("a10",), 600, _tflops(fp32=31.2, bf16=125, fp16=125, int8=250)),
    # NVIDIA publishes no A10G datasheet; its FLOP/s come from the start-up measurement.
    GpuDatasheet("A10G", ("a10g",), 600, {}),
    # Turing has no bf16 tensor cores.
    GpuDatasheet("T4", ("t4",), 320, _tflops(fp32=8.1, fp16=65, int8=130)),
    # GeForce tensor cores run fp16/bf16 with fp32 accumulate at half the fp16-accumulate rate;
    # torch accumulates in fp32, so that is the rate quoted. Laptop and "D" parts differ.
    GpuDatasheet("RTX 4090", ("rtx", "4090"), 1008, _tflops(fp32=82.6, bf16=165.2, fp16=165.2, int8=660.6),
                 reject_tokens=("laptop", "d")),
    GpuDatasheet("RTX 3090", ("rtx", "3090"), 936, _tflops(fp32=35.6, bf16=71, fp16=71, int8=284),
                 reject_tokens=("laptop", "ti")),
)


def _name_tokens(device_name: str) -> set[str]:
    words = device_name.lower()
    for separator in "-_/()":
        words = words.replace(separator, " ")
    return set(words.split())


def lookup_gpu(device_name: str) -> GpuDatasheet | None:
    """The datasheet entry for an NVML/torch device name, or None for a chip not in the table."""
    tokens = _name_tokens(device_name)
    for sheet in KNOWN_GPUS:
        if all(t in tokens for t in sheet.match_tokens) and not any(t in tokens for t in sheet.reject_tokens):
            return sheet
    return None


# ---------------------------------------------------------------------------------------------
# DeviceSpec

_DTYPE_ALIASES = {
    "fp32": "fp32", "float32": "fp32", "float": "fp32",
    "bf16": "bf16", "bfloat16": "bf16",
    "fp16": "fp16", "float16": "fp16", "half": "fp16",
    "int8": "int8",
}
# Where a figure is missing, the nearest one that is a fair stand-in for it.
_FLOPS_FALLBACK = {
    "fp32": ("fp32",),
    "bf16": ("bf16", "fp16", "fp32"),
    "fp16": ("fp16", "bf16", "fp32"),
    "int8": ("int8", "bf16", "fp16", "fp32"),
}


def dtype_name(dtype: str | torch.dtype) -> str:
    """'fp32' | 'bf16' | 'fp16' | 'int8' for a torch dtype or a common spelling of one."""
    key = str(dtype).removeprefix("torch.").lower()
    if key not in _DTYPE_ALIASES:
        raise ValueError(f"unknown dtype {dtype!r}; expected one of {', '.join(DTYPE_NAMES)}")
    return _DTYPE_ALIASES[key]


@dataclass(frozen=True)
class DeviceSpec:
    """What one device can do. Plain data: safe to hand to another thread, `to_dict()` for JSON."""

    name: str
    kind: str  # "cuda" | "cpu"
    peak_bandwidth_gbs: float  # the "peak" the app draws: datasheet for a known GPU, measured on CPU
    peak_flops: dict[str, float] = field(default_factory=dict)  # dtype name -> dense FLOP/s
    spec_bandwidth_gbs: float | None = None
    measured_bandwidth_gbs: float | None = None
    measured_flops: dict[str, float] = field(default_factory=dict)
    memory_total_bytes: int | None = None
    source: str = ""
    nvml: bool = False
    nvml_index: int | None = None  # for NvmlSampler; differs from the CUDA index under CUDA_VISIBLE_DEVICES

    def peak_flops_for(self, dtype: str | torch.dtype) -> float | None:
        """Peak FLOP/s for a dtype, falling back fp16<->bf16, then fp32; None if nothing is known."""
        for candidate in _FLOPS_FALLBACK[dtype_name(dtype)]:
            if candidate in self.peak_flops:
                return self.peak_flops[candidate]
        return None

    @property
    def ridge_dtype(self) -> str | None:
        """The dtype the ridge point is quoted for: bf16 where known (what decode runs in), else fp32."""
        for candidate in ("bf16", "fp16", "fp32"):
            if candidate in self.peak_flops:
                return candidate
        return None

    @property
    def ridge_flop_per_byte(self) -> float | None:
        """Roofline ridge: peak FLOP/s of `ridge_dtype` / peak bytes/s. None if either is unknown."""
        if self.ridge_dtype is None or self.peak_bandwidth_gbs <= 0:
            return None
        return self.peak_flops[self.ridge_dtype] / (self.peak_bandwidth_gbs * GB)

    def to_dict(self) -> dict[str, Any]:
        out = asdict(self)
        out["ridge_dtype"] = self.ridge_dtype
        out["ridge_flop_per_byte"] = self.ridge_flop_per_byte
        return out

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> DeviceSpec:
        names = {f.name for f in fields(cls)}
        return cls(**{k: v for k, v in data.items() if k in names})


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


# ---------------------------------------------------------------------------------------------
# NVML


def _import_pynvml():
    import pynvml  # lazy: the engine runs on machines without it

    return pynvml


def nvml_status() -> tuple[bool, str]:
    """(True, driver and GPU count) when NVML answers, else (False, why not)."""
    try:
        nvml = _import_pynvml()
    except ImportError:
        return False, "pynvml not installed"
    try:
        nvml.nvmlInit()
    except nvml.NVMLError_LibraryNotFound:
        return False, "no NVIDIA driver (NVML library not found)"
    except nvml.NVMLError as error:
        return False, f"NVML: {error}"
    try:
        driver = nvml.nvmlSystemGetDriverVersion()
        if isinstance(driver, bytes):
            driver = driver.decode()
        return True, f"NVML driver {driver}, {nvml.nvmlDeviceGetCount()} GPU(s)"
    except nvml.NVMLError as error:
        return False, f"NVML: {error}"
    finally:
        nvml.nvmlShutdown()


def _nvml_call(nvml: Any, function_name: str, *args: Any) -> Any:
    """One NVML query, or None if it fails. Telemetry must never take the engine down, and a chip
    or driver lacking one counter (or an older pynvml lacking the function) is normal."""
    try:
        return getattr(nvml, function_name)(*args)
    except Exception:
        return None


def _as_str(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


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


@dataclass(frozen=True)
class HardwareSample:
    """One reading of the GPU's counters; None where the chip, driver or machine cannot say."""

    t_s: float  # time.monotonic()
    mem_util_pct: float | None = None  # % of time memory was busy (not % of bandwidth: see GPM)
    sm_util_pct: float | None = None  # % of time any kernel ran (not % of SMs busy)
    sm_clock_mhz: float | None = None
    mem_clock_mhz: float | None = None
    power_w: float | None = None
    memory_used_bytes: int | None = None
    memory_total_bytes: int | None = None
    # GPM (Hopper and later), over the interval since the previous sample:
    dram_bw_util_pct: float | None = None  # % of peak DRAM bandwidth actually moved
    sm_occupancy_pct: float | None = None  # resident warps / max warps
    tensor_active_pct: float | None = None  # % of time any tensor core pipe was busy

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


class NvmlSampler:
    """Reads NVML counters of one GPU (NVML index). Unavailable NVML gives all-None samples."""

    def __init__(self, device_index: int = 0):
        self.device_index = device_index
        self.available = False
        self.unavailable_reason = ""
        self._nvml: Any = None
        self._handle: Any = None
        self._gpm_buffers: list[Any] = []  # two GPM samples, alternating as previous / current
        self._gpm_current = 0
        self._gpm_have_previous = False
        self._gpm_metric_ids: tuple[int, ...] = ()
        try:
            nvml = _import_pynvml()
        except ImportError:
            self.unavailable_reason = "pynvml not installed"
            return
        try:
            nvml.nvmlInit()
        except Exception as error:
            self.unavailable_reason = ("no NVIDIA driver (NVML library not found)"
                                       if isinstance(error, getattr(nvml, "NVMLError_LibraryNotFound", ()))
                                       else f"NVML: {error}")
            return
        self._nvml = nvml
        self._handle = _nvml_call(nvml, "nvmlDeviceGetHandleByIndex", device_index)
        if self._handle is None:
            self.unavailable_reason = f"NVML: no GPU at index {device_index}"
            self.close()
            return
        self.available = True
        self._init_gpm()

    def _init_gpm(self) -> None:
        nvml = self._nvml
        support = _nvml_call(nvml, "nvmlGpmQueryDeviceSupport", self._handle)
        if not getattr(support, "isSupportedDevice", 0):
            return
        metric_names = ("NVML_GPM_METRIC_DRAM_BW_UTIL", "NVML_GPM_METRIC_SM_OCCUPANCY",
                        "NVML_GPM_METRIC_ANY_TENSOR_UTIL")
        if not all(hasattr(nvml, name) for name in metric_names):
            return  # a pynvml older than GPM
        self._gpm_metric_ids = tuple(getattr(nvml, name) for name in metric_names)
        for _ in range(2):
            buffer = _nvml_call(nvml, "nvmlGpmSampleAlloc")
            if buffer is None:
                self._free_gpm()
                return
            self._gpm_buffers.append(buffer)

    @property
    def gpm_supported(self) -> bool:
        return bool(self._gpm_buffers)

    def sample(self) -> HardwareSample:
        t_s = time.monotonic()
        if not self.available:
            return HardwareSample(t_s=t_s)
        nvml, handle = self._nvml, self._handle
        utilization = _nvml_call(nvml, "nvmlDeviceGetUtilizationRates", handle)
        power_mw = _nvml_call(nvml, "nvmlDeviceGetPowerUsage", handle)
        memory = _nvml_call(nvml, "nvmlDeviceGetMemoryInfo", handle)
        dram_bw_util_pct, sm_occupancy_pct, tensor_active_pct = self._sample_gpm()
        return HardwareSample(
            t_s=t_s,
            mem_util_pct=_float_or_none(getattr(utilization, "memory", None)),
            sm_util_pct=_float_or_none(getattr(utilization, "gpu", None)),
            sm_clock_mhz=_float_or_none(_nvml_call(nvml, "nvmlDeviceGetClockInfo", handle, nvml.NVML_CLOCK_SM)),
            mem_clock_mhz=_float_or_none(_nvml_call(nvml, "nvmlDeviceGetClockInfo", handle, nvml.NVML_CLOCK_MEM)),
            power_w=power_mw / 1e3 if power_mw is not None else None,
            memory_used_bytes=getattr(memory, "used", None),
            memory_total_bytes=getattr(memory, "total", None),
            dram_bw_util_pct=dram_bw_util_pct,
            sm_occupancy_pct=sm_occupancy_pct,
            tensor_active_pct=tensor_active_pct,
        )

    def _sample_gpm(self) -> tuple[float | None, ...]:
        """GPM metrics are rates between two snapshots: take one, diff it against the previous."""
        unknown = (None,) * 3
        if not self._gpm_buffers:
            return unknown
        nvml = self._nvml
        current = self._gpm_buffers[self._gpm_current]
        previous = self._gpm_buffers[1 - self._gpm_current]
        try:
            nvml.nvmlGpmSampleGet(self._handle, current)
        except Exception:
            return unknown  # keep the previous snapshot; the next good one diffs against it
        had_previous, self._gpm_have_previous = self._gpm_have_previous, True
        self._gpm_current = 1 - self._gpm_current
        if not had_previous:
            return unknown
        try:
            request = nvml.c_nvmlGpmMetricsGet_t()
            request.version = nvml.NVML_GPM_METRICS_GET_VERSION
            request.numMetrics = len(self._gpm_metric_ids)
            request.sample1, request.sample2 = previous, current
            for slot, metric_id in enumerate(self._gpm_metric_ids):
                request.metrics[slot].metricId = metric_id
            nvml.nvmlGpmMetricsGet(request)
        except Exception:
            return unknown
        return tuple(
            float(request.metrics[slot].value) if request.metrics[slot].nvmlReturn == nvml.NVML_SUCCESS else None
            for slot in range(len(self._gpm_metric_ids))
        )

    def _free_gpm(self) -> None:
        for buffer in self._gpm_buffers:
            _nvml_call(self._nvml, "nvmlGpmSampleFree", buffer)
        self._gpm_buffers = []
        self._gpm_have_previous = False

    def close(self) -> None:
        """Release GPM buffers and this sampler's NVML reference; safe to call twice."""
        if self._nvml is None:
            return
        self._free_gpm()
        _nvml_call(self._nvml, "nvmlShutdown")
        self._nvml, self._handle, self.available = None, None, False

    def __enter__(self) -> NvmlSampler:
        return self

    def __exit__(self, *exc_info: Any) -> None:
        self.close()


def _float_or_none(value: Any) -> float | None:
    return float(value) if value is not None else None


# ---------------------------------------------------------------------------------------------
# Detection

_SPEC_CACHE: dict[tuple[str, int, bool], DeviceSpec] = {}
_SPEC_CACHE_LOCK = threading.Lock()  # the GUI worker and the CLI may both ask; measure once


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


def detect_device(device: str = "auto", measure: bool = True,
                  progress: Callable[[str], None] | None = None) -> DeviceSpec:
    """The DeviceSpec for "auto" (a GPU if visible, else the CPU), "cpu", "cuda" or "cuda:N".
    Measured once per process; later calls return the cached spec."""
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
    with _SPEC_CACHE_LOCK:
        if key not in _SPEC_CACHE:
            report = progress or (lambda message: None)
            _SPEC_CACHE[key] = (_detect_cuda(cuda_index, measure, report) if kind == "cuda"
                                else _detect_cpu(measure, report))
        return _SPEC_CACHE[key]


def describe(spec: DeviceSpec) -> str:
    """One line for the terminal: what the device is and where its numbers come from."""
    if spec.kind == "cpu":
        if spec.measured_bandwidth_gbs is None:
            return f"CPU {spec.name} — not measured"
        line = f"CPU {spec.name} — measured bandwidth {spec.measured_bandwidth_gbs:.1f} GB/s"
        if "fp32" in spec.measured_flops:
            line += f", fp32 matmul {spec.measured_flops['fp32'] / TERA:.2f} TFLOP/s"
        return line
    parts = []
    if spec.spec_bandwidth_gbs is not None:
        parts.append(f"spec {spec.spec_bandwidth_gbs:.0f} GB/s")
    if spec.measured_bandwidth_gbs is not None:
        parts.append(f"measured {spec.measured_bandwidth_gbs:.0f} GB/s")
    ridge_dtype = spec.ridge_dtype
    if ridge_dtype is not None:
        flops = f"{ridge_dtype} {spec.peak_flops[ridge_dtype] / TERA:.0f} TFLOP/s peak"
        if ridge_dtype in spec.measured_flops:
            flops += f", {spec.measured_flops[ridge_dtype] / TERA:.0f} measured"
        parts.append(flops)
    line = f"{spec.name} — {', '.join(parts) or 'nothing known'}"
    return line + (" (NVML)" if spec.nvml else " (no NVML)")
