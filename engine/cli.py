"""`membound` command line: the app (default), `chat` (terminal chat), `bench`, `models` (the models on
this machine) and `attach` (a running vLLM / SGLang / llama.cpp server; `--headless` here, the window
in app/).
Every known failure prints one line (`membound: error: …`) and exits 2; --debug shows tracebacks."""
from __future__ import annotations

import argparse
import sys

from engine.protocol import default_dtype

USER_ERRORS: tuple[type[BaseException], ...] = (ValueError, FileNotFoundError, PermissionError, MemoryError)


def _cpu_step_note(engine) -> None:
    """On a CPU, one line when the C++ decode step could not be built (the reason); nothing otherwise."""
    if engine.device == "cpu":
        from engine.model.cpu_step import fallback_line, model_refusal
        if line := fallback_line(engine.context):
            print(line, file=sys.stderr)
        elif why := model_refusal(engine.cfg):  # Gemma's and Phi's layers
            print(f"membound: {why}", file=sys.stderr)


def _progress_printer(stream=sys.stderr):
    last = {"msg": ""}

    def progress(fraction: float, message: str) -> None:
        if not stream.isatty():
            if message.split(" ")[0] != last["msg"].split(" ")[0]:
                print(f"… {message}", file=stream, flush=True)
            last["msg"] = message
            return
        bar = "#" * int(20 * fraction)
        print(f"\r[{bar:<20}] {message[:60]:<60}", end="", file=stream, flush=True)
        if fraction >= 1.0:
            print(file=stream)
    return progress


def add_model_args(p: argparse.ArgumentParser, default_dtype: str | None = None) -> None:
    p.add_argument("--model", default="default", help="default | PATH.gguf | HF model folder | synthetic:SHAPE")
    p.add_argument("--device", default="cpu", choices=["cpu", "cuda"])
    p.add_argument("--dtype", default=default_dtype, choices=["fp32", "bf16", "fp16"],
                   help="compute dtype (default: fp32 on cpu, bf16 on cuda)")
    p.add_argument("--max-context", type=int, default=4096, help="KV cache positions reserved (default 4096)")


def add_weight_args(p: argparse.ArgumentParser) -> None:
    from engine.settings import GROUP_SIZES, WEIGHT_FORMATS
    p.add_argument("--weights", choices=WEIGHT_FORMATS, default="fp",
                   help="weight storage: the dtype itself, int8 per channel, int4 group-wise (default fp)")
    p.add_argument("--group-size", type=int, choices=GROUP_SIZES, default=GROUP_SIZES[0],
                   help=f"int4 group size (default {GROUP_SIZES[0]})")


def add_attention_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--attention", choices=["flash", "naive"], default="flash",
                   help="flash: fused, scores never in memory (default); naive: score matrix materialised")
    p.add_argument("--kv-layout", choices=["contiguous", "paged", "off"], default="contiguous",
                   help="KV cache: a max-length buffer (default), blocks from a pool, or none (recompute)")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="membound", description="Watch LLM decoding hit the memory wall.")
    parser.add_argument("--debug", action="store_true", help="show tracebacks")
    parser.add_argument("--screenshot", metavar="FILE", help="(app) answer a prompt, save a PNG of the window, exit")
    parser.add_argument("--prompt", help="(app) prompt to send at start")
    parser.add_argument("--engine-thread", action="store_true",
                        help="(app) run the engine on a thread of the app's process, not in its own process")
    parser.add_argument("--tour", metavar="FILE", help="(app) run a guided tour: a TOML file, or 'default'")
    parser.add_argument("--lang", choices=["en", "es"],
                        help="(app) the language of the window and the tour: en or es (default: the system's)")
    parser.add_argument("--autoplay", action="store_true", help="(app) the tour steps on by itself")
    parser.add_argument("--check", action="store_true",
                        help="(with --tour) no window: check each step's direction against the engine on this "
                             "machine, printing its figure and verdict (a step that does not hold is left out "
                             "of the tour here)")
    parser.add_argument("--keep-decoding", action="store_true",
                        help="(app) the model keeps talking until stopped (Ctrl+K in the app)")
    parser.add_argument("--record", metavar="FILE", help="(app) record the session to FILE (membound replay plays it)")
    sub = parser.add_subparsers(dest="command")

    replay = sub.add_parser("replay", help="play a recorded session in the app (no engine, no torch)")
    replay.add_argument("file", nargs="?", default="default",
                        help="a recording (membound --record FILE), or 'default': the bundled tour")
    replay.add_argument("--speed", type=float, default=1.0, help="1, 2, 4, … times real time (default 1)")
    replay.add_argument("--lang", choices=["en", "es"], default=argparse.SUPPRESS,
                        help="the window's language (default: the system's)")
    replay.add_argument("--screenshot", dest="replay_screenshot", metavar="PNG",
                        help="play it all at once, save a PNG of the window, exit")
    replay.add_argument("--export", metavar="DIR",
                        help="play it all at once, export the window, plots, steps CSV and report into DIR, exit")

    chat = sub.add_parser("chat", help="chat in the terminal")
    add_model_args(chat)
    chat.add_argument("--prompt", dest="chat_prompt", help="answer this once and exit")
    chat.add_argument("--raw", action="store_true",
                      help="complete each prompt exactly as written: no chat template, no conversation, BOS as "
                           "the model file says (for base models)")
    chat.add_argument("--greedy", action="store_true", help="always take the most likely token")
    chat.add_argument("--max-tokens", type=int, default=256)
    chat.add_argument("--temperature", type=float, default=0.7)
    chat.add_argument("--top-p", type=float, default=0.95)
    chat.add_argument("--top-k", type=int, default=0)
    chat.add_argument("--seed", type=int, default=None)
    chat.add_argument("--no-kv-cache", action="store_true", help="recompute the whole context every step")
    chat.add_argument("--speculate", default="off", metavar="SOURCE",
                      help="speculative decoding: off, ngram (prompt lookup), draft (the model itself at "
                           "--draft-weights), draft:MODEL (default, a .gguf, an HF folder, synthetic:SHAPE), "
                           "or oracle (the model's own greedy reply computed first: the upper bound)")
    chat.add_argument("--draft-tokens", type=int, default=4, help="tokens guessed per step, 1..8 (default 4)")
    chat.add_argument("--draft-weights", choices=["fp", "int8", "int4"], default="int4",
                      help="the draft model's weights (default int4)")
    chat.add_argument("--eager", action="store_true", help="no captured decode step (CUDA graph) even where offered")
    add_weight_args(chat)
    add_attention_args(chat)
    chat.add_argument("--quiet", action="store_true", help="no per-reply statistics line")

    bench = sub.add_parser("bench", help="measure prefill and decode against the device's peak")
    add_model_args(bench)
    bench.add_argument("--prompt-tokens", type=int, default=128)
    bench.add_argument("--decode-tokens", type=int, default=128)
    bench.add_argument("--repeats", type=int, default=1, help="runs of the workload; the best is reported")
    bench.add_argument("--compare", choices=["hf", "llamacpp"],
                       help="also run transformers' generate on the same model (hf), or llama.cpp's llama-server on "
                            "the same GGUF with the same threads, interleaved with ours (llamacpp; `make peers` builds it)")
    bench.add_argument("--json", metavar="FILE", help="write the figures as JSON")
    bench.add_argument("--profile", action="store_true",
                       help="(cpu) where one decode step's time goes, per setting: the C++ step's phases with "
                            "their bytes at peak vs the time taken, and PyTorch's biggest operators")
    bench.add_argument("--no-kv-cache", action="store_true")
    add_weight_args(bench)
    bench.add_argument("--sweep", choices=["weights", "precision", "attention", "kv", "batch", "speculative",
                                           "overhead"],
                       help="weights: fp, int8 and int4 in one run, side by side, with perplexity and top-1 agreement; "
                            "precision: fp32, bf16, int8 and int4 (bf16 activations), each against the one before; "
                            "attention: naive vs flash over contexts (prefill and decode); kv: contiguous, paged "
                            "and no cache over contexts 128..4096; batch: batch sizes 1..64 (engine/bench/batch.py); "
                            "speculative: each draft source at k = 0, 2, 4, 8, greedy and sampled "
                            "(engine/bench/speculative.py); overhead: eager vs captured decode steps, batch 1, "
                            "a few model shapes (engine/bench/overhead.py)")
    add_attention_args(bench)
    from engine.bench.batch import add_batch_args  # --batch-sizes, --workload, --policy, --users, --requests
    add_batch_args(bench)
    from engine.bench.speculative import add_speculative_args  # --draft-model, --draft-weights, --draft-lengths
    add_speculative_args(bench)
    bench.add_argument("--contexts", metavar="N,N,...",
                       help="context lengths for --sweep attention/kv (default: kv 128..4096; attention "
                            "1024,4096 on cpu, 1024,4096,8192 on cuda)")
    bench.add_argument("--eval-tokens", type=int, default=2048,
                       help="tokens of evaluation text for the sweep's perplexity (0: skip quality)")
    attach = sub.add_parser("attach", help="the dashboard on a running vLLM, SGLang or llama.cpp server")
    attach.add_argument("url", help="the server's address, e.g. http://localhost:8000")
    attach.add_argument("--gpu", metavar="NAME",
                        help="the server's GPU, for MBU/MFU (a datasheet entry, e.g. H100); default: NVML "
                             "when the server runs on this machine")
    attach.add_argument("--api-key", help="sent as a Bearer token (a server started with --api-key)")
    attach.add_argument("--interval", type=float, default=1.0, help="seconds between scrapes (default 1)")
    attach.add_argument("--headless", action="store_true", help="no window: print each scrape")
    attach.add_argument("--seconds", type=float, default=10.0, help="(headless) how long to scrape (default 10)")
    attach.add_argument("--json", metavar="FILE", help="(headless) write the series, one record per scrape")
    roof = sub.add_parser("roof", help="this machine's measured roofs (read bandwidth, FLOP/s): when and how measured")
    roof.add_argument("--measure", action="store_true", help="measure them again now (run on a quiet machine)")
    models = sub.add_parser("models", help="list the models already on this machine (nothing is downloaded)")
    models.add_argument("--folder", action="append", default=[], metavar="DIR",
                        help="also look in DIR (repeatable; --add-folder remembers one)")
    models.add_argument("--add-folder", metavar="DIR", help="remember DIR for every later listing (and the app's)")
    models.add_argument("--device", default="auto", choices=["auto", "cpu", "cuda"],
                        help="the device to judge fit and ceiling for (default: a GPU if there is one)")
    models.add_argument("--dtype", choices=["fp32", "bf16", "fp16"],
                        help="the precision it would run at (default: fp32 on cpu, bf16 on cuda)")
    models.add_argument("--supported", action="store_true", help="only the models membound can run")
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        if args.command == "chat":
            return run_chat(args)
        if args.command == "attach":
            if not args.headless:
                raise ValueError("the attach window needs the desktop app (`membound attach URL`); "
                                 "--headless scrapes in the terminal")
            from engine.attach.headless import run_headless
            return run_headless(args)
        if args.command == "models":
            return run_models(args)
        if args.command == "roof":
            return run_roof(args)
        if args.command == "replay":
            raise ValueError("a replay plays in the desktop app: run `membound replay FILE`")
        if args.command == "bench":
            from engine.bench.run import run_bench
            return run_bench(args, _progress_printer())
        if args.check:
            if not args.tour:
                raise ValueError("--check checks a tour: give --tour FILE (or --tour default)")
            from engine.tour_check import run_tour_check
            return run_tour_check(args)
        return run_app(args)
    except KeyboardInterrupt:
        print(file=sys.stderr)
        return 130
    except USER_ERRORS as e:
        if args.debug:
            raise
        print(f"membound: error: {_one_line(e)}", file=sys.stderr)
        return 2
    except Exception as e:  # anything else is a bug, but still one line unless --debug
        if args.debug:
            raise
        print(f"membound: error: {type(e).__name__}: {_one_line(e)} (run with --debug for the traceback)",
              file=sys.stderr)
        return 1


def _one_line(e: BaseException) -> str:
    text = str(e).strip() or type(e).__name__
    return text.splitlines()[0]


def run_app(args) -> int:
    """The engine has no GUI: without a subcommand it chats in the terminal. (`membound`, the
    installed command, is app.launcher, which opens the desktop app instead.)"""
    if args.screenshot:
        raise ValueError("--screenshot needs the desktop app: run `membound --screenshot FILE`")
    return main(["chat"])


def run_chat(args) -> int:
    from engine.io.check import check_model
    check_model(args.model)  # header and architecture first: a bad file is refused before torch is imported
    from engine.engine import Engine
    from engine.events import DoneEvent, SettingsApplied, TokenEvent
    from engine.hardware.spec import describe
    from engine.settings import SamplingParams, Settings

    sampling = SamplingParams(temperature=0.0 if args.greedy else args.temperature, top_p=args.top_p,
                              top_k=args.top_k, seed=args.seed, greedy=args.greedy)
    dtype = args.dtype or default_dtype(args.device)
    speculate, draft_model = parse_speculate(args.speculate)
    settings = Settings(dtype=dtype, kv_layout=args.kv_layout, attention=args.attention,
                        kv_cache=False if args.no_kv_cache else None, max_new_tokens=args.max_tokens,
                        sampling=sampling, speculate=speculate, draft_tokens=args.draft_tokens,
                        draft_model=draft_model, draft_weights=args.draft_weights, cuda_graphs=not args.eager,
                        weights=args.weights, group_size=args.group_size)
    settings.validate(args.device)
    if args.chat_prompt is not None and not args.chat_prompt.strip():
        raise ValueError("empty prompt: give --prompt some text")
    progress = _progress_printer()
    engine = Engine(args.model, device=args.device, dtype=dtype, max_context=args.max_context,
                    progress=progress, settings=settings)
    print(f"membound · {engine.loaded.label} · {engine.settings.label} · {describe(engine.hardware)}", file=sys.stderr)
    _cpu_step_note(engine)
    if engine.device == "cpu":  # (timed now, not inside the first reply's steps: its time to first token)
        from engine.model import cpu_step
        draft = engine.speculative.draft
        for model in [engine.model] + ([draft.model] if draft is not None else []):
            cpu_step.prepare(model)
    note = getattr(engine.tokenizer, "template_note", "")
    if args.raw:
        bos = getattr(engine.tokenizer, "add_bos", False) and getattr(engine.tokenizer, "bos_id", None) is not None
        print(f"membound: raw completion: each prompt continued exactly as written, "
              f"{'BOS first' if bos else 'no BOS'} (as the model file says)", file=sys.stderr)
    elif note:
        print(f"membound: {note}", file=sys.stderr)

    def turn(text: str) -> None:
        metrics = []
        for event in (engine.complete(text) if args.raw else engine.chat(text)):
            if isinstance(event, TokenEvent):
                print(event.text, end="", flush=True)
            elif isinstance(event, DoneEvent):
                print()
                if not args.quiet:
                    print(_turn_summary(event, metrics, engine), file=sys.stderr)
            elif isinstance(event, SettingsApplied):
                pass
            else:
                metrics.append(event)

    if args.chat_prompt is not None:
        turn(args.chat_prompt)
        return 0
    print("type a message; /new starts over, /quit or Ctrl-D leaves", file=sys.stderr)
    while True:
        try:
            text = input("you> ")
        except EOFError:
            print(file=sys.stderr)
            return 0
        if text.strip() in ("/quit", "/exit"):
            return 0
        if text.strip() == "/new":
            engine.reset()
            print("(new conversation)", file=sys.stderr)
            continue
        if not text.strip():
            continue
        try:
            turn(text)
        except USER_ERRORS as e:  # a bad prompt loses nothing: the conversation stays
            print(f"membound: error: {_one_line(e)}", file=sys.stderr)


def run_roof(args) -> int:
    """The CPU roof every front end measures against (engine/hardware/roof.py), from the cache or now."""
    from engine.hardware.probe import cache_file, cpu_roof, measured_busy
    roof = cpu_roof(remeasure=args.measure, progress=lambda message: print(f"… {message}", file=sys.stderr))
    print(roof.describe())
    print(f"machine: {roof.machine}")
    if roof.load_average is not None:
        print(f"load average when measured: {roof.load_average:.2f}"
              + (f"; other processes used {roof.other_cores:.2f} cores during the read probe"
                 if roof.other_cores is not None else ""))
    print(f"cached in {cache_file()} (membound roof --measure measures again)")
    if measured_busy(roof):
        print("measured while other work ran (it reads low): the first start on a quiet machine measures again")
    return 0


def parse_speculate(value: str) -> tuple[str, str]:
    """--speculate: (Settings.speculate, Settings.draft_model). 'draft' alone drafts with the model itself."""
    source, _, model = value.partition(":")
    if source not in ("off", "ngram", "oracle", "draft") or (model and source != "draft"):
        raise ValueError(f"--speculate takes off, ngram, oracle, draft or draft:MODEL, got {value!r}")
    return source, model or "self"


def run_models(args) -> int:
    """The models on disk, one row each, with their fit and ceiling on this device."""
    from engine.hardware.ceilings import device_chip, fit_on
    from engine.hardware.detect import detect_device
    from engine.hardware.spec import describe
    from engine.io.discovery import COLUMNS, add_user_folder, discover, row_cells

    if args.add_folder:
        from pathlib import Path
        if not Path(args.add_folder).expanduser().is_dir():
            raise ValueError(f"--add-folder: {args.add_folder} is not a folder")
        add_user_folder(args.add_folder)
    spec = detect_device(args.device)
    dtype = args.dtype or ("bf16" if spec.kind == "cuda" else "fp32")
    chip = device_chip(spec)
    found = [m for m in discover(args.folder) if m.supported or not args.supported]
    print(f"{describe(spec)} · weights at {dtype}")
    if not found:
        print("no models found (HF hub cache, LM Studio, llama.cpp, Ollama, your folders: --folder DIR)",
              file=sys.stderr)
        return 0
    # each row's columns, "runs" (yes/no) and the path to open; the reason a model cannot run below it
    header = [c for c in COLUMNS if c != "supported"] + ["runs", "path"]
    lines = [header]
    for model in found:
        cells = dict(zip(COLUMNS, row_cells(model, fit_on(model.cfg, model.n_params, chip, dtype))))
        lines.append([cells[c] for c in COLUMNS if c != "supported"] + ["yes" if model.supported else "no", model.path])
    widths = [max(len(line[i]) for line in lines) for i in range(len(header) - 1)]
    for n, line in enumerate(lines):
        print("  ".join(cell.ljust(w) for cell, w in zip(line, widths)) + "  " + line[-1])
        if n and not found[n - 1].supported:
            print(f"    why: {found[n - 1].reason}")
    usable = sum(m.supported for m in found)
    print(f"{len(found)} found, {usable} membound can run: membound chat --model PATH")
    return 0


def _turn_summary(done, metrics, engine) -> str:
    from engine.metrics import DECODE_PHASES, reply_figures, speculation_summary
    parts = [f"{done.n_new_tokens} tokens ({done.reason})", done.ttft_note]
    steps = [m for m in metrics if hasattr(m, "step_s")]  # the StepMetrics among the events
    figures = reply_figures(steps)  # the window sums a reply up the same way
    if figures is not None:
        parts += [f"decode {figures.tokens_per_s:.1f} tok/s", f"{figures.achieved_gbs:.1f} GB/s (model)",
                  f"MBU {100 * figures.mbu:.0f}% of {figures.peak_gbs:.1f} GB/s",
                  f"ceiling {figures.ceiling_tokens_per_s:.0f} tok/s"]
        decode = [m for m in steps if m.phase in DECODE_PHASES]
        parts += speculation_summary(decode)
        parts += sorted({m.settings_label for m in decode if m.settings_label})  # what the steps ran
    if any(m.above_roof for m in steps):  # shown, never absorbed into the peak (engine/hardware/roof.py)
        from engine.hardware.roof import ABOVE_ROOF
        parts.append(ABOVE_ROOF)
    return "[" + " · ".join(parts) + "]"


if __name__ == "__main__":
    sys.exit(main())
