"""Arrow columns -> store features: type mapping and vectorised conversion.

Every column becomes a feature of the matching store type:

| Arrow type | store type |
|---|---|
| bool, int8..int64, uint8..uint64, date, time, timestamp, duration | ``int64`` (temporal: its integer representation) |
| float16/32/64, decimal | ``float32`` (narrowed) |
| list / large_list of an integer type | ``list<int64>`` |
| list / large_list of a floating type | ``list<float32>`` |
| fixed_size_list<float*, D> | ``fixed_size_list<float32, D>`` |
| fixed_size_list<int*, D> | ``list<int64>`` |
| string, binary (large too), fixed_size_binary | ``binary`` |
| dictionary<..., T> | the type for T (decoded) |

A null is an absent key: only present values are written (with ``--upsert`` a null leaves
the stored value alone). A null *inside* a list, or a uint64 above 2**63 - 1, is a bad row.
"""

from __future__ import annotations

import dataclasses
from typing import Optional, Union

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from recflash.ingest.hexids import parse_hex_column, valid_mask
from recflash.reader.store import parse_value_type

_INT64_MAX = np.iinfo(np.int64).max


@dataclasses.dataclass
class Column:
    """The present values of one feature in a chunk."""

    valid: Optional[np.ndarray]  # bool per chunk row; None: every row has a value
    values: Union[np.ndarray, pa.Array]  # one entry per present row

    def count(self, n_rows: int) -> int:
        return n_rows if self.valid is None else int(np.count_nonzero(self.valid))


class BadRows(Exception):
    """Rows of a chunk whose value in ``column`` cannot be stored."""

    def __init__(self, rows: np.ndarray, column: str, reasons: list[str]):
        super().__init__(f"{len(rows)} bad row(s) in column {column}")
        self.rows = rows
        self.column = column
        self.reasons = reasons


def _integer_like(t: pa.DataType) -> bool:
    return pa.types.is_integer(t) or pa.types.is_boolean(t)


def store_type(t: pa.DataType) -> Optional[str]:
    """The store type string for an Arrow type, or None when it cannot be stored."""
    if pa.types.is_dictionary(t):
        return store_type(t.value_type)
    if _integer_like(t) or pa.types.is_temporal(t):
        return "int64"
    if pa.types.is_floating(t) or pa.types.is_decimal(t):
        return "float32"
    if pa.types.is_list(t) or pa.types.is_large_list(t):
        child = t.value_type
        if _integer_like(child):
            return "list<int64>"
        if pa.types.is_floating(child):
            return "list<float32>"
        return None
    if pa.types.is_fixed_size_list(t):
        child = t.value_type
        if pa.types.is_floating(child):
            return f"fixed_size_list<float32, {t.list_size}>"
        if _integer_like(child):
            return "list<int64>"
        return None
    if (pa.types.is_string(t) or pa.types.is_large_string(t) or pa.types.is_binary(t)
            or pa.types.is_large_binary(t) or pa.types.is_fixed_size_binary(t)):
        return "binary"
    return None


def compatible(existing: str, new: str) -> bool:
    return existing.replace(" ", "") == new.replace(" ", "")


def _combine(arr) -> pa.Array:
    return arr.combine_chunks() if isinstance(arr, pa.ChunkedArray) else arr


def fixed_values(arr: pa.Array, np_type) -> np.ndarray:
    """The data buffer of a fixed-width Arrow array as numpy (null slots hold garbage)."""
    itemsize = np.dtype(np_type).itemsize
    return np.frombuffer(arr.buffers()[1], dtype=np_type, count=len(arr), offset=arr.offset * itemsize)


def _as_int64(arr: pa.Array, name: str) -> pa.Array:
    t = arr.type
    if pa.types.is_int64(t):
        return arr
    if pa.types.is_uint64(t):
        vals = fixed_values(arr, np.uint64)
        over = vals > np.uint64(_INT64_MAX)
        m = valid_mask(arr)
        if m is not None:
            over &= m
        if over.any():
            rows = np.flatnonzero(over)
            raise BadRows(rows, name, [f"uint64 value {int(vals[r])} does not fit in int64" for r in rows[:5]])
        return arr.view(pa.int64()) if arr.offset == 0 else arr.cast(pa.int64(), safe=False)
    if pa.types.is_temporal(t):
        width = t.bit_width
        return arr.view(pa.int32() if width == 32 else pa.int64()).cast(pa.int64())
    return arr.cast(pa.int64())


def to_column(arr, stype: str, name: str, hex_ids: bool = False, max_value_bytes: Optional[int] = None) -> Column:
    """Converts one Arrow column of a chunk. Raises BadRows for values that cannot be stored,
    among them variable-width values longer than ``max_value_bytes`` (when given: a page of
    the store cannot hold them)."""
    arr = _combine(arr)
    if pa.types.is_dictionary(arr.type):
        arr = arr.dictionary_decode()
    if hex_ids:
        values, valid, bad = parse_hex_column(arr)
        if bad is not None:
            reasons = []
            for r in bad[:5].tolist():
                v = arr[r].as_py()
                if isinstance(v, bytes):
                    v = v.decode("utf-8", "replace")
                reasons.append(f"not a hexadecimal id: {v!r}" + (" (more than 16 digits)" if len(v) > 16 else ""))
            raise BadRows(bad, name, reasons)
        return Column(valid, values)
    valid = valid_mask(arr)
    stype, dim = parse_value_type(stype)  # canonical form, the engine's parser
    if stype == "int64":
        a = _as_int64(arr, name)
        vals = fixed_values(a, np.int64)
        return Column(valid, vals if valid is None else vals[valid])
    if stype == "float32":
        a = arr if pa.types.is_float32(arr.type) else arr.cast(pa.float32(), safe=False)
        vals = fixed_values(a, np.float32)
        return Column(valid, vals if valid is None else vals[valid])
    if valid is not None:
        arr = arr.filter(pa.array(valid))
    if stype in ("list<int64>", "list<float32>"):
        child_type = pa.int64() if stype == "list<int64>" else pa.float32()
        if pa.types.is_fixed_size_list(arr.type):
            arr = pa.ListArray.from_arrays(
                pa.array(np.arange(len(arr) + 1, dtype=np.int32) * arr.type.list_size), arr.flatten())
        child = arr.flatten()
        if child.null_count:
            _bad_list_rows(arr, valid, name)
        if pa.types.is_large_list(arr.type) or arr.type.value_type != child_type:
            arr = arr.cast(pa.list_(child_type), safe=False)
        _check_value_bytes(arr, valid, name, max_value_bytes, 8 if stype == "list<int64>" else 4)
        return Column(valid, arr)
    if dim:
        if arr.flatten().null_count:
            _bad_list_rows(arr, valid, name)
        target = pa.list_(pa.float32(), arr.type.list_size)
        if arr.type != target:
            arr = arr.cast(target, safe=False)
        return Column(valid, arr)
    if stype == "binary":
        if not pa.types.is_binary(arr.type):
            arr = arr.cast(pa.binary())
        _check_value_bytes(arr, valid, name, max_value_bytes, 0)
        return Column(valid, arr)
    raise ValueError(f"column {name}: unsupported store type {stype}")  # pragma: no cover


def _check_value_bytes(arr: pa.Array, valid: Optional[np.ndarray], name: str, limit: Optional[int],
                      element_bytes: int) -> None:
    """Raises BadRows for the rows whose value (a binary, or a list of ``element_bytes``-byte
    elements) is longer than ``limit`` bytes. ``arr`` holds the present values only."""
    if limit is None or len(arr) == 0 or arr.nbytes <= limit:
        return  # no value can be longer than the column's buffers
    if element_bytes:
        sizes = pc.list_value_length(arr).to_numpy(zero_copy_only=False).astype(np.int64) * element_bytes
    else:
        sizes = pc.binary_length(arr).to_numpy(zero_copy_only=False).astype(np.int64)
    over = np.flatnonzero(sizes > limit)
    if not len(over):
        return
    rows = over if valid is None else np.flatnonzero(valid)[over]
    raise BadRows(rows.astype(np.int64), name,
                  [f"a value of {int(sizes[i])} bytes; a page of this store holds at most {limit} "
                   "(a new store with a larger --page-size holds more)" for i in over])


def _bad_list_rows(arr: pa.Array, valid: Optional[np.ndarray], name: str) -> None:
    """Raises BadRows for the rows whose list holds a null element."""
    flat_valid = valid_mask(arr.flatten())
    parent = pc.list_parent_indices(arr).to_numpy()
    bad_present = np.unique(parent[~flat_valid]) if flat_valid is not None else np.zeros(0, np.int64)
    rows = bad_present if valid is None else np.flatnonzero(valid)[bad_present]
    raise BadRows(rows.astype(np.int64), name, ["null element in a list"] * min(5, len(rows)))


def key_column(arr, name: str) -> np.ndarray:
    """A key column -> uint64 keys. Nulls, negatives and non-integers are bad rows."""
    arr = _combine(arr)
    if pa.types.is_dictionary(arr.type):
        arr = arr.dictionary_decode()
    if not pa.types.is_integer(arr.type):
        raise ValueError(f"key column {name} has type {arr.type}; keys must be integers")
    m = valid_mask(arr)
    if m is not None:
        rows = np.flatnonzero(~m)
        raise BadRows(rows, name, ["the key is empty (null)"] * min(5, len(rows)))
    if pa.types.is_unsigned_integer(arr.type):
        return arr.cast(pa.uint64()).to_numpy(zero_copy_only=False).astype(np.uint64, copy=False)
    vals = arr.cast(pa.int64()).to_numpy(zero_copy_only=False)
    neg = vals < 0
    if neg.any():
        rows = np.flatnonzero(neg)
        raise BadRows(rows, name, [f"negative key {int(vals[r])}" for r in rows[:5]])
    return vals.astype(np.uint64)
