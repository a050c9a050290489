"""`membound chat` / `bench` from the command line: answers once, and every bad input is one
line on stderr with exit code 2 — never a traceback."""
import json

import pytest

from engine.cli import main


def run_cli(capsys, *argv):
    code = main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


def assert_one_line_error(code, err, *needles):
    assert code == 2
    lines = [l for l in err.strip().splitlines() if l.startswith("membound: error:")]
    assert len(lines) == 1, err
    assert "Traceback" not in err
    for n in needles:
        assert n in lines[0], lines[0]


def test_prompt_answers_once_with_statistics(capsys):
    code, out, err = run_cli(capsys, "chat", "--prompt", "Say hello.", "--greedy", "--max-tokens", "8",
                             "--max-context", "512")
    assert code == 0
    assert out.strip()  # the reply
    assert "tok/s" in err and "MBU" in err and "GB/s" in err


def test_the_first_replys_time_to_first_token_leaves_the_setup_out(capsys, monkeypatch):
    """The C++ step's timing against PyTorch's (made once per format) and the conversation's KV cache are
    made before the first reply, not inside its first step: its time to first token (here each of
    those made to take 1 s) is the step's."""
    import re
    import time as clock

    from engine.context import reset_default_context
    from engine.model import cpu_step
    from engine.steps.plain import PlainSteps
    reset_default_context()  # (no format timed yet)
    steps, new_cache = cpu_step.time_steps, PlainSteps.new_cache
    monkeypatch.setattr(cpu_step, "time_steps", lambda model: clock.sleep(1.0) or steps(model))
    monkeypatch.setattr(PlainSteps, "new_cache", lambda *a: clock.sleep(1.0) or new_cache(*a))  # (and the cache's)
    code, _, err = run_cli(capsys, "chat", "--prompt", "Say hello.", "--greedy", "--max-tokens", "2",
                           "--max-context", "256", "--model", "synthetic:smollm2-135m")
    assert code == 0, err
    ttft = re.search(r"TTFT ([\d.,]+) (ms|s)", err)
    assert ttft, err
    assert float(ttft[1].replace(",", "")) * (1e-3 if ttft[2] == "ms" else 1) < 0.5, err


def test_missing_model_file(capsys, tmp_path):
    code, _, err = run_cli(capsys, "chat", "--prompt", "hi", "--model", str(tmp_path / "missing.gguf"))
    assert_one_line_error(code, err, "not found")


def test_corrupt_model_file(capsys, tmp_path):
    bad = tmp_path / "bad.gguf"
    bad.write_bytes(b"GGUF\x03\x00\x00\x00" + b"\x00\xff" * 100)
    code, _, err = run_cli(capsys, "chat", "--prompt", "hi", "--model", str(bad))
    assert_one_line_error(code, err, "bad.gguf")


def test_unsupported_architecture(capsys, tmp_path):
    (tmp_path / "config.json").write_text(json.dumps({"architectures": ["MambaForCausalLM"]}))
    code, _, err = run_cli(capsys, "chat", "--prompt", "hi", "--model", str(tmp_path))
    assert_one_line_error(code, err, "unsupported architecture")


def test_empty_prompt(capsys):
    code, _, err = run_cli(capsys, "chat", "--prompt", "   ")
    assert_one_line_error(code, err, "empty prompt")


@pytest.mark.parametrize("args,needle", [
    (["--temperature", "-1"], "temperature"),
    (["--top-p", "0"], "top-p"),
    (["--top-k", "-3"], "top-k"),
    (["--max-tokens", "0"], "max new tokens"),
    (["--dtype", "fp16"], "fp16"),
])
def test_invalid_settings(capsys, args, needle):
    code, _, err = run_cli(capsys, "chat", "--prompt", "hi", *args)
    assert_one_line_error(code, err, needle)


def test_cuda_without_a_gpu(capsys, monkeypatch):
    import torch
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    code, _, err = run_cli(capsys, "chat", "--prompt", "hi", "--device", "cuda")
    assert_one_line_error(code, err, "cuda")


def test_prompt_longer_than_the_context(capsys):
    code, _, err = run_cli(capsys, "chat", "--prompt", "word " * 400, "--max-context", "128")
    assert_one_line_error(code, err, "context window is 128")


def test_bench_writes_json_with_the_table(capsys, tmp_path):
    path = tmp_path / "b.json"
    code, out, err = run_cli(capsys, "bench", "--model", "synthetic:smollm2-135m", "--prompt-tokens", "8",
                             "--decode-tokens", "4", "--max-context", "64", "--json", str(path))
    assert code == 0
    for row in ("prefill tok/s", "decode tok/s", "TTFT", "achieved GB/s", "peak GB/s", "MBU", "MFU",
                "predicted ceiling"):
        assert row in out
    data = json.loads(path.read_text())
    r = data["results"][0]
    assert r["decode_tokens"] == 4 and 0 < r["mbu"] < 1.5 and r["peak_gbs"] > 0
    assert len(data["steps"]) == 5 and data["steps"][0]["phase"] == "prefill"


def test_interactive_chat_keeps_going_after_a_bad_prompt(capsys, monkeypatch):
    lines = iter(["Name a fruit.", "word " * 300, "/new", "Name a colour.", "/quit"])
    monkeypatch.setattr("builtins.input", lambda prompt="": next(lines))
    code, out, err = run_cli(capsys, "chat", "--greedy", "--max-tokens", "6", "--max-context", "256")
    assert code == 0
    assert err.count("membound: error:") == 1 and "context window" in err  # the long one, and on it went
    assert "(new conversation)" in err
    assert err.count("TTFT") == 2  # two replies
    assert "prompt tokens cached" not in err  # each the first turn of its conversation


def test_chat_speculates_and_says_how_many_guesses_landed(capsys):
    code, out, err = run_cli(capsys, "chat", "--prompt", "Repeat exactly: red green blue, red green blue.",
                             "--greedy", "--max-tokens", "12", "--max-context", "512", "--speculate", "ngram",
                             "--draft-tokens", "3")
    assert code == 0 and out.strip()
    assert "speculation: " in err and "of guesses kept" in err and "tokens per weight read" in err


@pytest.mark.parametrize("args,needle", [
    (["--speculate", "magic"], "--speculate takes"),
    (["--speculate", "ngram:x"], "--speculate takes"),
    (["--draft-tokens", "9"], "draft tokens"),
    (["--speculate", "draft:" + "/nowhere/model.gguf"], "not found"),
])
def test_bad_speculation_is_one_line(capsys, args, needle):
    code, _, err = run_cli(capsys, "chat", "--prompt", "hi", "--max-context", "256", *args)
    assert_one_line_error(code, err, needle)


def test_bench_sweep_speculative_writes_its_results(capsys, tmp_path):
    import torch
    from test_loader import save_hf_folder

    from engine.io.loader import synthetic_weights
    from engine.model.config import ModelConfig
    tiny = ModelConfig(name="tiny", dim=64, n_layers=2, n_heads=4, n_kv_heads=2, ffn_dim=128, vocab_size=300,
                       tied_embeddings=False, max_seq_len=1024)
    save_hf_folder(tmp_path, tiny, synthetic_weights(tiny, torch.float32, "cpu"))
    path = tmp_path / "s.json"
    code, out, err = run_cli(capsys, "bench", "--sweep", "speculative", "--model", str(tmp_path),
                             "--prompts", "1", "--decode-tokens", "4", "--draft-lengths", "2", "--sources",
                             "oracle", "--max-context", "512", "--repeats", "2", "--json", str(path))
    assert code == 0, err
    assert "oracle*" in out and "upper bound" in out and "vs k = 0" in out and "fastest of 2 runs" in out
    payload = json.loads(path.read_text())
    results = payload["results"]
    assert payload["repeats"] == 2
    assert {(r["source"], r["k"], r["sampling"]) for r in results} == {
        (s, k, m) for s, k in (("none", 0), ("oracle", 2)) for m in ("greedy", "sampled")}
    for r in results:
        assert {"decode_tokens_per_s", "acceptance_rate", "mean_accepted"} <= r.keys()
        assert r["decode_tokens_per_s"] > 0
    oracle = next(r for r in results if r["source"] == "oracle" and r["sampling"] == "greedy")
    assert oracle["acceptance_rate"] == 1.0 and oracle["mean_accepted"] == 2.0


def test_models_lists_what_is_on_disk_with_fit_and_ceiling(capsys, tmp_path, monkeypatch):
    import shutil

    from engine.io.default_model import find_default_model
    home = tmp_path / "home"
    for name in ("HF_HUB_CACHE", "HF_HOME", "OLLAMA_MODELS", "LLAMA_CACHE", "XDG_CACHE_HOME", "XDG_CONFIG_HOME"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("HOME", str(home))
    monkeypatch.setenv("OLLAMA_MODELS", str(tmp_path / "no-ollama"))
    mine = tmp_path / "mine"
    mine.mkdir()
    shutil.copyfile(find_default_model(), mine / "smol.gguf")
    (mine / "broken.gguf").write_bytes(b"GGUF\x03\x00\x00\x00")
    code, out, err = run_cli(capsys, "models", "--device", "cpu", "--add-folder", str(mine))
    assert code == 0, err
    lines = out.splitlines()
    smol = next(line for line in lines if line.startswith("smol.gguf"))
    assert "Llama" in smol and "135 M" in smol and "Q4_1" in smol and "fp32" in smol and "tok/s" in smol
    assert smol.rstrip().endswith(str(mine / "smol.gguf"))
    broken = lines.index(next(line for line in lines if line.startswith("broken.gguf")))
    assert lines[broken + 1].strip().startswith("why:") and "3 found, 2 membound can run" in out
    assert any(line.startswith("SmolLM2-135M-Instruct") for line in lines)  # the bundled default model
    code, out, _ = run_cli(capsys, "models", "--device", "cpu", "--supported")  # the folder was remembered
    assert "smol.gguf" in out and "broken.gguf" not in out
    code, _, err = run_cli(capsys, "models", "--add-folder", str(tmp_path / "nowhere"))
    assert_one_line_error(code, err, "is not a folder")


@pytest.mark.parametrize("kind", ["not-gguf", "truncated-header", "unsupported-gguf", "unsupported-hf"])
def test_a_bad_or_unsupported_file_is_refused_before_torch_and_the_bandwidth_probe(tmp_path, kind):
    """The file's header and architecture are read first: the one line comes before torch is
    imported and before the bandwidth probe (~20 s on a CPU), so it answers at once."""
    import subprocess
    import sys
    from pathlib import Path

    import gguf

    if kind == "not-gguf":
        model = tmp_path / "notes.gguf"
        model.write_text("these are not weights")
        needle = "is not a GGUF file"
    elif kind == "truncated-header":
        model = tmp_path / "cut.gguf"
        model.write_bytes(b"GGUF\x03\x00\x00\x00" + b"\x05\x00" * 20)
        needle = "cut.gguf"
    elif kind == "unsupported-gguf":
        model = tmp_path / "mamba.gguf"
        writer = gguf.GGUFWriter(str(model), "mamba")
        writer.add_block_count(1)
        writer.write_header_to_file()
        writer.write_kv_data_to_file()
        writer.write_tensors_to_file()
        writer.close()
        needle = "mamba.gguf: unsupported architecture 'mamba'"
    else:
        model = tmp_path / "mamba-hf"
        model.mkdir()
        (model / "config.json").write_text(json.dumps({"architectures": ["MambaForCausalLM"]}))
        needle = "unsupported architecture 'MambaForCausalLM'"
    code = ("import sys, types\n"  # the probe's module, replaced by one that fails the test if it is used
            "probe = types.ModuleType('engine.hardware.detect')\n"
            "def detect_device(*a, **k): raise SystemExit('the bandwidth probe ran')\n"
            "probe.detect_device = detect_device\n"
            "sys.modules['engine.hardware.detect'] = probe\n"
            "from engine.cli import main\n"
            f"rc = main(['chat', '--prompt', 'hi', '--model', {str(model)!r}])\n"
            "print('torch imported' if 'torch' in sys.modules else 'no torch', rc)\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60,
                         cwd=Path(__file__).resolve().parents[2])
    assert out.stdout.split() == ["no", "torch", "2"], out.stderr
    assert_one_line_error(2, out.stderr, needle)


def test_a_base_model_chats_as_plain_text_and_raw_completes_a_prompt_as_written(capsys, tmp_path, monkeypatch):
    """A GGUF with no chat template and no turn tokens (a base model): the chat says so in one line
    and feeds the conversation as plain text; --raw continues the prompt exactly as written, with
    the BOS its SentencePiece vocabulary asks for: transformers' greedy continuation, token for token."""
    import torch
    from model_files import hf_greedy, tiny_hf, write_gguf
    from test_engine import fake_cpu

    from engine.engine import Engine
    from engine.events import TokenEvent
    from engine.hardware import detect
    from engine.settings import SamplingParams, Settings

    monkeypatch.setattr(detect, "_detect_cpu", lambda measure, report, remeasure=False: fake_cpu())  # no probe here
    torch.manual_seed(0)
    hf = tiny_hf("llama", seed=5, vocab_size=400)
    path = write_gguf(hf, tmp_path / "base.gguf", sentencepiece=True)
    code, out, err = run_cli(capsys, "chat", "--model", str(path), "--prompt", "hello world", "--greedy",
                             "--max-tokens", "6", "--quiet")
    assert code == 0, err
    assert "no chat template in the file (a base model): the conversation is fed as plain text" in err
    assert "base model: plain text, no chat template" in err  # on the model line too
    code, out, err = run_cli(capsys, "chat", "--model", str(path), "--raw", "--prompt", "hello world", "--greedy",
                             "--max-tokens", "6", "--quiet")
    assert code == 0 and out.strip() and "raw completion" in err and "BOS first" in err
    assert "no chat template" not in err.split("raw completion")[1]

    greedy = Settings(max_new_tokens=8, sampling=SamplingParams(greedy=True, temperature=0.0))
    engine = Engine(str(path), hardware=fake_cpu(), settings=greedy)
    prompt = engine.tokenizer.encode("hello world")
    assert prompt[0] == 1 and engine.tokenizer.render_chat([{"role": "user", "content": "hi"}]) == \
        "User: hi\n\nAssistant:"
    ids = [e.token_id for e in engine.complete("hello world") if isinstance(e, TokenEvent) and e.token_id >= 0]
    assert ids == hf_greedy(hf, prompt, 8)
    assert engine.messages == []  # a completion is not a conversation turn


def test_chat_quantises_the_weights_it_is_asked_to(capsys):
    code, out, err = run_cli(capsys, "chat", "--prompt", "Say hello.", "--greedy", "--max-tokens", "6",
                             "--max-context", "256", "--dtype", "bf16", "--weights", "int4", "--group-size", "64")
    assert code == 0 and out.strip()
    header = next(line for line in err.splitlines() if line.startswith("membound ·"))
    summary = next(line for line in err.splitlines() if line.startswith("["))
    assert "bf16 · int4 g64" in header and "bf16 · int4 g64" in summary  # asked for, and what the steps ran


def test_chat_refuses_a_group_size_the_model_cannot_take(capsys):
    code, _, err = run_cli(capsys, "chat", "--prompt", "hi", "--max-context", "256", "--weights", "int4",
                           "--group-size", "128")
    assert_one_line_error(code, err, "group")
