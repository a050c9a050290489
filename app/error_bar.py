"""The window's error line: what went wrong (a refusal, a failure, a dead engine) in one line under
the controls, until it is dismissed or the next turn begins."""
from __future__ import annotations

from PySide6.QtWidgets import QHBoxLayout, QLabel, QPushButton, QWidget

from app.i18n import translate


class ErrorBar(QWidget):
    def __init__(self):
        super().__init__()
        self.label = QLabel("")
        self.label.setObjectName("error")
        self.label.setWordWrap(True)
        self.dismiss = QPushButton(translate("Window", "Dismiss"))
        self.dismiss.clicked.connect(lambda _checked=False: self.setVisible(False))
        row = QHBoxLayout(self)
        row.setContentsMargins(0, 0, 0, 0)
        row.addWidget(self.label, 1)
        row.addWidget(self.dismiss)
        self.setVisible(False)

    def show_message(self, message: str) -> None:
        self.label.setText(f"⚠  {message}")
        self.setVisible(True)
