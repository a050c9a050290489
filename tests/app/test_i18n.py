"""The UI in Spanish: Qt's translator turns the window's strings into the shipped translation; the
catalogue holds every string marked in app/, each translated, and the .qm is compiled from it."""
from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path
from xml.etree import ElementTree

import pytest
from PySide6.QtCore import QTranslator
from PySide6.QtWidgets import QApplication

from app import i18n

ROOT = Path(__file__).resolve().parents[2]
SOURCE = i18n.TRANSLATIONS / "membound_es.ts"


def tool(name: str) -> str:
    path = Path(sys.executable).with_name(name)  # the venv's PySide6 ships Qt's lupdate and lrelease
    return str(path) if path.exists() else shutil.which(name) or pytest.fail(f"{name} not found")


@pytest.fixture
def spanish(qapp):
    translator = i18n.install(QApplication.instance(), "es")
    assert translator is not None, "app/translations/membound_es.qm did not load"
    yield
    i18n.uninstall(QApplication.instance(), translator)


def test_the_window_speaks_spanish(spanish, make_window):
    window = make_window(max_new_tokens=4)
    assert window.theme_button.text() == "Tema claro  F9"
    assert window.chat.send_button.text() == "Enviar"
    assert window.windowTitle().startswith("membound — mira")
    assert window.controls.widgets["kv_cache"].text() == "SÍ"
    titles = {name: view.title_label.text() for name, view in window.plots.views.items()}
    assert "Tráfico de memoria" in titles["memory"] and "Cómputo" in titles["compute"]
    window.view.toggle_theme()
    assert window.theme_button.text() == "Tema oscuro  F9"
    window.close()


def test_english_is_the_source_text(make_window):
    window = make_window(max_new_tokens=4)
    assert window.theme_button.text() == "Light theme  F9"
    assert window.chat.send_button.text() == "Send"
    window.close()


def test_language_follows_lang_then_the_system_locale(monkeypatch):
    assert i18n.language("es") == "es" and i18n.language("en") == "en"

    class Spanish:
        @staticmethod
        def system():
            return Spanish()

        def name(self):
            return "es_MX"

    monkeypatch.setattr(i18n, "QLocale", Spanish)
    assert i18n.language(None) == "es"
    assert i18n.language("en") == "en"  # --lang wins over the locale


def messages(ts: Path) -> dict[tuple[str, str], str | None]:
    """(context, source) -> translation (None: unfinished) of a Qt Linguist .ts file."""
    out = {}
    for context in ElementTree.parse(ts).getroot().iter("context"):
        name = context.findtext("name") or ""
        for message in context.iter("message"):
            translation = message.find("translation")
            finished = translation is not None and translation.get("type") not in ("unfinished", "obsolete", "vanished")
            out[(name, message.findtext("source"))] = translation.text if finished else None
    return out


def test_every_marked_string_is_translated_and_compiled(tmp_path):
    fresh = tmp_path / "membound_es.ts"
    shutil.copy(SOURCE, fresh)
    sources = sorted(str(p.relative_to(ROOT)) for p in (ROOT / "app").glob("*.py"))  # as the Makefile's globs
    sources += sorted(str(p.relative_to(ROOT)) for p in (ROOT / "app" / "plots").glob("*.py"))
    subprocess.run([tool("pyside6-lupdate"), "-no-obsolete", "-locations", "none", "-source-language", "en",
                    "-target-language", "es", *sources, "-ts", str(fresh)], cwd=ROOT, check=True,
                   capture_output=True, timeout=120)
    found, shipped = messages(fresh), messages(SOURCE)
    untranslated = sorted(key for key, text in found.items() if not text)
    assert not untranslated, f"strings without Spanish (make translations, then translate them): {untranslated}"
    assert found.keys() == shipped.keys(), "membound_es.ts is stale: run make translations"
    translator = QTranslator()
    assert translator.load(str(i18n.TRANSLATIONS / "membound_es.qm"))
    stale = [key for key, text in shipped.items() if translator.translate(*key) != text]
    assert not stale, f"membound_es.qm is not compiled from the .ts (make translations): {stale[:5]}"


def speculative_steps() -> list:
    """A prefill, then three speculative rounds of k = 4 (a draft, then a verify keeping 4, 1, 3)."""
    from engine.metrics import StepMetrics

    rows, label = [], "fp32 · kv on · spec lookup k4"
    for i, (phase, kept) in enumerate([("prefill", 0)] + [(p, k) for k in (4, 1, 3) for p in ("draft", "verify")]):
        draft = 4 if phase != "prefill" else 0
        rows.append(StepMetrics(step=i, phase=phase, batch_size=1, new_tokens=1, step_s=0.01, t_s=100.0 + 0.01 * i,
                                tokens_out={"prefill": 1, "draft": 0, "verify": kept + 1}[phase], context_len=8 + i,
                                weight_bytes=10**6, kv_read_bytes=1000, kv_write_bytes=100, other_bytes=0,
                                flops=2 * 10**6, peak_bandwidth_bps=20e9, peak_flops=1e11, settings_label=label,
                                draft_tokens=draft, accepted_tokens=kept))
    return rows


def english_left(text: str, words: tuple[str, ...]) -> list[str]:
    return [word for word in words if word in text]


def test_the_speculation_plots_speak_spanish(spanish, qtbot):
    from app.live_data import LiveData
    from app.plots.acceptance import AcceptancePlot, PositionPlot
    from app.plots.step_plot import StepWindow
    from app.plots.tokens import TokensPlot
    from app.theme import DARK, SettingColours

    data = LiveData()
    data.start_reply(100.0)
    for row in speculative_steps():
        data.add_step(row)
    texts = []
    for view_class in (AcceptancePlot, PositionPlot, TokensPlot):
        view = view_class(data, DARK, SettingColours(DARK))
        qtbot.addWidget(view)
        view.draw(StepWindow(data))
        view.show_readout(view.readout())
        legend = [label.text for _, label in view.plot.legend.items] if view.plot.legend else []
        axes = [view.plot.getAxis(side).labelText for side in ("left", "bottom")]
        texts += [view.title_label.text(), *legend, *axes]
    text = "\n".join(texts)
    assert "aceptad" in text and "lectura de pesos" in text and "posición" in text, text
    assert not english_left(text, ("guesses kept", "kept by", "tokens per weight read", "guess position",
                                   "one verify step", "mean of the last", "last ")), text


def test_the_export_report_speaks_spanish(spanish):
    from types import SimpleNamespace

    from app.export import report_markdown
    from app.live_data import LiveData

    data = LiveData()
    for row in speculative_steps():
        data.add_step(row)
    data.annotate("kv cache off", "fp32 · kv off", 100.05)
    spec = SimpleNamespace(name="fake CPU", source="measured at load", peak_bandwidth_gbs=20.0)
    info = SimpleNamespace(label="tiny", cfg=SimpleNamespace(n_params=1.2e6), device="cpu", hardware=spec)
    report = report_markdown(SimpleNamespace(data=data, model_info=info), {"Memoria": "plot-memory.png"},
                             replay="session.membound")
    assert "Informe de la sesión" in report and "Modelo:" in report and "parámetros" in report, report
    assert "ancho de banda" in report and "por configuración" in report and "techo" in report, report
    assert not english_left(report, ("session report", "Model:", "parameters", "peak bandwidth",
                                     "Steps recorded", "Settings timeline", "per setting", "ceiling",
                                     "From a replay", "## Plots", "settings from here")), report


def test_the_reply_summary_speaks_spanish(spanish, make_window):
    from engine.events import DoneEvent

    window = make_window(max_new_tokens=4)
    window.conversation.begin("hola")
    window.conversation.steps = speculative_steps()
    done = DoneEvent(reason="max_tokens", text="abc", n_prompt_tokens=20, n_new_tokens=10, ttft_s=0.012,
                     decode_s=0.06, n_cached_tokens=8)
    window.conversation.finish(done, window.source.reply_summary(done, window.reply_steps))
    summary = window.chat.plain_text().splitlines()[-1]
    assert "decodificación" in summary and "tok/s" in summary and "del pico" in summary, summary
    assert "especulación" in summary and "aceptad" in summary and "lectura de pesos" in summary, summary
    assert "de 20 tokens del prompt en caché" in summary, summary
    assert not english_left(summary, ("decode ", "of ", "peak", "speculation", "guesses kept", "a step",
                                      "tokens per weight read", "prompt tokens cached")), summary
    window.conversation.ended()
    window.close()


def test_qts_own_buttons_speak_spanish_too(spanish, qtbot):
    from PySide6.QtWidgets import QDialogButtonBox

    buttons = QDialogButtonBox(QDialogButtonBox.StandardButton.Ok | QDialogButtonBox.StandardButton.Cancel)
    qtbot.addWidget(buttons)
    texts = [button.text().replace("&", "") for button in buttons.buttons()]
    assert "Aceptar" in texts and "Cancelar" in texts, texts
