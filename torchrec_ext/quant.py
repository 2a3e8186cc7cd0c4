"""TorchRec's quantized inference path with SSD tables (``shard_quant_model_with_ssd``).

``torchrec.inference`` users quantize a model (``quantize_inference_model``) and shard it
(``shard_quant_model``). TorchRec already sets aside a group for SSD tables: the fused param
``FUSED_PARAM_SSD_TABLE_LIST`` puts the listed tables into their own ``"ssd"`` group, but that
group's kernel is hard-coded to FBGEMM's in-DRAM TBE. ``shard_quant_model_with_ssd`` shards
with that list and then replaces each ssd group's kernel module by
:class:`SsdQuantEmbeddingBag`, which sends the group's features to recflash's SLS engine in one
call; the other tables keep TorchRec's quantized CPU kernels (their weights re-assigned, since
sharding builds fresh TBEs).

The store's tables may be float32 (the float reference), or the quantized model's own int8 /
fp16 rows (``export_quantized_tables``), stored byte for byte and decoded as the engine pools.
"""

from __future__ import annotations

import os
from typing import Dict, Iterable, List, Optional, Tuple

import numpy as np
import torch
from torch import nn
from torchrec.distributed.embedding_types import GroupedEmbeddingConfig
from torchrec.distributed.fused_params import FUSED_PARAM_IS_SSD_TABLE, FUSED_PARAM_SSD_TABLE_LIST
from torchrec.modules.embedding_configs import DataType, PoolingType
from torchrec.sparse.jagged_tensor import KeyedJaggedTensor

from recflash.reader.errors import InvalidArgumentError
from recflash.torchrec_ext.backend import open_backend
from recflash.torchrec_ext.embedding_kernel import check_table_matches, pooled_lookup

_DTYPE_OF = {DataType.INT8: "int8", DataType.FP16: "float16", DataType.FP32: "float32"}


class SsdQuantEmbeddingBag(nn.Module):
    """Stands in for a ``QuantBatchedEmbeddingBag`` whose tables are on SSD."""

    def __init__(self, config: GroupedEmbeddingConfig, backend, output_dtype: torch.dtype = torch.float32,
                 max_gather_bytes: int = 16 << 20) -> None:
        super().__init__()
        self._config = config
        self._backend = backend
        self._output_dtype = output_dtype
        if config.pooling not in (PoolingType.SUM, PoolingType.MEAN):
            raise InvalidArgumentError(f"SSD tables: pooling {config.pooling} is not supported (sum and mean are)")
        self._mode = "mean" if config.pooling == PoolingType.MEAN else "sum"
        self._max_gather_bytes = int(max_gather_bytes)
        self._features: List[Tuple[str, int]] = []  # (table, dim) per feature, in key order
        for t in config.embedding_tables:
            check_table_matches(backend, t.name, t.num_embeddings, t.embedding_dim, "quantized SSD table group")
            self._features.extend((t.name, t.embedding_dim) for _ in t.feature_names)

    @property
    def config(self) -> GroupedEmbeddingConfig:
        return self._config

    def forward(self, features: KeyedJaggedTensor, vbe_output=None, vbe_output_offsets=None) -> torch.Tensor:
        if features.variable_stride_per_key():
            raise InvalidArgumentError("SSD tables do not support a variable batch size per feature")
        weights = features.weights_or_none() if self._config.is_weighted else None
        out = pooled_lookup(self._backend, self._features, features.stride(), features.values(), features.offsets(),
                            weights, self._mode, self._max_gather_bytes)
        return out.to(self._output_dtype)

    # No weights in DRAM: nothing for state_dict or the TBE registry to see.
    def named_buffers(self, prefix: str = "", recurse: bool = True, remove_duplicate: bool = True):
        return iter(())

    def split_embedding_weights(self):
        return []


def _ssd_kernels(sharded: nn.Module):
    """(sharded EBC, per-rank ModuleList, index, rank, kernel) of every ssd-group kernel.

    TorchRec keeps a quantized EBC's lookups in plain lists (not submodules), one lookup per
    rank inside each sharding's lookup, so they are walked explicitly."""
    from torchrec.distributed.quant_embedding_kernel import QuantBatchedEmbeddingBag
    from torchrec.distributed.quant_embeddingbag import ShardedQuantEmbeddingBagCollection

    for ebc in sharded.modules():
        if not isinstance(ebc, ShardedQuantEmbeddingBagCollection):
            continue
        for lookup in ebc._lookups:
            per_rank = getattr(lookup, "_embedding_lookups_per_rank", None) or [lookup]
            for rank, rl in enumerate(per_rank):
                mods = getattr(rl, "_emb_modules", None)
                if not isinstance(mods, nn.ModuleList):
                    continue
                for i, k in enumerate(mods):
                    if isinstance(k, QuantBatchedEmbeddingBag) and \
                            (k.config.fused_params or {}).get(FUSED_PARAM_IS_SSD_TABLE, False):
                        yield ebc, mods, i, rank, k


def _forget_tbe(ebc: nn.Module, kernel: nn.Module, tables: List[str]) -> None:
    """Drops every reference the sharded EBC keeps to a replaced TBE, so its DRAM is freed."""
    tbe = getattr(kernel, "_emb_module", None)
    configs = getattr(ebc, "_tbes_configs", None)
    if isinstance(configs, dict) and tbe in configs:
        del configs[tbe]
    if isinstance(getattr(ebc, "tbes", None), nn.ModuleList):
        ebc.tbes = nn.ModuleList([t for t in ebc.tbes if t is not tbe])
    bags = getattr(ebc, "embedding_bags", None)
    for t in tables:
        if isinstance(bags, nn.ModuleDict) and t in bags:
            for name in ("weight", "weight_qscale", "weight_qbias"):
                bags[t]._buffers.pop(name, None)


def shard_quant_model_with_ssd(model: nn.Module, ssd_tables: Iterable[str], store_path, world_size: int = 1,
                               constraints=None, **sls_options):
    """``shard_quant_model`` on CPU with `ssd_tables` served by recflash from `store_path`.

    ``model`` is a quantized model (``torchrec.inference.modules.quantize_inference_model``).
    Returns ``(sharded_model, plan)`` like ``shard_quant_model``. ``store_path`` may hold
    ``{rank}`` (a store per rank) or be a device address; ``sls_options`` are the SLS engine's
    cache options.
    """
    from torchrec.distributed.global_settings import set_propogate_device
    from torchrec.distributed.quant_embeddingbag import QuantEmbeddingBagCollectionSharder
    from torchrec.inference.modules import assign_weights_to_tbe, get_table_to_weights_from_tbe, shard_quant_model

    ssd_tables = list(ssd_tables)
    names = {c.name for m in model.modules() if callable(getattr(m, "embedding_bag_configs", None))
             for c in m.embedding_bag_configs()}
    unknown = sorted(set(ssd_tables) - names)
    if unknown:
        raise InvalidArgumentError(f"shard_quant_model_with_ssd: unknown table(s) {', '.join(unknown)} "
                                   f"(the model's tables: {', '.join(sorted(names))})")
    if isinstance(store_path, (str, os.PathLike)) and "{rank}" not in os.fspath(store_path) \
            and not os.fspath(store_path).startswith("unix:") and not os.path.isdir(store_path):
        from recflash.reader.errors import NotAStoreError
        raise NotAStoreError(f"embedding store '{os.fspath(store_path)}' does not exist")
    set_propogate_device(True)  # else sharding looks for CUDA
    dram_weights = {t: w for t, w in get_table_to_weights_from_tbe(model).items() if t not in ssd_tables}
    sharder = QuantEmbeddingBagCollectionSharder(fused_params={FUSED_PARAM_SSD_TABLE_LIST: ssd_tables})
    sharded, plan = shard_quant_model(model, world_size=world_size, compute_device="cpu", sharding_device="cpu",
                                      sharders=[sharder], constraints=constraints)
    # Each rank's ssd group gets recflash's kernel.
    replaced = 0
    for ebc, mods, i, rank, k in list(_ssd_kernels(sharded)):
        backend = open_backend(store_path, rank, world_size, sls_options)
        out_dtype = getattr(getattr(k, "_emb_module", None), "output_dtype", torch.float32)
        if isinstance(out_dtype, int):
            from fbgemm_gpu.split_embedding_configs import SparseType
            out_dtype = SparseType.from_int(out_dtype).as_dtype()
        mods[i] = SsdQuantEmbeddingBag(k.config, backend, output_dtype=out_dtype)
        _forget_tbe(ebc, k, [t.name for t in k.config.embedding_tables])
        replaced += 1
    if ssd_tables and not replaced:
        raise InvalidArgumentError("shard_quant_model_with_ssd: no SSD table group was created; are the tables "
                                   "in a QuantEmbeddingBagCollection?")
    assign_weights_to_tbe(sharded, dram_weights)
    return sharded, plan


def quantized_table_rows(model: nn.Module, tables: Optional[Iterable[str]] = None) -> Dict[str, Tuple[str, np.ndarray]]:
    """Each quantized table's rows as TorchRec's TBE holds them: {table: (dtype, uint8 or float rows)}.

    int8 rows come back as ``[scale f16][bias f16][dim x uint8]`` (the store's int8 layout)."""
    from torchrec.inference.modules import get_table_to_weights_from_tbe

    dtypes = {c.name: c.data_type for m in model.modules() if callable(getattr(m, "embedding_bag_configs", None))
              for c in m.embedding_bag_configs()}
    out = {}
    for t, (w, sb) in get_table_to_weights_from_tbe(model).items():
        if tables is not None and t not in tables:
            continue
        dt = _DTYPE_OF.get(dtypes.get(t))
        if dt is None:
            raise InvalidArgumentError(f"table '{t}': data type {dtypes.get(t)} cannot be stored (int8, fp16, fp32 can)")
        w = w.detach().cpu()
        if dt == "int8":
            rows = torch.cat([sb.detach().cpu(), w], dim=1).numpy()
        elif dt == "float16":
            rows = w.numpy()  # uint8 bytes of the halves
        else:
            rows = w.view(torch.float32).numpy() if w.dtype == torch.uint8 else w.numpy()
        out[t] = (dt, rows)
    return out


def export_quantized_tables(quant_model: nn.Module, store_path, tables: Iterable[str], progress: bool = True) -> dict:
    """Writes a quantized model's int8 / fp16 rows into the store unchanged (``EmbeddingStore``
    tables of that dtype); the SLS engine then pools exactly what TorchRec's kernel would."""
    from recflash.ndp import EmbeddingStore
    from recflash.reader import Store

    tables = list(tables)
    rows = quantized_table_rows(quant_model, tables)
    missing = sorted(set(tables) - set(rows))
    if missing:
        raise InvalidArgumentError(f"export_quantized_tables: no quantized table(s) {', '.join(missing)} in the model")
    dims = {c.name: (c.num_embeddings, c.embedding_dim) for m in quant_model.modules()
            if callable(getattr(m, "embedding_bag_configs", None)) for c in m.embedding_bag_configs()}
    out = {}
    with Store.open(os.fspath(store_path)) as store:
        emb = EmbeddingStore(store)
        for t in tables:
            dt, r = rows[t]
            n, dim = dims[t]
            info = emb.create_table(t, num_rows=n, dim=dim, dtype=dt)
            emb.load_table(t, r, progress=progress)
            out[t] = {"rows": n, "dim": dim, "dtype": dt, "row_bytes": info.row_bytes}
        store.sync()
    return out
