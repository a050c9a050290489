import json
import os
import tempfile

import pytest
import torch

from engine.context import reset_default_context
from engine.model import cpu_step

os.environ.setdefault("QT_QPA_PLATFORM", "offscreen")
if os.environ["QT_QPA_PLATFORM"] == "offscreen":
    # Qt's offscreen screen is 800x600, where the window (sized from its screen: app/window.py
    # fit_to_screen) would fold its layout; the tests' screen is a desktop's, 1920x1080. The tests of
    # other screens give the window theirs (tests/app/test_screens.py).
    _fd, _screen = tempfile.mkstemp(prefix="membound-test-screen-", suffix=".json")
    with os.fdopen(_fd, "w") as _file:
        json.dump({"screens": [{"name": "test", "x": 0, "y": 0, "width": 1920, "height": 1080, "logicalDpi": 96}]},
                  _file)
    os.environ["QT_QPA_PLATFORM"] = f"offscreen:configfile={_screen}"

# The roofs a test session measures go to a cache of its own (engine/hardware/roof.py), never the
# user's; engine processes the tests start inherit it.
_CACHE = tempfile.mkdtemp(prefix="membound-roof-")
os.environ["MEMBOUND_ROOF_CACHE"] = os.path.join(_CACHE, "roof.json")
os.environ["MEMBOUND_TOUR_CHECKS"] = os.path.join(_CACHE, "tour-check.json")  # the tour's checks, likewise


@pytest.fixture(autouse=True)
def fresh_default_context():
    """What a test left in the process's default context (engine/context.py: a kernel switched
    off, a device measured, packed weights) is not there for the next: a fresh one after each test."""
    yield
    reset_default_context()


@pytest.fixture
def one_torch_thread():
    """The test machines share two cores among several jobs: with two OpenMP threads a tiny model's
    step waits on a descheduled thread (100+ ms instead of 0.5 ms). One thread keeps these tests
    fast; it is put back after each, so other tests keep their threads. Every app test asks for it
    (tests/app/conftest.py), and the engine's modules of tiny models (pytestmark)."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


@pytest.fixture(autouse=True)
def cpp_step_chosen(request, monkeypatch):
    """The C++ CPU step decodes wherever it builds, whatever its timing against PyTorch's step would
    say (engine/model/cpu_step.py `time_steps`): on machines shared by several jobs a timing lost to a
    descheduled OpenMP thread would hand a test's tiny model to PyTorch's step now and then. Tests of
    the timing itself are marked `cpu_timing`. (Engine processes a test starts time for real.)"""
    if request.node.get_closest_marker("cpu_timing") is None:
        monkeypatch.setattr(cpu_step, "time_steps", lambda model: (0.0, 1.0))
