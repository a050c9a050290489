"""The settings transaction: what the front end asked for and the engine does not run yet
(`pending`), the request ids that change answers, and the answer once it is taken or refused."""
from __future__ import annotations

import threading
import time
from dataclasses import replace
from typing import Callable

from engine.events import SettingsApplied, SettingsRefused
from engine.settings import Settings, describe_change


class SettingsTransaction:
    """Thread-safe: `ask` from any thread; `take` on the engine's thread, between steps. Asking
    again before a take lays the new settings over the old and answers both requests."""

    def __init__(self):
        self._lock = threading.Lock()
        self.pending: Settings | None = None  # asked for, not yet running
        self.pending_ids: list[int] = []  # the front end's requests `pending` answers

    def ask(self, settings: Settings, request_id: int = 0) -> None:
        with self._lock:
            self.pending = settings
            if request_id:
                self.pending_ids.append(request_id)

    def requested(self, running: Settings) -> Settings:
        """What the engine will run once pending changes are taken: the base a change is laid over."""
        pending = self.pending
        return pending if pending is not None else running

    @property
    def has_pending(self) -> bool:
        return self.pending is not None

    def drop_capture(self, running: Settings) -> None:
        """A capture failed and decode went eager for good: the settings say so at the next step."""
        with self._lock:
            base = self.pending if self.pending is not None else running
            if base.cuda_graphs:
                self.pending = replace(base, cuda_graphs=False)

    def take(self, ready: Callable[[Settings], bool]) -> tuple[Settings, list[int]] | None:
        """The pending settings and the ids they answer, now no longer pending; None when nothing is
        pending or `ready(pending)` says its models are still being made (they stay pending)."""
        with self._lock:
            new, ids = self.pending, self.pending_ids
            if new is None or not ready(new):
                return None
            self.pending, self.pending_ids = None, []
        return new, ids


def refused(ids: list[int], error: BaseException, running: Settings) -> list[SettingsRefused]:
    """Every request answered with the one-line reason; the engine keeps `running`."""
    reason = str(error).strip().splitlines()[0] if str(error).strip() else type(error).__name__
    return [SettingsRefused(request_id, reason, running) for request_id in ids or [0]]


def applied(old: Settings, new: Settings, ids: list[int], step: int) -> list[SettingsApplied]:
    """[SettingsApplied], also for a change that turned out to change nothing (every request is
    answered); [] for nothing changed and nobody to answer."""
    changes = describe_change(old, new)
    if not changes and not ids:
        return []
    return [SettingsApplied(new, changes, step, time.monotonic(), tuple(ids))]
