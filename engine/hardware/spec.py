"""What a chip can do, as plain data (torch-free): the GPU datasheet table and `DeviceSpec` (peak
bandwidth and FLOP/s; engine/hardware/detect.py fills one in for the device at hand)."""
from __future__ import annotations

from dataclasses import asdict, dataclass, field, fields
from typing import Any

GB = 1e9  # bandwidths are decimal GB/s, as on datasheets
TERA = 1e12
DTYPE_NAMES = ("fp32", "bf16", "fp16", "int8")
# the integer dot products a CPU's roof may hold beside its float rates (kernels/cpu_roof.py int_dot_flops):
# int8 bytes, as INT4 runs everywhere and INT8 on Arm; int16 pairs, as INT8 runs on x86
INT_DOT_KINDS = ("int8", "int16")


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


def dtype_name(dtype) -> str:
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
    cache_bandwidth_gbs: float | None = None  # CPU: a read that fits the last-level cache (engine/hardware/roof.py)
    cache_bytes: int | None = None  # the last-level cache, where its roof was measured
    cache_knee: tuple = ()  # CPU: (bytes, GB/s) where the cache gives out, past cache_bytes (engine/hardware/roof.py)
    measured_at: str = ""  # when the roof was measured ("" for a datasheet or nothing)

    def peak_flops_for(self, dtype) -> float | None:
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


def describe(spec: DeviceSpec) -> str:
    """One line for the terminal: what the device is and where its numbers come from."""
    if spec.kind == "cpu":
        if spec.measured_bandwidth_gbs is None:
            return f"CPU {spec.name} — not measured"
        line = f"CPU {spec.name} — measured read {spec.measured_bandwidth_gbs:.1f} GB/s"
        if spec.cache_bandwidth_gbs:
            line += f" (last-level cache {spec.cache_bandwidth_gbs:.1f} GB/s)"
        if "fp32" in spec.measured_flops:
            line += f", fp32 {spec.measured_flops['fp32'] / TERA:.3f} TFLOP/s"
        if spec.measured_at:
            line += f" · roof measured {spec.measured_at}"
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
