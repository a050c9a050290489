import os

import pytest

from engine.context import reset_default_context

os.environ.setdefault("QT_QPA_PLATFORM", "offscreen")


@pytest.fixture(autouse=True)
def fresh_default_context():
    """What a test left in the process's default context (engine/context.py: a kernel switched
    off, a device measured, packed weights) is not there for the next: a fresh one after each test."""
    yield
    reset_default_context()
