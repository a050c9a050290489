"""What every bench JSON carries beside its figures: the command and versions, the device and its
clocks around the timed part, which implementation ran each kind of operation (CUDA graph or
eager, Triton or PyTorch), and the seconds spent loading, compiling and tuning apart from the
timed steps. `JsonReport` rewrites its file at every update: a run cut short leaves what it had."""
from __future__ import annotations

import json
import os
import platform
import statistics
import sys
import time

import torch

from engine import dispatch


class JsonReport:
    """The bench's JSON file, written at once and again at each `update` (atomically: a reader
    never sees half a file); `"complete"` turns true at `finish`. No path: nothing is written."""

    def __init__(self, path: str | None, **fields):
        self.path = path
        self.payload = {"command": "membound " + " ".join(sys.argv[1:]), "complete": False, **versions(), **fields}
        self.t0 = time.perf_counter()
        self.write()

    def update(self, **fields) -> None:
        self.payload.update(fields)
        self.payload["elapsed_s"] = time.perf_counter() - self.t0
        self.write()

    def finish(self, **fields) -> None:
        self.update(complete=True, **fields)
        if self.path:
            print(f"wrote {self.path}", file=sys.stderr)

    def write(self) -> None:
        if not self.path:
            return
        tmp = f"{self.path}.tmp"
        with open(tmp, "w") as f:
            json.dump(self.payload, f, indent=1, default=str)
        os.replace(tmp, self.path)


def versions() -> dict:
    try:
        import triton
        triton_version = triton.__version__
    except ImportError:
        triton_version = None
    return {"machine": platform.platform(), "python": platform.python_version(), "torch": torch.__version__,
            "triton": triton_version, "cuda": torch.version.cuda, "threads": torch.get_num_threads()}


def device_clocks(hardware) -> dict:
    """The GPU's clocks, power and clock-limiting reasons now (NVML), or why they are unknown."""
    if hardware.kind != "cuda":
        return {"available": False, "reason": "not a GPU"}
    if hardware.nvml_index is None:
        return {"available": False, "reason": "NVML did not answer at start-up"}
    from engine.hardware.nvml import NvmlSampler
    with NvmlSampler(hardware.nvml_index) as sampler:
        return sampler.clocks()


def matmul_paths(model) -> dict[str, str]:
    """The implementation each kind of matmul module of `model` runs (fixed when it is built)."""
    names = {"triton": "Triton (kernels/, a torch custom op)", "cpu": "PyTorch CPU int kernels",
             "reference": "PyTorch reference (dequantise, then matmul)"}
    paths = {}
    for m in model.modules():
        if hasattr(type(m), "weight_bytes"):
            backend = getattr(m, "backend", None)
            paths[type(m).__name__] = names.get(backend, "PyTorch") if backend else "PyTorch"
    return paths


def weight_pages(model) -> dict | None:
    """How much of a CPU model's weights sit on 2 MiB pages (kernels/cpu_roof.py: {"share", "exact"}),
    None on a GPU or where the kernel does not say: a decode step streams its weights faster from
    huge pages (issue 24)."""
    from engine.model.huge_pages import model_tensors
    tensors = {t.data_ptr(): t.nbytes for t in model_tensors(model) if t.device.type == "cpu" and t.numel()}
    from kernels.cpu_roof import huge_page_share
    found = huge_page_share(tensors.items()) if tensors else None
    return None if found is None else {"share": found[0], "exact": found[1]}


def _dynamo_graphs() -> int:
    """torch.compile's graphs so far (none where dynamo was never imported: importing it takes ~1 s)."""
    if "torch._dynamo" not in sys.modules:
        return 0
    try:
        from torch._dynamo.utils import counters
        return int(counters["stats"]["unique_graphs"])
    except Exception:
        return 0


class PathWatch:
    """Counts what runs between its start and `report()`: the dispatch points (engine/dispatch.py),
    CUDA-graph captures and torch.compile graphs, so a timed region can prove it compiled nothing."""

    def __init__(self, graphs=None):
        self.graphs = graphs  # an engine's GraphDecoder, or None (the batched path has none)
        self.counts = dispatch.counts()
        self.captures = graphs.captures if graphs is not None else 0
        self.dynamo_graphs = _dynamo_graphs()

    def report(self, steps=(), model=None, cuda_graphs: str | None = None) -> dict:
        """`steps`: the region's StepMetrics; `cuda_graphs`: what to say about graphs (default:
        from the GraphDecoder: "used", or the reason they did not run)."""
        ops = dispatch.since(self.counts)
        decode = [s for s in steps if s.phase == "decode"]
        graph_steps = sum(ops.get("decode step", {}).values())
        if decode:
            ops.setdefault("decode step", {})
            if len(decode) > graph_steps:
                ops["decode step"]["eager"] = len(decode) - graph_steps
        if cuda_graphs is None:
            g = self.graphs
            cuda_graphs = "used" if g is not None and not g.unavailable and graph_steps else \
                (g.unavailable if g is not None and g.unavailable else "not used")
        times = sorted(s.step_s for s in decode)
        out = {
            "cuda_graphs": cuda_graphs,
            "ops": ops,
            "compiled_in_region": {
                "graph_captures": (self.graphs.captures - self.captures) if self.graphs is not None else 0,
                "torch_compile_graphs": _dynamo_graphs() - self.dynamo_graphs,
            },
            # a compile or a tuning inside the region shows as one step far slower than the rest
            "slowest_decode_step_over_median": times[-1] / statistics.median(times) if times else None,
        }
        if model is not None:
            out["matmul"] = matmul_paths(model)
            out["weight_pages"] = weight_pages(model)
        return out
