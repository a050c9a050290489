"""The window on the screens a talk meets (issue 25): sized and placed from the screen's available
area and never larger, and at every size, in either type size, nothing cut: every widget inside its
parent and the window, every button and one-line label at least as wide as its text, every plot at a
readable size with its legend above the data and inside the plot, every number of the hardware table
whole. (3840x2160 at scale 2 lays out as 1920x1080: Qt's logical pixels.) The screens are given to
`fit_to_screen` (offscreen, one process); docs/screens/ has them in a real X server."""
from __future__ import annotations

import pytest
from app_test_helpers import send_and_wait
from PySide6.QtCore import QPoint, QRect
from PySide6.QtWidgets import QAbstractButton, QApplication, QLabel, QWidget

from app import talk
from app.controls import BAR_SHARE
from app.hardware_strip import OneLineLabel
from app.plots.view import PlotView

SCREENS = ((1024, 768), (1280, 720), (1366, 768), (1920, 1080))
PREFERRED = (1600, 960)


def rect_in(widget: QWidget, ancestor: QWidget) -> QRect:
    return QRect(widget.mapTo(ancestor, QPoint(0, 0)), widget.size())


def shown_widgets(window) -> list[QWidget]:
    """Every widget of the window a person can see (not inside a scroll area's viewport, whose
    contents scroll by design; not pyqtgraph's own viewport)."""
    widgets = []
    for widget in window.findChildren(QWidget):
        if not widget.isVisible() or widget.isWindow():
            continue
        parent = widget.parentWidget()
        if parent is not None and parent.objectName() == "qt_scrollarea_viewport":
            continue
        widgets.append(widget)
    return widgets


def cut(window) -> list[str]:
    """What does not fit: widgets outside their parent (Qt clips them) or the window, buttons and
    one-line labels narrower than their text, wrapped labels shorter than their lines."""
    problems = []
    whole = window.rect()
    for widget in shown_widgets(window):
        name = f"{type(widget).__name__} {getattr(widget, 'text', lambda: '')()!r}"
        if not whole.contains(rect_in(widget, window)):
            problems.append(f"{name} outside the window: {rect_in(widget, window)}")
        parent = widget.parentWidget()
        if parent is not None and not parent.rect().adjusted(-1, -1, 1, 1).contains(widget.geometry()):
            problems.append(f"{name} outside its parent {type(parent).__name__}: {widget.geometry()} in {parent.rect()}")
        if isinstance(widget, QAbstractButton) and widget.text() and widget.width() < widget.sizeHint().width() - 1:
            problems.append(f"{name} cut: {widget.width()} < {widget.sizeHint().width()}")
        if isinstance(widget, QLabel) and widget.text() and not isinstance(widget, OneLineLabel):
            if widget.wordWrap():
                if widget.height() < widget.heightForWidth(widget.width()) - 2:
                    problems.append(f"{name} cut: {widget.height()} < {widget.heightForWidth(widget.width())}")
            elif widget.width() < widget.minimumSizeHint().width() - 1:
                problems.append(f"{name} cut: {widget.width()} < {widget.minimumSizeHint().width()}")
    return problems


def plot_problems(window) -> list[str]:
    problems = []
    plots = window.plots
    cell = plots.readable_cell()
    for name, view in plots.views.items():
        if not view.isVisible():
            continue
        if plots.shown is None and (view.width() < cell.width() - 2 or view.height() < cell.height() - 2):
            problems.append(f"{name}: {view.width()}x{view.height()} below a readable {cell.width()}x{cell.height()}")
        data = view.plot.getViewBox().sceneBoundingRect()
        scene = view.widget.sceneRect() if view.widget.sceneRect().width() else data
        legend = view.plot.legend
        if legend is not None and legend.isVisible() and legend.items:
            box = legend.sceneBoundingRect()
            if box.bottom() > data.top() + 1:
                problems.append(f"{name}: the legend runs into the data")
            if box.right() > view.widget.width() + 1:
                problems.append(f"{name}: the legend runs past the plot's edge ({box.right()} > {view.widget.width()})")
        for line in view._peak_lines.values():
            if line.isVisible() and line.label.isVisible():
                view.widget.grab()  # (a text item takes its size when it paints)
                label = line.label.sceneBoundingRect()
                if label.left() < data.left() - 2 or label.right() > data.right() + 2:
                    problems.append(f"{name}: a peak label cut at the plot's edge: {label} in {data}")
        del scene
    return problems


def table_problems(window) -> list[str]:
    table = window.seed_table.table
    if not table.isVisible():
        return []
    problems = []
    metrics = table.fontMetrics()
    for c in range(table.columnCount()):
        for r in range(table.rowCount()):
            text = table.item(r, c).text()
            if table.columnWidth(c) < metrics.horizontalAdvance(text):
                problems.append(f"table cell {text!r} wider than its column ({table.columnWidth(c)})")
    if table.horizontalScrollBar().isVisible():
        problems.append(f"the table scrolls at {table.width()} pixels (it needs {window.seed_table.readable_width()})")
    return problems


@pytest.mark.parametrize("large", [False, True], ids=["normal", "large-fonts"])
@pytest.mark.parametrize("screen", SCREENS, ids=[f"{w}x{h}" for w, h in SCREENS])
def test_the_window_fits_the_screen_and_nothing_is_cut(make_window, qtbot, screen, large):
    window = make_window(max_new_tokens=60, large_fonts=large)
    talk.install(window)
    available = QRect(0, 0, *screen)
    window.fit_to_screen(available)
    window.show()
    QApplication.processEvents()
    frame = window.frameGeometry().size() - window.size()  # (offscreen draws a frame too, once shown)
    size = (min(screen[0] - frame.width(), PREFERRED[0]), min(screen[1] - frame.height(), PREFERRED[1]))
    assert (window.width(), window.height()) == size
    assert available.contains(window.frameGeometry())
    assert window.maximize_on_show == (screen[0] < PREFERRED[0] or screen[1] < PREFERRED[1])
    send_and_wait(window, qtbot, "fill the plots")
    for layout in (None, ["tokens", "memory"], ["table"]):  # the grid; the presenter's two plots; the table
        window.talk.presenter.show(layout)
        qtbot.wait(50)
        window.plots.refresh(force=True)
        QApplication.processEvents()
        assert (window.width(), window.height()) == size
        problems = cut(window) + plot_problems(window) + table_problems(window)
        assert not problems, (layout, problems)
        bar = window.controls
        assert bar.height() <= BAR_SHARE * window.height() + 2 or bar.density == "collapsed", (bar.density, bar.height())
    window.talk.presenter.show(None)
    grid = window.plots.grid_cells
    assert grid[:2] == ["tokens", "memory"], grid  # the most telling plots are the last to go
    if len(grid) < len(window.plots._grid_wanted()):  # left out: named, with the keys that bring them
        assert "number keys" in window.plots.more_label.full_text()


def test_on_a_small_screen_with_large_fonts_the_plots_are_fewer_and_larger(make_window, qtbot):
    """1280x720 with projector fonts: the grid keeps two large plots by itself (no number key), the bar
    folds (every switch still a key: F3 cycles the precision), the strip keeps its device line."""
    window = make_window(max_new_tokens=20, large_fonts=True)
    talk.install(window)
    window.fit_to_screen(QRect(0, 0, 1280, 720))
    window.show()
    QApplication.processEvents()
    assert window.plots.grid_cells == ["tokens", "memory"]
    assert all(view.height() >= 230 for name, view in window.plots.views.items() if name in ("tokens", "memory"))
    assert window.controls.density != "full" and not window.controls.second_row.isVisible()
    assert window.controls.more_button.isVisible()
    window.controls.more_button.click()  # the numbers and the window's buttons, unfolded
    assert window.controls.second_row.isVisible()
    assert not window.hardware_strip.bandwidth_label.isVisible() and window.hardware_strip.device_label.toolTip()
    window.fit_to_screen(QRect(0, 0, 1920, 1080))  # a desktop: everything back
    QApplication.processEvents()
    window.set_large_fonts(False)
    QApplication.processEvents()
    assert window.controls.density == "full" and window.hardware_strip.bandwidth_label.isVisible()
    assert set(window.plots.grid_cells) == {"tokens", "memory", "compute", "roofline", "timeline", "extra"}
    assert not window.plots.more_label.isVisible()


def test_the_folded_bar_s_buttons_step_their_switch_like_its_key(make_window, qtbot):
    window = make_window()
    window.fit_to_screen(QRect(0, 0, 1024, 768))
    window.set_large_fonts(True)
    window.show()
    QApplication.processEvents()
    controls = window.controls
    assert controls.density == "collapsed"
    button = controls.cells["attention"].collapsed
    assert button.isVisible() and button.text().startswith("Attention Flash") and button.text().endswith("F5")
    button.click()
    assert controls.pending == {"attention": "naive"} and "→ Naive…" in button.text()  # asked, not yet run
    qtbot.waitUntil(lambda: window.settings.attention == "naive", timeout=10_000)
    assert "Attention Naive" in button.text() and "→" not in button.text()
    assert window.controls.widgets["kv_cache"].text().startswith("KV cache ON")  # a toggle names itself
    refused = controls.cells["dtype"].collapsed
    assert refused.isVisible() and refused.isEnabled()  # fp32 ↔ bf16 on a CPU (fp16: greyed, skipped)


def test_on_a_hidpi_screen_the_curves_are_as_wide_as_at_1x(monkeypatch, qapp):
    """A cosmetic pen's width is in device pixels: at scale 2 a 2-pixel curve drew 1 logical pixel wide
    (seen in Xvfb at 3840x2160, QT_SCALE_FACTOR=2). The plots' pens are given in logical pixels."""
    from app.plots import style

    assert style.pen("#ffffff", 2).widthF() == 2 * style.device_pixel_ratio()
    monkeypatch.setattr(style, "device_pixel_ratio", lambda: 2.0)
    assert style.pen("#ffffff", 2.5, dashed=True).widthF() == 5.0 and style.pen("#ffffff").isCosmetic()


def test_f8_shows_the_hardware_table_where_the_grid_has_no_room_for_it(make_window, qtbot):
    """1280x720 with projector fonts: the grid keeps two plots, so F8 (the window's Hardware table
    button) brings the table as the presenter's panel, whole; F8 again, the grid. Seen in Xvfb: F8
    only set the grid's wish for the cell, and nothing changed on the screen."""
    window = make_window(large_fonts=True)
    talk.install(window)
    window.fit_to_screen(QRect(0, 0, 1280, 720))
    window.show()
    QApplication.processEvents()
    assert "extra" not in window.plots.grid_cells and not window.seed_table.isVisible()
    window.toggle_seed_table()
    QApplication.processEvents()
    assert window.plots.shown == ["extra"] and window.seed_table.isVisible() and window.table_button.isChecked()
    assert window.side_tabs.currentWidget() is window.seed_table
    assert not table_problems(window) and not cut(window)
    window.toggle_seed_table()
    QApplication.processEvents()
    assert window.plots.shown is None and not window.seed_table.isVisible() and not window.table_button.isChecked()
    assert window.plots.grid_cells == ["tokens", "memory"]
    window.set_large_fonts(False)  # on a desktop in normal type the grid has a cell for it: F8 toggles it there
    window.fit_to_screen(QRect(0, 0, 1920, 1080))
    QApplication.processEvents()
    assert "extra" in window.plots.grid_cells and window.seed_table.isVisible() and window.table_button.isChecked()
    window.toggle_seed_table()
    QApplication.processEvents()
    assert "extra" not in window.plots.grid_cells and not window.seed_table.isVisible()
    window.toggle_seed_table()
    QApplication.processEvents()
    assert window.plots.shown is None and "extra" in window.plots.grid_cells and window.seed_table.isVisible()


@pytest.mark.parametrize("orientation, lo, hi, size", [("left", 1.5, 9.8, 130), ("bottom", 0.35, 3.2, 350),
                                                       ("left", 0.2, 3.0, 90), ("left", 0.1, 1e4, 250)])
def test_a_short_log_axis_labels_no_two_ticks_on_top_of_each_other(qapp, orientation, lo, hi, size):
    """Seen in Xvfb at 1280x720: over less than a decade pyqtgraph labelled every 1..9 of it, a column
    of 9, 8, 7 and "0.60.70.80.91" on the roofline. The labelled ticks keep a label's size apart."""
    import math

    import pyqtgraph as pg

    from app.plots.style import ReadableAxis

    def labelled(axis) -> list[float]:
        axis.setLogMode(True)
        values = []
        for spacing, ticks in axis.tickValues(math.log10(lo), math.log10(hi), size):
            values += [v for v, text in zip(ticks, axis.tickStrings(ticks, 1, spacing)) if text]
        return sorted(values)

    def closest_px(values: list[float]) -> float:
        return min(b - a for a, b in zip(values, values[1:])) * size / (math.log10(hi) - math.log10(lo))

    axis = ReadableAxis(orientation)
    shown = labelled(axis)
    assert len(shown) >= 2 or hi / lo < 3  # something to read the scale by
    if len(shown) >= 2:
        assert closest_px(shown) >= axis._label_extent_px() - 1e-6, [10 ** v for v in shown]
    if size < 200 and hi / lo < 10:
        assert closest_px(labelled(pg.AxisItem(orientation))) < axis._label_extent_px()  # pyqtgraph's own: crowded


def test_a_legend_that_gains_its_first_row_sits_above_the_data_at_once(qtbot):
    """Seen in Xvfb at 1366x768: at a reply's first step the memory plot's new legend row lay over
    the top of the data (the plot's layout came at its posted request, after a paint; with frames
    held to 1-3 a second it stayed so until the next). It is laid out as the legend changes."""
    from app_test_helpers import fake_cpu
    from test_plots import step

    from app.live_data import LiveData
    from app.plots.memory import MemoryPlot
    from app.plots.step_plot import StepWindow
    from app.theme import DARK, SettingColours

    live = LiveData()
    live.start_reply(100.0)
    view = MemoryPlot(live, DARK, SettingColours(DARK))
    qtbot.addWidget(view)
    view.set_hardware(fake_cpu())
    view.resize(440, 190)
    view.show()
    qtbot.waitExposed(view)
    view.draw(StepWindow(live))
    QApplication.processEvents()
    live.add_step(step(0, "prefill"))
    view.draw(StepWindow(live))  # no event in between, as a paint right after the frame would see it
    legend, data = view.plot.legend, view.plot.getViewBox().sceneBoundingRect()
    assert len(legend.items) == 1 and legend.sceneBoundingRect().bottom() <= data.top() + 1


def test_each_tour_step_s_two_cells_share_the_height_at_1280x720(make_window, qtbot):
    """The default tour's layouts in its order, at 1280x720 with projector fonts: each step's one or two
    cells take the panel's height between them (the side panel a little more), none squashed. Seen in
    Xvfb on the clicker: the presenter's splitter kept the cells of the steps before, hidden, and gave
    them the sizes, so "roofline, timeline" after "tokens, timeline" drew the timeline a few pixels high
    (and step 8's roofline, step 9's tokens/s)."""
    from app.tour import load_tour

    window = make_window(large_fonts=True)
    the_talk = talk.install(window)
    window.fit_to_screen(QRect(0, 0, 1280, 720))
    window.show()
    QApplication.processEvents()
    stack = window.plots._stack
    for step in load_tour("default", checked=False).steps:
        the_talk.presenter.show(list(step.plots))
        QApplication.processEvents()
        shown = [stack.widget(i) for i in range(stack.count()) if stack.widget(i).isVisibleTo(stack)]
        side = set(step.plots) & {"table", "kv", "serving"}
        assert len(shown) == len(step.plots) - len(side) + bool(side), (step.title, shown)
        heights = [widget.height() for widget in shown]
        assert sum(heights) >= stack.height() - stack.handleWidth() * len(shown) - 2, (step.title, heights)
        assert min(heights) >= 0.4 * (stack.height() - stack.handleWidth()) / (len(shown) / 2), (step.title, heights)
