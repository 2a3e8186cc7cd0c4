"""Tensors on the wire: numpy/torch <-> ``recflash.ndp.v1.Tensor`` (raw little-endian bytes).

Decoding checks what a peer sent before anything uses it — dtype among the allowed ones,
the expected number of dimensions, and a byte length that matches the shape — and raises
:class:`InvalidArgumentError` naming the field, so a bad request becomes a clear error
status instead of a misread buffer.
"""

from __future__ import annotations

from typing import Optional, Sequence

import numpy as np

from recflash.ndp.proto import ndp_pb2 as pb
from recflash.reader.errors import InvalidArgumentError

NP_OF = {pb.FLOAT32: np.dtype("<f4"), pb.INT64: np.dtype("<i8"), pb.INT32: np.dtype("<i4")}
PB_OF = {np.dtype(v).str: k for k, v in NP_OF.items()}
NAME_OF = {pb.FLOAT32: "float32", pb.INT64: "int64", pb.INT32: "int32", pb.DTYPE_UNSPECIFIED: "unspecified"}
IDS = (pb.INT64, pb.INT32)
FLOATS = (pb.FLOAT32,)


def as_numpy(x) -> np.ndarray:
    if hasattr(x, "detach"):  # torch.Tensor
        x = x.detach().cpu().numpy()
    return np.asarray(x)


def fill(t: "pb.Tensor", x, dtype=None) -> "pb.Tensor":
    """Writes array `x` (numpy, torch or a sequence) into message `t`; float64 becomes float32,
    other integer types int64, unless `dtype` is given."""
    a = as_numpy(x)
    if dtype is not None:
        a = a.astype(dtype, copy=False)
    elif a.dtype.kind == "f" and a.dtype != np.float32:
        a = a.astype(np.float32)
    elif a.dtype.kind in "iub" and a.dtype not in (np.int32, np.int64):
        a = a.astype(np.int64)
    a = a.astype(a.dtype.newbyteorder("<"), copy=False)
    code = PB_OF.get(a.dtype.str)
    if code is None:
        raise InvalidArgumentError(f"tensor of dtype {a.dtype} cannot be sent (float32, int64, int32)")
    t.dtype = code
    t.shape[:] = a.shape
    t.data = np.ascontiguousarray(a).tobytes()
    return t


def tensor(x, dtype=None) -> "pb.Tensor":
    return fill(pb.Tensor(), x, dtype)


def ids_tensor(x, what: str) -> "pb.Tensor":
    """Ids, offsets or lengths as a Tensor: integers only (a float or bool array raises
    InvalidArgumentError naming `what` instead of being rounded or cast), int32 kept, other
    integer types as int64; an unsigned value past the int64 range is reported as given."""
    from recflash.ndp.embedding import as_ids

    if hasattr(x, "detach"):
        x = x.detach().cpu().numpy()
    a = np.asarray(x) if not isinstance(x, np.ndarray) else x
    if a.dtype == np.int32:
        return fill(pb.Tensor(), a)
    a = as_ids(a, what, ndim=None)
    if a.dtype.kind == "u":  # as_ids leaves values past int64 unconverted
        bad = int(a[a > np.uint64(np.iinfo(np.int64).max)][0])
        raise InvalidArgumentError(f"{what}: row id {bad} out of range (ids must be below 2**63)")
    return fill(pb.Tensor(), a)


def decode(t: "pb.Tensor", what: str, allowed: Sequence[int], ndim: Optional[int] = None,
           copy: bool = False) -> np.ndarray:
    """The array in `t` (a read-only view of the message's bytes unless copy)."""
    if t.dtype not in allowed:
        names = " or ".join(NAME_OF[a] for a in allowed)
        raise InvalidArgumentError(f"{what} must be {names}, got {NAME_OF.get(t.dtype, f'dtype code {t.dtype}')}")
    shape = tuple(int(s) for s in t.shape)
    if ndim is not None and len(shape) != ndim:
        raise InvalidArgumentError(f"{what} must have {ndim} dimension(s), got shape {list(shape)}")
    if any(s < 0 for s in shape):
        raise InvalidArgumentError(f"{what} has a negative dimension in shape {list(shape)}")
    dt = NP_OF[t.dtype]
    n = int(np.prod(shape, dtype=np.int64)) if shape else 1
    if len(t.data) != n * dt.itemsize:
        raise InvalidArgumentError(f"{what}: shape {list(shape)} of {NAME_OF[t.dtype]} needs {n * dt.itemsize} bytes, "
                                   f"got {len(t.data)}")
    a = np.frombuffer(t.data, dtype=dt).reshape(shape)
    return a.copy() if copy else a
