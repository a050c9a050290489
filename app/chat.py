"""The chat panel: a transcript that streams the reply as it is generated, an input line, and the
Send / Stop / New chat buttons. It shows the messages only (the chat template stays hidden). Tokens
that were speculative guesses the model kept are tinted, so the audience sees the guesses land."""
from __future__ import annotations

from PySide6.QtCore import Signal
from PySide6.QtGui import QColor, QFont, QTextBlockFormat, QTextCharFormat, QTextCursor
from PySide6.QtWidgets import QHBoxLayout, QLabel, QLineEdit, QPushButton, QTextBrowser, QVBoxLayout, QWidget

from app.theme import Theme

PLACEHOLDER = "Ask something… (Enter sends, Esc stops)"


class ChatPanel(QWidget):
    send_requested = Signal(str)
    stop_requested = Signal()
    new_chat_requested = Signal()

    def __init__(self, theme: Theme, parent=None):
        super().__init__(parent)
        self.theme = theme
        self.reply_text = ""  # the reply streaming now (or the last one)
        self._streaming = False

        title = QLabel("Chat")
        title.setObjectName("title")
        self.model_label = QLabel("no model loaded")
        self.model_label.setObjectName("caption")
        self.model_label.setWordWrap(True)
        self.transcript = QTextBrowser()
        self.transcript.setOpenExternalLinks(False)
        self.transcript.setObjectName("transcript")
        self.input = QLineEdit()
        self.input.setPlaceholderText(PLACEHOLDER)
        self.input.returnPressed.connect(self._send)
        self.send_button = QPushButton("Send")
        self.send_button.setObjectName("send")
        self.send_button.clicked.connect(self._send)
        self.stop_button = QPushButton("Stop  (Esc)")
        self.stop_button.setObjectName("stop")
        self.stop_button.setEnabled(False)
        self.stop_button.clicked.connect(self.stop_requested)
        self.new_button = QPushButton("New chat  (Ctrl+N)")
        self.new_button.clicked.connect(self.new_chat_requested)

        header = QVBoxLayout()
        header.setSpacing(0)
        header.addWidget(title)
        header.addWidget(self.model_label)
        buttons = QHBoxLayout()
        buttons.addWidget(self.input, 1)
        buttons.addWidget(self.send_button)
        row2 = QHBoxLayout()
        row2.addWidget(self.stop_button)
        row2.addWidget(self.new_button)
        row2.addStretch(1)
        layout = QVBoxLayout(self)
        layout.setContentsMargins(0, 0, 0, 0)
        layout.addLayout(header)
        layout.addWidget(self.transcript, 1)
        layout.addLayout(buttons)
        layout.addLayout(row2)
        self.set_ready(False)

    # ---- state --------------------------------------------------------------------------------
    def set_ready(self, ready: bool) -> None:
        """ready: a model is loaded and no reply is streaming."""
        self.send_button.setEnabled(ready)
        self._update_placeholder()

    def set_streaming(self, streaming: bool) -> None:
        self._streaming = streaming
        self.stop_button.setEnabled(streaming)
        self._update_placeholder()

    def _update_placeholder(self) -> None:
        if self.send_button.isEnabled():
            text = PLACEHOLDER
        elif self._streaming:
            text = "the model is replying… (Esc stops)"
        else:
            text = "waiting for the model…"
        self.input.setPlaceholderText(text)

    def set_theme(self, theme: Theme) -> None:
        """The transcript so far takes the new theme's colours and type size too (left as it was,
        dark-theme text is all but invisible on the light theme's white)."""
        old, self.theme = self.theme, theme
        roles = ("text", "muted", "accent", "error", "verify")  # the colours the transcript is written in
        colours = {QColor(getattr(old, r)).name(): QColor(getattr(theme, r)) for r in roles}
        scale = theme.font_pt / old.font_pt
        document = self.transcript.document()
        block = document.begin()
        while block.isValid():
            it = block.begin()
            while not it.atEnd():
                fragment = it.fragment()
                if fragment.isValid():
                    fmt = fragment.charFormat()
                    colour = colours.get(fmt.foreground().color().name())
                    if colour is not None:
                        fmt.setForeground(colour)
                    if fmt.fontPointSize() > 0:
                        fmt.setFontPointSize(fmt.fontPointSize() * scale)
                    cursor = QTextCursor(document)
                    cursor.setPosition(fragment.position())
                    cursor.setPosition(fragment.position() + fragment.length(), QTextCursor.MoveMode.KeepAnchor)
                    cursor.setCharFormat(fmt)
                it += 1
            block = block.next()

    def _send(self) -> None:
        text = self.input.text()
        if not text.strip() or not self.send_button.isEnabled():
            return
        self.input.clear()
        self.send_requested.emit(text)

    # ---- transcript ---------------------------------------------------------------------------
    def _cursor_at_end(self) -> QTextCursor:
        cursor = self.transcript.textCursor()
        cursor.movePosition(QTextCursor.MoveOperation.End)
        return cursor

    def _format(self, colour: str, bold: bool = False, italic: bool = False, scale: float = 1.0) -> QTextCharFormat:
        fmt = QTextCharFormat()
        fmt.setForeground(QColor(colour))
        fmt.setFontWeight(QFont.Weight.Bold if bold else QFont.Weight.Normal)
        fmt.setFontItalic(italic)
        fmt.setFontPointSize(self.theme.font_pt * scale)
        return fmt

    def _new_block(self, cursor: QTextCursor, top_margin: float) -> None:
        block = QTextBlockFormat()
        block.setTopMargin(top_margin)
        if self.transcript.document().isEmpty():
            cursor.setBlockFormat(block)
        else:
            cursor.insertBlock(block)

    def _keep_scrolled(self, at_bottom: bool) -> None:
        if at_bottom:
            bar = self.transcript.verticalScrollBar()
            bar.setValue(bar.maximum())

    def _at_bottom(self) -> bool:
        bar = self.transcript.verticalScrollBar()
        return bar.value() >= bar.maximum() - 4

    def add_message(self, role: str, text: str) -> None:
        at_bottom = self._at_bottom()
        cursor = self._cursor_at_end()
        names = {"user": ("You", self.theme.accent), "assistant": ("Model", self.theme.text),
                 "system": ("membound", self.theme.muted)}
        name, colour = names.get(role, (role, self.theme.text))
        self._new_block(cursor, 10)
        cursor.insertText(name, self._format(colour, bold=True, scale=0.85))
        cursor.insertBlock()
        cursor.insertText(text, self._format(self.theme.text))
        self._keep_scrolled(at_bottom)

    def begin_reply(self) -> None:
        self.reply_text = ""
        at_bottom = self._at_bottom()
        cursor = self._cursor_at_end()
        self._new_block(cursor, 10)
        cursor.insertText("Model", self._format(self.theme.muted, bold=True, scale=0.85))
        cursor.insertBlock()
        self._keep_scrolled(at_bottom)

    def append_reply(self, text: "str | list[tuple[str, bool]]") -> None:
        """Streamed text of the reply: one insertion per batch of tokens, or per run of (text,
        drafted) pieces alike (drafted: an accepted speculative guess, tinted)."""
        pieces = [(text, False)] if isinstance(text, str) else text
        runs: list[list] = []
        for piece, drafted in pieces:
            if not piece:
                continue
            if runs and runs[-1][1] == drafted:
                runs[-1][0] += piece
            else:
                runs.append([piece, drafted])
        if not runs:
            return
        at_bottom = self._at_bottom()
        cursor = self._cursor_at_end()
        for piece, drafted in runs:
            self.reply_text += piece
            cursor.insertText(piece, self._format(self.theme.verify if drafted else self.theme.text))
        self._keep_scrolled(at_bottom)

    def end_reply(self, summary: str) -> None:
        at_bottom = self._at_bottom()
        cursor = self._cursor_at_end()
        cursor.insertBlock()
        cursor.insertText(summary, self._format(self.theme.muted, italic=True, scale=0.85))
        self._keep_scrolled(at_bottom)

    def add_notice(self, text: str, error: bool = False) -> None:
        at_bottom = self._at_bottom()
        cursor = self._cursor_at_end()
        self._new_block(cursor, 8)
        colour = self.theme.error if error else self.theme.muted
        cursor.insertText(("⚠ " if error else "") + text, self._format(colour, bold=error, scale=0.9))
        self._keep_scrolled(at_bottom)

    def clear(self) -> None:
        self.transcript.clear()
        self.reply_text = ""

    def plain_text(self) -> str:
        return self.transcript.toPlainText()

