"""SparseLengthsSum next to the store: only pooled vectors come back.

``SlsEngine.sls`` takes one request per table; the C++ engine sorts and de-duplicates each
request's row ids, gathers every unique row once (computed addresses, 512-byte
"vector-grained" reads by default, or whole pages with ``vector_grained=False``) and pools the
bags — the embedding-bag semantics of ``torch.nn.EmbeddingBag`` (sum, mean, per-sample
weights, empty bags give zeros).
"""

from __future__ import annotations

import dataclasses
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
    def __init__(self, tables: EmbeddingStore, vector_grained: bool = True):
        self.tables = tables
        self.vector_grained = vector_grained
        self.last_stats: dict = {}

    def sls(self, requests: Sequence[Union[SlsRequest, tuple]]) -> List:
        """Pooled [B, dim] float32 per request (torch tensors when the indices are)."""
        native = []
        as_torch = []
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
        outs, stats = self.tables.store._s.sls(native, self.vector_grained)
        self.last_stats = stats
        if any(as_torch):
            import torch

            return [torch.from_numpy(o) if t else o for o, t in zip(outs, as_torch)]
        return list(outs)
