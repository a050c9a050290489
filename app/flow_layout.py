"""A layout that places its widgets left to right and wraps to a new line when the width runs out
(the controls bar at 1280 pixels with projector fonts). Height follows width (heightForWidth)."""
from __future__ import annotations

from PySide6.QtCore import QMargins, QPoint, QRect, QSize, Qt
from PySide6.QtWidgets import QLayout, QWidgetItem


def flow_height(sizes, width: int, layout: "FlowLayout") -> int:
    """The height `sizes` (QSize each) take laid out as `layout` lays its items, in `width`."""
    x, height, line_height = 0, 0, 0
    for size in sizes:
        if x and x + size.width() > width:
            height += line_height + layout.line_spacing
            x, line_height = 0, 0
        x += size.width() + layout.spacing_
        line_height = max(line_height, size.height())
    return height + line_height


class FlowLayout(QLayout):
    def __init__(self, parent=None, spacing: int = 8, line_spacing: int = 4):
        super().__init__(parent)
        self._items: list = []
        self._spacing = spacing
        self._line_spacing = line_spacing
        self.spacing_, self.line_spacing = spacing, line_spacing
        self.setContentsMargins(QMargins(0, 0, 0, 0))

    # ---- QLayout's interface ----------------------------------------------------------------------
    def addItem(self, item) -> None:
        self._items.append(item)

    def insertWidget(self, index: int, widget) -> None:
        self.addChildWidget(widget)
        self._items.insert(max(0, min(index, len(self._items))), QWidgetItem(widget))
        self.invalidate()

    def count(self) -> int:
        return len(self._items)

    def itemAt(self, index: int):
        return self._items[index] if 0 <= index < len(self._items) else None

    def takeAt(self, index: int):
        return self._items.pop(index) if 0 <= index < len(self._items) else None

    def expandingDirections(self) -> Qt.Orientation:
        return Qt.Orientation(0)

    def hasHeightForWidth(self) -> bool:
        return True

    def heightForWidth(self, width: int) -> int:
        return self._arrange(QRect(0, 0, width, 0), place=False)

    def setGeometry(self, rect: QRect) -> None:
        super().setGeometry(rect)
        self._arrange(rect, place=True)

    def sizeHint(self) -> QSize:
        return self.minimumSize()

    def minimumSize(self) -> QSize:
        size = QSize()
        for item in self._items:
            size = size.expandedTo(item.minimumSize())
        margins = self.contentsMargins()
        return size + QSize(margins.left() + margins.right(), margins.top() + margins.bottom())

    # ---- placing --------------------------------------------------------------------------------------
    def _arrange(self, rect: QRect, place: bool) -> int:
        """Lay the visible items out in lines within rect's width; the height it takes."""
        margins = self.contentsMargins()
        area = rect.adjusted(margins.left(), margins.top(), -margins.right(), -margins.bottom())
        x, y, line_height = area.x(), area.y(), 0
        line: list[tuple] = []
        for item in self._items:
            widget = item.widget()
            if widget is not None and not widget.isVisibleTo(widget.parentWidget() or widget):
                continue
            hint = item.sizeHint()
            if line and x + hint.width() > area.right() + 1:
                if place:
                    self._place_line(line, line_height)
                x, y, line_height, line = area.x(), y + line_height + self._line_spacing, 0, []
            line.append((item, QPoint(x, y), hint))
            x += hint.width() + self._spacing
            line_height = max(line_height, hint.height())
        if place and line:
            self._place_line(line, line_height)
        return y + line_height - rect.y() + margins.bottom()

    @staticmethod
    def _place_line(line: list, line_height: int) -> None:
        for item, point, hint in line:  # bottom-aligned: a caption above a row of buttons lines up
            item.setGeometry(QRect(point + QPoint(0, line_height - hint.height()), hint))
