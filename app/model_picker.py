"""The model picker: the default model, a GGUF file, an HF model folder, or a synthetic shape
(random weights: the text is noise, the speed is real). Returns a spec string for the engine."""
from __future__ import annotations

from PySide6.QtWidgets import (
    QComboBox,
    QDialog,
    QDialogButtonBox,
    QFileDialog,
    QFormLayout,
    QHBoxLayout,
    QLabel,
    QLineEdit,
    QPushButton,
    QRadioButton,
    QVBoxLayout,
    QWidget,
)

from engine.model.config import NAMED_SHAPES


class ModelPicker(QDialog):
    def __init__(self, current: str = "default", parent=None):
        super().__init__(parent)
        self.setWindowTitle("Open a model")
        self.setMinimumWidth(560)
        self.default_radio = QRadioButton("Default model (SmolLM2-135M-Instruct, GGUF)")
        self.gguf_radio = QRadioButton("GGUF file")
        self.hf_radio = QRadioButton("Hugging Face model folder (config.json + safetensors)")
        self.synthetic_radio = QRadioButton("Synthetic shape — random weights: the text is noise, the speed is real")
        self.path_edit = QLineEdit()
        self.path_edit.setPlaceholderText("path to a .gguf file or a model folder")
        browse = QPushButton("Browse…")
        browse.clicked.connect(self._browse)
        self.shape_box = QComboBox()
        self.shape_box.addItems(sorted(NAMED_SHAPES))
        self.device_box = QComboBox()
        self.device_box.addItem("automatic (a GPU if there is one)", "auto")
        self.device_box.addItem("CPU", "cpu")
        self.device_box.addItem("CUDA GPU", "cuda")
        path_row = QHBoxLayout()
        path_row.addWidget(self.path_edit, 1)
        path_row.addWidget(browse)
        path_widget = QWidget()
        path_widget.setLayout(path_row)
        form = QFormLayout()
        form.addRow("Path", path_widget)
        form.addRow("Shape", self.shape_box)
        form.addRow("Device", self.device_box)
        buttons = QDialogButtonBox(QDialogButtonBox.StandardButton.Open | QDialogButtonBox.StandardButton.Cancel)
        buttons.accepted.connect(self.accept)
        buttons.rejected.connect(self.reject)
        note = QLabel("The current chat ends when a new model loads; a model that fails to load leaves "
                      "the current one in place.")
        note.setObjectName("caption")
        note.setWordWrap(True)
        layout = QVBoxLayout(self)
        for radio in (self.default_radio, self.gguf_radio, self.hf_radio, self.synthetic_radio):
            layout.addWidget(radio)
            radio.toggled.connect(self._update)
        layout.addLayout(form)
        layout.addWidget(note)
        layout.addWidget(buttons)
        if current.startswith("synthetic:"):
            self.synthetic_radio.setChecked(True)
            self.shape_box.setCurrentText(current.split(":", 1)[1])
        elif current.endswith(".gguf"):
            self.gguf_radio.setChecked(True)
            self.path_edit.setText(current)
        elif current != "default":
            self.hf_radio.setChecked(True)
            self.path_edit.setText(current)
        else:
            self.default_radio.setChecked(True)
        self._update()

    def _update(self) -> None:
        wants_path = self.gguf_radio.isChecked() or self.hf_radio.isChecked()
        self.path_edit.setEnabled(wants_path)
        self.shape_box.setEnabled(self.synthetic_radio.isChecked())

    def _browse(self) -> None:
        if self.hf_radio.isChecked():
            path = QFileDialog.getExistingDirectory(self, "HF model folder")
        else:
            self.gguf_radio.setChecked(True)
            path, _ = QFileDialog.getOpenFileName(self, "GGUF model", "", "GGUF models (*.gguf);;All files (*)")
        if path:
            self.path_edit.setText(path)

    def spec(self) -> str:
        if self.synthetic_radio.isChecked():
            return f"synthetic:{self.shape_box.currentText()}"
        if self.gguf_radio.isChecked() or self.hf_radio.isChecked():
            return self.path_edit.text().strip()
        return "default"

    def device(self) -> str:
        return self.device_box.currentData()
