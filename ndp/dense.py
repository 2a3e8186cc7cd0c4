"""A DLRM's dense part next to the store: bottom MLP, feature interaction, top MLP.

Built from torchrec's own ``DenseArch``, ``InteractionArch`` and ``OverArch``
(``torchrec.models.dlrm``) and loaded from a ``DLRM`` state dict, so the device computes the
same function as the host model. The embedding tables are not part of it: they live in the
store and are pooled by the SLS engine; ``config["tables"]`` says which store table serves
each of the model's sparse features. ``is_weighted`` (default false): the model's
EmbeddingBagCollection was built with ``is_weighted=True``, so every feature pools with the
KeyedJaggedTensor's per-value weights (Forward then needs them).

Config (JSON-able dict)::

    {"dense_in_features": 13, "dense_arch_layer_sizes": [64, 16],
     "over_arch_layer_sizes": [32, 1], "is_weighted": false,
     "tables": [{"name": "t0", "store_table": "t0", "embedding_dim": 16,
                 "num_embeddings": 1000, "feature_names": ["f0"], "pooling": "sum"}, ...]}
"""

from __future__ import annotations

import math
from typing import Dict, List, Optional, Sequence, Tuple

import numpy as np

from recflash.reader.errors import InvalidArgumentError, SchemaError

SPARSE_PREFIX = "sparse_arch."


def dlrm_config(model, table_map: Optional[Dict[str, str]] = None) -> dict:
    """The config of a torchrec ``DLRM`` (its store tables named by `table_map`, default: the
    model's table names)."""
    table_map = table_map or {}
    ebc = model.sparse_arch.embedding_bag_collection
    dense_mlp = model.dense_arch.model._mlp
    over_mlp, over_last = model.over_arch.model[0], model.over_arch.model[1]
    tables = []
    for c in ebc.embedding_bag_configs():
        pooling = getattr(c.pooling, "name", str(c.pooling)).lower()
        tables.append(dict(name=c.name, store_table=table_map.get(c.name, c.name), embedding_dim=int(c.embedding_dim),
                           num_embeddings=int(c.num_embeddings), feature_names=list(c.feature_names), pooling=pooling))
    return dict(
        dense_in_features=int(dense_mlp[0]._linear.in_features),
        dense_arch_layer_sizes=[int(p._linear.out_features) for p in dense_mlp],
        over_arch_layer_sizes=[int(p._linear.out_features) for p in over_mlp._mlp] + [int(over_last.out_features)],
        is_weighted=bool(ebc.is_weighted()) if callable(getattr(ebc, "is_weighted", None)) else False,
        tables=tables,
    )


def dense_state_dict(model_or_state) -> dict:
    """The DLRM state dict without its embedding tables."""
    sd = model_or_state.state_dict() if hasattr(model_or_state, "state_dict") else dict(model_or_state)
    return {k: v for k, v in sd.items() if not k.startswith(SPARSE_PREFIX)}


def _positive_ints(config: dict, key: str, name: str) -> List[int]:
    v = config.get(key)
    if not isinstance(v, list) or not v or not all(isinstance(x, int) and x > 0 for x in v):
        raise InvalidArgumentError(f"model '{name}': config '{key}' must be a non-empty list of positive ints, got {v!r}")
    return v


class DlrmDense:
    """Bottom MLP + interaction + top MLP of one registered model (torch, CPU, eval mode)."""

    def __init__(self, name: str, config: dict, state: Dict[str, "object"]):
        import torch
        from torchrec.models.dlrm import DenseArch, InteractionArch, OverArch

        self.name, self.config = name, config
        if not isinstance(config, dict):
            raise InvalidArgumentError(f"model '{name}': config must be a JSON object")
        din = config.get("dense_in_features")
        if not isinstance(din, int) or din <= 0:
            raise InvalidArgumentError(f"model '{name}': config 'dense_in_features' must be a positive int, got {din!r}")
        dense_sizes = _positive_ints(config, "dense_arch_layer_sizes", name)
        over_sizes = _positive_ints(config, "over_arch_layer_sizes", name)
        if len(over_sizes) < 2:
            raise InvalidArgumentError(f"model '{name}': 'over_arch_layer_sizes' needs at least two layers")
        self.is_weighted = config.get("is_weighted", False)
        if not isinstance(self.is_weighted, bool):
            raise InvalidArgumentError(f"model '{name}': config 'is_weighted' must be true or false, "
                                       f"got {self.is_weighted!r}")
        tables = config.get("tables")
        if not isinstance(tables, list) or not tables:
            raise InvalidArgumentError(f"model '{name}': config 'tables' must be a non-empty list")
        self.features: List[Tuple[str, str, str]] = []  # (feature, store table, pooling), torchrec's order
        dims = set()
        for t in tables:
            try:
                dims.add(int(t["embedding_dim"]))
                pooling = str(t.get("pooling", "sum")).lower()
                if pooling not in ("sum", "mean"):
                    raise InvalidArgumentError(f"model '{name}': table '{t['name']}' has pooling {pooling!r} "
                                               f"(the device pools with 'sum' or 'mean')")
                if self.is_weighted and pooling != "sum":
                    raise InvalidArgumentError(f"model '{name}': table '{t['name']}' pools by {pooling}, but the "
                                               f"model is weighted (is_weighted): per-value weights need 'sum'")
                for f in t["feature_names"]:
                    self.features.append((str(f), str(t.get("store_table", t["name"])), pooling))
            except (KeyError, TypeError) as e:
                raise InvalidArgumentError(f"model '{name}': table entry {t!r} lacks {e}") from None
        if len(dims) != 1:
            raise InvalidArgumentError(f"model '{name}': all tables need one embedding_dim (DLRM), got {sorted(dims)}")
        self.dim = dims.pop()
        if dense_sizes[-1] != self.dim:
            raise InvalidArgumentError(f"model '{name}': the bottom MLP ends at {dense_sizes[-1]}, the tables' "
                                       f"embedding_dim is {self.dim}")
        names = [f for f, _, _ in self.features]
        if len(set(names)) != len(names):
            raise InvalidArgumentError(f"model '{name}': a feature name appears twice in {names}")
        F = len(self.features)
        self.dense_in = din
        self.over_in = self.dim + math.comb(F, 2) + F
        self.module = torch.nn.Module()
        self.module.dense_arch = DenseArch(din, dense_sizes)
        self.module.inter_arch = InteractionArch(F)
        self.module.over_arch = OverArch(self.over_in, over_sizes)
        try:
            self.module.load_state_dict({k: torch.as_tensor(v) for k, v in state.items()}, strict=True)
        except RuntimeError as e:
            raise SchemaError(f"model '{name}': state dict does not match its config: {e}") from None
        self.module.eval()
        self.parameters = sum(p.numel() for p in self.module.parameters())

    def check_tables(self, tables: Dict[str, "object"]) -> None:
        """Every feature's store table exists with the model's dimension and enough rows."""
        rows = {t["store_table"] if "store_table" in t else t["name"]: int(t.get("num_embeddings", 0))
                for t in self.config["tables"]}
        for feature, table, _ in self.features:
            info = tables.get(table)
            if info is None:
                raise InvalidArgumentError(f"model '{self.name}': feature '{feature}' needs store table '{table}', "
                                           f"which the store does not have (tables: {', '.join(sorted(tables)) or 'none'})")
            if info.dim != self.dim:
                raise SchemaError(f"model '{self.name}': store table '{table}' has dim {info.dim}, the model {self.dim}")
            if rows.get(table, 0) > info.num_rows:
                raise SchemaError(f"model '{self.name}': table '{table}' has {rows[table]} embeddings in the model "
                                  f"but {info.num_rows} rows in the store")

    # -- compute (torch tensors in and out; no autograd) ----------------------------------
    def bottom(self, dense):
        import torch

        self._check(dense, self.dense_in, "bottom MLP input")
        with torch.inference_mode():
            return self.module.dense_arch(dense)

    def top(self, x):
        import torch

        self._check(x, self.over_in, "top MLP input")
        with torch.inference_mode():
            return self.module.over_arch(x)

    def forward_pooled(self, dense, pooled: Sequence):
        """Logits [B, 1] from dense features and the pooled [B, dim] embedding of each feature
        (torchrec's feature order)."""
        self._check(dense, self.dense_in, "dense features")
        return self.interact_top(self.bottom(dense), pooled)

    def interact_top(self, embedded_dense, pooled: Sequence):
        """Logits from the bottom MLP's output and the pooled embeddings: interaction + top MLP."""
        import torch

        with torch.inference_mode():
            sparse = torch.stack([torch.as_tensor(p) for p in pooled], dim=1)  # [B, F, D]
            x = self.module.inter_arch(dense_features=embedded_dense, sparse_features=sparse)
            return self.module.over_arch(x)

    def _check(self, x, width: int, what: str) -> None:
        if x.dim() != 2 or x.shape[1] != width:
            raise SchemaError(f"model '{self.name}': {what} must be [B, {width}], got {list(x.shape)}")

    def info(self) -> dict:
        return dict(name=self.name, config=self.config, parameters=int(self.parameters),
                    features=[f for f, _, _ in self.features])
