"""The model picker: the models already on this machine (HF hub cache, LM Studio, llama.cpp, Ollama,
the user's folders; engine/io/discovery.py, listed in the background), the default model, a GGUF
file, an HF model folder, or a synthetic shape (random weights: the text is noise, the speed is real).
Returns a spec string for the engine."""
from __future__ import annotations

import threading
from typing import Callable

from PySide6.QtCore import Qt, QTimer
from PySide6.QtGui import QColor
from PySide6.QtWidgets import (
    QAbstractItemView,
    QComboBox,
    QDialog,
    QDialogButtonBox,
    QFileDialog,
    QFormLayout,
    QHBoxLayout,
    QHeaderView,
    QLabel,
    QLineEdit,
    QPushButton,
    QRadioButton,
    QTableWidget,
    QTableWidgetItem,
    QVBoxLayout,
    QWidget,
)

from app.i18n import QT_TRANSLATE_NOOP, translate
from engine.hardware.ceilings import device_chip, fit_on
from engine.io import discovery
from engine.model.config import NAMED_SHAPES

POLL_MS = 100  # how often the dialog looks for the background scan's result
COLUMNS = ("model", "architecture", "parameters", "file", "type", "fits", "ceiling", "from")
HEADERS = (QT_TRANSLATE_NOOP("ModelPicker", "model"), QT_TRANSLATE_NOOP("ModelPicker", "architecture"),
           QT_TRANSLATE_NOOP("ModelPicker", "parameters"), QT_TRANSLATE_NOOP("ModelPicker", "file"),
           QT_TRANSLATE_NOOP("ModelPicker", "type"), QT_TRANSLATE_NOOP("ModelPicker", "fits"),
           QT_TRANSLATE_NOOP("ModelPicker", "ceiling"), QT_TRANSLATE_NOOP("ModelPicker", "from"))  # COLUMNS' headers


class ModelPicker(QDialog):
    def __init__(self, current: str = "default", parent=None, hardware=None,
                 discover: Callable[[], list] | None = None):
        """hardware: the DeviceSpec the fit and ceiling columns are judged on (None: unknown).
        discover: what lists the models (engine.io.discovery.discover; tests pass their own)."""
        super().__init__(parent)
        self.setWindowTitle(translate("ModelPicker", "Open a model"))
        self.setMinimumWidth(880)
        self.hardware = hardware
        self._discover = discover or discovery.discover
        self._found: list = []
        self._result: list | None = None  # set by the scan thread, taken by the poll timer
        self._scan_thread: threading.Thread | None = None
        self._poll = QTimer(self)
        self._poll.setInterval(POLL_MS)
        self._poll.timeout.connect(self._take_result)

        self.found_radio = QRadioButton(translate("ModelPicker", "A model on this machine"))
        self.table = QTableWidget(0, len(COLUMNS))
        self.table.setHorizontalHeaderLabels([translate("ModelPicker", header) for header in HEADERS])
        self.table.setSelectionBehavior(QAbstractItemView.SelectionBehavior.SelectRows)
        self.table.setSelectionMode(QAbstractItemView.SelectionMode.SingleSelection)
        self.table.setEditTriggers(QAbstractItemView.EditTrigger.NoEditTriggers)
        self.table.verticalHeader().setVisible(False)
        self.table.horizontalHeader().setSectionResizeMode(QHeaderView.ResizeMode.ResizeToContents)
        self.table.horizontalHeader().setSectionResizeMode(0, QHeaderView.ResizeMode.Stretch)
        self.table.setMinimumHeight(220)
        self.table.itemSelectionChanged.connect(self._row_chosen)
        self.table.cellDoubleClicked.connect(lambda *_: self.accept() if self._chosen() else None)
        self.scan_status = QLabel("")
        self.scan_status.setObjectName("caption")
        self.scan_status.setWordWrap(True)
        rescan = QPushButton(translate("ModelPicker", "Look again"))
        rescan.clicked.connect(self.rescan)
        add_folder = QPushButton(translate("ModelPicker", "Add a folder…"))
        add_folder.clicked.connect(self._add_folder)
        scan_row = QHBoxLayout()
        scan_row.addWidget(self.scan_status, 1)
        scan_row.addWidget(rescan)
        scan_row.addWidget(add_folder)

        self.default_radio = QRadioButton(translate("ModelPicker", "Default model (SmolLM2-135M-Instruct, GGUF)"))
        self.gguf_radio = QRadioButton(translate("ModelPicker", "GGUF file"))
        self.hf_radio = QRadioButton(translate("ModelPicker", "Hugging Face model folder (config.json + safetensors)"))
        self.synthetic_radio = QRadioButton(
            translate("ModelPicker", "Synthetic shape — random weights: the text is noise, the speed is real"))
        self.path_edit = QLineEdit()
        self.path_edit.setPlaceholderText(translate("ModelPicker", "path to a .gguf file or a model folder"))
        browse = QPushButton(translate("ModelPicker", "Browse…"))
        browse.clicked.connect(self._browse)
        self.shape_box = QComboBox()
        self.shape_box.addItems(sorted(NAMED_SHAPES))
        self.device_box = QComboBox()
        self.device_box.addItem(translate("ModelPicker", "automatic (a GPU if there is one)"), "auto")
        self.device_box.addItem("CPU", "cpu")
        self.device_box.addItem(translate("ModelPicker", "CUDA GPU"), "cuda")
        path_row = QHBoxLayout()
        path_row.addWidget(self.path_edit, 1)
        path_row.addWidget(browse)
        path_widget = QWidget()
        path_widget.setLayout(path_row)
        form = QFormLayout()
        form.addRow(translate("ModelPicker", "Path"), path_widget)
        form.addRow(translate("ModelPicker", "Shape"), self.shape_box)
        form.addRow(translate("ModelPicker", "Device"), self.device_box)
        self.buttons = QDialogButtonBox(QDialogButtonBox.StandardButton.Open | QDialogButtonBox.StandardButton.Cancel)
        self.buttons.accepted.connect(self.accept)
        self.buttons.rejected.connect(self.reject)
        note = QLabel(translate("ModelPicker", "The current chat ends when a new model loads; a model that fails "
                                               "to load leaves the current one in place. A quantised file (Q4_K_M…) "
                                               "runs at the precision chosen (fp32, bf16): the fit and ceiling "
                                               "columns are for that."))
        note.setObjectName("caption")
        note.setWordWrap(True)
        layout = QVBoxLayout(self)
        layout.addWidget(self.found_radio)
        layout.addWidget(self.table)
        layout.addLayout(scan_row)
        for radio in (self.found_radio, self.default_radio, self.gguf_radio, self.hf_radio, self.synthetic_radio):
            if radio is not self.found_radio:
                layout.addWidget(radio)
            radio.toggled.connect(self._update)
        layout.addLayout(form)
        layout.addWidget(note)
        layout.addWidget(self.buttons)
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

    # ---- the list of models on disk ------------------------------------------------------------
    def showEvent(self, event) -> None:
        super().showEvent(event)
        if self._scan_thread is None:
            self.rescan()

    def rescan(self) -> None:
        """List the models again, off the GUI thread (reading headers of many files takes a while)."""
        if self._scan_thread is not None and self._scan_thread.is_alive():
            return
        self.scan_status.setText(translate("ModelPicker", "looking for models on this machine…"))
        self._result = None

        def scan() -> None:
            try:
                self._result = list(self._discover())
            except Exception as error:  # noqa: BLE001 (the list is a convenience: say so, keep the dialog)
                self._result = [str(error).splitlines()[0] if str(error) else type(error).__name__]

        self._scan_thread = threading.Thread(target=scan, name="model discovery", daemon=True)
        self._scan_thread.start()
        self._poll.start()

    @property
    def scanning(self) -> bool:
        return self._poll.isActive()

    def _take_result(self) -> None:
        result = self._result
        if result is None:
            return
        self._poll.stop()
        if result and isinstance(result[0], str):
            self.scan_status.setText(translate("ModelPicker", "could not list the models: {error}").format(
                error=result[0]))
            return
        self._show_found(result)

    def _show_found(self, found: list) -> None:
        self._found = found
        chip = device_chip(self.hardware) if self.hardware is not None else None
        dtype = "bf16" if self.hardware is not None and self.hardware.kind == "cuda" else "fp32"
        self.table.setRowCount(len(found))
        muted = QColor(self.palette().color(self.palette().ColorRole.PlaceholderText))
        for row, model in enumerate(found):
            fit = fit_on(model.cfg, model.n_params, chip, dtype)
            cells = dict(zip(discovery.COLUMNS, discovery.row_cells(model, fit)))
            cells["from"] = model.source
            tip = model.path if model.supported else \
                translate("ModelPicker", "cannot run: {reason}").format(reason=model.reason) + f"\n{model.path}"
            for col, name in enumerate(COLUMNS):
                item = QTableWidgetItem(cells[name])
                item.setToolTip(tip)
                if not model.supported:  # listed with its reason, not chosen
                    item.setFlags(item.flags() & ~Qt.ItemFlag.ItemIsSelectable)
                    item.setForeground(muted)
                self.table.setItem(row, col, item)
        usable = sum(m.supported for m in found)
        self.scan_status.setText(
            translate("ModelPicker", "{n} found ({usable} can run) in the HF cache, LM Studio, llama.cpp, Ollama and "
                                     "your folders; hover a greyed row for why it cannot run").format(
                n=len(found), usable=usable) if found else
            translate("ModelPicker", "no models found in the HF cache, LM Studio, llama.cpp, Ollama and your folders"))

    def _chosen(self):
        rows = {i.row() for i in self.table.selectedItems()}
        return self._found[rows.pop()] if len(rows) == 1 else None

    def _row_chosen(self) -> None:
        model = self._chosen()
        if model is None:
            return
        self.found_radio.setChecked(True)
        self.path_edit.setText(model.path)

    def _add_folder(self) -> None:
        folder = QFileDialog.getExistingDirectory(self, translate("ModelPicker", "A folder with models"))
        if folder:
            discovery.add_user_folder(folder)
            self.rescan()

    # ---- the other choices ---------------------------------------------------------------------
    def _update(self) -> None:
        wants_path = self.gguf_radio.isChecked() or self.hf_radio.isChecked()
        self.path_edit.setEnabled(wants_path)
        self.shape_box.setEnabled(self.synthetic_radio.isChecked())
        if not self.found_radio.isChecked():
            self.table.clearSelection()

    def _browse(self) -> None:
        if self.hf_radio.isChecked():
            path = QFileDialog.getExistingDirectory(self, translate("ModelPicker", "HF model folder"))
        else:
            self.gguf_radio.setChecked(True)
            path, _ = QFileDialog.getOpenFileName(self, translate("ModelPicker", "GGUF model"), "",
                                                  translate("ModelPicker", "GGUF models (*.gguf);;All files (*)"))
        if path:
            self.path_edit.setText(path)

    def spec(self) -> str:
        if self.synthetic_radio.isChecked():
            return f"synthetic:{self.shape_box.currentText()}"
        if self.found_radio.isChecked():
            model = self._chosen()
            return model.path if model is not None else ""
        if self.gguf_radio.isChecked() or self.hf_radio.isChecked():
            return self.path_edit.text().strip()
        return "default"

    def device(self) -> str:
        return self.device_box.currentData()

    def done(self, result: int) -> None:
        self._poll.stop()  # a scan still running finishes on its own (a daemon thread) and is dropped
        super().done(result)
