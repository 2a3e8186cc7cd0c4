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
- **Projection pushdown.** ``ds.select_columns([...])`` reaches the read: a task scans the
  selected features' values and only the keys of the others. As with any ``select_columns``
  the rows do not change: they stay the union of the keys of every feature the dataset was
  made with, so a feature the projection drops is read with ``Store.scan_keys``
  (``scan_many(selected, rows_of=dropped)``), which reads no value. Its keys come from the
  page table for pages holding a dense run of keys (row numbers without gaps: no read), else
  from the key index when the task's read-only handle can take it from a ``CHECKPOINT`` of
  its snapshot (features updated or merged since their load, once the writer closed cleanly:
  no read), else from its pages, read whole (checksums cover whole pages) with only the keys
  decoded: a sparse feature that was only ever bulk loaded (an import with empty fields)
  costs its pages' reads, but no value decoding or copying. ``count()`` and
  ``select_columns([])`` read keys alone. Fewer ``features`` given to ``read_store`` read
  nothing of the others, but then the rows are the union of fewer features' keys.
- **Blocks** are Arrow tables: ``key`` (uint64, ascending) and one column per feature (null
  where a feature lacks the key), exactly what ``Store.scan_many`` returns.
- **Row counts.** A task's row figure comes from one feature's page item counts (an
  estimate: other features' keys are not in it, older versions of updated keys are), so the
  tasks report their rows as unknown to Ray and ``count()`` reads; the byte size stays an
  estimate for Ray's planning.
- **Snapshots.** Each read task opens the store read-only (no lock; many processes at once,
  also alongside a writer) and reads the snapshot of its open. If a writer rewrites a page the
  task's snapshot names, the engine raises ``StaleSnapshotError`` instead of returning other
  data; the task then reopens and reads the newer snapshot. The same holds when the open itself
  meets a writer moving on: the engine raises ``StaleSnapshotError`` at open too (metadata the
  writer committed past, or a WAL file the writer retired between the open's listing of the WAL
  directory and its replay of that file). Up to ``OPEN_RETRIES`` (10) reopens with a short
  backoff, then one ``StaleSnapshotError`` that says the writer outran the read. Tasks of one
  dataset can therefore see different snapshots while a writer is active; with no writer (the
  usual between-epochs update) they all see the same data.
- **Arguments** are checked in the driver when ``read_store`` / ``RecFlashDatasource`` is
  called (``InvalidArgumentError`` naming the argument and value); a ``select_columns`` name
  the dataset lacks is ``ColumnSelectionError`` when Ray plans the read.
"""

from __future__ import annotations

import math
import os
import time
from typing import Any, Callable, Dict, Iterable, List, Optional, Sequence, Tuple, TypeVar

import numpy as np
import pyarrow as pa
import ray.data
from ray.data.block import BlockMetadata
from ray.data.collate_fn import ArrowBatchCollateFn
from ray.data.datasource import Datasource, ReadTask
from ray.exceptions import UserCodeException

try:  # the placeholder column Ray Data's own readers put into zero-column blocks
    from ray.data._internal.arrow_block import _BATCH_SIZE_PRESERVING_STUB_COL_NAME as _STUB
except ImportError:  # pragma: no cover - a Ray without it
    _STUB = "__bsp_stub"

from recflash.ingest.preprocess import Preprocessor, check_key_range, check_names, check_positive_int
from recflash.reader import Store, StoreOptions
from recflash.reader.store import parse_value_type
from recflash.reader.errors import InvalidArgumentError, StaleSnapshotError

KEY = "key"
_MAX_KEY = (1 << 64) - 1
KeyRange = Optional[Tuple[int, Optional[int]]]
T = TypeVar("T")

#: Read-only opens (and the read after each) retried while a writer moves the store on under
#: them (StaleSnapshotError, at the open or the read); then one error.
OPEN_RETRIES = 10
_RETRY_DELAY = 0.01  # seconds before the first retry, doubled up to _RETRY_DELAY_MAX
_RETRY_DELAY_MAX = 0.2


class ColumnSelectionError(InvalidArgumentError, UserCodeException):
    """``select_columns`` named a column the dataset does not have. Raised while Ray plans the
    dataset (the projection pushdown); also a ``UserCodeException`` so that Ray reports it as
    the caller's error, not as an internal error of Ray Data."""


def _open_ro(path: str) -> Store:
    return Store.open(path, StoreOptions(read_only=True))


def _with_snapshot(path: str, fn: Callable[[Store], T], what: str) -> T:
    """``fn(store)`` on a fresh read-only open of ``path``. If a writer moves the store on
    under the open or the read (StaleSnapshotError: the engine's word for it, also for a WAL
    file retired during the open), reopens and retries up to OPEN_RETRIES times with a short
    backoff, then raises one StaleSnapshotError that says so. Any other error is raised at
    once. Nothing read from a stale snapshot is returned."""
    delay = _RETRY_DELAY
    last: Optional[BaseException] = None
    for attempt in range(OPEN_RETRIES + 1):
        if attempt:
            time.sleep(delay)
            delay = min(2 * delay, _RETRY_DELAY_MAX)
        try:
            with _open_ro(path) as store:
                return fn(store)
        except StaleSnapshotError as e:
            last = e
    raise StaleSnapshotError(f"{what}: store '{path}' changed under each of {OPEN_RETRIES + 1} read-only opens "
                             f"(a writer rewrites it faster than this read completes; retry when it is idle). "
                             f"Last: {last}") from last


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
    lo, hi = check_key_range(key_range, "split_key_range")
    rows_per_task = check_positive_int(rows_per_task, "rows_per_task", "split_key_range")
    mins = np.asarray(ranges["min_key"], dtype=np.uint64)
    maxs = np.asarray(ranges["max_key"], dtype=np.uint64)
    items = np.asarray(ranges["items"], dtype=np.float64)
    # Items of each page inside [lo, hi), assuming keys spread evenly over the page's range.
    span = (maxs - mins).astype(np.float64) + 1.0
    a = np.maximum(mins.astype(np.float64), float(lo))
    b = np.minimum(maxs.astype(np.float64) + 1.0, float(hi) if hi is not None else math.inf)
    inside = np.clip(b - a, 0.0, None) / span * items
    total = float(inside.sum())
    n_tasks = max(1, int(math.ceil(total / rows_per_task)))
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

    store_path: the store directory. features: a list of the features to read (default: all,
    in creation order). key_range: (lo, hi) half-open, hi None for no upper bound.
    rows_per_task: about this many rows per read task (None: split into the ``parallelism``
    Ray asks for). Every argument is checked here, in the driver (InvalidArgumentError).
    """

    def __init__(self, store_path: str, features: Optional[Sequence[str]] = None, key_range: KeyRange = None,
                 rows_per_task: Optional[int] = 1 << 18):
        super().__init__()
        what = "read_store"
        if not isinstance(store_path, (str, os.PathLike)):
            raise InvalidArgumentError(f"{what}: store_path must be a path, got {store_path!r}")
        self._path = os.fspath(store_path)
        self._rows_per_task = None if rows_per_task is None else check_positive_int(rows_per_task, "rows_per_task",
                                                                                   what)
        self._key_range = check_key_range(key_range, what)
        if features is not None:
            features = check_names(features, "features", what)

        def load(store: Store):
            types = store.features()
            wanted = list(types) if features is None else [f for f in dict.fromkeys(features) if f in types]
            return types, {f: store.key_ranges(f) for f in wanted}

        types, ranges = _with_snapshot(self._path, load, f"RecFlashDatasource over '{self._path}'")
        if features is None:
            features = list(types)
        if not features:
            raise InvalidArgumentError(f"RecFlashDatasource over '{self._path}': no features to read")
        for f in features:
            if f == KEY:
                raise InvalidArgumentError(f"'{KEY}' is the key column of store '{self._path}', not a feature")
            if f not in types:
                raise InvalidArgumentError(f"unknown feature '{f}' in store '{self._path}' "
                                           f"(known: {', '.join(list(types)[:8])}{', ...' if len(types) > 8 else ''})")
        self._features = features
        self._types = {f: _arrow_type(types[f]) for f in features}
        self._ranges = {f: ranges[f] for f in features}
        self._projection_map: Optional[Dict[str, str]] = None

    # -- projection pushdown (Ray 2.60: supports_projection_pushdown / apply_projection) -----
    def supports_projection_pushdown(self) -> bool:
        return True

    def apply_projection(self, projection_map: Optional[Dict[str, str]]) -> "RecFlashDatasource":
        """``select_columns`` reaching the read: the names are checked here (Ray calls this in
        the driver while it plans the dataset), a name the dataset lacks is ColumnSelectionError."""
        if projection_map is not None:
            known = [KEY] + self._features
            unknown = [c for c in projection_map if c not in known]
            if unknown:
                raise ColumnSelectionError(f"select_columns: no column(s) {unknown} in the dataset read from store "
                                           f"'{self._path}' (columns: {', '.join(known)})")
        return super().apply_projection(projection_map)

    def _columns(self) -> List[str]:
        """Output columns in order: the projection's, else key + every feature."""
        cols = self._get_data_columns()
        if cols is None:
            return [KEY] + self._features
        return list(cols)

    # -- Datasource API --------------------------------------------------------------------
    def get_name(self) -> str:
        return "RecFlash"

    def schema(self) -> pa.Schema:
        cols = self._columns()
        if not cols:  # select_columns([]) / count(): rows without columns, see _read_range
            return pa.schema([pa.field(_STUB, pa.null())])
        return pa.schema([pa.field(c, pa.uint64() if c == KEY else self._types[c]) for c in cols])

    def _splits(self, parallelism: int) -> List[Tuple[int, Optional[int], int]]:
        # Every feature's keys are rows, whatever the projection: the largest drives the split.
        driver = max(self._features, key=lambda f: float(np.asarray(self._ranges[f]["items"], dtype=np.float64).sum()))
        ranges = self._ranges[driver]
        if self._rows_per_task is not None:
            return split_key_range(ranges, self._rows_per_task, self._key_range)
        total = float(np.asarray(ranges["items"], dtype=np.float64).sum())
        per = max(1, int(math.ceil(total / max(1, parallelism))))
        return split_key_range(ranges, per, self._key_range, max_tasks=max(1, parallelism))

    def num_read_tasks(self) -> int:
        """The number of read tasks ``rows_per_task`` gives."""
        return len(self._splits(1))

    def estimate_inmemory_data_size(self) -> Optional[int]:
        return sum(n for _, _, n in self._splits(1)) * self._row_bytes()

    def _row_bytes(self) -> int:
        # at least 1: Ray reads an estimated size of 0 as an empty dataset
        return max(1, sum(8 if c == KEY else _row_bytes(self._types[c]) for c in self._columns()))

    def get_read_tasks(self, parallelism: int, per_task_row_limit: Optional[int] = None,
                       data_context: Any = None) -> List[ReadTask]:
        columns = self._columns()
        feats = self._features
        schema = self.schema()
        row_bytes = self._row_bytes()
        path = self._path
        tasks = []
        for lo, hi, rows in self._splits(parallelism):
            # num_rows=None: the split's row figure is an estimate (the page item counts of one
            # feature: other features' keys are not in it, stale versions are), and Ray takes a
            # known num_rows as exact (count() would return it without reading). The byte size
            # stays an estimate, which is what Ray uses it as.
            meta = BlockMetadata(num_rows=None, size_bytes=rows * row_bytes, input_files=None, exec_stats=None)
            tasks.append(ReadTask(
                lambda lo=lo, hi=hi: _read_range(path, feats, columns, lo, hi),
                meta, schema=schema, per_task_row_limit=per_task_row_limit))
        return tasks


def _split_reads(feats: List[str], columns: List[str]) -> Tuple[List[str], List[str]]:
    """What a read task of a dataset of ``feats`` scans for the output ``columns``: (the
    features whose values it reads — the selected ones, in column order —, the other features,
    whose keys alone it reads). A projection never changes the rows, which are the union of
    every feature's keys (null where one lacks a key): a dropped feature still contributes its
    keys, through ``Store.scan_keys``, which reads no value."""
    selected = [c for c in columns if c != KEY]
    chosen = set(selected)
    return selected, [f for f in feats if f not in chosen]


def _read_range(path: str, feats: List[str], columns: List[str], lo: int, hi: Optional[int],
                stats: Optional[Dict[str, Any]] = None) -> Iterable[pa.Table]:
    """One read task of a dataset of ``feats``: a read-only open and one scan_many of [lo, hi)
    that reads the values of the features among ``columns`` and only the keys of the others
    (rows_of: Store.scan_keys), so the rows are the union of every feature's keys; the
    projected columns. Retried on a fresh open while a writer moves the store on under it (see
    _with_snapshot). ``stats``, when given, receives the engine's read statistics of the read
    that was returned (Store.last_read_stats: the sum over its scans)."""
    values, keys_only = _split_reads(feats, columns)

    def read(store: Store) -> pa.Table:
        table = store.scan_many(values, key_range=(lo, hi), rows_of=keys_only)
        if stats is not None:
            stats.clear()
            stats.update(store.last_read_stats())
        return table

    table = _with_snapshot(path, read, f"read task [{lo}, {'end' if hi is None else hi})")
    if not columns:
        # An empty projection (count(), select_columns([])) still has the rows: a table without
        # columns would lose its row count in Ray's concatenation, so it carries Ray Data's
        # null placeholder column, as Ray's own readers do.
        return [pa.table({_STUB: pa.nulls(table.num_rows)})]
    return [table.select(columns)]


def read_store(store_path: str, features: Optional[Sequence[str]] = None, *, key_range: KeyRange = None,
               rows_per_task: Optional[int] = 1 << 18, **ray_args: Any) -> "ray.data.Dataset":
    """``ray.data.read_datasource(RecFlashDatasource(...), **ray_args)``: a Dataset of Arrow
    blocks with ``key`` and one column per feature. The arguments are checked here, in the
    driver (InvalidArgumentError naming the argument and its value)."""
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

    def __init__(self, preprocessor: Preprocessor):
        if not isinstance(preprocessor, Preprocessor):
            raise InvalidArgumentError(f"TorchRecCollate needs a recflash.ingest.Preprocessor, got "
                                       f"{type(preprocessor).__name__} {preprocessor!r}")
        super().__init__()
        self.preprocessor = preprocessor
        self._needed = list(preprocessor.features)

    def __call__(self, batch: pa.Table) -> Any:
        # Columns and their types per role (dense / sparse / label), checked before any conversion.
        self.preprocessor.check_schema(batch.schema, "TorchRecCollate")
        return self.preprocessor(batch)


__all__ = ["RecFlashDatasource", "read_store", "TorchRecCollate", "split_key_range", "ColumnSelectionError"]
