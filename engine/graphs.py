"""The overhead lever: a decode step replayed from a captured CUDA graph (torch.compile with
mode="reduce-overhead") instead of hundreds of kernel launches. Only batch-1 decode on the
contiguous cache is captured; everything else runs eager. A capture that fails switches graphs
off for this engine with the reason kept (`GraphDecoder.unavailable`), so the figures can say
which path ran."""
from __future__ import annotations

import torch

from engine.model.transformer import Transformer

GRAPH_BUCKET = 1024  # attention in a captured step reads a multiple of this many positions


class GraphDecoder:
    def __init__(self, device: str):
        self.device = device
        self._steps: dict = {}  # (id(model), id(cache)) -> compiled step; one at a time
        self.kind = "CUDA graph" if device.startswith("cuda") else ""  # what a captured step is here
        self.unavailable = "" if device.startswith("cuda") else "not on a GPU"  # why graphs do not run
        self.replays = 0  # decode steps that ran from a graph

    def bucket(self, enabled: bool, start: int, max_len: int) -> int | None:
        """Positions the captured step's attention reads for a token at `start`, or None: eager."""
        if not enabled or self.unavailable:
            return None
        bucket = -(-(start + 1) // GRAPH_BUCKET) * GRAPH_BUCKET
        return min(bucket, max_len)

    def decode(self, model: Transformer, cache, tokens: torch.Tensor, start: int, kv_len: int,
               attention: str) -> torch.Tensor:
        """Logits for one token at `start`; writes its K/V into `cache` in place. Any failure falls
        back to eager for good (a compiler problem must not end the conversation)."""
        key = (id(model), id(cache))
        try:
            if key not in self._steps:
                import torch._dynamo
                torch._dynamo.config.cache_size_limit = max(torch._dynamo.config.cache_size_limit, 64)
                # the graph writes the cache in place: its address must stay fixed
                torch._dynamo.mark_static_address(cache.k)
                torch._dynamo.mark_static_address(cache.v)
                self._steps = {key: torch.compile(model.forward_decode_static, mode="reduce-overhead",
                                                  fullgraph=True, dynamic=False)}
            pos = torch.tensor([start], dtype=torch.long, device=tokens.device)
            logits = self._steps[key](tokens, pos, cache, kv_len, attention).clone()
            cache.length = start + 1
            self.replays += 1
            return logits
        except Exception as error:
            self.unavailable = f"capture failed: {type(error).__name__}: {str(error).strip().splitlines()[0][:200]}" \
                if str(error).strip() else f"capture failed: {type(error).__name__}"
            self._steps = {}
            return model(tokens, start_pos=start, cache=cache, attention=attention)
