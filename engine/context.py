"""An engine's state beyond one call, in one object: its options (the environment, read once), which
kernels are switched off, the device measured, the matmul path chosen and the caches beside the
weights, fault injection. Nothing of it is module-level: two engines in one process (or two tests)
never see each other's.

Each `Engine` has one (`Engine.context`; engine/host.py gives the engines it runs in turn its own,
so a model switch neither measures the device nor checks the kernels again). Models carry their
engine's context (`Transformer.bind`, engine/variants.py binds every variant it makes), and the code
under a model's forward reads it there. A model built outside any engine (tests, the bench's oracle)
gets `default_context()`: the process's, for that code alone, and reset between tests.

Kept process-wide on purpose, each immutable by design: `kernels.tuning.TUNED` (a GPU's fastest
launch configuration per kernel and shape, set once per key: the captured step's custom op, which
cannot be handed an engine's object, launches what eager steps measured), whether a package imports
(`functools.cache`: a fact of the installed process) and the compiled C++ step
(kernels/cpu_decode.py: a loaded library cannot be unloaded; one per set of build flags; which of them
an engine uses, and its plans and timings, are the engine's: `CpuStepState`)."""
from __future__ import annotations

import threading

from torch.utils.weak import WeakIdKeyDictionary

from engine.faults import Faults
from engine.options import EngineOptions
from kernels.registry import KernelSwitches


class CpuStepState:
    """What engine/model/cpu_step.py knows for one engine: the C++ library loaded for its options (or
    why it cannot be), each model's plan over its current cache, the timings against PyTorch's step,
    and per thread whether its last step of a model ran in C++ (read by the cost model right after)."""

    def __init__(self):
        self.library = None  # the loaded library (kernels/cpu_decode.py load), once unavailable == ""
        self.unavailable: str | None = None  # None: not tried yet; "": loaded; else why not (one line)
        self.lock = threading.Lock()  # guards the first load
        self.plans = WeakIdKeyDictionary()  # model -> its plan (the C structs) over its current cache
        self.timings: dict = {}  # (format, shapes, vector level) -> its Choice: C++ against PyTorch's step
        self.model_timing = WeakIdKeyDictionary()  # model -> its Choice (asked every step: no key built)
        self.thread = threading.local()  # .ran: this thread's last step ran in C++


class EngineContext:
    def __init__(self, options: EngineOptions | None = None):
        self.options = options if options is not None else EngineOptions.from_environ()
        self.kernels = KernelSwitches()  # kernels/registry.py: switched off after a failed check at load
        self.faults = Faults(self.options.faults)  # engine/faults.py
        self.devices: dict = {}  # engine/hardware/detect.py: (kind, index, measured) -> DeviceSpec, measured once
        self.devices_lock = threading.Lock()
        # engine/model/transformer.py's matmul paths and the caches beside the weights
        self.chunked_gemv_faster: dict[int, bool] = {}  # chunks -> the chunked bmm beat F.linear here
        self.packed_weights = WeakIdKeyDictionary()  # weight -> (its version, its oneDNN-packed copy)
        self.packed_lock = threading.Lock()
        self.bytes_read = WeakIdKeyDictionary()  # model -> its matmul modules and their bytes by rows
        self.cpu_step = CpuStepState()  # engine/model/cpu_step.py: the C++ step's library, plans, timings

    def __deepcopy__(self, memo) -> "EngineContext":
        return self  # a copied model stays its engine's (its locks cannot be copied anyway)

    def __repr__(self) -> str:
        return f"EngineContext(kernels off: {self.kernels.disabled() or 'none'})"


_DEFAULT: list[EngineContext] = []  # made at first use: the options are read then, not at import
_DEFAULT_LOCK = threading.Lock()


def default_context() -> EngineContext:
    """The process's context, for models and kernels used outside any engine."""
    if not _DEFAULT:
        with _DEFAULT_LOCK:
            if not _DEFAULT:
                _DEFAULT.append(EngineContext())
    return _DEFAULT[0]


def reset_default_context() -> None:
    """A fresh default context, its options read again (tests: one test's state must not follow the next)."""
    with _DEFAULT_LOCK:
        _DEFAULT[:] = [EngineContext()]
