import os
import tempfile

import pytest
import torch

from engine.context import reset_default_context

os.environ.setdefault("QT_QPA_PLATFORM", "offscreen")
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
