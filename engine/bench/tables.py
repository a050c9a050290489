"""Plain-text tables for the bench: a label column, then one right-aligned column per item."""
from __future__ import annotations

from typing import Callable, Sequence


def side_by_side(header: str, names: Sequence[str], rows: Sequence[tuple[str, Sequence[str]]],
                 label_width: int, width: int) -> list[str]:
    """Lines of a table: `header` over the labels, `names` over the columns, one line per row."""
    lines = [f"{header:<{label_width}}" + "".join(f"{n:>{width}}" for n in names)]
    lines += [f"{label:<{label_width}}" + "".join(f"{c:>{width}}" for c in cells) for label, cells in rows]
    return lines


def rows_of(items: Sequence, rows: Sequence[tuple[str, Callable]]) -> list[tuple[str, list[str]]]:
    """(label, formatter) rows applied to every item: (label, cells)."""
    return [(label, [fmt(item) for item in items]) for label, fmt in rows]
