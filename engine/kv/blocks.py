"""Paged KV-cache bookkeeping in vLLM's names, pure Python (no torch, so the scheduler and the app
can use it): `BlockPool` hands out fixed-size blocks from a free list; `KVCacheManager` keeps each
sequence's block table, allocates on demand and frees on finish, and refuses with `KVCacheFull`
without touching any sequence when the pool runs dry. `KVCacheSnapshot` is what the app draws."""
from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass

FREE = -1  # owner of a block nobody holds


class KVCacheFull(ValueError):
    """The pool has too few free blocks for a request; nothing was allocated."""


class BlockPool:
    """`num_blocks` blocks with a free list. Freed blocks go to the back of the list (the least
    recently freed are reused first); `allocate` prefers the block right after a given one, so a
    sequence that grows alone stays in one run of consecutive blocks (the CPU path reads such a
    run as one view; the GPU kernel reads through the block table either way)."""

    def __init__(self, num_blocks: int):
        if num_blocks < 1:
            raise ValueError(f"a block pool needs at least one block, got {num_blocks}")
        self.num_blocks = num_blocks
        self._free: OrderedDict[int, None] = OrderedDict.fromkeys(range(num_blocks))
        self._owner = [FREE] * num_blocks

    @property
    def num_free(self) -> int:
        return len(self._free)

    @property
    def num_used(self) -> int:
        return self.num_blocks - len(self._free)

    def owner(self, block: int) -> int:
        return self._owner[block]

    @property
    def owners(self) -> tuple[int, ...]:
        return tuple(self._owner)

    def allocate(self, n: int, owner: int, after: int | None = None) -> list[int]:
        """n blocks for `owner`, all or none (KVCacheFull)."""
        if n > len(self._free):
            raise KVCacheFull(f"KV cache full: {n} more blocks needed, {len(self._free)} of "
                              f"{self.num_blocks} free")
        blocks = []
        for _ in range(n):
            want = None if after is None else after + 1
            if want is not None and want in self._free:
                del self._free[want]
                block = want
            else:
                block, _ = self._free.popitem(last=False)
            self._owner[block] = owner
            blocks.append(block)
            after = block
        return blocks

    def give(self, blocks: list[int], owner: int) -> None:
        """Blocks already allocated change hands (a cached prefix taken over by a new sequence)."""
        for block in blocks:
            if self._owner[block] == FREE:
                raise ValueError(f"block {block} is free: nobody can give it")
            self._owner[block] = owner

    def free(self, blocks: list[int]) -> None:
        for block in blocks:
            if self._owner[block] == FREE:
                raise ValueError(f"block {block} freed twice")
        for block in blocks:
            self._owner[block] = FREE
            self._free[block] = None


class KVCacheManager:
    """Per-sequence block tables over one `BlockPool`. A sequence's tokens 0..n-1 live in its
    blocks in order: position p is slot `table[p // block_size] * block_size + p % block_size`."""

    def __init__(self, pool: BlockPool, block_size: int):
        if block_size < 1:
            raise ValueError(f"block size must be >= 1, got {block_size}")
        self.pool = pool
        self.block_size = block_size
        self.block_tables: dict[int, list[int]] = {}
        self._num_tokens: dict[int, int] = {}

    def num_tokens(self, seq_id: int) -> int:
        return self._num_tokens.get(seq_id, 0)

    def blocks_for(self, num_tokens: int) -> int:
        return -(-num_tokens // self.block_size)

    def blocks_needed(self, seq_id: int, num_new_tokens: int) -> int:
        """Extra blocks `allocate_slots(seq_id, num_new_tokens)` would take."""
        have = len(self.block_tables.get(seq_id, ()))
        return max(0, self.blocks_for(self.num_tokens(seq_id) + num_new_tokens) - have)

    def can_allocate(self, seq_id: int, num_new_tokens: int) -> bool:
        return self.blocks_needed(seq_id, num_new_tokens) <= self.pool.num_free

    def allocate_slots(self, seq_id: int, num_new_tokens: int) -> list[int]:
        """Make room for `num_new_tokens` more tokens of `seq_id` (a new sequence starts empty);
        returns the blocks added. KVCacheFull leaves every sequence as it was."""
        if num_new_tokens < 0:
            raise ValueError(f"cannot allocate {num_new_tokens} tokens")
        need = self.blocks_needed(seq_id, num_new_tokens)
        table = self.block_tables.get(seq_id, [])
        added = self.pool.allocate(need, seq_id, after=table[-1] if table else None) if need else []
        self.block_tables[seq_id] = table + added
        self._num_tokens[seq_id] = self.num_tokens(seq_id) + num_new_tokens
        return added

    def truncate(self, seq_id: int, num_tokens: int) -> None:
        """Keep the first `num_tokens` tokens (a rewound conversation); frees blocks past them."""
        if seq_id not in self.block_tables or num_tokens >= self.num_tokens(seq_id):
            return
        num_tokens = max(0, num_tokens)
        table = self.block_tables[seq_id]
        keep = self.blocks_for(num_tokens)
        self.pool.free(table[keep:])
        self.block_tables[seq_id] = table[:keep]
        self._num_tokens[seq_id] = num_tokens

    def rename(self, seq_id: int, new_id: int) -> None:
        """Sequence `new_id` takes over `seq_id`'s blocks and tokens (its cached prefix)."""
        if new_id in self.block_tables:
            raise ValueError(f"sequence {new_id} already has blocks")
        table = self.block_tables.pop(seq_id)
        self.block_tables[new_id] = table
        self._num_tokens[new_id] = self._num_tokens.pop(seq_id)
        self.pool.give(table, new_id)

    def free(self, seq_id: int) -> None:
        """A finished (or pre-empted) sequence gives all its blocks back."""
        table = self.block_tables.pop(seq_id, [])
        self._num_tokens.pop(seq_id, None)
        self.pool.free(table)

    def slot(self, seq_id: int, pos: int) -> int:
        return self.block_tables[seq_id][pos // self.block_size] * self.block_size + pos % self.block_size

    def runs(self, seq_id: int, num_tokens: int | None = None) -> list[tuple[int, int]]:
        """The sequence's first `num_tokens` positions as runs of consecutive slots:
        [(first slot, positions), ...] — one run when its blocks are consecutive."""
        n = self.num_tokens(seq_id) if num_tokens is None else num_tokens
        runs: list[tuple[int, int]] = []
        bs = self.block_size
        for i, block in enumerate(self.block_tables.get(seq_id, [])[: self.blocks_for(n)]):
            take = min(bs, n - i * bs)
            if runs and runs[-1][0] + runs[-1][1] == block * bs:
                runs[-1] = (runs[-1][0], runs[-1][1] + take)
            else:
                runs.append((block * bs, take))
        return runs

    def snapshot(self, bytes_per_token: int, layout: str = "paged") -> "KVCacheSnapshot":
        bs = self.block_size
        filled = [0] * self.pool.num_blocks
        for seq_id, table in self.block_tables.items():
            n = self.num_tokens(seq_id)
            for i, block in enumerate(table):
                filled[block] = max(0, min(bs, n - i * bs))
        seqs = tuple(SequenceUsage(s, self.num_tokens(s), len(t)) for s, t in sorted(self.block_tables.items()))
        return KVCacheSnapshot(layout=layout, block_size=bs, bytes_per_token=bytes_per_token,
                               owners=self.pool.owners, filled=tuple(filled), sequences=seqs)


@dataclass(frozen=True)
class SequenceUsage:
    seq_id: int
    num_tokens: int  # positions holding live K/V
    num_blocks: int  # blocks (cells) reserved for it


@dataclass(frozen=True)
class KVCacheSnapshot:
    """The cache's memory, one cell per block, as plain data (no torch): what the KV panel draws.

    paged: cells are the pool's blocks; `owners[i]` is the sequence holding block i (FREE = -1),
    `filled[i]` how many of its `block_size` positions hold tokens.
    contiguous: each sequence's reserved max-length buffer cut into cells of `block_size`
    positions; the cells past its length are reserved but empty (owned, filled 0).
    off: no cells (nothing is stored; every step recomputes the context)."""
    layout: str  # "contiguous" | "paged" | "off"
    block_size: int
    bytes_per_token: int  # K and V of one position, all layers
    owners: tuple[int, ...] = ()
    filled: tuple[int, ...] = ()
    sequences: tuple[SequenceUsage, ...] = ()

    @property
    def num_blocks(self) -> int:
        return len(self.owners)

    @property
    def blocks_used(self) -> int:
        return sum(1 for o in self.owners if o != FREE)

    @property
    def blocks_free(self) -> int:
        return self.num_blocks - self.blocks_used

    @property
    def bytes_per_block(self) -> int:
        return self.block_size * self.bytes_per_token

    @property
    def pool_bytes(self) -> int:
        """Memory the cache holds from the allocator, free cells included."""
        return self.num_blocks * self.bytes_per_block

    @property
    def reserved_bytes(self) -> int:
        """Bytes set aside for sequences (their blocks, or their whole max-length buffers)."""
        return self.blocks_used * self.bytes_per_block

    @property
    def used_bytes(self) -> int:
        """Bytes holding live tokens."""
        return sum(self.filled) * self.bytes_per_token

    @property
    def fragmentation_bytes(self) -> int:
        """Reserved but holding no token: the empty tail of a buffer, the unfilled part of a block."""
        return self.reserved_bytes - self.used_bytes

    @property
    def fragmentation(self) -> float:
        return self.fragmentation_bytes / self.reserved_bytes if self.reserved_bytes else 0.0

    def sequences_that_fit(self, num_tokens: int) -> int:
        """How many more sequences of `num_tokens` tokens the free cells hold. A contiguous cache
        has no free cells: each new sequence needs a whole max-length buffer of its own."""
        if self.layout != "paged" or num_tokens < 1:
            return 0
        return self.blocks_free // -(-num_tokens // self.block_size)

    def capacity_sequences(self, num_tokens: int) -> int:
        """Sequences of `num_tokens` tokens this much memory holds in this layout: paged needs
        ceil(n / block_size) blocks each; contiguous reserves a full buffer per sequence."""
        if not self.num_blocks or num_tokens < 1:
            return 0
        if self.layout == "paged":
            return self.num_blocks // -(-num_tokens // self.block_size)
        per_sequence = max((s.num_blocks for s in self.sequences), default=self.num_blocks)
        return self.num_blocks // max(per_sequence, 1)


def contiguous_snapshot(lengths: list[int], max_len: int, block_size: int, bytes_per_token: int) -> KVCacheSnapshot:
    """A contiguous cache drawn as cells: row b is sequence b's max_len buffer."""
    cells = -(-max_len // block_size)
    owners, filled, seqs = [], [], []
    for seq_id, n in enumerate(lengths):
        owners += [seq_id] * cells
        filled += [max(0, min(block_size, n - i * block_size)) for i in range(cells)]
        seqs.append(SequenceUsage(seq_id, n, cells))
    return KVCacheSnapshot(layout="contiguous", block_size=block_size, bytes_per_token=bytes_per_token,
                           owners=tuple(owners), filled=tuple(filled), sequences=tuple(seqs))
