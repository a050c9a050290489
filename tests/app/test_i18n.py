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
    window.toggle_theme()
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
