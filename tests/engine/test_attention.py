"""Attention backends against an fp64 reference (prefill, a chunk after cached context, decode,
GQA, ragged rows), paged handles against dense tensors, the model and its graph-capturable step
with each backend, and what the cost model charges for each."""
import math

import pytest
import torch

from engine.io.loader import synthetic_weights
from engine.kv.blocks import BlockPool, KVCacheManager
from engine.kv.cache import ContiguousKVCache, PagedKV, PageLayout
from engine.metrics import step_cost
from engine.model.attention import BACKENDS, attend
from engine.model.config import ModelConfig
from engine.model.transformer import Transformer


def reference(q, k, v, kv_lens=None):
    """Plain softmax attention in fp64, one row at a time: query i of T sits at position n - T + i."""
    B, H, T, hd = q.shape
    group = H // k.shape[1]
    out = torch.zeros(B, H, T, hd, dtype=torch.float64)
    for b in range(B):
        n = k.shape[2] if kv_lens is None else int(kv_lens[b])
        kb = k[b, :, :n].double().repeat_interleave(group, 0)
        vb = v[b, :, :n].double().repeat_interleave(group, 0)
        scores = q[b].double() @ kb.transpose(-2, -1) / math.sqrt(hd)  # (H, T, n)
        allowed = torch.arange(n)[None, :] <= (n - T + torch.arange(T))[:, None]
        out[b] = scores.masked_fill(~allowed, float("-inf")).softmax(-1) @ vb
    return out


def qkv(B, H, n_kv, T, S, hd=24, seed=0, dtype=torch.float32):
    g = torch.Generator().manual_seed(seed)
    q = torch.randn(B, T, H, hd, generator=g).transpose(1, 2)  # strided, as the model makes it
    k = torch.randn(B, n_kv, S + 5, hd, generator=g)[:, :, :S]  # a view of a longer buffer
    v = torch.randn(B, n_kv, S + 5, hd, generator=g)[:, :, :S]
    return q.to(dtype), k.to(dtype), v.to(dtype)


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("H,n_kv", [(4, 4), (6, 2), (5, 1)])
@pytest.mark.parametrize("T,S", [(11, 11), (4, 19), (1, 23)])  # prefill, a chunk on cached context, decode
def test_backends_match_the_reference(backend, H, n_kv, T, S):
    q, k, v = qkv(2, H, n_kv, T, S)
    got = attend(q, k, v, backend)
    torch.testing.assert_close(got.double(), reference(q, k, v), rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("T", [1, 3])
def test_ragged_rows_see_only_their_own_keys(backend, T):
    q, k, v = qkv(3, 6, 2, T, 17, seed=1)
    lens = torch.tensor([17, 5, 9])
    k[1, :, 5:] = 1e4  # padding past a row's length must not leak into its result
    got = attend(q, k, v, backend, kv_lens=lens)
    torch.testing.assert_close(got.double(), reference(q, k, v, lens), rtol=1e-5, atol=1e-5)


def test_bf16_backends_agree_within_bf16_tolerance():
    q, k, v = qkv(1, 6, 2, 9, 30, seed=2, dtype=torch.bfloat16)
    ref = reference(q, k, v)
    for backend in BACKENDS:
        torch.testing.assert_close(attend(q, k, v, backend).double(), ref, rtol=3e-2, atol=3e-2)


def paged_handles(lengths, block_size, n_kv=2, hd=24, num_blocks=12, seed=3):
    """Pools with random contents and sequences whose blocks are interleaved."""
    g = torch.Generator().manual_seed(seed)
    k_pool = torch.randn(n_kv, num_blocks * block_size, hd, generator=g)
    v_pool = torch.randn(n_kv, num_blocks * block_size, hd, generator=g)
    mgr = KVCacheManager(BlockPool(num_blocks), block_size)
    for step in range(max(lengths)):  # grow the sequences in turn: their blocks interleave
        for seq, n in enumerate(lengths):
            if step < n:
                mgr.allocate_slots(seq, 1)
    layout = PageLayout(block_size, [mgr.block_tables[s] for s in range(len(lengths))], list(lengths),
                        [mgr.runs(s) for s in range(len(lengths))], [[] for _ in lengths])
    dense_k = torch.zeros(len(lengths), n_kv, max(lengths), hd)
    dense_v = torch.zeros_like(dense_k)
    for s, n in enumerate(lengths):
        slots = torch.tensor([mgr.slot(s, p) for p in range(n)])
        dense_k[s, :, :n] = k_pool[:, slots]
        dense_v[s, :, :n] = v_pool[:, slots]
    return PagedKV(k_pool, layout), PagedKV(v_pool, layout), dense_k, dense_v


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("lengths,T", [([21], 1), ([21], 4), ([21, 7, 13], 1), ([9, 9], 2)])
def test_paged_handles_read_through_the_block_tables(backend, lengths, T):
    k, v, dense_k, dense_v = paged_handles(lengths, block_size=4)
    q = torch.randn(len(lengths), 6, T, 24, generator=torch.Generator().manual_seed(4))
    got = attend(q, k, v, backend)
    want = reference(q, dense_k, dense_v, torch.tensor(lengths))
    torch.testing.assert_close(got.double(), want, rtol=1e-5, atol=1e-5)


# ---- the model ---------------------------------------------------------------------------------
CFG = ModelConfig(name="tiny", dim=48, n_layers=2, n_heads=6, n_kv_heads=2, ffn_dim=80, vocab_size=71,
                  max_seq_len=64)


def test_model_logits_are_the_same_with_either_backend_cached_or_not():
    w = synthetic_weights(CFG, torch.float32, "cpu", seed=1)
    model = Transformer(CFG, {k: t * 10 if "norm" not in k else t for k, t in w.items()})
    tokens = torch.randint(0, CFG.vocab_size, (1, 24), generator=torch.Generator().manual_seed(5))
    with torch.no_grad():
        full = model(tokens, last_only=False, attention="flash")  # no cache
        torch.testing.assert_close(model(tokens, last_only=False, attention="naive"), full, rtol=1e-5, atol=1e-5)
        for backend in BACKENDS:
            cache = ContiguousKVCache(CFG, 1, CFG.max_seq_len, torch.float32, "cpu")
            model(tokens[:, :10], 0, cache, attention=backend)
            chunk = model(tokens[:, 10:16], 10, cache, last_only=False, attention=backend)
            torch.testing.assert_close(chunk, full[:, 10:16], rtol=1e-5, atol=1e-5)
            for pos in range(16, 24):
                step = model(tokens[:, pos:pos + 1], pos, cache, attention=backend)
                torch.testing.assert_close(step[:, 0], full[:, pos], rtol=1e-5, atol=1e-5)
            static = ContiguousKVCache(CFG, 1, CFG.max_seq_len, torch.float32, "cpu")
            model(tokens[:, :16], 0, static, attention=backend)
            for pos in range(16, 24):  # the graph-capturable step over the whole buffer
                got = model.forward_decode_static(tokens[:, pos:pos + 1], torch.tensor([pos]), static,
                                                  attention=backend)
                torch.testing.assert_close(got[:, 0], full[:, pos], rtol=1e-5, atol=1e-5)


# ---- the cost model ----------------------------------------------------------------------------
LLAMA = ModelConfig.from_name("llama3-8b")


def test_paged_is_charged_for_the_block_tables_it_reads():
    common = dict(batch_size=1, new_tokens=1, context_len=1000, weight_bytes=0, kv_elem_bytes=2)
    contiguous = step_cost(LLAMA, **common)
    paged = step_cost(LLAMA, kv_layout="paged", block_size=16, **common)
    # 1001 positions in 63 blocks of 16: one int32 per block, read per KV head per layer
    assert paged.kv_read_bytes - contiguous.kv_read_bytes == 32 * 8 * 63 * 4
    assert paged.kv_write_bytes == contiguous.kv_write_bytes


def test_one_query_attention_takes_sdpa_output_in_any_memory_order(monkeypatch):
    # on a GPU, SDPA can return its output as a transposed view (the first GPU run failed here: a
    # `.view` of it raised when the flash kernel was switched off); on a CPU it is contiguous
    from engine.model import attention
    sdpa = attention.F.scaled_dot_product_attention
    monkeypatch.setattr(attention.F, "scaled_dot_product_attention",
                        lambda *a, **kw: sdpa(*a, **kw).transpose(1, 2).contiguous().transpose(1, 2))
    q, k, v = qkv(2, 6, 2, 1, 23)
    got = attention.flash_attention(q, k, v, torch.tensor([23, 9]))
    monkeypatch.undo()
    torch.testing.assert_close(got, attention.flash_attention(q, k, v, torch.tensor([23, 9])))
