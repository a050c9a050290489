"""The "what the hardware allows" panel: the seed table (model x chip -> batch-1 decode ceiling in
tokens/s, OOM where the weights do not fit) for the loaded model, reference shapes, this device
and the A100/H100/H200.

Readable at any size: the columns are as wide as their numbers and headers (never elided), the rest
shared out; where that does not fit, the headers take more lines and the rows name the model's size
only (its name in the tooltip), the caption moves into the title's tooltip, and only a table that
still does not fit scrolls."""
from __future__ import annotations

from PySide6.QtCore import QEvent, Qt
from PySide6.QtGui import QColor, QFont, QFontMetrics
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


LEVELS = 3  # 0: one-line row headers; 1: the size under the name; 2: the size only, headers on three lines
CELL_PADDING = 10  # pixels beside a cell's text (the style's padding and the grid line)
HEADER_PADDING = 6  # above and below a header's lines
ROW_PADDING = 4  # above and below a row's line(s)


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
        title.setWordWrap(True)  # (a narrow cell: it takes two lines rather than the table's width)
        self.level = 0  # how abbreviated the headers are (LEVELS)
        self._headers: list[tuple[str, ...]] = []  # per column: its header at each level
        self._row_headers: list[tuple[str, ...]] = []
        self.format_box = QComboBox()
        for name in FORMATS:
            self.format_box.addItem(name, name)  # (beside the tabs: short; its tooltip says what it is)
        self.format_box.setCurrentIndex(list(FORMATS).index("bf16"))
        self.format_box.currentIndexChanged.connect(self.refresh)
        self.format_tip = translate(
            "SeedTable", "the weights' format the table assumes, as the engine stores it (INT4: groups of {group}, "
                         "an fp16 scale and min a group, the head at INT8)").format(group=GROUP_SIZE)
        self.format_box.setToolTip(self.format_tip)
        self.caption = caption = QLabel()
        caption.setObjectName("caption")
        caption.setWordWrap(True)
        self.table = QTableWidget()
        self.table.setEditTriggers(QAbstractItemView.EditTrigger.NoEditTriggers)
        self.table.setSelectionMode(QAbstractItemView.SelectionMode.NoSelection)
        self.table.setFocusPolicy(Qt.FocusPolicy.NoFocus)
        # widths and heights are set by _fit, from the texts: a number is never elided
        self.table.verticalHeader().setSectionResizeMode(QHeaderView.ResizeMode.Fixed)
        self.table.horizontalHeader().setSectionResizeMode(QHeaderView.ResizeMode.Fixed)
        self.table.verticalHeader().setDefaultAlignment(Qt.AlignmentFlag.AlignLeft | Qt.AlignmentFlag.AlignVCenter)
        self.table.setWordWrap(False)
        self.table.setTextElideMode(Qt.TextElideMode.ElideNone)
        self.table.setHorizontalScrollMode(QAbstractItemView.ScrollMode.ScrollPerPixel)
        self.table.setVerticalScrollMode(QAbstractItemView.ScrollMode.ScrollPerPixel)
        self.table.installEventFilter(self)
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
        self.refresh()

    # ---- fitting the room ---------------------------------------------------------------------------
    def _metrics(self) -> tuple[QFontMetrics, QFontMetrics]:
        """The cells' and the headers' type (bold), as the style sheet sets it."""
        self.table.ensurePolished()
        font = QFont(self.table.font())
        bold = QFont(font)
        bold.setBold(True)
        return QFontMetrics(font), QFontMetrics(bold)

    def _natural(self, level: int) -> tuple[int, list[int], int, int, int]:
        """(row header width, column widths, header height, row height, frame) at a level."""
        cells, headers = self._metrics()
        numbers = [max((cells.horizontalAdvance(self.table.item(r, c).text()) for r in range(self.table.rowCount())
                        if self.table.item(r, c) is not None), default=0) for c in range(self.table.columnCount())]
        columns = [max(number, *(headers.horizontalAdvance(line) for line in header[level].split("\n"))) + CELL_PADDING
                   for number, header in zip(numbers, self._headers)]
        row_header = max((headers.horizontalAdvance(line) for texts in self._row_headers
                          for line in texts[level].split("\n")), default=0) + CELL_PADDING + 4
        header_lines = max((len(h[level].split("\n")) for h in self._headers), default=1)
        row_lines = max((len(t[level].split("\n")) for t in self._row_headers), default=1)
        frame = 2 * self.table.frameWidth()
        return (row_header, columns, header_lines * headers.lineSpacing() + HEADER_PADDING,
                row_lines * cells.lineSpacing() + ROW_PADDING, frame)

    def natural_width(self, level: int) -> int:
        row_header, columns, _, _, frame = self._natural(level)
        margins = self.layout().contentsMargins()
        return row_header + sum(columns) + frame + margins.left() + margins.right()

    def readable_width(self) -> int:
        """The narrowest this panel shows every number whole without scrolling."""
        return self.natural_width(LEVELS - 1)

    def readable_height(self) -> int:
        """The shortest this panel shows every row without scrolling (at the shortest headers)."""
        _, _, header_h, row_h, frame = self._natural(LEVELS - 1)
        margins = self.layout().contentsMargins()
        return (self._header_height() + self.layout().spacing() + header_h + self.table.rowCount() * row_h + frame
                + margins.top() + margins.bottom())

    def set_title_visible(self, visible: bool) -> None:
        """The title is left out where a tab already names the panel (its width goes to the table)."""
        self.title.setVisible(visible)
        self._fit()

    def resizeEvent(self, event) -> None:
        super().resizeEvent(event)
        self._fit()

    def eventFilter(self, watched, event) -> bool:
        if watched is self.table and event.type() == QEvent.Type.Resize:
            self._fit_table()
        return False

    def _header_height(self) -> int:
        """The title row's height (0 when the title is hidden and the format box sits elsewhere)."""
        shown = [w for w in (self.title, self.format_box) if w.isVisibleTo(self) and self.isAncestorOf(w)]
        return max((w.sizeHint().height() for w in shown), default=0)

    def _fit(self) -> None:
        """The caption only where the table keeps its rows' height below it (else it is the tooltip of
        the title and the format box); then the table's columns and rows (_fit_table)."""
        if not self._headers:
            return
        margins, spacing = self.layout().contentsMargins(), self.layout().spacing()
        width = self.width() - margins.left() - margins.right()
        level = next((lv for lv in range(LEVELS) if self.natural_width(lv) <= self.width()), LEVELS - 1)
        _, _, header_h, row_h, frame = self._natural(level)
        needed = header_h + self.table.rowCount() * row_h + frame
        room = self.height() - margins.top() - margins.bottom() - self._header_height() - spacing
        caption_h = self.caption.heightForWidth(max(width, 1)) + spacing
        show_caption = not self.compact and room - caption_h >= needed
        self.caption.setVisible(show_caption)
        self.title.setToolTip("" if show_caption else self.caption.text())
        self.format_box.setToolTip(self.format_tip + ("" if show_caption else "<br><br>" + self.caption.text()))
        self._fit_table()

    def _fit_table(self) -> None:
        """The fullest headers whose columns fit the table's width (else the shortest, scrolling),
        the spare width and height shared out among the columns and rows."""
        if not self._headers:
            return
        table = self.table
        margins = self.layout().contentsMargins()
        level = next((lv for lv in range(LEVELS)
                      if self.natural_width(lv) - margins.left() - margins.right() <= table.width()), LEVELS - 1)
        self.level = level
        for c, header in enumerate(self._headers):
            table.horizontalHeaderItem(c).setText(header[level])
        for r, texts in enumerate(self._row_headers):
            table.verticalHeaderItem(r).setText(texts[level])
        row_header, columns, header_h, row_h, frame = self._natural(level)
        rows = table.rowCount()
        width, height = table.width() - frame, table.height() - frame
        if height < header_h + rows * row_h:  # the rows scroll: their scroll bar takes width from the columns
            width -= table.verticalScrollBar().sizeHint().width()
        if width < row_header + sum(columns):  # the columns scroll: their bar takes height from the rows
            height -= table.horizontalScrollBar().sizeHint().height()
        spare_w = max(0, width - row_header - sum(columns))
        spare_h = max(0, height - header_h - rows * row_h)
        table.verticalHeader().setFixedWidth(row_header)
        for c, w in enumerate(columns):
            table.setColumnWidth(c, w + spare_w // max(1, len(columns)))
        table.horizontalHeader().setFixedHeight(header_h)
        for r in range(rows):
            table.setRowHeight(r, row_h + spare_h // max(1, rows))

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
        self._headers = []
        for c in chips:  # at the shortest, three lines: "CPU" / "20" / "GB/s"
            name, bandwidth = short_chip(c.label), format_bandwidth(c.bandwidth_gbs)
            self._headers.append((f"{name}\n{bandwidth}",) * 2 + ("\n".join([name.split()[-1]] + bandwidth.split()),))
        for n in TP_DEGREES:
            self._headers.append((f"TP {n}\n{n}×{short_chip(TP_GPU)}",) * 2 + (f"TP {n}\n{n}×\n{short_chip(TP_GPU)}",))
        self.table.setHorizontalHeaderLabels([h[0] for h in self._headers])
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
        # narrower: the size under the name, then the size alone (the name in the row's tooltip)
        names = [m.label if len(m.label) <= 16 else m.label[:15] + "…" for m in models]
        self._row_headers = [(f"{name}  {format_params(m.stored_params)}", f"{name}\n{format_params(m.stored_params)}",
                              format_params(m.stored_params)) for name, m in zip(names, models)]
        self.table.setVerticalHeaderLabels([texts[0] for texts in self._row_headers])
        for r, m in enumerate(models):
            self.table.verticalHeaderItem(r).setToolTip(f"{m.label}: {format_params(m.stored_params)} "
                                                        + translate("SeedTable", "parameters"))
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
        self._fit()
