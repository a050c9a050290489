"""Which implementation ran each kind of operation, counted as it runs, so a figure can name the
path it came from: `record("attention decode", "triton flash_decode")` at a dispatch point, and
`counts()` / `since(before)` for a report. Torch-free; callers skip `record` inside a
torch.compile trace (a trace runs once; engine/graphs.py counts the replays)."""
from __future__ import annotations

from collections import Counter

_COUNTS: Counter = Counter()  # (op kind, implementation) -> calls


def record(op: str, impl: str, calls: int = 1) -> None:
    _COUNTS[(op, impl)] += calls


def counts() -> dict[tuple[str, str], int]:
    return dict(_COUNTS)


def since(before: dict[tuple[str, str], int]) -> dict[str, dict[str, int]]:
    """Calls since the `counts()` snapshot `before`, as {op kind: {implementation: calls}}."""
    out: dict[str, dict[str, int]] = {}
    for (op, impl), n in sorted(_COUNTS.items()):
        ran = n - before.get((op, impl), 0)
        if ran:
            out.setdefault(op, {})[impl] = ran
    return out
