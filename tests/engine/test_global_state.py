"""No module-level mutable state in engine/ and kernels/ outside the per-engine context
(engine/context.py): every global of every module is listed, and each is immutable (a number, a
string, a tuple or frozenset of such, a frozen dataclass, a read-only mapping, a function, a class,
a kernel's definition) or named below with why; no function rebinds a global (`global`)."""
from __future__ import annotations

import ast
import dataclasses
import enum
import importlib
import os
import pathlib
import pkgutil
import re
import sys
import types
from pathlib import Path

import pytest
import torch

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")  # the kernel modules define their kernels at import

import engine  # noqa: E402
import kernels  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]

# Read-only tables written as dicts, lists or sets before this test: read, never written. A new
# table is a tuple, a frozenset or a types.MappingProxyType, which the test takes as it is.
CONSTANT_TABLES = {
    "engine.attach.servers.SERVERS", "engine.bench.attention.NAIVE_PREFILL_BUDGET",
    "engine.bench.hf_compare._HF_PARTS", "engine.bench.hf_compare._HF_CLASSES", "engine.bench.run.TABLE_ROWS",
    "engine.bench.speculative.SOURCE_LABELS", "engine.hardware.ceilings.GPU_MEMORY_BYTES",
    "engine.hardware.ceilings.NVLINK_GBS",
    "engine.hardware.spec._DTYPE_ALIASES", "engine.hardware.spec._FLOPS_FALLBACK",
    "engine.io.discovery.FAMILY_NAMES", "engine.io.discovery.GGUF_ARCHITECTURES", "engine.io.file_headers.GGML_TYPES",
    "engine.io.file_headers.FILE_TYPES", "engine.io.file_headers._SCALARS", "engine.io.file_headers.SAFETENSORS_DTYPES",
    "engine.io.loader._GGUF_NAMES", "engine.io.loader._FUSED", "engine.io.loader._ST_DTYPES",
    "engine.io.loader._HF_NAMES", "engine.io.tokenizer.GPT2_PRE", "engine.io.tokenizer.DIGITS_THEN_GPT2_PRE",
    "engine.io.tokenizer.LLAMA3_PRE", "engine.io.tokenizer.QWEN2_PRE", "engine.kernel_checks.TOLERANCE",
    "engine.kernel_checks.GRAPH_TOLERANCE", "engine.model.config.HF_ARCHITECTURES",
    "engine.model.config.HF_MODEL_TYPES", "engine.model.config.GGUF_ARCHITECTURES", "engine.model.config.FAMILY_NAMES",
    "engine.model.config.NAMED_SHAPES", "engine.model.cpu_step.ACT_FORMATS", "engine.model.quant.CPU_PACKED_MAX_ROWS",
    "engine.variants.DTYPES",
    "engine.io.loader._HF_GEMMA_NAMES", "engine.io.tokenizer.GPT4O_PRE", "engine.model.config.GEMMA3_TEXT_DEFAULTS",
    "engine.model.config.GEMMA2_DEFAULTS", "engine.model.config.ACTIVATIONS",
}
# Mutable on purpose, process-wide, each with why (engine/context.py says the same).
PROCESS_WIDE = {
    "engine.context._DEFAULT": "the default context itself: for code outside any engine, replaced between tests",
    "engine.context._DEFAULT_LOCK": "guards the default context's making",
    "kernels.tuning.TUNED": "a GPU's fastest launch configuration per kernel and shape, write-once per key: "
                            "the captured step's custom op cannot be handed an engine's object",
    "kernels.cpu_decode._LOADED": "the compiled C++ step, one library per set of build flags: a loaded "
                                  "library cannot be unloaded",
    "kernels.cpu_decode._LOCK": "guards the build of that library",
    "kernels.cpu_roof._lib": "the compiled roof probe (a library, loaded once: it cannot be unloaded)",
    "kernels.cpu_roof._lock": "guards its load",
    "engine.dispatch._COUNTS": "which implementation ran, counted since the process began: monotonic, and "
                               "read as differences (`since`), so no reader sees another's counts",
    "engine.model.attention._kernels_available": "whether triton imports: a fact of the installed process",
    "engine.model.transformer._onednn_available": "whether this torch build has oneDNN's packed matmul: a fact "
                                                  "of the installed process",
    "engine.model.transformer._onednn_packs": "whether oneDNN runs a dtype's packed matmul on this CPU (at the "
                                              "level the process was started with): a fact of the process",
    "engine.model.cpu_step.model_refusal": "a pure function of a frozen ModelConfig, memoised",
    "engine.model.attention._QUIET": "this thread is inside the captured step's attention op (a scoped flag)",
    "engine.model.attention._FLASH_OFF": "stateless switches (flash off) for that op, which cannot be handed "
                                         "its engine's context",
    # (the C++ step's library, plans and timings are its engine's: EngineContext.cpu_step)
    "engine.model.cpu_step._local": "this thread runs PyTorch's step (`pytorch_only`, a scoped flag: the "
                                    "references and profiles that ask for it hold no engine's context)",
    "engine.model.sampling._SCRATCH": "each thread's working rows for the C++ sampler (a row's probabilities "
                                      "and candidates, overwritten by every call: no state between calls)",
}
IMMUTABLE = (int, float, complex, str, bytes, bool, type(None), frozenset, range, pathlib.PurePath, re.Pattern,
             torch.dtype, enum.Enum, types.MappingProxyType, types.ModuleType, types.FunctionType,
             types.BuiltinFunctionType, type, property, types.GenericAlias)


def modules(packages=(engine, kernels)):
    for package in packages:
        for info in pkgutil.walk_packages(package.__path__, package.__name__ + "."):
            yield importlib.import_module(info.name)


def is_immutable(value) -> bool:
    if isinstance(value, IMMUTABLE) or type(value) is object:  # object(): a sentinel
        return True
    if isinstance(value, tuple):
        return all(is_immutable(item) for item in value)
    if dataclasses.is_dataclass(value):
        return value.__dataclass_params__.frozen
    kind = type(value)
    # a definition, not state: a Triton kernel, a torch custom op, a future import, a typing alias
    return kind.__module__.split(".")[0] in ("triton", "__future__", "typing") or kind.__name__ == "CustomOpDef"


def mutable_globals(packages=(engine, kernels)) -> dict[str, str]:
    """"module.name" -> its type, for every mutable global (each object under the module that defines it)."""
    found: dict[int, tuple[str, str]] = {}
    for module in modules(packages):
        for name, value in vars(module).items():
            if name.startswith("__") or is_immutable(value):
                continue
            if callable(value) and getattr(value, "__module__", module.__name__) != module.__name__:
                continue  # imported from where it is defined (a cached function of another module)
            where = f"{module.__name__}.{name}"
            if id(value) not in found or where in PROCESS_WIDE or where in CONSTANT_TABLES:
                found[id(value)] = (where, type(value).__name__)
    return dict(found.values())


def rebound_globals(root: Path = ROOT, packages=("engine", "kernels")) -> dict[str, int]:
    """"module.name" -> the line of each `global name` statement."""
    rebound = {}
    for package in packages:
        for path in sorted((root / package).rglob("*.py")):
            module = ".".join(path.relative_to(root).with_suffix("").parts)
            for node in ast.walk(ast.parse(path.read_text())):
                if isinstance(node, ast.Global):
                    rebound.update({f"{module}.{name}": node.lineno for name in node.names})
    return rebound


def unexplained(found) -> dict:
    return {where: kind for where, kind in found.items() if where not in CONSTANT_TABLES and where not in PROCESS_WIDE}


def test_no_module_holds_mutable_state_outside_the_engine_context():
    assert not unexplained(mutable_globals()), (
        f"module-level mutable state {unexplained(mutable_globals())}: keep it in the engine's context "
        "(engine/context.py), make it immutable (a tuple, a frozenset, a MappingProxyType), or say here "
        "why it is process-wide")


def test_no_function_rebinds_a_global():
    assert not unexplained(rebound_globals())


def test_the_lists_name_only_what_is_there():
    """A global that went (moved into the context, made a tuple) leaves these lists too."""
    names = {f"{module.__name__}.{name}" for module in modules() for name in vars(module)}
    assert not (CONSTANT_TABLES - names) and not (set(PROCESS_WIDE) - names)


@pytest.mark.parametrize("source, caught", [
    ("_SEEN = {}\n", "probe.state._SEEN"), ("_SEEN: list = []\n", "probe.state._SEEN"),
    ("import threading\n_LOCAL = threading.local()\n", "probe.state._LOCAL"),
    ("import functools\n@functools.cache\ndef measured():\n    return 1\n", "probe.state.measured"),
    ("_X = None\ndef f():\n    global _X\n    _X = 1\n", "probe.state._X"),
    ("LIMITS = (1, 2)\nNAMES = frozenset({'a'})\n", None),
])
def test_the_listing_catches_a_new_mutable_global(source, caught, tmp_path, monkeypatch):
    package = tmp_path / "probe"
    package.mkdir()
    (package / "__init__.py").write_text("")
    (package / "state.py").write_text(source)
    monkeypatch.syspath_prepend(str(tmp_path))
    for name in ("probe", "probe.state"):
        monkeypatch.delitem(sys.modules, name, raising=False)  # this case's probe, not the last one's
    probe = importlib.import_module("probe")
    try:
        found = {**unexplained(mutable_globals((probe,))), **unexplained(rebound_globals(tmp_path, ("probe",)))}
    finally:
        for name in ("probe", "probe.state"):
            sys.modules.pop(name, None)
    assert list(found) == ([caught] if caught else [])
