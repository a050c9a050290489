"""Every `membound bench` command README.md lists runs here on the default model, with small token
counts. The commands are read from the README itself, so one added there is covered too: a README
command cannot break unseen. A GPU-only command is checked the way a CPU machine can: as written it
refuses in one line; its other flags then run on the CPU. `--compare llamacpp` runs llama.cpp's
tools, which `make peers` builds before the tests."""
import shlex
from pathlib import Path

import pytest
import torch

from tests.engine.test_cli import assert_one_line_error, run_cli

README = Path(__file__).resolve().parents[2] / "README.md"
# appended to every command (argparse keeps the last value): small token counts, each run a few seconds
SMALL = ("--prompt-tokens", "16", "--decode-tokens", "4", "--repeats", "1", "--eval-tokens", "32",
         "--requests", "8", "--prompts", "1", "--contexts", "32", "--draft-lengths", "2", "--batch-sizes", "1,8",
         "--max-context", "512")
# what a flag's output must show, whatever else the command asks for
PRINTS = {"--compare llamacpp": ("llama-bench",), "--sweep batch": ("aggregate tok/s", "of the roofline"),
          "--compare hf": ("transformers",), "--profile": ("operators",)}


def readme_bench_commands() -> list[list[str]]:
    """The argument lists of the `.venv/bin/membound bench ...` lines in the README's code blocks."""
    commands, in_code = [], False
    for line in README.read_text().splitlines():
        if line.startswith("```"):
            in_code = not in_code
        elif in_code and line.startswith(".venv/bin/membound bench"):
            commands.append(shlex.split(line, comments=True)[1:])
    return commands


COMMANDS = readme_bench_commands()


@pytest.fixture(scope="module")
def loaded_once():
    """The default GGUF read once for all the commands (~5 s of CPU each time: its loading is tested
    in tests/engine/test_loader.py and test_default_model.py); every command still builds its engines."""
    from engine.io import loader
    read, cache = loader.load_gguf, {}

    def load_gguf(path, dtype, device, progress, max_context):
        key = (str(path), dtype, device, max_context)
        if key not in cache:
            cache[key] = read(path, dtype, device, progress, max_context)
        return cache[key]
    loader.load_gguf = load_gguf
    yield
    loader.load_gguf = read


def test_the_readme_lists_the_bench_commands():
    sweeps = {argv[argv.index("--sweep") + 1] for argv in COMMANDS if "--sweep" in argv}
    assert sweeps == {"weights", "precision", "attention", "kv", "batch", "speculative", "overhead"}
    assert any("--workload" in argv for argv in COMMANDS) and any("llamacpp" in argv for argv in COMMANDS)


@pytest.mark.parametrize("argv", COMMANDS, ids=" ".join)
def test_a_readme_bench_command_runs(argv, capsys, monkeypatch, tmp_path, loaded_once):
    if "overhead" in argv:
        # torch.compile of a whole model takes ~1 min a shape on 2 cores: the sweep runs here on the default
        # model alone, its captured step uncompiled (tests/engine/test_graphs.py checks the compiled one)
        from engine.bench import overhead
        monkeypatch.setattr(overhead, "CPU_SHAPES", ("default",))
        monkeypatch.setattr(torch, "compile", lambda fn, **kwargs: fn)
    if argv[argv.index("--device") + 1 if "--device" in argv else 0] == "cuda" and not torch.cuda.is_available():
        code, _, err = run_cli(capsys, *argv, *SMALL)
        assert_one_line_error(code, err, "GPU")
        argv = [*argv, "--device", "cpu", "--model", "default"]  # the rest of its flags, on this machine
    path = tmp_path / "bench.json"
    code, out, err = run_cli(capsys, *argv, *SMALL, "--json", str(path))
    assert code == 0, err
    assert "Traceback" not in err and out.strip()
    assert path.is_file() and path.stat().st_size > 0
    line = " ".join(argv)
    for flag, shown in PRINTS.items():
        assert flag not in line or all(text in out for text in shown), (flag, out)
    if "--sweep batch" in line and "llamacpp" in line:
        assert "llama-batched-bench" in out and "membound/llama.cpp" in out
