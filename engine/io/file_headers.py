"""Model files on disk, read without torch or gguf (the app lists models with it): GGUF headers (the
key/values and tensor list, not the data) with ggml's table of tensor types, and safetensors headers
and the shard list of an HF folder. Malformed files raise ModelFileError with a one-line message."""
from __future__ import annotations

import json
import mmap
import struct
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import Any


class ModelFileError(ValueError):
    """A model file that is missing, unreadable or corrupt (one-line message for the user)."""


# ggml's tensor types: id -> (name, elements per block, bytes per block); the gguf package's
# GGMLQuantizationType and GGML_QUANT_SIZES, as data (tests check the two agree)
GGML_TYPES: dict[int, tuple[str, int, int]] = {
    0: ("F32", 1, 4), 1: ("F16", 1, 2), 2: ("Q4_0", 32, 18), 3: ("Q4_1", 32, 20), 6: ("Q5_0", 32, 22),
    7: ("Q5_1", 32, 24), 8: ("Q8_0", 32, 34), 9: ("Q8_1", 32, 40), 10: ("Q2_K", 256, 84), 11: ("Q3_K", 256, 110),
    12: ("Q4_K", 256, 144), 13: ("Q5_K", 256, 176), 14: ("Q6_K", 256, 210), 15: ("Q8_K", 256, 292),
    16: ("IQ2_XXS", 256, 66), 17: ("IQ2_XS", 256, 74), 18: ("IQ3_XXS", 256, 98), 19: ("IQ1_S", 256, 50),
    20: ("IQ4_NL", 32, 18), 21: ("IQ3_S", 256, 110), 22: ("IQ2_S", 256, 82), 23: ("IQ4_XS", 256, 136),
    24: ("I8", 1, 1), 25: ("I16", 1, 2), 26: ("I32", 1, 4), 27: ("I64", 1, 8), 28: ("F64", 1, 8),
    29: ("IQ1_M", 256, 56), 30: ("BF16", 1, 2), 34: ("TQ1_0", 256, 54), 35: ("TQ2_0", 256, 66),
    39: ("MXFP4", 32, 17),
}
# llama.cpp's file types (general.file_type; gguf.LlamaFileType without its MOSTLY_/ALL_ prefix)
FILE_TYPES: dict[int, str] = {
    0: "F32", 1: "F16", 2: "Q4_0", 3: "Q4_1", 7: "Q8_0", 8: "Q5_0", 9: "Q5_1", 10: "Q2_K", 11: "Q3_K_S",
    12: "Q3_K_M", 13: "Q3_K_L", 14: "Q4_K_S", 15: "Q4_K_M", 16: "Q5_K_S", 17: "Q5_K_M", 18: "Q6_K",
    19: "IQ2_XXS", 20: "IQ2_XS", 21: "Q2_K_S", 22: "IQ3_XS", 23: "IQ3_XXS", 24: "IQ1_S", 25: "IQ4_NL",
    26: "IQ3_S", 27: "IQ3_M", 28: "IQ2_S", 29: "IQ2_M", 30: "IQ4_XS", 31: "IQ1_M", 32: "BF16", 36: "TQ1_0",
    37: "TQ2_0", 38: "MXFP4_MOE",
}


# ---- GGUF ------------------------------------------------------------------------------------
# GGUF value types (gguf.GGUFValueType) -> struct format; 8 = string, 9 = array
_SCALARS = {0: "<B", 1: "<b", 2: "<H", 3: "<h", 4: "<I", 5: "<i", 6: "<f", 7: "<?", 10: "<Q", 11: "<q", 12: "<d"}
LONG_ARRAY = 64  # arrays longer than this (a vocabulary, its merges) come back as range(length)


@dataclass(frozen=True)
class GgufTensorInfo:
    name: str
    shape: tuple[int, ...]  # as stored: fastest-varying dimension first
    type_id: int  # gguf.GGMLQuantizationType value
    offset: int  # from the start of the data section


@dataclass(frozen=True)
class GgufHeader:
    meta: dict[str, Any]
    tensors: tuple[GgufTensorInfo, ...]
    data_start: int
    file_bytes: int


def read_gguf_header(path: str | Path) -> GgufHeader:
    """Key/values and tensor list of a GGUF file without reading its data, and without parsing the
    vocabulary (long arrays come back as range(length)): milliseconds where gguf.GGUFReader takes
    seconds on a 150k-token vocabulary. ModelFileError (one line) on anything malformed."""
    path = Path(path)
    try:
        with open(path, "rb") as f:
            size = f.seek(0, 2)
            if size < 24:
                raise ModelFileError(f"{path.name} is not a GGUF file (only {size} bytes)")
            buf = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ)
    except OSError as e:
        raise ModelFileError(f"cannot read {path.name}: {e.strerror or e}") from None
    with buf:
        if buf[:4] != b"GGUF":
            raise ModelFileError(f"{path.name} is not a GGUF file (bad magic {bytes(buf[:4])!r})")
        try:
            return _parse_header(buf, size)
        except (struct.error, UnicodeDecodeError, IndexError, ValueError, OverflowError):
            raise ModelFileError(f"{path.name}: GGUF header is corrupt or truncated") from None


def _parse_header(buf, size: int) -> GgufHeader:
    version, n_tensors, n_kv = struct.unpack_from("<IQQ", buf, 4)
    if version not in (2, 3):
        raise ValueError(f"GGUF version {version}")
    pos = 24

    def string() -> str:
        nonlocal pos
        (n,) = struct.unpack_from("<Q", buf, pos)
        if pos + 8 + n > size:
            raise ValueError("string past the end")
        pos += 8 + n
        return bytes(buf[pos - n:pos]).decode("utf-8")

    def value(kind: int):
        nonlocal pos
        if kind == 8:
            return string()
        if kind == 9:
            (item_kind, count) = struct.unpack_from("<IQ", buf, pos)
            pos += 12
            if count > LONG_ARRAY:
                if item_kind in _SCALARS:  # skipped in one step
                    pos += count * struct.calcsize(_SCALARS[item_kind])
                else:
                    for _ in range(count):
                        value(item_kind)
                if pos > size:
                    raise ValueError("array past the end")
                return range(count)
            return [value(item_kind) for _ in range(count)]
        fmt = _SCALARS[kind]
        (out,) = struct.unpack_from(fmt, buf, pos)
        pos += struct.calcsize(fmt)
        return out

    meta: dict[str, Any] = {}
    for _ in range(n_kv):
        key = string()
        (kind,) = struct.unpack_from("<I", buf, pos)
        pos += 4
        meta[key] = value(kind)
    tensors = []
    for _ in range(n_tensors):
        name = string()
        (n_dims,) = struct.unpack_from("<I", buf, pos)
        shape = struct.unpack_from(f"<{n_dims}Q", buf, pos + 4)
        pos += 4 + 8 * n_dims
        type_id, offset = struct.unpack_from("<IQ", buf, pos)
        pos += 12
        tensors.append(GgufTensorInfo(name, tuple(shape), type_id, offset))
    alignment = int(meta.get("general.alignment", 32)) or 32
    data_start = -(-pos // alignment) * alignment
    return GgufHeader(meta, tuple(tensors), data_start, size)


def check_complete(header: GgufHeader, name: str) -> None:
    """ModelFileError when the tensors run past the end of the file (a download cut short)."""
    try:
        end = max((header.data_start + t.offset + tensor_nbytes(t) for t in header.tensors), default=0)
    except (KeyError, ValueError):
        return  # a tensor type gguf does not know: the loader names it
    if end > header.file_bytes:
        raise ModelFileError(f"{name} is truncated ({header.file_bytes:,} of {end:,} bytes): an unfinished download?")


def tensor_nbytes(info: GgufTensorInfo) -> int:
    """Bytes of a tensor's data by its type's block size (KeyError for a type not in GGML_TYPES)."""
    _, block, block_bytes = GGML_TYPES[info.type_id]
    n = 1
    for d in info.shape:
        n *= d
    return n // block * block_bytes


def type_name(type_id: int) -> str:
    return GGML_TYPES[type_id][0] if type_id in GGML_TYPES else f"type {type_id}"


def gguf_file_type(meta: dict, tensor_types: Counter) -> str:
    """What the file holds, as llama.cpp names it ("Q4_K_M"): general.file_type when written,
    else the tensor type holding the most elements (`tensor_types`: type name -> elements)."""
    try:
        return FILE_TYPES[int(meta["general.file_type"])]
    except (KeyError, ValueError, TypeError):
        return tensor_types.most_common(1)[0][0] if tensor_types else "F32"


# ---- safetensors --------------------------------------------------------------------------------
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
