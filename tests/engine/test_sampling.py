"""Top-p from a top-k prefix: the same tokens and the same renormalised probabilities as a stable
full-vocabulary sort, on peaked, flat and tied rows, top_p near 0 and near 1, prefixes too small
(widened); temperature and top-k unchanged."""
import numpy
import pytest
import torch
from hypothesis import given
from hypothesis import settings as hyp_settings
from hypothesis import strategies as st

from engine.model import sampling
from engine.model.sampling import mask_tokens, probabilities, sample, top_p_filter
from engine.settings import SamplingParams


def full_sort_top_p(probs: torch.Tensor, top_p: float) -> torch.Tensor:
    """The reference: sort the whole vocabulary (stably: ties lowest id first), drop a token once
    the mass before it reaches top_p, renormalise."""
    sorted_probs, order = probs.sort(dim=-1, descending=True, stable=True)
    drop = sorted_probs.cumsum(dim=-1) - sorted_probs >= top_p
    kept = torch.zeros_like(probs).scatter_(-1, order, sorted_probs.masked_fill(drop, 0.0))
    return kept / kept.sum(dim=-1, keepdim=True)


def random_probs(rows: int, vocab: int, scale: float, levels: int, seed: int) -> torch.Tensor:
    """Softmax of random logits; levels > 0 rounds them to that many values (many exact ties)."""
    logits = torch.randn(rows, vocab, generator=torch.Generator().manual_seed(seed)) * scale
    if levels:
        logits = (logits * levels / (3 * scale)).round()
    return torch.softmax(logits, dim=-1)


@hyp_settings(max_examples=150, deadline=None)
@given(rows=st.integers(1, 6), vocab=st.integers(1, 700), scale=st.sampled_from([0.01, 0.3, 1.0, 3.0, 30.0]),
       levels=st.sampled_from([0, 0, 2, 5]), prefix=st.sampled_from([1, 2, 3, 8, 128]),
       top_p=st.one_of(st.floats(1e-6, 0.999999), st.sampled_from([1e-9, 0.5, 0.95, 1 - 1e-7])),
       seed=st.integers(0, 2**31))
def test_prefix_top_p_equals_the_full_sort(rows, vocab, scale, levels, prefix, top_p, seed):
    probs = random_probs(rows, vocab, scale, levels, seed)
    assert torch.equal(top_p_filter(probs, top_p, prefix), full_sort_top_p(probs, top_p))


@pytest.mark.parametrize("shape", [(2, 49152), (5, 49152), (2, 3, 1000)])
def test_a_flat_row_widens_past_the_prefix_and_a_peaked_one_does_not_need_to(shape):
    probs = random_probs(shape[0] * (shape[1] if len(shape) == 3 else 1), shape[-1], 1.0, 0, 1).reshape(shape)
    probs[..., 0, :] = random_probs(1, shape[-1], 30.0, 0, 2)  # peaked: a few tokens hold the mass
    kept = top_p_filter(probs, 0.9)
    assert torch.equal(kept, full_sort_top_p(probs, 0.9))
    assert (kept[..., 1:, :] > 0).sum(dim=-1).min() > sampling.TOP_P_PREFIX  # widened
    assert (kept[..., 0, :] > 0).sum() < sampling.TOP_P_PREFIX
    assert torch.allclose(kept.sum(dim=-1), torch.ones(shape[:-1]))


def test_ties_at_the_cut_keep_the_lowest_ids():
    probs = torch.tensor([[0.1, 0.3, 0.1, 0.3, 0.1, 0.1]])
    kept = top_p_filter(probs, 0.65, prefix=2)  # 0.3, 0.3, then one of the four 0.1s
    assert torch.equal(kept > 0, torch.tensor([[True, True, False, True, False, False]]))
    assert torch.allclose(kept, torch.tensor([[1, 3, 0, 3, 0, 0]]) / 7)


def test_temperature_and_top_k_come_before_top_p():
    logits = torch.randn(4, 300, generator=torch.Generator().manual_seed(3)) * 4
    params = SamplingParams(temperature=0.7, top_k=50, top_p=0.9)
    masked = logits / 0.7
    masked = masked.masked_fill(masked < masked.topk(50, dim=-1).values[:, -1:], float("-inf"))
    assert torch.equal(probabilities(logits, params), full_sort_top_p(torch.softmax(masked, dim=-1), 0.9))
    assert torch.equal(probabilities(logits, SamplingParams(temperature=2.0, top_p=1.0)),
                       torch.softmax(logits / 2.0, dim=-1))
    greedy = SamplingParams(greedy=True, temperature=0.0)
    assert torch.equal(sample(logits, greedy), logits.argmax(dim=-1))
    drawn = sample(logits, params, torch.Generator().manual_seed(0))
    assert bool((probabilities(logits, params).gather(-1, drawn[:, None]) > 0).all())


def test_masked_tokens_get_no_probability_even_when_they_are_the_most_likely():
    logits = torch.randn(3, 50, generator=torch.Generator().manual_seed(5))
    top = logits.argmax(dim=-1).tolist()
    banned = sorted(set(top) | {0, 1})
    masked = mask_tokens(logits.clone(), banned)
    assert not set(sample(masked, SamplingParams(greedy=True, temperature=0.0)).tolist()) & set(banned)
    for params in (SamplingParams(temperature=1.0), SamplingParams(temperature=0.8, top_k=5, top_p=0.9)):
        assert float(probabilities(masked, params)[:, banned].sum()) == 0.0
        assert torch.allclose(probabilities(masked, params).sum(dim=-1), torch.ones(3))
    assert torch.equal(mask_tokens(logits.clone(), ()), logits)  # nothing masked: untouched


def test_greedy_takes_torchs_argmax_on_ties_nan_and_masked_rows():
    """The CPU fp32 argmax (numpy's) picks what torch's does: the first of tied maxima, the first NaN,
    index 0 of an all -inf row; int64, the rows' shape."""
    from engine.model.sampling import greedy
    x = torch.randn(4, 1000, generator=torch.Generator().manual_seed(0))
    x[0, 3] = x[0, 9] = 100.0
    x[1, 5] = x[1, 7] = float("nan")
    x[2] = float("-inf")
    for rows in (x, x[:, :], x[1], torch.randn(2, 3, 50)[:, -1]):
        got = greedy(rows)
        assert got.dtype == torch.int64 and got.shape == rows.argmax(dim=-1).shape
        assert torch.equal(got, rows.argmax(dim=-1))
    assert greedy(x).tolist()[:3] == [3, 5, 0]


@hyp_settings(max_examples=150, deadline=None)
@given(vocab=st.integers(1, 700), scale=st.sampled_from([0.01, 0.3, 1.0, 3.0, 30.0]),
       levels=st.sampled_from([0, 0, 2, 5]), floor=st.sampled_from([0.5, 2.0 ** -12, 1e-30]),
       top_p=st.one_of(st.floats(1e-6, 0.999999), st.sampled_from([1e-9, 0.5, 0.95, 1 - 1e-7])),
       masked=st.integers(0, 3), seed=st.integers(0, 2**31))
def test_kept_tokens_are_the_filters_own(vocab, scale, levels, floor, top_p, masked, seed):
    """The CPU sampler's top-p set (candidates near the most likely token, widened as needed) holds the
    tokens top_p_filter gives mass to, most likely first (ties lowest id first), with their own
    probabilities; masked tokens (zero probability) never among the positive ones."""
    probs = random_probs(1, vocab, scale, levels, seed)[0]
    probs[:masked] = 0.0
    if probs.sum() == 0:
        return
    ids, values = sampling.kept_tokens(probs.numpy(), top_p, floor)
    ref = top_p_filter(probs, top_p)
    assert sorted(ids[values > 0].tolist()) == ref.nonzero()[:, 0].tolist()
    assert torch.equal(torch.from_numpy(values), probs[torch.from_numpy(ids)])
    order = sorted(range(len(ids)), key=lambda i: (-float(values[i]), int(ids[i])))
    assert order == list(range(len(ids)))


def test_a_draw_takes_each_token_at_its_probability_and_a_zero_never():
    """draw (torch rows) and draw_one (numpy weights): 40,000 draws of a row with zeros land within
    0.01 of each probability, never on a zero; u rounded up to the total takes the last token with mass."""
    probs = torch.tensor([[0.1, 0.0, 0.45, 0.3, 0.0, 0.15, 0.0]])
    g = torch.Generator().manual_seed(3)
    got = torch.bincount(torch.cat([sampling.draw(probs.expand(1000, -1), g) for _ in range(40)]), minlength=7)
    assert (abs(got / got.sum() - probs[0]) < 0.01).all() and got[probs[0] == 0].sum() == 0
    weights = (probs[0] * 7).numpy()  # need not sum to 1
    u = torch.rand(40000, generator=g, dtype=torch.float64).tolist()
    got = torch.bincount(torch.tensor([sampling.draw_one(weights, x) for x in u]), minlength=7)
    assert (abs(got / got.sum() - probs[0]) < 0.01).all() and got[probs[0] == 0].sum() == 0
    assert sampling.draw_one(weights, 1.0) == 5 and sampling.draw_one(weights, 0.0) == 0
    with pytest.raises(ValueError):
        sampling.draw(torch.zeros(1, 4), g)
    with pytest.raises(ValueError):
        sampling.draw_one(numpy.zeros(4), 0.5)


@pytest.mark.parametrize("params", [SamplingParams(), SamplingParams(temperature=1.3, top_k=5, top_p=0.8),
                                    SamplingParams(temperature=0.5, top_p=1.0)])
def test_sample_draws_probabilities_distribution_with_one_uniform_number_a_row(params):
    """sample's tokens follow `probabilities` (the distribution speculation verifies against), a masked or
    filtered token never; each row takes one uniform number from the generator (torch.multinomial took
    one exponential number a vocabulary token: ~1.3 ms a 49k-token row, a third of an INT4 step here)."""
    logits = torch.randn(2, 40, generator=torch.Generator().manual_seed(5)) * 2
    mask_tokens(logits, [int(logits[0].argmax())])
    want = probabilities(logits, params)
    g = torch.Generator().manual_seed(7)
    counts = torch.zeros_like(want)
    for _ in range(6000):
        counts.scatter_add_(1, sample(logits, params, g)[:, None], torch.ones(2, 1))
    assert counts[want == 0].sum() == 0
    assert (abs(counts / 6000 - want) < 0.025).all()
    g1, g2 = torch.Generator().manual_seed(11), torch.Generator().manual_seed(11)
    sample(torch.randn(3, 49152), params, g1)
    torch.rand(3, generator=g2, dtype=torch.float64)
    assert torch.equal(g1.get_state(), g2.get_state())
