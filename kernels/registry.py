"""Which kernels are switched off in this process, and why. Torch-free. The engine's dispatch asks
`enabled(name)` before it takes a kernel; engine/kernel_checks.py calls `disable` for one that fails
its check at load, and the engine takes the PyTorch path for that op from then on.

Names: "int8", "int4" (the weight-only matmuls), "flash" (flash-decoding over a contiguous cache),
"paged" (flash-decoding through block tables), "graphs" (the CUDA-graph decode step), "cpu_step"
(the C++ decode step on a CPU, kernels/cpu_decode.cpp)."""
from __future__ import annotations

import threading

KERNELS = ("int8", "int4", "flash", "paged", "graphs", "cpu_step")

_disabled: dict[str, str] = {}  # name -> why it is off
_lock = threading.Lock()


def _known(name: str) -> str:
    if name not in KERNELS:
        raise ValueError(f"unknown kernel {name!r} (one of {', '.join(KERNELS)})")
    return name


def disable(name: str, reason: str) -> None:
    """Switch `name` off for the rest of this process; the first reason given is kept."""
    with _lock:
        _disabled.setdefault(_known(name), reason or "switched off")


def enabled(name: str) -> bool:
    return name not in _disabled  # read on every dispatch: a dict lookup, no lock


def reason(name: str) -> str:
    """Why `name` is off ("" while it is on)."""
    return _disabled.get(_known(name), "")


def disabled() -> dict[str, str]:
    with _lock:
        return dict(_disabled)


def reset() -> None:
    """Every kernel on again (tests: one test's failed check must not follow the next)."""
    with _lock:
        _disabled.clear()
