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

from recflash.ndp.embedding import EmbeddingStore, _as_numpy
from recflash.reader.errors import InvalidArgumentError


@dataclasses.dataclass
class SlsRequest:
    table: str
    indices: object                      # 1-D ints (numpy or torch)
    offsets: object                      # bag starts, as torch.nn.EmbeddingBag takes them
    mode: str = "sum"                    # "sum" | "mean"
    per_sample_weights: Optional[object] = None
    include_last_offset: bool = False    # offsets has B + 1 entries, the last = len(indices)


class SlsEngine:
    """Pooled embedding lookups over the tables of an :class:`EmbeddingStore`.

    Caches (all off by default; each has a byte budget and hit/miss counters, see
    :meth:`cache_stats`):

    - ``row_cache_bytes``: host-side LRU row cache;
    - ``hot_rows_bytes``: static hot-row partition, filled by :meth:`profile` from a trace;
    - ``pooled_cache_bytes`` / ``pooled_min_bag``: pooled-embedding cache keyed by an
      order-invariant hash of a bag's ids, for bags of at least ``pooled_min_bag`` ids;
    - ``device_cache_bytes``: store-side direct-mapped row cache.

    ``EmbeddingStore.update_rows`` keeps every engine built on it coherent.
    """

    def __init__(self, tables: EmbeddingStore, vector_grained: bool = True, row_cache_bytes: int = 0,
                 hot_rows_bytes: int = 0, pooled_cache_bytes: int = 0, pooled_min_bag: int = 8,
                 device_cache_bytes: int = 0):
        from recflash import _native

        self.tables = tables
        self.vector_grained = vector_grained
        self._engine = _native.SlsEngine(tables.store.native_handle, dict(
            vector_grained=vector_grained, row_cache_bytes=int(row_cache_bytes),
            hot_rows_bytes=int(hot_rows_bytes), pooled_cache_bytes=int(pooled_cache_bytes),
            pooled_min_bag=int(pooled_min_bag), device_cache_bytes=int(device_cache_bytes),
            expected_tables=max(1, len(tables.tables()))))
        tables._register_engine(self)
        self.last_stats: dict = {}

    def _native_requests(self, requests):
        native, as_torch = [], []
        for req in requests:
            if not isinstance(req, SlsRequest):
                req = SlsRequest(*req)
            info = self.tables.info(req.table)
            idx = _as_numpy(req.indices, np.int64).reshape(-1)
            off = _as_numpy(req.offsets, np.int64).reshape(-1)
            if req.mode not in ("sum", "mean"):
                raise InvalidArgumentError(f"sls on table '{req.table}': mode must be 'sum' or 'mean', got {req.mode!r}")
            if req.per_sample_weights is not None and req.mode != "sum":
                raise InvalidArgumentError(f"sls on table '{req.table}': per_sample_weights need mode 'sum'")
            if not req.include_last_offset:
                off = np.append(off, idx.size)  # B bag starts; the last bag runs to the end
            if idx.size and (idx.min() < 0 or idx.max() >= info.num_rows):
                bad = int(idx[(idx < 0) | (idx >= info.num_rows)][0])
                raise InvalidArgumentError(f"sls: row id {bad} out of range for table '{req.table}' "
                                           f"with {info.num_rows} rows")
            w = None if req.per_sample_weights is None else _as_numpy(req.per_sample_weights, np.float32).reshape(-1)
            native.append((EmbeddingStore.feature_name(req.table), idx, off, w, req.mode == "mean"))
            as_torch.append(hasattr(req.indices, "detach"))
        return native, as_torch

    def sls(self, requests: Sequence[Union[SlsRequest, tuple]]) -> List:
        """Pooled [B, dim] float32 per request (torch tensors when the indices are)."""
        native, as_torch = self._native_requests(requests)
        outs, stats = self._engine.run(native)
        self.last_stats = stats
        if any(as_torch):
            import torch

            return [torch.from_numpy(o) if t else o for o, t in zip(outs, as_torch)]
        return list(outs)

    def profile(self, requests: Sequence[Union[SlsRequest, tuple]]) -> None:
        """Chooses the static hot rows (most frequent in `requests`) within hot_rows_bytes."""
        native, _ = self._native_requests(requests)
        self._engine.profile(native)

    def cache_stats(self) -> dict:
        return json.loads(self._engine.cache_stats())

    def _invalidate(self, table: str, ids: np.ndarray) -> None:
        self._engine.invalidate(EmbeddingStore.feature_name(table), ids.astype(np.uint64))
