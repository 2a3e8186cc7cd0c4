"""The compute kernel of SSD-offloaded tables: one SLS engine call per group per batch.

TorchRec groups a rank's tables by compute kernel; the group whose plan says
``CUSTOMIZED_KERNEL`` gets an :class:`SsdEmbeddingBag` instead of a TBE. Its ``forward`` takes
the group's KeyedJaggedTensor, builds one ``SlsRequest`` per feature (a table can serve several
features) and sends them all in one ``backend.sls`` call, so every table of the group shares one
io_uring pass; the pooled ``[B, dim]`` results are concatenated in feature order, the layout
TorchRec's TBE kernels return (``[B, sum of dims]``).

The kernel owns no weights: rows live in the store. Its ``state_dict`` is empty; the sharded
module routes checkpoint rows to the store (see ``sharding.py``).
"""

from __future__ import annotations

from typing import Iterator, List, Optional, Tuple

import torch
from torchrec.distributed.embedding_kernel import BaseEmbedding
from torchrec.distributed.embedding_types import GroupedEmbeddingConfig
from torchrec.modules.embedding_configs import PoolingType
from torchrec.sparse.jagged_tensor import KeyedJaggedTensor

from recflash.ndp import SlsRequest
from recflash.reader.errors import InvalidArgumentError, SchemaError, UnknownFeatureError


def check_table_matches(backend, name: str, num_rows: int, dim: int, where: str) -> None:
    """The store's table `name` must have the model's shape; the message names the table."""
    try:
        info = backend.info(name)
    except UnknownFeatureError:
        have = sorted(backend.tables())
        raise UnknownFeatureError(
            f"{where}: table '{name}' is planned on SSD but the store has no such table "
            f"(it has: {', '.join(have) or 'no tables'}); export it with "
            f"recflash.torchrec_ext.export_tables first") from None
    if info.dim != dim:
        raise SchemaError(f"{where}: table '{name}' has dim {dim} in the model but {info.dim} in the store")
    if info.num_rows != num_rows:
        raise SchemaError(f"{where}: table '{name}' has {num_rows} rows in the model but "
                          f"{info.num_rows} in the store")


def pooled_lookup(backend, tables: List[Tuple[str, int]], batch: int, values: torch.Tensor, offsets: torch.Tensor,
                  weights, mode: str, max_gather_bytes: int) -> torch.Tensor:
    """[batch, sum of dims] pooled vectors of a group's features (one (table, dim) per feature, in
    the KJT's key order) through the backend. The engine holds every looked-up row of a call
    while it pools (about 2 x ids x row bytes); calls keep that under ``max_gather_bytes``.
    Features are split between calls, never a feature's bags while it fits: each call has the
    whole batch of its tables (one ring pass), so a table's rows keep the batch's density, which
    decides how many pages are read whole (``SlsEngine``'s ``dense_page_rows``). Only a feature
    that alone needs more than the bound is looked up in windows of whole bags."""

    def ids(i: int, b0: int, b1: int) -> Tuple[int, int]:
        return int(offsets[i * batch + b0]), int(offsets[i * batch + b1])

    def request(i: int, b0: int, b1: int) -> SlsRequest:
        off = offsets[i * batch + b0:i * batch + b1 + 1]
        a, z = ids(i, b0, b1)
        return SlsRequest(tables[i][0], values[a:z], off - a if a else off, mode=mode,
                          per_sample_weights=None if weights is None else weights[a:z], include_last_offset=True)

    def need(i: int) -> int:
        a, z = ids(i, 0, batch)
        return 2 * 4 * tables[i][1] * (z - a)

    cols: List[Optional[torch.Tensor]] = [None] * len(tables)
    group: List[int] = []
    held = 0

    def run(group: List[int]) -> None:
        for i, pooled in zip(group, backend.sls([request(i, 0, batch) for i in group])):
            cols[i] = pooled

    for i in range(len(tables)):
        n = need(i)
        if max_gather_bytes > 0 and n > max_gather_bytes:  # this feature alone: windows of its bags
            windows = max(1, min(batch, -(-n // max_gather_bytes)))
            step = max(1, -(-batch // windows))
            parts = [backend.sls([request(i, b0, min(batch, b0 + step))])[0] for b0 in range(0, batch, step)]
            cols[i] = parts[0] if len(parts) == 1 else torch.cat(parts, dim=0)
            continue
        if group and max_gather_bytes > 0 and held + n > max_gather_bytes:
            run(group)
            group, held = [], 0
        group.append(i)
        held += n
    if group:
        run(group)
    return cols[0] if len(cols) == 1 else torch.cat(cols, dim=1)


class SsdEmbeddingBag(BaseEmbedding):
    """Pooled lookups of a group of SSD tables through a recflash SLS backend."""

    def __init__(self, config: GroupedEmbeddingConfig, backend, where: str = "SSD table group",
                 max_gather_bytes: int = 16 << 20) -> None:
        super().__init__()
        self._config = config
        self._backend = backend
        # see pooled_lookup: serving memory stays bounded whatever the batch size
        self._max_gather_bytes = int(max_gather_bytes)
        if config.pooling == PoolingType.SUM:
            self._mode = "sum"
        elif config.pooling == PoolingType.MEAN:
            self._mode = "mean"
        else:
            raise InvalidArgumentError(f"{where}: pooling {config.pooling} is not supported on SSD tables "
                                       f"(sum and mean are)")
        # (feature, table, dim) in the order of the group's KJT keys and output columns.
        self._features: List[Tuple[str, str, int]] = []
        for table in config.embedding_tables:
            if table.local_rows != table.num_embeddings or table.local_cols != table.embedding_dim:
                raise InvalidArgumentError(
                    f"{where}: table '{table.name}' is split ({table.local_rows} x {table.local_cols} of "
                    f"{table.num_embeddings} x {table.embedding_dim}); SSD tables are sharded table-wise")
            check_table_matches(backend, table.name, table.num_embeddings, table.embedding_dim, where)
            for f in table.feature_names:
                self._features.append((f, table.name, table.embedding_dim))

    @property
    def config(self) -> GroupedEmbeddingConfig:
        return self._config

    @property
    def backend(self):
        return self._backend

    def table_names(self) -> List[str]:
        return [t.name for t in self._config.embedding_tables]

    def forward(self, features: KeyedJaggedTensor) -> torch.Tensor:
        if features.variable_stride_per_key():
            raise InvalidArgumentError(
                f"SSD tables {', '.join(self.table_names())}: the batch has a different batch size per "
                f"feature (variable batch per feature), which SSD-offloaded tables do not support; "
                f"send every feature with the same batch size")
        batch = features.stride()
        values = features.values()
        offsets = features.offsets()
        weights = features.weights_or_none()
        if weights is not None and not torch.is_floating_point(weights):
            weights = None
        if weights is not None and self._mode != "sum":
            raise InvalidArgumentError(f"SSD tables {', '.join(self.table_names())}: per-sample weights "
                                       f"need sum pooling, the tables pool by {self._mode}")
        return pooled_lookup(self._backend, [(t, d) for _, t, d in self._features], batch, values, offsets,
                             weights, self._mode, self._max_gather_bytes)

    # The kernel holds no parameters: nothing for TorchRec's state_dict or optimizer to see.
    def named_parameters_by_table(self) -> Iterator[Tuple[str, torch.Tensor]]:
        return iter(())

    def flush(self) -> None:
        pass

    def purge(self) -> None:
        pass
