"""Embedding tables stored in the recflash store.

A table is a ``fixed_size_list<float32, dim>`` feature named ``emb/<table>`` whose keys are
row ids. ``load_table`` writes it in bulk and compacts it, so rows lie in packed pages in id
order: the SLS engine then computes a row's address instead of looking it up, and reads just
the device blocks holding it. ``update_rows`` writes new versions while serving; they are
found through the store's key index (and its write buffer) until the next compaction folds
them back into the packed layout.
"""

from __future__ import annotations

import dataclasses
import json
import weakref
import zlib
from typing import Dict, Optional

import numpy as np

from recflash.reader import Store
from recflash.reader.errors import InvalidArgumentError, SchemaError, UnknownFeatureError

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
        return 4 * self.dim


def _as_numpy(x, dtype) -> np.ndarray:
    if hasattr(x, "detach"):  # torch.Tensor
        x = x.detach().cpu().numpy()
    return np.ascontiguousarray(np.asarray(x), dtype=dtype)


class EmbeddingStore:
    """Embedding tables on a :class:`recflash.reader.Store`."""

    def __init__(self, store: Store):
        self.store = store
        self.store.create_feature(_CATALOG, "binary")
        self._tables: Dict[str, TableInfo] = {}
        self._engines = weakref.WeakSet()  # SLS engines whose caches must follow updates
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
        if dtype != "float32":
            raise SchemaError(f"table '{name}': only float32 rows are supported, got {dtype}")
        if num_rows <= 0 or dim <= 0:
            raise InvalidArgumentError(f"table '{name}': num_rows and dim must be positive, got {num_rows}, {dim}")
        if name in self._tables:
            t = self._tables[name]
            if (t.num_rows, t.dim) != (num_rows, dim):
                raise SchemaError(f"table '{name}' exists with {t.num_rows} rows x dim {t.dim}")
            return t
        self.store.create_feature(self.feature_name(name), f"fixed_size_list<float32, {dim}>")
        info = TableInfo(name=name, num_rows=int(num_rows), dim=int(dim), dtype=dtype)
        key = np.array([zlib.crc32(name.encode())], dtype=np.uint64)
        self.store.put(_CATALOG, key, [json.dumps(dataclasses.asdict(info)).encode()])
        self.store.sync()
        self._tables[name] = info
        return info

    def load_table(self, name: str, weights, progress: bool = True, chunk_rows: int = 1 << 18) -> None:
        """Bulk load (all rows, ids 0..num_rows-1), then compact into the packed layout."""
        t = self.info(name)
        w = _as_numpy(weights, np.float32)
        if w.shape != (t.num_rows, t.dim):
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
                self.store.put(feature, np.arange(a, z, dtype=np.uint64), w[a:z])
                if bar:
                    bar.advance(task, z - a)
        finally:
            if bar:
                bar.stop()
        self.store.compact([feature])
        self.verify_table(name)

    def verify_table(self, name: str) -> int:
        """Reads the table's packed pages whose block checksums are not held yet (whole pages,
        page checksums verified) and takes their 512 B block checksums, so vector-grained
        reads of it are verified from the first lookup on. Returns the pages read (0 when all
        sums are held, or with ``StoreOptions(verify_block_reads=False)``)."""
        self.info(name)
        return int(self.store.verify_rows(self.feature_name(name)))

    def update_rows(self, name: str, ids, rows) -> None:
        """New versions of some rows, visible to the next lookup (model update while serving)."""
        t = self.info(name)
        ids = self._check_ids(t, ids)
        r = _as_numpy(rows, np.float32)
        if r.shape != (len(ids), t.dim):
            raise SchemaError(f"table '{name}': {len(ids)} ids need rows of shape ({len(ids)}, {t.dim}), "
                              f"got {r.shape}")
        self.store.put(self.feature_name(name), ids.astype(np.uint64), r)
        uniq = np.unique(ids)
        for engine in list(self._engines):
            engine._invalidate(name, uniq)

    def _register_engine(self, engine) -> None:
        self._engines.add(engine)

    def read_rows(self, name: str, ids, vector_grained: bool = True) -> np.ndarray:
        """Rows for ids (any order, duplicates allowed) as a [len(ids), dim] float32 array."""
        t = self.info(name)
        ids = self._check_ids(t, ids)
        uniq, inv = np.unique(ids, return_inverse=True)
        rows, st = self.store.gather_rows(self.feature_name(name), uniq, vector_grained)
        self.last_gather_stats = st
        return rows[inv]

    def compact(self, name: Optional[str] = None) -> None:
        """Folds updated rows back into the packed layout."""
        names = [name] if name else list(self._tables)
        self.store.compact([self.feature_name(n) for n in names])
        for n in names:
            self.verify_table(n)

    @staticmethod
    def _check_ids(t: TableInfo, ids) -> np.ndarray:
        ids = _as_numpy(ids, np.int64).reshape(-1)
        if ids.size and (ids.min() < 0 or ids.max() >= t.num_rows):
            bad = int(ids[(ids < 0) | (ids >= t.num_rows)][0])
            raise InvalidArgumentError(f"row id {bad} out of range for table '{t.name}' with {t.num_rows} rows")
        return ids
