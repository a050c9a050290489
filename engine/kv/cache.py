"""KV cache layouts. `ContiguousKVCache` reserves a max-length buffer per sequence and hands
attention a view of the filled prefix; `PagedKVCache` keeps K/V in fixed-size blocks of a shared
pool (bookkeeping in engine/kv/blocks.py) and hands attention `PagedKV` handles that read through the
block tables. Both: `update(layer, start_pos, k, v)`, `truncate(n)`, `length`, `snapshot()`.
("off", no cache, is the model run with cache=None: every step recomputes the context.)"""
from __future__ import annotations

import weakref

import torch

from engine.kv.blocks import BlockPool, KVCacheFull, KVCacheManager, KVCacheSnapshot, contiguous_snapshot
from engine.model.config import ModelConfig

DEFAULT_BLOCK_SIZE = 16  # positions per block (vLLM's default on GPUs)


class BuffersRef:
    """A cache and the K/V tensors it has now, held weakly: whether something made over them (the C++
    step's plan, a captured decode step), which points at their addresses, still matches the cache.
    A paged cache's precision switch gives it new K/V in place (`PagedKVCache.astype`), and an id of a
    freed cache can come back; a weak reference can do neither, nor keep the old buffers alive."""

    def __init__(self, cache):
        self._refs = (weakref.ref(cache), weakref.ref(cache.k), weakref.ref(cache.v))

    def matches(self, cache) -> bool:
        was_cache, was_k, was_v = (ref() for ref in self._refs)
        return was_cache is cache and was_k is cache.k and was_v is cache.v


class ContiguousKVCache:
    layout = "contiguous"

    def __init__(self, cfg: ModelConfig, batch_size: int, max_len: int, dtype: torch.dtype, device):
        shape = (cfg.n_layers, batch_size, cfg.n_kv_heads, max_len, cfg.head_dim)  # (L, B, n_kv, S, hd)
        self.k = torch.zeros(shape, dtype=dtype, device=device)
        self.v = torch.zeros(shape, dtype=dtype, device=device)
        self.max_len = max_len
        self.length = 0  # positions holding live tokens (same for every row of the batch)

    def update(self, layer: int, start_pos: int, k: torch.Tensor, v: torch.Tensor):
        end = start_pos + k.shape[2]
        if end > self.max_len:
            raise ValueError(f"KV cache holds {self.max_len} positions; step needs {end}")
        self.k[layer, :, :, start_pos:end] = k
        self.v[layer, :, :, start_pos:end] = v
        if layer == self.k.shape[0] - 1:
            self.length = end
        return self.k[layer, :, :, :end], self.v[layer, :, :, :end]

    def truncate(self, length: int) -> None:
        """Forget positions from `length` on (a rewound conversation); no data moves."""
        self.length = min(self.length, length)

    def prefix(self, n: int) -> tuple[torch.Tensor, torch.Tensor]:
        """K and V of row 0's positions 0..n-1, (L, n_kv, n, hd) views."""
        return self.k[:, 0, :, :n], self.v[:, 0, :, :n]

    def load(self, k: torch.Tensor, v: torch.Tensor) -> None:
        """Hold exactly K and V (L, n_kv, n, hd) as positions 0..n-1 of every row."""
        n = k.shape[2]
        self.k[:, :, :, :n] = k[:, None]
        self.v[:, :, :, :n] = v[:, None]
        self.length = n

    @property
    def reserved_bytes(self) -> int:
        return 2 * self.k.numel() * self.k.element_size()

    @property
    def used_bytes(self) -> int:
        return self.reserved_bytes * self.length // self.max_len

    def astype(self, dtype: torch.dtype) -> "ContiguousKVCache":
        """The same cached context at another precision (a dtype switch keeps the conversation)."""
        new = ContiguousKVCache.__new__(ContiguousKVCache)
        new.k, new.v, new.max_len, new.length = self.k.to(dtype), self.v.to(dtype), self.max_len, self.length
        return new

    def snapshot(self, block_size: int = DEFAULT_BLOCK_SIZE) -> KVCacheSnapshot:
        return contiguous_snapshot([self.length] * self.k.shape[1], self.max_len, block_size,
                                   _bytes_per_token(self.k))


class PagedKVCache:
    """K and V in blocks of one pool shared by every sequence: k, v (L, n_kv, num_blocks * block_size, hd),
    block b holding slots b * block_size ... (b + 1) * block_size - 1 for every layer and head.
    Batch row i of a step is sequence `seq_ids[i]`; blocks are allocated as the sequences grow
    (all or nothing: KVCacheFull leaves every sequence intact) and freed by truncate/free."""
    layout = "paged"

    def __init__(self, cfg: ModelConfig, num_blocks: int, block_size: int, dtype: torch.dtype, device,
                 seq_ids: tuple[int, ...] = (0,)):
        self.manager = KVCacheManager(BlockPool(num_blocks), block_size)
        shape = (cfg.n_layers, cfg.n_kv_heads, num_blocks * block_size, cfg.head_dim)  # (L, n_kv, slots, hd)
        self.k = torch.zeros(shape, dtype=dtype, device=device)
        self.v = torch.zeros(shape, dtype=dtype, device=device)
        self.block_size = block_size
        self.seq_ids = list(seq_ids)
        self._step: PageLayout | None = None

    @property
    def length(self) -> int:
        return self.manager.num_tokens(self.seq_ids[0])

    @property
    def max_len(self) -> int:
        """Positions one sequence could hold with the whole pool to itself."""
        return self.manager.pool.num_blocks * self.block_size

    def truncate(self, length: int) -> None:
        for seq in self.seq_ids:
            self.manager.truncate(seq, length)

    def free(self) -> None:
        for seq in self.seq_ids:
            self.manager.free(seq)

    def prefix(self, n: int, seq: int | None = None) -> tuple[torch.Tensor, torch.Tensor]:
        """K and V of a sequence's positions 0..n-1 (default: its first), (L, n_kv, n, hd)."""
        runs = self.manager.runs(self.seq_ids[0] if seq is None else seq, n) or [(0, 0)]  # n = 0: empty
        return tuple(torch.cat([t[:, :, slot:slot + m] for slot, m in runs], dim=2) for t in (self.k, self.v))

    def load(self, k: torch.Tensor, v: torch.Tensor) -> None:
        """Hold exactly K and V (L, n_kv, n, hd) as positions 0..n-1 of every sequence."""
        self.free()
        for seq in self.seq_ids:
            self.manager.allocate_slots(seq, k.shape[2])
            self.write(seq, 0, k, v)

    def write(self, seq: int, start: int, k: torch.Tensor, v: torch.Tensor) -> None:
        """Put K and V (L, n_kv, T, hd) at `seq`'s positions start..start+T-1, every layer at once
        (their slots allocated already); converted to the pool's precision."""
        for slot, n, offset in _write_runs(self.manager, seq, start, start + k.shape[2]):
            self.k[:, :, slot:slot + n] = k[:, :, offset:offset + n]
            self.v[:, :, slot:slot + n] = v[:, :, offset:offset + n]

    def update(self, layer: int, start_pos: int, k: torch.Tensor, v: torch.Tensor):
        """Write the step's k, v (B, n_kv, T, hd) at positions start_pos.. of each row's sequence;
        return this layer's (PagedKV, PagedKV). Blocks are allocated once per step, at layer 0."""
        if layer == 0:
            self._step = self.begin_step(start_pos, k.shape[2])
        step = self._step
        for b, runs in enumerate(step.write_runs):
            for slot, n, offset in runs:
                self.k[layer, :, slot:slot + n] = k[b, :, offset:offset + n]
                self.v[layer, :, slot:slot + n] = v[b, :, offset:offset + n]
        return PagedKV(self.k[layer], step), PagedKV(self.v[layer], step)

    def begin_step(self, start_pos: int, n_new: int) -> "PageLayout":
        manager = self.manager
        for seq in self.seq_ids:
            have = manager.num_tokens(seq)
            if have > start_pos:
                manager.truncate(seq, start_pos)
            elif have < start_pos:
                raise ValueError(f"paged KV cache: sequence {seq} holds {have} positions, "
                                 f"the step starts at {start_pos}")
        need = sum(manager.blocks_needed(seq, n_new) for seq in self.seq_ids)
        if need > manager.pool.num_free:  # checked for the whole batch first: all or nothing
            raise KVCacheFull(f"KV cache full: this step needs {need} more blocks of {self.block_size} positions, "
                              f"{manager.pool.num_free} of {manager.pool.num_blocks} are free")
        for seq in self.seq_ids:
            manager.allocate_slots(seq, n_new)
        return PageLayout(
            block_size=self.block_size,
            block_tables=[list(manager.block_tables[seq]) for seq in self.seq_ids],
            context_lens=[manager.num_tokens(seq) for seq in self.seq_ids],
            runs=[manager.runs(seq) for seq in self.seq_ids],
            write_runs=[_write_runs(manager, seq, start_pos, start_pos + n_new) for seq in self.seq_ids])

    def astype(self, dtype: torch.dtype) -> "PagedKVCache":
        self.k, self.v = self.k.to(dtype), self.v.to(dtype)  # same blocks, same tables
        return self

    def snapshot(self) -> KVCacheSnapshot:
        return self.manager.snapshot(_bytes_per_token(self.k))


class PageLayout:
    """Where one step's sequences live in the pool (shared by every layer, and by K and V)."""

    def __init__(self, block_size: int, block_tables: list[list[int]], context_lens: list[int],
                 runs: list[list[tuple[int, int]]], write_runs: list[list[tuple[int, int, int]]]):
        self.block_size = block_size
        self.block_tables = block_tables
        self.context_lens = context_lens  # keys per row after this step's writes
        self.runs = runs  # per row: (first slot, positions) runs of consecutive slots, in order
        self.write_runs = write_runs  # per row: (first slot, positions, offset in the step's tokens)
        self._tensors: dict = {}

    def tensors(self, device) -> tuple[torch.Tensor, torch.Tensor]:
        """(block_tables (B, max_blocks) int32, context_lens (B,) int32) on `device`, made once a step."""
        key = str(device)
        if key not in self._tensors:
            width = max(len(t) for t in self.block_tables)
            tables = torch.tensor([t + [0] * (width - len(t)) for t in self.block_tables], dtype=torch.int32)
            lens = torch.tensor(self.context_lens, dtype=torch.int32)
            self._tensors[key] = (tables.to(device), lens.to(device))
        return self._tensors[key]


class PagedKV:
    """One layer's K (or V) for a batch, stored in pages: the pool (n_kv, slots, hd) and the layout.
    Attention reads it through the block tables (the GPU kernel) or as runs of slots (CPU)."""

    def __init__(self, pool: torch.Tensor, layout: PageLayout):
        self.pool = pool
        self.layout = layout

    def run_views(self, row: int) -> list[torch.Tensor]:
        """Row `row`'s keys in order as views of the pool, one (1, n_kv, n, hd) per run: no copy."""
        return [self.pool[None, :, slot:slot + n] for slot, n in self.layout.runs[row]]

    def dense(self) -> torch.Tensor:
        """(B, n_kv, max context, hd): a view when B == 1 and the row is one run, else a gathered
        copy (rows shorter than the longest are zero-padded; attention masks them)."""
        rows = [self.run_views(b) for b in range(len(self.layout.runs))]
        if len(rows) == 1 and len(rows[0]) == 1:
            return rows[0][0]
        width = max(self.layout.context_lens)
        n_kv, _, hd = self.pool.shape
        out = self.pool.new_zeros((len(rows), n_kv, width, hd))
        for b, views in enumerate(rows):
            pos = 0
            for view in views:
                out[b, :, pos:pos + view.shape[2]] = view[0]
                pos += view.shape[2]
        return out


def _write_runs(manager: KVCacheManager, seq: int, start: int, end: int) -> list[tuple[int, int, int]]:
    """Positions start..end-1 of `seq` as (first slot, positions, offset from start) runs."""
    bs = manager.block_size
    table = manager.block_tables[seq]
    runs: list[tuple[int, int, int]] = []
    pos = start
    while pos < end:
        i = pos // bs
        n = min(end, (i + 1) * bs) - pos
        slot = table[i] * bs + pos - i * bs
        if runs and runs[-1][0] + runs[-1][1] == slot:
            runs[-1] = (runs[-1][0], runs[-1][1] + n, runs[-1][2])
        else:
            runs.append((slot, n, pos - start))
        pos += n
    return runs


def _bytes_per_token(cache_k: torch.Tensor) -> int:
    """K and V of one position over all layers and heads."""
    n_layers, hd = cache_k.shape[0], cache_k.shape[-1]
    n_kv = cache_k.shape[-3]
    return 2 * n_layers * n_kv * hd * cache_k.element_size()
