"""engine.hardware: datasheet lookups, CPU measurement, the no-GPU errors, and the NVML sampler
driven through a fake pynvml module so its GPU code paths run on a CPU-only machine."""
from __future__ import annotations

import dataclasses
import os
import sys
import types

import pytest
import torch

from engine.context import EngineContext, reset_default_context
from engine.hardware import detect as hardware
from engine.hardware.detect import detect_device
from engine.hardware.nvml import HardwareSample, NvmlSampler, nvml_status
from engine.hardware.spec import DTYPE_NAMES, KNOWN_GPUS, TERA, DeviceSpec, HardwareError, describe, lookup_gpu

# --------------------------------------------------------------------------------------------
# Datasheet table


@pytest.mark.parametrize("device_name, label, bandwidth_gbs", [
    ("NVIDIA H200", "H200 SXM", 4800),
    ("NVIDIA H200 NVL", "H200 NVL", 4800),
    ("NVIDIA H100 80GB HBM3", "H100 SXM", 3350),
    ("NVIDIA H100 PCIe", "H100 PCIe", 2000),
    ("NVIDIA H100 NVL", "H100 NVL", 3900),
    ("NVIDIA A100-SXM4-80GB", "A100 80GB SXM", 2039),
    ("NVIDIA A100 80GB PCIe", "A100 80GB PCIe", 1935),
    ("NVIDIA A100-SXM4-40GB", "A100 40GB", 1555),
    ("NVIDIA A100-PCIE-40GB", "A100 40GB", 1555),
    ("NVIDIA L4", "L4", 300),
    ("NVIDIA L40S", "L40S", 864),
    ("NVIDIA L40", "L40", 864),
    ("NVIDIA A10G", "A10G", 600),
    ("NVIDIA A10", "A10", 600),
    ("Tesla T4", "T4", 320),
    ("NVIDIA GeForce RTX 4090", "RTX 4090", 1008),
    ("NVIDIA GeForce RTX 3090", "RTX 3090", 936),
])
def test_lookup_gpu_finds_the_most_specific_entry(device_name, label, bandwidth_gbs):
    sheet = lookup_gpu(device_name)
    assert sheet is not None
    assert (sheet.label, sheet.bandwidth_gbs) == (label, bandwidth_gbs)


def test_h100_pcie_gets_pcie_figures_not_sxm():
    pcie, sxm = lookup_gpu("NVIDIA H100 PCIe"), lookup_gpu("NVIDIA H100 80GB HBM3")
    assert pcie.flops["bf16"] == pytest.approx(756.5 * TERA)
    assert sxm.flops["bf16"] == pytest.approx(989.4 * TERA)
    assert pcie.bandwidth_gbs < sxm.bandwidth_gbs


def test_datasheet_flops_are_dense():
    h200, a100, l4 = lookup_gpu("NVIDIA H200"), lookup_gpu("NVIDIA A100-SXM4-80GB"), lookup_gpu("NVIDIA L4")
    assert (h200.flops["bf16"], h200.flops["fp32"], h200.flops["int8"]) == pytest.approx(
        (989.4 * TERA, 67 * TERA, 1978.9 * TERA))
    assert (a100.flops["bf16"], a100.flops["fp32"], a100.flops["int8"]) == pytest.approx(
        (312 * TERA, 19.5 * TERA, 624 * TERA))
    assert (l4.flops["bf16"], l4.flops["int8"]) == pytest.approx((121 * TERA, 242.5 * TERA))


@pytest.mark.parametrize("device_name", [
    "NVIDIA GeForce RTX 4090 Laptop GPU", "NVIDIA GeForce RTX 4090 D", "NVIDIA GeForce RTX 3090 Ti",
    "NVIDIA GH200 480GB", "Radeon RX 7900 XTX", "",
])
def test_lookup_gpu_unknown_is_none(device_name):
    assert lookup_gpu(device_name) is None


@pytest.mark.parametrize("sheet", KNOWN_GPUS, ids=lambda sheet: sheet.label)
def test_every_table_entry_is_reachable_and_consistent(sheet):
    # An entry shadowed by a less specific one above it would never be returned.
    assert lookup_gpu(f"NVIDIA {sheet.label}") is sheet
    assert set(sheet.flops) <= set(DTYPE_NAMES)
    if "fp32" in sheet.flops and "fp16" in sheet.flops:
        assert sheet.flops["fp32"] < sheet.flops["fp16"] < sheet.flops["int8"]


# --------------------------------------------------------------------------------------------
# DeviceSpec


def make_spec(**overrides) -> DeviceSpec:
    values = dict(name="test GPU", kind="cuda", peak_bandwidth_gbs=2000.0,
                  peak_flops={"fp32": 20 * TERA, "bf16": 300 * TERA})
    return DeviceSpec(**{**values, **overrides})


def test_peak_flops_for_falls_back_between_half_precisions():
    spec = make_spec()
    assert spec.peak_flops_for("bf16") == 300 * TERA
    assert spec.peak_flops_for("fp16") == 300 * TERA
    assert spec.peak_flops_for(torch.float16) == 300 * TERA
    assert spec.peak_flops_for("int8") == 300 * TERA
    assert spec.peak_flops_for("float32") == 20 * TERA
    assert make_spec(peak_flops={"fp32": 20 * TERA}).peak_flops_for("bf16") == 20 * TERA
    assert make_spec(peak_flops={}).peak_flops_for("bf16") is None
    with pytest.raises(ValueError, match="unknown dtype"):
        spec.peak_flops_for("fp8")


def test_ridge_point_uses_bf16_then_fp32():
    assert make_spec().ridge_dtype == "bf16"
    assert make_spec().ridge_flop_per_byte == pytest.approx(300e12 / 2000e9)
    fp32_only = make_spec(peak_flops={"fp32": 20 * TERA})
    assert (fp32_only.ridge_dtype, fp32_only.ridge_flop_per_byte) == ("fp32", pytest.approx(10.0))
    assert make_spec(peak_flops={}).ridge_flop_per_byte is None
    assert make_spec(peak_bandwidth_gbs=0.0).ridge_flop_per_byte is None


def test_device_spec_is_frozen_plain_data():
    spec = make_spec(measured_flops={"bf16": 250 * TERA}, nvml=True)
    with pytest.raises(dataclasses.FrozenInstanceError):
        spec.name = "other"
    data = spec.to_dict()
    assert data["ridge_flop_per_byte"] == pytest.approx(150.0)
    assert DeviceSpec.from_dict(data) == spec


# --------------------------------------------------------------------------------------------
# CPU detection and the no-GPU errors (valid on a GPU machine too: CUDA is hidden where it matters)


@pytest.fixture(scope="module")
def cpu_spec_and_progress(tmp_path_factory):
    messages: list[str] = []  # a context of its own: measured here, so progress is reported
    context = EngineContext()
    saved = os.environ["MEMBOUND_ROOF_CACHE"]
    os.environ["MEMBOUND_ROOF_CACHE"] = str(tmp_path_factory.mktemp("roof") / "roof.json")  # nothing cached yet
    try:
        yield detect_device("cpu", progress=messages.append, context=context), messages, context
    finally:
        os.environ["MEMBOUND_ROOF_CACHE"] = saved


def test_detect_cpu_measures_the_cpu(cpu_spec_and_progress):
    spec, messages, _ = cpu_spec_and_progress
    assert spec.kind == "cpu"
    assert 1 < spec.measured_bandwidth_gbs < 1000
    assert spec.peak_bandwidth_gbs == spec.measured_bandwidth_gbs
    assert spec.spec_bandwidth_gbs is None and not spec.nvml
    assert "CPU" in spec.source and "C++ streaming read" in spec.source and spec.measured_at
    assert spec.measured_flops["fp32"] > 0 and spec.peak_flops_for("bf16") > 0
    assert spec.ridge_flop_per_byte > 0
    assert any("bandwidth" in message for message in messages)
    line = describe(spec)
    assert line.startswith("CPU ") and "GB/s" in line and "\n" not in line


def test_detect_cpu_is_cached(cpu_spec_and_progress):
    spec, _, context = cpu_spec_and_progress
    again: list[str] = []
    assert detect_device("cpu", progress=again.append, context=context) is spec  # measured once per context
    assert again == []


def test_detect_auto_without_gpu_is_cpu(cpu_spec_and_progress, monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert detect_device("auto", context=cpu_spec_and_progress[2]) is cpu_spec_and_progress[0]


@pytest.mark.parametrize("device", ["cuda", "cuda:0"])
def test_detect_cuda_without_gpu_raises_one_line(device, monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    with pytest.raises(HardwareError, match="no CUDA GPU is visible") as caught:
        detect_device(device)
    assert isinstance(caught.value, ValueError)
    assert "\n" not in str(caught.value)


@pytest.mark.parametrize("device", ["tpu", "cpu:1", "cuda:x"])
def test_detect_unknown_device_raises(device):
    with pytest.raises(HardwareError, match="unknown device"):
        detect_device(device)


def test_measure_matmul_rejects_int8():
    with pytest.raises(ValueError, match="int8"):
        hardware.measure_matmul_flops("cpu", "int8")


def test_real_nvml_absent_here():
    available, reason = nvml_status()
    if available:
        pytest.skip(f"NVML answers on this machine ({reason})")
    assert reason
    sampler = NvmlSampler(0)
    assert not sampler.available and sampler.unavailable_reason
    assert_all_none(sampler.sample())
    sampler.close()


# --------------------------------------------------------------------------------------------
# NVML through a fake pynvml


def assert_all_none(sample: HardwareSample) -> None:
    assert sample.t_s > 0
    assert all(getattr(sample, f.name) is None for f in dataclasses.fields(sample) if f.name != "t_s")


class FakeGpmSample:
    snapshot: dict | None = None


class FakeGpmMetric:
    def __init__(self):
        self.metricId, self.nvmlReturn, self.value = 0, -1, 0.0


class FakeGpmMetricsGet:
    def __init__(self):
        self.version = self.numMetrics = 0
        self.sample1 = self.sample2 = None
        self.metrics = [FakeGpmMetric() for _ in range(8)]


def make_fake_pynvml(gpm: bool = True) -> types.ModuleType:
    """A pynvml with two GPUs, cumulative counters the test advances, and GPM that turns two
    snapshots into rates like the real one: DRAM bandwidth and tensor activity, no SM occupancy."""
    nvml = types.ModuleType("pynvml")

    class NVMLError(Exception):
        pass

    class NVMLError_LibraryNotFound(NVMLError):
        pass

    nvml.NVMLError, nvml.NVMLError_LibraryNotFound = NVMLError, NVMLError_LibraryNotFound
    nvml.NVML_SUCCESS, nvml.NVML_ERROR_NOT_SUPPORTED = 0, 3
    nvml.NVML_CLOCK_SM, nvml.NVML_CLOCK_MEM = 1, 2
    nvml.NVML_GPM_METRIC_SM_OCCUPANCY, nvml.NVML_GPM_METRIC_ANY_TENSOR_UTIL = 3, 5
    nvml.NVML_GPM_METRIC_DRAM_BW_UTIL = 10
    nvml.NVML_GPM_METRICS_GET_VERSION = 1
    nvml.c_nvmlGpmMetricsGet_t = FakeGpmMetricsGet
    nvml.init_count = 0
    nvml.freed_samples = 0
    nvml.counters = {"elapsed_s": 0.0, "dram_bytes": 0.0, "tensor_busy_s": 0.0}
    nvml.peak_dram_bytes_per_s = 4.8e12
    uuids = ["GPU-00000000-0000-0000-0000-000000000000", "GPU-11111111-2222-3333-4444-555555555555"]

    def init():
        nvml.init_count += 1

    def shutdown():
        nvml.init_count -= 1

    def handle_by_index(index):
        if not 0 <= index < len(uuids):
            raise NVMLError("Invalid Argument")
        return ("handle", index)

    def clock_info(handle, clock_type):
        return {nvml.NVML_CLOCK_SM: 1980, nvml.NVML_CLOCK_MEM: 2619}[clock_type]

    def gpm_sample_get(handle, sample):
        sample.snapshot = dict(nvml.counters)
        return sample

    def gpm_metrics_get(request):
        first, second = request.sample1.snapshot, request.sample2.snapshot
        elapsed_s = second["elapsed_s"] - first["elapsed_s"]
        rates = {
            nvml.NVML_GPM_METRIC_DRAM_BW_UTIL:
                100 * (second["dram_bytes"] - first["dram_bytes"]) / (elapsed_s * nvml.peak_dram_bytes_per_s),
            nvml.NVML_GPM_METRIC_ANY_TENSOR_UTIL:
                100 * (second["tensor_busy_s"] - first["tensor_busy_s"]) / elapsed_s,
        }
        for metric in request.metrics[:request.numMetrics]:
            if metric.metricId in rates:
                metric.nvmlReturn, metric.value = nvml.NVML_SUCCESS, rates[metric.metricId]
            else:
                metric.nvmlReturn = nvml.NVML_ERROR_NOT_SUPPORTED
        return request

    def gpm_sample_free(sample):
        nvml.freed_samples += 1

    nvml.nvmlInit, nvml.nvmlShutdown = init, shutdown
    nvml.nvmlSystemGetDriverVersion = lambda: "550.54.15"
    nvml.nvmlDeviceGetCount = lambda: len(uuids)
    nvml.nvmlDeviceGetHandleByIndex = handle_by_index
    nvml.nvmlDeviceGetUUID = lambda handle: uuids[handle[1]]
    nvml.nvmlDeviceGetUtilizationRates = lambda handle: types.SimpleNamespace(gpu=97, memory=81)
    nvml.nvmlDeviceGetClockInfo = clock_info
    nvml.nvmlDeviceGetMaxClockInfo = clock_info
    nvml.nvmlDeviceGetMemoryBusWidth = lambda handle: 5120
    nvml.nvmlDeviceGetPowerUsage = lambda handle: 612_345  # milliwatts
    nvml.nvmlDeviceGetMemoryInfo = lambda handle: types.SimpleNamespace(
        used=40 * 2**30, total=141 * 2**30, free=101 * 2**30)
    nvml.nvmlGpmQueryDeviceSupport = lambda handle: types.SimpleNamespace(isSupportedDevice=int(gpm))
    nvml.nvmlGpmSampleAlloc = FakeGpmSample
    nvml.nvmlGpmSampleGet = gpm_sample_get
    nvml.nvmlGpmMetricsGet = gpm_metrics_get
    nvml.nvmlGpmSampleFree = gpm_sample_free
    return nvml


@pytest.fixture
def fake_nvml(monkeypatch):
    nvml = make_fake_pynvml()
    monkeypatch.setitem(sys.modules, "pynvml", nvml)
    return nvml


def advance(nvml, seconds: float, dram_bytes: float, tensor_busy_s: float) -> None:
    nvml.counters["elapsed_s"] += seconds
    nvml.counters["dram_bytes"] += dram_bytes
    nvml.counters["tensor_busy_s"] += tensor_busy_s


def test_sampler_reads_nvml_counters(fake_nvml):
    sampler = NvmlSampler(0)
    assert sampler.available and sampler.gpm_supported
    sample = sampler.sample()
    assert (sample.sm_util_pct, sample.mem_util_pct) == (97.0, 81.0)
    assert (sample.sm_clock_mhz, sample.mem_clock_mhz) == (1980.0, 2619.0)
    assert sample.power_w == pytest.approx(612.345)
    assert (sample.memory_used_bytes, sample.memory_total_bytes) == (40 * 2**30, 141 * 2**30)
    sampler.close()


def test_sampler_gpm_metrics_are_rates_between_consecutive_samples(fake_nvml):
    sampler = NvmlSampler(0)
    first = sampler.sample()
    assert first.dram_bw_util_pct is None and first.tensor_active_pct is None  # nothing to diff yet

    advance(fake_nvml, seconds=0.1, dram_bytes=0.1 * 3.6e12, tensor_busy_s=0.02)
    second = sampler.sample()
    assert second.dram_bw_util_pct == pytest.approx(75.0)
    assert second.tensor_active_pct == pytest.approx(20.0)
    assert second.sm_occupancy_pct is None  # the fake GPU does not report it

    # The next rate covers only the interval since `second`, not since `first`.
    advance(fake_nvml, seconds=0.2, dram_bytes=0.2 * 1.2e12, tensor_busy_s=0.0)
    third = sampler.sample()
    assert third.dram_bw_util_pct == pytest.approx(25.0)
    assert third.tensor_active_pct == pytest.approx(0.0)
    sampler.close()


def test_sampler_gpm_failed_snapshot_keeps_the_previous_one(fake_nvml, monkeypatch):
    sampler = NvmlSampler(0)
    sampler.sample()
    advance(fake_nvml, seconds=0.1, dram_bytes=0.1 * 4.8e12, tensor_busy_s=0.1)

    def fail(handle, sample):
        raise fake_nvml.NVMLError("GPU is lost")

    good_get = fake_nvml.nvmlGpmSampleGet
    monkeypatch.setattr(fake_nvml, "nvmlGpmSampleGet", fail)
    assert sampler.sample().dram_bw_util_pct is None
    monkeypatch.setattr(fake_nvml, "nvmlGpmSampleGet", good_get)
    advance(fake_nvml, seconds=0.1, dram_bytes=0.0, tensor_busy_s=0.0)
    assert sampler.sample().dram_bw_util_pct == pytest.approx(50.0)  # over both intervals
    sampler.close()


def test_sampler_failing_calls_give_none_not_exceptions(fake_nvml):
    def fail(*args):
        raise fake_nvml.NVMLError("Not Supported")

    for name in ("nvmlDeviceGetUtilizationRates", "nvmlDeviceGetPowerUsage", "nvmlGpmMetricsGet"):
        setattr(fake_nvml, name, fail)
    del fake_nvml.nvmlDeviceGetClockInfo  # an older pynvml without the function
    sampler = NvmlSampler(0)
    sampler.sample()
    sample = sampler.sample()
    assert sample.sm_util_pct is None and sample.power_w is None and sample.sm_clock_mhz is None
    assert sample.dram_bw_util_pct is None
    assert sample.memory_total_bytes == 141 * 2**30
    sampler.close()


def test_sampler_without_gpm_support(monkeypatch):
    nvml = make_fake_pynvml(gpm=False)
    monkeypatch.setitem(sys.modules, "pynvml", nvml)
    sampler = NvmlSampler(0)
    assert sampler.available and not sampler.gpm_supported
    sampler.sample()
    sample = sampler.sample()
    assert sample.sm_util_pct == 97.0 and sample.dram_bw_util_pct is None
    sampler.close()


def test_sampler_close_releases_everything_once(fake_nvml):
    sampler = NvmlSampler(0)
    assert fake_nvml.init_count == 1
    sampler.sample()
    sampler.close()
    sampler.close()
    assert (fake_nvml.init_count, fake_nvml.freed_samples) == (0, 2)
    assert not sampler.available
    assert_all_none(sampler.sample())


def test_sampler_bad_index_is_unavailable(fake_nvml):
    sampler = NvmlSampler(7)
    assert not sampler.available and "index 7" in sampler.unavailable_reason
    assert fake_nvml.init_count == 0
    assert_all_none(sampler.sample())


def test_sampler_without_driver_or_pynvml(fake_nvml, monkeypatch):
    def no_library():
        raise fake_nvml.NVMLError_LibraryNotFound("NVML Shared Library Not Found")

    monkeypatch.setattr(fake_nvml, "nvmlInit", no_library)
    sampler = NvmlSampler(0)
    assert not sampler.available and "NVML library not found" in sampler.unavailable_reason
    assert_all_none(sampler.sample())

    monkeypatch.setitem(sys.modules, "pynvml", None)  # makes `import pynvml` raise ImportError
    sampler = NvmlSampler(0)
    assert (sampler.available, sampler.unavailable_reason) == (False, "pynvml not installed")
    assert_all_none(sampler.sample())


def test_nvml_status_reasons(fake_nvml, monkeypatch):
    assert nvml_status() == (True, "NVML driver 550.54.15, 2 GPU(s)")
    assert fake_nvml.init_count == 0

    def raise_on_init(error):
        def init():
            raise error
        return init

    monkeypatch.setattr(fake_nvml, "nvmlInit", raise_on_init(fake_nvml.NVMLError_LibraryNotFound()))
    assert nvml_status() == (False, "no NVIDIA driver (NVML library not found)")
    monkeypatch.setattr(fake_nvml, "nvmlInit", raise_on_init(fake_nvml.NVMLError("Driver Not Loaded")))
    assert nvml_status() == (False, "NVML: Driver Not Loaded")
    monkeypatch.setitem(sys.modules, "pynvml", None)
    assert nvml_status() == (False, "pynvml not installed")


# --------------------------------------------------------------------------------------------
# GPU detection without a GPU: torch.cuda and pynvml both faked, measurement off


@pytest.fixture
def fake_cuda(fake_nvml, monkeypatch):
    """torch sees one GPU: NVML's second device (as under CUDA_VISIBLE_DEVICES=1)."""
    device = types.SimpleNamespace(name="NVIDIA H200", total_memory=140 * 2**30,
                                   uuid="11111111-2222-3333-4444-555555555555")
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 1)
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 0)
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda index=0: device.name)
    monkeypatch.setattr(torch.cuda, "get_device_properties", lambda index=0: device)
    reset_default_context()  # nothing measured before the fake GPU came (tests/conftest.py resets it after)
    return device


def test_detect_known_gpu_uses_the_datasheet_and_nvml(fake_cuda, fake_nvml):
    spec = detect_device("cuda", measure=False)
    assert (spec.kind, spec.name, spec.nvml, spec.nvml_index) == ("cuda", "NVIDIA H200", True, 1)
    assert spec.peak_bandwidth_gbs == spec.spec_bandwidth_gbs == 4800
    assert spec.peak_flops_for("bf16") == pytest.approx(989.4 * TERA)
    assert spec.memory_total_bytes == 141 * 2**30  # NVML's figure over torch's
    assert spec.source == "spec table" and spec.measured_bandwidth_gbs is None
    assert fake_nvml.init_count == 0
    line = describe(spec)
    assert "NVIDIA H200" in line and "spec 4800 GB/s" in line and line.endswith("(NVML)")
    assert detect_device("auto", measure=False) is spec


def test_detect_unknown_gpu_derives_bandwidth_from_nvml_clocks(fake_cuda):
    fake_cuda.name = "NVIDIA Future GPU"
    spec = detect_device("cuda:0", measure=False)
    # 2619 MHz x 2 transfers x 5120 bits / 8 = 3352 GB/s, an H100 SXM's memory system.
    assert spec.spec_bandwidth_gbs == pytest.approx(3352.32)
    assert spec.source == "NVML clocks × bus width"
    assert spec.peak_flops == {} and spec.ridge_flop_per_byte is None


def test_detect_gpu_without_nvml(fake_cuda, monkeypatch):
    monkeypatch.setitem(sys.modules, "pynvml", None)
    spec = detect_device("cuda", measure=False)
    assert (spec.nvml, spec.nvml_index, spec.memory_total_bytes) == (False, None, 140 * 2**30)
    assert spec.spec_bandwidth_gbs == 4800 and describe(spec).endswith("(no NVML)")


def test_detect_cuda_index_out_of_range(fake_cuda):
    with pytest.raises(HardwareError, match="only 1 CUDA GPU"):
        detect_device("cuda:3")


def test_sampler_clocks_for_a_bench_record(fake_nvml, monkeypatch):
    fake_nvml.nvmlDeviceGetEnforcedPowerLimit = lambda handle: 700_000
    fake_nvml.nvmlDeviceGetCurrentClocksEventReasons = lambda handle: 0x4  # an older pynvml lacks this one
    with NvmlSampler(0) as sampler:
        clocks = sampler.clocks()
    assert clocks["available"] and (clocks["sm_clock_mhz"], clocks["max_mem_clock_mhz"]) == (1980, 2619)
    assert clocks["power_w"] == pytest.approx(612.345) and clocks["power_limit_w"] == 700.0
    assert clocks["clock_event_reasons"] == 0x4
    assert clocks["temperature_c"] is None and clocks["mig_mode"] is None  # not in this fake: None, no error
    monkeypatch.setitem(sys.modules, "pynvml", None)  # no pynvml at all
    assert NvmlSampler(0).clocks() == {"available": False, "reason": "pynvml not installed"}
