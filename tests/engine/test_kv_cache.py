"""KV cache layouts: the block pool and manager (pure bookkeeping, with a hypothesis property
test), the paged cache against the contiguous one through the model, running out of blocks,
the memory snapshot the app draws, and switching layouts mid-reply."""
import dataclasses

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from test_engine import GREEDY, make_engine, run

from engine.events import SettingsApplied, TokenEvent
from engine.io.loader import synthetic_weights
from engine.kv.blocks import FREE, BlockPool, KVCacheFull, KVCacheManager, contiguous_snapshot
from engine.kv.cache import ContiguousKVCache, PagedKVCache
from engine.metrics import StepMetrics
from engine.model.config import ModelConfig
from engine.model.transformer import Transformer
from engine.settings import Settings


# ---- BlockPool / KVCacheManager -------------------------------------------------------------
def test_pool_allocates_all_or_nothing_and_refuses_double_free():
    pool = BlockPool(4)
    a = pool.allocate(3, owner=7)
    assert a == [0, 1, 2] and pool.num_free == 1 and pool.owner(1) == 7
    with pytest.raises(KVCacheFull, match="2 more blocks needed, 1 of 4 free"):
        pool.allocate(2, owner=8)
    assert pool.num_free == 1 and pool.owners == (7, 7, 7, FREE)
    pool.free([1])
    with pytest.raises(ValueError, match="freed twice"):
        pool.free([0, 1])
    assert pool.owner(0) == 7  # the refused free changed nothing


def test_manager_grows_on_demand_truncates_and_frees():
    mgr = KVCacheManager(BlockPool(8), block_size=4)
    assert mgr.allocate_slots(0, 5) == [0, 1]  # 5 tokens: 2 blocks
    assert mgr.allocate_slots(0, 3) == []  # 8 tokens still fit in 2 blocks
    assert mgr.allocate_slots(1, 1) == [2]
    assert mgr.allocate_slots(0, 1) == [3]  # the block after 1 is taken: the next free one
    assert mgr.block_tables[0] == [0, 1, 3] and mgr.num_tokens(0) == 9
    assert mgr.slot(0, 8) == 12 and mgr.runs(0) == [(0, 8), (12, 1)]
    mgr.truncate(0, 4)
    assert mgr.block_tables[0] == [0] and mgr.pool.num_free == 6
    mgr.free(0)
    mgr.free(1)
    assert mgr.pool.num_free == 8 and mgr.block_tables == {}


def test_a_sequence_growing_alone_stays_in_one_run():
    mgr = KVCacheManager(BlockPool(64), block_size=16)
    for _ in range(300):
        mgr.allocate_slots(0, 1)
    assert mgr.runs(0) == [(mgr.block_tables[0][0] * 16, 300)]


@settings(max_examples=150, deadline=None)
@given(num_blocks=st.integers(1, 20), block_size=st.sampled_from([1, 3, 16]),
       ops=st.lists(st.tuples(st.sampled_from(["admit", "append", "truncate", "finish"]), st.integers(0, 5),
                              st.integers(0, 40)), max_size=60))
def test_random_admits_appends_and_finishes_leak_nothing_and_own_nothing_twice(num_blocks, block_size, ops):
    pool = BlockPool(num_blocks)
    mgr = KVCacheManager(pool, block_size)
    lengths: dict[int, int] = {}  # the oracle
    data: dict[int, tuple[int, int]] = {}  # slot -> (seq, position) written there

    def write(seq, start, end):
        for pos in range(start, end):
            data[mgr.slot(seq, pos)] = (seq, pos)

    for op, seq, n in ops:
        before = ({s: list(t) for s, t in mgr.block_tables.items()}, pool.owners, pool.num_free)
        try:
            if op == "admit" and seq not in lengths:
                mgr.allocate_slots(seq, n)
                lengths[seq] = n
                write(seq, 0, n)
            elif op == "append" and seq in lengths:
                mgr.allocate_slots(seq, n % 9)
                write(seq, lengths[seq], lengths[seq] + n % 9)
                lengths[seq] += n % 9
            elif op == "truncate" and seq in lengths:
                lengths[seq] = min(lengths[seq], n)
                mgr.truncate(seq, n)
            elif op == "finish" and seq in lengths:
                mgr.free(seq)
                del lengths[seq]
        except KVCacheFull:  # refused: nothing moved
            assert ({s: list(t) for s, t in mgr.block_tables.items()}, pool.owners, pool.num_free) == before
        owned = [b for t in mgr.block_tables.values() for b in t]
        assert len(owned) == len(set(owned)), "a block is in two tables"
        assert len(owned) + pool.num_free == num_blocks, "a block leaked"
        for s, table in mgr.block_tables.items():
            assert mgr.num_tokens(s) == lengths[s]
            assert len(table) == -(-lengths[s] // block_size)
            assert all(pool.owner(b) == s for b in table)
        for s, n_tokens in lengths.items():  # every live token still reads back its own data
            assert all(data[mgr.slot(s, p)] == (s, p) for p in range(n_tokens))
    for s in list(lengths):
        mgr.free(s)
    assert pool.num_free == num_blocks and set(pool.owners) <= {FREE}


# ---- the paged cache through the model ----------------------------------------------------------
CFG = ModelConfig(name="tiny", dim=64, n_layers=2, n_heads=4, n_kv_heads=2, ffn_dim=96, vocab_size=97,
                  max_seq_len=96)


def _model():
    w = synthetic_weights(CFG, torch.float32, "cpu", seed=3)
    return Transformer(CFG, {k: v * 10 if "norm" not in k else v for k, v in w.items()})


@pytest.mark.parametrize("attention", ["flash", "naive"])
@pytest.mark.parametrize("scatter", [False, True])
def test_paged_cache_gives_the_contiguous_logits(attention, scatter):
    """Prefill, a multi-token chunk, then decode steps; `scatter` first fragments the pool so the
    sequence's blocks are not consecutive (attention reads several runs)."""
    model = _model()
    tokens = torch.randint(0, CFG.vocab_size, (1, 40), generator=torch.Generator().manual_seed(1))
    contiguous = ContiguousKVCache(CFG, 1, CFG.max_seq_len, torch.float32, "cpu")
    paged = PagedKVCache(CFG, num_blocks=16, block_size=8, dtype=torch.float32, device="cpu", seq_ids=(0,))
    if scatter:
        pool = paged.manager.pool  # other sequences hold every other block
        pool.allocate(16, owner=99)
        pool.free([1, 3, 5, 7, 9, 11, 13])
    with torch.no_grad():
        for lo, hi in [(0, 13), (13, 21)] + [(p, p + 1) for p in range(21, 40)]:
            want = model(tokens[:, lo:hi], lo, contiguous, last_only=False, attention=attention)
            got = model(tokens[:, lo:hi], lo, paged, last_only=False, attention=attention)
            torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)
    assert paged.length == 40
    if scatter:
        assert len(paged.manager.runs(0)) == 5


def test_running_out_of_blocks_refuses_the_step_and_keeps_the_sequence():
    model = _model()
    tokens = torch.randint(0, CFG.vocab_size, (1, 20), generator=torch.Generator().manual_seed(2))
    paged = PagedKVCache(CFG, num_blocks=2, block_size=8, dtype=torch.float32, device="cpu")
    ref = ContiguousKVCache(CFG, 1, CFG.max_seq_len, torch.float32, "cpu")
    with torch.no_grad():
        model(tokens[:, :12], 0, paged)
        model(tokens[:, :12], 0, ref)
        with pytest.raises(KVCacheFull, match="KV cache full"):
            model(tokens[:, 12:20], 12, paged)  # needs a third block
        assert paged.length == 12 and paged.manager.pool.num_free == 0
        for pos in range(12, 16):  # what fits still decodes exactly as before
            torch.testing.assert_close(model(tokens[:, pos:pos + 1], pos, paged),
                                       model(tokens[:, pos:pos + 1], pos, ref), rtol=1e-5, atol=1e-5)


# ---- snapshots ---------------------------------------------------------------------------------
def test_contiguous_snapshot_shows_the_reserved_empty_tail():
    snap = contiguous_snapshot([20], max_len=64, block_size=16, bytes_per_token=100)
    assert snap.owners == (0, 0, 0, 0) and snap.filled == (16, 4, 0, 0)
    assert snap.reserved_bytes == 6400 and snap.used_bytes == 2000 and snap.fragmentation_bytes == 4400
    assert snap.sequences_that_fit(20) == 0 and snap.capacity_sequences(20) == 1


def test_paged_snapshot_counts_blocks_fragmentation_and_room():
    mgr = KVCacheManager(BlockPool(10), block_size=16)
    mgr.allocate_slots(0, 20)
    mgr.allocate_slots(1, 33)
    snap = mgr.snapshot(bytes_per_token=10)
    assert snap.blocks_used == 5 and snap.blocks_free == 5
    assert snap.owners[:5] == (0, 0, 1, 1, 1) and snap.filled[:5] == (16, 4, 16, 16, 1)
    assert snap.used_bytes == 53 * 10 and snap.reserved_bytes == 5 * 160
    assert snap.fragmentation_bytes == 800 - 530
    assert snap.sequences_that_fit(20) == 2 and snap.capacity_sequences(20) == 5
    assert [(s.seq_id, s.num_tokens, s.num_blocks) for s in snap.sequences] == [(0, 20, 2), (1, 33, 3)]


# ---- the engine: settings and switching --------------------------------------------------------
def test_kv_cache_flag_and_kv_layout_stay_one_setting():
    assert Settings().kv_layout == "contiguous" and Settings().kv_cache
    assert Settings(kv_cache=False).kv_layout == "off"
    assert not Settings(kv_layout="off").kv_cache
    paged = Settings(kv_layout="paged")
    assert dataclasses.replace(paged, kv_cache=True).kv_layout == "paged"  # the toggle keeps the layout
    off = dataclasses.replace(paged, kv_cache=False)
    assert off.kv_layout == "off"
    assert dataclasses.replace(off, kv_cache=True).kv_layout == "contiguous"
    assert dataclasses.replace(off, kv_layout="paged").kv_cache  # the layout control turns it on
    assert dataclasses.replace(off, dtype="bf16").kv_layout == "off"  # other changes leave it alone
    assert Settings(kv_layout="paged", attention="naive").label == "fp32 · kv paged · naive attention"
    with pytest.raises(ValueError, match="KV layout"):
        Settings(kv_layout="ring").validate()
    with pytest.raises(ValueError, match="attention"):
        Settings(attention="sparse").validate()


def _settings(**kw):
    return Settings(dtype="fp32", max_new_tokens=12, sampling=GREEDY.sampling, **kw)


@pytest.mark.parametrize("switch_to,label", [(dict(kv_layout="paged"), "kv paged"),
                                             (dict(attention="naive"), "naive attention"),
                                             (dict(kv_layout="paged", attention="naive"), None)])
def test_switching_layout_or_attention_mid_reply_keeps_the_conversation(switch_to, label):
    prompt = list(range(1, 30))
    baseline, _, _, _ = run(make_engine().generate(prompt))
    eng = make_engine(_settings())
    events = []
    for event in eng.generate(prompt):
        events.append(event)
        if isinstance(event, TokenEvent) and event.index == 3:
            eng.apply(_settings(**switch_to))
    tokens = [e.token_id for e in events if isinstance(e, TokenEvent)]
    assert tokens == baseline
    applied = [e for e in events if isinstance(e, SettingsApplied)]
    assert len(applied) == 1 and (label is None or applied[0].changes == (label,))
    steps = [e for e in events if isinstance(e, StepMetrics)]
    after = steps[4:]
    if "kv_layout" in switch_to:  # a new layout starts empty: one step re-prefills the context
        assert after[0].new_tokens == len(prompt) + 4 and after[0].context_len == 0
        assert all(s.new_tokens == 1 for s in after[1:])
        assert eng.cache.layout == "paged"
    else:  # same cache: decoding goes on
        assert all(s.new_tokens == 1 for s in after)
    if switch_to.get("attention") == "naive":
        assert all(s.attention_bytes > 0 for s in after) and all(s.attention_bytes == 0 for s in steps[:4])


def test_engine_snapshot_follows_the_layout_and_a_new_chat_frees_the_blocks():
    eng = make_engine(_settings(kv_layout="paged"))
    run(eng.generate(list(range(1, 30))))
    snap = eng.kv_snapshot()
    assert snap.layout == "paged" and snap.sequences[0].num_tokens == 29 + 11
    assert snap.blocks_used == -(-40 // 16) and snap.num_blocks == -(-CFG_ENGINE_MAX // 16)
    eng.reset()
    assert eng.kv_snapshot().blocks_used == 0
    eng.apply(_settings(kv_layout="off"))
    run(eng.generate([1, 2, 3]))
    assert eng.kv_snapshot().layout == "off" and eng.kv_snapshot().num_blocks == 0
    eng.apply(_settings())
    run(eng.generate([1, 2, 3]))
    snap = eng.kv_snapshot()
    assert snap.layout == "contiguous" and snap.fragmentation_bytes > 0.9 * snap.reserved_bytes


CFG_ENGINE_MAX = 200  # test_engine.CFG.max_seq_len
