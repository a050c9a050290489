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


def cpp_sampler():
    """The C++ library a CPU engine samples with (cpu_step.sampler): it must build here, CI checks it."""
    from kernels import cpu_decode
    return cpu_decode.load()


def python_top_p_token(probs: numpy.ndarray, top_p: float, u: float) -> int:
    """top_p_token's rule as numpy runs it (kept_tokens, then draw_one): the C++ draw's reference."""
    ids, values = sampling.kept_tokens(probs, top_p)
    return int(ids[sampling.draw_one(values, u)])


@hyp_settings(max_examples=200, deadline=None)
@given(vocab=st.integers(1, 700), scale=st.sampled_from([0.01, 0.3, 1.0, 3.0, 30.0]),
       levels=st.sampled_from([0, 0, 2, 5]),
       top_p=st.one_of(st.floats(1e-6, 0.999999), st.sampled_from([1e-9, 0.5, 0.95, 1 - 1e-7, 1.0])),
       masked=st.integers(0, 3), seed=st.integers(0, 2**31))
def test_the_cpp_top_p_draw_is_kept_tokens_and_draw_one(vocab, scale, levels, top_p, masked, seed):
    """membound_top_p_token (what a CPU's sampled tokens take: one call) gives numpy's token at every uniform
    number, u at 0 and next to 1 too: the same candidates, order, ties (lowest id), kept count and draw."""
    lib = cpp_sampler()
    probs = random_probs(1, vocab, scale, levels, seed)[0]
    probs[:masked] = 0.0
    if probs.sum() == 0:
        return
    row = probs.numpy()
    us = [0.0, 1.0 - 2.0 ** -53, *torch.rand(12, generator=torch.Generator().manual_seed(seed),
                                           dtype=torch.float64).tolist()]
    assert [sampling.top_p_token(row, top_p, u, lib) for u in us] == [python_top_p_token(row, top_p, u) for u in us]


@pytest.mark.parametrize("params", [SamplingParams(), SamplingParams(temperature=1.3, top_k=5, top_p=0.8),
                                    SamplingParams(temperature=0.05, top_k=1, top_p=0.5),
                                    SamplingParams(temperature=2.0, top_k=40, top_p=0.99)])
def test_the_cpp_softmax_is_torchs_within_rounding_and_zero_where_torchs_is(params):
    """The C++ library's tempered softmax (top_p_rows on a CPU): torch's probabilities to fp32 rounding,
    exactly zero for masked tokens and those under the top-k cut (tied ones at the cut kept), summing to 1."""
    g = torch.Generator().manual_seed(3)
    logits = torch.cat([torch.randn(3, 49152, generator=g) * 4, (torch.randn(1, 300, generator=g) * 2).round()
                        .repeat(1, 164)[:, :49152]])
    top = int(logits[0].argmax())
    mask_tokens(logits, [top, 7, 11])
    got = torch.from_numpy(sampling.top_p_rows(logits, params, cpp_sampler()))
    want = sampling.tempered(logits, params)
    assert bool((got[want == 0] == 0).all()) and bool((want[got == 0] < 1e-30).all())
    assert torch.allclose(got, want, rtol=3e-6, atol=1e-12)
    assert torch.allclose(got.double().sum(dim=-1), torch.ones(4, dtype=torch.float64), atol=1e-5)
    assert float(got[0, top]) == 0.0 and float(got[0, 7]) == 0.0


@pytest.mark.parametrize("bad", [float("nan"), float("inf"), "all masked"])
def test_a_row_with_nothing_to_sample_says_so_on_every_cpu_path(bad):
    """A NaN or +inf logit, or every token masked: the same one-line ValueError from sample and sample_row,
    with the C++ sampler and without it (never a token drawn from garbage)."""
    logits = torch.randn(1, 300)
    if bad == "all masked":
        logits[:] = float("-inf")
    else:
        logits[0, 5] = bad
    params = SamplingParams(seed=1)
    for lib in (cpp_sampler(), None):
        for call in (lambda: sample(logits, params, torch.Generator().manual_seed(1), lib),
                     lambda: sampling.sample_row(logits[0].numpy(), params, 0.5, lib)):
            with pytest.raises(ValueError, match="no finite positive mass"):
                call()


def test_with_the_cpp_sampler_or_without_sample_and_sample_row_agree():
    """Each way of sampling a CPU row (the C++ library's, or PyTorch's softmax and numpy's draw where it cannot
    be built) gives sample's and sample_row's tokens alike from the same uniform numbers; the two ways agree
    on these rows (their softmaxes differ in the last bits only)."""
    logits = torch.randn(6, 49152, generator=torch.Generator().manual_seed(9)) * 3
    params = SamplingParams(temperature=0.8, top_k=50, top_p=0.9, seed=4)
    tokens = {}
    for name, lib in (("native", cpp_sampler()), ("torch", None)):
        g = torch.Generator().manual_seed(4)
        batch = sample(logits, params, g, lib).tolist()
        g = torch.Generator().manual_seed(4)
        rows = [sampling.sample_row(row, params, sampling.uniform(g, params), lib) for row in logits.numpy()]
        assert batch == rows
        tokens[name] = rows
    assert tokens["native"] == tokens["torch"]


def test_an_engine_samples_its_cpu_rows_with_its_cpp_library_unless_its_step_is_off():
    """cpu_step.sampler: the engine's own library (its options' build), or None where MEMBOUND_CPU_STEP=0 switched
    the C++ step off (then PyTorch's softmax and numpy's draw)."""
    from types import SimpleNamespace

    from engine.context import EngineContext
    from engine.model import cpu_step
    from engine.options import EngineOptions
    assert cpu_step.sampler(SimpleNamespace(context=EngineContext(EngineOptions(cpu_step=False)))) is None
    lib = cpu_step.sampler(SimpleNamespace(context=EngineContext(EngineOptions(cpu_step=True))))
    assert lib is cpp_sampler() and lib.membound_sample_top_p.restype is not None
