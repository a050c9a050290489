"""Talk mode put together on a window: the presenter layout (number keys), keep-decoding (Ctrl+K),
export (Ctrl+E), and a tour with its caption in large type and a presentation clicker's keys
(PageDown/Right next, PageUp/Left back, B or . the captions); in a replay, the recorded captions
and layouts. `install(window, …)` returns the `Talk` that holds them."""
from __future__ import annotations

from PySide6.QtCore import QEvent, QObject, Qt, QTimer
from PySide6.QtGui import QKeySequence, QShortcut
from PySide6.QtWidgets import (
    QAbstractSpinBox,
    QApplication,
    QFileDialog,
    QFrame,
    QLabel,
    QLineEdit,
    QPlainTextEdit,
    QPushButton,
    QTextEdit,
    QVBoxLayout,
)

from app.i18n import translate
from app.keep_decoding import KeepDecoding
from app.presenter import PLOT_KEYS, Presenter

NEXT_KEYS = {Qt.Key.Key_PageDown, Qt.Key.Key_Right}
BACK_KEYS = {Qt.Key.Key_PageUp, Qt.Key.Key_Left}
CAPTION_KEYS = {Qt.Key.Key_B, Qt.Key.Key_Period}  # clickers' "blank screen" button sends one of them
ALWAYS = {Qt.Key.Key_PageDown, Qt.Key.Key_PageUp}  # keys no text field uses: the tour's even while typing
DIGITS = {getattr(Qt.Key, f"Key_{n}"): n for n in range(10)}
HINTS = {"en": "PgDn next · PgUp back · B captions", "es": "AvPág sigue · RePág atrás · B subtítulos"}


class CaptionBanner(QFrame):
    """The tour's caption in large type, at the top of the chat column (it takes room from the
    transcript, never from the plots or over them); B hides and shows it."""

    def __init__(self, window, lang: str = "en"):
        super().__init__(window)
        self.window_ = window
        self.lang = lang
        self.setObjectName("caption_banner")
        self.where = QLabel()
        self.title = QLabel()
        self.text = QLabel()
        for label in (self.where, self.title, self.text):
            label.setWordWrap(True)
            label.setTextFormat(Qt.TextFormat.PlainText)
        column = QVBoxLayout(self)
        column.setContentsMargins(12, 8, 12, 10)
        column.setSpacing(2)
        column.addWidget(self.where)
        column.addWidget(self.title)
        column.addWidget(self.text)
        self.wanted = True  # the person's choice (B); hidden too while there is no caption
        self.setVisible(False)
        window.chat.layout().insertWidget(1, self)
        window.installEventFilter(self)
        self._style()

    def show_step(self, step, index: int, count: int) -> None:
        self.show_text(step.title, step.caption, f"{index + 1} / {count}  ·  {HINTS.get(self.lang, HINTS['en'])}")

    def show_text(self, title: str, caption: str, where: str = "") -> None:
        self.where.setText(where)
        self.title.setText(title)
        self.text.setText(caption)
        self.window_.action.emit("caption", (title, caption, where))
        self.setVisible(self.wanted and bool(title or caption))
        self._fit()

    def toggle(self) -> None:
        self.set_wanted(not self.wanted)

    def set_wanted(self, wanted: bool) -> None:
        self.wanted = wanted
        self.window_.action.emit("captions", (wanted,))
        self.setVisible(wanted and bool(self.title.text() or self.text.text()))

    def _style(self) -> None:
        t = self.window_.theme
        self.setStyleSheet(
            f"QFrame#caption_banner {{ background: {t.panel}; border: 3px solid {t.accent}; border-radius: 10px; }}"
            f"QLabel {{ background: transparent; border: 0px; }}")
        self.where.setStyleSheet(f"color: {t.muted}; font-size: {max(t.font_pt - 2, 9)}pt;")
        self.title.setStyleSheet(f"color: {t.text}; font-weight: bold; font-size: {round(t.font_pt * 1.4)}pt;")
        self.text.setStyleSheet(f"color: {t.text}; font-size: {t.font_pt}pt;")

    def eventFilter(self, watched, event) -> bool:
        if watched is self.window_ and event.type() == QEvent.Type.StyleChange:  # the theme or font size changed
            self._style()
            self._fit()
        return False

    def resizeEvent(self, event) -> None:
        super().resizeEvent(event)
        if event.size().width() != event.oldSize().width():
            self._fit()

    def _fit(self) -> None:
        """As tall as the wrapped caption needs at this width (the transcript below gives way): a
        squeezed caption would draw its lines over each other."""
        height = self.layout().totalHeightForWidth(self.width())
        if height > 0 and height != self.minimumHeight():
            self.setMinimumHeight(height)


class TalkKeys(QObject):
    """The clicker's and the presenter's keys, seen before any widget: an application event filter,
    active only for keys pressed in `talk.window`. Keys a text field uses go to it while it has the focus."""

    def __init__(self, talk: "Talk"):
        super().__init__(talk)
        self.talk = talk
        QApplication.instance().installEventFilter(self)
        talk.window.closing.connect(self.remove)

    def remove(self) -> None:
        app = QApplication.instance()
        if app is not None:
            app.removeEventFilter(self)

    def eventFilter(self, watched, event) -> bool:
        if event.type() != QEvent.Type.KeyPress or event.isAutoRepeat():
            return False
        window = self.talk.window
        if not isinstance(watched, QObject) or not hasattr(watched, "window") or watched.window() is not window:
            return False
        return self.handle(event.key(), event.modifiers())

    def handle(self, key, modifiers) -> bool:
        talk = self.talk
        mods = modifiers & ~Qt.KeyboardModifier.KeypadModifier
        plain = mods == Qt.KeyboardModifier.NoModifier
        typing = _typing()
        if talk.runner is not None and plain and (key in ALWAYS or not typing):
            if key in NEXT_KEYS:
                talk.runner.next()
                return True
            if key in BACK_KEYS:
                talk.runner.back()
                return True
        if talk.overlay is not None and plain and not typing and key in CAPTION_KEYS:
            talk.overlay.toggle()
            return True
        if key in DIGITS and ((plain and not typing) or mods == Qt.KeyboardModifier.ControlModifier):
            if DIGITS[key] in PLOT_KEYS or DIGITS[key] == 0:
                talk.presenter.press(DIGITS[key])
                return True
        return False


def _typing() -> bool:
    focus = QApplication.focusWidget()
    return isinstance(focus, (QLineEdit, QTextEdit, QPlainTextEdit, QAbstractSpinBox)) and \
        not getattr(focus, "isReadOnly", lambda: False)()


class Talk(QObject):
    def __init__(self, window, lang: str = "en"):
        super().__init__(window)
        self.window = window
        self.lang = lang
        self.presenter = Presenter(window)
        self.overlay = CaptionBanner(window, lang)
        self.keep: KeepDecoding | None = None
        self.runner = None
        self.keys = TalkKeys(self)
        self.shortcuts: list[QShortcut] = []
        self._look = None
        window.installEventFilter(self)
        self._note_look()

    def _note_look(self) -> None:
        """The theme and type size, recorded when they change (a replay looks as the talk did)."""
        look = (self.window.theme.name, self.window.theme.large)
        if look != self._look:
            self._look = look
            self.window.action.emit("look", look)

    def eventFilter(self, watched, event) -> bool:
        if watched is self.window and event.type() == QEvent.Type.StyleChange:
            self._note_look()
        return False

    def add_shortcut(self, keys: str, action) -> None:
        shortcut = QShortcut(QKeySequence(keys), self.window)
        shortcut.activated.connect(action)
        self.shortcuts.append(shortcut)


def install(window, *, tour=None, lang: str = "en", keep_decoding: bool = False, autoplay: bool = False,
            player=None) -> Talk:
    """Talk mode on `window`. tour: an app.tour.Tour to run (it starts once the model is loaded);
    player: an app.replay.Player (a replay: recorded captions and layouts, nothing that drives)."""
    talk = Talk(window, lang)
    window.talk = talk
    if player is not None:
        player.handlers["layout"] = talk.presenter.show
        player.handlers["caption"] = talk.overlay.show_text
        player.handlers["captions"] = talk.overlay.set_wanted
        player.handlers["look"] = lambda name, large: set_look(window, name, large)
        return talk
    talk.keep = KeepDecoding(window, lang)
    keep_button = QPushButton(translate("Talk", "Keep decoding  Ctrl+K"))
    keep_button.setCheckable(True)
    keep_button.setToolTip(translate("Talk", "the model keeps talking until stopped (Esc): each reply runs to its "
                                             "token budget, then a follow-up; when the context fills, a new chat "
                                             "starts"))
    keep_button.clicked.connect(lambda _checked: talk.keep.toggle())
    talk.keep.changed.connect(keep_button.setChecked)
    export_button = QPushButton(translate("Talk", "Export…  Ctrl+E"))
    export_button.setToolTip(translate("Talk", "the window and each plot as PNG and SVG, the steps as CSV, "
                                               "a one-page report"))
    export_button.clicked.connect(lambda: export_dialog(window))
    window.controls.extra.insertWidget(0, keep_button)
    window.controls.extra.insertWidget(1, export_button)
    talk.keep_button, talk.export_button = keep_button, export_button
    talk.add_shortcut("Ctrl+K", talk.keep.toggle)
    talk.add_shortcut("Ctrl+E", lambda: export_dialog(window))
    if tour is not None:
        from app.tour import TourRunner

        talk.runner = TourRunner(window, tour, talk.presenter, talk.overlay, talk.keep, autoplay=autoplay)
        window.plots.setFocus()  # a tour sends its own prompts: the clicker's arrows and B are the tour's
        if tour.large_fonts and not window.theme.large:
            window.set_large_fonts(True)
        for number, why in tour.skipped:  # checked on this machine (membound --tour … --check)
            window.chat.add_notice(translate("Talk", "tour step {number} left out: on this machine {why}").format(
                number=number, why=why), error=True)
        QTimer.singleShot(0, talk.runner, talk.runner.start)
    elif keep_decoding:
        talk.keep.start()
    return talk


def set_look(window, name: str, large: bool) -> None:
    if window.theme.name != name:
        window.view.toggle_theme()
    if window.theme.large != large:
        window.set_large_fonts(large)


def export_dialog(window) -> None:
    from app.export import export_session

    folder = QFileDialog.getExistingDirectory(window, translate("Talk", "Export the session into a folder"))
    if not folder:
        return
    try:
        written = export_session(window, folder)
    except (OSError, ValueError) as error:
        window.show_error(translate("Talk", "export failed: {error}").format(error=error))
        return
    window.chat.add_notice(translate("Talk", "exported {n} files to {folder} (report.md, steps.csv, PNG and SVG)")
                           .format(n=len(written), folder=folder))
