"""The Open Model dialog lists the models found on disk (in the background), greys out the ones
membound cannot run with the reason on hover, and opens the one chosen."""
from app_test_helpers import fake_cpu
from PySide6.QtCore import Qt

from app.model_picker import ModelPicker
from engine.io.discovery import FoundModel
from engine.model.config import ModelConfig

QWEN = ModelConfig.from_name("qwen2.5-0.5b")
FOUND = [
    FoundModel("Qwen/Qwen2.5-0.5B-Instruct", "/hub/snapshots/abc", "hf cache", "hf", "Qwen2", QWEN.n_params,
               988_000_000, "bf16", cfg=QWEN),
    FoundModel("gemma:2b", "/ollama/blobs/sha256-x", "ollama", "gguf", "gemma", 2_500_000_000, 1_600_000_000, "Q4_0",
               reason="unsupported architecture 'gemma': membound runs Llama 1-3.x, Mistral, Qwen2/2.5, Qwen3, "
                      "Gemma 2/3 (text), Phi-3/3.5/4-mini"),
]


def open_picker(qtbot, found, **kwargs):
    picker = ModelPicker("default", hardware=fake_cpu(), discover=lambda: found, **kwargs)
    qtbot.addWidget(picker)
    picker.show()
    qtbot.waitUntil(lambda: not picker.scanning, timeout=10_000)
    return picker


def test_found_models_are_listed_with_fit_and_ceiling_and_the_chosen_one_opens(qtbot):
    picker = open_picker(qtbot, FOUND)
    table = picker.table
    assert table.rowCount() == 2
    cells = [table.item(0, c).text() for c in range(table.columnCount())]
    assert cells[:5] == ["Qwen/Qwen2.5-0.5B-Instruct", "Qwen2", "494 M", "0.99 GB", "bf16"]
    assert cells[5].startswith("yes") and "fp32" in cells[5]  # the fake CPU: fp32, 16 GiB
    assert cells[6].startswith("≤ ") and cells[6].endswith("tok/s") and cells[7] == "hf cache"
    gemma = table.item(1, 0)
    assert not gemma.flags() & Qt.ItemFlag.ItemIsSelectable and "unsupported architecture 'gemma'" in gemma.toolTip()
    assert "2 found (1 can run)" in picker.scan_status.text()
    assert picker.spec() == "default"
    table.selectRow(0)
    assert picker.found_radio.isChecked() and picker.spec() == "/hub/snapshots/abc"
    picker.synthetic_radio.setChecked(True)
    assert picker.spec().startswith("synthetic:") and not table.selectedItems()


def test_a_failed_scan_says_so_and_the_dialog_still_works(qtbot):
    def broken():
        raise PermissionError("cannot read /root/.cache")

    picker = ModelPicker("synthetic:llama3-8b", hardware=None, discover=broken)
    qtbot.addWidget(picker)
    picker.show()
    qtbot.waitUntil(lambda: not picker.scanning, timeout=10_000)
    assert "could not list the models: cannot read /root/.cache" in picker.scan_status.text()
    assert picker.spec() == "synthetic:llama3-8b"


def test_without_a_device_the_list_still_shows_what_is_known(qtbot):
    picker = ModelPicker("default", hardware=None, discover=lambda: FOUND[:1])
    qtbot.addWidget(picker)
    picker.show()
    qtbot.waitUntil(lambda: not picker.scanning, timeout=10_000)
    assert picker.table.item(0, 5).text() == "?" and picker.table.item(0, 6).text() == "—"
