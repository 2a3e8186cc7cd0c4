"""Store rows -> TorchRec ``Batch``: the transformation and batching step of training ingestion.

``Preprocessor(dense=[...], sparse=[...], label=...)`` turns the Arrow table of
``Store.scan_many(features, key_range)`` (one row per key, a column per feature, null where a
feature lacks the key) into ``torchrec.datasets.utils.Batch``:

- ``dense_features``: float32 ``[B, len(dense)]``, ``log(1 + max(x, 0))`` per value (the DLRM
  Criteo transform; ``dense_transform=None`` keeps the raw values), a missing value becomes
  ``dense_fill`` (0).
- ``sparse_features``: a ``KeyedJaggedTensor`` with one key per sparse feature, feature-major
  (all rows of the first feature, then the next ...): int64 ``values`` and int32 ``lengths``.
  A scalar int64 feature gives one id per row; a missing one becomes ``sparse_fill`` (0, as
  TorchRec's Criteo pipeline does), or an empty bag with ``sparse_fill=None``. A
  ``list<int64>`` feature gives its list (a missing list: an empty bag). Ids are reduced
  modulo the feature's table size (``table_sizes``: one int for every sparse feature, a list
  in the order of ``sparse``, or a mapping that names every sparse feature and nothing else),
  or hashed first (``hash_ids=True``, splitmix64) so that nearby raw ids spread over the table.
- ``labels``: float32 ``[B]`` (missing: ``label_fill``).

Column types are checked per role before any conversion: dense and label take integer or
floating-point scalars, sparse takes integers or lists of integers (floats, binary, embeddings
are refused, not cast); a wrong type is ``SchemaError`` naming the feature, its type and its
role, a missing column ``InvalidArgumentError``. Bad constructor or ``batches`` arguments are
``InvalidArgumentError`` (a ``ValueError``), raised when called.

Everything works on the Arrow buffers with numpy (no per-row Python): the dense matrix is
filled column by column in place, the KJT's ``values`` / ``lengths`` are preallocated once
per batch and written feature by feature, and torch tensors wrap the numpy arrays without a
copy (``torch.from_numpy``).
"""

from __future__ import annotations

import numbers
import queue
import threading
from collections.abc import Iterator, Mapping, Sequence
from typing import Any, Optional, Union

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from recflash.ingest.hexids import valid_mask
from recflash.reader.errors import InvalidArgumentError, SchemaError

TableSizes = Union[None, int, Mapping[str, int], Sequence[int]]
KeyRange = Optional[tuple[int, Optional[int]]]
_MAX_KEY = (1 << 64) - 1
_KEY_END = 1 << 64  # exclusive end of the key space (a window ending here reaches _MAX_KEY)


def _is_int(x: Any) -> bool:
    """An integer argument: int or numpy integer, not bool (nor a float that happens to be whole)."""
    return isinstance(x, (numbers.Integral, np.integer)) and not isinstance(x, (bool, np.bool_))


def check_positive_int(value: Any, name: str, what: str) -> int:
    """``value`` as an int >= 1, else InvalidArgumentError naming ``what`` and ``name``."""
    if not _is_int(value) or int(value) < 1:
        raise InvalidArgumentError(f"{what}: {name} must be a positive integer, got {value!r}")
    return int(value)


def check_key_range(key_range: Any, what: str) -> tuple[int, Optional[int]]:
    """The one validator of a user's ``key_range`` (read_store, RecFlashDatasource,
    Preprocessor.batches): None (every key) or a half-open (lo, hi) pair of integers with
    0 <= lo <= hi <= 2**64 - 1, hi None for no upper bound (then key 2**64 - 1 is included).
    Returns (lo, hi) with hi None for no upper bound; anything else is InvalidArgumentError
    naming ``what``, the argument and its value."""
    if key_range is None:
        return 0, None
    shape = ("must be None or a (lo, hi) pair of integers, half-open, hi None for no upper bound "
             "(0 <= lo <= hi <= 2**64 - 1)")
    if isinstance(key_range, (str, bytes)) or not isinstance(key_range, Sequence) or len(key_range) != 2:
        raise InvalidArgumentError(f"{what}: key_range {shape}, got {key_range!r}")
    lo, hi = key_range
    if not _is_int(lo) or (hi is not None and not _is_int(hi)):
        raise InvalidArgumentError(f"{what}: key_range {shape}, got {key_range!r}")
    lo = int(lo)
    hi = None if hi is None else int(hi)
    if lo < 0 or lo > _MAX_KEY:
        raise InvalidArgumentError(f"{what}: key_range={key_range!r}: lo must be in [0, 2**64 - 1]")
    if hi is not None and hi > _MAX_KEY:
        raise InvalidArgumentError(f"{what}: key_range={key_range!r}: hi must be <= 2**64 - 1 "
                                   f"(hi=None reads to the end of the key space, key 2**64 - 1 included)")
    if hi is not None and hi < lo:
        raise InvalidArgumentError(f"{what}: key_range={key_range!r}: lo must be <= hi")
    return lo, hi


def check_names(value: Any, arg: str, what: str = "Preprocessor") -> list[str]:
    """`value` as a list of distinct, non-empty feature names (a lone string is refused: it is
    not a list of its characters)."""
    if isinstance(value, (str, bytes)):
        raise InvalidArgumentError(f"{what}: {arg} must be a list of feature names, got the string {value!r} "
                                   f"(did you mean [{value!r}]?)")
    try:
        names = list(value)
    except TypeError:
        raise InvalidArgumentError(f"{what}: {arg} must be a list of feature names, got {value!r}") from None
    for n in names:
        if not isinstance(n, str) or not n:
            raise InvalidArgumentError(f"{what}: {arg} must be a list of feature names (non-empty strings), "
                                       f"got {n!r} in {names!r}")
    dup = sorted({n for n in names if names.count(n) > 1})
    if dup:
        raise InvalidArgumentError(f"{what}: duplicate feature name(s) {dup} in {arg}={names!r}")
    return names


def _real(value: Any, arg: str) -> float:
    if isinstance(value, (bool, np.bool_)) or not isinstance(value, (numbers.Real, np.integer, np.floating)):
        raise InvalidArgumentError(f"Preprocessor: {arg} must be a number, got {value!r}")
    return float(value)


# What each role accepts (checked per column before any conversion; see _check_role).
_ROLE_TYPES = {
    "dense": "a numeric scalar (integer or floating point)",
    "label": "a numeric scalar (integer or floating point)",
    "sparse": "integer ids: an integer scalar or a list of integers",
}


def _role_accepts(role: str, t: pa.DataType) -> bool:
    if role in ("dense", "label"):
        return pa.types.is_integer(t) or pa.types.is_floating(t)
    if pa.types.is_integer(t):
        return True
    if pa.types.is_list(t) or pa.types.is_large_list(t) or pa.types.is_fixed_size_list(t):
        return pa.types.is_integer(t.value_type)
    return False


def _mix64_into(x: np.ndarray, out: np.ndarray) -> None:
    """splitmix64 of int64 ``x`` into uint64 ``out`` (vectorised, wrapping arithmetic)."""
    np.copyto(out, x.view(np.uint64))
    with np.errstate(over="ignore"):
        out += np.uint64(0x9E3779B97F4A7C15)
        t = out >> np.uint64(30)
        out ^= t
        out *= np.uint64(0xBF58476D1CE4E5B9)
        np.right_shift(out, np.uint64(27), out=t)
        out ^= t
        out *= np.uint64(0x94D049BB133111EB)
        np.right_shift(out, np.uint64(31), out=t)
        out ^= t


def _column(table: Union[pa.Table, pa.RecordBatch], name: str) -> pa.Array:
    col = table.column(name)
    if isinstance(col, pa.ChunkedArray):
        col = col.chunk(0) if col.num_chunks == 1 else col.combine_chunks()
    return col


def _fixed(arr: pa.Array, dtype) -> np.ndarray:
    itemsize = np.dtype(dtype).itemsize
    return np.frombuffer(arr.buffers()[1], dtype=dtype, count=len(arr), offset=arr.offset * itemsize)


def _check_role(name: str, t: pa.DataType, role: str, what: str) -> None:
    if not _role_accepts(role, t):
        raise SchemaError(f"{what}: {role} feature '{name}' has type {t}; a {role} feature must be "
                          f"{_ROLE_TYPES[role]}")


class Preprocessor:
    """See the module docstring. ``__call__(table) -> Batch``; ``batches(store, ...)`` iterates
    a store."""

    def __init__(self, dense: Sequence[str] = (), sparse: Sequence[str] = (), label: Optional[str] = None,
                 table_sizes: TableSizes = None, hash_ids: bool = False, dense_fill: float = 0.0,
                 sparse_fill: Optional[int] = 0, label_fill: float = 0.0,
                 dense_transform: Optional[str] = "log1p"):
        self.dense = check_names(dense, "dense")
        self.sparse = check_names(sparse, "sparse")
        if label is not None and (not isinstance(label, str) or not label):
            raise InvalidArgumentError(f"Preprocessor: label must be a feature name or None, got {label!r}")
        self.label = label
        if not self.dense and not self.sparse:
            raise InvalidArgumentError("Preprocessor needs at least one dense or sparse feature")
        if dense_transform not in (None, "log1p"):
            raise InvalidArgumentError(f"Preprocessor: dense_transform must be 'log1p' or None, got {dense_transform!r}")
        self.dense_transform = dense_transform
        self.dense_fill = _real(dense_fill, "dense_fill")
        if sparse_fill is not None and not _is_int(sparse_fill):
            raise InvalidArgumentError(f"Preprocessor: sparse_fill must be an integer id or None, got {sparse_fill!r}")
        self.sparse_fill = None if sparse_fill is None else int(sparse_fill)
        self.label_fill = _real(label_fill, "label_fill")
        if not isinstance(hash_ids, (bool, np.bool_)):
            raise InvalidArgumentError(f"Preprocessor: hash_ids must be True or False, got {hash_ids!r}")
        self.hash_ids = bool(hash_ids)
        self.table_sizes = self._table_sizes(table_sizes)
        if self.hash_ids and len(self.table_sizes) != len(self.sparse):
            raise InvalidArgumentError("Preprocessor: hash_ids=True needs a table size for every sparse feature "
                                       "(table_sizes)")

    def _table_sizes(self, table_sizes: TableSizes) -> dict[str, int]:
        """table_sizes as {sparse feature: size}: one int for all, a mapping that names every
        sparse feature and nothing else, or a sequence in the order of ``sparse``."""
        def size(name: str, v: Any) -> int:
            if not _is_int(v) or int(v) <= 0:
                raise InvalidArgumentError(f"Preprocessor: table_sizes: the size of sparse feature '{name}' must be "
                                           f"a positive integer, got {v!r}")
            return int(v)

        if table_sizes is None:
            return {}
        if _is_int(table_sizes):
            if int(table_sizes) <= 0:
                raise InvalidArgumentError(f"Preprocessor: table_sizes must be positive, got {table_sizes!r}")
            return {n: int(table_sizes) for n in self.sparse}
        if isinstance(table_sizes, Mapping):
            unknown = [k for k in table_sizes if k not in self.sparse]
            if unknown:
                raise InvalidArgumentError(f"Preprocessor: table_sizes names {unknown}, which are not sparse features "
                                           f"(sparse: {self.sparse})")
            missing = [n for n in self.sparse if n not in table_sizes]
            if missing:
                raise InvalidArgumentError(f"Preprocessor: table_sizes lacks a size for sparse feature(s) {missing}; "
                                           f"give every sparse feature a size (or table_sizes=None for raw ids)")
            return {n: size(n, table_sizes[n]) for n in self.sparse}
        if isinstance(table_sizes, (str, bytes)) or not isinstance(table_sizes, (Sequence, np.ndarray)):
            raise InvalidArgumentError(f"Preprocessor: table_sizes must be None, a positive integer, a mapping "
                                       f"{{sparse feature: size}} or a list of sizes, got {table_sizes!r}")
        table_sizes = list(table_sizes)
        if len(table_sizes) != len(self.sparse):
            raise InvalidArgumentError(f"Preprocessor: {len(table_sizes)} table sizes for {len(self.sparse)} sparse "
                                       f"features")
        return {n: size(n, v) for n, v in zip(self.sparse, table_sizes)}

    @classmethod
    def criteo(cls, table_sizes: TableSizes = None, hash_ids: bool = False, **kw: Any) -> "Preprocessor":
        """label, I1..I13 dense, C1..C26 sparse (the layout of ``recflash import criteo``)."""
        from recflash.ingest import criteo

        return cls(dense=criteo.INT_NAMES, sparse=criteo.CAT_NAMES, label=criteo.LABEL, table_sizes=table_sizes,
                   hash_ids=hash_ids, **kw)

    @property
    def features(self) -> list[str]:
        """The store features to scan, label first (each once, also one used in two roles)."""
        return list(dict.fromkeys(([self.label] if self.label else []) + self.dense + self.sparse))

    def _roles(self) -> list[tuple[str, str]]:
        return ([(self.label, "label")] if self.label else []) + [(n, "dense") for n in self.dense] + \
            [(n, "sparse") for n in self.sparse]

    def check_schema(self, schema: pa.Schema, what: str = "Preprocessor") -> None:
        """Every feature is a column of ``schema`` with a type its role takes (dense and label:
        numeric scalar; sparse: integer or list of integers), else InvalidArgumentError (missing
        columns, all named) or SchemaError (the feature, its type and its role)."""
        names = set(schema.names)
        missing = [f for f in self.features if f not in names]
        if missing:
            raise InvalidArgumentError(f"{what}: the batch lacks column(s) {missing} that the preprocessor needs "
                                       f"(batch has {schema.names}); read them from the store")
        for name, role in self._roles():
            _check_role(name, schema.field(name).type, role, what)

    def _column(self, table, name: str, role: str) -> pa.Array:
        if name not in table.schema.names:
            raise InvalidArgumentError(f"Preprocessor: the table has no column '{name}' (the {role} feature "
                                       f"'{name}'); it has {table.schema.names}")
        arr = _column(table, name)
        _check_role(name, arr.type, role, "Preprocessor")
        return arr

    # -- the transformation ---------------------------------------------------------------------
    def dense_matrix(self, table) -> np.ndarray:
        n = table.num_rows
        out = np.empty((len(self.dense), n), dtype=np.float32)
        for j, name in enumerate(self.dense):
            arr = self._column(table, name, "dense")
            row = out[j]
            t = arr.type
            if pa.types.is_int64(t):
                np.copyto(row, _fixed(arr, np.int64), casting="unsafe")
            elif pa.types.is_float32(t):
                np.copyto(row, _fixed(arr, np.float32))
            else:
                a = arr.cast(pa.float32(), safe=False)
                np.copyto(row, _fixed(a, np.float32))
            if self.dense_transform == "log1p":
                np.maximum(row, 0.0, out=row)
                if pa.types.is_int64(t):
                    # Integer counts (Criteo's): 1 + x is exact below 2**24, so log(1 + x) is
                    # log1p within one ulp, and numpy's float32 log is vectorised (~5x faster
                    # than log1p; log1p was half of a training batch's preprocessing).
                    np.add(row, 1.0, out=row)
                    np.log(row, out=row)
                else:
                    np.log1p(row, out=row)
            m = valid_mask(arr)
            if m is not None:
                row[~m] = self.dense_fill
        return np.ascontiguousarray(out.T)

    def labels(self, table) -> np.ndarray:
        arr = self._column(table, self.label, "label")
        if pa.types.is_float32(arr.type):
            y = _fixed(arr, np.float32).copy()
        else:
            y = _fixed(arr.cast(pa.float32(), safe=False), np.float32).copy()
        m = valid_mask(arr)
        if m is not None:
            y[~m] = self.label_fill
        return y

    def _reduce_into(self, name: str, ids: np.ndarray, out: np.ndarray) -> None:
        # x mod m as x - (x // m) * m: numpy divides by a scalar with libdivide, ~2.6 ns per
        # value here against ~4.5 ns for np.remainder (same floor semantics)
        size = self.table_sizes.get(name)
        if self.hash_ids:
            h = out.view(np.uint64)
            _mix64_into(ids, h)
            q = np.floor_divide(h, np.uint64(size))
            np.multiply(q, np.uint64(size), out=q)
            np.subtract(h, q, out=h)
        elif size is not None:
            q = np.floor_divide(ids, size)
            np.multiply(q, size, out=q)
            np.subtract(ids, q, out=out)
        else:
            np.copyto(out, ids)

    def sparse_arrays(self, table) -> tuple[np.ndarray, np.ndarray]:
        """(values int64, lengths int32) of the KJT, feature-major."""
        n = table.num_rows
        parts = []  # (name, kind, arr, valid, count)
        total = 0
        for name in self.sparse:
            arr = self._column(table, name, "sparse")
            valid = valid_mask(arr)
            if pa.types.is_list(arr.type) or pa.types.is_large_list(arr.type) or pa.types.is_fixed_size_list(arr.type):
                flat = pc.list_flatten(arr)
                if not pa.types.is_int64(flat.type):
                    # integer ids of another width; uint64 above 2**63 wraps (then reduced modulo the table)
                    flat = flat.cast(pa.int64(), safe=False)
                count = len(flat)
                parts.append((name, "list", arr, flat, count))
            else:
                if not pa.types.is_int64(arr.type):
                    arr = arr.cast(pa.int64(), safe=False)
                count = n if (valid is None or self.sparse_fill is not None) else int(np.count_nonzero(valid))
                parts.append((name, "scalar", arr, valid, count))
            total += count
        values = np.empty(total, dtype=np.int64)
        lengths = np.empty(len(self.sparse) * n, dtype=np.int32)
        pos = 0
        for f, (name, kind, arr, extra, count) in enumerate(parts):
            lens = lengths[f * n:(f + 1) * n]
            seg = values[pos:pos + count]
            if kind == "scalar":
                valid = extra
                ids = _fixed(arr, np.int64)
                if valid is None:
                    lens.fill(1)
                    self._reduce_into(name, ids, seg)
                elif self.sparse_fill is not None:
                    lens.fill(1)
                    self._reduce_into(name, ids, seg)
                    fill = np.array([self.sparse_fill], dtype=np.int64)
                    tmp = np.empty(1, dtype=np.int64)
                    self._reduce_into(name, fill, tmp)
                    seg[~valid] = tmp[0]
                else:
                    np.copyto(lens, valid, casting="unsafe")
                    self._reduce_into(name, ids[valid], seg)
            else:
                flat = extra
                if count:
                    self._reduce_into(name, _fixed(flat, np.int64), seg)
                ll = pc.list_value_length(arr)
                if ll.null_count:
                    ll = ll.fill_null(0)
                np.copyto(lens, ll.to_numpy(zero_copy_only=False), casting="unsafe")
            pos += count
        return values, lengths

    def __call__(self, table) -> Any:
        """Arrow table (or record batch) with the features as columns -> ``Batch``."""
        import torch
        from torchrec.datasets.utils import Batch
        from torchrec.sparse.jagged_tensor import KeyedJaggedTensor

        self.check_schema(table.schema)
        n = table.num_rows
        dense = torch.from_numpy(self.dense_matrix(table)) if self.dense else torch.empty((n, 0))
        if self.sparse:
            values, lengths = self.sparse_arrays(table)
            kjt = KeyedJaggedTensor(keys=self.sparse, values=torch.from_numpy(values),
                                    lengths=torch.from_numpy(lengths), stride=n)
        else:
            kjt = KeyedJaggedTensor(keys=[], values=torch.empty(0, dtype=torch.int64),
                                    lengths=torch.empty(0, dtype=torch.int32), stride=n)
        if self.label:
            labels = torch.from_numpy(self.labels(table))
        else:
            labels = torch.zeros(n, dtype=torch.float32)
        return Batch(dense_features=dense, sparse_features=kjt, labels=labels)

    # -- batching over a store --------------------------------------------------------------------
    def tables(self, store, key_range: KeyRange = None, scan_keys: int = 1 << 18) -> Iterator[pa.Table]:
        """The features' rows over consecutive key windows of ``scan_keys`` keys, as
        :func:`scan_joined` tables (the same table ``scan_many`` gives). ``key_range``: None
        (every key, 2**64 - 1 included) or half-open (lo, hi), hi None for no upper bound. After
        an empty window the next existing key is found by probing ever wider ranges (a scan
        reads only the pages whose key range overlaps, so empty probes are cheap). Arguments
        and the store's feature types are checked here, before the first window."""
        lo, hi, scan_keys = self._check_scan(store, key_range, scan_keys, "Preprocessor.tables")
        return self._tables(store, lo, hi, scan_keys)

    def _check_scan(self, store, key_range: Any, scan_keys: Any, what: str) -> tuple[int, Optional[int], int]:
        lo, hi = check_key_range(key_range, what)
        scan_keys = check_positive_int(scan_keys, "scan_keys", what)
        # The store's types, per role, before any window (an empty scan: the schema only).
        self.check_schema(store.scan_many(self.features, key_range=(0, 0)).schema, what)
        return lo, hi, scan_keys

    def _tables(self, store, lo: int, hi: Optional[int], scan_keys: int) -> Iterator[pa.Table]:
        # end: exclusive, 2**64 for "no upper bound" (a window ending there is scanned with
        # hi=None, which includes key 2**64 - 1; a half-open window ending at 2**64 - 1 would not)
        end = _KEY_END if hi is None else hi
        feats = self.features
        while lo < end:
            w_hi = min(end, lo + scan_keys)
            t = scan_joined(store, feats, key_range=(lo, None if w_hi >= _KEY_END else w_hi))
            if t.num_rows:
                yield t
                lo = w_hi
                continue
            if w_hi >= end:
                return
            nxt = _next_key(store, feats, w_hi, end, scan_keys)
            if nxt is None:
                return
            lo = nxt

    def batches(self, store, batch_size: int = 8192, key_range: KeyRange = None,
                scan_keys: int = 1 << 18, drop_last: bool = False, prefetch: bool = True) -> Iterator[Any]:
        """Batches of ``batch_size`` rows in key order. Scans run one window ahead in a thread
        (the store releases the GIL), so reading overlaps preprocessing. ``key_range`` as in
        :meth:`tables`. The arguments and the store's feature types are checked when this is
        called (InvalidArgumentError / SchemaError / UnknownFeatureError), not at the first batch."""
        what = "Preprocessor.batches"
        batch_size = check_positive_int(batch_size, "batch_size", what)
        lo, hi, scan_keys = self._check_scan(store, key_range, scan_keys, what)
        return self._batches(self._tables(store, lo, hi, scan_keys), batch_size, drop_last, prefetch)

    def _batches(self, source: Iterator[pa.Table], batch_size: int, drop_last: bool, prefetch: bool) -> Iterator[Any]:
        if prefetch:
            source = _prefetch(source)
        carry: Optional[pa.Table] = None
        for t in source:
            if carry is not None and carry.num_rows:
                t = pa.concat_tables([carry, t])
                carry = None
            n = t.num_rows
            full = n - n % batch_size
            for lo in range(0, full, batch_size):
                yield self(t.slice(lo, batch_size))
            if full < n:
                carry = t.slice(full)
        if carry is not None and carry.num_rows and not drop_last:
            yield self(carry.combine_chunks())


def _next_key(store, features: Sequence[str], lo: int, end: int, step: int) -> Optional[int]:
    """The smallest key >= lo (and < end; end 2**64: no upper bound) of any of the features,
    or None. Probes with scan_keys: the keys alone, no value read."""
    width = 2 * max(1, step)
    while lo < end:
        p_hi = min(end, lo + width)
        kr = (lo, None if p_hi >= _KEY_END else p_hi)
        firsts = []
        for f in features:
            keys = store.scan_keys(f, key_range=kr)
            if len(keys):
                firsts.append(int(keys[0]))
        if firsts:
            return min(firsts)
        lo = p_hi
        width *= 2
    return None


def scan_joined(store, features: Sequence[str], key_range: KeyRange = None) -> pa.Table:
    """``store.scan_many(features, key_range)``: key (ascending) and one column per feature,
    null where a feature lacks a key. Kept as a name for callers; the O(rows) bitmap join
    lives in the store now."""
    return store.scan_many(list(features), key_range=key_range)


def _prefetch(it: Iterator[pa.Table], depth: int = 1) -> Iterator[pa.Table]:
    q: queue.Queue = queue.Queue(maxsize=depth)
    done = object()
    stop = threading.Event()

    def run() -> None:
        try:
            for x in it:
                while not stop.is_set():
                    try:
                        q.put(x, timeout=0.1)
                        break
                    except queue.Full:
                        continue
                if stop.is_set():
                    return
            q.put(done)
        except BaseException as e:  # handed to the consumer
            q.put(e)

    th = threading.Thread(target=run, name="recflash-prefetch", daemon=True)
    th.start()
    try:
        while True:
            x = q.get()
            if x is done:
                return
            if isinstance(x, BaseException):
                raise x
            yield x
    finally:
        stop.set()
