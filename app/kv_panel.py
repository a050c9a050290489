"""The KV cache panel: the cache's memory drawn one cell per block, coloured by the sequence that
owns it (a partly filled block is filled partly; a reserved block holding no token is hatched;
a free block is an empty outline), beside a gauge of used / reserved-but-empty / free bytes.

It draws plain-data snapshots (`engine.kv.blocks.KVCacheSnapshot`, pure Python: no torch here);
`set_snapshot` only stores one, `refresh` (the window's plot timer) redraws if it changed."""
from __future__ import annotations

import math

import numpy as np
import pyqtgraph as pg
from PySide6.QtCore import QRectF, Qt
from PySide6.QtGui import QBrush, QColor, QPainter, QPen
from PySide6.QtWidgets import QFrame, QHBoxLayout, QLabel, QSizePolicy, QVBoxLayout, QWidget

from app.i18n import translate
from app.theme import DARK, Theme
from engine.kv.blocks import FREE, KVCacheSnapshot

CELL_PX = 7  # pixels per cell side in the image (one pixel of it is the gap between cells)
MAX_CELLS = 8192  # above this, neighbouring blocks share a cell (a GPU pool has ~10^5 blocks)


def _fmt_bytes(n: float) -> str:
    for unit, size in (("GB", 1e9), ("MB", 1e6), ("kB", 1e3)):
        if abs(n) >= size:
            return f"{n / size:,.1f} {unit}"
    return f"{n:,.0f} B"


def _rgb(colour: str) -> tuple[int, int, int]:
    c = QColor(colour)
    return c.red(), c.green(), c.blue()


class MemoryGauge(QWidget):
    """One horizontal bar: bytes holding tokens, reserved but empty, and free (paged pool)."""

    def __init__(self, theme: Theme, parent=None):
        super().__init__(parent)
        self.theme = theme
        self.parts: tuple[float, float, float] = (0.0, 0.0, 0.0)  # used, reserved-empty, free
        self.colour = theme.accent
        self.setMinimumHeight(18)
        self.setSizePolicy(QSizePolicy.Policy.Expanding, QSizePolicy.Policy.Fixed)

    def set_parts(self, used: float, empty: float, free: float, colour: str) -> None:
        self.parts, self.colour = (used, empty, free), colour
        self.update()

    def paintEvent(self, event) -> None:  # noqa: N802 (Qt's name)
        painter = QPainter(self)
        rect = QRectF(self.rect()).adjusted(0.5, 0.5, -0.5, -0.5)
        painter.setPen(QPen(QColor(self.theme.border)))
        painter.setBrush(QBrush(QColor(self.theme.panel)))
        painter.drawRect(rect)
        total = sum(self.parts)
        if total > 0:
            used, empty, _ = self.parts
            x = rect.left()
            w_used = rect.width() * used / total
            painter.fillRect(QRectF(x, rect.top(), w_used, rect.height()), QColor(self.colour))
            hatch = QBrush(QColor(self.colour), Qt.BrushStyle.BDiagPattern)
            painter.fillRect(QRectF(x + w_used, rect.top(), rect.width() * empty / total, rect.height()), hatch)
        painter.end()


class KVCachePanel(QFrame):
    """Call `set_snapshot(engine.kv_snapshot())` between steps (through the worker, as plain data)
    and `refresh()` on the plot timer. `probe_tokens`: the length the "more sequences fit" line
    asks about (default: the longest live sequence, at least 256)."""

    def __init__(self, theme: Theme = DARK, parent=None, probe_tokens: int | None = None):
        super().__init__(parent)
        self.setObjectName("panel")
        self.theme = theme
        self.probe_tokens = probe_tokens
        self.snapshot: KVCacheSnapshot | None = None
        self._drawn: KVCacheSnapshot | None = None
        self._dirty = False
        self.title = QLabel(translate("KvPanel", "KV cache"))
        self.title.setObjectName("caption")
        self.view = pg.GraphicsLayoutWidget()
        self.view.setMinimumHeight(120)
        self.box = self.view.addViewBox(lockAspect=True, enableMouse=False, invertY=True)
        self.box.setMenuEnabled(False)
        self.image = pg.ImageItem(axisOrder="row-major")
        self.box.addItem(self.image)
        self.gauge = MemoryGauge(theme)
        self.numbers = QLabel("")
        self.numbers.setWordWrap(True)
        self.legend = QLabel("")
        self.legend.setTextFormat(Qt.TextFormat.RichText)
        self.legend.setWordWrap(True)  # one entry per sequence: many users wrap rather than widen the window
        layout = QVBoxLayout(self)
        layout.setContentsMargins(8, 6, 8, 6)
        layout.setSpacing(4)
        layout.addWidget(self.title)
        layout.addWidget(self.view, 1)
        row = QHBoxLayout()
        row.addWidget(self.gauge, 1)
        layout.addLayout(row)
        layout.addWidget(self.numbers)
        layout.addWidget(self.legend)
        self.set_theme(theme)

    # ---- input ------------------------------------------------------------------------------------
    def set_snapshot(self, snapshot: KVCacheSnapshot | None) -> None:
        if snapshot != self.snapshot:
            self.snapshot = snapshot
            self._dirty = True

    def set_theme(self, theme: Theme) -> None:
        self.theme = theme
        self.gauge.theme = theme
        self.view.setBackground(theme.panel)
        self._dirty = True
        self.refresh()

    # ---- drawing ------------------------------------------------------------------------------------
    def owner_colour(self, owner: int) -> str:
        palette = (self.theme.accent,) + tuple(self.theme.spare_colours)
        return palette[owner % len(palette)]

    def refresh(self) -> bool:
        """Redraw if the snapshot changed since the last draw; True if it drew."""
        if not self._dirty:
            return False
        self._dirty = False
        snap = self.snapshot
        self._drawn = snap
        if snap is None or snap.layout == "off" or not snap.num_blocks:
            self.image.clear()
            self.gauge.set_parts(0, 0, 0, self.theme.accent)
            what = (translate("KvPanel", "off: nothing is stored, every step recomputes the whole context")
                    if snap and snap.layout == "off" else translate("KvPanel", "empty: nothing cached yet"))
            self.title.setText(f"{translate('KvPanel', 'KV cache')} · {snap.layout if snap else ''}".rstrip(" ·"))
            self.numbers.setText(what)
            self.legend.setText("")
            return True
        self.image.setImage(self.render(snap), autoLevels=False)
        self.box.autoRange(padding=0.02)
        self.title.setText(translate("KvPanel", "KV cache · {layout} · {cells} cells of {tokens} tokens").format(
            layout=snap.layout, cells=f"{snap.num_blocks:,}", tokens=snap.block_size))
        empty = snap.fragmentation_bytes
        free = snap.pool_bytes - snap.reserved_bytes
        self.gauge.set_parts(snap.used_bytes, empty, free, self.owner_colour(0))
        self.numbers.setText(self.describe(snap))
        self.legend.setText(self.legend_html(snap))
        return True

    def render(self, snap: KVCacheSnapshot) -> np.ndarray:
        """RGBA image (rows * CELL_PX, cols * CELL_PX, 4), uint8, row-major."""
        owners = np.asarray(snap.owners, dtype=np.int64)
        filled = np.asarray(snap.filled, dtype=np.float64) / snap.block_size
        group = max(1, math.ceil(len(owners) / MAX_CELLS))
        if group > 1:  # several blocks per cell: the first owner, the mean fill
            pad = (-len(owners)) % group
            owners = np.concatenate([owners, np.full(pad, FREE)]).reshape(-1, group)
            filled = np.concatenate([filled, np.zeros(pad)]).reshape(-1, group).mean(1)
            owned = owners != FREE
            owners = np.where(owned.any(1), owners[np.arange(len(owners)), owned.argmax(1)], FREE)
        n = len(owners)
        cols = max(8, min(64, math.ceil(math.sqrt(n * 2))))
        rows = math.ceil(n / cols)
        p = CELL_PX
        img = np.zeros((rows * p, cols * p, 4), dtype=np.uint8)
        img[..., :3] = _rgb(self.theme.panel)
        img[..., 3] = 255
        border = _rgb(self.theme.border)
        yy, xx = np.mgrid[0:p - 1, 0:p - 1]
        hatch = ((xx + yy) % 3) == 0
        for i in range(n):
            r, c = divmod(i, cols)
            cell = img[r * p:r * p + p - 1, c * p:c * p + p - 1]
            owner = int(owners[i])
            if owner == FREE:  # an empty outline
                cell[0, :, :3] = border
                cell[-1, :, :3] = border
                cell[:, 0, :3] = border
                cell[:, -1, :3] = border
                continue
            colour = _rgb(self.owner_colour(owner))
            width = int(round(filled[i] * (p - 1)))
            if width == 0:  # reserved, holding nothing: hatched
                cell[hatch, :3] = colour
            else:
                cell[hatch, :3] = colour  # the unfilled rest of the block stays hatched
                cell[:, :width, :3] = colour
        return img

    def describe(self, snap: KVCacheSnapshot) -> str:
        longest = max((s.num_tokens for s in snap.sequences), default=0)
        probe = self.probe_tokens or max(256, longest)
        parts = [translate("KvPanel", "{used} hold tokens of {reserved} reserved ({pct}% reserved but empty)").format(
            used=_fmt_bytes(snap.used_bytes), reserved=_fmt_bytes(snap.reserved_bytes),
            pct=f"{100 * snap.fragmentation:.1f}")]
        if snap.layout == "paged":
            parts.append(translate("KvPanel", "blocks {used} in use / {free} free of {pool}").format(
                used=f"{snap.blocks_used:,}", free=f"{snap.blocks_free:,}", pool=_fmt_bytes(snap.pool_bytes)))
            parts.append(translate("KvPanel", "{n} more {probe}-token sequences fit").format(
                n=f"{snap.sequences_that_fit(probe):,}", probe=probe))
        else:
            per = snap.sequences[0].num_blocks * snap.block_size if snap.sequences else 0
            parts.append(translate("KvPanel", "each sequence reserves {per} positions up front: 0 more fit (paged, "
                                              "this memory holds {paged} {probe}-token sequences)").format(
                per=f"{per:,}", paged=f"{snap.num_blocks // max(1, -(-probe // snap.block_size)):,}", probe=probe))
        return " · ".join(parts)

    def legend_html(self, snap: KVCacheSnapshot) -> str:
        items = []
        for s in snap.sequences[:8]:
            items.append(f"<span style='color:{self.owner_colour(s.seq_id)}'>■</span> " + translate(
                "KvPanel", "seq {seq}: {tokens} tokens in {cells} cells").format(
                seq=s.seq_id, tokens=f"{s.num_tokens:,}", cells=f"{s.num_blocks:,}"))
        free = translate("KvPanel", "▨ reserved, empty · □ free")
        items.append(f"<span style='color:{self.theme.muted}'>{free}</span>")
        return " &nbsp; ".join(items)
