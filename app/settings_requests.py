"""Settings as a transaction, the window's side: a change travels as its changes from what is already
asked for, with a request id; the controls show it pending until the engine answers that id."""
from __future__ import annotations

import itertools

from engine.protocol import Apply, settings_delta
from engine.settings import Settings


class SettingsRequests:
    """The requests not answered yet (`pending`), and those held while a restarted engine loads."""

    def __init__(self, controls):
        self.controls = controls
        self._ids = itertools.count(1)
        self.pending: dict[int, tuple] = {}  # request id -> its changes
        self.after_load: list[Apply] = []  # made while a restarted engine loads: sent once it has
        self.quality_asked = False  # the quantised copies' quality is measured once

    @property
    def waiting(self) -> bool:
        return bool(self.pending) or bool(self.after_load)

    def ask(self, new: Settings) -> Apply | None:
        """The command for `new` (None: nothing changes), marked pending."""
        changes = settings_delta(self.controls.requested, new)
        if not changes:
            return None
        request_id = next(self._ids)
        self.pending[request_id] = changes
        self.show()
        return Apply(changes=changes, request_id=request_id)

    def answered(self, *request_ids: int) -> None:
        for request_id in request_ids:
            self.pending.pop(request_id, None)
        self.show()

    def drop(self) -> None:
        """Whatever was asked is not coming (the engine died, another source feeds the window)."""
        self.pending.clear()
        self.after_load = []
        self.show()

    def take_after_load(self) -> list[Apply]:
        after, self.after_load = self.after_load, []
        return after

    def show(self) -> None:
        fields: dict = {}
        for request_id in sorted(self.pending):
            fields.update(self.pending[request_id])
        self.controls.set_pending(fields)
