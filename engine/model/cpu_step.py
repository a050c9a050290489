"""Decode-shaped steps on a CPU as one call into C++ (kernels/cpu_decode.cpp): one OpenMP region per
step instead of ~700 PyTorch operators. `decode_step(model, tokens, start_pos, cache)` returns the
logits, or None where it does not apply (the caller runs the PyTorch step, its reference).

It applies to one sequence, one new token, the contiguous cache, fp32 or bf16 activations (attention
fused, or naive: its score matrix written to memory and read back, as the setting asks), and models
whose every matmul module can describe itself (`cpu_matrix()`); the reason it does not is kept
(`unavailable_reason`). It reads what the PyTorch step reads: each weight once at its stored precision,
the cache's live positions; no dequantised copy is made.

Per format (activation dtype and weight format, on this model's shapes) the C++ step is timed once
against PyTorch's step, on a stand-in of the model's first layers (`choice`), and runs only where it
is faster; `path_line` says which runs, why, and at which vector level. MEMBOUND_CPU_STEP=0 switches
it off (PyTorch's step then runs every step); MEMBOUND_CPU_ISA builds it for another vector level
(kernels/cpu_decode.py). An engine reads both when its context is made (engine/options.py), and keeps
what this module knows in it (`EngineContext.cpu_step`, a `CpuStepState`): the library loaded for its
options or why not, each model's plan over its cache, the timings."""
from __future__ import annotations

import contextlib
import copy
import ctypes
import functools
import threading
import time
from dataclasses import dataclass, replace

import torch

from engine.context import CpuStepState, EngineContext, default_context
from engine.dispatch import record
from engine.kv.cache import BuffersRef, ContiguousKVCache

ACT_FORMATS = {torch.float32: 0, torch.bfloat16: 1}  # kernels/cpu_decode.py F32, BF16
STEP_LABEL = "C++ CPU step (one OpenMP region)"  # what the bench's path line calls it
MAX_HEAD_DIM = 1024  # the C++ step's per-head buffers
# The timing at load: a stand-in of the model's first layers, at least this many bytes of weights
# (out of the caches, as the whole model's are) or the whole model, and a 256-row head; each step
# warmed once, then the best of at least TIMED_STEPS of each, interleaved, and more (up to
# MAX_TIMED_STEPS) until TIMING_S have passed: on a busy machine a step whose thread lost the core for
# a time slice falls out of the best, and a short step gets many tries across several slices.
STAND_IN_BYTES = 32 << 20
STAND_IN_VOCAB = 256
TIMED_STEPS = 3
MAX_TIMED_STEPS = 200
TIMING_S = 0.1
# A C++ step that loses is timed again, up to RETIMED_ROUNDS more times after a pause: its OpenMP region
# meets a barrier per matmul, so a machine busy for a moment (the app drawing beside it, another job)
# costs it far more than PyTorch's step (seen on 2 shared cores: a tiny model's C++ step 75 ms against
# PyTorch's 24 ms while busy, 0.04 ms against 0.5 ms a few seconds later).
RETIMED_ROUNDS = 3
RETIME_PAUSE_S = 0.05
PROMPT = 4  # positions prefilled before a timed step
# A prompt longer than the library's rows runs in C++ as chunks of that many rows (each call reads every
# weight once) where that is faster than PyTorch's step over the whole prompt (its GEMMs; INT4 and INT8
# dequantise each matrix first): timed at load too, on the stand-in, PROMPT_CHUNKS chunks' rows, the
# best of PROMPT_TIMED of each after one to warm up; and only while the context stays within
# PROMPT_CONTEXT positions, or PROMPT_CONTEXT_WIDE where the chunks won by PROMPT_WIDE_SPEEDUP or more.
# The chunks lose ground as the prompt grows: each chunk's rows read the context before them again and
# the C++ step's attention costs more a key than PyTorch's; the stand-in's few layers (their K/V in the
# caches) cannot show it. Measured on the Zen 4 (docs/benchmarks.md, session 31), the default model,
# chunks against PyTorch's step: fp32 0.89-1.02x at 128 tokens, 0.86x at 1,024; INT8 1.00-1.10x at 128,
# 0.82x at 1,024; INT4 at AVX-512 2.6x at 128, 1.4x at 1,024, 1.06x at 2,048, 0.86x at 4,000; bf16 at
# AVX2 4.1x at 128, 2.7x at 2,048. The stand-in's ratios: 1.0-1.3x where the whole model's lose by 1,024,
# 2.3-4.6x where they still win at 2,048 (INT4 at both levels, bf16 and INT8 at AVX2).
PROMPT_CHUNKS = 2
PROMPT_TIMED = 3
PROMPT_CLEAR = 3.0  # a path this much faster after one timed round: no more rounds
PROMPT_CONTEXT = 512
PROMPT_WIDE_SPEEDUP = 2.0
PROMPT_CONTEXT_WIDE = 2048

_local = threading.local()  # .pytorch_only: this thread runs PyTorch's step (a reference, a profile)


@dataclass(frozen=True)
class Choice:
    """One format's timing: the C++ step against PyTorch's on the same stand-in, seconds a step."""
    label: str  # "fp32", "bf16 · int8", …
    cpp_s: float
    pytorch_s: float
    isa: str
    prompt_cpp_s: float = float("inf")  # a prompt of PROMPT_CHUNKS chunks' rows: the C++ step's chunks ...
    prompt_pytorch_s: float = 0.0  # ... against PyTorch's step over the whole prompt

    @property
    def use_cpp(self) -> bool:
        return self.cpp_s < self.pytorch_s

    @property
    def speedup(self) -> float:
        return self.pytorch_s / self.cpp_s if self.cpp_s > 0 else float("inf")

    @property
    def chunks_prompts(self) -> bool:
        """Whether a prompt longer than the library's rows runs in C++, in chunks (within `prompt_context`)."""
        return self.use_cpp and self.prompt_cpp_s < self.prompt_pytorch_s

    @property
    def prompt_context(self) -> int:
        """The longest context a prompt in chunks may reach."""
        return PROMPT_CONTEXT_WIDE if self.prompt_speedup >= PROMPT_WIDE_SPEEDUP else PROMPT_CONTEXT

    @property
    def prompt_speedup(self) -> float:
        return self.prompt_pytorch_s / self.prompt_cpp_s if self.prompt_cpp_s > 0 else float("inf")


@contextlib.contextmanager
def pytorch_only():
    """Within it, this thread's decode steps run in PyTorch (the C++ step's reference)."""
    before = getattr(_local, "pytorch_only", False)
    _local.pytorch_only = True
    try:
        yield
    finally:
        _local.pytorch_only = before


def _context(model) -> EngineContext:
    return getattr(model, "context", None) or default_context()


def _state(context: EngineContext | None) -> CpuStepState:
    return (context or default_context()).cpu_step


def unavailable_reason(context: EngineContext | None = None) -> str:
    """"" when the C++ step can run for the engine of `context` (None: the default); else why not
    (the library built on first call for the context's options, seconds)."""
    context = context or default_context()
    if not context.options.cpu_step:
        return "switched off by MEMBOUND_CPU_STEP=0"
    state = context.cpu_step
    if state.unavailable is None:
        with state.lock:
            if state.unavailable is None:
                try:
                    from kernels.cpu_decode import load
                    state.library = load(options=context.options)
                    state.unavailable = ""
                except Exception as error:  # a missing compiler, a failed build: the PyTorch step runs
                    text = str(error).strip()
                    state.unavailable = text.splitlines()[0] if text else type(error).__name__
    return state.unavailable or context.kernels.reason("cpu_step")


def library(context: EngineContext | None = None):
    """The library loaded for the context's options (after unavailable_reason(context) == "")."""
    state = _state(context)
    if state.library is None:
        unavailable_reason(context)
        if state.library is None:
            raise RuntimeError(f"the C++ CPU step is not loaded: {state.unavailable}")
    return state.library


def sampler(model):
    """The library a CPU engine samples its top-p rows with (engine/model/sampling.py `native`): the C++
    step's, built or loaded for the model's engine, or None where MEMBOUND_CPU_STEP=0 or it cannot be
    built (PyTorch's softmax and numpy's draw). The same for every step of that engine, whichever path
    runs it, so its row path and module path draw alike."""
    context = _context(model)
    if context.cpu_step.unavailable is None:
        unavailable_reason(context)  # (loads it unless the options switch the step off)
    return context.cpu_step.library


def fallback_line(context: EngineContext | None = None) -> str:
    """One line for a terminal when the C++ step cannot run for this engine, or runs on one thread
    ("" when it runs as built)."""
    why = unavailable_reason(context)
    if why:
        return f"membound: the C++ CPU decode step is off ({why}): PyTorch's step decodes"
    note = library(context).threads_note
    return f"membound: {note}" if note else ""


def refusal(model, tokens: torch.Tensor, cache, attention: str) -> str:
    """Why this step cannot run in C++ ("" when it can); cheap enough to ask every step."""
    if tokens.device.type != "cpu" or tokens.shape != (1, 1):
        return "not a batch-1 decode step on a CPU"
    if not isinstance(cache, ContiguousKVCache) or cache.k.shape[1] != 1:
        return "not the contiguous cache of one sequence"
    return step_refusal(model, cache, attention)


def step_refusal(model, cache, attention: str) -> str:
    """Why this model's steps over this cache cannot run in C++, whatever their rows ("" when they can)."""
    if attention not in ("flash", "naive"):
        return f"{attention} attention is not the C++ step's"
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
    when the C++ step does not apply here, or PyTorch's step is faster for this format (nothing has
    been written then)."""
    if tokens.device.type != "cpu" or tokens.shape != (1, 1):
        return None
    plan = token_plan(model, cache, attention)
    if plan is None:
        return None
    token = tokens.tolist()[0][0]  # (tolist: no indexing ops)
    logits = plan.run([(token, start_pos, 0, None)], [0], naive=attention == "naive")
    _decoded(model, plan, start_pos, cache, attention)
    return logits.view(1, 1, -1)


def token_plan(model, cache, attention: str = "flash") -> _Plan | None:
    """The plan that runs `decode_token` for this model over this cache (the contiguous cache of one
    sequence), or None where the C++ step does not take its one-token steps (decode_step's checks)."""
    if not isinstance(cache, ContiguousKVCache) or cache.k.shape[1] != 1 or torch.compiler.is_compiling() \
            or getattr(_local, "pytorch_only", False) or step_refusal(model, cache, attention) \
            or unavailable_reason(_context(model)):
        return None
    plan = plan_for(model, cache)
    return plan if plan is not None and choice(model).use_cpp else None


def decode_token(model, plan: _Plan, token: int, start_pos: int, cache, attention: str = "flash"):
    """decode_step for a token id on its `token_plan`, with no PyTorch operator on the way: the logits
    as a (vocab,) fp32 numpy row that the plan's next such step overwrites (`_Plan.run_token`). After a
    step has streamed the weights through the caches each PyTorch operator costs 20-100 us here (its
    code and data come back from memory), ~10x its warm time: the plain decode loop calls this
    (engine/steps/plain.py; docs/benchmarks.md, session 29)."""
    row = plan.run_token(token, start_pos, naive=attention == "naive")
    _decoded(model, plan, start_pos, cache, attention)
    return row


def decode_rows(model, plan: _Plan, tokens: list[int], start_pos: int, cache, attention: str = "flash",
                logits_rows: int = 1):
    """sequence_step for token ids (2 or more, at start_pos..) on their `token_plan`: a speculative verify
    step, its logits for the last `logits_rows` rows as numpy (logits_rows, vocab) fp32; one PyTorch
    operator (the logits' buffer). None where the rows do not fit the library or the cache (nothing
    written)."""
    if len(tokens) > plan.lib.max_rows or start_pos + len(tokens) > cache.max_len:
        return None
    return _rows_step(model, plan, tokens, start_pos, cache, attention, logits_rows).numpy()


def _rows_step(model, plan: _Plan, ids: list[int], start_pos: int, cache, attention: str, n: int,
               table: torch.Tensor | None = None) -> torch.Tensor:
    """One sequence's rows `ids` at start_pos.. through the plan (a paged cache's blocks: `table`), the
    last n rows' logits (n, vocab); more rows than the library takes run as chunks of that many, one
    call each, in order (each chunk's rows attend over the K/V the chunks before it wrote). What the
    step leaves behind: how it multiplied and in which calls, a contiguous cache's length, its path."""
    T = len(ids)
    logits, calls = _in_chunks(plan, ids, start_pos, n, attention, table)
    _ran(model, plan.products, calls)
    if table is None:
        cache.length = start_pos + T
    record("decode step" if T == 1 else "multi-row step",
           STEP_LABEL if T == 1 else ROWS_LABEL if len(calls) == 1 else CHUNKS_LABEL)
    return logits


def _in_chunks(plan: _Plan, ids: list[int], start_pos: int, n: int, attention: str,
               table: torch.Tensor | None = None) -> tuple[torch.Tensor, list[int]]:
    """The rows `ids` at start_pos.. in calls of at most the library's rows, in order: the last n rows'
    logits (n, vocab) and the rows of each call."""
    T, size = len(ids), plan.lib.max_rows
    pointer = None if table is None else table.data_ptr()
    parts, calls = [], []
    for lo in range(0, T, size):
        hi = min(T, lo + size)
        rows = [(ids[i], start_pos + i, 0, pointer) for i in range(lo, hi)]
        parts.append(plan.run(rows, [i - lo for i in range(max(lo, T - n), hi)], naive=attention == "naive"))
        calls.append(hi - lo)
    return (parts[0] if len(parts) == 1 else torch.cat(parts)), calls


def _decoded(model, plan: _Plan, start_pos: int, cache, attention: str) -> None:
    """What a one-token C++ step leaves behind: how it multiplied, the cache's length, its path."""
    _ran(model, plan.products)
    cache.length = start_pos + 1
    record("decode step", STEP_LABEL)
    record("attention decode", attention_label(attention), model.cfg.n_layers)


ROWS_LABEL = "C++ CPU step, token rows"  # a step of several rows (a batch, a verify step, a prompt chunk)
CHUNKS_LABEL = "C++ CPU step, a prompt in chunks of token rows"  # more rows than one call takes
NAIVE_LABEL = "C++ CPU step, naive (scores in memory)"  # attention under the naive setting


def attention_label(attention: str) -> str:
    """The path record of the C++ step's attention under a setting."""
    return NAIVE_LABEL if attention == "naive" else "C++ CPU step"


def ran_in_cpp(model) -> bool:
    """Whether this thread's last step of a model of `model`'s engine ran in C++ (the cost model
    charges it as such: engine/metrics.py CPP_STEP)."""
    return bool(getattr(_context(model).cpu_step.thread, "ran", False))


def products(model) -> tuple[str, str] | None:
    """How this thread's last step of `model`'s engine multiplied its layers' and its head's matrices
    where it ran in C++ (kernels/cpu_decode.py product_kind: "fp32", "bf16", "int16", "int8"), for
    its compute roof (engine/metrics.py measured); None after a PyTorch step."""
    return getattr(_context(model).cpu_step.thread, "ran", None) or None


def chunks(model) -> tuple[int, ...]:
    """The rows of each C++ call this thread's last step of `model`'s engine made, where it made more
    than one (a prompt longer than the library's rows, in chunks: the cost model counts each call's
    weights and context); () after a step of one call or PyTorch's."""
    return getattr(_context(model).cpu_step.thread, "calls", ())


def _ran(model, done: tuple[str, str] | bool, calls: list[int] | None = None) -> None:
    """done: the plan's products (it ran in C++), or False; calls: the rows of each call, where several."""
    thread = _context(model).cpu_step.thread
    thread.ran = done
    thread.calls = tuple(calls) if calls is not None and len(calls) > 1 else ()


def mark_pytorch_step(model) -> None:
    if not torch.compiler.is_compiling():  # (a compiled step is PyTorch's: nothing to trace here)
        _ran(model, False)


def _routable(model, cache, attention: str) -> bool:
    """Whether this model's steps over this cache may run in C++ now (cheap: asked every step)."""
    return not (torch.compiler.is_compiling() or getattr(_local, "pytorch_only", False)
                or step_refusal(model, cache, attention) or unavailable_reason(_context(model)))


def sequence_step(model, tokens: torch.Tensor, start_pos: int, cache, attention: str = "flash",
                  last_only: bool = True, logits_rows: int | None = None) -> torch.Tensor | None:
    """One sequence's T new tokens (1 <= T <= the library's rows, or more in chunks of that many where
    the format's timing says so, `Choice.chunks_prompts`, within its `prompt_context` positions) at positions
    start_pos.., over the contiguous cache of one sequence or a paged cache of one sequence, causal among themselves:
    a decode step, a speculative verify step (T = k + 1) or a prompt. Logits (1, rows, vocab)
    for the last `logits_rows` rows (else the last row, or every row when not `last_only`), as
    Transformer.forward returns them; None where the C++ step does not apply (nothing written)."""
    B, T = tokens.shape
    if tokens.device.type != "cpu" or B != 1 or T < 1:
        return None
    _ran(model, False)
    if T == 1 and isinstance(cache, ContiguousKVCache):
        return decode_step(model, tokens, start_pos, cache, attention)
    from engine.kv.cache import PagedKVCache
    paged = isinstance(cache, PagedKVCache)
    if not (paged and len(cache.seq_ids) == 1 or isinstance(cache, ContiguousKVCache) and cache.k.shape[1] == 1):
        return None
    if not _routable(model, cache, attention) or start_pos + T > cache.max_len:
        return None
    plan = plan_for(model, cache)
    timed = choice(model) if plan is not None else None
    if timed is None or not (timed.chunks_prompts and start_pos + T <= timed.prompt_context
                             if T > plan.lib.max_rows else timed.use_cpp):
        return None
    n = T if logits_rows is None and not last_only else (logits_rows or 1)
    table = None
    if paged:  # the blocks for the new positions (all or nothing: KVCacheFull leaves the cache as it was)
        layout = cache.begin_step(start_pos, T)
        table = torch.tensor(layout.block_tables[0], dtype=torch.int32)
        if len(layout.block_tables[0]) * cache.block_size > plan.lib.membound_max_blocks() * cache.block_size:
            return None
    return _rows_step(model, plan, tokens[0].tolist(), start_pos, cache, attention, n, table).view(1, n, -1)


def plan_step(model, cache, seqs, attention: str = "flash") -> tuple[list[int], torch.Tensor] | None:
    """A scheduler plan (engine/serving/batch_forward.py forward_plan's contract) as one C++ step: every
    sequence's tokens are token rows at their own positions over their own blocks of the paged pool;
    (request ids that sample, their logits (n, vocab)); None where it does not apply."""
    _ran(model, False)
    total = sum(len(s.token_ids) for s in seqs)
    if not seqs or model.device.type != "cpu" or not _routable(model, cache, attention):
        return None
    plan = plan_for(model, cache)
    if plan is None or total > plan.lib.max_rows or not choice(model).use_cpp:
        return None
    bs = cache.block_size
    rows, wanted, ids, tables = [], [], [], []
    for s in seqs:
        if -(-(s.start_pos + len(s.token_ids)) // bs) > len(s.block_table):
            return None  # (the scheduler allocates before it plans: never seen)
        table = torch.tensor(s.block_table, dtype=torch.int32)
        tables.append(table)
        rows += [(t, s.start_pos + i, 0, table.data_ptr()) for i, t in enumerate(s.token_ids)]
        if s.samples:
            wanted.append(len(rows) - 1)
            ids.append(s.request_id)
    if max(p for _, p, _, _ in rows) >= model.cfg.max_seq_len:
        raise ValueError(f"context of {max(p for _, p, _, _ in rows) + 1} tokens exceeds the model's "
                         f"{model.cfg.max_seq_len}")
    logits = plan.run(rows, wanted, naive=attention == "naive")
    _ran(model, plan.products)
    record("batched step", ROWS_LABEL)
    if any(len(s.token_ids) == 1 for s in seqs):  # its decode rows, and their attention, ran here too
        record("decode step", ROWS_LABEL)
        record("attention decode", attention_label(attention), model.cfg.n_layers)
    return ids, logits


def checked_step(model, tokens: torch.Tensor, start_pos: int, cache) -> torch.Tensor | None:
    """decode_step run in C++ whatever the timing says (the load check holds it to PyTorch's step)."""
    if refusal(model, tokens, cache, "flash") or unavailable_reason(_context(model)):
        return None
    plan = plan_for(model, cache)
    if plan is None:
        return None
    logits = plan.run([(tokens.tolist()[0][0], start_pos, 0, None)], [0])  # (tolist: no indexing ops)
    cache.length = start_pos + 1
    return logits.view(1, 1, -1)


def plan_for(model, cache) -> _Plan | None:
    """The C structs of `model` over `cache` (made on first use, kept in its engine's context); None
    where a module cannot describe itself."""
    plans = _context(model).cpu_step.plans
    plan = plans.get(model)
    if plan is None or not plan.buffers.matches(cache):
        plan = _Plan.build(model, cache)
        if plan is None:
            return None
        plans[model] = plan
    return plan


# ---- which step is faster here, per format ------------------------------------------------------------
def format_label(model) -> str:
    """The model's format as the timing keys it: "fp32", "bf16 · int8", …"""
    dtype = {torch.float32: "fp32", torch.bfloat16: "bf16"}.get(model.dtype, str(model.dtype))
    described = getattr(model.layers[0].wqkv, "cpu_matrix", lambda: None)()
    weights = {2: "int8", 3: "int4"}.get(described[0] if described else None, "")
    return f"{dtype} · {weights}" if weights else dtype


def _key(model) -> tuple:
    cfg = model.cfg
    return (format_label(model), cfg.dim, cfg.ffn_dim, cfg.n_heads, cfg.n_kv_heads, cfg.head_dim,
            library(_context(model)).isa)


def choice(model) -> Choice:
    """The timing of this model's format (timed on first use: ~6 steps of a stand-in, once per engine
    context and format)."""
    by_model = _context(model).cpu_step.model_timing
    found = by_model.get(model)
    if found is None:
        found = by_model[model] = _choice_of(model)
    return found


def prepare(model) -> None:
    """The library built and this model's format timed now, where its steps can run in C++, so that
    neither happens inside a reply's first step (its time to first token; the app's load check and the
    bench's warm-up do the same)."""
    if model.device.type == "cpu" and model.dtype in ACT_FORMATS and not model_refusal(model.cfg) \
            and not unavailable_reason(_context(model)):
        choice(model)


def _choice_of(model) -> Choice:
    key = _key(model)
    timings = _context(model).cpu_step.timings
    found = timings.get(key)
    if found is None:
        cpp_s, pytorch_s = time_steps(model)
        prompt_s = time_prompts(model) if cpp_s < pytorch_s else (float("inf"), 0.0)
        found = timings.setdefault(key, Choice(key[0], cpp_s, pytorch_s, key[-1], *prompt_s))
    return found


def known_choices(model) -> list[Choice]:
    """The timings made so far for this model's shapes and the built level (in the order made)."""
    cfg, isa = model.cfg, library(_context(model)).isa
    return [c for k, c in _context(model).cpu_step.timings.items() if k[1:] == (cfg.dim, cfg.ffn_dim, cfg.n_heads, cfg.n_kv_heads,
                                                        cfg.head_dim, isa)]


def stand_in(model, min_bytes: int | None = None):
    """The model's first layers (at least `min_bytes` of their weights, default STAND_IN_BYTES, or all)
    and the first STAND_IN_VOCAB rows of its head: the same tensors, a shorter model to time."""
    min_bytes = STAND_IN_BYTES if min_bytes is None else min_bytes
    layers, total = 0, 0
    for block in model.layers:
        layers += 1
        total += sum(getattr(m, "weight_bytes", 0) for m in (block.wqkv, block.wo, block.w_gate_up, block.w_down))
        if total >= min_bytes:
            break
    vocab = min(STAND_IN_VOCAB, model.cfg.vocab_size)
    short = copy.copy(model)
    short._modules = dict(model._modules)
    short._parameters = dict(model._parameters)
    short._buffers = dict(model._buffers)
    short.cfg = replace(model.cfg, n_layers=layers, vocab_size=vocab)
    short.layers = torch.nn.ModuleList(list(model.layers)[:layers])
    head = model.head  # the same format over its first rows (Linear, Int8Linear `first_rows`)
    short.head = head.first_rows(vocab) if hasattr(head, "first_rows") else head
    if short.head is not head and "context" in short.head.__dict__:
        short.head.context = model.context  # its engine's (packed weights, switches)
    return short


@torch.inference_mode()
def time_steps(model) -> tuple[float, float]:
    """(C++ step, PyTorch step) seconds on the model's stand-in after PROMPT positions: the best of
    TIMED_STEPS or more each, interleaved, after one of each to warm up."""
    short = stand_in(model)
    cfg = short.cfg
    cache = ContiguousKVCache(cfg, 1, PROMPT + 1, model.dtype, "cpu")
    with pytorch_only():
        short(torch.arange(1, PROMPT + 1)[None] % cfg.vocab_size, 0, cache)
    plan = _Plan.build(short, cache)
    if plan is None:
        return float("inf"), 0.0
    token = torch.tensor([[PROMPT % cfg.vocab_size]])

    def cpp() -> None:
        plan.run([(PROMPT % cfg.vocab_size, PROMPT, 0, None)], [0])

    def pytorch() -> None:
        cache.truncate(PROMPT)
        with pytorch_only():
            short(token, PROMPT, cache)

    best = [float("inf"), float("inf")]
    for rounds in range(1 + RETIMED_ROUNDS):
        if rounds:  # the C++ step lost: a pause (other work runs, OpenMP's spinning threads sleep), again
            time.sleep(RETIME_PAUSE_S)
        start = time.perf_counter()
        for done in range(MAX_TIMED_STEPS + 1):
            if done > TIMED_STEPS and time.perf_counter() - start >= TIMING_S:
                break
            for i, run in enumerate((cpp, pytorch)):
                t0 = time.perf_counter()
                run()
                best[i] = min(best[i], time.perf_counter() - t0)
        if best[0] < best[1]:
            break
    return best[0], best[1]


@torch.inference_mode()
def time_prompts(model) -> tuple[float, float]:
    """(C++ step in chunks, PyTorch step) seconds for a prompt of PROMPT_CHUNKS times the library's rows
    on the model's stand-in: the best of PROMPT_TIMED each, interleaved, after one of each to warm up;
    (inf, 0) where the stand-in cannot take them."""
    short = stand_in(model)
    cfg = short.cfg
    rows = PROMPT_CHUNKS * library(_context(model)).max_rows
    if rows > min(cfg.max_seq_len, short.rope_cos.shape[0]):
        return float("inf"), 0.0
    cache = ContiguousKVCache(cfg, 1, rows, model.dtype, "cpu")
    plan = _Plan.build(short, cache)
    if plan is None:
        return float("inf"), 0.0
    ids = [(7 * i + 1) % cfg.vocab_size for i in range(rows)]
    tokens = torch.tensor([ids])

    def cpp() -> None:
        _in_chunks(plan, ids, 0, 1, "flash")

    def pytorch() -> None:
        with pytorch_only():
            short(tokens, 0, cache)

    best = [float("inf"), float("inf")]
    for done in range(PROMPT_TIMED + 1):
        for i, run in enumerate((cpp, pytorch)):
            t0 = time.perf_counter()
            run()
            if done:
                best[i] = min(best[i], time.perf_counter() - t0)
        if done and not 1 / PROMPT_CLEAR < best[1] / best[0] < PROMPT_CLEAR:
            break  # (decided whatever the next rounds read: at AVX2, bf16's and INT8's PyTorch steps take ~4x)
    return best[0], best[1]


def path_line(model) -> str:
    """Which step decodes each format timed so far, at which vector level, and why (one line; "" when
    the C++ step cannot run here)."""
    if model is None or unavailable_reason(_context(model)):
        return ""
    lib = library(_context(model))
    made = known_choices(model)
    cpp = [c for c in made if c.use_cpp]
    slower = [c for c in made if not c.use_cpp]
    threads = lib.threads_note or f"{torch.get_num_threads()} threads"
    line = f"decode: C++ step, {lib.isa}, {threads}"
    if not made:
        return line + " (not yet timed against PyTorch's step)"
    if cpp:
        line += " — timed at load against PyTorch's step: " + ", ".join(f"{c.label} {c.speedup:.1f}x" for c in cpp)
        chunked = [c for c in cpp if c.chunks_prompts]
        if chunked:
            line += f"; prompts over {lib.max_rows} tokens in chunks of {lib.max_rows}: " + \
                ", ".join(f"{c.label} {c.prompt_speedup:.1f}x (to {c.prompt_context:,})" for c in chunked)
    if slower:
        line += "; PyTorch's step for " + ", ".join(f"{c.label} (the C++ step {1 / c.speedup:.1f}x its time)"
                                                    for c in slower)
    return line


def slower_formats(model) -> list[Choice]:
    return [c for c in known_choices(model) if not c.use_cpp]


# ---- the C structs -----------------------------------------------------------------------------------
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
        from kernels.cpu_decode import Layer, Mat, Model, Row, product_kind

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
            t = t if t.is_contiguous() else t.contiguous()  # (no new tensor where none is needed)
            plan.keep.append(t)
            return t.data_ptr()

        cfg = model.cfg
        if isinstance(cache, ContiguousKVCache):  # (L, B, n_kv, S, hd): a row's sequence b at b * n_kv * S * hd
            head_stride, block_size, max_len = cache.max_len * cfg.head_dim, 0, cache.max_len
        else:  # a paged pool (L, n_kv, slots, hd), addressed through each row's block table
            head_stride, block_size, max_len = cache.k.shape[2] * cfg.head_dim, cache.block_size, cache.k.shape[2]
        layers = (Layer * cfg.n_layers)()
        for i, block in enumerate(model.layers):
            mats = [mat(m) for m in (block.wqkv, block.wo, block.w_gate_up, block.w_down)]
            if any(m is None for m in mats):
                return None
            layers[i] = Layer(vec(block.attn_norm), vec(block.ffn_norm), vec(block.bqkv), vec(block.qk_norm), *mats,
                              cache.k[i].data_ptr(), cache.v[i].data_ptr())
        head = mat(model.head)
        if head is None:
            return None
        plan.lib = library(_context(model))
        plan.products = (product_kind(plan.lib, layers[0].wqkv.fmt), product_kind(plan.lib, head.fmt))
        plan.layers = layers
        # max_len: the longest context a row may attend over (the per-thread score buffer)
        plan.model = Model(cfg.dim, cfg.n_layers, cfg.n_heads, cfg.n_kv_heads, cfg.head_dim, cfg.ffn_dim,
                           cfg.vocab_size, min(max_len, model.rope_cos.shape[0]), ACT_FORMATS[model.dtype],
                           cfg.norm_eps, vec(model.embed), vec(model.norm), head, layers, head_stride, block_size)
        plan.cos, plan.sin = model.rope_cos, model.rope_sin  # (max_seq_len, head_dim) fp32
        plan.vocab = cfg.vocab_size
        plan.buffers = BuffersRef(cache)  # (a plan must neither write a cache's old K/V nor keep them alive)
        plan.scratch = torch.empty(0, dtype=torch.float32)  # grown to the most rows asked for
        plan.scratch_floats = 0
        # run_token's own: one row, its logits' buffer (reused), the scratch sizes by (threads, naive)
        plan.token_row = (Row * 1)()
        plan.token_wanted = (ctypes.c_int64 * 1)(0)
        plan.token_logits = torch.empty(1, plan.vocab, dtype=torch.float32)
        plan.token_view = plan.token_logits.numpy()[0]
        plan.token_floats = {}
        plan.token_pointers = None  # (cos, sin, logits, scratch) addresses, made again when the scratch grows
        return plan

    def run(self, rows: list[tuple[int, int, int, int | None]], logit_rows: list[int],
            profile: torch.Tensor | None = None, naive: bool = False) -> torch.Tensor:
        """Logits (len(logit_rows), vocab) fp32 of the token rows (token, position, kv_base, block table
        pointer or None); `profile` (float64, one per kernels.cpu_decode.PHASES): thread 0's seconds
        per phase are added to it; `naive`: attention as the naive setting runs it (its score matrix
        written to memory, softmaxed there and read back: kernels/cpu_decode.cpp attend_naive)."""
        from kernels.cpu_decode import Row
        m = len(rows)
        limit = self.model.max_len
        for _, pos, _, _ in rows:
            if not 0 <= pos < limit:
                raise ValueError(f"position {pos} is past the cache's {limit}")
        threads = torch.get_num_threads()
        floats = self.lib.membound_scratch_floats(ctypes.byref(self.model), m, threads, int(naive))
        if self.scratch_floats < floats:
            self._grow_scratch(floats)
        scratch = self.scratch
        c_rows = (Row * m)(*[Row(t, p, b, table) for t, p, b, table in rows])
        wanted = (ctypes.c_int64 * max(1, len(logit_rows)))(*logit_rows)
        logits = torch.empty(len(logit_rows), self.vocab, dtype=torch.float32)
        failed = self.lib.membound_step(ctypes.byref(self.model), c_rows, m, self.cos.data_ptr(), self.sin.data_ptr(),
                                        wanted, len(logit_rows), logits.data_ptr(), scratch.data_ptr(), threads,
                                        int(naive), None if profile is None else profile.data_ptr())
        if failed:
            raise ValueError(f"{m} token rows: the C++ step takes 1 to {self.lib.max_rows}")
        return logits

    def _grow_scratch(self, floats: int) -> None:
        self.scratch = torch.empty(floats, dtype=torch.float32)
        self.scratch_floats = floats
        self.token_pointers = None

    def run_token(self, token: int, pos: int, naive: bool = False):
        """run for one token row on the contiguous cache of one sequence, with no PyTorch operator:
        its logits as a (vocab,) fp32 numpy row, this plan's buffer (the next run_token overwrites it)."""
        if not 0 <= pos < self.model.max_len:
            raise ValueError(f"position {pos} is past the cache's {self.model.max_len}")
        threads = torch.get_num_threads()
        floats = self.token_floats.get((threads, naive))
        if floats is None:
            floats = self.token_floats[(threads, naive)] = \
                self.lib.membound_scratch_floats(ctypes.byref(self.model), 1, threads, int(naive))
        if self.scratch_floats < floats:
            self._grow_scratch(floats)
        if self.token_pointers is None:
            self.token_pointers = (self.cos.data_ptr(), self.sin.data_ptr(), self.token_logits.data_ptr(),
                                   self.scratch.data_ptr())
        cos, sin, logits, scratch = self.token_pointers
        row = self.token_row[0]
        row.token, row.pos = token, pos  # (kv_base 0, no block table: the contiguous cache of one sequence)
        self.lib.membound_step(ctypes.byref(self.model), self.token_row, 1, cos, sin, self.token_wanted, 1, logits,
                               scratch, threads, int(naive), None)
        return self.token_view
