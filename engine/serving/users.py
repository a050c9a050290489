"""Simulated users, pure Python: N users, each sending one request at a time (a prompt from a set,
a varied output length), waiting for its last token, thinking, then sending the next. `due(now)`
returns the requests whose time has come; `finished(request, now)` starts that user's think time.
Deterministic for a seed, so a static and a continuous run see the same workload."""
from __future__ import annotations

import random
from dataclasses import dataclass
from pathlib import Path

from engine.serving.scheduler import Request

PROMPTS_FILE = Path(__file__).resolve().parents[2] / "assets" / "user_prompts.txt"


def bundled_prompts(path: Path = PROMPTS_FILE) -> list[str]:
    """The prompts simulated users send: one per line of assets/user_prompts.txt (# comments)."""
    lines = path.read_text(encoding="utf-8").splitlines()
    return [line.strip() for line in lines if line.strip() and not line.lstrip().startswith("#")]


@dataclass(frozen=True)
class Workload:
    prompts: tuple[tuple[int, ...], ...]  # token ids; each request takes one
    prompt_lens: tuple[int, int] | None = (16, 128)  # cut (or repeated) to uniform in [lo, hi]; None: as is
    output_lens: tuple[int, int] = (8, 64)
    think_s: tuple[float, float] = (0.0, 0.0)
    eos_ids: frozenset[int] = frozenset()


class SimulatedUsers:
    def __init__(self, n_users: int, workload: Workload, seed: int = 0, first_id: int = 1_000_000,
                 max_requests: int | None = None, start_s: float = 0.0):
        if not workload.prompts or any(not p for p in workload.prompts):
            raise ValueError("simulated users need at least one non-empty prompt")
        self.workload = workload
        self.rng = random.Random(seed)  # requests (prompt, lengths), in the order they are sent
        # Think times come from their own generator: they are drawn as replies end, in an order that
        # depends on the batching policy, and must not change which requests are sent (a static and
        # a continuous run of one seed serve the same requests).
        self.think_rng = random.Random(f"think-{seed}")
        self.next_id = first_id  # far from the person's own request ids
        self.max_requests = max_requests
        self.sent = 0
        self._next_send_s = {user: start_s for user in range(n_users)}  # user -> when it sends next
        self._user_of: dict[int, int] = {}  # request id -> the user waiting on it
        self._target = n_users

    @property
    def n_users(self) -> int:
        return len(self._next_send_s) + len(self._user_of)

    def set_users(self, n_users: int, now: float) -> None:
        """Grow at once; shrink by retiring idle users (busy ones leave when their request ends)."""
        self._target = n_users
        while self.n_users < n_users:
            self._next_send_s[max(self._all_users(), default=-1) + 1] = now
        for user in sorted(self._next_send_s, reverse=True):
            if self.n_users <= n_users:
                break
            del self._next_send_s[user]

    def _all_users(self):
        return list(self._next_send_s) + list(self._user_of.values())

    def due(self, now: float) -> list[Request]:
        out = []
        for user, at in sorted(self._next_send_s.items()):
            if at > now or (self.max_requests is not None and self.sent >= self.max_requests):
                continue
            del self._next_send_s[user]
            out.append(self._new_request(user, now))
        return out

    def finished(self, request: Request, now: float) -> None:
        user = self._user_of.pop(request.request_id, None)
        if user is not None and self.n_users < self._target:  # else it leaves (the slider went down)
            lo, hi = self.workload.think_s
            self._next_send_s[user] = now + self.think_rng.uniform(lo, hi)

    @property
    def done(self) -> bool:
        """Every request sent (max_requests reached) and answered."""
        return self.max_requests is not None and self.sent >= self.max_requests and not self._user_of

    def _new_request(self, user: int, now: float) -> Request:
        w, rng = self.workload, self.rng
        prompt = rng.choice(w.prompts)
        n = len(prompt) if w.prompt_lens is None else rng.randint(*w.prompt_lens)
        ids = (prompt * -(-n // len(prompt)))[:n]
        req = Request(self.next_id, list(ids), rng.randint(*w.output_lens), w.eos_ids, arrival_s=now)
        self._user_of[req.request_id] = user
        self.next_id += 1
        self.sent += 1
        return req
