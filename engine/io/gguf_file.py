"""Reading GGUF files through the `gguf` package (imported here, lazily, so the engine
imports without it). Metadata comes back as plain Python values; the header alone is read by
engine/io/file_headers.py (no gguf, no torch: the app lists models with it)."""
from __future__ import annotations

from pathlib import Path
from typing import Any

from engine.io.file_headers import ModelFileError, check_complete, read_gguf_header

__all__ = ["ModelFileError", "open_gguf", "read_gguf_metadata", "read_metadata"]


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
