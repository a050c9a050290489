"""The "what the hardware allows" panel: the seed table (model x chip -> batch-1 decode ceiling in
tokens/s, OOM where the weights do not fit) for the loaded model, reference shapes, this device
and the A100/H100/H200."""
from __future__ import annotations

from PySide6.QtCore import Qt
from PySide6.QtGui import QColor, QFont
from PySide6.QtWidgets import (
    QAbstractItemView,
    QComboBox,
    QFrame,
    QHBoxLayout,
    QHeaderView,
    QLabel,
    QTableWidget,
    QTableWidgetItem,
    QVBoxLayout,
)

from app.i18n import translate
from app.theme import SettingColours, Theme
from engine.hardware.ceilings import (
    FORMATS,
    GROUP_SIZE,
    REFERENCE_GPUS,
    TP_DEGREES,
    TP_GPU,
    Chip,
    ModelSize,
    device_chip,
    format_params,
    gpu_chip,
    model_size,
    reference_models,
    seed_table,
    tp_ceiling,
)


def short_chip(label: str) -> str:
    """"A100 80GB SXM" -> "A100": the columns are narrow; the tooltip has the full name."""
    return label if label.startswith("this ") else label.split()[0]


def short_model(label: str, width: int = 16) -> str:
    """"SmolLM2-135M-Instruct.Q4_1.gguf (Q4_1 → fp32)" -> "SmolLM2-135M-In…": the row header
    must leave the columns room; the tooltip has the full name."""
    name = label.split(" (")[0].removesuffix(".gguf").split(".")[0]
    return name if len(name) <= width else name[: width - 1] + "…"


def format_bandwidth(gbs: float) -> str:
    return f"{gbs / 1000:.1f} TB/s" if gbs >= 1000 else f"{gbs:.0f} GB/s"


class SeedTable(QFrame):
    def __init__(self, theme: Theme, colours: SettingColours, parent=None):
        super().__init__(parent)
        self.setObjectName("panel")
        self.theme = theme
        self.colours = colours
        self.model: ModelSize | None = None
        self.model_tooltip = ""
        self.compact = False
        self.device: Chip | None = None
        self.title = title = QLabel(translate("SeedTable", "What the hardware allows"))
        title.setObjectName("title")
        self.format_box = QComboBox()
        for name in FORMATS:
            self.format_box.addItem(translate("SeedTable", "{name} weights").format(name=name), name)
        self.format_box.setCurrentIndex(list(FORMATS).index("bf16"))
        self.format_box.currentIndexChanged.connect(self.refresh)
        self.format_box.setToolTip(translate(
            "SeedTable", "the weights' format the table assumes, as the engine stores it (INT4: groups of {group}, "
                         "an fp16 scale and min a group, the head at INT8)").format(group=GROUP_SIZE))
        self.caption = caption = QLabel()
        caption.setObjectName("caption")
        caption.setWordWrap(True)
        self.table = QTableWidget()
        self.table.setEditTriggers(QAbstractItemView.EditTrigger.NoEditTriggers)
        self.table.setSelectionMode(QAbstractItemView.SelectionMode.NoSelection)
        self.table.setFocusPolicy(Qt.FocusPolicy.NoFocus)
        self.table.verticalHeader().setSectionResizeMode(QHeaderView.ResizeMode.Stretch)
        self.table.horizontalHeader().setSectionResizeMode(QHeaderView.ResizeMode.Stretch)
        self.table.verticalHeader().setDefaultAlignment(Qt.AlignmentFlag.AlignLeft | Qt.AlignmentFlag.AlignVCenter)
        self.table.setWordWrap(False)
        header = QHBoxLayout()
        header.addWidget(title)
        header.addStretch(1)
        header.addWidget(self.format_box)
        layout = QVBoxLayout(self)
        layout.setContentsMargins(8, 6, 8, 6)
        layout.setSpacing(4)
        layout.addLayout(header)
        layout.addWidget(self.table, 1)
        layout.addWidget(caption)
        self.refresh()

    def set_model(self, cfg, label: str, hardware, dtype: str) -> None:
        self.model = model_size(cfg, short_model(label))
        self.model_tooltip = translate("SeedTable", "the loaded model: {model}").format(model=label)
        self.device = device_chip(hardware)
        index = self.format_box.findData(dtype)
        if index >= 0:
            self.format_box.blockSignals(True)
            self.format_box.setCurrentIndex(index)
            self.format_box.blockSignals(False)
        self.refresh()

    def set_theme(self, theme: Theme) -> None:
        self.theme = theme
        self.refresh()

    def set_compact(self, compact: bool) -> None:
        """Compact (the presenter layout): the table takes the caption's room; the caption becomes
        the title's tooltip."""
        self.compact = compact
        self.caption.setVisible(not compact)
        self.title.setToolTip(self.caption.text() if compact else "")
        self.refresh()

    @property
    def weight_format(self) -> str:
        return self.format_box.currentData()

    def refresh(self) -> None:
        models = ([self.model] if self.model else []) + reference_models()
        chips = ([self.device] if self.device else []) + [gpu_chip(label) for label in REFERENCE_GPUS]
        cells = seed_table(models, chips, self.weight_format)
        tp_gpu = gpu_chip(TP_GPU)
        for model, row in zip(models, cells):  # tensor parallelism: n GPUs, each reads 1/n of the weights
            row += [tp_ceiling(model, tp_gpu, n, self.weight_format) for n in TP_DEGREES]
        device = f"{self.device.label} {self.device.source}, " if self.device else ""
        self.caption.setText(translate(
            "SeedTable", "max batch-1 decode tokens/s = bandwidth ÷ weight bytes per token (model); OOM: the "
                         "weights alone exceed the chip's memory. Bandwidth: {device}GPUs from datasheets. "
                         "TP n: n × {gpu}, each reading 1/n of the weights, plus two all-reduces per layer at NVLink "
                         "bandwidth ({link_gbs} GB/s; latency not counted).").format(
            device=device, gpu=short_chip(TP_GPU), link_gbs=f"{tp_gpu.link_gbs:.0f}"))
        self.table.clear()
        self.table.setRowCount(len(models))
        self.table.setColumnCount(len(chips) + len(TP_DEGREES))
        self.table.setHorizontalHeaderLabels([f"{short_chip(c.label)}\n{format_bandwidth(c.bandwidth_gbs)}"
                                              for c in chips]
                                             + [f"TP {n}\n{n}×{short_chip(TP_GPU)}" for n in TP_DEGREES])
        for i, chip in enumerate(chips):
            memory = f", {chip.memory_bytes / 1e9:.0f} GB" if chip.memory_bytes else ""
            self.table.horizontalHeaderItem(i).setToolTip(
                f"{chip.label}: {chip.bandwidth_gbs:,.1f} GB/s ({chip.source}){memory}")
        for i, n in enumerate(TP_DEGREES, len(chips)):
            self.table.horizontalHeaderItem(i).setToolTip(translate(
                "SeedTable", "tensor parallelism over {n} {gpu}: {memory_gb} GB together; each GPU reads its 1/{n} of "
                             "every weight matrix at {gbs} GB/s, and every layer all-reduces its hidden vector twice "
                             "over NVLink ({link_gbs} GB/s both ways)").format(
                n=n, gpu=TP_GPU, memory_gb=f"{n * tp_gpu.memory_bytes / 1e9:.0f}", gbs=f"{tp_gpu.bandwidth_gbs:,.0f}",
                link_gbs=f"{tp_gpu.link_gbs:.0f}"))
        # compact: the size under the name, so the columns get the width (the rows have the height)
        between, width = ("\n", 12) if self.compact else ("  ", 16)
        names = [m.label if len(m.label) <= width else m.label[: width - 1] + "…" for m in models]
        self.table.setVerticalHeaderLabels([f"{name}{between}{format_params(m.stored_params)}"
                                            for name, m in zip(names, models)])
        if self.model:
            loaded = self.table.verticalHeaderItem(0)
            loaded.setToolTip(self.model_tooltip)
            font = QFont()
            font.setBold(True)
            font.setUnderline(True)
            loaded.setFont(font)
        colour = self.colours.option_colour(self.weight_format) or self.theme.text
        bold = QFont()
        bold.setBold(True)
        for r, row in enumerate(cells):
            for c, cell in enumerate(row):
                item = QTableWidgetItem(cell.text())
                item.setTextAlignment(Qt.AlignmentFlag.AlignCenter)
                item.setForeground(QColor(self.theme.error if not cell.fits else colour))
                if not cell.fits:
                    item.setFont(bold)
                tip = translate("SeedTable", "{read_gb} GB read per token; {held_gb} GB of weights held")
                item.setToolTip(tip.format(read_gb=f"{cell.weight_bytes_per_token / 1e9:.2f}",
                                           held_gb=f"{cell.stored_bytes / 1e9:.1f}"))
                self.table.setItem(r, c, item)
