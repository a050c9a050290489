"""The peak a server's GPU can reach, for MBU and MFU: the datasheet entry `--gpu NAME` names, or
the one NVML reports when the server runs on this machine; None when neither says."""
from __future__ import annotations

from dataclasses import dataclass
from urllib.parse import urlsplit

from engine.hardware.spec import GB, KNOWN_GPUS, lookup_gpu

LOOPBACK_HOSTS = ("localhost", "127.0.0.1", "::1", "0.0.0.0")


@dataclass(frozen=True)
class GpuPeak:
    label: str  # "H100 SXM"
    bandwidth_gbs: float
    flops: float | None  # dense bf16 FLOP/s (what servers run in); None where not published
    source: str  # "datasheet, --gpu h100" | "datasheet, NVML: NVIDIA H100 80GB HBM3"

    @property
    def bandwidth_bps(self) -> float:
        return self.bandwidth_gbs * GB

    def describe(self) -> str:
        flops = f", bf16 {self.flops / 1e12:,.0f} TFLOP/s" if self.flops else ""
        return f"{self.label}: {self.bandwidth_gbs:,.0f} GB/s{flops} ({self.source})"


def from_datasheet(name: str, source: str) -> GpuPeak | None:
    sheet = lookup_gpu(name)
    if sheet is None:
        return None
    flops = sheet.flops.get("bf16") or sheet.flops.get("fp16")
    return GpuPeak(sheet.label, sheet.bandwidth_gbs, flops, source)


def known_gpu_names() -> str:
    return ", ".join(sheet.label for sheet in KNOWN_GPUS)


def is_local(url: str) -> bool:
    host = (urlsplit(url).hostname or "").lower()
    return host in LOOPBACK_HOSTS or host.startswith("127.")


def local_gpu_name() -> str | None:
    """NVML's name for GPU 0 of this machine, or None (no driver, no pynvml, no GPU)."""
    try:
        import pynvml  # lazy: most machines that attach have no NVIDIA driver
    except ImportError:
        return None
    try:
        pynvml.nvmlInit()
    except pynvml.NVMLError:
        return None
    try:
        name = pynvml.nvmlDeviceGetName(pynvml.nvmlDeviceGetHandleByIndex(0))
        return name.decode() if isinstance(name, bytes) else str(name)
    except pynvml.NVMLError:
        return None
    finally:
        pynvml.nvmlShutdown()


def resolve_peak(url: str, gpu: str | None = None) -> tuple[GpuPeak | None, str]:
    """(peak, note): `gpu` names a datasheet entry (ValueError for one not in the table); without
    it, a server on this machine gets NVML's GPU. The note says where the peak came from or why
    there is none."""
    if gpu:
        peak = from_datasheet(gpu, f"datasheet, --gpu {gpu}")
        if peak is None:
            raise ValueError(f"--gpu {gpu!r} is not in the datasheet table; known: {known_gpu_names()}")
        return peak, peak.describe()
    if not is_local(url):
        return None, "the server is on another machine: pass --gpu NAME for MBU and MFU"
    name = local_gpu_name()
    if name is None:
        return None, "no NVIDIA GPU on this machine (NVML): pass --gpu NAME for MBU and MFU"
    peak = from_datasheet(name, f"datasheet, NVML: {name}")
    if peak is None:
        return None, f"{name} is not in the datasheet table: pass --gpu NAME for MBU and MFU"
    return peak, peak.describe()
