"""Sampling a token from logits: greedy, temperature, top-k, top-p, seeded (`SamplingParams`,
engine/settings.py, says which). `probabilities` is the distribution `sample` draws from (what
speculative decoding's verification compares a draft against)."""
from __future__ import annotations

import threading

import numpy
import torch

from engine.settings import SamplingParams

TOP_P_PREFIX = 128  # the most likely tokens looked at first; a row whose mass needs more widens 8x at a time
# A prefix settles a row only when its mass reaches top_p by this much more: the float rounding of the
# full-vocabulary cumulative sum (a few ulps of 1.0) then cannot keep a token past the prefix.
TOP_P_MARGIN = 1e-5


def probabilities(logits: torch.Tensor, params: SamplingParams) -> torch.Tensor:
    """logits (..., vocab) fp32 → the sampling distribution (..., vocab) after temperature, top-k
    and top-p, summing to 1; greedy: one-hot on the argmax."""
    if params.is_greedy:
        return torch.zeros_like(logits).scatter_(-1, logits.argmax(dim=-1, keepdim=True), 1.0)
    probs = tempered(logits, params)
    if params.top_p < 1.0:
        probs = top_p_filter(probs, params.top_p)
    return probs


def tempered(logits: torch.Tensor, params: SamplingParams) -> torch.Tensor:
    """The softmax after temperature and top-k: `probabilities` before top-p (sampled params)."""
    logits = logits / params.temperature
    if params.top_k and params.top_k < logits.shape[-1]:
        kth = torch.topk(logits, params.top_k, dim=-1).values[..., -1:]
        logits = logits.masked_fill(logits < kth, float("-inf"))
    return torch.softmax(logits, dim=-1)


def top_p_rows(logits: torch.Tensor, params: SamplingParams, native=None) -> numpy.ndarray | None:
    """Where top-p's tokens are found by kept_tokens (sampled params with top-p on a CPU, eager): the
    rows' tempered probabilities (rows, vocab) fp32 for it; else None (`probabilities` whole). `native`:
    the C++ library an engine samples its CPU rows with (engine/model/cpu_step.py `sampler`: its softmax,
    membound_tempered, within fp32 rounding of PyTorch's), or None (PyTorch's softmax)."""
    if params.is_greedy or params.top_p >= 1.0 or logits.device.type != "cpu" or torch.compiler.is_compiling():
        return None
    if native is None:
        return tempered(logits.float(), params).reshape(-1, logits.shape[-1]).numpy()
    rows = numpy.ascontiguousarray(logits.detach().float().reshape(-1, logits.shape[-1]).numpy())
    out = numpy.empty_like(rows)
    cut = _scratch(rows.shape[1])[0]
    for row, into in zip(rows, out):
        if native.membound_tempered(row.ctypes.data, row.shape[0], params.temperature, params.top_k,
                                    into.ctypes.data, cut):
            raise ValueError(NO_MASS)
    return out


def top_p_filter(probs: torch.Tensor, top_p: float, prefix: int = TOP_P_PREFIX) -> torch.Tensor:
    """probs (..., vocab) → the smallest most-likely set whose mass reaches top_p, renormalised: in
    descending order a token is dropped once the mass before it reaches top_p (the first always
    stays). Among tokens tied at the cut, the lowest ids stay (a stable sort's order).

    The rule is a full-vocabulary sort's, but only a top-k prefix is sorted: its cumulative sums are
    the sort's first ones, and a prefix whose mass reaches top_p (+ margin) holds every kept token."""
    rows = probs.reshape(-1, probs.shape[-1])
    n_rows, vocab = rows.shape
    cut = torch.empty(n_rows, dtype=rows.dtype, device=rows.device)  # the smallest kept probability
    kept = torch.empty(n_rows, dtype=torch.long, device=rows.device)  # how many tokens stay
    todo = torch.arange(n_rows, device=rows.device)
    k = min(prefix, vocab)
    while len(todo):
        values = (rows if len(todo) == n_rows else rows[todo]).topk(k, dim=-1).values  # descending
        mass = values.cumsum(dim=-1)
        n = ((mass - values) < top_p).sum(dim=-1)
        settled = mass[:, -1] >= top_p + TOP_P_MARGIN if k < vocab else torch.ones_like(n, dtype=torch.bool)
        cut[todo[settled]] = values.gather(-1, n[:, None] - 1)[settled, 0]
        kept[todo[settled]] = n[settled]
        todo, k = todo[~settled], min(8 * k, vocab)
    keep = rows >= cut[:, None]
    straddle = (keep.sum(dim=-1) > kept).nonzero()[:, 0]  # ties at the cut: only some of them stay
    if len(straddle):
        tied = rows[straddle] == cut[straddle, None]
        extra = kept[straddle] - (rows[straddle] > cut[straddle, None]).sum(dim=-1)  # how many tied stay
        keep[straddle] = (rows[straddle] > cut[straddle, None]) | (tied & (tied.cumsum(dim=-1) <= extra[:, None]))
    filtered = rows.masked_fill(~keep, 0.0)
    return (filtered / filtered.sum(dim=-1, keepdim=True)).reshape(probs.shape)


def mask_tokens(logits: torch.Tensor, token_ids) -> torch.Tensor:
    """logits (..., vocab) with `token_ids` set to -inf, in place (and returned): tokens that must never
    be sampled, greedy or not (keep-decoding's end of turn and other special tokens)."""
    if token_ids:
        logits[..., list(token_ids)] = float("-inf")
    return logits


def greedy(logits: torch.Tensor) -> torch.Tensor:
    """The argmax of each row (the first where several tie; a NaN counts as the largest), int64: on a
    CPU numpy's (~4 us a 49k-token row, where torch's argmax takes ~45 us a step), else torch's."""
    if logits.device.type == "cpu" and logits.dtype == torch.float32 and not logits.requires_grad \
            and not torch.compiler.is_compiling():
        return torch.from_numpy(numpy.asarray(logits.numpy().argmax(axis=-1), dtype=numpy.int64))
    return logits.argmax(dim=-1)


def draw(probs: torch.Tensor, generator: torch.Generator | None = None) -> torch.Tensor:
    """One token id per row of probs (..., vocab), each drawn with its probability (a row need not sum
    to 1): the row's cumulative sum (fp64) inverted at one uniform number, a token whose probability is
    zero never. torch.multinomial draws one exponential number per token of the row to take one
    sample (~1.3 ms a 49k-token row on a laptop core, a third of an INT4 step); this takes one."""
    rows = probs.reshape(-1, probs.shape[-1])
    cdf = rows.to(torch.float64).cumsum(dim=-1)
    total = cdf[:, -1:]
    if not bool((total > 0).all()) or not bool(torch.isfinite(total).all()):
        raise ValueError("a row to sample from has no finite positive mass")
    u = torch.rand(rows.shape[0], 1, generator=generator, dtype=torch.float64, device=rows.device) * total
    at = torch.searchsorted(cdf, u, right=True)  # the first token whose cumulative sum passes u
    past = at >= rows.shape[-1]  # u rounded up to the total: the last token with mass
    if bool(past.any()):
        at = torch.where(past, cdf.argmax(dim=-1, keepdim=True), at)
    return at.reshape(probs.shape[:-1])


# Candidates for top-p: the tokens within this factor of the most likely one, widened (x 2^-8 at a time) until
# their mass reaches top_p + TOP_P_MARGIN (SmolLM2's sampled decode rows at temperature 0.7 kept 1-8 of 49k tokens).
CANDIDATE_FLOOR = 2.0 ** -12


def kept_tokens(row: numpy.ndarray, top_p: float,
                near: float = CANDIDATE_FLOOR) -> tuple[numpy.ndarray, numpy.ndarray]:
    """top_p_filter's rule on one row of probabilities (fp32, vocab): the token ids it keeps, most likely
    first (tied ones lowest id first), and their probabilities (not renormalised). Only the candidates
    (those within `near` of the most likely, widened: CANDIDATE_FLOOR) are sorted, as a full stable sort
    orders them, their cumulative sums taken as torch's (fp64, rounded to fp32 each); top_p_filter's
    passes over the whole vocabulary took ~0.3 ms a 49k-token row here (docs/benchmarks.md, session 28)."""
    floor = float(row.max()) * near
    while True:
        ids = numpy.flatnonzero(row >= floor) if floor > 0 else numpy.arange(row.shape[0])
        values = row[ids]
        if floor <= 0 or values.sum(dtype=numpy.float64) >= top_p + TOP_P_MARGIN:
            break
        floor = floor * 2.0 ** -8 if floor > 1e-30 else 0.0
    order = numpy.argsort(-values, kind="stable")
    values, ids = values[order], ids[order]
    mass = numpy.cumsum(values, dtype=numpy.float64).astype(numpy.float32)
    n = max(1, int(numpy.count_nonzero((mass - values) < numpy.float32(top_p))))
    return ids[:n], values[:n]


NO_MASS = "a row to sample from has no finite positive mass"


def draw_one(weights: numpy.ndarray, u: float) -> int:
    """The index whose share of weights' cumulative sum (fp64) holds u * the total (u uniform in [0, 1)),
    a zero weight never."""
    cdf = numpy.cumsum(weights, dtype=numpy.float64)
    total = cdf[-1]
    if not (total > 0 and numpy.isfinite(total)):
        raise ValueError(NO_MASS)
    at = int(numpy.searchsorted(cdf, u * total, side="right"))
    return at if at < len(cdf) else int(numpy.flatnonzero(weights > 0)[-1])


def sample(logits: torch.Tensor, params: SamplingParams, generator: torch.Generator | None = None,
           native=None) -> torch.Tensor:
    """logits (B, vocab) fp32 → token ids (B,): `probabilities`' distribution, one uniform number a row.
    On a CPU the top-p set comes from kept_tokens (the same tokens, a fraction of the time); `native`: the
    C++ library that takes the row's softmax and draw (top_p_rows), or None."""
    if params.is_greedy:
        return greedy(logits)
    rows = top_p_rows(logits, params, native)
    if rows is None:
        return draw(probabilities(logits, params), generator)
    out = numpy.empty(rows.shape[0], dtype=numpy.int64)
    for i, row in enumerate(rows):
        out[i] = top_p_token(row, params.top_p, uniform(generator, params), native)
    return torch.from_numpy(out).reshape(logits.shape[:-1])


def top_p_token(probs: numpy.ndarray, top_p: float, u: float, native=None) -> int:
    """The token a row of tempered probabilities gives at uniform number u: kept_tokens' set, drawn (with
    `native`, the C++ library's membound_top_p_token: the same rule, in one call)."""
    if native is None:
        ids, values = kept_tokens(probs, top_p)
        return int(ids[draw_one(values, u)])
    probs = numpy.ascontiguousarray(probs, dtype=numpy.float32)
    return _drawn(native.membound_top_p_token(probs.ctypes.data, probs.shape[0], top_p, TOP_P_MARGIN, CANDIDATE_FLOOR,
                                              u, _scratch(probs.shape[0])[1]))


def row_sampled(params: SamplingParams) -> bool:
    """Whether sample_row takes these params' tokens: greedy, or top-p below 1 (kept_tokens' rule)."""
    return params.is_greedy or params.top_p < 1.0


def uniform(generator: torch.Generator | None, params: SamplingParams) -> float:
    """The uniform number sample would draw for a row under `params` (0.0 for greedy: none drawn)."""
    return 0.0 if params.is_greedy else float(torch.rand(1, generator=generator, dtype=torch.float64))


def sample_row(row: numpy.ndarray, params: SamplingParams, u: float, native=None) -> int:
    """sample's token for one fp32 logits row held in numpy (row_sampled params), its uniform number
    `u` drawn beforehand (`uniform`): the same token as sample's with the same `native` from the same
    generator state. A greedy token takes no PyTorch operator; a sampled one, one call into the C++
    library (`native`: top_p_rows' softmax and top_p_token's draw), else the tempered softmax's."""
    if params.is_greedy:
        return int(row.argmax())  # (greedy's argmax: numpy's)
    if native is None:
        return top_p_token(tempered(torch.from_numpy(row.reshape(1, -1)), params).numpy()[0], params.top_p, u)
    row = numpy.ascontiguousarray(row, dtype=numpy.float32)  # (the step's logits row: already)
    n = row.shape[0]
    return _drawn(native.membound_sample_top_p(row.ctypes.data, n, params.temperature, params.top_k, params.top_p,
                                               TOP_P_MARGIN, CANDIDATE_FLOOR, u, _scratch(n)[0]))


def _drawn(token: int) -> int:
    """A C++ sampler's answer as a token id: negative where the row had nothing to sample (NO_MASS)."""
    if token < 0:
        raise ValueError(NO_MASS)
    return int(token)


_SCRATCH = threading.local()  # (each thread's working rows for the C++ sampler: no state between calls)


def _scratch(n: int) -> tuple[int, int]:
    """This thread's scratch for a row of n tokens: (membound_sample_top_p's 3n + 2 floats, membound_top_p_token's
    n ids), as addresses."""
    held = getattr(_SCRATCH, "held", None)
    if held is None or held[0] < n:
        floats = numpy.empty((3 * n + 3) // 2, dtype=numpy.float64).view(numpy.float32)  # (8-byte aligned)
        ids = numpy.empty(n, dtype=numpy.int64)
        held = _SCRATCH.held = (n, floats, ids, floats.ctypes.data, ids.ctypes.data)
    return held[3], held[4]
