"""Speculative decoding in the window: the plots fed by hand with draft and verify steps (tokens/s
over both, the timeline's two colours, acceptance over time and by guess position), accepted
guesses tinted in the chat, and on the tiny model the F1 switch, a speculative reply end to end,
and the captured-step switch greyed on a CPU with the engine's reason; the switches' bar with two
more switches clips no text; the transcript (tints included) follows a theme change."""
from __future__ import annotations

import dataclasses

import numpy as np
import pytest
from app_test_helpers import activate, confirmed, send_and_wait
from PySide6.QtCore import Qt
from PySide6.QtGui import QColor, QTextCursor

from app.chat import ChatPanel
from app.live_data import LiveData
from app.plots import PlotsPanel
from app.plots.acceptance import AcceptancePlot, PositionPlot, position_rates
from app.plots.step_plot import StepWindow
from app.plots.timeline import TimelinePlot
from app.plots.tokens import TokensPlot
from app.theme import DARK, SettingColours
from engine.metrics import StepMetrics

LABEL = "fp32 · kv on · spec draft self int4 k4"


def step(i: int, phase: str, step_s: float = 0.01, draft: int = 0, accepted: int = 0) -> StepMetrics:
    out = {"prefill": 1, "decode": 1, "draft": 0, "verify": accepted + 1}[phase]
    fed = {"prefill": 8, "decode": 1, "draft": draft, "verify": draft + 1}[phase]
    return StepMetrics(step=i, phase=phase, batch_size=1, new_tokens=fed, tokens_out=out, context_len=8 + i,
                       step_s=step_s, weight_bytes=10**6 if phase != "draft" else 10**6 * draft // 4,
                       kv_read_bytes=1000, kv_write_bytes=100, other_bytes=0, flops=2 * 10**6,
                       peak_bandwidth_bps=20e9, peak_flops=1e11, t_s=100.0 + 0.01 * (i + 1), settings_label=LABEL,
                       draft_tokens=draft, accepted_tokens=accepted)


@pytest.fixture
def data() -> LiveData:
    """A prefill, then four speculative steps of k = 4 (draft, verify) keeping 4, 2, 0 and 3 guesses."""
    live = LiveData()
    live.start_reply(100.0)
    live.add_step(step(0, "prefill"))
    for n, kept in enumerate((4, 2, 0, 3)):  # the engine hands each verify step its draft's figures
        draft = step(1 + 2 * n, "draft", step_s=0.004, draft=4)
        live.add_step(draft)
        live.add_step(step(2 + 2 * n, "verify", step_s=0.012, draft=4, accepted=kept).with_draft(draft))
    live.end_reply(100.1)
    return live


def make(view_class, data, qtbot):
    view = view_class(data, DARK, SettingColours(DARK))
    qtbot.addWidget(view)
    view.draw(StepWindow(data))
    return view


def test_a_speculative_step_counts_its_tokens_over_its_draft_and_verify_time(data):
    steps = data.steps
    verify = steps.column("verify") > 0.5
    assert steps.column("prefill").tolist() == [1] + [0] * 8  # draft and verify steps are not prefill
    assert np.isnan(steps.column("tokens_per_s")[steps.column("draft") > 0.5]).all()
    assert steps.column("tokens_per_s")[verify].tolist() == pytest.approx([5 / 0.016, 3 / 0.016, 1 / 0.016, 4 / 0.016])
    # the ceiling: peak bandwidth x tokens / (the verify's bytes + its draft's)
    assert steps.column("ceiling_tps")[verify][0] == pytest.approx(5 * 20e9 / (1001100 + 1001100))


def test_the_tokens_line_joins_the_verify_steps_and_the_timeline_colours_draft_and_verify(data, qtbot):
    tokens = make(TokensPlot, data, qtbot)
    x, y = tokens.series[0].getData()
    assert x.tolist() == [0, 2, 4, 6, 8] and np.isfinite(y[1:]).all()  # no draft row: the line is unbroken
    timeline = make(TimelinePlot, data, qtbot)
    assert set(timeline.bars) == {"prefill", "draft", "verify"}
    assert timeline.bars["draft"].opts["pen"].color().name() == QColor(DARK.draft).name()
    assert timeline.bars["verify"].opts["pen"].color().name() == QColor(DARK.verify).name()
    assert "ms/token" in timeline.readout() and "overhead" in timeline.readout()


def test_acceptance_over_time_and_by_guess_position(data, qtbot):
    view = make(AcceptancePlot, data, qtbot)
    x, rate = view.rate_item.getData()
    assert x.tolist() == [2, 4, 6, 8] and rate.tolist() == [100, 50, 0, 75]
    assert view.mean_item.getData()[1].tolist() == pytest.approx([100, 75, 50, 56.25])
    assert view.readout() == "56% kept · 3.2 tokens per weight read (k = 4)"
    positions = make(PositionPlot, data, qtbot)
    assert positions.bars.opts["height"][:4].tolist() == [75, 75, 50, 25]
    assert position_rates(np.array([2, 4]), np.array([2, 1]))[:4].tolist()[:2] == [100, 50]
    assert positions.readout() == "guess 1 75% · guess 4 25% (last 4 steps)"


def test_the_speculation_row_shows_only_with_speculative_steps(data, qtbot):
    plain = LiveData()
    plain.add_step(step(0, "prefill"))
    panel = PlotsPanel(plain, DARK, SettingColours(DARK))
    qtbot.addWidget(panel)
    panel.refresh(force=True)
    assert not panel.speculation_visible
    fed = PlotsPanel(data, DARK, SettingColours(DARK))
    qtbot.addWidget(fed)
    fed.refresh(force=True)
    fed.update_readouts()
    assert fed.speculation_visible and "kept" in fed.acceptance.title_label.text()


def test_accepted_guesses_are_tinted_in_the_chat(qtbot):
    chat = ChatPanel(DARK)
    qtbot.addWidget(chat)
    chat.begin_reply()
    chat.append_reply([("The ", False), ("lamp ", True), ("was ", True), ("lit.", False)])
    assert chat.reply_text == "The lamp was lit."
    text = chat.plain_text()

    def colour_at(word: str) -> str:
        cursor = QTextCursor(chat.transcript.document())
        cursor.setPosition(text.index(word) + 1)
        return cursor.charFormat().foreground().color().name()

    assert colour_at("lamp") == colour_at("was") == QColor(DARK.verify).name()
    assert colour_at("The") == colour_at("lit") == QColor(DARK.text).name()


def test_f1_switches_speculation_on_and_a_reply_shows_its_guesses(make_window, qtbot):
    window = make_window(max_new_tokens=24)
    activate(window, qtbot)
    qtbot.keyClick(window, Qt.Key.Key_F1)
    confirmed(window, qtbot)
    assert window.settings.speculate == "ngram" and window.worker.engine.settings.speculate == "ngram"
    # the draft model is the model itself at its own weights: every guess lands
    window.apply_settings(dataclasses.replace(window.controls.requested, speculate="draft", draft_weights="fp"))
    confirmed(window, qtbot)
    done = send_and_wait(window, qtbot, "repeat after me")
    assert done.n_new_tokens == 24
    assert (window.data.steps.column("verify") > 0.5).sum() >= 3
    assert any(n.text.startswith("speculation draft self fp") for n in window.data.annotations)
    qtbot.waitUntil(lambda: window.plots.speculation_visible, timeout=5_000)
    assert {"draft", "verify"} <= set(window.plots.timeline.bars)
    assert "tokens per weight read" in window.chat.plain_text()
    cursor = QTextCursor(window.chat.transcript.document())
    colours = set()
    while cursor.movePosition(QTextCursor.MoveOperation.Right):
        colours.add(cursor.charFormat().foreground().color().name())
    assert {QColor(DARK.verify).name(), QColor(DARK.text).name()} <= colours  # guesses tinted, the rest not


def test_the_captured_step_switch_is_greyed_on_a_cpu_with_the_reason(make_window):
    window = make_window()
    button = window.controls.widgets["cuda_graphs"]
    assert window.settings.cuda_graphs is False and not button.isChecked()
    assert not button.isEnabled() and "compiled decode step measured no faster" in button.toolTip()


def test_every_switch_shows_its_whole_text_and_the_bar_fits_the_window(make_window, qtbot):
    """Two more switches filled the bar: at 1600 pixels no button may be squeezed below its text, in
    either type size (in large fonts the bar folds rather than clip: tests/app/test_screens.py)."""
    from PySide6.QtWidgets import QPushButton

    window = make_window()
    window.show()
    for large in (False, True):
        window.set_large_fonts(large)
        window.resize(1600, 960)
        qtbot.wait(50)
        buttons = [b for b in window.controls.findChildren(QPushButton) if b.isVisible()]
        assert len(buttons) > 20
        clipped = [(b.text(), b.width(), b.sizeHint().width()) for b in buttons if b.width() < b.sizeHint().width()]
        assert not clipped, (large, clipped)
        if not large:
            assert window.width() == 1600
    assert window.controls.widgets["cuda_graphs"].text() == "OFF"  # its caption names it


def test_the_transcript_takes_a_new_theme_s_colours_and_type_size(qtbot):
    from app.theme import LIGHT, themed

    chat = ChatPanel(DARK)
    qtbot.addWidget(chat)
    chat.add_message("user", "hello")
    chat.begin_reply()
    chat.append_reply([("The ", False), ("lamp", True)])
    chat.end_reply("— 2 tokens")
    text = chat.plain_text()

    def at(word: str):
        cursor = QTextCursor(chat.transcript.document())
        cursor.setPosition(text.index(word) + 1)
        return cursor.charFormat()

    size = at("The").fontPointSize()
    chat.set_theme(themed("light", large_fonts=True))
    assert at("hello").foreground().color().name() == at("The").foreground().color().name() == QColor(LIGHT.text).name()
    assert at("lamp").foreground().color().name() == QColor(LIGHT.verify).name()
    assert at("tokens").foreground().color().name() == QColor(LIGHT.muted).name()
    assert at("The").fontPointSize() > size
