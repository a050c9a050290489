"""`membound bench --sweep speculative`: speculative decoding on an input-grounded workload (prompts
that ask to repeat, correct or summarise a passage given in the prompt), k = 0, 2, 4, 8 for each draft
source, greedy and sampled, on one engine in one run: decode tok/s and its ratio to k = 0, the
acceptance rate and the mean accepted run. The oracle is the upper bound, and is labelled so.

Configurations take turns prompt by prompt (with --repeats N, N rounds in alternating order, each
reply's fastest run kept), so load from elsewhere falls on each alike. Decode tok/s is wall clock
from a reply's first token to its last, as `membound bench` times it; greedy replies
must be token-for-token those of k = 0 (checked: a speculative step is lossless or the run fails)."""
from __future__ import annotations

import json
import platform
import statistics
import sys
from dataclasses import asdict, dataclass, replace
from types import MappingProxyType

from engine.bench.tables import rows_of, side_by_side

SOURCES = ("ngram", "draft", "oracle")
DRAFT_LENGTHS = (2, 4, 8)
SOURCE_LABELS = {"none": "none (k = 0)", "ngram": "prompt lookup", "draft": "draft model",
                 "oracle": "oracle (upper bound)"}

# Self-written passages; each task's answer is grounded in its passage.
PASSAGES = (
    "Every token a language model writes costs one full read of its weights from memory. A chip can "
    "multiply far faster than its memory can deliver those bytes, so a single conversation waits on "
    "bandwidth, not on arithmetic. Batching shares each read among many conversations, and smaller "
    "weights make each read cheaper.",
    "The lighthouse keeper climbed the hundred steps at dusk, lit the lamp, and wrote the time in his "
    "log. Ships passed in the night without knowing his name. In the morning he put the lamp out, "
    "cleaned the glass, and walked down to the village for bread.",
    "To make bread, mix flour, water, salt and yeast into a dough. Knead it for ten minutes until it is "
    "smooth, then let it rise for an hour in a warm place. Shape the loaf, let it rise again, and bake "
    "it in a hot oven for about forty minutes.",
)
TASKS = (
    ("repeat", "Repeat the following paragraph exactly, word for word:\n\n{passage}"),
    ("correct", "Correct the spelling mistakes in this paragraph and write it out in full:\n\n{typos}"),
    ("summarise", "Summarise this paragraph in two sentences, reusing its wording:\n\n{passage}"),
)
TYPOS = (("memory", "memroy"), ("language", "langauge"), ("night", "nigth"), ("village", "vilage"),
         ("smooth", "smoth"), ("minutes", "minuets"))


def workload() -> list[tuple[str, str]]:
    """(name, prompt) pairs: every task on every passage."""
    prompts = []
    for i, passage in enumerate(PASSAGES):
        typos = passage
        for right, wrong in TYPOS:
            typos = typos.replace(right, wrong)
        for task, template in TASKS:
            prompts.append((f"{task} {i + 1}", template.format(passage=passage, typos=typos)))
    return prompts


@dataclass
class SpecPoint:
    source: str  # "none" (k = 0), "ngram", "draft", "oracle" (the upper bound)
    k: int
    sampling: str  # "greedy" | "sampled"
    decode_tokens_per_s: float
    speedup: float  # decode tok/s over k = 0's, same sampling
    acceptance_rate: float  # guesses kept / guesses checked (nan at k = 0)
    mean_accepted: float  # guesses kept per verify step
    tokens_per_weight_read: float  # tokens per target step (1 at k = 0)
    draft_time_share: float  # of decode time, in draft-model steps
    target_step_ms: float  # median time of the target's steps (decode at k = 0, else verify: k + 1 tokens)
    tokens: int  # decode tokens over the workload
    slowest_step_ms: float = float("nan")  # the longest decode-phase step (a compile, a capture, a stall)
    in_steps: float = float("nan")  # of the replies' decode wall time, the share inside their steps
    label: str = ""


def add_speculative_args(bench) -> None:
    bench.add_argument("--draft-model", default="self",
                       help="the draft source's model: self (the target at --draft-weights), default, a .gguf, "
                            "an HF folder or synthetic:SHAPE (default self)")
    bench.add_argument("--draft-weights", choices=["fp", "int8", "int4"], default="int4",
                       help="the draft model's weights (default int4)")
    bench.add_argument("--draft-lengths", metavar="K,K,...", help="k for --sweep speculative (default 2,4,8; "
                       "k = 0 always runs)")
    bench.add_argument("--sources", metavar="S,S,...", help="draft sources for --sweep speculative "
                       "(default ngram,draft,oracle)")
    bench.add_argument("--prompts", type=int, help="--sweep speculative: the first N prompts of the workload "
                       f"(default all {len(PASSAGES) * len(TASKS)})")


def measure(engine, prompt_ids: list[int], decode_tokens: int):
    """One reply: (token ids, steps, decode wall seconds from the first token to the last)."""
    import time

    from engine.events import DoneEvent, TokenEvent
    from engine.metrics import StepMetrics

    engine.reset()
    tokens, steps, t_first, t_done = [], [], 0.0, 0.0
    for event in engine.generate(prompt_ids, max_new_tokens=decode_tokens):
        if isinstance(event, StepMetrics):
            steps.append(event)
        elif isinstance(event, TokenEvent):
            if event.index == 0:
                t_first = time.perf_counter()
            if event.token_id >= 0:
                tokens.append(event.token_id)
        elif isinstance(event, DoneEvent):
            t_done = time.perf_counter()
    return tokens, steps, t_done - t_first


def run_speculative_sweep(args, progress) -> int:
    from engine.conversation import Conversation
    from engine.engine import Engine
    from engine.hardware.spec import describe
    from engine.metrics import DECODE_PHASES
    from engine.protocol import default_dtype
    from engine.settings import SamplingParams, Settings

    dtype = args.dtype or default_dtype(args.device)
    lengths = _ints(args.draft_lengths) if args.draft_lengths else DRAFT_LENGTHS
    sources = tuple(args.sources.split(",")) if args.sources else SOURCES
    bad = [s for s in sources if s not in SOURCES]
    if bad or any(not 1 <= k <= 8 for k in lengths):
        raise ValueError(f"--sources takes {', '.join(SOURCES)} and --draft-lengths 1..8")
    if args.decode_tokens < 2:
        raise ValueError("the sweep needs --decode-tokens >= 2")
    samplings = {"greedy": SamplingParams(greedy=True, temperature=0.0),
                 "sampled": SamplingParams(temperature=0.7, top_p=0.95, seed=0)}
    base = Settings(dtype=dtype, weights=args.weights, group_size=args.group_size, kv_layout=args.kv_layout,
                    attention=args.attention, max_new_tokens=args.decode_tokens, draft_model=args.draft_model,
                    draft_weights=args.draft_weights)
    configs = {}
    for sampling_name, sampling in samplings.items():
        configs[("none", 0, sampling_name)] = replace(base, sampling=sampling)
        for source in sources:
            for k in lengths:
                configs[(source, k, sampling_name)] = replace(base, sampling=sampling, speculate=source, draft_tokens=k)
    engine = Engine(args.model, device=args.device, dtype=dtype, max_context=args.max_context, progress=progress,
                    settings=base)
    print(f"model: {engine.loaded.label}", file=sys.stderr)
    print(f"device: {describe(engine.hardware)}", file=sys.stderr)
    prompts = workload()[: args.prompts or None]
    conversation = Conversation(engine.tokenizer)
    prompt_ids = [conversation.prompt_ids(text) for _, text in prompts]
    for i, (key, settings) in enumerate(configs.items()):  # each copy made, each path warmed up
        progress(i / len(configs), f"warming up {_label(key)}")
        engine.apply(settings)
        measure(engine, prompt_ids[0][-64:], 8)
    runs = {key: [] for key in configs}
    repeats = max(1, args.repeats)
    total = len(prompt_ids) * len(configs) * repeats
    ties: list[str] = []  # greedy replies that parted from plain decoding at a rounding tie
    for p, ids in enumerate(prompt_ids):
        greedy_tokens, best = None, {}
        for r in range(repeats):
            order = list(configs.items()) if r % 2 == 0 else list(configs.items())[::-1]  # drift falls on all
            for i, (key, settings) in enumerate(order):
                progress(((p * repeats + r) * len(configs) + i) / total,
                         f"prompt {p + 1}/{len(prompt_ids)} ({prompts[p][0]}), run {r + 1}/{repeats}: {_label(key)}")
                engine.apply(settings)
                tokens, steps, wall_s = measure(engine, ids, args.decode_tokens)
                if any(s.settings_label != settings.label for s in steps):
                    raise RuntimeError(f"the sweep asked for {_label(key)}, but a step ran other settings")
                if key[2] == "greedy":
                    if greedy_tokens is None:
                        greedy_tokens = tokens
                    elif tokens != greedy_tokens:
                        tie = near_tie(engine.model, ids, greedy_tokens, tokens)
                        if tie is None:
                            raise RuntimeError(f"{_label(key)} changed the greedy reply to {prompts[p][0]!r}: "
                                               "speculation must be lossless")
                        ties.append(f"{_label(key)}, {prompts[p][0]!r}: {tie}")
                if key not in best or wall_s < best[key][2]:  # the fastest of the repeats, as timeit reports
                    best[key] = (tokens, [s for s in steps if s.phase in DECODE_PHASES], wall_s)
        for key in configs:
            runs[key].append(best[key])
    progress(1.0, "done")
    points = [_point(key, runs[key], runs[("none", 0, key[2])]) for key in configs]
    print(f"\nworkload: {len(prompts)} input-grounded prompts (repeat, correct, summarise a passage given in the "
          f"prompt), up to {args.decode_tokens} tokens each (EOS ends a reply), batch 1, {base.label}, the fastest of "
          f"{repeats} run{'s' * (repeats > 1)} of each reply; sampled: "
          f"T=0.7 top-p 0.95 seed 0; draft model: {args.draft_model} at {args.draft_weights}")
    print(format_speculative(points))
    for line in ties:
        print(f"parted from plain decoding at a tie: {line}")
    if args.json:
        payload = {
            "command": "membound " + " ".join(sys.argv[1:]), "model": engine.loaded.label,
            "device": engine.hardware.to_dict(), "dtype": dtype, "machine": platform.platform(),
            "prompts": [name for name, _ in prompts], "repeats": repeats, "results": [asdict(p) for p in points],
            "parted_at_ties": ties,
        }
        with open(args.json, "w") as f:
            json.dump(payload, f, indent=1)
        print(f"wrote {args.json}", file=sys.stderr)
    return 0


# how close, as a share of the logits' spread, the two tokens' logits may be for the reply's parting to
# count as rounding: a verify step of k+1 rows rounds differently from a one-row step where the
# products are not computed row by row (a GPU's matmuls pick their algorithm by shape)
TIE_SHARE = MappingProxyType({"fp32": 1e-4, "bf16": 3e-2, "fp16": 1e-2})


def near_tie(model, prompt_ids: list[int], plain: list[int], other: list[int]) -> str | None:
    """Where a greedy reply parts from plain decoding's: a line saying at which token and by how
    little, if the two tokens are a near-tie in a reference pass (the model's own forward over the
    prompt and plain's tokens before the parting), else None: a real change."""
    import torch

    from engine.hardware.spec import dtype_name

    d = next((i for i, (a, b) in enumerate(zip(plain, other)) if a != b), None)
    if d is None:  # one reply ends where the other goes on: not a tie between two tokens
        return None
    with torch.inference_mode():
        tokens = torch.tensor([prompt_ids + plain[:d]], device=model.device)
        logits = model(tokens, start_pos=0, cache=None, last_only=True)[0, -1].float()
    a, b = plain[d], other[d]
    spread = float(logits.max() - logits.min()) or 1.0
    share = abs(float(logits[a] - logits[b])) / spread
    if share > TIE_SHARE.get(dtype_name(model.dtype), 1e-4):
        return None
    return f"token {d + 1} of {len(plain)}, logits {share:.1e} of their spread apart"


def _point(key, runs, baseline) -> SpecPoint:
    source, k, sampling = key

    def rate(rs):
        return sum(max(0, len(t) - 1) for t, _, _ in rs) / sum(w for _, _, w in rs)

    steps = [s for _, ss, _ in runs for s in ss]
    verifies = [s for s in steps if s.phase == "verify"]
    drafted = sum(s.draft_tokens for s in verifies)
    accepted = sum(s.accepted_tokens for s in verifies)
    target_steps = [s for s in steps if s.phase != "draft"]
    decode_s = sum(s.step_s for s in steps)
    tokens = sum(max(0, len(t) - 1) for t, _, _ in runs)
    return SpecPoint(
        source=source, k=k, sampling=sampling, decode_tokens_per_s=rate(runs), speedup=rate(runs) / rate(baseline),
        acceptance_rate=accepted / drafted if drafted else float("nan"),
        mean_accepted=accepted / len(verifies) if verifies else float("nan"),
        tokens_per_weight_read=sum(s.tokens_out for s in target_steps) / max(1, len(target_steps)),
        draft_time_share=sum(s.step_s for s in steps if s.phase == "draft") / decode_s if decode_s else 0.0,
        target_step_ms=1e3 * statistics.median(s.step_s for s in target_steps) if target_steps else float("nan"),
        tokens=tokens, label=_label(key),
        slowest_step_ms=1e3 * max((s.step_s for s in steps), default=float("nan")),
        in_steps=decode_s / wall if (wall := sum(w for _, _, w in runs)) else float("nan"))


def _label(key) -> str:
    source, k, sampling = key
    return f"{SOURCE_LABELS[source]}{f' k={k}' if k else ''}, {sampling}"


def format_speculative(points: list[SpecPoint]) -> str:
    rows = [
        ("decode tok/s", lambda p: f"{p.decode_tokens_per_s:,.1f}"),
        ("vs k = 0", lambda p: f"{p.speedup:.2f}x"),
        ("acceptance", lambda p: _or_dash(p.k and f"{100 * p.acceptance_rate:.0f}%", p.acceptance_rate)),
        ("mean accepted", lambda p: _or_dash(p.k and f"{p.mean_accepted:.2f}", p.mean_accepted)),
        ("tokens / weight read", lambda p: f"{p.tokens_per_weight_read:.2f}"),
        ("target step (median)", lambda p: f"{p.target_step_ms:.1f} ms"),
        ("draft time", lambda p: f"{100 * p.draft_time_share:.0f}%" if p.source == "draft" else ""),
        ("tokens", lambda p: f"{p.tokens}"),
        ("slowest step", lambda p: f"{p.slowest_step_ms:.1f} ms"),
        ("wall time in steps", lambda p: f"{100 * p.in_steps:.0f}%"),
    ]
    lines = []
    for sampling in dict.fromkeys(p.sampling for p in points):
        group = [p for p in points if p.sampling == sampling]
        names = [("k=0" if p.k == 0 else f"{_short(p.source)} k={p.k}") for p in group]
        lines += ["", f"{sampling}:"] + side_by_side("", names, rows_of(group, rows), 22, 13)
    lines.append("oracle*: the target's own greedy reply computed beforehand: the upper bound, not a method (a "
                 "sampled reply leaves it at its first different token; from there it guesses nothing, -)")
    return "\n".join(lines)


def _or_dash(text, value: float) -> str:
    """'' at k = 0; '-' where nothing was guessed (nan)."""
    if not text:
        return ""
    return "-" if value != value else text


def _short(source: str) -> str:
    return {"ngram": "lookup", "draft": "draft", "oracle": "oracle*"}[source]


def _ints(text: str) -> tuple[int, ...]:
    try:
        return tuple(int(v) for v in text.split(","))
    except ValueError:
        raise ValueError(f"expected whole numbers separated by commas, got {text!r}") from None
