"""Fault injection for the reliability tests (docs/reliability.md), torch-free. The engine calls
`inject(point)` at a few places; with `MEMBOUND_FAULTS` unset (always, outside tests) it does nothing.

MEMBOUND_FAULTS="reset,apply:oom,step:exit" — a comma list of POINT[:KIND]: at POINT, `raise`
(RuntimeError, the default), `oom` (MemoryError), `value` (ValueError), `exit` (the process ends at
once, as a crash would: exit code 70) or `hang` (sleeps for an hour). A point may carry a count
after '@': "step@5" fails the fifth time it is reached. At "kernel_check" the kind may instead name
kernels (kernels/registry.py), joined by '+': "kernel_check:int4+paged" fails those kernels' checks at
load, on a CPU too, where no check runs otherwise. Read once per process, at first use, so an engine
process spawned by the app inherits what the test set in its environment."""
from __future__ import annotations

import os
import time

KINDS = ("raise", "oom", "value", "exit", "hang")
POINTS = ("load", "chat", "reset", "quality", "apply", "listener", "step", "serve_step", "kernel_check")
_faults: dict[str, tuple[str, int]] | None = None
_reached: dict[str, int] = {}


class InjectedFault(RuntimeError):
    pass


def _parse(text: str) -> dict[str, tuple[str, int]]:
    faults = {}
    for item in filter(None, (part.strip() for part in text.split(","))):
        spec, _, kind = item.partition(":")
        point, _, nth = spec.partition("@")
        faults[point] = (kind or "raise", int(nth) if nth else 1)
    return faults


def _read() -> dict[str, tuple[str, int]]:
    global _faults
    if _faults is None:
        _faults = _parse(os.environ.get("MEMBOUND_FAULTS", ""))
    return _faults


def inject(point: str) -> None:
    _read()
    if not _faults or point not in _faults:
        return
    kind, nth = _faults[point]
    _reached[point] = _reached.get(point, 0) + 1
    if _reached[point] != nth:
        return
    if kind == "exit":
        os._exit(70)
    if kind == "hang":
        time.sleep(3600)
    if kind == "oom":
        raise MemoryError(f"injected at {point}")
    if kind == "value":
        raise ValueError(f"injected fault at {point}")
    raise InjectedFault(f"injected fault at {point}")


def inject_kernel_check(kernel: str) -> None:
    """Called as `kernel`'s check at load begins: fails it when MEMBOUND_FAULTS names it at
    "kernel_check"; a plain kind there ("kernel_check", "kernel_check:exit@2") is `inject("kernel_check")`
    at each check (the first, or the nth, then acts)."""
    kind = _read().get("kernel_check", ("", 1))[0]
    if kind in KINDS:
        inject("kernel_check")
    elif kernel in kind.split("+"):
        raise InjectedFault(f"injected fault in the {kernel} kernel's check")
