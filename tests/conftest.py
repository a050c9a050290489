import os
import tempfile

import pytest

from kernels import registry as kernel_registry

os.environ.setdefault("QT_QPA_PLATFORM", "offscreen")
# The roofs a test session measures go to a cache of its own (engine/hardware/roof.py), never the
# user's; engine processes the tests start inherit it.
os.environ["MEMBOUND_ROOF_CACHE"] = os.path.join(tempfile.mkdtemp(prefix="membound-roof-"), "roof.json")


@pytest.fixture(autouse=True)
def kernels_switched_on():
    """A kernel a test switched off (a failed check at load: kernels/registry.py) is on for the next."""
    yield
    kernel_registry.reset()
