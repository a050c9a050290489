"""Talk mode on the tiny model: a clicker's keys step a tour forward and back and the window runs
what each step asks for; number keys choose the presenter's plots; keep-decoding runs past the
context window and starts over cleanly; every theme passes the contrast check, the chat's text too."""
from __future__ import annotations

import dataclasses

import pytest
import torch
from app_test_helpers import activate
from PySide6.QtCore import Qt
from PySide6.QtGui import QColor

from app import talk
from app.contrast import AA, contrast, failures, text_pairs
from app.keep_decoding import STARTING_OVER
from app.plots.view import ANNOTATION_SHARE
from app.theme import THEMES, themed
from app.tour import load_tour
from engine.io.byte_tokenizer import ByteTokenizer
from engine.io.loader import LoadedWeights, synthetic_weights
from engine.model.config import ModelConfig

TOUR = """
[tour]
keep_decoding = false
large_fonts = false
[tour.settings]
kv_layout = "contiguous"
weights = "fp"
[[step]]
title = "Start"
caption = "The first step."
plots = ["tokens", "timeline"]
[[step]]
title = "No cache"
caption = "The KV cache is off."
settings = { kv_layout = "off" }
plots = ["compute"]
[[step]]
title = "Eight bits"
caption = "INT8 weights, the cache back on."
settings = { weights = "int8", kv_layout = "paged" }
plots = ["memory", "kv"]
"""


def step_state(window, runner) -> dict:
    return {"kv_layout": window.settings.kv_layout, "weights": window.settings.weights,
            "caption": runner.overlay.title.text(), "plots": window.plots.shown}


def test_clicker_keys_step_the_tour_forward_and_back(make_window, qtbot, tmp_path):
    path = tmp_path / "tour.toml"
    path.write_text(TOUR)
    window = make_window(max_new_tokens=8)
    activate(window, qtbot)
    the_talk = talk.install(window, tour=load_tour(str(path)))
    runner = the_talk.runner
    qtbot.waitUntil(lambda: runner.index == 0 and runner.done, timeout=10_000)
    assert not talk._typing()  # the chat input has the focus in a chat; in a tour, the clicker's keys do
    expected = [{"kv_layout": "contiguous", "weights": "fp", "caption": "Start", "plots": ["tokens", "timeline"]},
                {"kv_layout": "off", "weights": "fp", "caption": "No cache", "plots": ["compute"]},
                {"kv_layout": "paged", "weights": "int8", "caption": "Eight bits", "plots": ["memory", "extra"]}]
    assert step_state(window, runner) == expected[0] and runner.matches()
    for key, index in ((Qt.Key.Key_PageDown, 1), (Qt.Key.Key_Right, 2), (Qt.Key.Key_PageDown, 2),
                       (Qt.Key.Key_PageUp, 1), (Qt.Key.Key_Left, 0), (Qt.Key.Key_PageUp, 0)):
        qtbot.keyClick(window, key)
        qtbot.waitUntil(lambda: runner.index == index and runner.done, timeout=30_000)
        assert step_state(window, runner) == expected[index], (key, index)
        assert runner.matches() and not window.settings_pending
    assert window.side_tabs.currentWidget() is window.kv_panel  # "kv" brought the KV cache tab forward
    # B (a clicker's "blank" button) hides the captions and shows them again
    assert runner.overlay.isVisible()
    qtbot.keyClick(window, Qt.Key.Key_B)
    assert not runner.overlay.isVisible()
    qtbot.keyClick(window, Qt.Key.Key_Period)
    assert runner.overlay.isVisible()
    # while the person types, arrows and B are the text field's; PageDown is still the tour's
    window.chat.input.setFocus()
    qtbot.waitUntil(lambda: window.chat.input.hasFocus(), timeout=5_000)
    qtbot.keyClicks(window.chat.input, "Bb")
    qtbot.keyClick(window.chat.input, Qt.Key.Key_Left)
    assert window.chat.input.text() == "Bb" and runner.index == 0 and runner.overlay.isVisible()
    qtbot.keyClick(window.chat.input, Qt.Key.Key_PageDown)
    qtbot.waitUntil(lambda: runner.index == 1 and runner.done, timeout=30_000)


def test_number_keys_choose_the_presenters_plots(make_window, qtbot):
    window = make_window(max_new_tokens=8)
    activate(window, qtbot)
    the_talk = talk.install(window)
    window.setFocus()
    for key, shown in ((Qt.Key.Key_1, ["tokens"]), (Qt.Key.Key_4, ["tokens", "roofline"]),
                       (Qt.Key.Key_2, ["roofline", "memory"]), (Qt.Key.Key_2, ["roofline"]),
                       (Qt.Key.Key_6, ["roofline", "extra"]), (Qt.Key.Key_0, None)):
        qtbot.keyClick(window, key)
        assert window.plots.shown == shown and the_talk.presenter.shown == shown
        views = dict(window.plots.views, extra=window.side_tabs)
        assert {name for name, view in views.items() if view.isVisibleTo(window.plots)} == \
            (set(shown) if shown else set(views) - {"acceptance", "positions"})  # (those: while speculating)
    assert window.controls.extra.count() > 0 and not window.controls.folding.compact  # the grid: all back
    window.chat.input.setFocus()  # typing: digits are text; Ctrl+digit still chooses
    qtbot.waitUntil(lambda: window.chat.input.hasFocus(), timeout=5_000)
    qtbot.keyClick(window.chat.input, Qt.Key.Key_3)
    assert window.chat.input.text() == "3" and window.plots.shown is None
    qtbot.keyClick(window.chat.input, Qt.Key.Key_3, Qt.KeyboardModifier.ControlModifier)
    assert window.plots.shown == ["compute"]


def test_the_presenters_side_tab_stays_when_users_start_and_panels_go_compact(make_window, qtbot):
    window = make_window(max_new_tokens=8)
    the_talk = talk.install(window)
    the_talk.presenter.show(["kv", "memory"])  # the paged-KV step: the blocks, though users join
    assert window.seed_table.compact and window.serving_panel.compact
    assert not window.seed_table.caption.isVisibleTo(window) and window.seed_table.title.toolTip()
    window.apply_settings(dataclasses.replace(window.settings, users=2))
    qtbot.waitUntil(lambda: window.settings.users == 2, timeout=10_000)
    assert window.side_tabs.currentWidget() is window.kv_panel
    the_talk.presenter.show(None)  # the grid: the panels' full form
    assert not window.seed_table.compact and not window.serving_panel.compact
    window.apply_settings(dataclasses.replace(window.settings, users=0))
    qtbot.waitUntil(lambda: window.settings.users == 0, timeout=10_000)
    window.apply_settings(dataclasses.replace(window.settings, users=1))
    qtbot.waitUntil(lambda: window.settings.users == 1, timeout=10_000)
    assert window.side_tabs.currentWidget() is window.serving_panel  # no presenter choice: the batch shows
    window.apply_settings(dataclasses.replace(window.settings, users=0))
    qtbot.waitUntil(lambda: window.settings.users == 0, timeout=10_000)


def test_keep_decoding_runs_past_the_context_window_and_starts_over(qtbot, make_window):
    short = ModelConfig(name="tiny", dim=64, n_layers=2, n_heads=4, n_kv_heads=2, ffn_dim=128, vocab_size=256,
                        tied_embeddings=True, max_seq_len=200)
    model = LoadedWeights(short, synthetic_weights(short, torch.float32, "cpu"), ByteTokenizer(256), "synthetic",
                          "tiny (random weights, 200-token context)", "fp32")
    window = make_window(max_new_tokens=60, model=model)
    the_talk = talk.install(window)
    keep = the_talk.keep
    keep.first_prompt = "hi"
    keep.start()
    qtbot.waitUntil(lambda: keep.restarts >= 2 and window.data.steps.total > 3 * 200, timeout=60_000)
    keep.toggle()  # Ctrl+K: off, and the reply stops
    qtbot.waitUntil(lambda: not window.replying, timeout=10_000)
    assert not keep.on and window.last_error == ""
    assert STARTING_OVER["en"].format(n=200) in window.chat.plain_text()
    assert all(not done or done.reason != "eos" for done in [window.conversation.last_done])
    assert window.data.steps.total > 3 * 200  # decoding went on well past one context window


@pytest.mark.parametrize("name", sorted(THEMES))
@pytest.mark.parametrize("large", [False, True])
def test_every_theme_passes_the_contrast_check(name, large):
    theme = themed(name, large)
    assert failures(theme) == []
    assert len(text_pairs(theme)) > 20
    assert contrast("#777777", "#ffffff") < AA < contrast("#595959", "#ffffff")  # the check can fail


def test_the_chat_text_is_readable_after_a_theme_switch_mid_reply(make_window, qtbot):
    window = make_window(max_new_tokens=3000)
    window.send("a long reply")
    qtbot.waitUntil(lambda: len(window.chat.reply_text) > 20, timeout=10_000)
    for _ in range(2):
        window.view.toggle_theme()  # light, then dark again
        window.set_large_fonts(not window.theme.large)
        qtbot.waitUntil(lambda: len(window.chat.reply_text) > 40, timeout=10_000)
        background = window.theme.panel
        document = window.chat.transcript.document()
        block, checked = document.begin(), 0
        while block.isValid():
            it = block.begin()
            while not it.atEnd():
                fragment = it.fragment()
                colour = QColor(fragment.charFormat().foreground().color()).name()
                assert contrast(colour, background) >= AA, (fragment.text()[:40], colour, background)
                assert fragment.charFormat().fontPointSize() >= window.theme.font_pt * 0.85 - 1e-6
                checked += 1
                it += 1
            block = block.next()
        assert checked > 3
        # the switches' key hints ("F3") are drawn in the new theme's muted colour, not the old one's
        hints = [label.text() for label, _text, keys in window.controls.parts.captions if keys]
        assert hints and all(f"color:{window.theme.muted}" in hint for hint in hints)
        assert contrast(window.theme.muted, window.theme.panel) >= AA
    window.stop()
    qtbot.waitUntil(lambda: not window.replying, timeout=10_000)


def test_legends_sit_above_the_data_and_labels_never_overlap(make_window, qtbot):
    window = make_window(max_new_tokens=200)
    the_talk = talk.install(window)
    window.show()
    window.send("annotate me")
    qtbot.waitUntil(lambda: window.data.steps.total > 20, timeout=10_000)
    window.stop()
    qtbot.waitUntil(lambda: not window.replying, timeout=10_000)
    for i in range(12):  # changes close together: their labels compete for room
        window.data.annotate(f"setting change number {i}", window.settings.label, window.clock())
        window.data.add_step(window.reply_steps[-1])
    for size, large, layout in (((1920, 1080), False, None), ((1280, 720), True, ["tokens", "memory"])):
        window.set_large_fonts(large)
        window.resize(*size)
        the_talk.presenter.show(layout)
        qtbot.wait(100)
        window.plots.refresh(force=True)
        for name, view in window.plots.views.items():
            if not view.isVisible():
                continue
            view.place_annotation_labels()
            plot_area = view.plot.getViewBox().sceneBoundingRect()
            legend = view.plot.legend.sceneBoundingRect()
            assert legend.bottom() <= plot_area.top() + 1, name  # the legend is above the data, not on it
            view.widget.grab()  # a text item undoes the plot's scaling when it paints: paint, then measure
            labels = [line.label.sceneBoundingRect() for line in view.annotation_lines or []
                      if line.isVisible() and line.label.isVisible()]
            if name in ("tokens", "memory", "compute"):  # the step plots (the roofline has no time axis)
                assert len(labels) >= 2, (name, size)
            for i, a in enumerate(labels):
                assert plot_area.adjusted(-1, -1, 1, 1).contains(a), (name, a, plot_area)
                top_rows = max(ANNOTATION_SHARE * plot_area.height(), 2 * (a.height() + 2)) + 6
                assert a.bottom() <= plot_area.top() + top_rows, (name, a)  # in the headroom, off the data
                for b in labels[i + 1:]:
                    assert not a.intersects(b), (name, a, b)
