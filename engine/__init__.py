"""The engine: models, steps, KV caches, serving, metrics (no Qt here)."""
import os

# PyTorch held to a lower vector level (ATEN_CPU_CAPABILITY=avx2|default, how an AVX2 laptop is reproduced
# on an AVX-512 machine: docs/benchmarks.md) holds its own kernels there but not oneDNN's, which still
# sees AMX or AVX-512 and packs for it: bf16 attention then fails ("pack_vnni2 is only supported when
# avx512 is supported", seen on an Intel Xeon with AMX). oneDNN is held to the same level, unless told.
_ONEDNN_LEVEL = {"avx2": "AVX2", "default": "SSE41"}.get(os.environ.get("ATEN_CPU_CAPABILITY", "").lower())
if _ONEDNN_LEVEL:
    os.environ.setdefault("ONEDNN_MAX_CPU_ISA", _ONEDNN_LEVEL)
