"""The KV cache panel draws plain-data snapshots: cells per block by owner, hatched reserved-but-
empty cells (a contiguous buffer's tail), the gauge and the numbers; it redraws only on change."""
import pytest

pytest.importorskip("PySide6")
pytest.importorskip("pyqtgraph")

from app.kv_panel import CELL_PX, KVCachePanel  # noqa: E402
from engine.kv.blocks import BlockPool, KVCacheManager, KVCacheSnapshot, contiguous_snapshot  # noqa: E402


def test_paged_snapshot_draws_owners_partial_blocks_and_free_cells(qtbot):
    panel = KVCachePanel()
    qtbot.addWidget(panel)
    mgr = KVCacheManager(BlockPool(20), block_size=16)
    mgr.allocate_slots(0, 40)
    mgr.allocate_slots(1, 16)
    panel.set_snapshot(mgr.snapshot(bytes_per_token=1000))
    assert panel.refresh() and not panel.refresh()  # drew once; nothing new, no redraw
    img = panel.render(panel.snapshot)
    assert img.shape[0] % CELL_PX == 0 and img.shape[2] == 4
    assert "4 in use / 16 free" in panel.numbers.text() and "more 256-token sequences fit" in panel.numbers.text()
    assert "seq 1" in panel.legend.text()
    assert panel.gauge.parts == (56_000, 8_000, 256_000)


def test_contiguous_tail_is_reserved_but_empty_and_off_says_so(qtbot):
    panel = KVCachePanel()
    qtbot.addWidget(panel)
    panel.set_snapshot(contiguous_snapshot([20], max_len=4096, block_size=16, bytes_per_token=100))
    panel.refresh()
    assert "0 more fit" in panel.numbers.text() and "99.5% reserved but empty" in panel.numbers.text()
    panel.set_snapshot(KVCacheSnapshot(layout="off", block_size=16, bytes_per_token=100))
    panel.refresh()
    assert "recomputes" in panel.numbers.text()


def test_a_huge_pool_is_drawn_in_bounded_cells(qtbot):
    panel = KVCachePanel()
    qtbot.addWidget(panel)
    mgr = KVCacheManager(BlockPool(100_000), block_size=16)
    mgr.allocate_slots(0, 32_000)
    panel.set_snapshot(mgr.snapshot(bytes_per_token=131072))
    panel.refresh()
    img = panel.render(panel.snapshot)
    assert img.shape[0] * img.shape[1] <= 8192 * 2 * CELL_PX * CELL_PX
