import json
import os
import tempfile

import pytest

from kernels import registry as kernel_registry

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


@pytest.fixture(autouse=True)
def kernels_switched_on():
    """A kernel a test switched off (a failed check at load: kernels/registry.py) is on for the next."""
    yield
    kernel_registry.reset()
