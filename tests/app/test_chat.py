"""The chat's transcript: a reply stays one paragraph of prose, whatever notices come while it streams."""
from __future__ import annotations

from app.chat import ChatPanel
from app.theme import themed


def _panel(qtbot) -> ChatPanel:
    panel = ChatPanel(themed("dark"))
    qtbot.addWidget(panel)
    return panel


def test_a_notice_during_a_reply_is_drawn_after_it(qtbot):
    # under load a step measured above a low roof put its notice inside the reply ("The capital of
    # France\n⚠ above the measured roof… is Paris."): seen as a flake of test_app_default_model
    panel = _panel(qtbot)
    panel.add_message("user", "What is the capital of France?")
    panel.begin_reply()
    panel.set_streaming(True)
    panel.append_reply("The capital of France")
    panel.add_notice("above the measured roof", error=True)
    panel.append_reply(" is Paris.")
    assert "The capital of France is Paris." in panel.plain_text()
    assert "above the measured roof" not in panel.plain_text()  # held until the reply ends
    panel.end_reply("— 8 tokens")
    panel.set_streaming(False)
    text = panel.plain_text()
    assert text.index("The capital of France is Paris.") < text.index("— 8 tokens") < text.index("⚠ above the measured roof")
    panel.set_theme(themed("light"))  # redrawn from its entries: the same order
    assert panel.plain_text() == text


def test_a_reply_that_ends_without_a_summary_lets_its_notices_out(qtbot):
    panel = _panel(qtbot)
    panel.begin_reply()
    panel.set_streaming(True)
    panel.append_reply("Half a")
    panel.add_notice("the reply failed: the engine stopped", error=True)
    panel.set_streaming(False)
    assert panel.plain_text().endswith("⚠ the reply failed: the engine stopped")
    panel.add_notice("new chat")  # no reply open: at once
    assert panel.plain_text().endswith("new chat")
