"""SparseLengthsSum next to the store: only pooled vectors come back.

``SlsEngine.sls`` takes one request per table; the C++ engine sorts and de-duplicates each
request's row ids, gathers every unique row once (computed addresses, 512-byte
"vector-grained" reads by default, or whole pages with ``vector_grained=False``) and pools the
bags — the embedding-bag semantics of ``torch.nn.EmbeddingBag`` (sum, mean, per-sample
weights, empty bags give zeros).
"""

from __future__ import annotations

import dataclasses
import json
from typing import List, Optional, Sequence, Union

import numpy as np

from recflash.ndp.embedding import EmbeddingStore, _as_numpy, as_ids, check_range, table_errors
from recflash.ndp.row_format import ROW_FORMATS
from recflash.reader.errors import InvalidArgumentError
from recflash.reader.store import dense_page_rows_arg


@dataclasses.dataclass
class SlsRequest:
    table: str
    indices: object                      # 1-D ints (numpy or torch)
    offsets: object                      # bag starts, as torch.nn.EmbeddingBag takes them
    mode: str = "sum"                    # "sum" | "mean"
    per_sample_weights: Optional[object] = None
    include_last_offset: bool = False    # offsets has B + 1 entries, the last = len(indices)


def _check_offsets(off: np.ndarray, n: int, include_last: bool, where: str) -> None:
    """Bag starts (or B + 1 bounds with include_last) over `n` indices, in the words of the
    problem: a start past the indices, a decrease, a last bound that is not n."""
    if include_last and off.size == 0:
        raise InvalidArgumentError(f"{where}: offsets must have B + 1 entries with include_last_offset, got none")
    if off.size == 0:
        return
    if off[0] != 0:
        raise InvalidArgumentError(f"{where}: offsets must start at 0, got {int(off[0])}")
    past = np.flatnonzero(off > n)
    if past.size:
        b = int(past[0])
        raise InvalidArgumentError(f"{where}: offset {int(off[b])} (bag {b}) is past the end of the {n} indices")
    dec = np.flatnonzero(np.diff(off.astype(np.int64)) < 0)
    if dec.size:
        b = int(dec[0])
        raise InvalidArgumentError(f"{where}: offsets decrease at bag {b} ({int(off[b])} then {int(off[b + 1])})")
    if include_last and int(off[-1]) != n:
        raise InvalidArgumentError(f"{where}: the last offset is {int(off[-1])} but there are {n} indices "
                                   f"(include_last_offset)")


# A page from which one call needs this many rows is read whole (SlsEngine's dense_page_rows):
# measured on RM2-shaped tables (rows of 256 B, 64 per 16 KiB page), batch 64, uniform ids —
# see the README's SLS figures.
DENSE_PAGE_ROWS = 2


class SlsEngine:
    """Pooled embedding lookups over the tables of an :class:`EmbeddingStore`.

    Caches (all off by default; each has a byte budget and hit/miss counters, see
    :meth:`cache_stats`):

    - ``row_cache_bytes``: host-side row cache, a segmented LRU (a row hit twice outlives rows seen once);
    - ``hot_rows_bytes``: static hot-row partition. Filled once, automatically, from the ids of
      the first ``hot_rows_profile_ids`` looked-up ids (default 100 000; the lookup that reaches
      the count also reads the chosen rows), or by :meth:`profile` from a representative trace
      (which replaces the automatic profile; ``hot_rows_profile_ids=0``: only profile() fills
      it). Updated rows stay coherent; the set of hot rows does not change afterwards;
    - ``pooled_cache_bytes`` / ``pooled_min_bag``: pooled-embedding cache keyed by an
      order-invariant hash of a bag's ids, for bags of at least ``pooled_min_bag`` ids;
    - ``device_cache_bytes``: store-side direct-mapped row cache.

    Reads: ``vector_grained`` (default) reads a row as the 512-byte device blocks holding it;
    ``False`` reads whole pages. ``dense_page_rows`` (default :data:`DENSE_PAGE_ROWS`; 0: off)
    refines the block reads: a packed page from which one call needs that many rows or more is
    read whole, with the call's other such pages in runs of adjacent pages (one device request
    each, page checksums verified). A batch that touches most pages of a table (large batches,
    long bags, small tables) then reads at the device's sequential bandwidth instead of its
    random-read IOPS; sparse batches keep their 512-byte reads.

    ``EmbeddingStore.update_rows`` keeps every engine built on it coherent.
    """

    def __init__(self, tables: EmbeddingStore, vector_grained: bool = True, row_cache_bytes: int = 0,
                 hot_rows_bytes: int = 0, pooled_cache_bytes: int = 0, pooled_min_bag: int = 8,
                 device_cache_bytes: int = 0, hot_rows_profile_ids: int = 100_000,
                 dense_page_rows: Optional[int] = None):
        from recflash import _native

        self.tables = tables
        self.vector_grained = vector_grained
        self.dense_page_rows = dense_page_rows_arg(DENSE_PAGE_ROWS if dense_page_rows is None else dense_page_rows,
                                                   "SlsEngine")
        self._engine = _native.SlsEngine(tables.store.native_handle, dict(
            vector_grained=vector_grained, dense_page_rows=self.dense_page_rows, row_cache_bytes=int(row_cache_bytes),
            hot_rows_bytes=int(hot_rows_bytes), pooled_cache_bytes=int(pooled_cache_bytes),
            pooled_min_bag=int(pooled_min_bag), device_cache_bytes=int(device_cache_bytes),
            hot_rows_profile_ids=int(hot_rows_profile_ids), expected_tables=max(1, len(tables.tables()))))
        tables._register_engine(self)
        self.last_stats: dict = {}

    def _native_requests(self, requests):
        native, as_torch = [], []
        for req in requests:
            if not isinstance(req, SlsRequest):
                req = SlsRequest(*req)
            info = self.tables.info(req.table)
            where = f"sls on table '{req.table}'"
            idx = as_ids(req.indices, f"{where}: indices")
            off = as_ids(req.offsets, f"{where}: offsets")
            if req.mode not in ("sum", "mean"):
                raise InvalidArgumentError(f"{where}: mode must be 'sum' or 'mean', got {req.mode!r}")
            if req.per_sample_weights is not None and req.mode != "sum":
                raise InvalidArgumentError(f"{where}: per_sample_weights need mode 'sum'")
            _check_offsets(off, idx.size, req.include_last_offset, where)
            off = np.ascontiguousarray(off, dtype=np.int64)
            if not req.include_last_offset:
                off = np.append(off, idx.size)  # B bag starts; the last bag runs to the end
            idx = check_range(idx, req.table, info.num_rows, "sls: ")
            w = None
            if req.per_sample_weights is not None:
                w = _as_numpy(req.per_sample_weights, np.float32).reshape(-1)
                if w.size != idx.size:
                    raise InvalidArgumentError(f"{where}: per_sample_weights has {w.size} entries for "
                                               f"{idx.size} indices")
            if info.dtype == "float32":
                native.append((EmbeddingStore.feature_name(req.table), idx, off, w, req.mode == "mean"))
            else:  # the engine decodes float16 / int8 rows as it pools them
                native.append((EmbeddingStore.feature_name(req.table), idx, off, w, req.mode == "mean",
                               ROW_FORMATS[info.dtype], info.dim))
            as_torch.append(hasattr(req.indices, "detach"))
        return native, as_torch

    def sls(self, requests: Sequence[Union[SlsRequest, tuple]]) -> List:
        """Pooled [B, dim] float32 per request (torch tensors when the indices are)."""
        native, as_torch = self._native_requests(requests)
        with table_errors():
            outs, stats = self._engine.run(native)
        self.last_stats = stats
        if any(as_torch):
            import torch

            return [torch.from_numpy(o) if t else o for o, t in zip(outs, as_torch)]
        return list(outs)

    def profile(self, requests: Sequence[Union[SlsRequest, tuple]]) -> None:
        """Chooses the static hot rows (most frequent in `requests`) within hot_rows_bytes; from
        then on the automatic profile (hot_rows_profile_ids) is off."""
        native, _ = self._native_requests(requests)
        with table_errors():
            self._engine.profile(native)

    def cache_stats(self) -> dict:
        return json.loads(self._engine.cache_stats())

    def _invalidate(self, table: str, ids: np.ndarray) -> None:
        with table_errors():
            self._engine.invalidate(EmbeddingStore.feature_name(table), ids.astype(np.uint64))
