"""Ray Data over a store: ``read_store`` / ``RecFlashDatasource`` and ``TorchRecCollate``.

```python
import ray
from recflash.ingest import Preprocessor
from recflash.ingest.ray import read_store, TorchRecCollate

pre = Preprocessor.criteo(table_sizes=100_000)
ds = read_store("/data/store", features=pre.features)          # key + one column per feature
for batch in ds.iter_torch_batches(batch_size=4096, collate_fn=TorchRecCollate(pre)):
    ...                                                        # torchrec.datasets.utils.Batch
```

- **Read tasks split by key range.** The driver opens the store read-only and cuts the key
  space at page boundaries of the requested features (``Store.key_ranges``), about
  ``rows_per_task`` rows per task. The ranges are contiguous and disjoint and the first and
  last are open-ended, so every key (also one still in the write buffer) is read by exactly
  one task.
- **Projection pushdown.** ``ds.select_columns([...])`` reaches the read: a task scans only
  the selected features (``scan_many`` reads a page holding several of them once), so a model
  that needs 8 of 39 features reads about 8/39 of the bytes.
- **Blocks** are Arrow tables: ``key`` (uint64, ascending) and one column per feature (null
  where a feature lacks the key), exactly what ``Store.scan_many`` returns.
- **Snapshots.** Each read task opens the store read-only (no lock; many processes at once,
  also alongside a writer) and reads the snapshot of its open. If a writer rewrites a page the
  task's snapshot names, the engine raises ``StaleSnapshotError`` instead of returning other
  data; the task then reopens once and reads the newer snapshot. Tasks of one dataset can
  therefore see different snapshots while a writer is active; with no writer (the usual
  between-epochs update) they all see the same data.
"""

from __future__ import annotations

import math
from typing import Any, Dict, Iterable, List, Optional, Sequence, Tuple

import numpy as np
import pyarrow as pa
import ray.data
from ray.data.block import BlockMetadata
from ray.data.collate_fn import ArrowBatchCollateFn
from ray.data.datasource import Datasource, ReadTask

from recflash.reader import Store, StoreOptions
from recflash.reader.store import parse_value_type
from recflash.reader.errors import InvalidArgumentError, StaleSnapshotError

KEY = "key"
_MAX_KEY = (1 << 64) - 1
KeyRange = Optional[Tuple[int, Optional[int]]]


def _open_ro(path: str) -> Store:
    return Store.open(path, StoreOptions(read_only=True))


def _arrow_type(type_str: str) -> pa.DataType:
    if type_str == "float32":
        return pa.float32()
    if type_str == "int64":
        return pa.int64()
    if type_str == "list<int64>":
        return pa.list_(pa.int64())
    if type_str == "list<float32>":
        return pa.list_(pa.float32())
    canonical, dim = parse_value_type(type_str)
    if dim:
        return pa.list_(pa.float32(), dim)
    if canonical != "binary":
        raise InvalidArgumentError(f"no Arrow type for the store type {type_str!r}")
    return pa.binary()


def _row_bytes(t: pa.DataType) -> int:
    """In-memory bytes per value (an estimate for variable-width types)."""
    if pa.types.is_fixed_size_list(t):
        return 4 * t.list_size
    if pa.types.is_list(t):
        return 4 + 8 * 4
    if pa.types.is_binary(t):
        return 4 + 32
    return t.bit_width // 8


def split_key_range(ranges: Dict[str, np.ndarray], rows_per_task: int, key_range: KeyRange = None,
                    max_tasks: Optional[int] = None) -> List[Tuple[int, Optional[int], int]]:
    """Cuts [lo, hi) (hi None: to the end) at page boundaries into tasks of about
    ``rows_per_task`` items. ``ranges`` is ``Store.key_ranges(feature)`` of the feature that
    drives the split. Returns (lo, hi, estimated rows) per task; the ranges are contiguous,
    disjoint and cover [lo, hi) whole."""
    lo = 0 if key_range is None else int(key_range[0])
    hi = None if key_range is None or key_range[1] is None else int(key_range[1])
    mins = np.asarray(ranges["min_key"], dtype=np.uint64)
    maxs = np.asarray(ranges["max_key"], dtype=np.uint64)
    items = np.asarray(ranges["items"], dtype=np.float64)
    # Items of each page inside [lo, hi), assuming keys spread evenly over the page's range.
    span = (maxs - mins).astype(np.float64) + 1.0
    a = np.maximum(mins.astype(np.float64), float(lo))
    b = np.minimum(maxs.astype(np.float64) + 1.0, float(hi) if hi is not None else math.inf)
    inside = np.clip(b - a, 0.0, None) / span * items
    total = float(inside.sum())
    n_tasks = max(1, int(math.ceil(total / max(1, rows_per_task))))
    if max_tasks is not None:
        n_tasks = min(n_tasks, max(1, max_tasks))
    target = total / n_tasks
    cuts: List[int] = []
    acc = 0.0
    for m, n in zip(mins.tolist(), inside.tolist()):
        if n <= 0:
            continue
        # A cut lands on a page's first key, so a task reads whole pages where it can.
        if acc >= target * (len(cuts) + 1) and m > lo and (hi is None or m < hi) and (not cuts or m > cuts[-1]):
            cuts.append(int(m))
        acc += n
    bounds = [lo] + cuts
    out = []
    for i, start in enumerate(bounds):
        end = bounds[i + 1] if i + 1 < len(bounds) else hi
        e = np.clip(np.minimum(maxs.astype(np.float64) + 1.0, math.inf if end is None else float(end))
                    - np.maximum(mins.astype(np.float64), float(start)), 0.0, None) / span * items
        out.append((start, end, int(round(float(e.sum())))))
    return out


class RecFlashDatasource(Datasource):
    """A ``ray.data.Datasource`` over a recflash store (see the module docstring).

    store_path: the store directory. features: the features to read (default: all, in creation
    order). key_range: (lo, hi) half-open, hi None for no upper bound. rows_per_task: about
    this many rows per read task (None: split into the ``parallelism`` Ray asks for).
    """

    def __init__(self, store_path: str, features: Optional[Sequence[str]] = None, key_range: KeyRange = None,
                 rows_per_task: Optional[int] = 1 << 18):
        super().__init__()
        self._path = str(store_path)
        if rows_per_task is not None and int(rows_per_task) < 1:
            raise InvalidArgumentError(f"rows_per_task must be >= 1, got {rows_per_task}")
        self._rows_per_task = None if rows_per_task is None else int(rows_per_task)
        if key_range is not None:
            lo, hi = key_range
            if int(lo) < 0 or (hi is not None and int(hi) < int(lo)):
                raise InvalidArgumentError(f"key_range {key_range!r} must satisfy 0 <= lo <= hi")
        self._key_range = key_range
        with _open_ro(self._path) as store:
            types = store.features()
            if features is None:
                features = list(types)
            features = list(features)
            if not features:
                raise InvalidArgumentError(f"RecFlashDatasource over '{self._path}': no features to read")
            for f in features:
                if f == KEY:
                    raise InvalidArgumentError(f"'{KEY}' is the key column of store '{self._path}', not a feature")
                if f not in types:
                    raise InvalidArgumentError(f"unknown feature '{f}' in store '{self._path}' "
                                               f"(known: {', '.join(list(types)[:8])}{', ...' if len(types) > 8 else ''})")
            if len(set(features)) != len(features):
                raise InvalidArgumentError(f"duplicate feature names in {features}")
            self._features = features
            self._types = {f: _arrow_type(types[f]) for f in features}
            self._ranges = {f: store.key_ranges(f) for f in features}
        self._projection_map: Optional[Dict[str, str]] = None

    # -- projection pushdown (Ray 2.60: supports_projection_pushdown / apply_projection) -----
    def supports_projection_pushdown(self) -> bool:
        return True

    def _columns(self) -> List[str]:
        """Output columns in order: the projection's, else key + every feature."""
        cols = self._get_data_columns()
        if cols is None:
            return [KEY] + self._features
        for c in cols:
            if c != KEY and c not in self._types:
                raise InvalidArgumentError(f"column '{c}' is not among the features read from store "
                                           f"'{self._path}' ({', '.join([KEY] + self._features)})")
        return list(cols)

    def _scan_features(self, columns: List[str]) -> List[str]:
        feats = [c for c in columns if c != KEY]
        # Only the key asked for: the rows are still the union of every feature's keys.
        return feats or list(self._features)

    # -- Datasource API --------------------------------------------------------------------
    def get_name(self) -> str:
        return "RecFlash"

    def schema(self) -> pa.Schema:
        cols = self._columns()
        return pa.schema([pa.field(c, pa.uint64() if c == KEY else self._types[c]) for c in cols])

    def _driver_feature(self, feats: List[str]) -> str:
        return max(feats, key=lambda f: float(np.asarray(self._ranges[f]["items"], dtype=np.float64).sum()))

    def _splits(self, parallelism: int) -> List[Tuple[int, Optional[int], int]]:
        feats = self._scan_features(self._columns())
        ranges = self._ranges[self._driver_feature(feats)]
        if self._rows_per_task is not None:
            return split_key_range(ranges, self._rows_per_task, self._key_range)
        total = float(np.asarray(ranges["items"], dtype=np.float64).sum())
        per = max(1, int(math.ceil(total / max(1, parallelism))))
        return split_key_range(ranges, per, self._key_range, max_tasks=parallelism)

    def num_read_tasks(self) -> int:
        """The number of read tasks ``rows_per_task`` gives (before any projection)."""
        return len(self._splits(1))

    def estimate_inmemory_data_size(self) -> Optional[int]:
        return sum(n for _, _, n in self._splits(1)) * self._row_bytes()

    def _row_bytes(self) -> int:
        return sum(8 if c == KEY else _row_bytes(self._types[c]) for c in self._columns())

    def get_read_tasks(self, parallelism: int, per_task_row_limit: Optional[int] = None,
                       data_context: Any = None) -> List[ReadTask]:
        columns = self._columns()
        feats = self._scan_features(columns)
        schema = self.schema()
        row_bytes = self._row_bytes()
        path = self._path
        tasks = []
        for lo, hi, rows in self._splits(parallelism):
            meta = BlockMetadata(num_rows=rows, size_bytes=rows * row_bytes, input_files=None, exec_stats=None)
            tasks.append(ReadTask(
                lambda lo=lo, hi=hi: _read_range(path, feats, columns, lo, hi),
                meta, schema=schema, per_task_row_limit=per_task_row_limit))
        return tasks


def _read_range(path: str, feats: List[str], columns: List[str], lo: int, hi: Optional[int]) -> Iterable[pa.Table]:
    """One read task: a read-only open, one scan_many of [lo, hi), the projected columns."""
    for attempt in (0, 1):
        store = _open_ro(path)
        try:
            table = store.scan_many(feats, key_range=(lo, hi))
            break
        except StaleSnapshotError:
            if attempt:
                raise
        finally:
            store.close()
    return [table.select(columns)]


def read_store(store_path: str, features: Optional[Sequence[str]] = None, *, key_range: KeyRange = None,
               rows_per_task: Optional[int] = 1 << 18, **ray_args: Any) -> "ray.data.Dataset":
    """``ray.data.read_datasource(RecFlashDatasource(...), **ray_args)``: a Dataset of Arrow
    blocks with ``key`` and one column per feature."""
    ds = RecFlashDatasource(store_path, features=features, key_range=key_range, rows_per_task=rows_per_task)
    if rows_per_task is not None and "override_num_blocks" not in ray_args:
        # One block per read task. Left to itself, Ray asks for about one block per MiB of
        # the estimated size and splits each task's table to match (2 M rows of 8 features:
        # 129 blocks of 1 MiB, each its own object, most batches then concatenated across
        # two of them), which cost ~0.8 s of a 1.1 s epoch on 2 cores.
        ray_args["override_num_blocks"] = ds.num_read_tasks()
    return ray.data.read_datasource(ds, **ray_args)


class TorchRecCollate(ArrowBatchCollateFn):
    """``iter_torch_batches(collate_fn=TorchRecCollate(preprocessor))``: each Arrow batch of
    the dataset becomes a TorchRec ``Batch`` (dense float32, a KeyedJaggedTensor of ids,
    labels) through ``preprocessor`` (a :class:`recflash.ingest.Preprocessor`) — one numpy
    pass per column, no per-row Python. The output is not a plain tensor batch, so Ray leaves
    device placement to the caller (``batch.to(device)``)."""

    def __init__(self, preprocessor: Any):
        super().__init__()
        self.preprocessor = preprocessor
        self._needed = list(preprocessor.features)

    def __call__(self, batch: pa.Table) -> Any:
        have = set(batch.column_names)
        missing = [c for c in self._needed if c not in have]
        if missing:
            raise InvalidArgumentError(f"TorchRecCollate: the batch lacks column(s) {missing} that the preprocessor "
                                       f"needs (batch has {batch.column_names}); read them from the store")
        return self.preprocessor(batch)


__all__ = ["RecFlashDatasource", "read_store", "TorchRecCollate", "split_key_range"]
