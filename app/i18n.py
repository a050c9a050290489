"""The UI's languages: the source strings are English; Spanish comes from Qt Linguist's compiled
`translations/membound_es.qm` (source: `membound_es.ts`; `make translations` rebuilds both).

`install(app, lang)` puts the translation for `lang` on the application before any widget is built;
`language(asked)`: the --lang asked for, else the system locale's where the UI ships it, else English."""
from __future__ import annotations

from pathlib import Path

from PySide6.QtCore import QT_TRANSLATE_NOOP, QCoreApplication, QLibraryInfo, QLocale, QTranslator

TRANSLATIONS = Path(__file__).resolve().parent / "translations"
LANGUAGES = ("en", "es")  # English is the source text: it has no file

translate = QCoreApplication.translate  # translate("Context", "text"): the form pyside6-lupdate finds
__all__ = ["LANGUAGES", "QT_TRANSLATE_NOOP", "install", "language", "translate", "uninstall"]


def language(asked: str | None = None) -> str:
    if asked in LANGUAGES:
        return asked
    return "es" if QLocale.system().name().startswith("es") else "en"


def install(app, lang: str) -> QTranslator | None:
    """Load `lang`'s translation into `app` (a QCoreApplication); None for English or when the
    file is missing (the English source text shows). Keep the result: Qt does not own it.
    Qt's own strings (dialog buttons, context menus) come from the qtbase catalogue PySide6 ships."""
    if lang == "en":
        return None
    translator = QTranslator(app)
    if not translator.load(str(TRANSLATIONS / f"membound_{lang}.qm")):
        return None
    app.installTranslator(translator)
    qt = QTranslator(translator)
    qt_dir = QLibraryInfo.path(QLibraryInfo.LibraryPath.TranslationsPath)
    translator.qt = qt if qt.load(f"qtbase_{lang}", qt_dir) and app.installTranslator(qt) else None
    return translator


def uninstall(app, translator: QTranslator | None) -> None:
    if translator is not None:
        if getattr(translator, "qt", None) is not None:
            app.removeTranslator(translator.qt)
        app.removeTranslator(translator)
