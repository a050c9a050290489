"""Responsiveness benchmark (not a test): while the model decodes flat out inside the app, how late
does a 10 ms QTimer fire (the GUI event loop's latency), and how fast does the engine decode
compared with the same engine headless on the same conversation?

    QT_QPA_PLATFORM=offscreen python -m app.gui_bench [--model default] [--tokens 128] [--replies 2]
                                                       [--dtype fp32|bf16] [--weights fp|int8|int4]

Prints one JSON object: timer lateness p50/p95/max (ms), decode tok/s in the app and headless,
and their ratio. Headless runs the app's conversation (the same prompts, greedy, the same budget) on
one engine on this thread, each reply right after the app's (the window idle meanwhile), so the two
decode at the same contexts in the same minute of a shared machine; the ratio is the mean of the
replies' ratios. Both sides first decode one untimed reply (--warmup-replies): the headless engine is
warmed at its load, and the app's first reply was otherwise its engine's first. `app_over_bench` is
the ratio against `membound bench`'s shorter 32-token prompt, for comparison. The issue's bar: p95 lateness < 50 ms, ratio >= 0.90. --dtype/--weights set the
precision of both (one per run: the app's ratios between precisions are those of separate runs).

    QT_QPA_PLATFORM=offscreen python -m app.gui_bench --attach URL [--replies 2]

measures the same lateness with the window attached to a running server (docs/attach.md), while
its replies stream and its /metrics is scraped."""
from __future__ import annotations

import argparse
import json
import sys
import time

PROMPT = ("Write a long, detailed explanation of how a transformer language model generates text one "
          "token at a time, and why each new token needs every weight of the model to be read from memory.")


PROMPTS = (PROMPT, "Go on, in more detail.")  # the app's replies, in turn: reply i answers PROMPTS[min(i, 1)]


def decode_tokens_per_s(steps) -> float | None:
    """A reply's decode rate: wall clock from its first decode step's end to its last's (the host's own
    time between steps counts, as it does in `membound bench`); None for fewer than two steps."""
    decode = [s for s in steps if getattr(s, "phase", None) == "decode"]  # StepMetrics among other events
    if len(decode) > 1 and decode[-1].t_s > decode[0].t_s:
        return (len(decode) - 1) / (decode[-1].t_s - decode[0].t_s)
    return None


class Headless:
    """The app's conversation without the app: one engine on this thread, reply by reply (PROMPTS,
    greedy, the same token budget, through `Engine.chat`), so each reply decodes at the contexts the
    app's did (the app's second reply starts ~210 tokens in)."""

    def __init__(self, model: str, tokens: int, dtype: str = "fp32", weights: str = "fp"):
        from engine.bench.prompts import bench_prompt_ids
        from engine.bench.run import run_ours
        from engine.engine import Engine
        from engine.settings import SamplingParams, Settings

        self.tokens = tokens
        self.engine = Engine(model, dtype=dtype, settings=Settings(dtype=dtype, weights=weights, max_new_tokens=tokens,
                                                                   sampling=SamplingParams(greedy=True)))
        run_ours(self.engine, bench_prompt_ids(self.engine.tokenizer, 32), 8)  # warm-up (it resets the conversation)

    def reply(self, i: int) -> float | None:
        """Decode tok/s of the conversation's reply i (replies are asked in turn, from 0)."""
        return decode_tokens_per_s(list(self.engine.chat(PROMPTS[min(i, 1)])))

    def bench(self) -> float:
        """`membound bench`'s workload: a 32-token prompt and `tokens` decoded (it ends at 160); resets."""
        from engine.bench.prompts import bench_prompt_ids
        from engine.bench.run import run_ours
        result, _ = run_ours(self.engine, bench_prompt_ids(self.engine.tokenizer, 32), self.tokens)
        return result.decode_tokens_per_s


def paired_ratios(app: list, headless: list) -> dict:
    """The app's and headless rates reply by reply (None: a reply too short to time), each reply's
    ratio, and their mean: the app over headless."""
    pairs = [(a, h) for a, h in zip(app, headless) if a is not None and h]
    ratios = [a / h for a, h in pairs]
    return {"app_decode_tokens_per_s_per_reply": app, "headless_decode_tokens_per_s_per_reply": headless,
            "headless_decode_tokens_per_s": sum(h for _, h in pairs) / len(pairs) if pairs else float("nan"),
            "app_over_headless_per_reply": ratios,
            "app_over_headless": sum(ratios) / len(ratios) if ratios else float("nan")}


def thread_activity() -> dict[str, tuple[int, float]]:
    """Per thread name of this process (Linux; {} elsewhere): its context switches so far (a
    voluntary one is the thread going to sleep: the count is how often it woke up) and its CPU seconds."""
    import os
    activity: dict[str, tuple[int, float]] = {}
    try:
        tasks = os.listdir("/proc/self/task")
        tick_s = 1 / os.sysconf("SC_CLK_TCK")
    except (OSError, ValueError):
        return activity
    for tid in tasks:
        try:
            with open(f"/proc/self/task/{tid}/comm") as file:
                name = file.read().strip()
            with open(f"/proc/self/task/{tid}/status") as file:
                switches = sum(int(line.split(":")[1]) for line in file if "ctxt_switches" in line)
            with open(f"/proc/self/task/{tid}/stat") as file:
                fields = file.read().rsplit(")", 1)[1].split()
            cpu_s = (int(fields[11]) + int(fields[12])) * tick_s  # utime, stime (fields 14, 15 of stat)
        except (OSError, ValueError, IndexError):
            continue
        n, cpu = activity.get(name, (0, 0.0))
        activity[name] = (n + switches, cpu + cpu_s)
    return activity


def lateness_ms(lateness, percentile: float) -> float:
    """A percentile of the probe's lateness samples; nan where it had none (a probe slower than the replies)."""
    import numpy as np
    return float(np.percentile(lateness, percentile)) if len(lateness) else float("nan")


class LatenessProbe:
    """A 10 ms QTimer and how late each of its ticks came (ms): the GUI event loop's latency.
    `counting`: whether a tick counts (e.g. only while a reply streams)."""

    def __init__(self, parent=None, counting=lambda: True, interval_ms: int = 10):
        from PySide6.QtCore import QElapsedTimer, QTimer
        self.lateness_ms: list[float] = []
        self._clock, self._timer = QElapsedTimer(), QTimer(parent)
        self._timer.setInterval(interval_ms)
        self._timer.timeout.connect(self._tick)
        self._interval_ms, self._counting, self._due_ms = interval_ms, counting, float(interval_ms)

    def _tick(self) -> None:
        now_ms = self._clock.nsecsElapsed() / 1e6
        if self._counting():
            self.lateness_ms.append(max(0.0, now_ms - self._due_ms))
        self._due_ms = now_ms + self._interval_ms

    def start(self) -> None:
        self._clock.start()
        self._due_ms = float(self._interval_ms)
        self._timer.start()

    def stop(self) -> None:
        self._timer.stop()


def in_app(model: str, tokens: int, replies: int, engine_process: bool = True, dtype: str = "fp32",
           weights: str = "fp", probe_ms: int = 10, settle_s: float = 1.0, after_reply=None,
           warmup_replies: int = 0) -> dict:
    """The app's replies, `settle_s` after the model is ready (a person types the first prompt once the
    window has drawn it; the load's last layouts land in that time). after_reply(i), if given, runs on
    this thread after reply i with the window idle (the headless reply); its results are returned too.
    The first `warmup_replies` replies (each followed by its after_reply) are not counted: both sides
    then measure engines that have decoded a reply, not the app's cold one against a warmed headless."""
    import numpy as np
    from PySide6.QtCore import QEventLoop
    from PySide6.QtWidgets import QApplication

    from app.plots.style import configure_pyqtgraph
    from app.window import MainWindow
    from engine.metrics import reply_figures
    from engine.settings import SamplingParams, Settings

    app = QApplication.instance() or QApplication(sys.argv[:1])
    configure_pyqtgraph()
    window = MainWindow(model=model, settings=Settings(dtype=dtype, weights=weights, max_new_tokens=tokens,
                                                      sampling=SamplingParams(greedy=True)),
                        engine_process=engine_process)
    window.resize(1600, 960)
    window.show()
    loop = QEventLoop()
    window.model_ready.connect(lambda _info: loop.quit())
    loop.exec()

    if settle_s > 0:
        from PySide6.QtCore import QTimer
        settle = QEventLoop()
        QTimer.singleShot(int(settle_s * 1000), settle.quit)
        settle.exec()

    probe = LatenessProbe(counting=lambda: window.replying, interval_ms=probe_ms)
    decode_rates, figures, contexts, after = [], [], [], []
    gui_cpu_s = wall_s = 0.0
    activity = {}
    for i in range(warmup_replies):  # untimed, on both sides
        warm_loop = QEventLoop()
        window.reply_finished.connect(warm_loop.quit)
        window.send(PROMPTS[min(i, 1)])
        warm_loop.exec()
        window.reply_finished.disconnect(warm_loop.quit)
        if after_reply is not None:
            after_reply(i)
    for i in range(warmup_replies, warmup_replies + replies):
        activity0 = thread_activity()
        done_loop = QEventLoop()
        window.reply_finished.connect(done_loop.quit)
        cpu0, wall0 = time.process_time(), time.monotonic()
        probe.start()
        window.send(PROMPTS[min(i, 1)])
        done_loop.exec()
        gui_cpu_s += time.process_time() - cpu0  # every thread of the app's process
        wall_s += time.monotonic() - wall0
        probe.stop()
        window.reply_finished.disconnect(done_loop.quit)
        for name, (n, cpu) in thread_activity().items():  # while the replies streamed
            n0, cpu0_s = activity0.get(name, (0, 0.0))
            total_n, total_cpu = activity.get(name, (0, 0.0))
            activity[name] = (total_n + n - n0, total_cpu + cpu - cpu0_s)
        figures.append(reply_figures(window.reply_steps))  # as the reply's summary line says it
        decode = [step for step in window.reply_steps if step.phase == "decode"]
        decode_rates.append(decode_tokens_per_s(decode))
        if decode:
            contexts.append([decode[0].context_len, decode[-1].context_len])
        if after_reply is not None:
            after.append(after_reply(i))
    frames = window.plots.frames_drawn
    window.close()
    lateness = np.array(probe.lateness_ms)
    return {"timer_lateness_ms_p50": lateness_ms(lateness, 50),
            "timer_lateness_ms_p95": lateness_ms(lateness, 95),
            "timer_lateness_ms_max": lateness_ms(lateness, 100), "timer_samples": len(lateness),
            "app_decode_tokens_per_s": float(np.mean([r for r in decode_rates if r is not None])),
            "app_decode_tokens_per_s_per_reply": decode_rates, "after_reply": after, "frames_drawn": frames,
            "app_decode_contexts": contexts,  # per reply: the context at its first and last decode step
            "app_decode_mbu": [f.mbu for f in figures if f is not None],  # per reply, against the roof
            "app_peak_gbs": [f.peak_gbs for f in figures if f is not None],
            "frames_per_s": frames / wall_s if wall_s else 0.0,
            # CPU the app's own process took while replies streamed, in cores (with the engine in its
            # own process: the GUI's share of the machine; on a thread: the engine's too)
            "app_process_cores": gui_cpu_s / wall_s if wall_s else 0.0,
            # how often each of the app's threads woke up a second while replies streamed, and its share of
            # a core (the bench's own 10 ms probe is on the main thread, "python": ~100 wake-ups a second)
            "thread_wakeups_per_s": {name: round(n / wall_s, 1) for name, (n, _) in sorted(activity.items()) if n}
            if wall_s else {},
            "thread_cores": {name: round(cpu / wall_s, 3) for name, (n, cpu) in sorted(activity.items()) if n}
            if wall_s else {}}


def in_app_users(model: str, users: int, seconds: float, dtype: str = "fp32", weights: str = "fp",
                 engine_process: bool = True) -> dict:
    """`users` simulated users served in the window (the engine in its own process, as the app runs it;
    on a thread of this one with engine_process=False) for `seconds`: the aggregate tok/s the serving
    panel plots, over the samples with every user's request running (the first third of the run left
    out: the batch filling up)."""
    import numpy as np
    from PySide6.QtCore import QEventLoop, QTimer
    from PySide6.QtWidgets import QApplication

    from app.plots.style import configure_pyqtgraph
    from app.window import MainWindow
    from engine.settings import SamplingParams, Settings

    app = QApplication.instance() or QApplication(sys.argv[:1])
    configure_pyqtgraph()
    window = MainWindow(model=model, settings=Settings(dtype=dtype, weights=weights, users=users,
                                                      sampling=SamplingParams(greedy=True)),
                        engine_process=engine_process)
    window.resize(1600, 960)
    window.show()
    loop = QEventLoop()
    window.model_ready.connect(lambda _info: loop.quit())
    loop.exec()
    wait = QEventLoop()
    QTimer.singleShot(int(seconds * 1000), wait.quit)
    cpu0, wall0 = time.process_time(), time.monotonic()
    wait.exec()
    # this process's share of the machine: the GUI's alone in process mode, the engine's too on a thread
    gui_cores = (time.process_time() - cpu0) / (time.monotonic() - wall0)
    serving = window.data.serving
    t, running = serving.column("t_s"), serving.column("running")
    aggregate = serving.column("aggregate_tps")
    late = t >= t[0] + (t[-1] - t[0]) / 3 if len(t) else t > 0
    full = late & (running == users)
    window.close()
    return {"users": users, "dtype": dtype, "weights": weights, "seconds": seconds, "samples": int(len(t)),
            "samples_all_running": int(full.sum()), "app_process_cores": gui_cores,
            "app_aggregate_tokens_per_s_median": float(np.median(aggregate[full])) if full.any() else float("nan"),
            "app_aggregate_tokens_per_s_median_any": float(np.median(aggregate[late])) if late.any() else float("nan")}


def attached(url: str, replies: int, interval_s: float = 0.25) -> dict:
    """Timer lateness while the window is attached to a server and chats with it."""
    import numpy as np
    from PySide6.QtCore import QEventLoop
    from PySide6.QtWidgets import QApplication

    from app.plots.style import configure_pyqtgraph
    from app.window import MainWindow

    app = QApplication.instance() or QApplication(sys.argv[:1])
    configure_pyqtgraph()
    window = MainWindow(autoload=False)
    window.resize(1600, 960)
    window.show()
    if not window.attach.attach(url, interval_s=interval_s):
        raise SystemExit(f"gui_bench: {window.last_error}")
    probe = LatenessProbe()
    probe.start()
    t0 = time.monotonic()
    for i in range(replies):
        loop = QEventLoop()
        window.attach.reply_finished.connect(loop.quit)
        window.chat.send_requested.emit(PROMPTS[min(i, 1)])
        loop.exec()
        window.attach.reply_finished.disconnect(loop.quit)
    wall_s = time.monotonic() - t0
    probe.stop()
    window.attach.detach()
    frames = window.plots.frames_drawn
    window.close()
    lateness = np.array(probe.lateness_ms)
    return {"attached_to": url, "timer_lateness_ms_p50": lateness_ms(lateness, 50),
            "timer_lateness_ms_p95": lateness_ms(lateness, 95),
            "timer_lateness_ms_max": lateness_ms(lateness, 100), "timer_samples": len(lateness),
            "scrapes": len(window.attach.records), "frames_drawn": frames, "wall_s": wall_s}


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="python -m app.gui_bench", description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="default")
    parser.add_argument("--tokens", type=int, default=128)
    parser.add_argument("--replies", type=int, default=2)
    parser.add_argument("--engine-thread", action="store_true",
                        help="the engine on a thread of the app's process (the app's --engine-thread)")
    parser.add_argument("--attach", metavar="URL", help="measure the window attached to this server instead")
    parser.add_argument("--dtype", choices=["fp32", "bf16"], default="fp32", help="activations and fp weights")
    parser.add_argument("--weights", choices=["fp", "int8", "int4"], default="fp", help="weight storage")
    parser.add_argument("--settle-s", type=float, default=1.0,
                        help="seconds between the model being ready and the first prompt")
    parser.add_argument("--probe-ms", type=int, default=10,
                        help="the lateness probe's period (its own wake-ups; 1000 to see the app's alone)")

    parser.add_argument("--engine-spin-count", type=int, default=None, metavar="N",
                        help="GOMP_SPINCOUNT for the app's engine process alone (libgomp: how long a thread spins "
                             "at a barrier before it sleeps; the headless runs keep the default)")
    parser.add_argument("--users", type=int, default=0,
                        help="serve this many simulated users in the window for --seconds instead of replies: the "
                             "serving panel's aggregate tok/s (compare `membound bench --sweep batch`)")
    parser.add_argument("--seconds", type=float, default=60.0)
    parser.add_argument("--warmup-replies", type=int, default=1, metavar="N",
                        help="replies each side decodes before the timed ones (default 1: the headless engine is "
                             "warmed at its load, the app's is not; 0: the app's first reply counts, cold)")
    args = parser.parse_args(argv)
    if args.users:
        print(json.dumps(in_app_users(args.model, args.users, args.seconds, args.dtype, args.weights,
                                      engine_process=not args.engine_thread), indent=2))
        return 0
    if args.attach:
        print(json.dumps(attached(args.attach, args.replies), indent=2))
        return 0
    t0 = time.time()
    # headless on this thread, each reply right after the app's: a machine that slows down or speeds up
    # mid-run (shared cores) moves both sides of a reply's ratio, rather than the app's alone
    headless = Headless(args.model, args.tokens, args.dtype, args.weights)  # loaded before the window
    import os
    if args.engine_spin_count is not None:  # the engine process reads it at its start; this one's OpenMP
        os.environ["GOMP_SPINCOUNT"] = str(args.engine_spin_count)  # (headless) read its own already
    result = in_app(args.model, args.tokens, args.replies, engine_process=not args.engine_thread, dtype=args.dtype,
                    weights=args.weights, probe_ms=args.probe_ms, settle_s=args.settle_s, after_reply=headless.reply,
                    warmup_replies=args.warmup_replies)
    if args.engine_spin_count is not None:
        del os.environ["GOMP_SPINCOUNT"]
    result["engine_spin_count"] = args.engine_spin_count
    result["engine"] = "thread" if args.engine_thread else "process"
    result["warmup_replies"] = args.warmup_replies
    result["dtype"], result["weights"] = args.dtype, args.weights
    result.update(paired_ratios(result.pop("app_decode_tokens_per_s_per_reply"), result.pop("after_reply")))
    # `membound bench`'s 32-token prompt (shorter contexts than the app's replies: a faster denominator;
    # the ratio against it is how sessions before 16 measured)
    result["bench_decode_tokens_per_s"] = headless.bench()
    result["app_over_bench"] = result["app_decode_tokens_per_s"] / result["bench_decode_tokens_per_s"]
    result["wall_s"] = time.time() - t0
    print(json.dumps(result, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
