"""Q4_K and Q6_K blocks made from real weights, for test files: the installed `gguf` package
dequantises the K-quants but cannot quantise them, and a Q4_K_M file (Q4_K matrices, Q6_K for the
head and half the FFN-down layers) is what people download. The block layouts are ggml's; the
encoders are simple (min/max per sub-block, no search), checked against gguf's own dequantiser in
test_gguf_types.py. Helpers only."""
from __future__ import annotations

import numpy as np

QK_K = 256  # values per K-quant super-block


def _f16_bytes(x: np.ndarray) -> np.ndarray:
    return x.astype(np.float16).view(np.uint8).reshape(*x.shape, 2)


def quantize_q4_k(w: np.ndarray) -> np.ndarray:
    """(rows, cols) float -> (rows, cols / 256 * 144) uint8: per 256 values d and dmin (fp16), eight
    6-bit scales and mins packed in 12 bytes, 4-bit codes; value = d * scale * q - dmin * min."""
    rows, cols = w.shape
    x = w.astype(np.float32).reshape(-1, 8, 32)  # (blocks, sub-blocks, values)
    lo = np.minimum(x.min(axis=-1), 0.0)
    hi = np.maximum(x.max(axis=-1), lo + 1e-12)
    sub_scale, sub_min = (hi - lo) / 15.0, -lo
    d = sub_scale.max(axis=-1) / 63.0
    dmin = sub_min.max(axis=-1) / 63.0
    d16, dmin16 = d.astype(np.float16).astype(np.float32), dmin.astype(np.float16).astype(np.float32)
    with np.errstate(divide="ignore", invalid="ignore"):
        sc = np.clip(np.rint(np.where(d16[:, None] > 0, sub_scale / d16[:, None], 0)), 0, 63).astype(np.uint8)
        mn = np.clip(np.rint(np.where(dmin16[:, None] > 0, sub_min / dmin16[:, None], 0)), 0, 63).astype(np.uint8)
        step = d16[:, None] * sc
        q = np.where(step[..., None] > 0, (x + (dmin16[:, None] * mn)[..., None]) / step[..., None], 0)
    q = np.clip(np.rint(q), 0, 15).astype(np.uint8)  # (blocks, 8, 32)
    scales = np.zeros((x.shape[0], 12), dtype=np.uint8)
    scales[:, 0:4] = sc[:, 0:4] | ((sc[:, 4:8] >> 4) << 6)
    scales[:, 4:8] = mn[:, 0:4] | ((mn[:, 4:8] >> 4) << 6)
    scales[:, 8:12] = (sc[:, 4:8] & 0xF) | ((mn[:, 4:8] & 0xF) << 4)
    qs = (q[:, 0::2] | (q[:, 1::2] << 4)).reshape(-1, 128)  # chunk c: low nibbles sub-block 2c, high 2c + 1
    out = np.concatenate([_f16_bytes(d16), _f16_bytes(dmin16), scales, qs], axis=-1)
    return out.reshape(rows, cols // QK_K * 144)


def quantize_q6_k(w: np.ndarray) -> np.ndarray:
    """(rows, cols) float -> (rows, cols / 256 * 210) uint8: per 256 values 6-bit codes (low 4 bits
    in ql, high 2 in qh), sixteen int8 scales, d (fp16); value = d * scale * (q - 32)."""
    rows, cols = w.shape
    x = w.astype(np.float32).reshape(-1, 16, 16)  # (blocks, sub-blocks, values)
    sub_scale = np.abs(x).max(axis=-1) / 31.0
    d = np.abs(sub_scale).max(axis=-1) / 127.0
    d16 = d.astype(np.float16).astype(np.float32)
    with np.errstate(divide="ignore", invalid="ignore"):
        sc = np.clip(np.rint(np.where(d16[:, None] > 0, sub_scale / d16[:, None], 0)), -128, 127).astype(np.int8)
        step = d16[:, None] * sc
        q = np.where(step[..., None] != 0, x / step[..., None], 0)
    u = (np.clip(np.rint(q), -32, 31) + 32).astype(np.uint8).reshape(-1, 2, 4, 32)  # (blocks, half, quarter, l)
    ql = np.concatenate([u[:, :, 0] & 0xF | ((u[:, :, 2] & 0xF) << 4),
                         u[:, :, 1] & 0xF | ((u[:, :, 3] & 0xF) << 4)], axis=-1).reshape(-1, 128)
    qh = ((u[:, :, 0] >> 4) | ((u[:, :, 1] >> 4) << 2) | ((u[:, :, 2] >> 4) << 4)
          | ((u[:, :, 3] >> 4) << 6)).reshape(-1, 64)
    out = np.concatenate([ql, qh, sc.view(np.uint8), _f16_bytes(d16)], axis=-1)
    return out.reshape(rows, cols // QK_K * 210)


ENCODERS = {"Q4_K": quantize_q4_k, "Q6_K": quantize_q6_k}

