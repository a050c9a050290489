"""membound's desktop app (PySide6 + pyqtgraph). It never imports torch: the engine runs in a
worker thread (app.worker) and talks to the GUI with plain-data Qt signals."""
import os

# The engine's OpenMP threads share the CPU with the GUI thread. Spinning OpenMP threads (the
# default) stall at every barrier while a core runs something else: on a 2-core machine the
# default model decoded at 0.8 tok/s in the app and 17 tok/s with passive waiting (measured, 2-core
# AMD EPYC under load). It must be set before torch loads, hence here; a user's setting wins.
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
