"""Row formats of embedding tables: float32, float16 and FBGEMM's row-wise int8.

Mirrors ``ndp/csrc/row_format.h``: a table is stored as ``fixed_size_list<float32, W>`` whose W
words hold one encoded row. ``int8`` is the row TorchRec's quantized TBE keeps (FBGEMM's
``FloatOrHalfToFusedNBitRowwiseQuantizedSBHalf`` with 8 bits, scale and bias moved in front):
``[scale f16][bias f16][dim x uint8]``, value = scale * q + bias.
"""

from __future__ import annotations

import numpy as np

from recflash.reader.errors import InvalidArgumentError

ROW_FORMATS = {"float32": 0, "float16": 1, "int8": 2}  # codes of ndp::RowFormat


def check_dtype(dtype: str, where: str) -> str:
    if dtype not in ROW_FORMATS:
        raise InvalidArgumentError(f"{where}: row dtype must be one of {', '.join(ROW_FORMATS)}, got {dtype!r}")
    return dtype


def row_bytes(dtype: str, dim: int) -> int:
    """Bytes of one encoded row before padding to whole words."""
    return {"float32": 4 * dim, "float16": 2 * dim, "int8": dim + 4}[dtype]


def row_words(dtype: str, dim: int) -> int:
    return (row_bytes(dtype, dim) + 3) // 4


def quantize_int8(rows: np.ndarray) -> np.ndarray:
    """FBGEMM's 8-bit row-wise quantization, in TorchRec's TBE row layout: uint8 [n, dim + 4]."""
    x = np.ascontiguousarray(rows, dtype=np.float32)
    n, dim = x.shape
    out = np.zeros((n, dim + 4), dtype=np.uint8)
    if n == 0:
        return out
    lo = x.min(axis=1).astype(np.float16).astype(np.float32)  # the bias is kept as half: quantize against it
    hi = x.max(axis=1)
    rng = hi - lo
    with np.errstate(divide="ignore", over="ignore"):
        scale = np.where(rng == 0, np.float32(1.0), rng / np.float32(255.0)).astype(np.float16).astype(np.float32)
        scale = np.where(scale == 0, np.float32(1.0), scale)
        inv = np.float32(1.0) / scale
    bad = np.isinf(inv)
    scale[bad] = 1.0
    inv[bad] = 1.0
    q = np.clip(np.rint((x - lo[:, None]) * inv[:, None]), 0, 255).astype(np.uint8)
    out[:, 4:] = q
    out[:, 0:2] = scale.astype(np.float16).view(np.uint8).reshape(n, 2)
    out[:, 2:4] = lo.astype(np.float16).view(np.uint8).reshape(n, 2)
    return out


def encode_rows(dtype: str, rows, dim: int, where: str) -> np.ndarray:
    """Rows -> the stored words, float32-typed [n, W].

    Float input is encoded (rounded to half, or quantized); uint8 input of ``row_bytes`` per row
    is taken as already-encoded rows (a quantized model's weights, unchanged)."""
    if hasattr(rows, "detach"):
        rows = rows.detach().cpu().numpy()
    a = np.asarray(rows)
    if a.ndim != 2:
        raise InvalidArgumentError(f"{where}: rows must be 2-D, got shape {a.shape}")
    n = a.shape[0]
    if a.dtype == np.uint8:
        if dtype == "float32" or a.shape[1] != row_bytes(dtype, dim):
            raise InvalidArgumentError(f"{where}: encoded {dtype} rows of dim {dim} are {row_bytes(dtype, dim)} bytes, "
                                       f"got uint8 rows of {a.shape[1]}")
        raw = a
    else:
        if a.shape[1] != dim:
            raise InvalidArgumentError(f"{where}: rows must have {dim} values, got shape {a.shape}")
        if dtype == "float32":
            return np.ascontiguousarray(a, dtype=np.float32)
        if dtype == "float16":
            raw = np.ascontiguousarray(a, dtype=np.float32).astype(np.float16).view(np.uint8).reshape(n, 2 * dim)
        else:
            raw = quantize_int8(a)
    words = row_words(dtype, dim)
    padded = np.zeros((n, 4 * words), dtype=np.uint8)
    padded[:, :raw.shape[1]] = raw
    return padded.view(np.float32)


def decode_rows(dtype: str, words: np.ndarray, dim: int) -> np.ndarray:
    """Stored words [n, W] -> float32 rows [n, dim] (what the SLS engine pools)."""
    if dtype == "float32":
        return words
    raw = np.ascontiguousarray(words).view(np.uint8)
    n = raw.shape[0]
    if dtype == "float16":
        return raw[:, :2 * dim].copy().view(np.float16).astype(np.float32).reshape(n, dim)
    scale = raw[:, 0:2].copy().view(np.float16).astype(np.float32)
    bias = raw[:, 2:4].copy().view(np.float16).astype(np.float32)
    return scale * raw[:, 4:4 + dim].astype(np.float32) + bias


def raw_rows(dtype: str, words: np.ndarray, dim: int) -> np.ndarray:
    """Stored words -> the encoded rows as uint8 [n, row_bytes] (TorchRec's quantized row)."""
    return np.ascontiguousarray(words).view(np.uint8)[:, :row_bytes(dtype, dim)]
