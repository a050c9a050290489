"""A CPU model's weights packed into one buffer on 2 MiB pages (issue 24).

A decode step streams every weight once a token. On 4 KiB pages each TLB miss walks the page tables
(two of them under a hypervisor), and the step read its weights slower than the roof probe reads its
own 2 MiB-page buffer: measured on the project's 2-core KVM machine, fp32 decode 41 → 50 tok/s with
every weight moved onto huge pages (docs/benchmarks.md). PyTorch's allocator advises only tensors of
2 MiB or more (THP_MEM_ALLOC_ENABLE, engine/options.py), each with its unaligned ends on small pages:
35% of the default model's fp32 weights got them, none of its INT4 tiles (each under 2 MiB).

`pack(tensors, aliases)` copies each storage the tensors use into one buffer mapped for huge pages
(kernels/cpu_roof.py huge_buffer), storage by storage, and points every tensor and alias at its copy
(`Tensor.set_`), so the old memory is freed as it goes: the peak is the model plus one storage. It
runs while a model is being made, before any other thread or C++ plan holds a pointer into it (the
callers: Transformer's construction and quantize_model). Off Linux, or without room: nothing moves.
"""
from __future__ import annotations

from typing import Iterable, MutableMapping

import torch

ALIGN = 64  # each storage's start in the buffer: a cache line (and every dtype's element size)
MIN_BYTES = 1 << 20  # a model smaller than this is left where it is (tests' tiny models, stand-ins)


def _storage_key(t: torch.Tensor) -> int:
    return t.untyped_storage().data_ptr()


def _available_bytes() -> int | None:
    try:
        with open("/proc/meminfo") as meminfo:
            for line in meminfo:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError):
        return None
    return None


def _point(t: torch.Tensor, storage, offset_bytes: int) -> None:
    """t now views `storage` at its own shape and strides, its storage offset moved by offset_bytes."""
    offset = offset_bytes // t.element_size() + t.storage_offset()
    if t.is_inference():
        with torch.inference_mode():
            t.set_(storage, offset, t.shape, t.stride())
    else:
        with torch.no_grad():
            t.set_(storage, offset, t.shape, t.stride())


def pack(tensors: Iterable[torch.Tensor], aliases: MutableMapping[str, torch.Tensor] | None = None) -> int:
    """Moves the CPU storages of `tensors` into one huge-page buffer; `aliases` (a name -> tensor table
    sharing those storages, e.g. the loaded weights) is pointed there too, so nothing keeps the old
    memory. Returns the bytes moved (0: nothing moved)."""
    from kernels.cpu_roof import huge_buffer

    owners: dict[int, list[torch.Tensor]] = {}
    for t in tensors:
        if t is not None and t.device.type == "cpu" and t.numel() and not t.is_sparse:
            group = owners.setdefault(_storage_key(t), [])
            if all(t is not other for other in group):
                group.append(t)
    if not owners:
        return 0
    sizes = {key: group[0].untyped_storage().nbytes() for key, group in owners.items()}
    total = sum(-(-n // ALIGN) * ALIGN for n in sizes.values())
    available = _available_bytes()
    if total < MIN_BYTES or (available is not None and available < total // 4):
        return 0  # the copy is made storage by storage, but the buffer's pages are faulted in as it goes
    buffer = huge_buffer(total)
    if buffer is None:
        return 0
    storage = buffer.untyped_storage()
    by_alias: dict[int, list[str]] = {}
    for name, t in (aliases or {}).items():
        if isinstance(t, torch.Tensor) and t.device.type == "cpu" and t.numel():
            by_alias.setdefault(_storage_key(t), []).append(name)
    offset = 0
    for key, group in owners.items():
        n = sizes[key]
        source = torch.empty(0, dtype=torch.uint8).set_(group[0].untyped_storage())
        with torch.inference_mode():
            buffer[offset:offset + n].copy_(source)
        for t in group:
            _point(t, storage, offset)
        for name in by_alias.get(key, ()):
            old = aliases[name]
            new = torch.empty(0, dtype=old.dtype)
            new.set_(storage, offset // old.element_size() + old.storage_offset(), old.shape, old.stride())
            aliases[name] = new
        offset += -(-n // ALIGN) * ALIGN
    return offset


def model_tensors(module: torch.nn.Module) -> list[torch.Tensor]:
    """Every parameter and buffer of `module`, and the tensors its modules keep as plain attributes
    (a quantised layer's CPU tiles), each object once."""
    found: dict[int, torch.Tensor] = {}
    for m in module.modules():
        for t in (*m._parameters.values(), *m._buffers.values(),
                  *(v for v in vars(m).values() if isinstance(v, torch.Tensor))):
            if t is not None:
                found.setdefault(id(t), t)
    return list(found.values())
