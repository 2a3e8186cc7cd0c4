"""Embedding tables stored in the recflash store.

A table is a ``fixed_size_list<float32, W>`` feature named ``emb/<table>`` whose keys are
row ids; W words hold one row in the table's row format (``float32``: W = dim; ``float16``;
``int8``: FBGEMM's row-wise layout with a per-row scale and bias — see ``row_format.py``). ``load_table`` writes it in bulk and compacts it, so rows lie in packed pages in id
order: the SLS engine then computes a row's address instead of looking it up, and reads just
the device blocks holding it. ``update_rows`` writes new versions while serving; they are
found through the store's key index (and its write buffer) until the next compaction folds
them back into the packed layout.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import weakref
import zlib
from typing import Dict, Optional

import numpy as np

from recflash.ndp import row_format
from recflash.reader import Store
from recflash.reader.errors import InvalidArgumentError, RecflashError, SchemaError, UnknownFeatureError

TABLE_PREFIX = "emb/"
_CATALOG = "emb/__tables__"  # binary feature: crc32(name) -> JSON table description


@dataclasses.dataclass(frozen=True)
class TableInfo:
    name: str
    num_rows: int
    dim: int
    dtype: str = "float32"

    @property
    def row_bytes(self) -> int:
        """Bytes of one encoded row (float32: 4 x dim; float16: 2 x dim; int8: dim + 4)."""
        return row_format.row_bytes(self.dtype, self.dim)

    @property
    def words(self) -> int:
        """4-byte words a row takes in the store (the feature's fixed width)."""
        return row_format.row_words(self.dtype, self.dim)


_INT64_MAX = np.iinfo(np.int64).max


def _as_numpy(x, dtype) -> np.ndarray:
    """A contiguous array of `dtype` (for float data such as weights; ids go through as_ids)."""
    if hasattr(x, "detach"):  # torch.Tensor
        x = x.detach().cpu().numpy()
    return np.ascontiguousarray(np.asarray(x), dtype=dtype)


def as_ids(x, what: str, ndim: Optional[int] = 1) -> np.ndarray:
    """Row ids, offsets or lengths as a contiguous int64 array, refusing what is not integer.

    Float (1.7 would silently become row 1), bool, complex and object arrays raise
    :class:`InvalidArgumentError` naming `what` (e.g. "sls on table 'user': indices"); so do
    unsigned values above the int64 range (reported as given, not wrapped negative) and, when
    `ndim` is given, another number of dimensions. An empty sequence is accepted whatever its
    dtype (``[]`` is float64 to numpy)."""
    if hasattr(x, "detach"):  # torch.Tensor
        x = x.detach().cpu().numpy()
    try:
        a = np.asarray(x)
    except (ValueError, TypeError) as e:  # ragged nested lists and the like
        raise InvalidArgumentError(f"{what} must be a 1-D array of integer ids: {e}") from None
    if a.dtype.kind not in "iu":
        if a.size == 0 and a.dtype.kind in "fiub":
            a = a.astype(np.int64)
        else:
            raise InvalidArgumentError(f"{what} must be int64 or int32, got {a.dtype}")
    if ndim is not None and a.ndim != ndim:
        raise InvalidArgumentError(f"{what} must have {ndim} dimension(s), got shape {list(a.shape)}")
    if a.dtype.kind == "u" and a.size and int(a.max()) > _INT64_MAX:
        return a  # the caller range-checks the values as given; see check_range
    return np.ascontiguousarray(a, dtype=np.int64)


def check_range(ids: np.ndarray, table: str, num_rows: int, prefix: str = "") -> np.ndarray:
    """`ids` (from as_ids) as int64 after checking 0 <= id < num_rows; the message reports the
    first bad id as it was given."""
    if ids.size:
        if ids.dtype.kind == "u":
            bad_mask = ids >= np.uint64(num_rows)
        else:
            bad_mask = (ids < 0) | (ids >= num_rows)
        if bad_mask.any():
            bad = int(ids[bad_mask][0])
            raise InvalidArgumentError(f"{prefix}row id {bad} out of range for table '{table}' with {num_rows} rows")
    return np.ascontiguousarray(ids, dtype=np.int64)


def public_error(e: Exception) -> Exception:
    """`e` with the store's feature names (``'emb/user'``) replaced by the table's (``'user'``):
    the engine and the store name features, a user knows tables."""
    msg = str(e)
    if f"'{TABLE_PREFIX}" not in msg or not e.args:
        return e
    try:
        out = type(e)(msg.replace(f"'{TABLE_PREFIX}", "'"))
    except Exception:  # noqa: BLE001 - an exception class with another signature: keep it as it is
        return e
    out.__cause__ = e.__cause__
    return out


@contextlib.contextmanager
def table_errors():
    """Re-raises a recflash error from the store or engine with table names (public_error)."""
    try:
        yield
    except RecflashError as e:
        pe = public_error(e)
        if pe is e:
            raise
        raise pe from None


class EmbeddingStore:
    """Embedding tables on a :class:`recflash.reader.Store`."""

    def __init__(self, store: Store):
        self.store = store
        self._tables: Dict[str, TableInfo] = {}
        self._engines = weakref.WeakSet()  # SLS engines whose caches must follow updates
        if _CATALOG not in self.store.features():
            return  # no tables yet: the catalog is created with the first (a data store stays as it is)
        cat = self.store.scan(_CATALOG)
        for v in cat.column("value").to_pylist():
            d = json.loads(v)
            self._tables[d["name"]] = TableInfo(**d)

    @staticmethod
    def feature_name(table: str) -> str:
        return TABLE_PREFIX + table

    def tables(self) -> Dict[str, TableInfo]:
        return dict(self._tables)

    def info(self, table: str) -> TableInfo:
        try:
            return self._tables[table]
        except KeyError:
            raise UnknownFeatureError(f"unknown embedding table '{table}' in store '{self.store.path}' "
                                      f"(tables: {', '.join(sorted(self._tables)) or 'none'})") from None

    def create_table(self, name: str, num_rows: int, dim: int, dtype: str = "float32") -> TableInfo:
        """A table of num_rows x dim values; dtype is the row format: float32, float16 or int8."""
        row_format.check_dtype(dtype, f"table '{name}'")
        if num_rows <= 0 or dim <= 0:
            raise InvalidArgumentError(f"table '{name}': num_rows and dim must be positive, got {num_rows}, {dim}")
        if name in self._tables:
            t = self._tables[name]
            if (t.num_rows, t.dim, t.dtype) != (num_rows, dim, dtype):
                raise SchemaError(f"table '{name}' exists with {t.num_rows} rows x dim {t.dim} of {t.dtype}, "
                                  f"not {num_rows} x {dim} of {dtype}")
            return t
        words = row_format.row_words(dtype, dim)
        if _CATALOG not in self.store.features():
            self.store.create_feature(_CATALOG, "binary")
        self.store.create_feature(self.feature_name(name), f"fixed_size_list<float32, {words}>")
        info = TableInfo(name=name, num_rows=int(num_rows), dim=int(dim), dtype=dtype)
        key = np.array([zlib.crc32(name.encode())], dtype=np.uint64)
        self.store.put(_CATALOG, key, [json.dumps(dataclasses.asdict(info)).encode()])
        self.store.sync()
        self._tables[name] = info
        return info

    def load_table(self, name: str, weights, progress: bool = True, chunk_rows: int = 1 << 18) -> None:
        """Bulk load (all rows, ids 0..num_rows-1), then compact into the packed layout.

        ``weights``: float rows [num_rows, dim] (encoded into the table's row format), or for a
        float16/int8 table its encoded rows as uint8 [num_rows, row_bytes] (stored unchanged)."""
        t = self.info(name)
        w = weights.detach().cpu().numpy() if hasattr(weights, "detach") else np.asarray(weights)
        if w.dtype != np.uint8:
            w = np.ascontiguousarray(w, dtype=np.float32)
        if w.ndim != 2 or w.shape[0] != t.num_rows or w.shape[1] not in (t.dim, t.row_bytes if w.dtype == np.uint8 else t.dim):
            raise SchemaError(f"table '{name}' is {t.num_rows} x {t.dim}; weights have shape {w.shape}")
        feature = self.feature_name(name)
        bar = None
        if progress:
            from rich.progress import Progress

            bar = Progress(transient=True)
            bar.start()
            task = bar.add_task(f"loading {name}", total=t.num_rows)
        try:
            for a in range(0, t.num_rows, chunk_rows):
                z = min(t.num_rows, a + chunk_rows)
                rows = row_format.encode_rows(t.dtype, w[a:z], t.dim, f"table '{name}'")
                with table_errors():
                    self.store.put(feature, np.arange(a, z, dtype=np.uint64), rows)
                if bar:
                    bar.advance(task, z - a)
        finally:
            if bar:
                bar.stop()
        with table_errors():
            self.store.compact([feature])
        self.verify_table(name)

    def verify_table(self, name: str) -> int:
        """Reads the table's packed pages whose block checksums are not held yet (whole pages,
        page checksums verified) and takes their 512 B block checksums, so vector-grained
        reads of it are verified from the first lookup on. Returns the pages read (0 when all
        sums are held, or with ``StoreOptions(verify_block_reads=False)``)."""
        self.info(name)
        with table_errors():
            return int(self.store.verify_rows(self.feature_name(name)))

    def update_rows(self, name: str, ids, rows) -> None:
        """New versions of some rows, visible to the next lookup (model update while serving).

        Float rows are encoded into the table's row format; a float16/int8 table also takes
        encoded uint8 rows."""
        t = self.info(name)
        ids = self._check_ids(t, ids)
        r = rows.detach().cpu().numpy() if hasattr(rows, "detach") else np.asarray(rows)
        if r.ndim != 2 or r.shape[0] != len(ids) or (r.dtype != np.uint8 and r.shape[1] != t.dim):
            raise SchemaError(f"table '{name}': {len(ids)} ids need rows of shape ({len(ids)}, {t.dim}), "
                              f"got {r.shape}")
        r = row_format.encode_rows(t.dtype, r, t.dim, f"table '{name}'")
        with table_errors():
            self.store.put(self.feature_name(name), ids.astype(np.uint64), r)
        uniq = np.unique(ids)
        for engine in list(self._engines):
            engine._invalidate(name, uniq)

    def _register_engine(self, engine) -> None:
        self._engines.add(engine)

    def read_rows(self, name: str, ids, vector_grained: bool = True, raw: bool = False,
                  dense_page_rows: int = 0) -> np.ndarray:
        """Rows for ids (any order, duplicates allowed) as a [len(ids), dim] float32 array
        (float16/int8 rows decoded as the SLS engine pools them; ``raw=True``: the encoded rows
        as uint8 [len(ids), row_bytes])."""
        t = self.info(name)
        ids = self._check_ids(t, ids)
        uniq, inv = np.unique(ids, return_inverse=True)
        with table_errors():
            rows, st = self.store.gather_rows(self.feature_name(name), uniq, vector_grained, dense_page_rows)
        self.last_gather_stats = st
        rows = rows[inv]
        if raw:
            return row_format.raw_rows(t.dtype, rows, t.dim) if t.dtype != "float32" else rows.view(np.uint8)
        return row_format.decode_rows(t.dtype, rows, t.dim)

    def compact(self, name: Optional[str] = None) -> None:
        """Folds updated rows back into the packed layout."""
        names = [name] if name else list(self._tables)
        with table_errors():
            self.store.compact([self.feature_name(n) for n in names])
        for n in names:
            self.verify_table(n)

    @staticmethod
    def _check_ids(t: TableInfo, ids) -> np.ndarray:
        ids = as_ids(ids, f"table '{t.name}': ids", ndim=None).reshape(-1)
        return check_range(ids, t.name, t.num_rows)
