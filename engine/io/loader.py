"""Model loaders: GGUF (dequantised through `gguf`), HF safetensors folders (memory-mapped), and
synthetic random weights of a named shape. Each returns a `LoadedWeights`: config, tensors in the
engine's naming (embed, norm, head, layers.{i}.wqkv, .w_gate_up, .bqkv …: fused once here), tokenizer,
and the model line ("name (family, file type → precision, rope)")."""
from __future__ import annotations

import json
import mmap
from collections import Counter
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Callable

import torch

from engine.io.file_headers import ModelFileError, gguf_file_type, safetensors_files, safetensors_header
from engine.io.gguf_file import open_gguf, read_metadata
from engine.model.config import GEMMA, ConfigError, ModelConfig

Progress = Callable[[float, str], None]


class LoadError(ModelFileError):
    """The model cannot be loaded here (does not fit, unsupported tensor type…)."""


@dataclass
class LoadedWeights:
    cfg: ModelConfig
    weights: dict[str, torch.Tensor]
    tokenizer: Any
    source: str  # "gguf", "hf" or "synthetic"
    label: str  # what the user sees, e.g. "SmolLM2-135M-Instruct.Q4_1.gguf (Llama, Q4_1 → fp32, rope 100000)"
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
    "attn_norm.weight": "attn_norm", "ffn_norm.weight": "ffn_norm", "attn_q.weight": "wq", "attn_k.weight": "wk",
    "attn_v.weight": "wv", "attn_output.weight": "wo", "ffn_gate.weight": "w_gate", "ffn_up.weight": "w_up",
    "ffn_down.weight": "w_down", "attn_q.bias": "bq", "attn_k.bias": "bk", "attn_v.bias": "bv",
    "attn_q_norm.weight": "q_norm", "attn_k_norm.weight": "k_norm",
    "post_attention_norm.weight": "post_attn_norm", "post_ffw_norm.weight": "post_ffn_norm",  # Gemma 2/3
    "attn_qkv.weight": "wqkv",  # Phi-3: fused as the model takes it
}


def unpermute_qk(w: torch.Tensor, n_heads: int) -> torch.Tensor:
    """llama.cpp's converter interleaves the two halves of each head's rows of Q and K (for
    GPT-J style RoPE) in llama-arch files; put them back in the HF rotate-half order. Works on
    a weight (rows, cols) and on a bias (rows,)."""
    rows = w.shape[0]
    head_dim = rows // n_heads
    return w.reshape(n_heads, head_dim // 2, 2, *w.shape[1:]).transpose(1, 2).reshape(w.shape)


def load_gguf(path: Path, dtype, device, progress: Progress, max_context: int | None) -> LoadedWeights:
    import numpy as np
    from gguf.quants import dequantize

    from engine.io.tokenizer import Tokenizer

    progress(0.0, f"reading {path.name}")
    reader = open_gguf(path)
    meta = read_metadata(reader)
    names = {t.name for t in reader.tensors}
    meta["_tied_embeddings"] = "output.weight" not in names
    meta["_qkv_bias"] = "blk.0.attn_q.bias" in names
    meta["_longrope"] = "rope_factors_short.weight" in names
    # an Ollama blob is named by its hash: the name written in the file says more
    shown = str(meta.get("general.name") or path.name) if path.name.startswith("sha256-") else path.name
    cfg = ModelConfig.from_gguf_metadata(meta, name=shown.removesuffix(".gguf"))
    if max_context:
        cfg = cfg.with_max_seq_len(min(cfg.max_seq_len, max_context))
    check_fits(cfg, dtype, device, path.name)
    tokenizer = Tokenizer.from_gguf_metadata(meta)
    permuted = meta.get("general.architecture") == "llama"  # only llama-arch files interleave Q/K rows

    weights: dict[str, torch.Tensor] = {}
    kinds = Counter()
    for i, tensor in enumerate(reader.tensors):
        progress(0.05 + 0.9 * i / len(reader.tensors), f"dequantising {tensor.name} ({i + 1}/{len(reader.tensors)})")
        key, part = _gguf_key(tensor.name)
        if key is None:
            continue
        try:
            array = dequantize(tensor.data, tensor.tensor_type)
        except NotImplementedError:
            raise LoadError(f"{path.name}: tensor type {tensor.tensor_type.name} is not supported") from None
        except Exception as e:
            raise ModelFileError(f"{path.name}: tensor {tensor.name} is corrupt ({e})") from None
        kinds[tensor.tensor_type.name] += int(tensor.n_elements)
        t = torch.from_numpy(np.array(array, dtype=np.float32))  # a writable copy
        if key in ("rope_freqs", "rope_factors_short"):  # (Gemma's norms are stored as 1 + w already)
            cfg = replace(cfg, rope_freq_factors=tuple(float(f) for f in t.reshape(-1)))
            continue
        if part == "w_up" and cfg.arch == "phi3":  # Phi-3's ffn_up is gate and up fused
            key, part = key.replace("w_up", "w_gate_up"), "w_gate_up"
        if permuted and part in ("wq", "bq"):
            t = unpermute_qk(t, cfg.n_heads)
        elif permuted and part in ("wk", "bk"):
            t = unpermute_qk(t, cfg.n_kv_heads)
        weights[key] = _cast(t, dtype, device)
    fuse_layers(weights, cfg)
    _check_complete(weights, cfg, path.name)
    file_format = gguf_file_type(meta, kinds)
    progress(1.0, "loaded")
    return LoadedWeights(cfg, weights, tokenizer, "gguf", _label(shown, cfg, file_format, dtype, tokenizer),
                         file_format, {"path": str(path)})


def _gguf_key(name: str) -> tuple[str | None, str]:
    """(engine key, layer part) of a GGUF tensor name; (None, "") for tensors the model does not use."""
    if name == "token_embd.weight":
        return "embed", ""
    if name == "output_norm.weight":
        return "norm", ""
    if name == "output.weight":
        return "head", ""
    if name == "rope_freqs.weight":
        return "rope_freqs", ""
    if name == "rope_factors_short.weight":  # Phi-3's longrope within its original context
        return "rope_factors_short", ""
    if name.startswith("blk."):
        _, idx, rest = name.split(".", 2)
        part = _GGUF_NAMES.get(rest)
        if part:
            return f"layers.{idx}.{part}", part
    return None, ""


def _label(name: str, cfg: ModelConfig, file_format: str, dtype, tokenizer=None) -> str:
    """The model line: "Llama-3.2-1B.Q4_K_M.gguf (Llama, Q4_K_M → bf16, rope 500000, llama3 ×32)", and
    " · base model: plain text" where the file has no chat template to render a conversation with."""
    plain = " · base model: plain text, no chat template" if getattr(tokenizer, "chat_format", "") == "plain" else ""
    return f"{name} ({cfg.family}, {file_format} → {_dtype_name(dtype)}, {cfg.rope_label}){plain}"


# ---- weights in the engine's naming --------------------------------------------------
_FUSED = {"wqkv": ("wq", "wk", "wv"), "w_gate_up": ("w_gate", "w_up"), "bqkv": ("bq", "bk", "bv")}


def fuse_layers(weights: dict[str, torch.Tensor], cfg: ModelConfig) -> None:
    """Concatenate each layer's q/k/v (and gate/up, and the q/k/v biases) in place, dropping the
    parts: the model takes them fused (one matmul each), and the parts are not kept beside them."""
    for i in range(cfg.n_layers):
        for fused_name, parts in _FUSED.items():
            keys = [f"layers.{i}.{p}" for p in parts]
            if all(k in weights for k in keys):
                weights[f"layers.{i}.{fused_name}"] = torch.cat([weights.pop(k) for k in keys], dim=0)


def layer_keys(cfg: ModelConfig) -> tuple[str, ...]:
    keys = ("attn_norm", "ffn_norm", "wqkv", "wo", "w_gate_up", "w_down")
    if cfg.post_norms:
        keys += ("post_attn_norm", "post_ffn_norm")
    if cfg.qkv_bias:
        keys += ("bqkv",)
    if cfg.qk_norm:
        keys += ("q_norm", "k_norm")
    return keys


def _check_complete(weights: dict, cfg: ModelConfig, what: str) -> None:
    need = ["embed", "norm"] + [f"layers.{i}.{k}" for i in range(cfg.n_layers) for k in layer_keys(cfg)]
    if not cfg.tied_embeddings:
        need.append("head")
    missing = [k for k in need if k not in weights]
    if missing:
        raise ModelFileError(f"{what} lacks {len(missing)} tensors (first: {missing[0]}): "
                             f"not a complete {cfg.family} model")
    expect = {"embed": (cfg.vocab_size, cfg.dim), "norm": (cfg.dim,),
              "layers.0.wqkv": (cfg.q_dim + 2 * cfg.kv_dim, cfg.dim), "layers.0.wo": (cfg.dim, cfg.q_dim),
              "layers.0.w_gate_up": (2 * cfg.ffn_dim, cfg.dim), "layers.0.w_down": (cfg.dim, cfg.ffn_dim)}
    if cfg.qkv_bias:
        expect["layers.0.bqkv"] = (cfg.q_dim + 2 * cfg.kv_dim,)
    if cfg.qk_norm:
        expect["layers.0.q_norm"] = expect["layers.0.k_norm"] = (cfg.head_dim,)
    if cfg.post_norms:
        expect["layers.0.post_attn_norm"] = expect["layers.0.post_ffn_norm"] = (cfg.dim,)
    if not cfg.tied_embeddings:
        expect["head"] = (cfg.vocab_size, cfg.dim)
    for k, shape in expect.items():
        if tuple(weights[k].shape) != shape:
            raise ModelFileError(f"{what}: tensor {k} has shape {tuple(weights[k].shape)}, config says {shape}")


def _dtype_name(dtype: torch.dtype) -> str:
    names = {torch.float32: "fp32", torch.bfloat16: "bf16", torch.float16: "fp16", torch.float64: "fp64"}
    return names.get(dtype, str(dtype).removeprefix("torch."))


# ---- HF safetensors ------------------------------------------------------------------
_ST_DTYPES = {"F32": torch.float32, "F16": torch.float16, "BF16": torch.bfloat16, "F64": torch.float64}
_HF_NAMES = {
    "input_layernorm.weight": "attn_norm", "post_attention_layernorm.weight": "ffn_norm",
    "self_attn.q_proj.weight": "wq", "self_attn.k_proj.weight": "wk", "self_attn.v_proj.weight": "wv",
    "self_attn.o_proj.weight": "wo", "mlp.gate_proj.weight": "w_gate", "mlp.up_proj.weight": "w_up",
    "mlp.down_proj.weight": "w_down", "self_attn.q_proj.bias": "bq", "self_attn.k_proj.bias": "bk",
    "self_attn.v_proj.bias": "bv", "self_attn.q_norm.weight": "q_norm", "self_attn.k_norm.weight": "k_norm",
    "self_attn.qkv_proj.weight": "wqkv", "mlp.gate_up_proj.weight": "w_gate_up",  # Phi-3: fused already
}
# Gemma 2/3 name their four norms otherwise: "post_attention_layernorm" is the attention's output norm
_HF_GEMMA_NAMES = {**_HF_NAMES, "post_attention_layernorm.weight": "post_attn_norm",
                   "pre_feedforward_layernorm.weight": "ffn_norm", "post_feedforward_layernorm.weight": "post_ffn_norm"}
# Gemma 3's multimodal checkpoints keep the language model under a prefix (two layouts over the versions)
_HF_PREFIXES = (("model.language_model.", "model."), ("language_model.model.", "model."),
                ("language_model.lm_head.", "lm_head."))


def read_safetensors(path: Path) -> dict[str, torch.Tensor]:
    """Tensors of one .safetensors file as views of a copy-on-write memory map: nothing is read
    until used, and a tensor kept in the file's dtype is never copied."""
    header, base = safetensors_header(path)
    with open(path, "rb") as f:
        size = f.seek(0, 2)
        buf = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_COPY) if size else b""
    out = {}
    for name, info in header.items():
        if name == "__metadata__":
            continue
        dtype = _ST_DTYPES.get(info.get("dtype"))
        if dtype is None:
            raise LoadError(f"{path.name}: tensor {name} has unsupported dtype {info.get('dtype')}")
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
    files = safetensors_files(path)
    if not (path / "tokenizer.json").exists():
        raise ModelFileError(f"{path} has no tokenizer.json")
    weights: dict[str, torch.Tensor] = {}
    stored = Counter()
    tensors = [(file, name, t) for file in files for name, t in read_safetensors(file).items()]
    gemma = cfg.arch in GEMMA
    for n, (file, name, t) in enumerate(tensors):
        progress(0.05 + 0.9 * n / len(tensors), f"reading {name} ({file.name})")
        key = _hf_key(name, gemma)
        if key:
            stored[_dtype_name(t.dtype)] += t.numel()
            if gemma and name.endswith("norm.weight"):  # Gemma's RMSNorm scales by (1 + w): stored so once
                t = t.float() + 1.0
            weights[key] = _cast(t, dtype, device)
    if cfg.tied_embeddings:
        weights.pop("head", None)
    elif "head" not in weights:
        raise ModelFileError(f"{path.name}: config says untied embeddings but there is no lm_head.weight")
    fuse_layers(weights, cfg)
    _check_complete(weights, cfg, path.name)
    tok_config = {}
    if (path / "tokenizer_config.json").exists():
        tok_config = json.loads((path / "tokenizer_config.json").read_text())
    tokenizer = Tokenizer.from_file(path / "tokenizer.json", tok_config)
    file_format = "/".join(name for name, _ in stored.most_common())
    progress(1.0, "loaded")
    return LoadedWeights(cfg, weights, tokenizer, "hf", _label(path.name, cfg, file_format, dtype, tokenizer),
                         file_format, {"path": str(path)})


def _hf_key(name: str, gemma: bool = False) -> str | None:
    for prefix, plain in _HF_PREFIXES:
        if name.startswith(prefix):
            name = plain + name.removeprefix(prefix)
            break
    if name == "model.embed_tokens.weight":
        return "embed"
    if name == "model.norm.weight":
        return "norm"
    if name == "lm_head.weight":
        return "head"
    if name.startswith("model.layers."):
        idx, part = name.removeprefix("model.layers.").split(".", 1)
        names = _HF_GEMMA_NAMES if gemma else _HF_NAMES
        if part in names:
            return f"layers.{idx}.{names[part]}"
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
        if cfg.qkv_bias:
            w.update({f"layers.{i}.bq": rand(cfg.q_dim), f"layers.{i}.bk": rand(cfg.kv_dim),
                      f"layers.{i}.bv": rand(cfg.kv_dim)})
        if cfg.qk_norm:
            w.update({f"layers.{i}.q_norm": ones(cfg.head_dim), f"layers.{i}.k_norm": ones(cfg.head_dim)})
        if cfg.post_norms:
            w.update({f"layers.{i}.post_attn_norm": ones(cfg.dim), f"layers.{i}.post_ffn_norm": ones(cfg.dim)})
    return w


def load_synthetic(shape: str, dtype, device, progress: Progress, max_context: int | None) -> LoadedWeights:
    from engine.io.byte_tokenizer import ByteTokenizer

    cfg = ModelConfig.from_name(shape)
    if max_context:
        cfg = cfg.with_max_seq_len(min(cfg.max_seq_len, max_context))
    check_fits(cfg, dtype, device, f"synthetic:{shape}")
    weights = synthetic_weights(cfg, dtype, device, progress=progress)
    fuse_layers(weights, cfg)
    progress(1.0, "made random weights")
    return LoadedWeights(cfg, weights, ByteTokenizer(cfg.vocab_size), "synthetic",
                         f"synthetic:{shape} ({cfg.family}, random weights, {_dtype_name(dtype)}: text is noise, "
                         "speed is real)", _dtype_name(dtype))


__all__ = ["ConfigError", "LoadError", "LoadedWeights", "ModelFileError", "load_model", "synthetic_weights"]
