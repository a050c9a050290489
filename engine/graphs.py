"""The overhead lever: a decode step replayed from a captured CUDA graph (torch.compile with
mode="reduce-overhead") instead of hundreds of kernel launches. Only batch-1 decode on the
contiguous cache is captured; everything else (prefill, speculative verify steps, paged steps)
runs eager. A capture that fails, or that Inductor runs without a graph, switches graphs off for
this engine with the reason kept (`GraphDecoder.unavailable`), so the figures can say which path
ran; so does a failed check at load (engine/kernel_checks.py, kernels/registry.py).

One compile per model and cache buffer, whatever the context length: the step takes the position as
a tensor and attention reads the live keys of the whole buffer (engine/model/attention.py,
decode_attention), so a reply that grows past any length compiles nothing (engine/kernel_checks.py
compiles the engine's step at load). `compiles` counts the torch.compile graphs made in its calls.

On a CPU the same step can be compiled (torch.compile, Inductor's C++), but it measured no faster
than eager on the default model at batch 1, so only the overhead sweep asks for it
(`cpu_compile=True`); the engine's CPU decode runs eagerly and says why (CPU_CAPTURE_REFUSAL)."""
from __future__ import annotations

import time

import torch

from engine.context import default_context
from engine.dispatch import record
from engine.kv.cache import BuffersRef
from engine.model.attention import captured_attention_path, captured_reads_whole_buffer
from engine.model.transformer import Transformer
from kernels.registry import KernelSwitches

# torch's CUDA graph trees run a new graph's first call as a warm-up and record it on the second;
# replays start at the third. Those calls compile and capture: bench warm-ups must make them.
CAPTURE_CALLS = 2
# docs/benchmarks.md, "The overhead lever": the CPU step is weight streaming (matmuls ~85% of its
# operator time), and Inductor's code for it was slower than the engine's chunked GEMV
NOT_ON_GPU = "not on a GPU"
CPU_CAPTURE_REFUSAL = ("on a CPU a compiled decode step measured no faster than eager: the step is weight "
                       "streaming (`membound bench --sweep overhead` measures it)")


class GraphDecoder:
    def __init__(self, device: str, cpu_compile: bool = False, kernels: KernelSwitches | None = None):
        """`kernels`: the engine's switches (engine/context.py): "graphs" off there, no capture here."""
        self.device = device
        self.cuda = device.startswith("cuda")
        self._steps: dict[int, object] = {}  # id(model) -> its compiled step, all for the cache below
        self._cache_buffers: BuffersRef | None = None  # the cache and its K/V those steps write
        self._calls: dict[int, int] = {}  # id(model) -> calls of its compiled step so far
        self.kind = "CUDA graph" if self.cuda else "compiled step" if cpu_compile else ""  # what a capture is here
        # why graphs do not run ("" while they can)
        self.unavailable = (kernels.reason("graphs") if kernels is not None else "") if self.cuda else \
            "" if cpu_compile else NOT_ON_GPU
        self.replays = 0  # decode steps that ran through the compiled step (capture calls included)
        self.captures = 0  # steps compiled and captured (one per model and cache buffer)
        self.capture_s = 0.0  # seconds of the calls that compiled and captured them
        self.compiles = 0  # torch.compile graphs made inside decode() (a recompile would count here)

    @property
    def refusal(self) -> str:
        """Why a front end cannot turn capture on here, in full ("" when it can)."""
        return CPU_CAPTURE_REFUSAL if self.unavailable == NOT_ON_GPU else self.unavailable

    def active(self, enabled: bool) -> bool:
        """Whether a decode step asked to be captured (`enabled`) takes the compiled step."""
        return enabled and not self.unavailable

    def kv_read_tokens(self, model: Transformer, start: int, max_len: int, attention: str) -> int | None:
        """Cache positions the captured step's attention reads for a token at `start`, for the cost
        model: None for the live context alone (as eager), or the whole buffer's `max_len` (where any
        layer's attention is one the kernel does not take)."""
        flash_on = (model.context or default_context()).kernels.enabled("flash")  # its engine's switch
        whole = any(captured_reads_whole_buffer(self.cuda, attention, flash_on=flash_on, **layer.attend_options)
                    for layer in model.layers)
        return max_len if whole else None

    def decode(self, model: Transformer, cache, tokens: torch.Tensor, start: int, attention: str) -> torch.Tensor:
        """Logits for one token at `start`; writes its K/V into `cache` in place. Any failure falls
        back to eager for good (a compiler problem must not end the conversation)."""
        try:
            step = self._step_for(model, cache)
            key = id(model)
            calls = self._calls.get(key, 0)
            skips_before = _cudagraph_skips()
            graphs_before = _dynamo_graphs()
            t0 = time.perf_counter()
            pos = torch.tensor([start], dtype=torch.long, device=tokens.device)
            # the compiled step guards on its inputs' strides: a token sliced from a longer row
            # (stride 5, say) would compile it again
            tokens = tokens.clone(memory_format=torch.contiguous_format)
            logits = step(tokens, pos, cache, attention).clone()
            compiled = _dynamo_graphs() - graphs_before
            self.compiles += compiled
            if calls < CAPTURE_CALLS or compiled:
                if _cudagraph_skips() != skips_before:  # compiled, but Inductor left the graph out
                    raise RuntimeError("Inductor skipped the CUDA graph (TORCH_LOGS=perf_hints says why)")
                if self.cuda:
                    torch.cuda.synchronize()
                self.capture_s += time.perf_counter() - t0
                self.captures += calls == 0
            self._calls[key] = calls + 1
            cache.length = start + 1
            self.replays += 1
            if self.cuda:
                record("decode step", "cuda graph" if calls >= CAPTURE_CALLS else "compiled, capturing the cuda graph")
            else:
                record("decode step", "compiled step (Inductor C++)")
            flash_on = (model.context or default_context()).kernels.enabled("flash")
            for layer in model.layers:
                record("attention decode", captured_attention_path(self.cuda, attention, flash_on=flash_on,
                                                                   **layer.attend_options))
            return logits
        except Exception as error:
            self.unavailable = f"capture failed: {type(error).__name__}: {str(error).strip().splitlines()[0][:200]}" \
                if str(error).strip() else f"capture failed: {type(error).__name__}"
            self._steps, self._calls = {}, {}
            return model(tokens, start_pos=start, cache=cache, attention=attention)

    def _step_for(self, model: Transformer, cache):
        """The compiled step of `model` over `cache`. Steps are kept per model (switching weights
        back and forth must not compile again inside a reply or a timed run) and dropped when the
        cache or its K/V buffers change (a step writes the addresses it was captured with; an id of
        a freed cache can come back, a weak reference cannot). A kept step holds its model, so a
        model's id cannot be reused while it is kept."""
        if self._cache_buffers is None or not self._cache_buffers.matches(cache):
            self._steps, self._calls, self._cache_buffers = {}, {}, BuffersRef(cache)
        step = self._steps.get(id(model))
        if step is None:
            import torch._dynamo
            import torch._inductor.config as inductor_config
            config = torch._dynamo.config
            if hasattr(config, "cache_size_limit"):
                config.cache_size_limit = max(config.cache_size_limit, 64)
            if self.cuda and hasattr(inductor_config.triton, "cudagraph_or_error"):
                inductor_config.triton.cudagraph_or_error = True  # a skipped graph raises: no silent eager
            # the graph writes the cache in place: its address must stay fixed
            torch._dynamo.mark_static_address(cache.k)
            torch._dynamo.mark_static_address(cache.v)
            mode = "reduce-overhead" if self.cuda else None  # a CPU has no graphs: Inductor's C++ only
            step = torch.compile(model.forward_decode_static, mode=mode, fullgraph=True, dynamic=False)
            self._steps[id(model)] = step
        return step


def _dynamo_graphs() -> int:
    """Graphs torch.compile has made in this process (a compile, or a recompile, adds one)."""
    try:
        from torch._dynamo.utils import counters
        return int(counters["stats"]["unique_graphs"])
    except Exception:
        return 0


def _cudagraph_skips() -> int:
    try:
        from torch._dynamo.utils import counters
        return int(counters["inductor"]["cudagraph_skips"])
    except Exception:  # a torch without the counter: the cudagraph_or_error setting still guards
        return 0
