"""The batch-1 decode step on a CPU as one call into C++ (kernels/cpu_decode.cpp): one OpenMP region
per step instead of ~700 PyTorch operators. `decode_step(model, tokens, start_pos, cache)` returns
the logits, or None where it does not apply (the caller runs the PyTorch step, its reference).

It applies to one sequence, one new token, the contiguous cache, fused attention, fp32 or bf16
activations, and models whose every matmul module can describe itself (`cpu_matrix()`); the
reason it does not is kept (`unavailable_reason`). It reads what the PyTorch step reads: each
weight once at its stored precision, the cache's live positions; no dequantised copy is made.
MEMBOUND_CPU_STEP=0 in the environment switches it off (PyTorch's step then runs every step): an
engine reads it when its context is made (engine/options.py)."""
from __future__ import annotations

import contextlib
import ctypes
import functools
import threading
import weakref

import torch
from torch.utils.weak import WeakIdKeyDictionary

from engine.context import EngineContext, default_context
from engine.dispatch import record
from engine.kv.cache import ContiguousKVCache

ACT_FORMATS = {torch.float32: 0, torch.bfloat16: 1}  # kernels/cpu_decode.py F32, BF16
STEP_LABEL = "C++ CPU step (one OpenMP region)"  # what the bench's path line calls it
MAX_HEAD_DIM = 1024  # the C++ step's per-head buffers

_PLANS = WeakIdKeyDictionary()  # model -> _Plan for its current cache
_unavailable: str | None = None  # why the library cannot be used in this process ("" when it can)
_lock = threading.Lock()
_local = threading.local()  # .pytorch_only: this thread runs PyTorch's step (a reference, a profile)


@contextlib.contextmanager
def pytorch_only():
    """Within it, this thread's decode steps run in PyTorch (the C++ step's reference)."""
    before = getattr(_local, "pytorch_only", False)
    _local.pytorch_only = True
    try:
        yield
    finally:
        _local.pytorch_only = before


def unavailable_reason(context: EngineContext | None = None) -> str:
    """"" when the C++ step can run for the engine of `context` (None: the default); else why not
    (built on first call, seconds)."""
    global _unavailable
    context = context or default_context()
    if not context.options.cpu_step:
        return "switched off by MEMBOUND_CPU_STEP=0"
    with _lock:
        if _unavailable is None:
            try:
                from kernels.cpu_decode import load
                load()
                _unavailable = ""
            except Exception as error:  # a missing compiler, a failed build: the PyTorch step runs
                _unavailable = str(error).strip().splitlines()[0] if str(error).strip() else type(error).__name__
        return _unavailable or context.kernels.reason("cpu_step")


def fallback_line(context: EngineContext | None = None) -> str:
    """One line for a terminal when the C++ step cannot run for this engine ("" when it can)."""
    why = unavailable_reason(context)
    return f"membound: the C++ CPU decode step is off ({why}): PyTorch's step decodes" if why else ""


def refusal(model, tokens: torch.Tensor, cache, attention: str) -> str:
    """Why this step cannot run in C++ ("" when it can); cheap enough to ask every step."""
    if tokens.device.type != "cpu" or tokens.shape != (1, 1):
        return "not a batch-1 decode step on a CPU"
    if not isinstance(cache, ContiguousKVCache) or cache.k.shape[1] != 1:
        return "not the contiguous cache of one sequence"
    if attention != "flash":
        return "naive attention runs in PyTorch (its score matrix in memory is the point)"
    if model.dtype not in ACT_FORMATS or cache.k.dtype != model.dtype:
        return f"activations in {model.dtype} (the C++ step takes fp32 or bf16)"
    cfg = model.cfg
    if cfg.head_dim % 2 or cfg.head_dim > MAX_HEAD_DIM or cfg.n_heads % cfg.n_kv_heads:
        return "an attention shape the C++ step does not take"
    return model_refusal(cfg)


@functools.lru_cache(maxsize=16)
def model_refusal(cfg) -> str:
    """Why this model's layers cannot run in C++ ("" when they can): Gemma's and Phi's additions."""
    beyond = cfg.beyond_llama()
    return f"{cfg.family}'s {beyond}: the C++ step runs Llama-family layers, PyTorch's step decodes" if beyond else ""


def decode_step(model, tokens: torch.Tensor, start_pos: int, cache, attention: str = "flash") -> torch.Tensor | None:
    """Logits (1, 1, vocab) fp32 of the token at start_pos, its K/V written into `cache`; None
    when the C++ step does not apply here (nothing has been written then)."""
    if torch.compiler.is_compiling() or getattr(_local, "pytorch_only", False) \
            or refusal(model, tokens, cache, attention) or unavailable_reason(model.context):
        return None
    plan = _PLANS.get(model)
    if plan is None or plan.cache() is not cache:
        plan = _Plan.build(model, cache)
        if plan is None:
            return None
        _PLANS[model] = plan
    logits = plan.run(int(tokens[0, 0]), start_pos)
    cache.length = start_pos + 1
    record("decode step", STEP_LABEL)
    record("attention decode", "C++ CPU step", model.cfg.n_layers)
    return logits.view(1, 1, -1)


def matrix(fmt: int, weight: torch.Tensor, scale: torch.Tensor | None = None, mins: torch.Tensor | None = None,
           group: int = 0, n: int | None = None, k: int | None = None) -> tuple:
    """A matmul module's `cpu_matrix()`: (format, N, K, group, tensors to keep alive, codes, scale, min);
    N and K default to the weight's shape."""
    n = weight.shape[0] if n is None else n
    k = weight.shape[1] if k is None else k
    tensors = tuple(t for t in (weight, scale, mins) if t is not None)
    if not all(t.is_contiguous() and t.device.type == "cpu" for t in tensors):
        raise ValueError("a matmul's tensors are not contiguous CPU tensors")
    return fmt, n, k, group, tensors, weight.data_ptr(), _ptr(scale), _ptr(mins)


def _ptr(t: torch.Tensor | None) -> int | None:
    return None if t is None else t.data_ptr()


class _Plan:
    """The C structs for one model over one cache, and the tensors they point into (kept alive)."""

    @classmethod
    def build(cls, model, cache) -> _Plan | None:
        from kernels.cpu_decode import Layer, Mat, Model, load

        plan = cls()
        plan.keep = []

        def mat(module) -> Mat | None:
            describe = getattr(module, "cpu_matrix", None)
            if describe is None:
                return None
            found = describe()
            if found is None:
                return None
            fmt, n, k, group, tensors, w, scale, mins = found
            plan.keep.extend(tensors)
            return Mat(fmt, n, k, group, w, scale, mins)

        def vec(t: torch.Tensor | None) -> int | None:
            if t is None:
                return None
            t = t.detach().contiguous()
            plan.keep.append(t)
            return t.data_ptr()

        cfg = model.cfg
        layers = (Layer * cfg.n_layers)()
        for i, block in enumerate(model.layers):
            mats = [mat(m) for m in (block.wqkv, block.wo, block.w_gate_up, block.w_down)]
            if any(m is None for m in mats):
                return None
            layers[i] = Layer(vec(block.attn_norm), vec(block.ffn_norm), vec(block.bqkv), vec(block.qk_norm), *mats,
                              cache.k[i, 0].data_ptr(), cache.v[i, 0].data_ptr())
        head = mat(model.head)
        if head is None:
            return None
        plan.layers = layers
        plan.model = Model(cfg.dim, cfg.n_layers, cfg.n_heads, cfg.n_kv_heads, cfg.head_dim, cfg.ffn_dim,
                           cfg.vocab_size, cache.max_len, ACT_FORMATS[model.dtype], cfg.norm_eps,
                           vec(model.embed), vec(model.norm), head, layers)
        plan.lib = load()
        plan.cos, plan.sin = model.rope_cos, model.rope_sin  # (max_seq_len, head_dim) fp32
        plan.row_bytes = cfg.head_dim * 4
        plan.vocab = cfg.vocab_size
        plan.cache = weakref.ref(cache)
        plan.keep += [cache.k, cache.v]
        plan.threads = 0
        plan.scratch = None
        return plan

    def run(self, token: int, pos: int, profile: torch.Tensor | None = None) -> torch.Tensor:
        """Logits (vocab,) fp32; `profile` (float64, one per kernels.cpu_decode.PHASES): thread 0's
        seconds per phase are added to it."""
        if pos >= self.model.max_len or pos >= self.cos.shape[0]:
            raise ValueError(f"position {pos} is past the cache's {self.model.max_len}")
        threads = torch.get_num_threads()
        if threads != self.threads:
            floats = self.lib.membound_scratch_floats(ctypes.byref(self.model), threads)
            self.scratch, self.threads = torch.empty(floats, dtype=torch.float32), threads
        logits = torch.empty(self.vocab, dtype=torch.float32)
        self.lib.membound_decode_step(ctypes.byref(self.model), token, pos,
                                      self.cos.data_ptr() + pos * self.row_bytes,
                                      self.sin.data_ptr() + pos * self.row_bytes,
                                      logits.data_ptr(), self.scratch.data_ptr(), threads,
                                      None if profile is None else profile.data_ptr())
        return logits
