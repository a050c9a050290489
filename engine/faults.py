"""Fault injection for the reliability tests (docs/reliability.md), torch-free. The engine's host
and its load checks call `faults.inject(point)` on their context's `Faults` (engine/context.py);
with `MEMBOUND_FAULTS` unset (always, outside tests) it does nothing.

MEMBOUND_FAULTS="reset,apply:oom,step:exit" — a comma list of POINT[:KIND]: at POINT, `raise`
(RuntimeError, the default), `oom` (MemoryError), `value` (ValueError), `exit` (the process ends at
once, as a crash would: exit code 70), `hang` (sleeps for an hour) or `slow` (sleeps SLOW_S each time
it is reached, from the nth on: a tiny model's reply that lasts seconds). A point may carry a count
after '@': "step@5" fails the fifth time it is reached. At "kernel_check" the kind may instead name
kernels (kernels/registry.py), joined by '+': "kernel_check:int4+paged" fails those kernels' checks at
load, on a CPU too, where no check runs otherwise. Read when the context is made (engine/options.py),
so an engine process spawned by the app injects what the test set in its environment."""
from __future__ import annotations

import os
import threading
import time

KINDS = ("raise", "oom", "value", "exit", "hang", "slow")
SLOW_S = 0.005
POINTS = ("load", "chat", "reset", "quality", "apply", "listener", "step", "serve_step", "kernel_check")


class InjectedFault(RuntimeError):
    pass


def parse(text: str) -> dict[str, tuple[str, int]]:
    faults = {}
    for item in filter(None, (part.strip() for part in text.split(","))):
        spec, _, kind = item.partition(":")
        point, _, nth = spec.partition("@")
        faults[point] = (kind or "raise", int(nth) if nth else 1)
    return faults


class Faults:
    """The faults one spec asks for, and how often each point has been reached."""

    def __init__(self, spec: str = ""):
        self.faults = parse(spec)
        self._reached: dict[str, int] = {}
        self._lock = threading.Lock()  # the host's thread and its listener both reach points

    def inject(self, point: str) -> None:
        if point not in self.faults:
            return
        kind, nth = self.faults[point]
        with self._lock:
            self._reached[point] = self._reached.get(point, 0) + 1
            reached = self._reached[point]
        if kind == "slow" and reached >= nth:
            time.sleep(SLOW_S)
            return
        if reached != nth:
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

    def inject_kernel_check(self, kernel: str) -> None:
        """Called as `kernel`'s check at load begins: fails it when the spec names it at
        "kernel_check"; a plain kind there ("kernel_check", "kernel_check:exit@2") is `inject("kernel_check")`
        at each check (the first, or the nth, then acts)."""
        kind = self.faults.get("kernel_check", ("", 1))[0]
        if kind in KINDS:
            self.inject("kernel_check")
        elif kernel in kind.split("+"):
            raise InjectedFault(f"injected fault in the {kernel} kernel's check")
