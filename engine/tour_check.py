"""`membound --tour default --check`: every step of a tour that states a direction (its `expect` in the
tour file: decode faster with the KV cache on, with INT8, with INT4; aggregate tokens/s higher with
more users; fewer bytes per token with speculation ...) measured on this machine's engine, headless:
each step's figure beside the one it is compared with, and whether the caption's direction holds.

A step whose direction does not hold here says why in one line; the verdicts are kept (per machine,
tour and model) so the window's tour leaves such a step out on this machine (app/tour.py).

    expect = { figure = "decode_tokens_per_s", direction = "higher", than = { weights = "fp" } }
    expect = { figure = "mbu", at_most = 1.0 }      # a bound instead of a comparison

`than` is the step's own settings with these changed (so only the lever the caption names moves).
Figures: decode_tokens_per_s, bytes_per_token, aggregate_tokens_per_s (the batch with its users),
mbu, prefill_intensity_over_ridge, decode_intensity_over_ridge."""
from __future__ import annotations

import sys
import time
import tomllib
from dataclasses import dataclass, replace
from typing import Any

from engine.events import BatchStats, DoneEvent
from engine.metrics import DECODE_PHASES, StepMetrics
from engine.protocol import with_changes
from engine.settings import Settings
from engine.tour_verdicts import save_verdicts, tour_file

FIGURES = ("decode_tokens_per_s", "bytes_per_token", "aggregate_tokens_per_s", "mbu",
           "prefill_intensity_over_ridge", "decode_intensity_over_ridge")
DIRECTIONS = ("higher", "lower")
DECODE_TOKENS = 24  # tokens a measured reply decodes (the first few warm up and are left out)
WARM_TOKENS = 4
BATCH_STEPS = 24  # at least this many batched steps measured for an aggregate rate, after the batch fills,
BATCH_REQUESTS = 2  # and on until the users' requests finished this many times over: a static batch differs
# from a continuous one only once its first member ends (its slot then sits empty until the longest ends)
REPEATS = 2  # each side of a comparison measured this often, interleaved; the best is kept
DEFAULT_PROMPT = "Explain, step by step, why generating text one token at a time waits on memory."


class TourCheckError(ValueError):
    """A tour's `expect` that cannot be checked (one line naming the file and step)."""


@dataclass(frozen=True)
class Expect:
    figure: str
    direction: str = ""  # "higher" | "lower" than `than`; "" for a bound
    than: tuple[tuple[str, Any], ...] = ()
    at_most: float | None = None
    at_least: float | None = None


@dataclass(frozen=True)
class CheckStep:
    number: int
    title: str
    settings: Settings  # what the tour runs at this step
    prompt: str
    expects: tuple[Expect, ...]


@dataclass(frozen=True)
class Verdict:
    number: int
    title: str
    holds: bool
    line: str  # the figure(s) and the verdict, one line


def read_expectations(spec: str, settings_type: type = Settings) -> list[CheckStep]:
    """The tour's steps with their settings (laid over one another, as the window runs them) and
    their expectations. Steps needing a setting this engine lacks are left out, as the window does."""
    path = tour_file(spec)
    try:
        doc = tomllib.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, tomllib.TOMLDecodeError) as error:
        raise TourCheckError(f"{spec}: cannot read the tour: {error}") from None
    head = doc.get("tour", {})
    optional = set(head.get("optional", []))
    known = {f for f in settings_type.__dataclass_fields__}
    current = with_changes(settings_type(), _pairs(head.get("settings", {}), known, optional))
    prompt = DEFAULT_PROMPT
    out = []
    for number, raw in enumerate(doc.get("step", []), 1):
        if raw.get("requires") and raw["requires"] not in known:
            continue
        current = with_changes(current, _pairs(raw.get("settings", {}), known, optional))
        prompt = _english(raw.get("prompt")) or prompt
        expects = raw.get("expect", [])
        expects = [expects] if isinstance(expects, dict) else expects
        parsed = tuple(_expect(e, f"{spec}: step {number}", known, optional) for e in expects)
        out.append(CheckStep(number, _english(raw.get("title")) or f"step {number}", current, prompt, parsed))
    return out


def _english(value) -> str:
    if isinstance(value, dict):
        value = value.get("en", "")
    return value.strip() if isinstance(value, str) else ""


def _pairs(raw: dict, known: set, optional: set) -> tuple[tuple[str, Any], ...]:
    return tuple((k, v) for k, v in raw.items() if k in known or k not in optional)


def _expect(raw, where: str, known: set, optional: set) -> Expect:
    if not isinstance(raw, dict) or raw.get("figure") not in FIGURES:
        raise TourCheckError(f"{where}: expect: a table with figure = one of {', '.join(FIGURES)}")
    direction = raw.get("direction", "")
    bounded = "at_most" in raw or "at_least" in raw
    if bounded == bool(direction) or (direction and direction not in DIRECTIONS):
        raise TourCheckError(f"{where}: expect: give direction = higher|lower with than = {{…}}, or at_most/at_least")
    than = _pairs(raw.get("than", {}), known, optional)
    if direction and not than:
        raise TourCheckError(f"{where}: expect: direction {direction!r} needs than = {{ setting = value }}")
    return Expect(raw["figure"], direction, than, raw.get("at_most"), raw.get("at_least"))


# ---- measuring ------------------------------------------------------------------------------------
def measure(engine, settings: Settings, prompt: str, figure: str) -> float:
    """One figure of `settings` on `engine` (a fresh conversation each time)."""
    engine.apply(replace(settings, users=settings.users if figure == "aggregate_tokens_per_s" else 0,
                         max_new_tokens=DECODE_TOKENS))
    engine.take_settings(wait=True)
    engine.reset()
    if figure == "aggregate_tokens_per_s":
        return _aggregate(engine, settings)
    steps = _reply_steps(engine, prompt)
    decode = [s for s in steps if s.phase in DECODE_PHASES][WARM_TOKENS:]
    if figure in ("prefill_intensity_over_ridge", "decode_intensity_over_ridge"):
        chosen = [s for s in steps if s.phase == "prefill"] if figure.startswith("prefill") else decode
        step = chosen[0] if figure.startswith("prefill") else chosen[-1]
        return step.arithmetic_intensity / (step.peak_flops / step.peak_bandwidth_bps)
    seconds = sum(s.step_s for s in decode)
    if figure == "decode_tokens_per_s":
        return sum(s.tokens_out for s in decode) / seconds
    if figure == "bytes_per_token":
        return sum(s.total_bytes for s in decode) / max(1, sum(s.tokens_out for s in decode))
    if figure == "mbu":
        return max(s.mbu for s in decode)
    raise TourCheckError(f"unknown figure {figure!r}")


def _reply_steps(engine, prompt: str) -> list[StepMetrics]:
    steps = []
    for event in engine.chat(prompt, ignore_eos=True):
        if isinstance(event, StepMetrics):
            steps.append(event)
        elif isinstance(event, DoneEvent):
            break
    engine.reset()
    return steps


def _aggregate(engine, settings: Settings) -> float:
    """Tokens/s of the whole batch: the simulated users (and nobody else) served from the first step
    that runs as many as the settings ask for (at least two), every step after it counted, whatever
    its batch (a static batch's emptied slots are what it costs), for BATCH_STEPS steps and until
    BATCH_REQUESTS x users requests have finished."""
    if not settings.users:  # one user: its decode rate is the whole machine's
        return measure(engine, settings, DEFAULT_PROMPT, "decode_tokens_per_s")
    steps: list[StepMetrics] = []
    finished_before = finished = None
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline and (len(steps) < BATCH_STEPS or finished is None
                                           or finished - finished_before < BATCH_REQUESTS * settings.users):
        for event in engine.serve_step():
            if isinstance(event, StepMetrics) and (steps or event.batch_size >= min(settings.users, 2)):
                steps.append(event)
            elif isinstance(event, BatchStats) and steps:
                finished = event.finished_total
                finished_before = finished if finished_before is None else finished_before
    engine.apply(replace(engine.settings, users=0))
    while engine.serving and time.monotonic() < deadline + 60:  # the users leave
        engine.serve_step()
    seconds = sum(s.step_s for s in steps)
    return sum(s.tokens_out for s in steps) / seconds if seconds else float("nan")


def check_step(engine, step: CheckStep, expect: Expect, repeats: int = REPEATS) -> tuple[bool, str]:
    """(holds, one line) for one expectation of a step."""
    name = expect.figure.replace("_", " ")
    if not expect.direction:
        value = max(measure(engine, step.settings, step.prompt, expect.figure) for _ in range(repeats)) \
            if expect.at_most is None else min(measure(engine, step.settings, step.prompt, expect.figure)
                                                for _ in range(repeats))
        holds = (expect.at_most is None or value <= expect.at_most) and \
            (expect.at_least is None or value >= expect.at_least)
        bound = f"at most {expect.at_most:g}" if expect.at_most is not None else f"at least {expect.at_least:g}"
        return holds, f"{name} {_fmt(value)} ({bound}): " + ("holds" if holds else "does not hold here")
    other = with_changes(step.settings, expect.than)
    best = max if expect.figure.endswith("per_s") else min  # interference only slows a run, adds no bytes
    ours, theirs = [], []
    for _ in range(repeats):  # interleaved: a neighbour's burst hits both sides alike
        ours.append(measure(engine, step.settings, step.prompt, expect.figure))
        theirs.append(measure(engine, other, step.prompt, expect.figure))
    a, b = best(ours), best(theirs)
    holds = a > b if expect.direction == "higher" else a < b
    lever = ", ".join(f"{k}={v}" for k, v in expect.than)
    line = f"{name} {_fmt(a)} vs {_fmt(b)} with {lever}: {expect.direction}"
    if holds:
        return True, line + ", as the caption says"
    return False, line + f" expected, {_fmt(a / b if b else float('nan'))}x: does not hold here" + _why(
        engine, step, other, expect)


def _why(engine, step: CheckStep, other: Settings, expect: Expect) -> str:
    """What went the other way: for a speed, whether the bytes moved as the lever says they should."""
    if expect.figure == "aggregate_tokens_per_s" and "policy" in dict(expect.than):
        return (" (a static batch's emptied slots cost it little here: a step of fewer rows runs about as many "
                "tokens a second as a full one: `membound bench --sweep batch`)")
    if expect.figure == "aggregate_tokens_per_s":  # the bytes a token costs are the users' own here
        return " (a batched step here costs more per token than one user's: `membound bench --sweep batch`)"
    if expect.figure != "decode_tokens_per_s":
        return ""
    ours = measure(engine, step.settings, step.prompt, "bytes_per_token")
    theirs = measure(engine, other, step.prompt, "bytes_per_token")
    if ours >= theirs:
        return f" (bytes per token {_fmt(ours)} vs {_fmt(theirs)})"
    return (f" (its bytes per token fell {theirs / ours:.2f}x, but this machine's step is not bound by them: "
            "compute or per-step overhead sets its pace here)")


def _fmt(value: float) -> str:
    return f"{value:,.3g}" if abs(value) < 1000 else f"{value:,.0f}"


def run_tour_check(args) -> int:
    """Print each checked step's figure and verdict; 0 when every direction holds, 1 otherwise."""
    from engine.engine import Engine
    from engine.hardware.spec import describe

    steps = read_expectations(args.tour)
    checked = [s for s in steps if s.expects]
    import torch
    model = getattr(args, "model", None) or "default"
    device = getattr(args, "device", None) or ("cuda" if torch.cuda.is_available() else "cpu")
    dtype = getattr(args, "dtype", None) or ("fp32" if device == "cpu" else "bf16")
    engine = Engine(model, device=device, dtype=dtype, max_context=getattr(args, "max_context", None) or 4096,
                    settings=Settings(dtype=dtype, max_new_tokens=DECODE_TOKENS))
    base_dtype = engine.settings.dtype
    print(f"membound tour check · {args.tour} · {engine.loaded.label} · {describe(engine.hardware)}")
    verdicts = []
    for step in checked:
        settings = replace(step.settings, dtype=base_dtype)
        step = replace(step, settings=settings)
        results = []
        for expect in step.expects:
            try:
                results.append(check_step(engine, step, expect))
            except Exception as error:  # a setting this model/device refuses: the step says why
                results.append((False, f"{expect.figure}: could not run here: {str(error).splitlines()[0]}"))
        holds = all(ok for ok, _ in results)
        verdict = Verdict(step.number, step.title, holds, "; ".join(line for _, line in results))
        verdicts.append(verdict)
        print(f"step {step.number:>2} {step.title}: {'✓' if holds else '✗'} {verdict.line}", flush=True)
    save_verdicts(args.tour, {v.number: (v.holds, v.line) for v in verdicts}, device, model)
    failed = [v for v in verdicts if not v.holds]
    print(f"{len(verdicts) - len(failed)} of {len(verdicts)} directions hold on this machine"
          + (f"; the window's tour leaves out step {', '.join(str(v.number) for v in failed)} here" if failed else ""),
          file=sys.stderr if failed else sys.stdout)
    return 1 if failed else 0
