"""What a model's weights hold in memory, measured: every tensor its modules keep (parameters and
buffers, the layouts a backend adds to a quantised layer included), each storage once; the RoPE
tables are not weights. engine/metrics.py's `held_weight_bytes` predicts the same from the shape
(the fit check's figure); tests/engine/test_footprint.py holds the two together."""
from __future__ import annotations

import torch
import torch.nn as nn

NOT_WEIGHTS = ("rope_cos", "rope_sin")


def _storages(model: nn.Module) -> dict[tuple[str, int, int], int]:
    """(device, first byte, bytes) -> bytes, for every weight tensor `model` holds: the span each
    tensor covers in its storage, each span once (a CPU model's tensors share one buffer on 2 MiB
    pages, engine/model/huge_pages.py: a storage's size would count the whole model for each)."""
    held = {}
    tensors = [t for _, t in model.named_parameters(remove_duplicate=False)]
    tensors += [t for name, t in model.named_buffers(remove_duplicate=False) if name.split(".")[-1] not in NOT_WEIGHTS]
    for t in tensors:
        span = 1 + sum((size - 1) * stride for size, stride in zip(t.shape, t.stride())) if t.numel() else 0
        key = (str(t.device), t.data_ptr(), span * t.element_size())
        held[key] = key[2]
    return held


def held_bytes(model: nn.Module, beside: nn.Module | None = None) -> int:
    """Bytes of weights `model` holds; with `beside`, only those it does not share with that model
    (a quantised copy beside the floating-point model it was made from)."""
    held = _storages(model)
    if beside is not None:
        for key in _storages(beside):
            held.pop(key, None)
    return sum(held.values())


def free_bytes(device: str) -> int | None:
    """Memory free for more weights on `device`: on a GPU what the driver has free plus what torch's
    allocator holds unused; on a CPU MemAvailable. None where unknown."""
    if device.startswith("cuda"):
        gpu = torch.device(device)
        free, _total = torch.cuda.mem_get_info(gpu)
        return free + torch.cuda.memory_reserved(gpu) - torch.cuda.memory_allocated(gpu)
    from engine.io.loader import available_memory_bytes
    return available_memory_bytes(device)


# quantize_int8/int4 work on an fp32 copy of one weight at a time: about four fp32 temporaries of
# the largest matrix are alive at once (the copy, its centred and scaled versions, the rounded codes)
QUANTISE_TEMPORARY_BYTES_PER_WEIGHT = 16
FIT_SHARE = 0.9  # of the free memory a new copy may take (as the load's check_fits)


def copy_fit_refusal(cfg, device: str, dtype: str, weights: str, group_size: int, elem_bytes: int,
                     free: int | None = None) -> str:
    """Why a new copy of the weights cannot be made ("" when it fits): another dtype's floating-point
    model (`weights` "fp"), or a quantised copy beside the floating-point one, which stays for
    switching back. Every copy already held is in use, so the free memory counts it; the new one is
    the cost model's figure (engine/metrics.py), with its quantisation's temporaries."""
    from engine.metrics import extra_copy_bytes, held_weight_bytes
    from engine.settings import weights_label

    kind = "cpu" if device == "cpu" else "cuda"
    if weights == "fp":
        need = held_weight_bytes(cfg, elem_bytes, "fp", group_size, kind)
        what = f"{dtype} weights"
    else:
        largest = max(cfg.vocab_size * cfg.dim, 2 * cfg.ffn_dim * cfg.dim, cfg.dim * (cfg.q_dim + 2 * cfg.kv_dim))
        need = extra_copy_bytes(cfg, elem_bytes, weights, group_size, kind) \
            + QUANTISE_TEMPORARY_BYTES_PER_WEIGHT * largest
        what = f"{weights_label(weights, group_size)} weights"
    free = free_bytes(device) if free is None else free
    if free is None or need <= FIT_SHARE * free:
        return ""
    beside = f" beside the {dtype} ones already held" if weights != "fp" else ""
    return (f"{what} need {need / 1e9:.1f} GB more on {device}{beside}, but only {free / 1e9:.1f} GB is free: "
            "out of memory")
