"""An HF model folder's files, torch-free (the loader reads them; discovery lists them): the
safetensors headers and which weight files make up the model (all shards, or which are missing)."""
from __future__ import annotations

import json
import struct
from collections import Counter
from pathlib import Path

from engine.io.gguf_file import ModelFileError

SAFETENSORS_DTYPES = {"F32": "fp32", "F16": "fp16", "BF16": "bf16", "F64": "fp64"}  # what the loader reads


def safetensors_header(path: Path) -> tuple[dict, int]:
    """(header, byte offset of the data) of a .safetensors file: u64 length, then JSON."""
    try:
        with open(path, "rb") as f:
            (header_len,) = struct.unpack("<Q", f.read(8))
            if header_len > 100_000_000:
                raise ValueError("header too long")
            header = json.loads(f.read(header_len))
    except (struct.error, ValueError, UnicodeDecodeError):  # JSONDecodeError is a ValueError
        raise ModelFileError(f"{path.name} is not a valid safetensors file") from None
    except OSError as e:
        raise ModelFileError(f"cannot read {path.name}: {e.strerror or e}") from None
    if not isinstance(header, dict):
        raise ModelFileError(f"{path.name} is not a valid safetensors file")
    return header, 8 + header_len


def safetensors_files(path: Path) -> list[Path]:
    """The folder's weight files: those its model.safetensors.index.json names (every shard must
    be there: a half-finished download says which is missing), else every *.safetensors."""
    index = path / "model.safetensors.index.json"
    if index.exists():
        try:
            weight_map = json.loads(index.read_text())["weight_map"]
            names = sorted(set(weight_map.values()))
        except (OSError, ValueError, KeyError, TypeError, AttributeError):
            raise ModelFileError(f"{index.name} in {path.name} is not a valid index") from None
        files = [path / name for name in names]
        missing = [f.name for f in files if not f.exists()]
        if missing:
            raise ModelFileError(f"{path.name}: {len(missing)} of {len(files)} weight shards missing "
                                 f"(first: {missing[0]}): an unfinished download?")
        return files
    files = sorted(path.glob("*.safetensors"))
    if not files:
        raise ModelFileError(f"{path} has no *.safetensors files")
    return files


def weights_summary(files: list[Path]) -> tuple[Counter, int]:
    """(elements per dtype name, bytes on disk) over the weight files, from their headers alone;
    ModelFileError for a file shorter than its header says (a truncated download)."""
    elements: Counter = Counter()
    total = 0
    for file in files:
        header, base = safetensors_header(file)
        size = file.stat().st_size
        end = base
        for name, info in header.items():
            if name == "__metadata__" or not isinstance(info, dict):
                continue
            n = 1
            for d in info.get("shape", ()):
                n *= int(d)
            elements[SAFETENSORS_DTYPES.get(info.get("dtype"), str(info.get("dtype")))] += n
            end = max(end, base + int(info.get("data_offsets", (0, 0))[1]))
        if end > size:
            raise ModelFileError(f"{file.name} is truncated ({size:,} of {end:,} bytes): an unfinished download?")
        total += size
    return elements, total
