"""Model loaders: GGUF (dequantised through `gguf`), HF safetensors folders, and synthetic
random weights of a named shape. Each returns a `LoadedWeights`: config, tensors in the
engine's naming (embed, norm, head, layers.{i}.wq …), tokenizer, and a label of the source."""
from __future__ import annotations

import json
import mmap
import struct
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

import torch

from engine.io.gguf_file import ModelFileError, open_gguf, read_metadata
from engine.model.config import ConfigError, ModelConfig

Progress = Callable[[float, str], None]

LAYER_KEYS = ("attn_norm", "ffn_norm", "wq", "wk", "wv", "wo", "w_gate", "w_up", "w_down")


class LoadError(ModelFileError):
    """The model cannot be loaded here (does not fit, unsupported tensor type…)."""


@dataclass
class LoadedWeights:
    cfg: ModelConfig
    weights: dict[str, torch.Tensor]
    tokenizer: Any
    source: str  # "gguf", "hf" or "synthetic"
    label: str  # what the user sees, e.g. "SmolLM2-135M-Instruct.Q4_1.gguf (Q4_1 → fp32)"
    file_format: str = ""  # storage format of the file, e.g. "Q4_1"
    extra: dict = field(default_factory=dict)


def _no_progress(fraction: float, message: str) -> None:
    pass


def load_model(spec: str | Path, dtype: torch.dtype = torch.float32, device: str = "cpu",
               progress: Progress | None = None, max_context: int | None = None) -> LoadedWeights:
    """spec: 'default', 'synthetic:<shape>', a .gguf file, or an HF model folder."""
    progress = progress or _no_progress
    spec_str = str(spec)
    if spec_str == "default":
        from engine.io.default_model import find_default_model
        spec_str = str(find_default_model())
    if spec_str.startswith("synthetic:"):
        return load_synthetic(spec_str.split(":", 1)[1], dtype, device, progress, max_context)
    path = Path(spec_str).expanduser()
    if not path.exists():
        raise ModelFileError(f"model not found: {path} (give a .gguf file, an HF model folder, "
                             "'default' or 'synthetic:SHAPE')")
    if path.is_dir():
        return load_hf_dir(path, dtype, device, progress, max_context)
    return load_gguf(path, dtype, device, progress, max_context)


# ---- memory check ------------------------------------------------------------------
def available_memory_bytes(device: str) -> int | None:
    if device.startswith("cuda"):
        free, _total = torch.cuda.mem_get_info()
        return free
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) * 1024
    except OSError:
        pass
    return None


def check_fits(cfg: ModelConfig, dtype: torch.dtype, device: str, what: str) -> None:
    elem = torch.tensor([], dtype=dtype).element_size()
    need = cfg.n_params * elem
    have = available_memory_bytes(device)
    if have is not None and need > 0.9 * have:
        raise LoadError(f"{what} needs {need / 1e9:.1f} GB of weights in {str(dtype).removeprefix('torch.')}, "
                        f"but only {have / 1e9:.1f} GB is free on {device}: out of memory")


def _cast(t: torch.Tensor, dtype: torch.dtype, device: str) -> torch.Tensor:
    return t.to(device=device, dtype=dtype).contiguous()


# ---- GGUF --------------------------------------------------------------------------
_GGUF_NAMES = {
    "attn_norm": "attn_norm", "ffn_norm": "ffn_norm", "attn_q": "wq", "attn_k": "wk", "attn_v": "wv",
    "attn_output": "wo", "ffn_gate": "w_gate", "ffn_up": "w_up", "ffn_down": "w_down",
}


def unpermute_qk(w: torch.Tensor, n_heads: int) -> torch.Tensor:
    """llama.cpp's converter interleaves the two halves of each head's rows of Q and K (for
    GPT-J style RoPE); put them back in the HF rotate-half order."""
    rows, cols = w.shape
    head_dim = rows // n_heads
    return w.reshape(n_heads, head_dim // 2, 2, cols).transpose(1, 2).reshape(rows, cols)


def load_gguf(path: Path, dtype, device, progress: Progress, max_context: int | None) -> LoadedWeights:
    import numpy as np
    from gguf import GGMLQuantizationType
    from gguf.quants import dequantize

    from engine.io.tokenizer import Tokenizer

    progress(0.0, f"reading {path.name}")
    reader = open_gguf(path)
    meta = read_metadata(reader)
    names = {t.name for t in reader.tensors}
    meta["_tied_embeddings"] = "output.weight" not in names
    cfg = ModelConfig.from_gguf_metadata(meta, name=path.stem)
    if max_context:
        cfg = cfg.with_max_seq_len(min(cfg.max_seq_len, max_context))
    check_fits(cfg, dtype, device, path.name)
    tokenizer = Tokenizer.from_gguf_metadata(meta)

    weights: dict[str, torch.Tensor] = {}
    kinds = Counter()
    for i, tensor in enumerate(reader.tensors):
        progress(0.05 + 0.9 * i / len(reader.tensors), f"dequantising {tensor.name}")
        try:
            array = dequantize(tensor.data, tensor.tensor_type)
        except NotImplementedError:
            raise LoadError(f"{path.name}: tensor type {tensor.tensor_type.name} is not supported") from None
        except Exception as e:
            raise ModelFileError(f"{path.name}: tensor {tensor.name} is corrupt ({e})") from None
        if tensor.tensor_type not in (GGMLQuantizationType.F32,):
            kinds[tensor.tensor_type.name] += tensor.n_elements
        t = torch.from_numpy(np.array(array, dtype=np.float32))  # a writable copy
        name = tensor.name.removesuffix(".weight")
        if name == "token_embd":
            key = "embed"
        elif name == "output_norm":
            key = "norm"
        elif name == "output":
            key = "head"
        elif name.startswith("blk."):
            _, idx, part = name.split(".", 2)
            if part not in _GGUF_NAMES:
                continue  # e.g. rope_freqs: not used by plain Llama shapes
            key = f"layers.{idx}.{_GGUF_NAMES[part]}"
            if part == "attn_q":
                t = unpermute_qk(t, cfg.n_heads)
            elif part == "attn_k":
                t = unpermute_qk(t, cfg.n_kv_heads)
        else:
            continue
        weights[key] = _cast(t, dtype, device)
    _check_complete(weights, cfg, path.name)
    file_format = kinds.most_common(1)[0][0] if kinds else "F32"
    progress(1.0, "loaded")
    return LoadedWeights(cfg, weights, tokenizer, "gguf", f"{path.name} ({file_format} → {_dtype_name(dtype)})",
                         file_format, {"path": str(path)})


def _check_complete(weights: dict, cfg: ModelConfig, what: str) -> None:
    need = ["embed", "norm"] + [f"layers.{i}.{k}" for i in range(cfg.n_layers) for k in LAYER_KEYS]
    if not cfg.tied_embeddings:
        need.append("head")
    missing = [k for k in need if k not in weights]
    if missing:
        raise ModelFileError(f"{what} lacks {len(missing)} tensors (first: {missing[0]}): not a complete Llama model")
    expect = {"embed": (cfg.vocab_size, cfg.dim), "layers.0.wq": (cfg.q_dim, cfg.dim),
              "layers.0.wk": (cfg.kv_dim, cfg.dim), "layers.0.w_down": (cfg.dim, cfg.ffn_dim)}
    for k, shape in expect.items():
        if tuple(weights[k].shape) != shape:
            raise ModelFileError(f"{what}: tensor {k} has shape {tuple(weights[k].shape)}, config says {shape}")


def _dtype_name(dtype: torch.dtype) -> str:
    return {torch.float32: "fp32", torch.bfloat16: "bf16", torch.float16: "fp16"}.get(dtype, str(dtype))


# ---- HF safetensors ------------------------------------------------------------------
_ST_DTYPES = {"F32": torch.float32, "F16": torch.float16, "BF16": torch.bfloat16, "F64": torch.float64}
_HF_NAMES = {
    "input_layernorm": "attn_norm", "post_attention_layernorm": "ffn_norm", "self_attn.q_proj": "wq",
    "self_attn.k_proj": "wk", "self_attn.v_proj": "wv", "self_attn.o_proj": "wo", "mlp.gate_proj": "w_gate",
    "mlp.up_proj": "w_up", "mlp.down_proj": "w_down",
}


def read_safetensors(path: Path) -> dict[str, torch.Tensor]:
    """Tensors of one .safetensors file (header: u64 length + JSON; then raw little-endian data)."""
    with open(path, "rb") as f:
        try:
            (header_len,) = struct.unpack("<Q", f.read(8))
            header = json.loads(f.read(header_len))
        except (struct.error, json.JSONDecodeError, UnicodeDecodeError):
            raise ModelFileError(f"{path.name} is not a valid safetensors file") from None
        buf = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_COPY)
    base = 8 + header_len
    out = {}
    for name, info in header.items():
        if name == "__metadata__":
            continue
        dtype = _ST_DTYPES.get(info["dtype"])
        if dtype is None:
            raise LoadError(f"{path.name}: tensor {name} has unsupported dtype {info['dtype']}")
        begin, end = info["data_offsets"]
        if base + end > len(buf):
            raise ModelFileError(f"{path.name} is truncated (tensor {name} runs past the end)")
        count = (end - begin) // torch.tensor([], dtype=dtype).element_size()
        t = torch.frombuffer(buf, dtype=dtype, count=count, offset=base + begin) if count else torch.empty(0, dtype=dtype)
        out[name] = t.reshape(info["shape"])
    return out


def load_hf_dir(path: Path, dtype, device, progress: Progress, max_context: int | None) -> LoadedWeights:
    from engine.io.tokenizer import Tokenizer

    cfg = ModelConfig.from_hf_config(path, name=path.name)
    if max_context:
        cfg = cfg.with_max_seq_len(min(cfg.max_seq_len, max_context))
    check_fits(cfg, dtype, device, path.name)
    files = sorted(path.glob("*.safetensors"))
    if not files:
        raise ModelFileError(f"{path} has no *.safetensors files")
    weights: dict[str, torch.Tensor] = {}
    for n, file in enumerate(files):
        progress(0.05 + 0.9 * n / len(files), f"reading {file.name}")
        for name, t in read_safetensors(file).items():
            key = _hf_key(name)
            if key:
                weights[key] = _cast(t, dtype, device)
    if cfg.tied_embeddings:
        weights.pop("head", None)
    elif "head" not in weights:
        raise ModelFileError(f"{path.name}: config says untied embeddings but there is no lm_head.weight")
    _check_complete(weights, cfg, path.name)
    tok_config = {}
    if (path / "tokenizer_config.json").exists():
        tok_config = json.loads((path / "tokenizer_config.json").read_text())
    if not (path / "tokenizer.json").exists():
        raise ModelFileError(f"{path} has no tokenizer.json")
    tokenizer = Tokenizer.from_file(path / "tokenizer.json", tok_config)
    st_dtypes = {str(t.dtype) for t in read_safetensors(files[0]).values()}
    file_format = "/".join(sorted(s.removeprefix("torch.") for s in st_dtypes))
    progress(1.0, "loaded")
    return LoadedWeights(cfg, weights, tokenizer, "hf", f"{path.name} ({file_format} → {_dtype_name(dtype)})",
                         file_format, {"path": str(path)})


def _hf_key(name: str) -> str | None:
    if name == "model.embed_tokens.weight":
        return "embed"
    if name == "model.norm.weight":
        return "norm"
    if name == "lm_head.weight":
        return "head"
    if name.startswith("model.layers."):
        rest = name.removeprefix("model.layers.").removesuffix(".weight")
        idx, part = rest.split(".", 1)
        if part in _HF_NAMES:
            return f"layers.{idx}.{_HF_NAMES[part]}"
    return None


# ---- synthetic -----------------------------------------------------------------------
def synthetic_weights(cfg: ModelConfig, dtype, device, seed: int = 0, progress: Progress = _no_progress):
    """Random weights of the shape: the text they produce is noise, their speed is real."""
    gen = torch.Generator(device=device).manual_seed(seed)

    def rand(*shape):
        return torch.empty(shape, dtype=dtype, device=device).normal_(0.0, 0.02, generator=gen)

    def ones(n):
        return torch.ones(n, dtype=dtype, device=device)

    w = {"embed": rand(cfg.vocab_size, cfg.dim), "norm": ones(cfg.dim)}
    if not cfg.tied_embeddings:
        w["head"] = rand(cfg.vocab_size, cfg.dim)
    for i in range(cfg.n_layers):
        progress(0.05 + 0.9 * i / cfg.n_layers, f"making random layer {i + 1}/{cfg.n_layers}")
        w.update({
            f"layers.{i}.attn_norm": ones(cfg.dim), f"layers.{i}.ffn_norm": ones(cfg.dim),
            f"layers.{i}.wq": rand(cfg.q_dim, cfg.dim), f"layers.{i}.wk": rand(cfg.kv_dim, cfg.dim),
            f"layers.{i}.wv": rand(cfg.kv_dim, cfg.dim), f"layers.{i}.wo": rand(cfg.dim, cfg.q_dim),
            f"layers.{i}.w_gate": rand(cfg.ffn_dim, cfg.dim), f"layers.{i}.w_up": rand(cfg.ffn_dim, cfg.dim),
            f"layers.{i}.w_down": rand(cfg.dim, cfg.ffn_dim),
        })
    return w


def load_synthetic(shape: str, dtype, device, progress: Progress, max_context: int | None) -> LoadedWeights:
    from engine.io.byte_tokenizer import ByteTokenizer

    cfg = ModelConfig.from_name(shape)
    if max_context:
        cfg = cfg.with_max_seq_len(min(cfg.max_seq_len, max_context))
    check_fits(cfg, dtype, device, f"synthetic:{shape}")
    weights = synthetic_weights(cfg, dtype, device, progress=progress)
    progress(1.0, "made random weights")
    return LoadedWeights(cfg, weights, ByteTokenizer(cfg.vocab_size), "synthetic",
                         f"synthetic:{shape} (random weights, {_dtype_name(dtype)}: text is noise, speed is real)",
                         _dtype_name(dtype))


__all__ = ["ConfigError", "LoadError", "LoadedWeights", "ModelFileError", "load_model", "synthetic_weights"]
