"""Weight-only quantisation: INT8 (symmetric, one scale per output channel) and INT4
(asymmetric, group-wise along K: w = code * scale + min, codes 0..15, scale and min in fp16).
Quantisers turn a weight tensor into stored tensors; `quantize_model` swaps every `Linear` of
a `Transformer` for an `Int8Linear` / `Int4Linear` built from them, sharing everything else.

What runs where: CUDA → the Triton kernels in kernels/ (through torch custom ops, so a compiled
decode step can capture them) unless one failed its check at load (kernels/registry.py); CPU → PyTorch's packed CPU kernels, fed bf16 activations (the
only ones they vectorise); anything else → the one-line reference forward.

The head is quantised too (a fifth of the default model's weight bytes), to INT8 in both
settings: on the default model an INT4 head alone raises perplexity by 7% (its table is also
the embedding, stored Q8_0 in the GGUF), an INT8 one by nothing measurable; llama.cpp's Q4
files likewise keep the output matrix at higher precision. The embedding lookup keeps the
floating-point table: it reads one row per token, so its bytes do not matter, and the lookup
stays exact."""
from __future__ import annotations

import copy
import threading
from typing import Callable

import torch
import torch.nn as nn
import torch.nn.functional as F

from engine.context import EngineContext, default_context
from engine.metrics import dequantised_copy_bytes
from engine.model import cpu_step, huge_pages
from engine.model.transformer import Linear, Transformer
from engine.settings import GROUP_SIZES, QuantError, check_weights, weights_label
from kernels.int4_pack import pack_int4, unpack_int4
from kernels.registry import KernelSwitches

INT4_CPU_ZERO_CODE = 8  # PyTorch's CPU int4 kernel dequantises (code - 8) * scale + zero
# PyTorch's packed CPU kernels are matrix-vector kernels: their time grows with every row of x,
# while a bf16 GEMM (oneDNN) barely notices rows. Past these row counts (prefill) the CPU path
# dequantises the layer to bf16 and runs the GEMM instead. Measured on a 3072 x 576 layer, two
# threads (2-core AMD EPYC): int8 packed 3.10 ms vs dequantise + GEMM 1.40 ms at 128 rows
# (even at 32); int4 packed 2.70 vs 3.17 ms at 128 rows, 5.47 vs 4.54 ms at 256.
CPU_PACKED_MAX_ROWS = {"int8": 32, "int4": 192}
# The copies a dequantising path writes and reads back are charged by the cost model
# (engine/metrics.py dequantised_copy_bytes); `bytes_read` says which path a forward takes.


# ---- quantisers (tensor → stored tensors) ---------------------------------------------------
def quantize_int8(w: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(N, K) float → q int8 (N, K) in [-127, 127] and fp32 scales (N,): w ≈ q * scale.
    Scales are rounded to bf16 values first (the CPU kernel takes bf16 scales), so every
    backend dequantises to exactly the same weights."""
    w = w.float()
    scales = (w.abs().amax(dim=1).clamp(min=1e-30) / 127.0).bfloat16().float()
    q = torch.round(w / scales[:, None]).clamp(-127, 127).to(torch.int8)
    return q, scales


def dequantize_int8(q: torch.Tensor, scales: torch.Tensor) -> torch.Tensor:
    return q.float() * scales.float()[:, None]


def quantize_int4(w: torch.Tensor, group_size: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(N, K) float → packed uint8 (N, K/2), fp16 scales and mins (N, K/group):
    w ≈ code * scale + min per group of `group_size` consecutive inputs, codes 0..15.
    Scale and min are rounded to fp16 before the codes are chosen, so the codes are the best
    ones for what is stored; a Q4_1 GGUF (fp16 d and m, group 32) comes back code for code."""
    n, k = w.shape
    if group_size not in GROUP_SIZES:
        raise QuantError(f"int4 group size must be one of {', '.join(map(str, GROUP_SIZES))}, got {group_size}")
    if k % group_size:
        raise QuantError(f"int4 group size {group_size} does not divide the layer's {k} inputs")
    groups = w.float().reshape(n, k // group_size, group_size)
    lo = groups.amin(dim=2)
    hi = groups.amax(dim=2)
    scales = ((hi - lo) / 15.0).clamp(min=2 ** -24).half()  # a constant group keeps a tiny nonzero scale
    mins = lo.half()
    codes = torch.round((groups - mins.float()[..., None]) / scales.float()[..., None]).clamp(0, 15)
    return pack_int4(codes.reshape(n, k).to(torch.uint8)), scales, mins


def dequantize_int4(packed: torch.Tensor, scales: torch.Tensor, mins: torch.Tensor, group_size: int) -> torch.Tensor:
    codes = unpack_int4(packed).float()
    return codes * scales.float().repeat_interleave(group_size, 1) + mins.float().repeat_interleave(group_size, 1)


# ---- torch custom ops around the Triton kernels ---------------------------------------------
# Opaque to torch.compile: the captured decode graph launches the kernel as it is.
@torch.library.custom_op("membound::int8_weight_matmul", mutates_args=())
def _int8_op(x: torch.Tensor, q: torch.Tensor, scales: torch.Tensor) -> torch.Tensor:
    from kernels.int8_matmul import int8_matmul
    return int8_matmul(x, q, scales)


@_int8_op.register_fake
def _(x, q, scales):
    return x.new_empty(*x.shape[:-1], q.shape[0])


@torch.library.custom_op("membound::int4_weight_matmul", mutates_args=())
def _int4_op(x: torch.Tensor, packed: torch.Tensor, scales: torch.Tensor, mins: torch.Tensor,
             group_size: int) -> torch.Tensor:
    from kernels.int4_matmul import int4_matmul
    return int4_matmul(x, packed, scales, mins, group_size)


@_int4_op.register_fake
def _(x, packed, scales, mins, group_size):
    return x.new_empty(*x.shape[:-1], packed.shape[0])


def _backend(device: torch.device) -> str:
    if device.type == "cpu":
        return "cpu"
    if device.type == "cuda":
        try:
            import triton  # noqa: F401
            return "triton"
        except ImportError:
            pass
    return "reference"


# ---- quantised linear modules -------------------------------------------------------------
def _kernels(module: nn.Module) -> KernelSwitches:
    """The kernel switches of the engine the module belongs to (engine/context.py)."""
    return (module.context or default_context()).kernels


class Int8Linear(nn.Module):
    """y = x @ (q * scale[:, None]).T, q int8 (N, K), one fp32 scale per output channel."""

    def __init__(self, q: torch.Tensor, scales: torch.Tensor):
        super().__init__()
        self.out_features, self.in_features = q.shape
        self.register_buffer("q", q.contiguous())
        self.register_buffer("scales", scales.float())
        self.backend = _backend(q.device)
        self.context: EngineContext | None = None  # its engine's (Transformer.bind); None: the default
        if self.backend == "cpu":  # the CPU kernel wants scales in the activation dtype (bf16)
            self.register_buffer("scales_bf16", self.scales.bfloat16(), persistent=False)

    @classmethod
    def from_weight(cls, weight: torch.Tensor) -> "Int8Linear":
        return cls(*quantize_int8(weight))

    def first_rows(self, n: int) -> "Int8Linear":
        """The first n output rows as a module (a head cut short to time it)."""
        return Int8Linear(self.q[:n], self.scales[:n])

    def reference(self, x: torch.Tensor) -> torch.Tensor:
        return F.linear(x, dequantize_int8(self.q, self.scales).to(x.dtype))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.backend == "cpu":
            x2 = x.reshape(-1, self.in_features).bfloat16()
            if x2.shape[0] > CPU_PACKED_MAX_ROWS["int8"]:
                y = F.linear(x2, self.q * self.scales_bf16[:, None])  # one kernel: int8 * bf16 -> bf16
            else:
                y = torch._weight_int8pack_mm(x2, self.q, self.scales_bf16)
            return y.to(x.dtype).reshape(*x.shape[:-1], self.out_features)
        if self.backend == "triton" and _kernels(self).enabled("int8"):
            return _int8_op(x, self.q, self.scales)
        return self.reference(x)

    def cpu_matrix(self) -> tuple | None:
        """The codes and bf16 scales for the C++ CPU decode step (engine/model/cpu_step.py)."""
        return cpu_step.matrix(2, self.q, self.scales_bf16) if self.backend == "cpu" else None

    @property
    def weight_bytes(self) -> int:
        """What forward reads per step: the int8 codes and one scale per row, as stored."""
        scales = self.scales_bf16 if self.backend == "cpu" else self.scales
        return self.q.numel() + scales.numel() * scales.element_size()

    def bytes_read(self, rows: int) -> int:
        """Bytes a forward over `rows` rows moves for its weight: as stored, plus the dequantised
        copy a path writes and reads back (engine/metrics.py dequantised_copy_bytes)."""
        path = "cpu" if self.backend == "cpu" and rows > CPU_PACKED_MAX_ROWS["int8"] else \
            "reference" if self.backend == "reference" or (self.backend == "triton" and not _kernels(self).enabled("int8")) \
            else None
        return self.weight_bytes + dequantised_copy_bytes("int8", path, self.q.numel())


class Int4Linear(nn.Module):
    """y = x @ W.T with W[n, k] = code * scale[n, k // g] + min[n, k // g], two codes per byte."""

    def __init__(self, packed: torch.Tensor, scales: torch.Tensor, mins: torch.Tensor, group_size: int):
        super().__init__()
        self.out_features, self.in_features = packed.shape[0], 2 * packed.shape[1]
        self.group_size = group_size
        self.register_buffer("packed", packed.contiguous())
        self.register_buffer("scales", scales.contiguous())
        self.register_buffer("mins", mins.contiguous())
        self.backend = _backend(packed.device)
        self.context: EngineContext | None = None  # its engine's (Transformer.bind); None: the default
        if self.backend == "cpu":
            self._make_cpu_layout()

    def _make_cpu_layout(self) -> None:
        """PyTorch's CPU int4 kernel: its own tiled packing (N a multiple of 16), and one bf16
        (scale, zero) pair per group, laid out (K/g, N, 2), dequantising (code - 8) * scale + zero."""
        n = self.out_features
        n_pad = -(-n // 16) * 16  # rows added to reach a multiple of 16 give zeros, sliced off
        codes = unpack_int4(self.packed).to(torch.int32)
        scales, mins = self.scales.float(), self.mins.float()
        if n_pad != n:
            codes = F.pad(codes, (0, 0, 0, n_pad - n))
            scales, mins = F.pad(scales, (0, 0, 0, n_pad - n)), F.pad(mins, (0, 0, 0, n_pad - n))
        zeros = mins + INT4_CPU_ZERO_CODE * scales
        self.register_buffer("cpu_packed", torch._convert_weight_to_int4pack_for_cpu(codes, 1), persistent=False)
        self.register_buffer("cpu_scale_zeros", torch.stack([scales.t(), zeros.t()], dim=-1).bfloat16().contiguous(),
                             persistent=False)

    def cpu_matrix(self) -> tuple | None:
        """The codes and fp16 scales and mins in the C++ step's tiles of 16 rows (kernels/cpu_decode.cpp
        gemv_int4), for the CPU decode step (engine/model/cpu_step.py)."""
        if self.backend != "cpu" or self.in_features % 8 or self.group_size % 8:
            return None
        if getattr(self, "cpu_tiles", None) is None:
            self._make_cpu_tiles()
        return cpu_step.matrix(3, self.cpu_tiles, self.cpu_tile_scales, self.cpu_tile_mins, self.group_size,
                               n=self.out_features, k=self.in_features)

    def _make_cpu_tiles(self) -> None:
        n, k, g = self.out_features, self.in_features, self.group_size
        tiles = -(-n // 16)
        codes = F.pad(unpack_int4(self.packed), (0, 0, 0, 16 * tiles - n)).long()  # (16T, K), zero rows added
        octets = codes.view(tiles, 16, k // 8, 4, 2).permute(0, 2, 1, 3, 4)  # (T, K/8, 16 rows, a, b): input 2a + b
        shifts = 4 * torch.arange(4)[:, None] + 16 * torch.arange(2)[None, :]  # nibble at bit 4a + 16b
        words = (octets << shifts).sum(dim=(-2, -1))  # (T, K/8, 16): the bits do not overlap
        self.register_buffer("cpu_tiles", words.to(torch.int32).contiguous().view(torch.uint8).view(tiles, -1),
                             persistent=False)

        def per_tile(t: torch.Tensor) -> torch.Tensor:  # (N, K/g) -> (T, K/g, 16)
            return F.pad(t, (0, 0, 0, 16 * tiles - n)).view(tiles, 16, k // g).transpose(1, 2).contiguous()

        self.register_buffer("cpu_tile_scales", per_tile(self.scales), persistent=False)
        self.register_buffer("cpu_tile_mins", per_tile(self.mins), persistent=False)

    @classmethod
    def from_weight(cls, weight: torch.Tensor, group_size: int) -> "Int4Linear":
        return cls(*quantize_int4(weight, group_size), group_size)

    def reference(self, x: torch.Tensor) -> torch.Tensor:
        return F.linear(x, dequantize_int4(self.packed, self.scales, self.mins, self.group_size).to(x.dtype))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.backend == "cpu":
            x2 = x.reshape(-1, self.in_features).bfloat16()
            if x2.shape[0] > CPU_PACKED_MAX_ROWS["int4"]:
                return F.linear(x2, self._dequantize_bf16()).to(x.dtype).reshape(*x.shape[:-1], self.out_features)
            y = torch._weight_int4pack_mm_for_cpu(x2, self.cpu_packed, self.group_size, self.cpu_scale_zeros)
            if y.shape[1] != self.out_features:
                y = y[:, : self.out_features]
            return y.to(x.dtype).reshape(*x.shape[:-1], self.out_features)
        if self.backend == "triton" and _kernels(self).enabled("int4"):
            return _int4_op(x, self.packed, self.scales, self.mins, self.group_size)
        return self.reference(x)

    def _dequantize_bf16(self) -> torch.Tensor:
        n, k, g = self.out_features, self.in_features, self.group_size
        codes = torch.stack([self.packed & 0xF, self.packed >> 4], dim=-1).view(n, k // g, g).to(torch.bfloat16)
        return torch.addcmul(self.mins.bfloat16()[..., None], codes, self.scales.bfloat16()[..., None]).view(n, k)

    def bytes_read(self, rows: int) -> int:
        """Bytes a forward over `rows` rows moves for its weight: as stored, plus the dequantised
        copy a path writes and reads back (engine/metrics.py dequantised_copy_bytes)."""
        path = "cpu" if self.backend == "cpu" and rows > CPU_PACKED_MAX_ROWS["int4"] else \
            "reference" if self.backend == "reference" or (self.backend == "triton" and not _kernels(self).enabled("int4")) \
            else None
        return self.weight_bytes + dequantised_copy_bytes("int4", path, self.out_features * self.in_features)

    @property
    def weight_bytes(self) -> int:
        """What forward reads per step: half a byte per weight plus a scale and a min (or
        zero) per group, as stored for this backend."""
        if self.backend == "cpu":
            tensors = (self.cpu_packed, self.cpu_scale_zeros)
        else:
            tensors = (self.packed, self.scales, self.mins)
        return sum(t.numel() * t.element_size() for t in tensors)


# ---- the model transform --------------------------------------------------------------------
HEAD_WEIGHTS = "int8"  # what the output head becomes under int8 and int4 (see the module docstring)


def quantize_linear(linear: Linear, weights: str, group_size: int) -> nn.Module:
    if weights == "int8":
        return Int8Linear.from_weight(linear.weight)
    if weights == "int4":
        return Int4Linear.from_weight(linear.weight, group_size)
    raise QuantError(f"cannot quantise to {weights!r}")


@torch.no_grad()
def quantize_model(model: Transformer, weights: str, group_size: int = 32,
                   progress: Callable[[float, str], None] | None = None) -> Transformer:
    """A copy of `model` with every Linear quantised. Embedding, norms and RoPE tables are the
    same tensors as the source's (nothing floating-point is copied); the source is unchanged."""
    check_weights(model.cfg, weights, group_size)
    total = sum(isinstance(m, Linear) for m in model.modules())
    done = 0
    label = weights_label(weights, group_size)

    new_layers = []

    def swap(module: nn.Module, name: str = "") -> nn.Module:
        nonlocal done
        if isinstance(module, Linear):
            made = quantize_linear(module, HEAD_WEIGHTS if name == "head" else weights, group_size)
            new_layers.append(made)
            done += 1
            if progress:
                progress(done / total, f"quantising weights to {label}: {done}/{total} layers")
            return made
        clone = copy.copy(module)  # a shallow copy: its own child table, shared tensors
        clone._parameters = dict(module._parameters)
        clone._buffers = dict(module._buffers)
        clone._modules = {child_name: swap(child, f"{name}.{child_name}" if name else child_name)
                          for child_name, child in module._modules.items()}
        return clone

    quantised = swap(model).bind(model.context)  # the new modules belong to the source's engine
    if model.embed.device.type == "cpu":  # the new layers' tensors only: the shared ones are the source's
        for layer in new_layers:
            try:
                layer.cpu_matrix()  # the C++ step's tiles made now, so they are packed too
            except ValueError:  # a layer the C++ step cannot take: it says so when a plan is built
                pass
        huge_pages.pack(huge_pages.model_tensors(nn.ModuleList(new_layers)))
    return quantised


class QuantisedModels:
    """Quantised copies of a model, made once per key (dtype, weights, group) and kept.
    A copy is made in a background thread so a streaming reply keeps going meanwhile; one at a
    time, the others asked for meanwhile queued in order (a speaker pressing F4 twice gets INT4
    once INT8 is made, not a refusal)."""

    def __init__(self):
        self._ready: dict[tuple, Transformer] = {}
        self._lock = threading.Lock()
        self._done = threading.Condition(self._lock)
        self._building: tuple | None = None
        self._queue: list[tuple] = []  # (key, source, progress) waiting for the one being made
        self._fraction = 0.0
        self._errors: dict[tuple, BaseException] = {}

    def get(self, key: tuple) -> Transformer | None:
        with self._lock:
            return self._ready.get(key)

    @property
    def building(self) -> tuple[tuple, float] | None:
        """(key, fraction done) of the copy being made, or None."""
        with self._lock:
            return (self._building, self._fraction) if self._building is not None else None

    def start(self, key: tuple, source: Callable[[], Transformer],
              progress: Callable[[float, str], None] | None = None) -> None:
        """Begin making `key` (or queue it behind the one being made) unless it is ready or asked for."""
        with self._lock:
            if key in self._ready or self._building == key or any(k == key for k, _, _ in self._queue):
                return
            self._errors.pop(key, None)
            if self._building is not None:
                self._queue.append((key, source, progress))
                return
            self._begin(key, source, progress)

    def _begin(self, key: tuple, source, progress) -> None:
        """Start the thread that makes `key` (the lock is held)."""
        _, weights, group_size = key
        self._building, self._fraction = key, 0.0

        def report(fraction: float, message: str) -> None:
            self._fraction = fraction
            if progress:
                progress(fraction, message)

        def build() -> None:
            try:
                made = quantize_model(source(), weights, group_size, report)
                with self._lock:
                    self._ready[key] = made
            except BaseException as e:  # kept for wait(): the stream reports it in one line
                with self._lock:
                    self._errors[key] = e
            finally:
                with self._lock:
                    self._building = None
                    if self._queue:
                        self._begin(*self._queue.pop(0))
                    self._done.notify_all()

        # not a daemon: a process that exits mid-build waits for it (seconds) rather than
        # tearing torch down under a running thread
        threading.Thread(target=build, name=f"quantise {weights}").start()

    def wait(self, key: tuple) -> Transformer:
        """The copy for `key`, waiting for it if it is being made or queued."""
        with self._lock:
            while key not in self._ready and key not in self._errors and (
                    self._building == key or any(k == key for k, _, _ in self._queue)):
                self._done.wait()
            if key in self._ready:
                return self._ready[key]
            error = self._errors.pop(key, None)
        if isinstance(error, QuantError):
            raise error
        if error is not None:
            raise QuantError(f"making {weights_label(key[1], key[2])} weights failed: "
                             f"{type(error).__name__}: {error}") from error
        raise QuantError(f"{weights_label(key[1], key[2])} weights were never requested")
