"""Live GPU counters through NVML (and GPM on Hopper and later), torch-free: `NvmlSampler.sample()`
gives `HardwareSample`s; a machine without NVML gives all-None samples, never an error."""
from __future__ import annotations

import time
from dataclasses import asdict, dataclass
from typing import Any

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

    def clocks(self) -> dict[str, Any]:
        """The chip's state for a benchmark record: current and maximum clocks, power and its
        limit, temperature, the active clock-limiting reasons (NVML bit mask) and the MIG mode."""
        if not self.available:
            return {"available": False, "reason": self.unavailable_reason}
        nvml, handle = self._nvml, self._handle
        clock = getattr(nvml, "NVML_CLOCK_SM", 1), getattr(nvml, "NVML_CLOCK_MEM", 2)
        power_mw = _nvml_call(nvml, "nvmlDeviceGetPowerUsage", handle)
        limit_mw = _nvml_call(nvml, "nvmlDeviceGetEnforcedPowerLimit", handle)
        reasons = _nvml_call(nvml, "nvmlDeviceGetCurrentClocksEventReasons", handle)
        if reasons is None:  # the older name of the same query
            reasons = _nvml_call(nvml, "nvmlDeviceGetCurrentClocksThrottleReasons", handle)
        mig = _nvml_call(nvml, "nvmlDeviceGetMigMode", handle)
        return {
            "available": True,
            "sm_clock_mhz": _nvml_call(nvml, "nvmlDeviceGetClockInfo", handle, clock[0]),
            "mem_clock_mhz": _nvml_call(nvml, "nvmlDeviceGetClockInfo", handle, clock[1]),
            "max_sm_clock_mhz": _nvml_call(nvml, "nvmlDeviceGetMaxClockInfo", handle, clock[0]),
            "max_mem_clock_mhz": _nvml_call(nvml, "nvmlDeviceGetMaxClockInfo", handle, clock[1]),
            "power_w": power_mw / 1e3 if power_mw is not None else None,
            "power_limit_w": limit_mw / 1e3 if limit_mw is not None else None,
            "temperature_c": _nvml_call(nvml, "nvmlDeviceGetTemperature", handle,
                                        getattr(nvml, "NVML_TEMPERATURE_GPU", 0)),
            "clock_event_reasons": reasons,
            "mig_mode": list(mig) if isinstance(mig, (list, tuple)) else mig,  # [current, pending]
        }

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
