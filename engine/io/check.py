"""The quick look at a model before anything slow (importing torch, measuring the bandwidth,
dequantising): its header and its architecture, read as the model list reads them. Torch-free;
raises ModelFileError (ConfigError for an unknown shape) with the one line the loader would give, in milliseconds."""
from __future__ import annotations

from pathlib import Path

from engine.io.file_headers import ModelFileError
from engine.model.config import ModelConfig


def check_model(spec) -> None:
    """Nothing when `spec` ('default', 'synthetic:SHAPE', a GGUF file, an HF folder, or weights
    already in memory) looks loadable; else the reason, as the loader would say it."""
    if not isinstance(spec, (str, Path)):
        return  # weights already loaded (tests, the app's model cache)
    spec_str = str(spec)
    if spec_str.startswith("synthetic:"):
        ModelConfig.from_name(spec_str.split(":", 1)[1])
        return
    if spec_str == "default":
        from engine.io.default_model import find_default_model
        path = find_default_model()
    else:
        path = Path(spec_str).expanduser()
    if not path.exists():
        raise ModelFileError(f"model not found: {path} (give a .gguf file, an HF model folder, "
                             "'default' or 'synthetic:SHAPE')")
    from engine.io.discovery import scan_gguf, scan_hf_folder

    if path.is_dir():
        row = scan_hf_folder(path, "", path.name)
    else:
        row = scan_gguf(path, "", path.name)
        if row is None:
            raise ModelFileError(f"{path.name} is a later part of a split GGUF: merge the parts first "
                                 "(llama-gguf-split --merge) and open the merged file")
    if row.reason:
        reason = row.reason if path.name in row.reason else f"{path.name}: {row.reason}"
        raise ModelFileError(reason)
