"""Preallocated ring buffers of float columns (numpy). The GUI appends one row per engine step or
hardware sample and reads whole columns, oldest first, when a plot redraws; nothing else allocates."""
from __future__ import annotations

import numpy as np


class RingBuffer:
    def __init__(self, capacity: int, columns: tuple[str, ...]):
        if capacity < 1:
            raise ValueError("capacity must be >= 1")
        self.capacity = capacity
        self.columns = columns
        self._index = {name: i for i, name in enumerate(columns)}
        self._data = np.full((len(columns), capacity), np.nan)
        self._next = 0  # slot the next row goes into
        self.total = 0  # rows ever appended (also counts those overwritten)

    def __len__(self) -> int:
        return min(self.total, self.capacity)

    def append(self, **values: float) -> None:
        """One row; columns not given are NaN."""
        slot = self._next
        self._data[:, slot] = np.nan
        for name, value in values.items():
            self._data[self._index[name], slot] = np.nan if value is None else value
        self._next = (slot + 1) % self.capacity
        self.total += 1

    def column(self, name: str, last: int | None = None) -> np.ndarray:
        """The column's rows, oldest first (a fresh array); only the newest `last` rows if given."""
        row = self._data[self._index[name]]
        n = len(self)
        if last is not None:
            n = max(0, min(n, last))
        start = (self._next - n) % self.capacity if n else 0
        if start + n <= self.capacity:
            return row[start:start + n].copy()
        return np.concatenate((row[start:], row[: start + n - self.capacity]))

    def last(self, name: str) -> float:
        if self.total == 0:
            return float("nan")
        return float(self._data[self._index[name], (self._next - 1) % self.capacity])

    def clear(self) -> None:
        self._data[:] = np.nan
        self._next = 0
        self.total = 0
