import os

import pytest

from kernels import registry as kernel_registry

os.environ.setdefault("QT_QPA_PLATFORM", "offscreen")


@pytest.fixture(autouse=True)
def kernels_switched_on():
    """A kernel a test switched off (a failed check at load: kernels/registry.py) is on for the next."""
    yield
    kernel_registry.reset()
