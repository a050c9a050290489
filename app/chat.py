"""The chat panel: a transcript that streams the reply as it is generated, an input line, and the
Send / Stop / New chat buttons. It shows the messages only (the chat template stays hidden). Tokens
that were speculative guesses the model kept are tinted, so the audience sees the guesses land."""
from __future__ import annotations

from PySide6.QtCore import Signal
from PySide6.QtGui import QColor, QFont, QTextBlockFormat, QTextCharFormat, QTextCursor
from PySide6.QtWidgets import QHBoxLayout, QLabel, QLineEdit, QPushButton, QTextBrowser, QVBoxLayout, QWidget

from app.flow_layout import FlowLayout
from app.i18n import QT_TRANSLATE_NOOP, translate
from app.theme import Theme

PLACEHOLDER = QT_TRANSLATE_NOOP("Chat", "Ask something… (Enter sends, Esc stops)")


class ChatPanel(QWidget):
    send_requested = Signal(str)
    stop_requested = Signal()
    new_chat_requested = Signal()

    def __init__(self, theme: Theme, parent=None):
        super().__init__(parent)
        self.theme = theme
        self.reply_text = ""  # the reply streaming now (or the last one)
        # [kind, text, extra] per block: what the transcript is drawn from (a reply's text: its runs)
        self._entries: list[list] = []
        self._streaming = False
        # a notice that comes while a reply streams (a step above the roof, a refused setting) is
        # drawn after the reply, not inside it: the reply's text stays one paragraph of prose
        self._reply_open = False
        self._held_notices: list[tuple[str, bool]] = []

        self.title = title = QLabel(translate("Chat", "Chat"))
        title.setObjectName("title")
        self.model_label = QLabel(translate("Chat", "no model loaded"))
        self.model_label.setObjectName("caption")
        self.model_label.setWordWrap(True)
        self.transcript = QTextBrowser()
        self.transcript.setOpenExternalLinks(False)
        self.transcript.setObjectName("transcript")
        self.input = QLineEdit()
        self.input.setPlaceholderText(translate("Chat", PLACEHOLDER))
        self.input.returnPressed.connect(self._send)
        self.send_button = QPushButton(translate("Chat", "Send"))
        self.send_button.setObjectName("send")
        self.send_button.clicked.connect(self._send)
        self.stop_button = QPushButton(translate("Chat", "Stop  (Esc)"))
        self.stop_button.setObjectName("stop")
        self.stop_button.setEnabled(False)
        self.stop_button.clicked.connect(self.stop_requested)
        self.new_button = QPushButton(translate("Chat", "New chat  (Ctrl+N)"))
        self.new_button.clicked.connect(self.new_chat_requested)

        header = QVBoxLayout()
        header.setSpacing(0)
        header.addWidget(title)
        header.addWidget(self.model_label)
        buttons = QHBoxLayout()
        buttons.addWidget(self.input, 1)
        buttons.addWidget(self.send_button)
        row2 = FlowLayout(spacing=6, line_spacing=4)  # (wraps in a narrow chat, rather than widen it)
        row2.addWidget(self.stop_button)
        row2.addWidget(self.new_button)
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
        if not streaming:  # (a reply that failed ends without a summary)
            self._close_reply()
        self.stop_button.setEnabled(streaming)
        self._update_placeholder()

    def _update_placeholder(self) -> None:
        if self.send_button.isEnabled():
            text = translate("Chat", PLACEHOLDER)
        elif self._streaming:
            text = translate("Chat", "the model is replying… (Esc stops)")
        else:
            text = translate("Chat", "waiting for the model…")
        self.input.setPlaceholderText(text)

    def set_compact(self, compact: bool) -> None:
        """Compact (the presenter layout): no title and no Stop / New chat row (Esc and Ctrl+N work)."""
        for widget in (self.title, self.stop_button, self.new_button):
            widget.setVisible(not compact)

    def set_theme(self, theme: Theme) -> None:
        """New colours and type size for every line already there, and for what follows."""
        changed = theme != self.theme
        self.theme = theme
        if changed and self._entries:
            self._redraw()

    def _send(self) -> None:
        text = self.input.text()
        if not text.strip() or not self.send_button.isEnabled():
            return
        self.input.clear()
        self.send_requested.emit(text)

    # ---- transcript ---------------------------------------------------------------------------
    # The transcript is kept as entries and drawn from them, so a change of theme or font size
    # redraws every line in the new colours (text written in the dark theme's light grey would
    # otherwise stay on the light theme's white).
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

    def _draw(self, entry: list) -> None:
        """One entry at the end of the document: [kind, text, extra]."""
        kind, text, extra = entry
        cursor = self._cursor_at_end()
        t = self.theme
        if kind == "message":
            names = {"user": (translate("Chat", "You"), t.accent), "assistant": (translate("Chat", "Model"), t.text),
                     "system": ("membound", t.muted)}
            name, colour = names.get(extra, (extra, t.text))
            self._new_block(cursor, 10)
            cursor.insertText(name, self._format(colour, bold=True, scale=0.85))
            cursor.insertBlock()
            cursor.insertText(text, self._format(t.text))
        elif kind == "reply":
            self._new_block(cursor, 10)
            cursor.insertText(translate("Chat", "Model"), self._format(t.muted, bold=True, scale=0.85))
            cursor.insertBlock()
            for piece, drafted in text:  # drafted: an accepted speculative guess, tinted
                cursor.insertText(piece, self._format(t.verify if drafted else t.text))
        elif kind == "summary":
            cursor.insertBlock()
            cursor.insertText(text, self._format(t.muted, italic=True, scale=0.85))
        elif kind == "notice":
            self._new_block(cursor, 8)
            colour = t.error if extra else t.muted
            cursor.insertText(("⚠ " if extra else "") + text, self._format(colour, bold=bool(extra), scale=0.9))

    def _add(self, kind: str, text: str = "", extra=None) -> None:
        at_bottom = self._at_bottom()
        entry = [kind, text, extra]
        self._entries.append(entry)
        self._draw(entry)
        self._keep_scrolled(at_bottom)

    def _redraw(self) -> None:
        at_bottom = self._at_bottom()
        self.transcript.clear()
        for entry in self._entries:
            self._draw(entry)
        self._keep_scrolled(at_bottom)

    def add_message(self, role: str, text: str) -> None:
        self._add("message", text, role)

    def begin_reply(self) -> None:
        self._close_reply()
        self.reply_text = ""
        self._add("reply", [])  # its text: (piece, drafted) runs
        self._reply_open = True

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
        reply = self._entries[-1] if self._entries and self._entries[-1][0] == "reply" else None
        for piece, drafted in runs:
            self.reply_text += piece
            if reply is not None:
                reply[1].append((piece, drafted))
            cursor.insertText(piece, self._format(self.theme.verify if drafted else self.theme.text))
        self._keep_scrolled(at_bottom)

    def end_reply(self, summary: str) -> None:
        self._add("summary", summary)
        self._close_reply()

    def _close_reply(self) -> None:
        self._reply_open = False
        held, self._held_notices = self._held_notices, []
        for text, error in held:
            self._add("notice", text, error)

    def add_notice(self, text: str, error: bool = False) -> None:
        if self._reply_open:
            self._held_notices.append((text, error))
        else:
            self._add("notice", text, error)

    def clear(self) -> None:
        self.transcript.clear()
        self._entries = []
        self._held_notices = []
        self._reply_open = False
        self.reply_text = ""

    def plain_text(self) -> str:
        return self.transcript.toPlainText()

