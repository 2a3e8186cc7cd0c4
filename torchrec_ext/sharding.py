"""Sharding an EmbeddingBagCollection with SSD-offloaded tables (TorchRec's distributed side).

The chain TorchRec builds for a sharded EBC, and the class that replaces each link:

    EmbeddingBagCollectionSharder.shard     -> SsdEmbeddingBagCollectionSharder.shard
    ShardedEmbeddingBagCollection           -> ShardedSsdEmbeddingBagCollection
      .create_embedding_bag_sharding        -> table-wise: SsdTwPooledEmbeddingSharding
    TwPooledEmbeddingSharding.create_lookup -> SsdGroupedPooledEmbeddingsLookup
      ._create_embedding_kernel             -> CUSTOMIZED_KERNEL: SsdEmbeddingBag, else TorchRec's

so the tables a plan puts on ``CUSTOMIZED_KERNEL`` run through recflash's SLS engine and every
other table keeps TorchRec's own kernels in the same sharded module. SSD tables are sharded
table-wise only: the rank that owns a table receives the whole global batch of its features
(TorchRec's input all-to-all) and returns pooled vectors (its output all-to-all).

SSD tables have no parameters in DRAM. A checkpoint's ``embedding_bags.<table>.weight`` entry
of an SSD table is written to the store when the sharded module loads a state dict, and
``ssd_state_dict()`` (or ``state_dict()`` with ``include_ssd_in_state_dict``) reads them back.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Dict, List, Optional

import torch
from torch import nn
from torchrec.distributed.embedding_lookup import GroupedPooledEmbeddingsLookup
from torchrec.distributed.embedding_sharding import EmbeddingSharding, EmbeddingShardingInfo
from torchrec.distributed.embedding_types import EmbeddingComputeKernel
from torchrec.distributed.embeddingbag import (EmbeddingBagCollectionSharder,
                                               ShardedEmbeddingBagCollection)
from torchrec.distributed.sharding.tw_sharding import TwPooledEmbeddingSharding
from torchrec.distributed.types import ParameterSharding, ShardingEnv, ShardingType
from torchrec.modules.embedding_modules import EmbeddingBagCollection

from recflash.reader.errors import InvalidArgumentError, RecflashError
from recflash.torchrec_ext.backend import check_sls_options, open_backend
from recflash.torchrec_ext.embedding_kernel import SsdEmbeddingBag

SSD_KERNEL = EmbeddingComputeKernel.CUSTOMIZED_KERNEL.value


@dataclasses.dataclass(frozen=True)
class SsdContext:
    """What the kernels of one sharded module need to reach their store."""
    location: Any            # store path (may hold "{rank}"), device address or client
    sls_options: Dict[str, Any]
    rank: int
    world_size: int
    max_gather_bytes: int = 16 << 20

    def backend(self):
        return open_backend(self.location, self.rank, self.world_size, self.sls_options)


class SsdGroupedPooledEmbeddingsLookup(GroupedPooledEmbeddingsLookup):
    """TorchRec's grouped lookup with the ``CUSTOMIZED_KERNEL`` group served by recflash."""

    def __init__(self, *args, ssd_context: SsdContext, **kwargs) -> None:
        # Set before nn.Module.__init__: the base constructor creates the kernels.
        self._ssd_context = ssd_context
        super().__init__(*args, **kwargs)

    def _create_embedding_kernel(self, config, device, pg, sharding_type, env):
        if config.compute_kernel == EmbeddingComputeKernel.CUSTOMIZED_KERNEL:
            names = ", ".join(t.name for t in config.embedding_tables)
            return SsdEmbeddingBag(config, self._ssd_context.backend(),
                                   where=f"SSD tables [{names}] on rank {self._ssd_context.rank}",
                                   max_gather_bytes=self._ssd_context.max_gather_bytes)
        return super()._create_embedding_kernel(config, device, pg, sharding_type, env)

    def ssd_kernels(self) -> List[SsdEmbeddingBag]:
        return [m for m in self._emb_modules if isinstance(m, SsdEmbeddingBag)]


class SsdTwPooledEmbeddingSharding(TwPooledEmbeddingSharding):
    """Table-wise sharding whose lookup knows recflash's kernel."""

    def __init__(self, *args, ssd_context: SsdContext, **kwargs) -> None:
        self._ssd_context = ssd_context
        super().__init__(*args, **kwargs)

    def create_lookup(self, device=None, fused_params=None, feature_processor=None):
        return SsdGroupedPooledEmbeddingsLookup(
            grouped_configs=self._grouped_embedding_configs,
            pg=self._pg,
            device=device if device is not None else self._device,
            feature_processor=feature_processor,
            env=self._env,
            ssd_context=self._ssd_context,
        )


class ShardedSsdEmbeddingBagCollection(ShardedEmbeddingBagCollection):
    """A sharded EBC whose ``CUSTOMIZED_KERNEL`` tables live in a recflash store."""

    def __init__(self, module: EmbeddingBagCollection, table_name_to_parameter_sharding: Dict[str, ParameterSharding],
                 env: ShardingEnv, *args, ssd_context: SsdContext, include_ssd_in_state_dict: bool = False,
                 **kwargs) -> None:
        self._ssd_context = ssd_context
        self._ssd_plan = {t: ps for t, ps in table_name_to_parameter_sharding.items() if ps.compute_kernel == SSD_KERNEL}
        for t, ps in self._ssd_plan.items():
            if ps.sharding_type != ShardingType.TABLE_WISE.value:
                raise InvalidArgumentError(
                    f"table '{t}': the plan puts it on SSD ({SSD_KERNEL}) with sharding type "
                    f"'{ps.sharding_type}'; SSD tables are sharded table-wise")
        if module.is_weighted() and any(
                c.pooling.name != "SUM" for c in module.embedding_bag_configs() if c.name in self._ssd_plan):
            raise InvalidArgumentError("a weighted EmbeddingBagCollection needs sum pooling on its SSD tables")
        self._ssd_dims = {c.name: (c.num_embeddings, c.embedding_dim) for c in module.embedding_bag_configs()}
        self.include_ssd_in_state_dict = include_ssd_in_state_dict
        super().__init__(module, table_name_to_parameter_sharding, env, *args, **kwargs)
        self._register_state_dict_hook(ShardedSsdEmbeddingBagCollection._add_ssd_tables_to_state_dict)

    # -- the sharding chain ----------------------------------------------------------------
    def create_embedding_bag_sharding(self, sharding_infos: List[EmbeddingShardingInfo], env: ShardingEnv,
                                      device: Optional[torch.device] = None, permute_embeddings: bool = False,
                                      qcomm_codecs_registry=None) -> EmbeddingSharding:
        sharding_type = sharding_infos[0].param_sharding.sharding_type
        if sharding_type == ShardingType.TABLE_WISE.value:
            return SsdTwPooledEmbeddingSharding(sharding_infos, env, device,
                                                qcomm_codecs_registry=qcomm_codecs_registry,
                                                ssd_context=self._ssd_context)
        return ShardedEmbeddingBagCollection.create_embedding_bag_sharding(
            sharding_infos, env, device, permute_embeddings=permute_embeddings,
            qcomm_codecs_registry=qcomm_codecs_registry)

    def input_dist(self, ctx, features):
        # TorchRec's variable-batch-per-feature (VBE) path mixing custom and TBE kernels is a
        # known source of wrong results upstream: refuse it before any collective starts.
        if self._ssd_plan and features.variable_stride_per_key():
            raise InvalidArgumentError(
                f"SSD tables {', '.join(sorted(self._ssd_plan))}: the batch has a different batch size per "
                f"feature (variable batch per feature), which SSD-offloaded tables do not support; send every "
                f"feature with the same batch size")
        return super().input_dist(ctx, features)

    def reset_parameters(self) -> None:
        # TorchRec initialises every table but KEY_VALUE ones; SSD tables have no DRAM weight.
        if self._device and self._device.type == "meta":
            return
        saved = self._embedding_bag_configs
        try:
            self._embedding_bag_configs = [c for c in saved if c.name not in self._ssd_plan]
            super().reset_parameters()
        finally:
            self._embedding_bag_configs = saved

    # -- SSD tables on this rank -----------------------------------------------------------
    def ssd_tables(self) -> List[str]:
        """Every table of this module the plan puts on SSD (on any rank)."""
        return sorted(self._ssd_plan)

    def local_ssd_tables(self) -> List[str]:
        """The SSD tables this rank serves."""
        out = []
        for lookup in self._lookups:
            inner = getattr(lookup, "module", lookup)  # DDP-wrapped lookups of data-parallel tables
            if isinstance(inner, SsdGroupedPooledEmbeddingsLookup):
                for k in inner.ssd_kernels():
                    out.extend(k.table_names())
        return sorted(out)

    def _owner(self, table: str) -> int:
        ps = self._ssd_plan[table]
        return int(ps.ranks[0]) if ps.ranks else 0

    def _check_ssd_table(self, table: str) -> None:
        if table not in self._ssd_plan:
            raise InvalidArgumentError(
                f"table '{table}' is not an SSD table of this module (SSD tables: "
                f"{', '.join(self.ssd_tables()) or 'none'})")

    @property
    def ssd_backend(self):
        return self._ssd_context.backend()

    def update_rows(self, table: str, ids, rows) -> None:
        """New rows of an SSD table while serving; the next forward sees them (caches stay coherent).

        Called on the rank that owns the table (other ranks ignore the call, so every rank may
        run the same update code)."""
        self._check_ssd_table(table)
        if self._owner(table) != self._ssd_context.rank:
            return
        self.ssd_backend.update_rows(table, ids, rows)

    def read_rows(self, table: str, ids) -> torch.Tensor:
        """Rows of an SSD table from the store, as a float32 tensor (owner rank only)."""
        self._check_ssd_table(table)
        return torch.from_numpy(self.ssd_backend.read_rows(table, ids))

    def ssd_state_dict(self, prefix: str = "") -> Dict[str, torch.Tensor]:
        """``embedding_bags.<table>.weight`` of the SSD tables this rank serves, read from the store.

        This materialises the tables in DRAM: meant for exporting a checkpoint, not for serving."""
        out = {}
        for t in self.local_ssd_tables():
            rows, _ = self._ssd_dims[t]
            out[f"{prefix}embedding_bags.{t}.weight"] = self.read_rows(t, torch.arange(rows))
        return out

    @staticmethod
    def _add_ssd_tables_to_state_dict(module, destination, prefix, local_metadata):
        if module.include_ssd_in_state_dict:
            destination.update(module.ssd_state_dict(prefix))
        return destination

    def _load_from_state_dict(self, state_dict, prefix, local_metadata, strict, missing_keys,
                              unexpected_keys, error_msgs) -> None:
        # SSD tables' rows go to the store; the rest loads as TorchRec does.
        for t in list(self._ssd_plan):
            key = f"{prefix}embedding_bags.{t}.weight"
            if key not in state_dict:
                continue
            w = state_dict.pop(key)
            if self._owner(t) != self._ssd_context.rank:
                continue
            if hasattr(w, "local_shards"):  # a ShardedTensor from another sharded checkpoint
                shards = w.local_shards()
                if not shards:
                    continue
                w = shards[0].tensor
            rows, dim = self._ssd_dims[t]
            if tuple(w.shape) != (rows, dim):
                error_msgs.append(f"SSD table '{t}': the checkpoint's weight has shape {tuple(w.shape)}, "
                                  f"the model {rows} x {dim}")
                continue
            try:
                _write_table_rows(self.ssd_backend, t, w)
            except RecflashError as e:
                error_msgs.append(f"SSD table '{t}': {e}")
        super()._load_from_state_dict(state_dict, prefix, local_metadata, strict, missing_keys,
                                      unexpected_keys, error_msgs)


def _write_table_rows(backend, table: str, weight: torch.Tensor, chunk: int = 1 << 18) -> None:
    if hasattr(backend, "load_table"):  # embedded: bulk load into the packed layout
        backend.load_table(table, weight.detach().to(torch.float32))
        return
    n = weight.shape[0]  # a device server: row updates in chunks
    for a in range(0, n, chunk):
        z = min(n, a + chunk)
        backend.update_rows(table, torch.arange(a, z), weight[a:z].detach().to(torch.float32))


class SsdEmbeddingBagCollectionSharder(EmbeddingBagCollectionSharder):
    """Drop-in ``EmbeddingBagCollectionSharder`` whose ``CUSTOMIZED_KERNEL`` tables run on recflash.

    ``store_path``: the embedding store (``{rank}`` in it selects a store per rank), a device
    server address (``unix:PATH`` or ``HOST:PORT``) or a ``DeviceClient``. ``None`` is allowed
    only for planning. ``sls_options``: the SLS engine's cache options (``row_cache_bytes``,
    ``hot_rows_bytes``, ``pooled_cache_bytes``, ``pooled_min_bag``, ``device_cache_bytes``,
    ``vector_grained``; ``hot_rows_bytes`` is filled from the first ``hot_rows_profile_ids`` ids
    looked up, see ``SlsEngine``) and ``writable`` (open a shared plain store path read-write).
    ``max_gather_bytes`` bounds the rows one engine call holds: a larger batch is split between
    calls by feature, each call with the whole batch of its tables (one ring pass), so a table's
    rows keep the batch's density; only a feature that alone passes the bound is looked up in
    windows of whole bags.
    """

    def __init__(self, store_path=None, fused_params: Optional[Dict[str, Any]] = None,
                 qcomm_codecs_registry=None, include_ssd_in_state_dict: bool = False,
                 max_gather_bytes: int = 16 << 20, **sls_options) -> None:
        check_sls_options(sls_options)
        super().__init__(fused_params=fused_params, qcomm_codecs_registry=qcomm_codecs_registry)
        self.store_path = store_path
        self.max_gather_bytes = int(max_gather_bytes)
        self.sls_options = sls_options
        self.include_ssd_in_state_dict = include_ssd_in_state_dict

    def compute_kernels(self, sharding_type: str, compute_device_type: str) -> List[str]:
        kernels = list(super().compute_kernels(sharding_type, compute_device_type))
        if sharding_type == ShardingType.TABLE_WISE.value:
            kernels.append(SSD_KERNEL)
        return kernels

    def shard(self, module: EmbeddingBagCollection, params: Dict[str, ParameterSharding], env: ShardingEnv,
              device: Optional[torch.device] = None, module_fqn: Optional[str] = None):
        if self.store_path is None and any(p.compute_kernel == SSD_KERNEL for p in params.values()):
            raise InvalidArgumentError("SsdEmbeddingBagCollectionSharder: the plan puts tables on SSD but the "
                                       "sharder was made without a store path or device address")
        ctx = SsdContext(self.store_path, dict(self.sls_options), env.rank, env.world_size, self.max_gather_bytes)
        return ShardedSsdEmbeddingBagCollection(
            module=module, table_name_to_parameter_sharding=params, env=env, fused_params=self.fused_params,
            device=device, qcomm_codecs_registry=self.qcomm_codecs_registry, module_fqn=module_fqn,
            ssd_context=ctx, include_ssd_in_state_dict=self.include_ssd_in_state_dict)


def find_ssd_modules(model: nn.Module) -> List[ShardedSsdEmbeddingBagCollection]:
    """Every sharded EBC with SSD tables inside `model` (a DMP or a plain module)."""
    return [m for m in model.modules() if isinstance(m, ShardedSsdEmbeddingBagCollection)]


def update_rows(model: nn.Module, table: str, ids, rows) -> None:
    """``update_rows`` on whichever sharded module of `model` holds SSD table `table`."""
    for m in find_ssd_modules(model):
        if table in m.ssd_tables():
            m.update_rows(table, ids, rows)
            return
    raise InvalidArgumentError(f"no SSD table '{table}' in this model")
