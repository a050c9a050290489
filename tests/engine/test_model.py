"""The model against transformers' LlamaForCausalLM on small random configs (fp32)."""
import pytest
import torch

from engine.bench.hf_compare import build_hf_model
from engine.context import default_context
from engine.io.loader import synthetic_weights
from engine.kv.cache import ContiguousKVCache
from engine.model.config import ModelConfig
from engine.model.transformer import Transformer


def tiny(n_heads=4, n_kv_heads=2, tied=False, **kw) -> ModelConfig:
    base = dict(name="tiny", dim=16 * n_heads, n_layers=2, n_heads=n_heads, n_kv_heads=n_kv_heads, ffn_dim=96,
                vocab_size=211, rope_theta=10000.0, norm_eps=1e-5, tied_embeddings=tied, max_seq_len=64)
    base.update(kw)
    return ModelConfig(**base)


def random_weights(cfg, seed=0):
    w = synthetic_weights(cfg, torch.float32, "cpu", seed=seed)
    gen = torch.Generator().manual_seed(seed + 1)
    for k in w:  # non-trivial norms and larger weights so errors would show
        if "norm" in k:
            w[k] = 1.0 + 0.1 * torch.randn(w[k].shape, generator=gen)
        else:
            w[k] = w[k] * 10
    return w


@pytest.mark.parametrize("n_heads,n_kv_heads,tied", [(4, 4, False), (4, 2, False), (6, 2, True), (4, 1, True)])
def test_prefill_logits_match_transformers(n_heads, n_kv_heads, tied):
    cfg = tiny(n_heads, n_kv_heads, tied)
    w = random_weights(cfg)
    ours = Transformer(cfg, w)
    hf = build_hf_model(cfg, w, torch.float32)
    tokens = torch.randint(0, cfg.vocab_size, (2, 13), generator=torch.Generator().manual_seed(3))
    with torch.no_grad():
        expect = hf(tokens).logits
        got = ours(tokens, last_only=False)
    torch.testing.assert_close(got, expect, rtol=1e-4, atol=1e-4)


def test_cached_decode_matches_full_recompute_and_transformers():
    cfg = tiny(4, 2)
    w = random_weights(cfg, seed=5)
    ours = Transformer(cfg, w)
    hf = build_hf_model(cfg, w, torch.float32)
    tokens = torch.randint(0, cfg.vocab_size, (1, 20), generator=torch.Generator().manual_seed(4))
    cache = ContiguousKVCache(cfg, 1, cfg.max_seq_len, torch.float32, "cpu")
    with torch.no_grad():
        expect = hf(tokens).logits
        first = ours(tokens[:, :8], start_pos=0, cache=cache, last_only=False)
        torch.testing.assert_close(first, expect[:, :8], rtol=1e-4, atol=1e-4)
        # a multi-token chunk on top of the cache (a second chat turn), then single-token steps
        chunk = ours(tokens[:, 8:12], start_pos=8, cache=cache, last_only=False)
        torch.testing.assert_close(chunk, expect[:, 8:12], rtol=1e-4, atol=1e-4)
        for pos in range(12, 20):
            step = ours(tokens[:, pos:pos + 1], start_pos=pos, cache=cache)
            torch.testing.assert_close(step[:, 0], expect[:, pos], rtol=1e-4, atol=1e-4)
    assert cache.length == 20


def test_greedy_generation_matches_transformers_generate():
    cfg = tiny(4, 2, tied=True)
    w = random_weights(cfg, seed=9)
    ours = Transformer(cfg, w)
    hf = build_hf_model(cfg, w, torch.float32)
    prompt = torch.randint(0, cfg.vocab_size, (1, 5), generator=torch.Generator().manual_seed(2))
    with torch.no_grad():
        expect = hf.generate(prompt, max_new_tokens=12, do_sample=False, pad_token_id=0)[0, 5:].tolist()
        cache = ContiguousKVCache(cfg, 1, cfg.max_seq_len, torch.float32, "cpu")
        logits = ours(prompt, 0, cache)
        got = []
        pos = 5
        for _ in range(12):
            tok = int(logits[0, -1].argmax())
            got.append(tok)
            logits = ours(torch.tensor([[tok]]), pos, cache)
            pos += 1
    assert got == expect


@pytest.mark.parametrize("rows", [1, 2, 3, 5])
def test_cpu_gemv_path_equals_plain_linear(rows, monkeypatch):
    from engine.model import transformer as model
    from engine.model.transformer import linear
    monkeypatch.setattr(model, "CPU_GEMV_MAX_ROWS", 8)  # the chunked bmm for every row count here
    monkeypatch.setattr(model, "chunked_gemv_is_faster", lambda chunks, context=None: True)  # whatever this CPU measures
    gen = torch.Generator().manual_seed(0)
    w = torch.randn(96, 40, generator=gen)
    x = torch.randn(rows, 40, generator=gen)
    torch.testing.assert_close(linear(x, w), x @ w.t(), rtol=1e-5, atol=1e-5)
    x3 = torch.randn(1, rows, 40, generator=gen)
    torch.testing.assert_close(linear(x3, w), x3 @ w.t(), rtol=1e-5, atol=1e-5)


def test_the_gemv_path_is_the_one_this_cpu_measures_faster():
    from engine.context import EngineContext
    from engine.model import transformer as model
    context = EngineContext()
    faster = model.chunked_gemv_is_faster(3, context)  # a thread count that does not divide 8192
    assert isinstance(faster, bool) and context.chunked_gemv_faster == {3: faster}  # measured once, then kept
    assert model.chunked_gemv_is_faster(3, context) is faster
    assert EngineContext().chunked_gemv_faster == {}  # each engine's context measures its own


needs_onednn = pytest.mark.skipif(not torch.backends.mkldnn.is_available(), reason="torch built without oneDNN")


@needs_onednn
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("rows", [1, 2, 3, 4, 5, 9, 33])
def test_linear_takes_the_packed_copy_for_batched_rows_and_matches_matmul(rows, dtype):
    from engine.model import transformer as model
    gen = torch.Generator().manual_seed(rows)
    lin = model.Linear(torch.randn(96, 40, generator=gen).to(dtype))
    x = torch.randn(1, rows, 40, generator=gen).to(dtype)  # (1, N, dim), as the batched forward packs rows
    y = lin(x)
    assert y.shape == (1, rows, 96) and y.dtype == dtype
    tol = dict(rtol=1e-5, atol=1e-5) if dtype == torch.float32 else dict(rtol=2e-2, atol=2e-2)
    torch.testing.assert_close(y.float(), (x.float() @ lin.weight.float().t()), **tol)
    packed = default_context().packed_weights.get(lin.weight) is not None  # a layer of no engine's: the default
    assert packed == (rows > model.CPU_GEMV_MAX_ROWS)  # batch-1 decode keeps its GEMV path


@needs_onednn
def test_packed_copy_follows_in_place_weight_writes_and_dies_with_the_weight():
    from engine.model import transformer as model
    lin = model.Linear(torch.randn(64, 32))
    x = torch.randn(6, 32)
    lin(x)
    before = model.packed_weight_bytes()
    assert before >= 64 * 32 * 4
    with torch.no_grad():
        lin.weight.mul_(-2.0)
    torch.testing.assert_close(lin(x), x @ lin.weight.t())  # packed again, not the stale copy
    assert model.packed_weight_bytes() == before
    del lin
    assert model.packed_weight_bytes() == before - 64 * 32 * 4


@needs_onednn
def test_no_packed_copy_when_memory_is_short(monkeypatch):
    from engine.model import transformer as model
    monkeypatch.setattr(model, "_memory_allows", lambda nbytes: False)
    lin = model.Linear(torch.randn(48, 16))
    x = torch.randn(7, 16)
    torch.testing.assert_close(lin(x), x @ lin.weight.t())
    assert default_context().packed_weights.get(lin.weight) is None


def test_context_longer_than_the_model_is_refused():
    cfg = tiny(max_seq_len=16)
    ours = Transformer(cfg, random_weights(cfg))
    with pytest.raises(ValueError, match="exceeds"):
        ours(torch.zeros(1, 17, dtype=torch.long))


def test_static_decode_path_matches_the_dynamic_one():
    """The graph-capturable decode step (used with CUDA graphs on a GPU) computes the same
    logits as the ordinary step, and leaves the cache in the same state."""
    cfg = tiny(4, 2)
    w = random_weights(cfg, seed=7)
    ours = Transformer(cfg, w)
    tokens = torch.randint(0, cfg.vocab_size, (1, 12), generator=torch.Generator().manual_seed(1))
    a = ContiguousKVCache(cfg, 1, cfg.max_seq_len, torch.float32, "cpu")
    b = ContiguousKVCache(cfg, 1, cfg.max_seq_len, torch.float32, "cpu")
    with torch.no_grad():
        ours(tokens[:, :6], 0, a)
        ours(tokens[:, :6], 0, b)
        for pos in range(6, 12):
            expect = ours(tokens[:, pos:pos + 1], pos, a)
            got = ours.forward_decode_static(tokens[:, pos:pos + 1], torch.tensor([pos]), b)
            torch.testing.assert_close(got, expect, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(a.k[:, :, :, :12], b.k[:, :, :, :12])


def test_the_fused_weights_are_the_only_copy():
    """q/k/v and gate/up are concatenated for one matmul each; the caller's originals become views
    of those copies (same values), so a loaded model is held once, not twice."""
    import weakref

    cfg = tiny(4, 2)
    w = random_weights(cfg)
    before = {k: v.clone() for k, v in w.items()}
    original = weakref.ref(w["layers.1.w_up"])
    model = Transformer(cfg, w)
    assert original() is None  # freed: nothing holds the loader's tensor any more
    for name in ("wq", "wk", "wv"):
        assert w[f"layers.1.{name}"].untyped_storage().data_ptr() == model.layers[1].wqkv.weight.untyped_storage().data_ptr()
        assert torch.equal(w[f"layers.1.{name}"], before[f"layers.1.{name}"])
    assert torch.equal(w["layers.0.w_gate"], before["layers.0.w_gate"]) and w["layers.0.w_gate"]._base is not None
    again = Transformer(cfg, w)  # a second model from the same dict (the engine's other dtype): same logits
    tokens = torch.arange(1, 9)[None]
    torch.testing.assert_close(again(tokens), model(tokens))
