"""The window on its screen: sized and placed from the screen's available area (the preferred size
where it fits, else the whole area, never larger; centred), fitted again once a window manager's
frame is known, the strip and the controls bar kept to what a short window has room for, and full
screen (F11) toggled."""
from __future__ import annotations

from PySide6.QtCore import QRect, QSize
from PySide6.QtGui import QGuiApplication
from PySide6.QtWidgets import QMainWindow

from app.controls import BAR_SHARE

PREFERRED_SIZE = (1600, 960)  # on a larger screen; a smaller one gets its available area
STRIP_LINES_EM = 45  # a window shorter than this many ems shows the strip's device line only
CHAT_SHARE = 1 / 3  # of the window's width, the chat's (the splitter keeps the share as the window resizes)


def available_geometry(window) -> QRect:
    """The available area (no task bars) of the screen the window is on, or the primary screen's."""
    screen = window.screen() or QGuiApplication.primaryScreen()
    return screen.availableGeometry() if screen is not None else QRect(0, 0, *PREFERRED_SIZE)


def fitted_size(available: QSize, frame: QSize = QSize(0, 0)) -> tuple[int, int]:
    """The window's size on a screen with this much room: the preferred size where it fits (with its
    frame), else the room itself less the frame."""
    return (min(PREFERRED_SIZE[0], available.width() - frame.width()),
            min(PREFERRED_SIZE[1], available.height() - frame.height()))


class ScreenFit:
    """Fits `window` (a MainWindow: its splitter, controls bar, hardware strip and theme) to its screen."""

    def __init__(self, window: QMainWindow):
        self.window = window
        self.maximize_on_show = False  # fit_to_screen: the screen is smaller than the preferred size
        self._fitted: tuple[QRect, QSize] | None = None  # the area and size of the last fit
        self._was_maximized = False  # before full screen

    def fit_to_screen(self, available: QRect | None = None) -> None:
        """Size and place the window from the screen's available area (`available`: a given one, in
        logical pixels): the preferred size where it fits, else the whole area, and never larger;
        centred. On a screen smaller than the preferred size `show_fitted` maximises it, so a window
        manager fits its frame in as well."""
        window = self.window
        available = available if available is not None else available_geometry(window)
        width, height = fitted_size(available.size(), self.frame_extra())
        self.maximize_on_show = (width, height) != PREFERRED_SIZE
        window.resize(width, height)
        frame = self.frame_extra()
        window.move(available.x() + max(0, (available.width() - width - frame.width()) // 2),
                    available.y() + max(0, (available.height() - height - frame.height()) // 2))
        chat = int(width * CHAT_SHARE)
        window.splitter.setSizes([chat, width - chat])
        self._fitted = (available, QSize(width, height))

    def shown(self) -> None:
        """Shown, the window has its frame: fitted before it was known, it is fitted again so the frame
        stays on the screen too (unless something resized it since)."""
        window, fitted = self.window, self._fitted
        if fitted is not None and window.size() == fitted[1] and not (window.isMaximized() or window.isFullScreen()) \
                and not fitted[0].contains(window.frameGeometry()):
            self.fit_to_screen(fitted[0])

    def frame_extra(self) -> QSize:
        """What a window manager's frame adds to the window (known once it is shown; none offscreen)."""
        frame, inner = self.window.frameGeometry(), self.window.geometry()
        return QSize(max(0, frame.width() - inner.width()), max(0, frame.height() - inner.height()))

    def resized(self, height: int) -> None:
        """The bar and the strip keep to what a window this tall has room for."""
        self.window.controls.set_height_budget(int(BAR_SHARE * height))
        self.fit_strip(height)

    def fit_strip(self, height: int) -> None:
        """The strip keeps to its device line where the window is short for its type (STRIP_LINES_EM)."""
        window = self.window
        em = window.theme.font_pt * window.logicalDpiY() / 72
        window.hardware_strip.set_small(height < STRIP_LINES_EM * em)

    def show_fitted(self) -> None:
        """Show the window as `fit_to_screen` sized it (maximised on a screen smaller than it prefers)."""
        self.window.showMaximized() if self.maximize_on_show else self.window.show()

    def toggle_full_screen(self) -> None:
        window = self.window
        if not window.isFullScreen():
            self._was_maximized = window.isMaximized()
            window.showFullScreen()
        elif self._was_maximized:
            window.showMaximized()
        else:
            window.showNormal()
