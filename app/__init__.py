"""membound's desktop app (PySide6 + pyqtgraph). It never imports torch: the engine runs in a
worker thread (app.worker) and talks to the GUI with plain-data Qt signals."""
