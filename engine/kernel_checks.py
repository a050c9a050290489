"""At load, each kernel the switches can select runs once on the loaded model's shapes against its
PyTorch reference; one that fails to compile, raises or disagrees is switched off in the engine's
context (engine/context.py, kernels/registry.py) and the engine takes the PyTorch path for that op.

`check_kernels(engine)` runs the checks that apply (on a GPU with triton: the INT8 and INT4 matmuls,
flash-decoding, the paged decode, the CUDA-graph decode step; on a CPU: the C++ decode step, the
others passing unrun, though a fault injected there still fails its check: engine/faults.py) and
returns the notes for `Engine.kernel_notes`: "field=value" of each switch whose kernel is off -> one line."""
from __future__ import annotations

import time
from dataclasses import dataclass, replace
from typing import Callable

import torch

from engine.kv.cache import DEFAULT_BLOCK_SIZE, ContiguousKVCache
from engine.model.config import ModelConfig
from engine.model.quant import quantize_int4, quantize_int8, quantize_model
from engine.protocol import one_line
from engine.settings import GROUP_SIZES, group_size_refusal
from kernels.registry import KernelSwitches

# Largest error allowed, relative to the reference's largest |value|. A broken kernel is off by
# order one; a working one by its rounding (16-bit outputs are rounded once; on a GPU the
# dequantised weights are rounded to the activations' dtype for the tensor cores). The unit tests
# hold the kernels to half of these or less, on small shapes (tests/kernels).
TOLERANCE = {torch.float32: 1e-4, torch.float16: 1e-2, torch.bfloat16: 4e-2}
# The graph step against eager decode through the whole model: every op rounds on both sides and
# the compiled step fuses some of them (rounding differently), so the bound is looser.
GRAPH_TOLERANCE = {torch.float32: 1e-3, torch.float16: 5e-2, torch.bfloat16: 1e-1}
MATMUL_ROWS = (1, 80)  # a decode step and a prefill chunk: the two families of launch configs
# keys in the attention checks: not a multiple of the tile (the masked tail runs), and long enough
# that a GPU splits it (the reduction runs); models with a shorter context use theirs
CONTEXT_LEN = 1000
GRAPH_PROMPT = 4  # positions prefilled before the checked graph step (and the C++ CPU step)
REASON_CHARS = 90  # a note is one line: the reason is cut here


@dataclass(frozen=True)
class KernelCheck:
    kernel: str  # its name in kernels/registry.py
    label: str  # what the window calls it
    options: tuple[str, ...]  # "field=value" of the switches that select it: their tooltips say why
    fallback: str  # what runs instead
    run: Callable[..., str | None]  # (engine) -> the problem in one line, "" if none, None: does not apply
    device: str = "cuda"  # where it runs: "cuda" (with triton) or "cpu"


@dataclass(frozen=True)
class CheckResult:
    kernel: str
    problem: str  # "" if it passed (or did not run)
    ran: bool
    seconds: float


def check_kernels(engine) -> dict[str, str]:
    """Run the checks (once per kernel and context: one switched off stays off) and return the
    notes of every kernel that is off."""
    results = run_checks(engine)
    ran = [r for r in results if r.ran]
    if ran and engine.progress is not None:
        failed = sum(bool(r.problem) for r in ran)
        engine.progress(1.0, f"checked {len(ran)} GPU kernels in {sum(r.seconds for r in ran):.1f} s"
                             + (f": {failed} switched off" if failed else ""))
    return {**kernel_notes(engine.context.kernels), **cpu_step_notes(engine)}


def cpu_step_notes(engine) -> dict[str, str]:
    """"weights=…" -> one line for each weight format at the engine's dtype that the load timing gave
    to PyTorch's step (the C++ step ran slower here: engine/model/cpu_step.py `choice`)."""
    if engine.device != "cpu" or not engine.context.kernels.enabled("cpu_step"):
        return {}
    from engine.model import cpu_step
    if cpu_step.unavailable_reason(engine.context):
        return {}
    notes = {}
    dtype = cpu_step.format_label(engine.model)
    for c in cpu_step.slower_formats(engine.model):
        fmt, _, weights = c.label.partition(" · ")
        if fmt == dtype:
            notes[f"weights={weights or 'fp'}"] = (f"{c.label} decodes in PyTorch's step: the C++ step ({c.isa}) took "
                                                   f"{1 / c.speedup:.1f}x its time at load")
    return notes


def run_checks(engine) -> list[CheckResult]:
    """Each check still enabled, in its own try and timed; a failure switches its kernel off."""
    on_gpu = engine.device.startswith("cuda") and _triton_available()
    results = []
    kernels = engine.context.kernels
    for check in CHECKS:
        if not kernels.enabled(check.kernel):
            continue
        result = run_check(check, engine, on_gpu if check.device == "cuda" else engine.device == check.device)
        results.append(result)
        if result.problem:
            kernels.disable(check.kernel, result.problem)
    if not kernels.enabled("graphs"):
        engine.disable_graphs(f"failed its check at load: {kernels.reason('graphs')}")
    return results


def run_check(check: KernelCheck, engine, run: bool = True) -> CheckResult:
    """One check; `run` False (not its device) passes it unrun, unless a fault is injected into it."""
    t0 = time.perf_counter()
    problem, ran = "", False
    try:
        engine.context.faults.inject_kernel_check(check.kernel)
        if run:
            if engine.progress is not None:
                engine.progress(1.0, f"checking the {check.label}…")
            ran = True
            problem = check.run(engine)
            if problem is None:
                ran, problem = False, ""
            if engine.device.startswith("cuda"):
                torch.cuda.synchronize()  # an asynchronous launch error surfaces here, in its own check
    except Exception as error:
        problem = one_line(error)
    return CheckResult(check.kernel, _cut(problem), ran, time.perf_counter() - t0)


def kernel_notes(kernels: KernelSwitches) -> dict[str, str]:
    """"field=value" -> one line, for every switch whose kernel is off in `kernels`."""
    notes = {}
    for check in CHECKS:
        reason = kernels.reason(check.kernel)
        if reason:
            note = f"{check.label} failed its check ({reason}) — {check.fallback}"
            notes.update(dict.fromkeys(check.options, note))
    return notes


# ---- the checks (each also callable on its own: the tests run them under TRITON_INTERPRET=1) ----
def check_int8(weight: torch.Tensor) -> str:
    """The INT8 matmul on `weight` (N, K) quantised, at its dtype and device, against the reference."""
    from kernels.int8_matmul import int8_matmul, reference_int8_matmul
    q, scales = quantize_int8(weight)
    for rows in MATMUL_ROWS:
        x = _random((rows, weight.shape[1]), weight.dtype, weight.device)
        problem = mismatch(int8_matmul(x, q, scales), reference_int8_matmul(x, q, scales))
        if problem:
            return f"{rows} rows: {problem}"
    return ""


def check_int4(weight: torch.Tensor, group_size: int) -> str:
    """The INT4 matmul on `weight` quantised with `group_size`, against the reference."""
    from kernels.int4_matmul import int4_matmul, reference_int4_matmul
    packed, scales, mins = quantize_int4(weight, group_size)
    for rows in MATMUL_ROWS:
        x = _random((rows, weight.shape[1]), weight.dtype, weight.device)
        problem = mismatch(int4_matmul(x, packed, scales, mins, group_size),
                           reference_int4_matmul(x, packed, scales, mins, group_size))
        if problem:
            return f"{rows} rows, group {group_size}: {problem}"
    return ""


def check_flash(cfg: ModelConfig, dtype: torch.dtype, device) -> str:
    """Flash-decoding over two rows of a cache view (ragged lengths) with the model's heads."""
    from kernels.flash_decode import flash_decode, reference_decode
    lens = _context_lens(cfg)
    q = _random((2, cfg.n_heads, cfg.head_dim), dtype, device)
    # views of a longer buffer, as the contiguous cache hands attention
    k = _random((2, cfg.n_kv_heads, lens[0] + 8, cfg.head_dim), dtype, device)[:, :, :lens[0]]
    v = _random((2, cfg.n_kv_heads, lens[0] + 8, cfg.head_dim), dtype, device)[:, :, :lens[0]]
    got = flash_decode(q, k, v, torch.tensor(lens, dtype=torch.int32, device=device))
    return mismatch(got, reference_decode(q, k, v, lens))


def check_paged(cfg: ModelConfig, dtype: torch.dtype, device, block_size: int = DEFAULT_BLOCK_SIZE) -> str:
    """The paged decode over two rows whose blocks lie scattered in the pool."""
    from kernels.flash_decode import paged_flash_decode, reference_paged_decode
    lens = _context_lens(cfg)
    per_row = -(-lens[0] // block_size)
    n_blocks = 2 * per_row + 1
    order = torch.randperm(n_blocks, generator=torch.Generator().manual_seed(0))[:2 * per_row]
    tables = order.view(2, per_row).to(device=device, dtype=torch.int32)
    q = _random((2, cfg.n_heads, cfg.head_dim), dtype, device)
    k_pool = _random((cfg.n_kv_heads, n_blocks * block_size, cfg.head_dim), dtype, device)
    v_pool = _random((cfg.n_kv_heads, n_blocks * block_size, cfg.head_dim), dtype, device)
    got = paged_flash_decode(q, k_pool, v_pool, tables, torch.tensor(lens, dtype=torch.int32, device=device),
                             block_size)
    return mismatch(got, reference_paged_decode(q, k_pool, v_pool, tables, lens, block_size))


@torch.inference_mode()  # as the engine's steps run
def check_graphs(engine) -> str | None:
    """One decode step replayed from the captured graph against the same step run eagerly. It runs
    on the engine's model and its (new, empty) cache, so the graph captured here is the one the first
    reply replays: the compile time moves from the first reply to the load. Returns None where
    graphs do not run (off in the settings, or not on this device)."""
    graphs = engine.graphs
    if graphs.unavailable or not engine.settings.cuda_graphs:
        return None
    model, cfg = engine.model, engine.cfg
    cache = engine.cache
    if not isinstance(cache, ContiguousKVCache) or cache.k.dtype != model.dtype:
        cache = ContiguousKVCache(cfg, 1, cfg.max_seq_len, model.dtype, engine.device)
        if engine.settings.kv_layout == "contiguous":  # the layout graphs run on: the first reply takes it
            engine.cache = cache
    engine.cached_ids = []  # what the check writes there is no conversation's
    ids = torch.arange(1, GRAPH_PROMPT + 2, device=model.device)[None] % cfg.vocab_size
    prompt, token = ids[:, :GRAPH_PROMPT], ids[:, GRAPH_PROMPT:]
    replays = graphs.replays
    attention = engine.settings.attention
    try:
        model(prompt, start_pos=0, cache=cache, attention=attention)
        want = model(token, start_pos=GRAPH_PROMPT, cache=cache, attention=attention)
        for _ in range(3):  # compile and warm up, record, replay: the third call is a replay
            cache.truncate(GRAPH_PROMPT)
            got = graphs.decode(model, cache, token, GRAPH_PROMPT, attention)
        ran = graphs.replays - replays
    finally:
        cache.truncate(0)
        graphs.replays = replays  # the figures count the conversation's replays only
    if ran < 3:
        return graphs.unavailable or "the graph did not run"
    return mismatch(got, want, GRAPH_TOLERANCE, model.dtype)  # fp32 logits of a model that computes in its dtype


@torch.inference_mode()
def check_cpu_step(engine) -> str | None:
    """One decode step of the engine's model in C++ (engine/model/cpu_step.py) against PyTorch's
    step, after a short prompt; a C++ step that cannot be built is a failed check too (the note says
    why the CPU runs PyTorch's step). None where the C++ step does not apply (this model or dtype)."""
    from engine.model import cpu_step
    model, cfg = engine.model, engine.cfg
    cache = ContiguousKVCache(cfg, 1, min(cfg.max_seq_len, GRAPH_PROMPT + 1), model.dtype, "cpu")
    token = torch.tensor([[GRAPH_PROMPT % cfg.vocab_size]])
    if cpu_step.refusal(model, token, cache, "flash"):
        return None
    unavailable = cpu_step.unavailable_reason(engine.context)
    if unavailable:
        return unavailable
    ids = torch.arange(1, GRAPH_PROMPT + 1)[None] % cfg.vocab_size
    model(ids, start_pos=0, cache=cache)
    got = cpu_step.checked_step(model, token, GRAPH_PROMPT, cache)
    cache.truncate(GRAPH_PROMPT)
    with cpu_step.pytorch_only():
        want = model(token, start_pos=GRAPH_PROMPT, cache=cache)
    if got is None:
        return "the C++ step did not run"
    # fp32 logits of a model that computes in its dtype; quantised products round in bf16: bf16's bound
    problem = mismatch(got, want, GRAPH_TOLERANCE, torch.bfloat16 if _rounds_in_bf16(model) else model.dtype)
    if not problem:  # which step decodes each weight format here: the C++ one where it is faster
        if engine.progress is not None:
            engine.progress(1.0, "timing the C++ step against PyTorch's, per format…")
        time_cpu_formats(model, _int4_group(engine) or 32)
    return problem


def _rounds_in_bf16(model) -> bool:
    """Whether this model's INT8/INT4 products round in bf16 on a CPU: PyTorch's take x and give y in
    bf16 (engine/model/quant.py), the C++ step's keep fp32 outputs (and may round x: bf16 dot products).
    Held to fp32's bound, an fp32 model with INT8 or INT4 weights failed by 0.018 / 0.038, and the app
    loaded so never ran the C++ step."""
    from engine.model import cpu_step
    return cpu_step.format_label(model).endswith(("int8", "int4"))


def time_cpu_formats(model, group_size: int = 32) -> list:
    """The timings of the model's format and of INT8 and INT4 weights at its dtype (its stand-in's
    layers quantised), as the load check makes them (engine/model/cpu_step.py `choice`)."""
    from engine.model import cpu_step
    made = [cpu_step.choice(model)]
    if cpu_step.format_label(model) in ("fp32", "bf16"):
        # the same layers quantised (fewer bytes: quantising as many bytes' worth took seconds at load)
        short = cpu_step.stand_in(model)
        for weights in ("int8", "int4"):
            try:
                made.append(cpu_step.choice(quantize_model(short, weights, group_size)))
            except Exception:  # a shape INT4 cannot take: that format is not offered
                continue
    return made


def _fp_weight(engine) -> torch.Tensor:
    """A layer's floating-point weight at the engine's dtype: the longest K of a layer (w_down)."""
    return engine.model_for(replace(engine.settings, weights="fp")).layers[0].w_down.weight


def _int4_group(engine) -> int | None:
    """The group size the settings ask for, else the first this model takes (None: INT4 is refused)."""
    for group_size in (engine.settings.group_size, *GROUP_SIZES):
        if not group_size_refusal(engine.cfg, group_size):
            return group_size
    return None


def _check_int4_of(engine) -> str | None:
    group_size = _int4_group(engine)
    return None if group_size is None else check_int4(_fp_weight(engine), group_size)


CHECKS = (
    KernelCheck("int8", "INT8 Triton kernel", ("weights=int8",), "using the PyTorch path",
                lambda engine: check_int8(_fp_weight(engine))),
    KernelCheck("int4", "INT4 Triton kernel", ("weights=int4",), "using the PyTorch path", _check_int4_of),
    KernelCheck("flash", "flash-decoding Triton kernel", ("attention=flash",), "using the PyTorch path",
                lambda engine: check_flash(engine.cfg, engine.model.dtype, engine.device)),
    KernelCheck("paged", "paged-decode Triton kernel", ("kv_layout=paged",), "using the PyTorch path",
                lambda engine: check_paged(engine.cfg, engine.model.dtype, engine.device)),
    # last: the captured step holds the kernels above that are still on
    KernelCheck("graphs", "CUDA-graph decode", ("cuda_graphs=True",), "decoding without graphs", check_graphs),
    KernelCheck("cpu_step", "C++ CPU decode step", ("attention=flash", "kv_layout=contiguous"),
                "using PyTorch's step", check_cpu_step, device="cpu"),
)


# ---- helpers --------------------------------------------------------------------------------
def mismatch(got: torch.Tensor, want: torch.Tensor, tolerance: dict = TOLERANCE,
             dtype: torch.dtype | None = None) -> str:
    """"" when `got` is within the tolerance of `dtype` (default want's) of `want`, relative to
    want's largest |value|; else what is wrong, in a few words."""
    if got.shape != want.shape or got.dtype != want.dtype:
        return f"returned {got.dtype} {tuple(got.shape)}, expected {want.dtype} {tuple(want.shape)}"
    got32, want32 = got.float(), want.float()
    if not bool(torch.isfinite(got32).all()) and bool(torch.isfinite(want32).all()):
        return "returned non-finite values"
    scale = want32.abs().max().clamp(min=1e-6)
    worst = ((got32 - want32).abs().max() / scale).item()
    allowed = tolerance[dtype or want.dtype]
    if not worst <= allowed:
        return f"max error {worst:.2g} of the largest output, allowed {allowed:g}"
    return ""


def _random(shape: tuple[int, ...], dtype: torch.dtype, device) -> torch.Tensor:
    generator = torch.Generator(device=device).manual_seed(0)
    return torch.randn(shape, generator=generator, device=device).to(dtype)


def _context_lens(cfg: ModelConfig) -> list[int]:
    longest = min(CONTEXT_LEN, cfg.max_seq_len)
    return [longest, max(1, longest // 3)]


def _cut(text: str) -> str:
    text = " ".join(text.split())
    return text if len(text) <= REASON_CHARS else text[:REASON_CHARS - 1] + "…"


def _triton_available() -> bool:
    try:
        import triton  # noqa: F401
        return True
    except ImportError:
        return False
