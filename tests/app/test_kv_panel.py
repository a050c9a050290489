"""The KV cache panel draws plain-data snapshots: cells per block by owner, hatched reserved-but-
empty cells (a contiguous buffer's tail), the gauge and the numbers; it redraws only on change."""
import numpy as np

from app.kv_panel import CELL_PX, KVCachePanel
from engine.kv.blocks import BlockPool, KVCacheManager, KVCacheSnapshot, contiguous_snapshot


def cell(img: np.ndarray, index: int, cols: int) -> np.ndarray:
    """The RGB pixels of cell `index` (without the gap after it)."""
    r, c = divmod(index, cols)
    return img[r * CELL_PX:(r + 1) * CELL_PX - 1, c * CELL_PX:(c + 1) * CELL_PX - 1, :3]


def rgb(colour: str) -> tuple[int, int, int]:
    return tuple(int(colour[i:i + 2], 16) for i in (1, 3, 5))


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
    cols = img.shape[1] // CELL_PX  # 20 blocks: seq 0 in 0-2 (40 tokens), seq 1 in 3, 4-19 free
    seq0, seq1 = rgb(panel.owner_colour(0)), rgb(panel.owner_colour(1))
    assert seq0 != seq1
    assert (cell(img, 0, cols) == seq0).all() and (cell(img, 3, cols) == seq1).all()  # full blocks
    partial = cell(img, 2, cols)  # 8 of 16 tokens: the left half filled, the rest hatched
    assert (partial[:, :3] == seq0).all() and not (partial[:, 3:] == seq0).all(axis=-1).all()
    free = cell(img, 4, cols)  # an empty outline
    assert (free[0] == rgb(panel.theme.border)).all() and (free[2:-2, 2:-2] == rgb(panel.theme.panel)).all()
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
    cols, colour = img.shape[1] // CELL_PX, rgb(panel.owner_colour(0))
    owned = [i for i in range(cols * (img.shape[0] // CELL_PX)) if (cell(img, i, cols) == colour).any()]
    assert owned == list(range(154))  # 13 blocks a cell: the 2,000 blocks of the sequence in the first 154
