"""Which kernels are switched off, and why: `KernelSwitches`, one per engine (its context,
engine/context.py), torch-free. The engine's dispatch asks `enabled(name)` before it takes a kernel;
engine/kernel_checks.py calls `disable` for one that fails its check at load, and that engine takes
the PyTorch path for that op from then on.

Names: "int8", "int4" (the weight-only matmuls), "flash" (flash-decoding over a contiguous cache),
"paged" (flash-decoding through block tables), "graphs" (the CUDA-graph decode step), "cpu_step"
(the C++ decode step on a CPU, kernels/cpu_decode.cpp)."""
from __future__ import annotations

import threading

KERNELS = ("int8", "int4", "flash", "paged", "graphs", "cpu_step")


def _known(name: str) -> str:
    if name not in KERNELS:
        raise ValueError(f"unknown kernel {name!r} (one of {', '.join(KERNELS)})")
    return name


class KernelSwitches:
    def __init__(self):
        self._disabled: dict[str, str] = {}  # name -> why it is off
        self._lock = threading.Lock()

    def disable(self, name: str, reason: str) -> None:
        """Switch `name` off for good; the first reason given is kept."""
        with self._lock:
            self._disabled.setdefault(_known(name), reason or "switched off")

    def enabled(self, name: str) -> bool:
        return name not in self._disabled  # read on every dispatch: a dict lookup, no lock

    def reason(self, name: str) -> str:
        """Why `name` is off ("" while it is on)."""
        return self._disabled.get(_known(name), "")

    def disabled(self) -> dict[str, str]:
        with self._lock:
            return dict(self._disabled)

    def reset(self) -> None:
        """Every kernel on again."""
        with self._lock:
            self._disabled.clear()
