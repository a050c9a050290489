"""Quality of a weight setting: perplexity on a fixed evaluation text, and top-1 agreement
with the floating-point model (how often both predict the same next token).

The evaluation text is read at run time from what every Python ships: the docstrings of a
fixed list of standard-library modules, in that order (no third-party prose is stored in this
repository). It differs between Python versions, so figures come with the version and a
fingerprint of the text; compare settings within one run, as `membound bench` does."""
from __future__ import annotations

import hashlib
import importlib
import inspect
import math
import sys

import torch
import torch.nn.functional as F

from engine.events import Quality

# Modules whose docstrings are mostly English prose (few code listings).
EVALUATION_MODULES = ("argparse", "csv", "json", "statistics", "heapq", "unittest", "doctest", "sched",
                      "itertools", "difflib", "collections", "random", "typing", "string", "pickle")
DEFAULT_TOKENS = 2048
DEFAULT_WINDOW = 512


def evaluation_text() -> str:
    """The module docstrings of EVALUATION_MODULES, joined by blank lines (deterministic for a
    given Python version)."""
    docs = [inspect.getdoc(importlib.import_module(name)) or "" for name in EVALUATION_MODULES]
    return "\n\n".join(d for d in docs if d)


def text_description(ids: list[int]) -> str:
    digest = hashlib.sha256(evaluation_text().encode()).hexdigest()[:12]
    return (f"{len(ids)} tokens of Python {sys.version_info.major}.{sys.version_info.minor} standard-library "
            f"docstrings (text sha256 {digest})")


def evaluation_ids(tokenizer, n_tokens: int = DEFAULT_TOKENS) -> list[int]:
    ids = tokenizer.encode(evaluation_text())
    if len(ids) < 2:
        raise ValueError("the evaluation text tokenised to fewer than 2 tokens")
    return ids[:n_tokens]


@torch.inference_mode()
def score(model, ids: list[int], window: int = DEFAULT_WINDOW) -> tuple[float, int, torch.Tensor]:
    """Teacher-forced pass over `ids` in independent windows of `window` tokens (no cache):
    (summed negative log-likelihood, tokens predicted, argmax prediction per position)."""
    nll, count, argmax = 0.0, 0, []
    for start in range(0, len(ids) - 1, window):
        chunk = ids[start:start + window + 1]
        if len(chunk) < 2:
            break
        tokens = torch.tensor([chunk[:-1]], dtype=torch.long, device=model.device)
        targets = torch.tensor(chunk[1:], dtype=torch.long, device=model.device)
        logits = model(tokens, start_pos=0, cache=None, last_only=False)[0].float()  # (T, vocab)
        nll += F.cross_entropy(logits, targets, reduction="sum").item()
        count += len(targets)
        argmax.append(logits.argmax(dim=-1).cpu())
    return nll, count, torch.cat(argmax)


def evaluate(models: dict, ids: list[int], reference: str, window: int = DEFAULT_WINDOW) -> dict[str, Quality]:
    """Quality of each named model on `ids`; agreement is measured against models[reference]."""
    scored = {name: score(model, ids, window) for name, model in models.items()}
    ref_argmax = scored[reference][2]
    return {name: Quality(name, math.exp(nll / count), (argmax == ref_argmax).float().mean().item(), count)
            for name, (nll, count, argmax) in scored.items()}


# ---- the weight settings side by side (the bench's sweep, the app's quality table) -----------
def weight_variants(settings, group_size: int = 32) -> dict:
    """label → settings for fp (the dtype itself), int8 and int4 at `group_size`; fp first."""
    from dataclasses import replace
    return {settings.dtype: replace(settings, weights="fp"),
            "int8": replace(settings, weights="int8"),
            f"int4 g{group_size}": replace(settings, weights="int4", group_size=group_size)}


def weight_quality(engine, variants: dict | None = None, n_tokens: int = 512) -> dict[str, Quality]:
    """Perplexity and top-1 agreement (against the first variant) of each weight setting, on
    the engine's model; quantised copies not made yet are made (and kept). Seconds on a CPU:
    call it off the GUI thread."""
    variants = variants or weight_variants(engine.settings, engine.settings.group_size)
    ids = evaluation_ids(engine.tokenizer, n_tokens)
    models = {label: engine.model_for(s) for label, s in variants.items()}
    window = min(DEFAULT_WINDOW, engine.max_context - 1)
    return evaluate(models, ids, reference=next(iter(variants)), window=window)
