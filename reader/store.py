"""Python API of the store. Arrays cross into the C++ engine once per call (numpy / Arrow
buffers, no per-item Python); the engine releases the GIL while it works."""

from __future__ import annotations

import dataclasses
import json
import os
import threading
from typing import Iterable, Optional, Sequence, Tuple, Union

import numpy as np
import pyarrow as pa

from recflash import _native
from recflash.reader.errors import InvalidArgumentError, SchemaError

KeyRange = Optional[Tuple[int, Optional[int]]]  # (lo, hi) half-open; hi None = no upper bound
_MAX_KEY = (1 << 64) - 1  # key_range=None reaches it; a half-open range cannot
#: The files of a store directory by role ("marker", "pages", "wal", ...): reader/csrc/filename.h.
FILE_NAMES: dict = dict(_native.FILE_NAMES)


@dataclasses.dataclass(slots=True)
class StoreOptions:
    """Options of a store. Every knob is documented where it is declared. A misspelled option
    raises (TypeError in the constructor, AttributeError on assignment), never goes unnoticed."""

    #: Logical page size in bytes (a flash page). Fixed when the store is created; reopening
    #: uses the stored value. Power of two in [4096, 1 MiB].
    page_size: int = 16384
    #: DRAM write buffer; a flush runs when buffered items reach it (the READER paper uses
    #: 2.5 % of the dataset).
    write_buffer_bytes: int = 64 << 20
    #: Open the page file with O_DIRECT (bypass the OS page cache).
    direct_io: bool = True
    #: Accounting mode: the same flush/pinner/merger/reclamation decide the same layout, but
    #: no page, WAL or metadata is written and merges find records through the key index;
    #: read costs come from account_scan(). For dataset sizes the disk cannot hold. Needs a
    #: new store directory; nothing survives close().
    accounting: bool = False
    #: Read-only handle: many processes (e.g. Ray read tasks) open the same store at once,
    #: also while one writer has it open. No LOCK is taken, nothing is written (the WAL is
    #: replayed into DRAM, the checkpoint is left in place), writes raise ReadOnlyError.
    #: The handle reads the snapshot of its open; a page a writer rewrote since then raises
    #: StaleSnapshotError (reopen) rather than returning other data.
    read_only: bool = False
    #: Compact pages: int64 values packed frame-of-reference (1, 2 or 4 bytes by each page
    #: segment's value range instead of 8). Off by default so item sizes stay what the
    #: amplification benchmarks assume; `recflash import` turns it on. Only affects what
    #: this handle writes; every reader reads both forms. Ignored in accounting mode.
    compact_pages: bool = False
    #: fsync the WAL on every put/delete. Off: durability points are sync() and flush().
    sync_on_write: bool = False
    #: Bulk-load mode (imports): puts and deletes skip the WAL; sync() and flush() write the
    #: whole buffer into pages and commit the metadata (nothing pinned). A sync stays the
    #: durability point, but each item is written once instead of twice. A crash loses the
    #: puts since the last sync (as with sync_on_write off).
    bulk_load: bool = False
    #: io_uring requests in flight per reader.
    queue_depth: int = 32
    #: Threads that build the pages of a large flush (a bulk load's write buffer is sized,
    #: dictionary-coded and packed on this many threads). 1: the flushing thread only.
    build_threads: int = 2
    #: Largest coalesced read of adjacent pages.
    max_io_bytes: int = 256 << 10
    #: Bytes of page reads a scan keeps in flight (at least one read; 0: up to queue_depth
    #: reads): enough to keep the device streaming, so that decoding overlaps the reads
    #: instead of waiting for a deep queue that completes in one burst. Near the end at most
    #: 3/4 of what is left to read goes out, so the last window, decoded after the device is
    #: done, is small. A scan on several threads (scan_threads) splits it between them.
    read_inflight_bytes: int = 768 << 10
    #: Of that budget, what a scan on one thread keeps in flight (a compacted or small
    #: feature, scan_many, scan_keys, get; 0: all of it). A disk that signals a batch of reads
    #: only when all of it is done (as the one measured here) gives such a scan, whose
    #: decoding is cheap, the next window to read while it decodes the last one. On a device
    #: that completes reads one by one, raise it to read_inflight_bytes.
    single_lane_inflight_bytes: int = 256 << 10
    #: Microseconds a reading thread polls for its completions before sleeping in the kernel
    #: (0: it sleeps at once). A thread woken from that sleep by a completion loses ~20 us on
    #: the virtual machine measured here: with 300, hot passes over the compaction
    #: benchmark's stores took 22 % (compacted) and 14 % (after updates) less time at 50 % and
    #: 36 % more CPU. For latency-bound readers with cores to spare. At most 10,000.
    read_poll_us: int = 0
    #: What the threads of a scan on several lanes (one large fragmented feature,
    #: ``scan_threads``) poll before they sleep, when ``read_poll_us`` is less. Such a scan
    #: already holds a helper core and waits for the device many times: scans of the compaction
    #: benchmark's default store took 5-7 % less time with 300 (read both ways, scan by scan),
    #: at ~10 % more CPU with 100. The poll yields the core every ~10 us, so other runnable
    #: threads are not held off. 0: lane scans sleep at once. At most 10,000.
    lane_read_poll_us: int = 300
    #: Threads that read and place the pages of one large fragmented feature's scan (one
    #: resolved through the key index after updates): the scan's thread plus helpers, each
    #: reading and placing its share of the pages. 1: the scan's thread only (many concurrent
    #: readers, e.g. Ray read tasks, already use the cores).
    scan_threads: int = 2
    #: Freed page slots kept allocated in the page file for the next flushes to overwrite,
    #: in write buffers (beyond it they are returned to the filesystem; close() returns all).
    #: Refilling punched holes costs a fresh allocation each flush and, on discarding or
    #: thinly provisioned disks, a slower first read. 0: punch every freed slot at once.
    free_reserve_buffers: float = 2.0
    #: Verify block-granular embedding-row reads (vector-grained SLS) against crc32c sums of
    #: their 512 B blocks, taken from checksum-verified whole-page reads (4 B of DRAM per
    #: block; a packed page without sums is read whole once). False: such reads are unverified.
    verify_block_reads: bool = True
    #: A WAL record that fails its checksum with later records after it (damage, not the torn
    #: last append of a crash, which just ends replay), a WAL file missing between two others,
    #: an empty one before the last, or the newest files missing (the metadata records the
    #: newest file a session logged to): "tolerate_torn_tail" fails the open with
    #: CorruptionError naming the file (and byte); "point_in_time" opens the store as of the
    #: record (or file) before it, replaying nothing logged after it
    #: (stats()["wal_bytes_dropped"]); a writable point_in_time open deletes the later WAL
    #: files and cuts the damaged one before it logs anything, and records the files it kept
    #: as the newest (a read-only one changes nothing).
    wal_recovery: str = "tolerate_torn_tail"
    #: Rec-aware pinner: keep small per-feature batches in DRAM across flushes.
    pinner_enabled: bool = True
    #: Pinned bytes stay within this fraction of the write buffer.
    pin_budget_frac: float = 0.05
    #: A feature is written (unpinned) once its buffered bytes reach this fraction of a page.
    pin_threshold_frac: float = 0.25
    #: At most this many features pinned at once (the paper's top-n).
    pin_max_features: int = 1024
    #: A feature pinned this many consecutive flushes is written anyway.
    pin_max_flushes: int = 8
    #: Rec-aware merger: re-pack fragmented features after a flush.
    merger_enabled: bool = True
    #: Fragmentation degree (pages holding a feature / ideal pages) that triggers a merge.
    #: Lower reads faster and writes more: the read/write trade-off knob.
    merge_threshold: float = 1.5
    #: The trigger while ``bulk_load`` is on, for features whose records are all current
    #: (what a load appends; the larger of the two applies). A bulk load gives each feature
    #: one partly filled page per flush, so a feature that adds a page or more per flush stays
    #: below 2x; merging it during the load cost its key index in DRAM and a third of the
    #: import's speed, and left its pages overlapping. Features that add less per flush pass
    #: 2x and are merged; features with stale records (updates, ``import --upsert``) are
    #: merged at ``merge_threshold``.
    merge_threshold_bulk_load: float = 2.0
    #: A victim's pages are gathered emptiest first until its degree is back to
    #: 1 + (merge_threshold - 1) * merge_target_frac.
    merge_target_frac: float = 0.5
    #: Pages a victim feature fills at least this fraction of (by capacity) are never gathered
    #: for it (little read benefit for a full page rewrite).
    merge_low_benefit_frac: float = 0.9
    #: Extra pages any feature may hold before it becomes a victim (tiny features would
    #: otherwise be rewritten whole after nearly every flush that touches them).
    merge_min_slack_pages: float = 1.0
    #: How much a page's place in a victim's runs of adjacent pages counts when its pages are
    #: gathered (in pages of payload): pages alone are gathered before pages inside a run, so
    #: merges leave a feature in fewer, longer runs (fewer device reads per scan) at some more
    #: bytes rewritten (compaction benchmark: 28 % fewer device reads at update amplification
    #: 2.77 instead of 2.56). 0: emptiest first only.
    merge_run_weight: float = 1.0
    #: Space reclamation: rewrite the least-utilised pages when pages in use exceed
    #: space_amp_limit x the pages the live data needs, down to space_amp_target.
    reclaim_enabled: bool = True
    space_amp_limit: float = 2.0
    space_amp_target: float = 1.6

    def single_lane_budget(self) -> int:
        """What a scan on one lane keeps in flight, as the engine takes it: the smaller of
        read_inflight_bytes and single_lane_inflight_bytes (either 0: the other; both: 0, no
        budget)."""
        a, b = self.read_inflight_bytes, self.single_lane_inflight_bytes
        return min(a, b) if a and b else a or b

    def _to_native(self) -> dict:
        return dataclasses.asdict(self)


def _check_option_names() -> None:
    """StoreOptions declares exactly the options the engine reads (its list is exported as
    recflash._native.STORE_OPTION_NAMES; the engine refuses any other key)."""
    ours = {f.name for f in dataclasses.fields(StoreOptions)}
    theirs = set(_native.STORE_OPTION_NAMES)
    if ours != theirs:
        raise ImportError(f"recflash.reader.StoreOptions and the engine's options differ: only in Python "
                          f"{sorted(ours - theirs)}, only in the engine {sorted(theirs - ours)} (rebuild with "
                          f"`make build`)")


_check_option_names()


def parse_value_type(type_str: str) -> Tuple[str, int]:
    """(canonical type string, dim) of a value type string — the engine's one parser
    (``fixed_size_list<float32, D>`` has dim D, every other type 0); SchemaError if unknown."""
    return _native.parse_value_type(type_str)


_FIXED_TYPES = {"float32": (np.float32, pa.float32()), "int64": (np.int64, pa.int64())}
_LIST_TYPES = {"list<int64>": (np.int64, pa.int64()), "list<float32>": (np.float32, pa.float32())}


class _Feature:
    """Conversion between user arrays and the engine's byte buffers for one feature type."""

    def __init__(self, name: str, type_str: str):
        self.name = name
        self.type = type_str
        _, self.dim = parse_value_type(type_str)
        self._scan_schema: Optional[pa.Schema] = None

    def scan_schema(self) -> pa.Schema:
        """The schema of scan()'s table, made once: Table.from_arrays with it is cheaper than
        pa.table() inferring it from a dict on every scan."""
        if self._scan_schema is None:
            self._scan_schema = pa.schema([("key", pa.uint64()), ("value", self.arrow_type())])
        return self._scan_schema

    # -- input -------------------------------------------------------------------------
    def encode(self, values, n: int):
        """Returns (values as uint8 ndarray, byte offsets int64 ndarray or None)."""
        t = self.type
        if t in _FIXED_TYPES:
            arr = _to_numpy_1d(values, self)
            np_type = _FIXED_TYPES[t][0]
            if t == "float32" and arr.dtype.kind != "f":
                raise SchemaError(f"feature '{self.name}' is float32; got values of dtype {arr.dtype}")
            if t == "int64" and arr.dtype.kind not in "iu":
                raise SchemaError(f"feature '{self.name}' is int64; got values of dtype {arr.dtype}")
            if t == "int64" and arr.dtype == np.uint64 and arr.size and arr.max() > np.iinfo(np.int64).max:
                raise SchemaError(f"feature '{self.name}' is int64; a uint64 value exceeds the int64 range")
            _check_len(self, len(arr), n)
            return np.ascontiguousarray(arr, dtype=np_type).view(np.uint8), None
        if self.dim:
            if isinstance(values, (pa.Array, pa.ChunkedArray)):
                values = _combine(values)
                if not pa.types.is_fixed_size_list(values.type) or values.type.list_size != self.dim:
                    raise SchemaError(f"feature '{self.name}' is {t}; got an Arrow array of type {values.type}")
                _no_nulls(self, values)
                flat = values.flatten().to_numpy(zero_copy_only=False)
                arr = flat.reshape(len(values), self.dim)
            else:
                arr = np.asarray(values)
            if arr.ndim != 2 or arr.shape[1] != self.dim:
                raise SchemaError(f"feature '{self.name}' is {t}; expected values of shape (n, {self.dim}), "
                                  f"got shape {arr.shape}")
            if arr.dtype.kind != "f":
                raise SchemaError(f"feature '{self.name}' is {t}; got values of dtype {arr.dtype}")
            _check_len(self, arr.shape[0], n)
            return np.ascontiguousarray(arr, dtype=np.float32).reshape(-1).view(np.uint8), None
        if t in _LIST_TYPES:
            np_type, pa_type = _LIST_TYPES[t]
            # Integer lists convert Python input by inference first, so the safe cast below
            # refuses floats instead of pyarrow truncating them (1.5 -> 1) in a typed build.
            arr = _to_arrow(values, pa.list_(pa_type), self, infer=pa.types.is_integer(pa_type))
            if not (pa.types.is_list(arr.type) or pa.types.is_large_list(arr.type)):
                raise SchemaError(f"feature '{self.name}' is {t}; got values of type {arr.type}")
            try:
                arr = arr.cast(pa.list_(pa_type), safe=True)
            except (pa.ArrowInvalid, pa.ArrowNotImplementedError) as e:
                raise SchemaError(f"feature '{self.name}' is {t}; cannot convert values of type {arr.type}: {e}") from None
            _no_nulls(self, arr)
            _check_len(self, len(arr), n)
            offs = np.asarray(arr.offsets, dtype=np.int64)
            offs = (offs - offs[0]) * np.dtype(np_type).itemsize
            flat = arr.flatten().to_numpy(zero_copy_only=False).astype(np_type, copy=False)
            return np.ascontiguousarray(flat).view(np.uint8), offs
        if t == "binary":
            arr = _to_arrow(values, pa.binary(), self)
            if pa.types.is_string(arr.type) or pa.types.is_large_string(arr.type) or pa.types.is_large_binary(arr.type):
                arr = arr.cast(pa.binary())
            if not pa.types.is_binary(arr.type):
                raise SchemaError(f"feature '{self.name}' is binary; got values of type {arr.type}")
            _no_nulls(self, arr)
            _check_len(self, len(arr), n)
            bufs = arr.buffers()
            offs = np.frombuffer(bufs[1], dtype=np.int32)[arr.offset: arr.offset + len(arr) + 1].astype(np.int64)
            data = np.frombuffer(bufs[2], dtype=np.uint8) if bufs[2] is not None else np.zeros(0, np.uint8)
            return data, offs
        raise SchemaError(f"feature '{self.name}' has unsupported type {t}")

    # -- output ------------------------------------------------------------------------
    def decode(self, values: np.ndarray, offsets: Optional[np.ndarray], n: int,
               found: Optional[np.ndarray] = None) -> pa.Array:
        validity = None
        null_count = 0
        if found is not None and n and not found.all():
            mask = found.astype(bool)
            validity = pa.py_buffer(np.packbits(mask, bitorder="little"))
            null_count = int(n - mask.sum())
        t = self.type
        if t in _FIXED_TYPES:
            return pa.Array.from_buffers(_FIXED_TYPES[t][1], n, [validity, pa.py_buffer(values)], null_count)
        if self.dim:
            child = pa.Array.from_buffers(pa.float32(), n * self.dim, [None, pa.py_buffer(values)])
            return pa.Array.from_buffers(pa.list_(pa.float32(), self.dim), n, [validity], null_count, children=[child])
        if t in _LIST_TYPES:
            pa_type = _LIST_TYPES[t][1]
            child = pa.Array.from_buffers(pa_type, int(offsets[-1]) if n else 0, [None, pa.py_buffer(values)])
            return pa.Array.from_buffers(pa.list_(pa_type), n, [validity, pa.py_buffer(offsets)], null_count,
                                         children=[child])
        return pa.Array.from_buffers(pa.binary(), n, [validity, pa.py_buffer(offsets), pa.py_buffer(values)],
                                     null_count)

    def arrow_type(self) -> pa.DataType:
        t = self.type
        if t in _FIXED_TYPES:
            return _FIXED_TYPES[t][1]
        if self.dim:
            return pa.list_(pa.float32(), self.dim)
        if t in _LIST_TYPES:
            return pa.list_(_LIST_TYPES[t][1])
        return pa.binary()


def _combine(values):
    return values.combine_chunks() if isinstance(values, pa.ChunkedArray) else values


def _no_nulls(f: _Feature, arr: pa.Array) -> None:
    if arr.null_count:
        raise SchemaError(f"feature '{f.name}': {arr.null_count} null value(s); nulls cannot be stored "
                          "(use delete() to remove keys)")


def _check_len(f: _Feature, got: int, n: int) -> None:
    if got != n:
        raise InvalidArgumentError(f"feature '{f.name}': {n} keys but {got} values")


def _to_numpy_1d(values, f: _Feature) -> np.ndarray:
    if isinstance(values, (pa.Array, pa.ChunkedArray)):
        values = _combine(values)
        _no_nulls(f, values)
        if not (pa.types.is_integer(values.type) or pa.types.is_floating(values.type)):
            raise SchemaError(f"feature '{f.name}' is {f.type}; got an Arrow array of type {values.type}")
        values = values.to_numpy(zero_copy_only=False)
    arr = np.asarray(values)
    if arr.ndim != 1:
        raise SchemaError(f"feature '{f.name}' is {f.type}; expected a 1-D array, got shape {arr.shape}")
    return arr


def _to_arrow(values, default_type: pa.DataType, f: _Feature, infer: bool = False) -> pa.Array:
    """Arrow array of `values`; Python input is built as `default_type`, or with `infer` as
    the type its values have (the caller's safe cast then checks them)."""
    if isinstance(values, (pa.Array, pa.ChunkedArray)):
        return _combine(values)
    src = list(values) if isinstance(values, np.ndarray) else values
    if infer:
        try:
            arr = pa.array(src)
        except (pa.ArrowInvalid, pa.ArrowTypeError, TypeError, OverflowError):
            arr = None  # mixed input: the typed build below reports it
        if arr is not None and not pa.types.is_null(arr.type):  # all None: typed below
            t = arr.type.value_type if pa.types.is_list(arr.type) or pa.types.is_large_list(arr.type) else arr.type
            # numbers only: a cast would parse strings ('1' -> 1) and take booleans as 0 / 1
            if not (pa.types.is_integer(t) or pa.types.is_floating(t) or pa.types.is_null(t)):
                raise SchemaError(f"feature '{f.name}' is {f.type}; got values of type {arr.type}")
            return arr
    try:
        return pa.array(src, type=default_type)
    except (pa.ArrowInvalid, pa.ArrowTypeError, TypeError, OverflowError) as e:
        raise SchemaError(f"feature '{f.name}' is {f.type}; cannot convert values: {e}") from None


def dense_page_rows_arg(value, where: str) -> int:
    """A gather's dense_page_rows (Store.gather_rows, SlsEngine): an int >= 0, not a bool."""
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or not 0 <= value < 2 ** 32:
        raise InvalidArgumentError(f"{where}: dense_page_rows must be an int >= 0 (0: off), got {value!r}")
    return int(value)


def _keys(keys, what: str) -> np.ndarray:
    if isinstance(keys, (pa.Array, pa.ChunkedArray)):
        if keys.null_count:
            raise InvalidArgumentError(f"{what}: keys hold {keys.null_count} null(s)")
        keys = keys.to_numpy(zero_copy_only=False)
    elif isinstance(keys, (list, tuple)) and keys and all(
            isinstance(k, (int, np.integer)) and not isinstance(k, (bool, np.bool_)) for k in keys):
        # Python ints above 2**63 - 1 make numpy infer float64 (rounding them): take them as
        # uint64, or name the one that is not a key.
        try:
            keys = np.array(keys, dtype=np.uint64)
        except OverflowError:
            bad = next(k for k in keys if not 0 <= k < 2**64)
            raise InvalidArgumentError(f"{what}: keys must be in [0, 2**64), got {bad}") from None
    arr = np.asarray(keys)
    if arr.ndim != 1:
        raise InvalidArgumentError(f"{what}: keys must be a 1-D array, got shape {arr.shape}")
    if arr.size == 0:
        return np.zeros(0, dtype=np.uint64)
    if arr.dtype.kind == "i":
        if arr.min() < 0:
            raise InvalidArgumentError(f"{what}: keys must be non-negative (uint64), got {int(arr.min())}")
    elif arr.dtype.kind != "u":
        raise InvalidArgumentError(f"{what}: keys must be integers (uint64), got dtype {arr.dtype}")
    return np.ascontiguousarray(arr, dtype=np.uint64)


_UINT64 = pa.uint64()


def _key_range(key_range: KeyRange) -> Tuple[int, int]:
    """(lo, hi) for the engine, which reads hi == 2**64 - 1 as "no upper bound". A user range
    ending at 2**64 - 1 excludes that key (half-open): see _drop_max."""
    if key_range is None:
        return 0, _MAX_KEY
    try:
        lo, hi = key_range
        lo, hi = int(lo), (_MAX_KEY if hi is None else int(hi))
    except (TypeError, ValueError):
        raise InvalidArgumentError(f"key_range must be a (lo, hi) pair of integers, got {key_range!r}") from None
    if lo < 0 or hi < lo or hi > _MAX_KEY:
        raise InvalidArgumentError(f"key_range ({lo}, {hi}) must satisfy 0 <= lo <= hi <= 2**64 - 1")
    return lo, hi


def _range_size(lo: int, key_range: KeyRange) -> int:
    """How many keys the user's range admits: [lo, hi), or [lo, 2**64) without an upper bound."""
    if key_range is None or key_range[1] is None:
        return (1 << 64) - lo
    return int(key_range[1]) - lo


def _ends_at_max(key_range: KeyRange) -> bool:
    return key_range is not None and key_range[1] is not None and int(key_range[1]) == _MAX_KEY


def _drop_max_key(keys: np.ndarray, key_range: KeyRange) -> np.ndarray:
    """_drop_max for a key array alone (scan_keys)."""
    if _ends_at_max(key_range) and len(keys) and keys[-1] == np.uint64(_MAX_KEY):
        return keys[:-1]
    return keys


#: The engine's read statistics, in the order its calls return them (a tuple per read:
#: the dict is made only when last_read_stats() asks).
_READ_STATS = ("pages_read", "read_requests", "bytes_read", "useful_bytes", "items", "seconds", "io_wait_seconds",
               "encoded_bytes", "peak_inflight_bytes")


def _sum_stats(stats) -> tuple:
    """The read statistics of several engine reads as one read's (the peak in flight: the
    largest)."""
    if len(stats) == 1:
        return stats[0]
    cols = list(zip(*stats))
    return tuple(max(x) if name == "peak_inflight_bytes" else sum(x) for name, x in zip(_READ_STATS, cols))


def _read_stats(raw) -> dict:
    """An engine read's statistics (a tuple in _READ_STATS order) as a dict, with the read
    amplifications."""
    out = dict(zip(_READ_STATS, raw))
    out["read_amplification"] = out["bytes_read"] / out["useful_bytes"] if out["useful_bytes"] else 0.0
    out["read_amplification_encoded"] = out["bytes_read"] / out["encoded_bytes"] if out["encoded_bytes"] > 0 else 0.0
    return out


def _drop_max(cols, key_range: KeyRange):
    """Half-open user ranges ending at 2**64 - 1 exclude that key; the engine included it."""
    if not _ends_at_max(key_range):
        return cols
    out = []
    for keys, values, offsets, found in cols:
        if len(keys) and keys[-1] == np.uint64(_MAX_KEY):
            n = len(keys) - 1
            keys = keys[:n]
            if offsets is None:
                values = values[: len(values) // (n + 1) * n]
            else:
                offsets = offsets[: n + 1]
        out.append((keys, values, offsets, found))
    return out


def _np_array(values: np.ndarray, type_: pa.DataType, valid: Optional[np.ndarray] = None) -> pa.Array:
    """A zero-copy Arrow array over a 1-D numpy array of fixed-width type_ (nulls where
    `valid` is False). Unlike pa.array(), never imports pandas (0.5 s on a first call)."""
    values = np.ascontiguousarray(values)
    validity, nulls = None, 0
    if valid is not None and len(valid) and not valid.all():
        validity = pa.py_buffer(np.packbits(valid, bitorder="little"))
        nulls = int(len(valid) - np.count_nonzero(valid))
    return pa.Array.from_buffers(type_, len(values), [validity, pa.py_buffer(values)], null_count=nulls)


def _outer_join(names, keys, arrays, more_keys=()) -> pa.Table:
    """Outer join of per-feature (sorted unique keys, values) on key, null where a feature
    lacks a key (_native.join_keys: the key union and each feature's rows, O(rows) for
    row-number-like keys). `more_keys`: sorted unique key arrays whose keys join the rows
    without a column."""
    all_keys, rows = _native.join_keys([np.ascontiguousarray(k, dtype=np.uint64) for k in list(keys) + list(more_keys)])
    n = len(all_keys)
    out = {"key": _np_array(all_keys, pa.uint64())}
    for name, arr, pos in zip(names, arrays, rows):
        out[name] = arr if pos is None else _spread(arr, pos, n)
    return pa.table(out)


def _spread(arr: pa.Array, pos: np.ndarray, n: int) -> pa.Array:
    """An array of length n with arr's values at rows pos (ascending) and nulls elsewhere."""
    t = arr.type
    if (pa.types.is_int64(t) or pa.types.is_float32(t)) and arr.null_count == 0:
        w = t.bit_width // 8
        values = np.frombuffer(arr.buffers()[1], dtype=np.uint8, count=len(arr) * w, offset=arr.offset * w)
        validity, vals = _native.spread_fixed(values, w, pos, n)
        return pa.Array.from_buffers(t, n, [pa.py_buffer(validity), pa.py_buffer(vals)], null_count=n - len(pos))
    mask = np.zeros(n, dtype=bool)
    mask[pos] = True
    idx = np.zeros(n, dtype=np.int64)
    idx[pos] = np.arange(len(pos), dtype=np.int64)
    return arr.take(_np_array(idx, pa.int64(), valid=mask))


class Store:
    """A READER store in a directory. Create or reopen with :meth:`Store.open`."""

    def __init__(self, native, path: str):
        self._s = native
        self.path = path
        self._features: dict[str, _Feature] = {}
        self._tls = threading.local()

    @classmethod
    def open(cls, path: Union[str, os.PathLike], options: Optional[StoreOptions] = None, *,
             read_only: Optional[bool] = None) -> "Store":
        """Creates or reopens the store at `path`. read_only=True (or options.read_only) opens
        an existing store for reading alongside other readers and one writer."""
        options = options or StoreOptions()
        if read_only is not None:
            options = dataclasses.replace(options, read_only=bool(read_only))
        path = os.fspath(path)
        return cls(_native.Store.open(path, options._to_native()), path)

    @property
    def read_only(self) -> bool:
        return bool(self._s.read_only)

    # -- features ----------------------------------------------------------------------
    def create_feature(self, name: str, type: str) -> None:
        """Creates a feature (no-op if it exists with the same type)."""
        _, type_str, _ = self._s.create_feature(name, type)
        self._features[name] = _Feature(name, type_str)

    def features(self) -> dict:
        """Feature names and their type strings, in creation order."""
        return {name: t for name, t in self._s.features()}

    def _feature(self, name: str) -> _Feature:
        f = self._features.get(name)
        if f is None:
            _, type_str, _ = self._s.lookup(name)  # raises UnknownFeatureError
            f = self._features[name] = _Feature(name, type_str)
        return f

    # -- writes ------------------------------------------------------------------------
    def put(self, feature: str, keys, values) -> None:
        """Upserts items. The last occurrence of a key within one call wins."""
        f = self._feature(feature)
        k = _keys(keys, f"put('{feature}')")
        data, offsets = f.encode(values, len(k))
        self._s.put(feature, k, data, offsets)

    def delete(self, feature: str, keys) -> None:
        self._feature(feature)
        self._s.delete(feature, _keys(keys, f"delete('{feature}')"))

    def flush(self) -> None:
        """Writes the buffer to pages (the pinner keeps small batches back); merger and
        reclamation run here. Also a durability point."""
        self._s.flush(False)

    def compact(self, features: Optional[Sequence[str]] = None) -> None:
        """Full merge: rewrites the named features (all when None) into packed pages in key
        order, the read-optimal layout. Like RocksDB's CompactRange, for before a training
        epoch; the merger after each flush does the incremental version on its own."""
        names = [features] if isinstance(features, str) else list(features or [])
        for n in names:
            self._feature(n)
        self._s.compact(names)

    def sync(self) -> None:
        """Durability point: every put/delete issued before it survives a crash."""
        self._s.sync()

    # -- reads -------------------------------------------------------------------------
    def scan(self, feature: str, key_range: KeyRange = None) -> pa.Table:
        """All items of a feature (optionally lo <= key < hi), keys ascending."""
        f = self._feature(feature)
        lo, hi = _key_range(key_range)
        # The table is made in the binding over the engine's buffers (reader/csrc/arrow_bindings.h).
        tab, st = self._s.scan_table(feature, lo, hi, _ends_at_max(key_range), f.scan_schema())
        self._tls.stats = st
        return tab

    def scan_many(self, features: Sequence[str], key_range: KeyRange = None, *,
                  rows_of: Sequence[str] = ()) -> pa.Table:
        """Several features at once, outer-joined on key (null where a feature lacks a key).
        A page holding several of the requested features is read once.

        rows_of: more features whose keys join the rows but which get no column; they are
        read with :meth:`scan_keys` (no value is read or decoded), so
        ``scan_many(a, rows_of=b)`` has exactly the rows of ``scan_many(a + b)`` and the
        columns ``key`` + ``a``. ``features`` may then be empty (a table of keys alone).
        ``last_read_stats()`` then sums all the reads of the call. Once one feature holds every
        key of ``key_range`` (a label column over row-numbered keys), the rows are the whole
        range and the remaining ``rows_of`` features are not read. The features of ``rows_of``
        are separate engine reads: on a read-only handle they all see the snapshot of its open;
        on a writable handle, writes another thread makes between them can show up in some
        and not others (as between two separate scans)."""
        features = list(features)
        rows_of = [rows_of] if isinstance(rows_of, str) else list(rows_of)
        if not features and not rows_of:
            raise InvalidArgumentError("scan_many needs at least one feature")
        for n in rows_of:
            if not isinstance(n, str):
                raise InvalidArgumentError(f"scan_many: rows_of must list feature names, got {n!r}")
        names = features + rows_of
        if len(set(names)) != len(names):
            where = f"{features}" if not rows_of else f"{features} and rows_of {rows_of}"
            raise InvalidArgumentError(f"scan_many: duplicate feature names in {where}")
        fs = [self._feature(n) for n in features]
        for n in rows_of:
            self._feature(n)
        lo, hi = _key_range(key_range)
        stats, cols = [], []
        if features:
            cols, st = self._s.scan_many(features, lo, hi)
            stats.append(st)
            cols = _drop_max(cols, key_range)
        # A feature that holds every key of the range (a label column, row numbers as keys)
        # already makes the rows the whole range: no other feature can add one, so the
        # remaining rows_of features are not read.
        span = _range_size(lo, key_range)
        covered = any(len(c[0]) == span for c in cols)
        more = []
        for n in rows_of:
            if covered:
                break
            keys, st = self._s.scan_keys(n, lo, hi)
            stats.append(st)
            keys = _drop_max_key(keys, key_range)
            covered = len(keys) == span
            more.append(keys)
        self._tls.stats = _sum_stats(stats)
        arrays = [f.decode(values, offsets, len(keys)) for f, (keys, values, offsets, _) in zip(fs, cols)]
        return _outer_join(features, [c[0] for c in cols], arrays, more)

    def scan_keys(self, feature: str, key_range: KeyRange = None) -> np.ndarray:
        """The keys of a feature's live items (optionally lo <= key < hi), ascending, as a
        uint64 numpy array: exactly the ``key`` column of ``scan(feature, key_range)``,
        buffered (unflushed) writes and deletes included, without reading any value.

        The engine takes them from the page table where a page's keys are a dense run (a
        tombstone-free segment whose record count equals its key span: row-number keys of a
        bulk load), else from the key index when it describes this handle's snapshot with no
        page read (a writer's; a read-only handle's after :meth:`build_key_index`, or taken
        from a ``CHECKPOINT`` of its snapshot, i.e. after the writer's clean close), else it
        reads the remaining pages and decodes their keys only. ``last_read_stats()`` counts
        the pages it read (``bytes_read`` 0 when none was)."""
        self._feature(feature)
        lo, hi = _key_range(key_range)
        keys, st = self._s.scan_keys(feature, lo, hi)
        self._tls.stats = st
        return _drop_max_key(keys, key_range)

    def get(self, feature: str, keys) -> pa.Array:
        """Point lookups: values aligned with keys, null where absent."""
        f = self._feature(feature)
        k = _keys(keys, f"get('{feature}')")
        (rkeys, values, offsets, found), st = self._s.get(feature, k)
        self._tls.stats = st
        return f.decode(values, offsets, len(k), found=found)

    def key_ranges(self, feature: str) -> dict:
        """Per-page key ranges of a feature in this handle's snapshot, ascending by min_key:
        {"min_key": uint64[], "max_key": uint64[], "items": uint64[], "page": uint32[]} (ranges
        overlap where updated keys have older versions not merged yet; items counts records per
        page; page is the logical page id, the page's slot in pages.dat, at page id x page_size).
        Buffered (unflushed) items are not included. Split points for parallel scans; the pages
        are the ones a full scan reads (benchmarks replay them to time the device alone)."""
        self._feature(feature)
        lo, hi, n, page = self._s.key_ranges(feature)
        return {"min_key": lo, "max_key": hi, "items": n, "page": page}

    def account_scan(self, feature: str) -> dict:
        """What a full scan of `feature` would read, from the metadata alone (no I/O):
        pages_read, bytes_read, useful_bytes, encoded_bytes, items. Works in both modes."""
        self._feature(feature)
        return _read_stats(self._s.account_scan(feature))

    def last_read_stats(self) -> dict:
        """pages_read, bytes_read, useful_bytes, items, seconds, read_amplification of this
        thread's last scan / scan_many / scan_keys / get."""
        self._s.check_open()  # raises StoreClosedError after close()
        raw = getattr(self._tls, "stats", None)
        return _read_stats(raw) if raw else {}

    # -- embedding rows ----------------------------------------------------------------
    def gather_rows(self, feature: str, ids, vector_grained: bool = True,
                    dense_page_rows: int = 0) -> Tuple[np.ndarray, dict]:
        """Rows of an embedding table (a ``fixed_size_list<float32, D>`` feature) for ``ids``
        (ascending, unique) as a float32 array [len(ids), D], and the gather's statistics
        (rows, buffer_rows, vector_rows, page_rows, device_reads, device_bytes, ...).
        vector_grained: a row in a packed page is read as just the device blocks holding it
        (verified against block checksums); otherwise rows are read with their whole page.
        dense_page_rows (with vector_grained; 0: off): a page from which this call needs at
        least that many rows is read whole instead, in runs with adjacent ones."""
        where = f"gather_rows('{feature}')"
        return self._s.gather_rows(feature, _keys(ids, where), bool(vector_grained), dense_page_rows_arg(dense_page_rows, where))

    def verify_rows(self, feature: str) -> int:
        """Reads the packed pages of an embedding table whose block checksums are not held
        yet (whole pages, page checksums verified) and takes their block checksums. Returns
        the pages read."""
        return int(self._s.verify_rows(feature))

    def build_key_index(self, read_pages: bool = True) -> bool:
        """Makes this handle's item counts exact (``stats()["items_exact"]``); returns whether
        they are. A read-only handle's open reads no page, so until then it counts every record
        of its pages as valid (upper bounds after updates not merged away). This takes the key
        index from ``CHECKPOINT`` when it matches the snapshot (a writer's clean close), else,
        with ``read_pages``, by reading every live page. A writer's counts are always exact."""
        self._s.check_open()
        self._s.build_key_index(bool(read_pages))
        return bool(self.stats().get("items_exact"))

    @property
    def native_handle(self):
        """The engine's store object (``recflash._native.Store``), for engines bound into the
        same native module (``recflash.ndp``'s SLS engine takes it). Not a user API: its
        methods take raw buffers and skip this class's checks."""
        return self._s

    # -- status ------------------------------------------------------------------------
    def stats(self) -> dict:
        return json.loads(self._s.stats_json())

    @property
    def page_size(self) -> int:
        return self._s.page_size

    def close(self) -> None:
        """Writes everything (pinned items too), syncs, and releases the store."""
        self._s.close()

    def __enter__(self) -> "Store":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"Store({self.path!r})"
