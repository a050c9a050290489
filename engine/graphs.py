"""The overhead lever: a decode step replayed from a captured CUDA graph (torch.compile with
mode="reduce-overhead") instead of hundreds of kernel launches. Only batch-1 decode on the
contiguous cache is captured; everything else (prefill, speculative verify steps, paged steps)
runs eager. A capture that fails switches graphs off for this engine with the reason kept
(`GraphDecoder.unavailable`), so the figures can say which path ran.

On a CPU the same step can be compiled (torch.compile, inductor's C++) but it measured slower than
eager on the default model at batch 1, so it is offered only to the overhead sweep
(`cpu_compile=True`); the engine's CPU decode runs eagerly and says why (CPU_CAPTURE_REFUSAL)."""
from __future__ import annotations

import torch

from engine.model.transformer import Transformer

GRAPH_BUCKET = 1024  # attention in a captured step reads a multiple of this many positions
# SmolLM2-135M fp32, batch 1, context 200, 2-core AMD EPYC: eager 30.0 ms a step, compiled 86.9 ms
# (docs/benchmarks.md, "The overhead lever"): the step is weight streaming, and inductor's code for it
# is slower than the engine's chunked GEMV
CPU_CAPTURE_REFUSAL = ("on a CPU a compiled decode step measured slower than eager (the step is weight "
                       "streaming; `membound bench --sweep overhead` measures it)")


class GraphDecoder:
    def __init__(self, device: str, cpu_compile: bool = False):
        self.device = device
        self.cuda = device.startswith("cuda")
        self._steps: dict = {}  # (id(model), id(cache)) -> compiled step; one at a time
        self.kind = "CUDA graph" if self.cuda else "compiled step" if cpu_compile else ""  # what a capture is here
        self.unavailable = "" if self.kind else CPU_CAPTURE_REFUSAL  # why every decode step runs eagerly
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
                import torch._dynamo as dynamo  # (not `import torch._dynamo`: that would make `torch` a local name)
                dynamo.config.cache_size_limit = max(dynamo.config.cache_size_limit, 64)
                # the graph writes the cache in place: its address must stay fixed
                dynamo.mark_static_address(cache.k)
                dynamo.mark_static_address(cache.v)
                mode = "reduce-overhead" if self.cuda else None  # a CPU has no graphs: inductor's C++ only
                self._steps = {key: torch.compile(model.forward_decode_static, mode=mode, fullgraph=True,
                                                  dynamic=False)}
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
