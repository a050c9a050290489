"""The verdicts of `membound --tour FILE --check` (engine/tour_check.py), kept per machine and tour so
the window's tour leaves out, on this machine, a step whose caption's direction did not hold here.
Torch-free: the window reads them."""
from __future__ import annotations

import json
import os
import time
from pathlib import Path

from engine.hardware.roof import machine_name

TOURS_DIR = Path(__file__).resolve().parents[1] / "assets" / "tours"


def tour_file(spec: str) -> Path:
    return TOURS_DIR / "default.toml" if spec == "default" else Path(spec)


def verdicts_file() -> Path:
    """MEMBOUND_TOUR_CHECKS, else the user's cache dir (membound/tour-check.json)."""
    override = os.environ.get("MEMBOUND_TOUR_CHECKS")
    if override:
        return Path(override)
    return Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache")) / "membound" / "tour-check.json"


def _key(tour: str) -> str:
    return f"{machine_name()} | {tour_file(tour).resolve()}"


def _read() -> dict:
    try:
        data = json.loads(verdicts_file().read_text())
    except (OSError, ValueError):
        return {}
    return data if isinstance(data, dict) else {}


def save_verdicts(tour: str, steps: dict[int, tuple[bool, str]], device: str, model: str) -> None:
    """steps: step number -> (the direction holds, its one line)."""
    data = _read()
    data[_key(tour)] = {"device": device, "model": model, "checked_at": time.strftime("%Y-%m-%d %H:%M"),
                        "steps": {str(n): {"holds": holds, "line": line} for n, (holds, line) in steps.items()}}
    path = verdicts_file()
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_suffix(".tmp")
        tmp.write_text(json.dumps(data, indent=1, ensure_ascii=False))
        os.replace(tmp, path)
    except OSError:
        pass  # an unwritable cache: the tour shows every step, as before any check


def failed_steps(tour: str) -> dict[int, str]:
    """Steps of `tour` whose direction did not hold when last checked on this machine: number -> why."""
    entry = _read().get(_key(tour))
    if not isinstance(entry, dict) or not isinstance(entry.get("steps"), dict):
        return {}
    out = {}
    for number, verdict in entry["steps"].items():
        if isinstance(verdict, dict) and verdict.get("holds") is False and str(number).isdigit():
            out[int(number)] = str(verdict.get("line", ""))
    return out
