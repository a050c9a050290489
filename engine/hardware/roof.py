"""The roofs a step is measured against, and the one policy that picks them (`Roof`): plain data,
torch-free (the GUI process imports it). A CPU's roofs are measured once per machine and cached
(engine/hardware/probe.py); a GPU's is its datasheet, beside a measured copy. Nothing raises a roof
from what a step did: a step above its roof is shown as such (`above_roof`)."""
from __future__ import annotations

from dataclasses import asdict, dataclass, field, fields

from engine.hardware.spec import GB, INT_DOT_KINDS, DeviceSpec, dtype_name

# ---------------------------------------------------------------------------------------------
# The policy

ABOVE_ROOF = "above the measured roof: the cost model or the probe is wrong"
ABOVE_ROOF_TOLERANCE = 1.02  # a probe's best-of-N repeats within a few %: beyond this a step is above


@dataclass(frozen=True)
class Roof:
    """The peaks one device offers a step: memory (DRAM/HBM) bandwidth, and where the machine has a
    measured last-level cache roof, the bandwidth of reads that fit it; FLOP/s per dtype. Every front
    end (app, bench, terminal, replay, attach) takes a step's roof from here."""
    bandwidth_bps: float
    flops: dict[str, float] = field(default_factory=dict)
    cache_bandwidth_bps: float | None = None
    cache_bytes: int | None = None
    # where the cache gives out: (bytes, bytes/s) of the reads past cache_bytes, ascending, the last of
    # them at the memory's rate (engine/hardware/probe.py knee_curve); () where none were read
    cache_knee: tuple = ()

    @classmethod
    def of(cls, spec: DeviceSpec) -> "Roof":
        cache_bps = spec.cache_bandwidth_gbs * GB if spec.cache_bandwidth_gbs else None
        knee = tuple((int(n), gbs * GB) for n, gbs in spec.cache_knee)
        return cls(spec.peak_bandwidth_gbs * GB, dict(spec.peak_flops), cache_bps, spec.cache_bytes, knee)

    def level_for(self, step_bytes: float) -> str:
        """'cache' when the step's bytes fit the last-level cache, or lie where it gives out and a read
        of that size still ran CACHE_FASTER than memory (a step that reads the same weights every time
        then streams them, or most of them, from the cache), else 'memory' (its roof may still be a
        read of its size a little faster than the memory roof's: Roof.bandwidth_for)."""
        return "cache" if self.bandwidth_for(step_bytes) >= CACHE_FASTER * self.bandwidth_bps else "memory"

    def bandwidth_for(self, step_bytes: float) -> float:
        """Bytes/s of the roof a step moving `step_bytes` sits under: the cache's for bytes that fit it;
        where the cache gives out, the rate of the largest read no bigger than the step (a read of
        fewer bytes is no slower: the roof stays an upper bound); past that, the memory's."""
        if not (self.cache_bandwidth_bps and self.cache_bytes) or step_bytes <= 0:
            return self.bandwidth_bps
        if step_bytes <= self.cache_bytes:
            return self.cache_bandwidth_bps
        if not any(n > step_bytes for n, _ in self.cache_knee):  # past the last read
            return self.bandwidth_bps
        below = [bps for n, bps in self.cache_knee if n <= step_bytes]
        return max(below[-1] if below else self.cache_bandwidth_bps, self.bandwidth_bps)

    def products_peak(self, kind: str, dtype) -> float:
        """Peak FLOP/s of the products a matrix runs as `kind` (the C++ step's: "fp32", "bf16",
        "int8" or "int16" dot products, kernels/cpu_decode.py product_kind) in a step of activations
        `dtype`: the float kinds as flops_for; an integer kind at its probed rate where the probe
        measured one, else the activations' (the machine has no such instruction)."""
        if kind in INT_DOT_KINDS and kind in self.flops:
            return self.flops[kind]
        return self.flops_for(kind if kind in ("fp32", "bf16") else dtype)

    def step_flops_peak(self, cost, dtype, products: tuple[str, str] | None = None) -> float:
        """The FLOP/s a step's FLOPs could run at, at most: flops_for(dtype), or where its matrices'
        products run another way (`products`: the layers' and the head's kinds), the rate of the
        whole when each part runs at its own peak (the layers' products, the head's, and the rest at
        the activations'): its FLOPs over the least time they take that way. `cost`: a StepCost."""
        rest = self.flops_for(dtype)
        if products is None or cost.flops <= 0:
            return rest
        layers, head = (self.products_peak(kind, dtype) for kind in products)
        if layers == head == rest:  # (an fp32 or bf16 step's: the one rate, as it is)
            return rest
        layer_flops = cost.matmul_flops - cost.head_flops
        seconds = layer_flops / layers + cost.head_flops / head + (cost.flops - cost.matmul_flops) / rest
        return cost.flops / seconds if seconds > 0 else rest

    def peak_kind(self, dtype, products: tuple[str, str] | None = None) -> str:
        """What step_flops_peak's rate is of, in words: the activations' dtype, or where the layers' or
        the head's products run as integer dot products this roof knows, "int8/int16 dots + fp32"."""
        dots = [k for k in dict.fromkeys(products or ()) if k in INT_DOT_KINDS and k in self.flops]
        return f"{'/'.join(dots)} dots + {dtype_name(dtype)}" if dots else dtype_name(dtype)

    def flops_for(self, dtype) -> float:
        """Peak FLOP/s for a dtype (fp16 <-> bf16, then fp32 stand in); nan when nothing is known."""
        name = dtype_name(dtype)
        for candidate in {"fp32": ("fp32",), "bf16": ("bf16", "fp16", "fp32"), "fp16": ("fp16", "bf16", "fp32"),
                          "int8": ("int8", "bf16", "fp16", "fp32")}[name]:
            if candidate in self.flops:
                return self.flops[candidate]
        return float("nan")


CACHE_FASTER = 1.2  # a size reads "from the cache" at this many times the memory roof or more


def knee_curve(reads: dict[int, float], memory_gbs: float, fit: int | None) -> list[tuple[int, float]]:
    """(bytes, GB/s) of the cache probe's reads past `fit` (the largest that read at the cache's rate),
    ascending, up to the first that read within ABOVE_ROOF_TOLERANCE of the memory roof: that one is
    given the memory's rate (from there a step sits under the memory roof; past the last read too).
    Between, a read slower than the cache's and faster than the memory's is a step's roof: on this
    Intel guest 240 MiB read 36.6 GB/s against a 31.7 memory roof, and the bf16 step (261 MiB) read
    33.9, "107% of the memory roof". [] without a fit or reads past it."""
    curve = []
    for n in sorted(n for n in reads if fit is not None and n > fit):
        if reads[n] < ABOVE_ROOF_TOLERANCE * memory_gbs:
            curve.append((n, memory_gbs))
            break
        curve.append((n, reads[n]))
    return curve


def machine_name() -> str:
    """This host and its CPU, torch-free (what the window and the tour check key their notes by)."""
    import platform
    cpu = platform.processor() or platform.machine()
    try:
        with open("/proc/cpuinfo") as cpuinfo:
            cpu = next((line.split(":", 1)[1].strip() for line in cpuinfo if line.startswith("model name")), cpu)
    except OSError:
        pass
    return f"{platform.node()} | {cpu}"


def above_roof(mbu: float, mfu: float) -> bool:
    """A step whose bytes or FLOPs at its measured time beat the roof (beyond the probe's noise)."""
    return any(x == x and x > ABOVE_ROOF_TOLERANCE for x in (mbu, mfu))


def roof_line(spec: DeviceSpec) -> str:
    """One line naming the roof every figure is measured against (the bench prints it)."""
    if spec.kind == "cpu":
        if not spec.measured_bandwidth_gbs:
            return "peak: not measured"
        cache = f", last-level cache read {spec.cache_bandwidth_gbs:.1f} GB/s" if spec.cache_bandwidth_gbs else ""
        if cache and spec.cache_bytes:  # the roof of a step whose bytes fit it (Roof.level_for)
            cache += f" (the roof of a step of up to {spec.cache_bytes / 2**20:.0f} MiB"
            if spec.cache_knee:  # Roof.bandwidth_for
                cache += f"; to {spec.cache_knee[-1][0] / 2**20:.0f} MiB, a read of the step's size"
            cache += ")"
        when = f", measured {spec.measured_at}" if spec.measured_at else ""
        return (f"peak: the measured roof, read {spec.peak_bandwidth_gbs:.1f} GB/s{cache}{when} "
                f"({spec.source.removeprefix('CPU — ')}; `membound roof`)")
    measured = f", measured copy {spec.measured_bandwidth_gbs:.0f} GB/s" if spec.measured_bandwidth_gbs else ""
    return f"peak: {spec.peak_bandwidth_gbs:.0f} GB/s ({spec.source}){measured}"


# ---------------------------------------------------------------------------------------------
# A machine's measured roof, as cached

@dataclass(frozen=True)
class MeasuredRoof:
    """One machine's probed roofs, as cached (plain data, JSON)."""
    machine: str  # the fingerprint it was measured on (CPU, cores, threads, memory)
    measured_at: str  # local date and time, "2025-01-31 14:05"
    method: str  # how, in words
    threads: int
    llc_bytes: int
    read_gbs: float  # the memory roof: best over the sizes
    read_gbs_by_size: dict[str, float]  # "256 MiB" -> best pass
    cache_read_gbs: float | None  # the best of buffers within the last-level cache, read again and again
    flops: dict[str, float]  # dtype -> FLOP/s
    flops_method: dict[str, str]  # dtype -> "FMA loop" | "bf16 dot loop" | "GEMM" | "int8 dot loop" | "int16 dot loop"
    load_average: float | None = None  # the 1-minute load when measured (a busy machine reads low)
    read_gbs_rounds: list[float] | None = None  # each round's best over the sizes: the run's own spread
    other_cores: float | None = None  # cores other processes kept busy during the read probe (/proc/stat)
    # the largest of those buffers that still read at the cache's rate: the bytes a step must fit to be
    # under the cache roof (None: no size read faster than memory; where sysfs names a host's L3, less than it)
    cache_read_bytes: int | None = None
    cache_reads: list | None = None  # [bytes, GB/s] of every size the cache probe read (its knee too)

    def cache_knee(self) -> list[tuple[int, float]]:
        """(bytes, GB/s) past cache_read_bytes where the cache gives out (engine/hardware/probe.py knee_curve)."""
        return knee_curve({int(n): gbs for n, gbs in self.cache_reads or []}, self.read_gbs, self.cache_read_bytes)

    def to_dict(self) -> dict:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict) -> "MeasuredRoof":
        names = {f.name for f in fields(cls)}
        return cls(**{k: v for k, v in data.items() if k in names})

    def describe(self) -> str:
        sizes = ", ".join(f"{size} {gbs:.1f}" for size, gbs in self.read_gbs_by_size.items())
        if self.read_gbs_rounds and len(self.read_gbs_rounds) > 1:
            sizes += f"; rounds {min(self.read_gbs_rounds):.1f}–{max(self.read_gbs_rounds):.1f}"
        flops = ", ".join(f"{dtype} {value / 1e12:.3f} TFLOP/s ({self.flops_method.get(dtype, '?')})"
                          for dtype, value in self.flops.items())
        cache = ""
        if self.cache_read_gbs:
            fit = f"up to {self.cache_read_bytes / 2**20:.0f} MiB" if self.cache_read_bytes else "no faster than memory"
            reads = {int(n): gbs for n, gbs in self.cache_reads or []}  # as read (the knee's last: memory's)
            knee = ", ".join(f"{n / 2**20:.0f} MiB {reads[n]:.1f}" for n, _ in self.cache_knee())
            fit += f" (then {knee} GB/s)" if knee else ""
            cache = f"; last-level cache ({self.llc_bytes / 2**20:.0f} MiB named) read {self.cache_read_gbs:.1f} GB/s {fit}"
        return (f"read {self.read_gbs:.1f} GB/s ({sizes} GB/s){cache}; {flops}; {self.threads} threads; "
                f"measured {self.measured_at} by {self.method}")
