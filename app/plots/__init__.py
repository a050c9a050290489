"""The live plots: one `PlotView` subclass per plot (tokens/s, memory, compute, roofline, phase
timeline), each drawing `LiveData`; `PlotsPanel` is the grid that owns them."""
from app.live_data import LiveData
from app.plots.panel import PlotsPanel

__all__ = ["LiveData", "PlotsPanel"]
