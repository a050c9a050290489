"""A kernel that fails its check at load, in the app as it ships (the engine in its own process):
the fault injected into the INT4 kernel's check on a CPU (engine/faults.py) stands for a Triton
kernel that fails to compile or disagrees with its reference on a GPU. The window says so in one
line, the hardware strip shows it, the INT4 option's tooltip says why, and replies still run."""
from __future__ import annotations

from app_test_helpers import GREEDY, confirmed, fake_cpu, send_and_wait

from engine.settings import Settings

NOTE = "INT4 Triton kernel failed its check (InjectedFault: injected fault in the int4 kernel's check) " \
       "— using the PyTorch path"


def test_a_kernel_failing_its_check_is_switched_off_with_one_line(qtbot, tiny_model, monkeypatch):
    from app.window import MainWindow

    monkeypatch.setenv("MEMBOUND_FAULTS", "kernel_check:int4")  # read by the engine process it spawns
    monkeypatch.setenv("OMP_NUM_THREADS", "1")
    window = MainWindow(model=tiny_model, hardware=fake_cpu(), settings=Settings(max_new_tokens=4, sampling=GREEDY),
                        engine_process=True)
    qtbot.addWidget(window)
    with qtbot.waitSignal(window.model_ready, timeout=60_000) as loaded:
        pass
    assert loaded.args[0].capabilities.notes == {"weights=int4": NOTE}
    assert window.chat.plain_text().count(NOTE) == 1
    notes = window.hardware_strip.notes_label
    assert notes.full_text() == NOTE == notes.toolTip() and not notes.isHidden()
    buttons = {button.value: button for button in window.controls.widgets["weights"].buttons()}
    assert NOTE in buttons["int4"].toolTip() and buttons["int4"].isEnabled()
    assert "failed its check" not in buttons["int8"].toolTip()
    assert send_and_wait(window, qtbot, "still talking?").n_new_tokens == 4
    window.apply_settings(Settings(max_new_tokens=4, sampling=GREEDY, weights="int4"))  # its PyTorch path
    confirmed(window, qtbot)
    assert window.settings.weights == "int4"
    assert send_and_wait(window, qtbot, "and in int4?").n_new_tokens == 4
    assert window.chat.plain_text().count(NOTE) == 1  # said once, at load
