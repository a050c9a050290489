"""The line under a finished reply of the local engine (or a replay of one): its tokens, why it
ended, its TTFT and the engine's figures for its steps (engine.metrics.reply_figures), translated."""
from __future__ import annotations

from app.i18n import QT_TRANSLATE_NOOP, translate
from engine.events import DoneEvent
from engine.metrics import DECODE_PHASES, StepMetrics, reply_figures, speculation_figures

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
