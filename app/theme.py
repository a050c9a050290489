"""Colours, fonts and the Qt stylesheet: a dark theme (default), a light high-contrast theme, and
a large-font mode for projectors. One colour per setting, the same in every plot and legend."""
from __future__ import annotations

from dataclasses import dataclass, replace
from string import Template


@dataclass(frozen=True)
class Theme:
    name: str
    background: str  # window
    panel: str  # plot and chat backgrounds
    raised: str  # buttons, inputs
    border: str
    text: str
    muted: str  # secondary text, axis ticks
    grid_alpha: float
    accent: str
    error: str
    peak: str  # dashed peak / ceiling lines
    spec_peak: str  # a datasheet peak beside a measured one
    prefill: str  # prefill steps (a phase, not a setting)
    mixed: str  # batched steps of prompt chunks and decode rows together
    setting_colours: tuple[tuple[str, str], ...]  # (token in the settings label, colour), first match wins
    spare_colours: tuple[str, ...]  # for settings no token names
    font_pt: int = 11
    # speculative decoding's two phases; accepted guesses in the chat take the verify colour
    draft: str = "#f8a5c2"  # the draft model's forwards
    verify: str = "#63e6be"  # the target's step that checks the guesses

    @property
    def large(self) -> bool:
        return self.font_pt >= 15


DARK = Theme(
    name="dark", background="#101217", panel="#171a21", raised="#232733", border="#313746",
    text="#e8eaf0", muted="#a3a9b7", grid_alpha=0.18, accent="#4da3ff", error="#ff6b6b",
    peak="#f2f2f2", spec_peak="#ffd166", prefill="#ffd166", mixed="#c8ccd6",
    setting_colours=(("kv off", "#ff5c8a"), ("int4", "#5ad16b"), ("int8", "#ff9f43"), ("fp16", "#3fd0c9"),
                     ("bf16", "#4da3ff"), ("fp32", "#b48cff")),
    spare_colours=("#f78fb3", "#c7ecee", "#badc58", "#e056fd", "#7ed6df", "#f0932b"),
)

LIGHT = Theme(
    name="light", background="#ffffff", panel="#ffffff", raised="#eef0f4", border="#5b6270",
    text="#000000", muted="#2b2f38", grid_alpha=0.25, accent="#0050b3", error="#c00000",
    # every colour that draws text here is >= 4.5:1 on white (WCAG AA: app/contrast.py, tested)
    peak="#000000", spec_peak="#a05a00", prefill="#8a5d00", mixed="#5b6270",
    setting_colours=(("kv off", "#c2185b"), ("int4", "#187a29"), ("int8", "#b34700"), ("fp16", "#00838f"),
                     ("bf16", "#0050b3"), ("fp32", "#6a1b9a")),
    spare_colours=("#8e24aa", "#2e7d32", "#a04b00", "#37474f", "#ad1457", "#00695c"),
    draft="#b0306a", verify="#00806a",
)

THEMES = {"dark": DARK, "light": LIGHT}
NORMAL_FONT_PT = 11
LARGE_FONT_PT = 16


def themed(name: str = "dark", large_fonts: bool = False) -> Theme:
    return replace(THEMES[name], font_pt=LARGE_FONT_PT if large_fonts else NORMAL_FONT_PT)


class SettingColours:
    """Colour of each settings label (e.g. "fp32 · kv on"): chosen once per label and kept, so a
    setting has one colour in every plot. A label takes the colour of the first token of the
    theme's table it contains, unless another label already has it; then a spare colour."""

    def __init__(self, theme: Theme):
        self.theme = theme
        self._slots: dict[str, int] = {}  # label -> index into the theme's colour list

    def _palette(self) -> list[str]:
        return [colour for _, colour in self.theme.setting_colours] + list(self.theme.spare_colours)

    def set_theme(self, theme: Theme) -> None:
        self.theme = theme  # slots are indices: a label keeps its place in the new palette

    def colour(self, label: str) -> str:
        if label not in self._slots:
            taken = set(self._slots.values())
            preferred = [i for i, (token, _) in enumerate(self.theme.setting_colours) if token in label]
            palette = self._palette()
            free = [i for i in preferred if i not in taken] or \
                   [i for i in range(len(self.theme.setting_colours), len(palette)) if i not in taken] or \
                   [len(self._slots) % len(palette)]
            self._slots[label] = free[0]
        return self._palette()[self._slots[label]]

    def option_colour(self, token: str) -> str | None:
        """Colour of a settings token on its own (a control's option, e.g. "bf16"), if it has one."""
        for name, colour in self.theme.setting_colours:
            if name == token:
                return colour
        return None


_STYLESHEET = Template("""
QWidget { background: $background; color: $text; font-size: ${font}pt; }
QMainWindow, QDialog { background: $background; }
QFrame#panel, QTextBrowser, QTableWidget, QPlainTextEdit, QLineEdit {
    background: $panel; border: 1px solid $border; border-radius: 6px; }
QTextBrowser { padding: 6px; }
QLineEdit, QPlainTextEdit { padding: 6px; selection-background-color: $accent; }
QPushButton, QToolButton, QComboBox, QSpinBox, QDoubleSpinBox {
    background: $raised; border: 1px solid $border; border-radius: 6px; padding: 5px 10px; }
QPushButton:hover, QToolButton:hover { border-color: $accent; }
QPushButton:disabled, QToolButton:disabled { color: $muted; }
QPushButton:checked, QToolButton:checked { border: 2px solid $accent; }
QPushButton#send { background: $accent; color: $background; font-weight: bold; }
QPushButton#stop:enabled { border: 2px solid $error; color: $error; font-weight: bold; }
QLabel#muted, QLabel#caption { color: $muted; }
QLabel#caption { font-size: ${small}pt; }
QLabel#title { font-weight: bold; font-size: ${big}pt; }
QLabel#error { background: $error; color: $background; border-radius: 6px; padding: 6px 10px; font-weight: bold; }
QHeaderView::section { background: $raised; color: $text; border: 0px; padding: 4px 1px; font-weight: bold; }
QTableWidget { gridline-color: $border; font-size: ${small}pt; }
QHeaderView::section { font-size: ${small}pt; }
QProgressBar { border: 1px solid $border; border-radius: 6px; background: $panel; text-align: center; }
QProgressBar::chunk { background: $accent; border-radius: 5px; }
QSplitter::handle { background: $border; }
QSlider::groove:horizontal { height: 8px; background: $raised; border: 1px solid $border; border-radius: 4px; }
QSlider::sub-page:horizontal { background: $accent; border-radius: 4px; }
QSlider::handle:horizontal { background: $text; border: 2px solid $accent; width: 16px; margin: -6px 0;
    border-radius: 9px; }
QSlider::handle:horizontal:disabled { background: $muted; border-color: $border; }
QLabel#slider_value { font-weight: bold; font-size: ${big}pt; }
QToolTip { background: $raised; color: $text; border: 1px solid $border; }
""")


def stylesheet(theme: Theme) -> str:
    return _STYLESHEET.substitute(
        background=theme.background, panel=theme.panel, raised=theme.raised, border=theme.border,
        text=theme.text, muted=theme.muted, accent=theme.accent, error=theme.error,
        font=theme.font_pt, small=max(theme.font_pt - 2, 8), big=theme.font_pt + 2)
