"""Every name our code reads off one of our own modules exists: `from engine.x import y` and
`alias.name` where `alias` is a module of engine/ or kernels/ (bound by `import ... as` or `from ...
import module`). Many such reads sit in branches only a GPU takes, which CPU tests never run: the
first GPU run found `kernel_registry.enabled` (a module-level function the per-engine context had
replaced) raising on every batched step."""
from __future__ import annotations

import ast
import importlib
import types
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
OURS = ("engine", "kernels")


def _module(name: str):
    try:
        return importlib.import_module(name)
    except ImportError:
        return None


def _resolve(module: str, name: str):
    """What `from module import name` binds, or None where nothing does."""
    mod = _module(module)
    if mod is not None and hasattr(mod, name):
        return getattr(mod, name)
    return _module(f"{module}.{name}")


def missing_names(source: str, filename: str) -> list[str]:
    tree = ast.parse(source, filename)
    aliases: dict[str, types.ModuleType] = {}
    problems = []
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.level == 0 and (node.module or "").split(".")[0] in OURS:
            for alias in node.names:
                found = _resolve(node.module, alias.name)
                if found is None:
                    problems.append(f"{filename}:{node.lineno}: {node.module} has no {alias.name}")
                elif isinstance(found, types.ModuleType):
                    aliases[alias.asname or alias.name] = found
        elif isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name.split(".")[0] in OURS and alias.asname:
                    aliases[alias.asname] = importlib.import_module(alias.name)
    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and node.value.id in aliases:
            mod = aliases[node.value.id]
            if not hasattr(mod, node.attr) and _module(f"{mod.__name__}.{node.attr}") is None:
                problems.append(f"{filename}:{node.lineno}: {mod.__name__} has no {node.attr}")
    return problems


def test_every_name_read_off_our_modules_exists():
    files = sorted(p for d in ("engine", "kernels", "scripts") for p in (ROOT / d).rglob("*.py"))
    assert len(files) > 50
    problems = [p for f in files for p in missing_names(f.read_text(encoding="utf-8"), str(f.relative_to(ROOT)))]
    assert problems == []


def test_a_name_that_is_gone_is_found():
    # the first GPU run's bug, as it was written
    source = ("def paged_kernel_enabled() -> bool:\n"
              "    from kernels import registry as kernel_registry\n"
              "    return kernel_registry.enabled('paged')\n")
    assert missing_names(source, "old.py") == ["old.py:3: kernels.registry has no enabled"]
    assert missing_names("from engine.context import no_such_thing\n", "x.py") == [
        "x.py:1: engine.context has no no_such_thing"]
