"""The C++ CPU decode step (kernels/cpu_decode.cpp through engine/model/cpu_step.py) against the
PyTorch step it replaces: logits and the K/V it writes, for every weight format and both activation
dtypes, on awkward shapes (GQA, rows not a multiple of 16, Qwen2's biases, Qwen3's q/k norms), at every
vector level this machine runs (AVX-512, AVX2: the laptop case, scalar); each product against its
fp64 reference; and the cases it leaves to PyTorch. The build plans of other platforms, the per-format
timing and the aarch64 builds under qemu: tests/kernels/test_cpu_decode_builds.py."""
import copy
from dataclasses import replace

import pytest
import torch

from engine.context import EngineContext, reset_default_context
from engine.io.loader import synthetic_weights
from engine.kv.cache import ContiguousKVCache, PagedKVCache
from engine.model import cpu_step
from engine.model.config import ModelConfig
from engine.model.quant import Int4Linear, Int8Linear, quantize_model
from engine.model.transformer import Linear, Transformer
from engine.options import EngineOptions
from kernels import cpu_decode
from kernels.int4_pack import unpack_int4

GQA = ModelConfig(name="gqa", dim=64, n_layers=2, n_heads=4, n_kv_heads=2, ffn_dim=96, vocab_size=250,
                  tied_embeddings=True, max_seq_len=64)
# Qwen-like: biases and per-head norms, 6 heads over 2 KV heads of 16, rows not a multiple of 16
QWEN = ModelConfig(name="qwen", dim=96, n_layers=2, n_heads=6, n_kv_heads=2, head_dim=16, ffn_dim=160,
                   vocab_size=203, qkv_bias=True, qk_norm=True, max_seq_len=64, rope_theta=1e6)
# fp32: the largest error allowed against PyTorch's step, relative to the largest |logit| (the sums
# run in another order; INT4's, offset by 128 per code, carry ~5e-6 of error per product, which
# these sharp random models amplify: test_each_product_matches_its_reference holds it tighter). bf16
# rounds at other points than PyTorch's ops do, so both bf16 steps are held to the fp32 step of the
# same weights: the C++ one may be off by at most 1.5x PyTorch's error.
TOLERANCE = {("fp32", "fp"): 1e-4, ("fp32", "int8"): 1e-4, ("fp32", "int4"): 5e-3, ("bf16", "fp"): 1.5,
             ("bf16", "int8"): 1.5, ("bf16", "int4"): 1.5}
# INT8 at the levels that take its inputs as int16 codes per group of 256 (x86: vpmaddwd / vpdpwssd) against
# the exact-input reference: each code is within half a step, max|x| of its group / 65534, of its input, so
# each product stays within INT16_TOLERANCE (below) of the exact one, and the step chains nine of them
# (q/k/v, output, gate/up, down in each of two layers, the head) with softmaxes between: 9 x 2e-4 < 2e-3
INT8_INT16_STEP_TOLERANCE = 2e-3
# INT4 at the levels that take its inputs as int8 codes per group of 32 (x86's vpdpbusd and vpmaddubsw,
# aarch64's SDOT), against a reference that rounds them the same way: a code flips where the step's
# activations and the reference's differ in their last bits across a rounding boundary (a step of
# max|x| / 127), which the sharp random models amplify: up to 5.5e-2 seen at AVX-512, 3e-2 at AVX2, over
# two layers and six steps; the driver's int8-code steps on aarch64 are held to 8e-2 too
# (test_cpu_decode_builds.py ROUNDED_STEP_TOLERANCE). Each product alone is held to PRODUCT_TOLERANCE.
INT4_INT8_STEP_TOLERANCE = 8e-2
# bf16 activations against PyTorch's (each op rounds at other points): logits and K/V, by INT4's inputs
BF16_BOUND = {cpu_decode.X_INT8: 2e-1}
DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16}


def machine_levels() -> list[str]:
    """The vector levels this machine runs (MEMBOUND_CPU_ISA values): every one is tested."""
    flags = cpu_decode.cpu_feature_line().split()
    return [isa for isa, need in (("avx512", "avx512f"), ("avx2", "avx2"), ("scalar", "")) if not need or need in flags]


LEVELS = machine_levels()

PROMPT = 7


def model_of(cfg: ModelConfig, dtype: str, weights: str, seed: int = 0) -> Transformer:
    """Random weights (bf16 values, whatever the dtype: the fp32 model of them is the bf16 one's truth)."""
    w = synthetic_weights(cfg, torch.float32, "cpu", seed=seed)
    # sharper logits, and norm weights that are not all ones (a swapped norm would pass otherwise)
    gen = torch.Generator().manual_seed(seed + 1)
    w = {k: (v * 20 if "norm" not in k else v + 0.1 * torch.randn(v.shape, generator=gen)) for k, v in w.items()}
    model = Transformer(cfg, {k: v.bfloat16().to(DTYPES[dtype]) for k, v in w.items()})
    return model if weights == "fp" else quantize_model(model, weights, 32)


def int4_codes_times_rounded(m: Int4Linear, x: torch.Tensor) -> torch.Tensor:
    """An INT4 product as a level computes it: the codes' part against x as the level rounds it (int8
    codes per group: max|x| / 127 a step, in fp32, half to even as the vector conversion rounds), the
    mins' part against the exact x (the kernel's per-group sums of its inputs)."""
    g = m.group_size
    xg = x.float().unflatten(-1, (-1, g))
    top = xg.abs().amax(-1, keepdim=True)
    inv = torch.where(top > 0, 127.0 / top, torch.zeros_like(top))
    xr = (torch.round(xg * inv) * (top / 127.0)).flatten(-2).double()
    n = m.out_features
    codes = unpack_int4(m.packed).double().view(n, -1, g)
    scaled = (codes * m.scales.double()[..., None]).view(n, -1)
    mins = m.mins.double()[..., None].expand(n, -1, g).reshape(n, -1)
    return xr @ scaled.T + x.double() @ mins.T  # (in fp64)


def reference_of(model: Transformer, int4_rounding: int = cpu_decode.X_BF16) -> Transformer:
    """The same weights through PyTorch's one-line references (dequantise, then matmul); INT4 takes
    its inputs as a level does (membound_input_rounding): rounded to bf16, as PyTorch's CPU path and the
    bf16-dot levels feed it, or as int8 codes per group (int4_codes_times_rounded); X_EXACT: exactly."""
    ref = copy.deepcopy(model)
    for m in ref.modules():
        if isinstance(m, (Int8Linear, Int4Linear)):
            m.backend = "reference"
        if isinstance(m, Int4Linear) and int4_rounding == cpu_decode.X_BF16:
            m.forward = lambda x, m=m: m.reference(x.bfloat16().to(x.dtype))
        elif isinstance(m, Int4Linear) and int4_rounding == cpu_decode.X_INT8:
            m.forward = lambda x, m=m: int4_codes_times_rounded(m, x).to(x.dtype)
    return ref


def int4_rounding(isa: str) -> int:
    """How the level takes INT4's inputs (membound_input_rounding: bf16 or int8 codes)."""
    return cpu_decode.load(isa).membound_input_rounding(cpu_decode.INT4)


@torch.inference_mode()
def decode(model: Transformer, tokens: list[int], use_cpp: bool) -> tuple[list[torch.Tensor], ContiguousKVCache]:
    """PROMPT tokens prefilled by the reference, then one step of `model` per remaining token (in C++
    or PyTorch); the logits of each step."""
    cache = ContiguousKVCache(model.cfg, 1, model.cfg.max_seq_len, model.dtype, "cpu")
    reference_of(model)(torch.tensor([tokens[:PROMPT]]), 0, cache)  # the same cached prompt for both
    # the reference run: PyTorch's step; the level: the environment's (MEMBOUND_CPU_ISA)
    model.bind(EngineContext(replace(EngineOptions.from_environ(), cpu_step=use_cpp)))
    out = [model(torch.tensor([[t]]), pos, cache)[0, 0].float() for pos, t in enumerate(tokens[PROMPT:], PROMPT)]
    return out, cache


def step_tolerance(isa: str, dtype: str, weights: str) -> float:
    """The step's bound for this level and setting against the reference (TOLERANCE, or fp32 INT8's when
    the level takes its inputs as int16 codes; bf16's bound is relative to PyTorch's own error)."""
    if dtype == "fp32" and weights == "int8" and cpu_decode.load(isa).membound_input_rounding(cpu_decode.INT8) == cpu_decode.X_INT16:
        return INT8_INT16_STEP_TOLERANCE
    if dtype == "fp32" and weights == "int4" and int4_rounding(isa) == cpu_decode.X_INT8:
        return INT4_INT8_STEP_TOLERANCE
    return TOLERANCE[(dtype, weights)]


def bf16_bound(isa: str, weights: str, usual: float) -> float:
    """A bf16 step's bound against PyTorch's bf16 path: `usual`, or looser where INT4 takes int8 codes."""
    return BF16_BOUND.get(int4_rounding(isa), usual) if weights == "int4" else usual


def relative_error(got: torch.Tensor, want: torch.Tensor) -> float:
    return ((got.float() - want.float()).abs().max() / want.float().abs().max()).item()


@pytest.mark.parametrize("isa", LEVELS)
@pytest.mark.parametrize("cfg", [GQA, QWEN], ids=["gqa", "qwen"])
@pytest.mark.parametrize("dtype,weights", list(TOLERANCE))
def test_cpp_step_matches_the_pytorch_step(isa, cfg, dtype, weights, monkeypatch):
    monkeypatch.setenv(cpu_decode.ISA_VARIABLE, isa)
    reset_default_context()  # (its options read the level now)
    assert cpu_step.unavailable_reason() == ""  # CI builds it: a C++ compiler is part of `make test`'s set-up
    model = model_of(cfg, dtype, weights)
    rounding = int4_rounding(isa)
    tokens = torch.randint(0, cfg.vocab_size, (PROMPT + 6,), generator=torch.Generator().manual_seed(3)).tolist()
    from engine import dispatch
    before = dispatch.counts()
    got, got_cache = decode(model, tokens, use_cpp=True)
    assert dispatch.since(before)["decode step"] == {cpu_step.STEP_LABEL: len(tokens) - PROMPT}
    assert model.context.cpu_step.plans[model].lib is cpu_decode.load(isa)
    # (the reference of a reference: itself)
    want, want_cache = decode(reference_of(model, rounding), tokens, use_cpp=False)
    tol = step_tolerance(isa, dtype, weights)
    if dtype == "fp32":
        for step, (g, w) in enumerate(zip(got, want)):
            assert relative_error(g, w) < tol, f"step {step}: {relative_error(g, w):.2e}"
    else:
        truth, _ = decode(reference_of(model_of(cfg, "fp32", weights), rounding), tokens, use_cpp=False)
        cpp_error = max(relative_error(g, t) for g, t in zip(got, truth))
        pytorch_error = max(relative_error(w, t) for w, t in zip(want, truth))
        assert cpp_error < tol * pytorch_error + 1e-3, f"C++ {cpp_error:.2e}, PyTorch {pytorch_error:.2e}"
        tol = bf16_bound(isa, weights, 5e-2)  # the cache: both are rounded to bf16, from sums in another order
    n = PROMPT + len(got)
    assert got_cache.length == want_cache.length == n
    # the K/V the steps wrote (RoPE'd keys, values) are PyTorch's, to the cache dtype's rounding
    for kv_got, kv_want in ((got_cache.k, want_cache.k), (got_cache.v, want_cache.v)):
        assert relative_error(kv_got[:, :, :, :n], kv_want[:, :, :, :n]) < max(tol, 1e-5)
        assert not kv_got[:, :, :, n:].any()  # nothing past the live positions


# per format: the product's largest error allowed, relative to the reference's largest |value|, by
# how the level takes its inputs (exactly or rounded to bf16: as the reference does; int16 codes per
# group: against the exact inputs)
PRODUCT_TOLERANCE = {"fp32": 1e-6, "bf16": 1e-5, "int8": 1e-6, "int4": 2e-5}
INT16_TOLERANCE = 2e-4


def product_layer(fmt: str, n: int, k: int, seed: int = 0):
    gen = torch.Generator().manual_seed(n + k + seed)
    w = torch.randn(n, k, generator=gen) * torch.linspace(0.1, 2, n)[:, None]
    if fmt in ("fp32", "bf16"):
        return Linear(w.to(DTYPES[fmt]))
    return Int8Linear.from_weight(w) if fmt == "int8" else Int4Linear.from_weight(w, 32)


def product_reference(layer, fmt: str, x: torch.Tensor, rounding: int) -> torch.Tensor:
    """x (m, k) @ the layer's weights dequantised, in fp64, the inputs rounded as the level takes them."""
    if fmt == "int4" and rounding == cpu_decode.X_INT8:
        return int4_codes_times_rounded(layer, x)
    xr = x.bfloat16().double() if rounding == cpu_decode.X_BF16 else x.double()
    if fmt in ("fp32", "bf16"):
        deq = layer.weight.double()
    elif fmt == "int8":
        deq = layer.q.double() * layer.scales.double()[:, None]
    else:
        n = layer.out_features
        deq = (unpack_int4(layer.packed).double().view(n, -1, 32) * layer.scales.double()[..., None]
               + layer.mins.double()[..., None]).view(n, -1)
    return xr @ deq.T


def c_matrix(layer):
    fmt_id, n_, k_, group, tensors, w_ptr, scale, mins = layer.cpu_matrix()
    return cpu_decode.Mat(fmt_id, n_, k_, group, w_ptr, scale, mins), tensors


@pytest.mark.parametrize("isa", LEVELS)
def test_the_sampler_holds_at_every_level(isa):
    """The C++ sampler built at each level this machine runs: top_p_rows' probabilities within fp32 rounding
    of PyTorch's softmax and zero where it is zero, and top_p_token's and sample_row's tokens numpy's
    (kept_tokens, draw_one) on them, on rows of 1 to 1,000 tokens (each vector width's tail), masked tokens
    and ties, at top-k 0 and 3 and top-p 0.5 to 1."""
    from engine.model import sampling
    from engine.settings import SamplingParams
    from tests.engine.test_sampling import python_top_p_token
    lib = cpu_decode.load(isa)
    g = torch.Generator().manual_seed(2)
    for n in (1, 5, 37, 203, 1000):
        logits = (torch.randn(1, n, generator=g) * 3).round() if n % 2 else torch.randn(1, n, generator=g) * 4
        logits[0, 1:4:2] = float("-inf")
        for params in (SamplingParams(temperature=0.7, top_p=0.5), SamplingParams(temperature=1.3, top_k=3, top_p=0.95),
                       SamplingParams(temperature=1.0, top_p=1.0 - 1e-7)):
            got = torch.from_numpy(sampling.top_p_rows(logits, params, lib))
            want = sampling.tempered(logits, params)
            assert bool((got[want == 0] == 0).all()) and torch.allclose(got, want, rtol=3e-6, atol=1e-12), (lib.isa, n)
            for u in (0.0, 0.37, 1.0 - 2.0 ** -53):
                token = python_top_p_token(got[0].numpy(), params.top_p, u)
                assert sampling.top_p_token(got[0].numpy(), params.top_p, u, lib) == token, (lib.isa, n, params, u)
                assert sampling.sample_row(logits[0].numpy(), params, u, lib) == token, (lib.isa, n, params, u)


@pytest.mark.parametrize("isa", LEVELS)
@pytest.mark.parametrize("fmt", list(PRODUCT_TOLERANCE))
@pytest.mark.parametrize("n,k", [(40, 96), (250, 64), (3, 160), (37, 224), (20, 608)],
                         ids=["n40", "n250", "n3", "n37k224", "n20k608"])  # (608: INT8's groups of 256 and a tail)
def test_each_product_matches_its_reference(isa, fmt, n, k):
    """One product of each format at each level (all threads), against PyTorch's dequantise-then-matmul
    in fp64, for 1, 3 and 7 token rows (x not centred: INT4's mins and its 128 offset both matter)."""
    lib = cpu_decode.load(isa)
    layer = product_layer(fmt, n, k)
    mat, _keep = c_matrix(layer)
    rounding = lib.membound_input_rounding(mat.fmt)
    tol = INT16_TOLERANCE if rounding == cpu_decode.X_INT16 else PRODUCT_TOLERANCE[fmt]
    for m in (1, 3, 7):
        x = torch.randn(m, k, generator=torch.Generator().manual_seed(m)) * 3 + 1
        got = cpu_decode.gemm(lib, mat, x, torch.get_num_threads())
        want = product_reference(layer, fmt, x, rounding)
        assert relative_error(got, want) < tol, f"{lib.isa}, {m} rows: {relative_error(got, want):.1e}"


@pytest.mark.parametrize("isa", LEVELS)
@pytest.mark.parametrize("group", [64, 128])
def test_int4_products_at_larger_groups_match_and_give_each_row_its_bits(isa, group):
    """`--group-size` 64 and 128 (a group's sums are taken in pieces where int16 sums would saturate at
    AVX2): each product against the reference at the level's input rounding, 1 to 7 token rows, each
    row's bits the same alone."""
    lib = cpu_decode.load(isa)
    layer = Int4Linear.from_weight(torch.randn(37, 512, generator=torch.Generator().manual_seed(group)), group)
    mat, _keep = c_matrix(layer)
    rounding = lib.membound_input_rounding(mat.fmt)
    for m in (1, 3, 7):
        x = torch.randn(m, 512, generator=torch.Generator().manual_seed(m)) * 3 + 1
        got = cpu_decode.gemm(lib, mat, x, 2)
        if rounding == cpu_decode.X_INT8:
            want = int4_codes_times_rounded(layer, x)
        else:
            xr = x.bfloat16().double() if rounding == cpu_decode.X_BF16 else x.double()
            want = layer.reference(xr)
        tol = PRODUCT_TOLERANCE["int4"]
        assert relative_error(got, want) < tol, f"{lib.isa}, {m} rows: {relative_error(got, want):.1e}"
        for i in range(m):
            assert torch.equal(cpu_decode.gemm(lib, mat, x[i:i + 1], 1)[0], got[i]), (lib.isa, m, i)


@pytest.mark.parametrize("isa", LEVELS)
@pytest.mark.parametrize("fmt", list(PRODUCT_TOLERANCE))
def test_a_token_row_gives_the_same_bits_alone_or_among_others(isa, fmt):
    """Each output is one chain that depends on its weight row and token row only: the rows of a
    9-row product (more than a pass takes: the converted / unpacked block is reused) equal each row's
    product alone, and any thread count gives the same bits."""
    lib = cpu_decode.load(isa)
    layer = product_layer(fmt, 70, 608, seed=1)  # (INT8's input groups: two of 256 and a tail)
    mat, _keep = c_matrix(layer)
    x = torch.randn(9, 608, generator=torch.Generator().manual_seed(5))
    together = cpu_decode.gemm(lib, mat, x, 2)
    for i in range(9):
        assert torch.equal(cpu_decode.gemm(lib, mat, x[i:i + 1], 1)[0], together[i]), f"{lib.isa} row {i}"


def test_steps_say_they_ran_in_cpp_and_pytorch_runs_what_cpp_does_not_take():
    from engine import dispatch
    model = model_of(GQA, "fp32", "fp")
    token = torch.tensor([[5]])
    with torch.inference_mode():
        cache = ContiguousKVCache(GQA, 1, GQA.max_seq_len, torch.float32, "cpu")
        before = dispatch.counts()
        model(token, 0, cache)
        assert dispatch.since(before)["decode step"] == {cpu_step.STEP_LABEL: 1}
        assert cache.length == 1
        refused = {
            "two sequences": (model, torch.tensor([[5], [6]]), ContiguousKVCache(GQA, 2, 8, torch.float32, "cpu"),
                              "flash"),
            "a paged cache": (model, token, PagedKVCache(GQA, 4, 16, torch.float32, "cpu"), "flash"),
            "a cache of another dtype": (model, token, ContiguousKVCache(GQA, 1, 8, torch.bfloat16, "cpu"), "flash"),
            "two new tokens": (model, torch.tensor([[5, 6]]), cache, "flash"),
        }
        for what, args in refused.items():
            assert cpu_step.refusal(*args), what
            assert cpu_step.decode_step(args[0], args[1], 1, args[2], args[3]) is None, what


@pytest.mark.parametrize("dtype", ["fp32", "bf16"])
def test_naive_attention_decodes_in_cpp_as_pytorchs_naive_step_does(dtype):
    """The naive setting's decode steps run in C++ too (its score matrix written to memory, softmaxed there
    and read back: attend_naive), so the lever shows what naive attention costs and not what PyTorch's
    whole step does (4.5x slower at INT4 here); their logits are PyTorch's naive step's within the fused
    step's bound, the path says so, and a verify step's rows give the one-token steps' bits."""
    from engine import dispatch
    model = model_of(GQA, dtype, "fp")
    tokens = torch.randint(0, GQA.vocab_size, (PROMPT + 6,), generator=torch.Generator().manual_seed(4)).tolist()
    ref = reference_of(model)
    with torch.inference_mode():
        caches = {}
        for name, step_model in (("cpp", model), ("torch", ref)):
            cache = ContiguousKVCache(GQA, 1, GQA.max_seq_len, model.dtype, "cpu")
            ref(torch.tensor([tokens[:PROMPT]]), 0, cache, attention="naive")
            before = dispatch.counts()
            logits = [step_model(torch.tensor([[t]]), pos, cache, attention="naive")[0, 0].float()
                      if name == "cpp" else cpu_step_off(step_model, t, pos, cache)
                      for pos, t in enumerate(tokens[PROMPT:], PROMPT)]
            caches[name] = (logits, cache, dispatch.since(before))
        got, _, paths = caches["cpp"]
        want = caches["torch"][0]
        assert paths["decode step"] == {cpu_step.STEP_LABEL: 6}
        assert paths["attention decode"] == {cpu_step.NAIVE_LABEL: 6 * GQA.n_layers}
        for g, w in zip(got, want):
            assert relative_error(g, w) < (TOLERANCE[(dtype, "fp")] if dtype == "fp32" else 5e-2)
        # five rows of one sequence (a verify step's shape) against five one-token steps: the same bits
        plan = cpu_step.plan_for(model, caches["cpp"][1])
        start = PROMPT
        rows = [(t, start + i, 0, None) for i, t in enumerate(tokens[PROMPT:PROMPT + 5])]
        together = plan.run(rows, list(range(5)), naive=True)
        alone = torch.cat([plan.run([row], [0], naive=True) for row in rows])
        assert torch.equal(together, alone)


def cpu_step_off(model, token: int, pos: int, cache) -> torch.Tensor:
    """PyTorch's naive step (the C++ step switched off for this call)."""
    with cpu_step.pytorch_only():
        return model(torch.tensor([[token]]), pos, cache, attention="naive")[0, 0].float()


def test_int4_tiles_hold_the_codes_in_the_documented_order():
    layer = Int4Linear.from_weight(torch.randn(40, 96), 32)  # 40 rows: the last tile is half padding
    fmt, n, k, group, tensors, *_ = layer.cpu_matrix()
    tiles, scales, mins = tensors
    assert (fmt, n, k, group) == (cpu_decode.INT4, 40, 96, 32) and tiles.shape == (3, 16 * 96 // 2)
    codes = unpack_int4(layer.packed)
    t, j, i = 1, 5, 3  # tile, octet of inputs, row in the tile
    word = int.from_bytes(bytes(tiles[t, 64 * j + 4 * i:64 * j + 4 * i + 4].tolist()), "little")
    row = 16 * t + i
    # nibble 4a + 16b holds input 8j + 2a + b
    assert [(word >> (4 * a + 16 * b)) & 15 for a in range(4) for b in range(2)] == codes[row, 8 * j:8 * j + 8].tolist()
    assert scales[t, 2, i] == layer.scales[row, 2] and mins[t, 1, i] == layer.mins[row, 1]
    assert not tiles[2, :].view(-1, 16, 4)[:, 8:].any()  # rows 40..47 do not exist: zero codes


def test_without_a_compiler_the_pytorch_step_runs_and_says_why(monkeypatch, tmp_path):
    monkeypatch.setenv("CXX", "")
    monkeypatch.setenv("PATH", str(tmp_path))  # no g++, c++ or clang++
    monkeypatch.setattr(cpu_decode, "EXTRA_FLAGS", ("-DNEVER_BUILT",))  # not in the cache
    reset_default_context()  # (its options read CXX now)
    assert cpu_step.unavailable_reason() == "no C++ compiler (g++ or clang++) on PATH"
    model = model_of(GQA, "fp32", "fp")
    cache = ContiguousKVCache(GQA, 1, GQA.max_seq_len, torch.float32, "cpu")
    with torch.inference_mode():
        assert cpu_step.decode_step(model, torch.tensor([[5]]), 0, cache) is None
        assert model(torch.tensor([[5]]), 0, cache).shape == (1, 1, GQA.vocab_size)  # PyTorch's step


def test_a_failed_build_is_one_line_and_the_engine_decodes_in_pytorch(monkeypatch, tmp_path, capsys):
    """A compiler that fails (an old g++, a missing header): the check's note is one line, no
    traceback, and the engine's steps run in PyTorch."""
    from engine.kernel_checks import check_kernels
    from tests.engine.test_engine import make_engine
    broken = tmp_path / "g++"
    broken.write_text("#!/bin/sh\n[ \"$1\" = --version ] && { echo 'g++ 0.0'; exit 0; }\n"
                      "echo 'In file included from cpu_decode.cpp:1:' >&2\n"
                      "echo 'cpu_decode.cpp:9:10: fatal error: omp.h: No such file or directory' >&2\nexit 1\n")
    broken.chmod(0o755)
    monkeypatch.setenv("CXX", str(broken))
    monkeypatch.setattr(cpu_decode, "EXTRA_FLAGS", ("-DNEVER_BUILT",))
    monkeypatch.setattr(cpu_decode, "_LOADED", {})
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    reset_default_context()  # (its options read CXX and the cache now)
    reason = cpu_step.unavailable_reason()
    assert reason == f"{broken} could not build kernels/cpu_decode.cpp: " \
                     "cpu_decode.cpp:9:10: fatal error: omp.h: No such file or directory"
    engine = make_engine()
    notes = check_kernels(engine)
    assert list(notes) == ["attention=flash", "kv_layout=contiguous"]
    assert all("\n" not in note and "could not build" in note and note.endswith("— using PyTorch's step")
               for note in notes.values())
    from engine import dispatch
    before = dispatch.counts()
    steps = [e for e in engine.generate(engine.tokenizer.encode("hello"), max_new_tokens=3)
             if type(e).__name__ == "StepMetrics"]
    assert len(steps) == 3 and cpu_step.STEP_LABEL not in dispatch.since(before).get("decode step", {})
    assert not list((tmp_path / "cache").rglob("*.so"))  # nothing half-built left in the cache
    from tests.engine.test_cli import run_cli
    code, out, err = run_cli(capsys, "chat", "--prompt", "hi", "--greedy", "--max-tokens", "2", "--max-context", "64")
    assert code == 0 and out.strip() and "Traceback" not in err
    assert [line for line in err.splitlines() if "C++" in line] == \
        [f"membound: the C++ CPU decode step is off ({reason}): PyTorch's step decodes"]


def test_the_environment_can_switch_the_cpp_step_off(monkeypatch):
    monkeypatch.setenv("MEMBOUND_CPU_STEP", "0")
    context = EngineContext()  # an engine's context reads the environment as it is made
    assert cpu_step.unavailable_reason(context) == "switched off by MEMBOUND_CPU_STEP=0"
    assert cpu_step.unavailable_reason(EngineContext(EngineOptions(cpu_step=True))) == ""
    model = model_of(GQA, "fp32", "fp").bind(context)
    cache = ContiguousKVCache(GQA, 1, GQA.max_seq_len, torch.float32, "cpu")
    with torch.inference_mode():
        assert cpu_step.decode_step(model, torch.tensor([[5]]), 0, cache) is None
