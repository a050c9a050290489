"""KV cache layouts. `ContiguousKVCache` reserves a max-length buffer per sequence and
hands attention a view of the filled prefix; `length` is how many positions are valid."""
from __future__ import annotations

import torch

from engine.config import ModelConfig


class ContiguousKVCache:
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

    @property
    def reserved_bytes(self) -> int:
        return 2 * self.k.numel() * self.k.element_size()

    @property
    def used_bytes(self) -> int:
        return self.reserved_bytes * self.length // self.max_len
