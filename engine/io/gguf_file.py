"""Reading GGUF files through the `gguf` package (imported here, lazily, so the engine
imports without it). Metadata comes back as plain Python values; `read_gguf_header` reads the
key/values and tensor list alone, fast, for listing models (torch-free)."""
from __future__ import annotations

import mmap
import struct
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import Any


class ModelFileError(ValueError):
    """A model file that is missing, unreadable or corrupt (one-line message for the user)."""


def open_gguf(path: str | Path):
    path = Path(path)
    if not path.exists():
        raise ModelFileError(f"model file not found: {path}")
    if not path.is_file():
        raise ModelFileError(f"not a file: {path}")
    try:
        import gguf
    except ImportError:
        raise ModelFileError("reading GGUF files needs the 'gguf' package (pip install gguf)") from None
    with open(path, "rb") as f:
        magic = f.read(4)
    if magic != b"GGUF":
        raise ModelFileError(f"{path.name} is not a GGUF file (bad magic {magic!r})")
    check_complete(read_gguf_header(path), path.name)  # in a blink, where the reader takes seconds to fail
    try:
        return gguf.GGUFReader(str(path), "r")
    except Exception as e:  # the reader raises many kinds on truncated or corrupt files
        raise ModelFileError(f"{path.name} is corrupt or truncated: {type(e).__name__}: {e}") from None


def read_metadata(reader) -> dict[str, Any]:
    """All key/value fields of an open GGUF reader as str/int/float/bool/list values."""
    meta: dict[str, Any] = {}
    for key, field in reader.fields.items():
        try:
            meta[key] = field.contents()
        except Exception as e:
            raise ModelFileError(f"GGUF field {key} is corrupt: {e}") from None
    return meta


def read_gguf_metadata(path: str | Path) -> dict[str, Any]:
    return read_metadata(open_gguf(path))


# ---- header only (model discovery) ----------------------------------------------------------
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
    """Bytes of a tensor's data by its type's block size (KeyError for a type gguf does not know)."""
    from gguf import GGML_QUANT_SIZES, GGMLQuantizationType

    block, type_size = GGML_QUANT_SIZES[GGMLQuantizationType(info.type_id)]
    n = 1
    for d in info.shape:
        n *= d
    return n // block * type_size


def gguf_file_type(meta: dict, tensor_types: Counter) -> str:
    """What the file holds, as llama.cpp names it ("Q4_K_M"): general.file_type when written,
    else the tensor type holding the most elements (`tensor_types`: type name -> elements)."""
    from gguf import LlamaFileType

    try:
        return LlamaFileType(int(meta["general.file_type"])).name.removeprefix("MOSTLY_").removeprefix("ALL_")
    except (KeyError, ValueError, TypeError):
        return tensor_types.most_common(1)[0][0] if tensor_types else "F32"
