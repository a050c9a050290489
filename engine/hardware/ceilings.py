"""What the hardware allows: the seed table. Batch-1 decode reads every weight once per token,
so `tokens/s <= memory bandwidth / weight bytes`; a model whose weights exceed the memory is OOM.
The bytes are the cost model's (engine/metrics.py) for each format as the engine stores it.
Pure functions over plain data (no torch tensors, no Qt): the app and the CLI both print it."""
from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from types import MappingProxyType

from engine.hardware.spec import KNOWN_GPUS, DeviceSpec
from engine.metrics import decode_weight_bytes, held_weight_bytes
from engine.model.config import ModelConfig
from engine.settings import Settings

GIB = 2**30

# Memory per GPU (the datasheet's capacity). KNOWN_GPUS carries bandwidth and FLOP/s only.
GPU_MEMORY_BYTES: dict[str, int] = {
    "H200 NVL": 141 * 10**9,
    "H200 SXM": 141 * 10**9,
    "H100 PCIe": 80 * GIB,
    "H100 NVL": 94 * GIB,
    "H100 SXM": 80 * GIB,
    "A100 80GB PCIe": 80 * GIB,
    "A100 80GB SXM": 80 * GIB,
    "A100 40GB": 40 * GIB,
    "L40S": 48 * GIB,
    "L40": 48 * GIB,
    "L4": 24 * GIB,
    "A10": 24 * GIB,
    "A10G": 24 * GIB,
    "T4": 16 * GIB,
    "RTX 4090": 24 * GIB,
    "RTX 3090": 24 * GIB,
}

# NVLink bandwidth per GPU, both directions together, as the datasheets quote it (GB/s); an
# all-reduce moves data one way at a time, so half of it is what a ring step gets.
NVLINK_GBS: dict[str, float] = {
    "H200 SXM": 900, "H200 NVL": 900, "H100 SXM": 900, "H100 NVL": 600, "A100 80GB SXM": 600, "A100 40GB": 600,
}
TP_DEGREES = (2, 4, 8)
TP_GPU = "H100 SXM"  # the eight-GPU node the tensor-parallel columns assume

# The weights' formats the table offers, each as the engine stores and reads it (engine/metrics.py:
# decode_weight_bytes, held_weight_bytes): a floating-point dtype, or INT8 / INT4 weight-only
# quantisation (INT8 a scale a row; INT4 the engine's default group, an fp16 scale and min a group;
# the head at INT8 under both) with the embedding, norms and activations in bf16.
FORMATS: Mapping[str, tuple[str, int]] = MappingProxyType({"fp32": ("fp", 4), "bf16": ("fp", 2), "fp16": ("fp", 2),
                                                          "int8": ("int8", 2), "int4": ("int4", 2)})
GROUP_SIZE = Settings().group_size  # INT4's group: the engine's default (F7 changes it in the app)

# The chips every table compares against, and the reference model shapes beside the loaded one.
REFERENCE_GPUS = ("A100 80GB SXM", "H100 SXM", "H200 SXM")
REFERENCE_SHAPES = ("llama3.2-1b", "llama3-8b", "llama-13b", "llama3-70b", "llama3.1-405b")


@dataclass(frozen=True)
class Chip:
    label: str
    bandwidth_gbs: float
    memory_bytes: int | None  # None: unknown, never OOM
    source: str  # where the bandwidth comes from, e.g. "spec" or "measured"
    link_gbs: float | None = None  # NVLink, both directions (datasheet); None: no NVLink
    device: str = "cuda"  # "cpu" | "cuda": the layout the engine stores its weights in there


@dataclass(frozen=True)
class ModelSize:
    label: str
    read_params: int  # weights one decode step reads: every matmul, the output head included
    stored_params: int  # weights held in memory: the above + the embedding table (if untied) + norms
    n_layers: int = 0
    dim: int = 0  # the hidden vector a tensor-parallel layer all-reduces
    cfg: ModelConfig | None = None  # the shape the cost model counts bytes from

    def read_bytes(self, weight_format: str, device: str = "cuda") -> float:
        """Weight bytes one batch-1 decode step reads at `weight_format` (a FORMATS key) on `device`."""
        weights, elem_bytes = FORMATS[weight_format]
        if self.cfg is None:  # no shape: every weight at the format's width (a synthetic row, a test)
            return self.read_params * _width(weights, elem_bytes)
        return decode_weight_bytes(self.cfg, elem_bytes, weights, GROUP_SIZE, device)

    def stored_bytes(self, weight_format: str, device: str = "cuda") -> float:
        """Bytes the weights hold at `weight_format` on `device` (a CPU's quantised layers also hold
        the layouts its kernels stream)."""
        weights, elem_bytes = FORMATS[weight_format]
        if self.cfg is None:
            return self.stored_params * _width(weights, elem_bytes)
        return held_weight_bytes(self.cfg, elem_bytes, weights, GROUP_SIZE, device)


def _width(weights: str, elem_bytes: int) -> float:
    """Bytes a weight where no shape is known: a floating-point element, a code, half a code and
    its group's scale and min."""
    return {"fp": elem_bytes, "int8": 1.0, "int4": 0.5 + 4 / GROUP_SIZE}[weights]


@dataclass(frozen=True)
class Ceiling:
    tokens_per_s: float | None  # None when the weights do not fit
    weight_bytes_per_token: float
    stored_bytes: float
    fits: bool

    def text(self) -> str:
        if not self.fits:
            return "OOM"
        tps = self.tokens_per_s
        if tps >= 1e6:
            return f"{tps / 1e6:.1f}M"
        if tps >= 1e4:
            return f"{tps / 1e3:.0f}k"
        return f"{tps:,.0f}" if tps >= 100 else f"{tps:.1f}" if tps >= 1 else f"{tps:.2f}"


def model_size(cfg: ModelConfig, label: str | None = None) -> ModelSize:
    read = cfg.n_layers * cfg.layer_linear_params + cfg.vocab_size * cfg.dim
    return ModelSize(label or cfg.name, read, cfg.n_params, cfg.n_layers, cfg.dim, cfg)


def reference_models(shapes: tuple[str, ...] = REFERENCE_SHAPES) -> list[ModelSize]:
    return [model_size(ModelConfig.from_name(name)) for name in shapes]


def gpu_chip(label: str) -> Chip:
    """A chip from the datasheet table, by its KNOWN_GPUS label."""
    for sheet in KNOWN_GPUS:
        if sheet.label == label:
            return Chip(label, sheet.bandwidth_gbs, GPU_MEMORY_BYTES.get(label), "spec", NVLINK_GBS.get(label))
    raise KeyError(f"no datasheet for {label!r}")


def device_chip(spec: DeviceSpec) -> Chip:
    """The chip the app runs on, with the bandwidth the app draws as its peak."""
    if spec.kind == "cpu":
        label, source = "this CPU", "measured"
    else:
        label = spec.name.removeprefix("NVIDIA ").strip()
        source = "spec" if spec.spec_bandwidth_gbs else "measured"
    return Chip(label, spec.peak_bandwidth_gbs, spec.memory_total_bytes, source,
                device="cpu" if spec.kind == "cpu" else "cuda")


def decode_ceiling(model: ModelSize, chip: Chip, weight_format: str) -> Ceiling:
    """Batch-1 decode ceiling on one chip: weights only (a short context's KV cache is small)."""
    read_bytes = model.read_bytes(weight_format, chip.device)
    stored_bytes = model.stored_bytes(weight_format, chip.device)
    fits = chip.memory_bytes is None or stored_bytes <= chip.memory_bytes
    tokens_per_s = chip.bandwidth_gbs * 1e9 / read_bytes if fits and read_bytes > 0 else None
    return Ceiling(tokens_per_s, read_bytes, stored_bytes, fits)


def tp_ceiling(model: ModelSize, chip: Chip, n_gpus: int, weight_format: str, act_bytes: int = 2) -> Ceiling:
    """Batch-1 decode ceiling with tensor parallelism over `n_gpus` of `chip`: each GPU holds and reads
    1/n of every weight matrix, and each layer ends its attention and its MLP with an all-reduce of
    the hidden vector (a ring: 2(n-1)/n of it crosses each GPU's link, one way at half the NVLink
    figure). Bandwidth terms only — an all-reduce's few microseconds of latency are not counted,
    so this is a ceiling, as the one-GPU columns are."""
    if chip.link_gbs is None:
        raise ValueError(f"{chip.label} has no NVLink figure for tensor parallelism")
    read_bytes = model.read_bytes(weight_format, chip.device) / n_gpus
    stored_bytes = model.stored_bytes(weight_format, chip.device) / n_gpus
    fits = chip.memory_bytes is None or stored_bytes <= chip.memory_bytes
    allreduce_bytes = 2 * model.n_layers * 2 * (n_gpus - 1) / n_gpus * model.dim * act_bytes
    step_s = read_bytes / (chip.bandwidth_gbs * 1e9) + allreduce_bytes / (chip.link_gbs / 2 * 1e9)
    return Ceiling(1 / step_s if fits and step_s > 0 else None, read_bytes, stored_bytes, fits)


def seed_table(models: list[ModelSize], chips: list[Chip], weight_format: str) -> list[list[Ceiling]]:
    """Rows: models; columns: chips."""
    return [[decode_ceiling(m, c, weight_format) for c in chips] for m in models]


def format_params(n: int) -> str:
    return f"{n / 1e9:.1f} B" if n >= 1e9 else f"{n / 1e6:.0f} M"


@dataclass(frozen=True)
class Fit:
    """A model on one device at one precision: do its weights fit, and the seed formula's ceiling."""
    dtype: str
    stored_bytes: float  # the weights held in memory at `dtype`
    memory_bytes: int | None  # what the device has (None: unknown)
    fits: bool | None  # None: unknown (no shape known, or no memory figure)
    ceiling_tokens_per_s: float | None  # batch-1 decode: bandwidth / bytes per token (None: unknown)


def fit_on(cfg: ModelConfig | None, n_params: int, chip: Chip | None, dtype: str) -> Fit:
    """A model file on `chip` at `dtype`: membound runs a file's weights at the chosen precision (a
    Q4_K_M file too), so that is what must fit and what every decode step reads. Without a shape
    (`cfg` None: a model membound cannot run) only the stored size is known, from `n_params`."""
    memory = chip.memory_bytes if chip is not None else None
    if cfg is None:
        return Fit(dtype, ModelSize("", n_params, n_params).stored_bytes(dtype), memory, None, None)
    size = model_size(cfg)
    if chip is None:
        return Fit(dtype, size.stored_bytes(dtype), None, None, None)
    ceiling = decode_ceiling(size, chip, dtype)
    fits = ceiling.fits if memory is not None else None
    tokens_per_s = ceiling.tokens_per_s if chip.bandwidth_gbs > 0 else None
    return Fit(dtype, ceiling.stored_bytes, memory, fits, tokens_per_s)
