"""The window's lines, translated: the one under a finished reply of the local engine (or a replay of
one: its tokens, why it ended, its TTFT and the engine's figures for its steps, engine.metrics.
reply_figures), the model line, and the lines for a failure or a step above the measured roof."""
from __future__ import annotations

import re

from app.i18n import QT_TRANSLATE_NOOP, translate
from engine.events import DoneEvent
from engine.metrics import DECODE_PHASES, StepMetrics, reply_figures, speculation_figures
from engine.settings import weights_label

DONE_WORDS = {"eos": QT_TRANSLATE_NOOP("Window", "finished"),
              "max_tokens": QT_TRANSLATE_NOOP("Window", "hit max tokens"),
              "stopped": QT_TRANSLATE_NOOP("Window", "stopped"),
              "context_full": QT_TRANSLATE_NOOP("Window", "context window full")}


def ttft_note(done: DoneEvent) -> str:
    """'TTFT 123 ms', and how much of the prompt the cache spared (DoneEvent.ttft_note, translated)."""
    if not done.n_cached_tokens:
        return translate("Window", "TTFT {ms} ms").format(ms=f"{1e3 * done.ttft_s:.0f}")
    return translate("Window", "TTFT {ms} ms ({cached} of {prompt} prompt tokens cached)").format(
        ms=f"{1e3 * done.ttft_s:.0f}", cached=f"{done.n_cached_tokens:,}", prompt=f"{done.n_prompt_tokens:,}")


def speculation_summary(steps: list[StepMetrics]) -> list[str]:
    """engine.metrics.speculation_figures in words, translated."""
    figures = speculation_figures(steps)
    if figures is None:
        return []
    pct, per_step, tokens = figures
    text = translate("Window", "speculation: {pct}% of guesses kept ({per_step} a step), {tokens} tokens per "
                               "weight read")
    return [text.format(pct=f"{pct:.0f}", per_step=f"{per_step:.2f}", tokens=f"{tokens:.2f}")]


def engine_reply_summary(done: DoneEvent, steps: list[StepMetrics]) -> str:
    """'— 64 tokens, finished · TTFT 80 ms · decode 41.0 tok/s · 11.2 GB/s (model) = 56% of 20 GB/s peak'."""
    how = translate("Window", DONE_WORDS[done.reason]) if done.reason in DONE_WORDS else done.reason
    parts = [translate("Window", "{n} tokens, {how}").format(n=done.n_new_tokens, how=how), ttft_note(done)]
    figures = reply_figures(steps)  # the engine's sums (engine/metrics.py), as the terminal's
    if figures is not None:
        decode = [m for m in steps if m.phase in DECODE_PHASES]
        batched = max(m.batch_size for m in decode) > 1
        # batched, steps also serve other requests (and may run while this one waits): this
        # reply's own rate is the engine's count of its tokens over its decode time
        rate = done.decode_tokens_per_s if batched else figures.tokens_per_s
        decode_text = translate("Window", "decode {tps} tok/s (this reply, batched)") if batched else \
            translate("Window", "decode {tps} tok/s")
        parts += [decode_text.format(tps=f"{rate:.1f}"),
                  translate("Window", "{gbs} GB/s (model) = {pct}% of {peak} GB/s peak").format(
                      gbs=f"{figures.achieved_gbs:.1f}", pct=f"{100 * figures.mbu:.0f}",
                      peak=f"{figures.peak_gbs:.0f}")]
        parts += speculation_summary(decode)
    return "— " + " · ".join(parts)


def model_line(info, settings) -> str:
    """The model line with the precision and weights the engine runs now (the loader's line says what
    it loaded at): 'tiny (random weights → bf16, int8) · 2 M parameters · cpu'."""
    params = info.cfg.n_params
    size = f"{params / 1e9:.1f} B" if params >= 1e9 else f"{params / 1e6:.0f} M"
    weights = "" if settings.weights == "fp" else f", {weights_label(settings.weights, settings.group_size)}"
    label = re.sub(r"→ (fp32|bf16|fp16)", f"→ {settings.dtype + weights}", info.label, count=1)
    return translate("Window", "{model} · {size} parameters · {device}").format(model=label, size=size,
                                                                              device=info.device)


def failure_line(what: str, message: str, model: str | None) -> str:
    """A failed command in one line (`what`: the source's `failed` kind; `model`: the one still loaded)."""
    if what == "serving":  # the engine switched the users off (its SettingsApplied says so)
        return translate("Window", "serving the simulated users failed, so they are off: {message}").format(
            message=message)
    if what == "load":
        text = translate("Window", "could not load the model: {message}").format(message=message)
        return text + (" " + translate("Window", "(still using {model})").format(model=model) if model else "")
    if what == "reply":
        text = translate("Window", "the reply failed: {message}").format(message=message)
        return text + (" — " + translate("Window", "the conversation so far is kept") if model else "")
    if what == "reset":
        return translate("Window", "new chat failed: {message}").format(message=message)
    if what == "quality":
        return translate("Window", "measuring quality failed: {message}").format(message=message)
    return message


def above_roof_line(step: StepMetrics) -> str:
    """A step above its measured roof: the cost model or the probe is wrong, and the line says so."""
    return translate("Window", "above the measured roof: the cost model or the probe is wrong (step {step}, "
                               "{phase}: MBU {mbu}%, MFU {mfu}%)").format(
        step=step.step, phase=step.phase, mbu=f"{100 * step.mbu:.0f}",
        mfu=f"{100 * step.mfu:.0f}" if step.peak_flops > 0 else "?")
