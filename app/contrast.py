"""WCAG 2 contrast: the relative luminance of an sRGB colour and the ratio of two (1 to 21), and the
pairs of colours a theme draws text with, each against the background it is drawn on. AA asks
4.5:1 for body text; every pair here is held to it, whatever the font size."""
from __future__ import annotations

from app.theme import Theme

AA = 4.5


def luminance(colour: str) -> float:
    """Relative luminance of '#rrggbb' (WCAG 2.x)."""
    value = colour.lstrip("#")
    if len(value) != 6:
        raise ValueError(f"expected #rrggbb, got {colour!r}")
    channels = [int(value[i:i + 2], 16) / 255 for i in (0, 2, 4)]
    linear = [c / 12.92 if c <= 0.04045 else ((c + 0.055) / 1.055) ** 2.4 for c in channels]
    return 0.2126 * linear[0] + 0.7152 * linear[1] + 0.0722 * linear[2]


def contrast(foreground: str, background: str) -> float:
    high, low = sorted((luminance(foreground), luminance(background)), reverse=True)
    return (high + 0.05) / (low + 0.05)


def text_pairs(theme: Theme) -> list[tuple[str, str, str]]:
    """(what, text colour, background colour) for every kind of text the app draws in this theme."""
    t = theme
    pairs = [("text on the window", t.text, t.background), ("text on a panel", t.text, t.panel),
             ("text on a button", t.text, t.raised), ("captions on the window", t.muted, t.background),
             ("captions and axis ticks on a panel", t.muted, t.panel), ("disabled button text", t.muted, t.raised),
             ("readouts and your messages", t.accent, t.panel), ("the Send button", t.background, t.accent),
             ("the error bar", t.background, t.error), ("errors in the chat", t.error, t.panel),
             ("peak line labels", t.peak, t.panel), ("datasheet peak labels", t.spec_peak, t.panel),
             ("TTFT label and prefill", t.prefill, t.panel)]
    for token, colour in t.setting_colours:  # annotation labels and legend lines, on the plot
        pairs.append((f"'{token}' labels on a plot", colour, t.panel))
        pairs.append((f"a checked '{token}' switch", t.background, colour))
    for colour in t.spare_colours:
        pairs.append((f"spare colour {colour} on a plot", colour, t.panel))
    return pairs


def failures(theme: Theme, minimum: float = AA) -> list[str]:
    return [f"{what}: {fg} on {bg} is {contrast(fg, bg):.2f}:1" for what, fg, bg in text_pairs(theme)
            if contrast(fg, bg) < minimum]
