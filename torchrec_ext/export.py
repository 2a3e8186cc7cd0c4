"""Trained embedding tables -> the store (``export_tables``).

A table's weight is found in a model or state dict by its TorchRec name
(``...embedding_bags.<table>.weight``) and written with ``EmbeddingStore.load_table``: bulk
load, then compaction into packed pages in row order (row addresses computed, not looked up)
with the 512-byte block checksums taken, so the first vector-grained lookup is verified.
"""

from __future__ import annotations

import os
from typing import Dict, Iterable, Mapping, Optional, Union

import numpy as np
import torch
from torch import nn

from recflash.reader.errors import InvalidArgumentError, SchemaError, UnknownFeatureError

ROW_DTYPES = ("float32", "float16", "int8")


def _weights_of(model_or_state_dict) -> Mapping[str, torch.Tensor]:
    if isinstance(model_or_state_dict, nn.Module):
        return model_or_state_dict.state_dict()
    if isinstance(model_or_state_dict, Mapping):
        return model_or_state_dict
    raise InvalidArgumentError(f"export_tables needs a torch module or a state dict, got "
                               f"{type(model_or_state_dict).__name__}")


def find_table_weight(state: Mapping[str, torch.Tensor], table: str) -> torch.Tensor:
    """The weight of TorchRec table `table` in a state dict (one match, any prefix)."""
    suffix = f"embedding_bags.{table}.weight"
    keys = [k for k in state if k == suffix or k.endswith("." + suffix)]
    if not keys:
        have = sorted({k.split("embedding_bags.", 1)[1].rsplit(".", 1)[0] for k in state
                       if "embedding_bags." in k and k.endswith(".weight")})
        raise UnknownFeatureError(f"no embedding table '{table}' in the model (tables: {', '.join(have) or 'none'})")
    if len(keys) > 1:
        raise InvalidArgumentError(f"table '{table}' is ambiguous in the model: {', '.join(keys)}")
    w = state[keys[0]]
    if hasattr(w, "local_shards"):
        raise InvalidArgumentError(f"table '{table}' is sharded in this model ({keys[0]}): export from the "
                                   f"unsharded model or its state dict")
    if w.device.type == "meta":
        raise InvalidArgumentError(f"table '{table}' is on the meta device in this model: it has no weights "
                                   f"to export (load a trained checkpoint, or export from its state dict)")
    return w


def export_tables(model_or_state_dict: Union[nn.Module, Mapping[str, torch.Tensor]], store_path: Union[str, os.PathLike],
                  tables: Optional[Iterable[str]] = None, dtype: Union[str, Dict[str, str]] = "float32",
                  progress: bool = True) -> Dict[str, dict]:
    """Writes the listed tables' trained weights into the embedding store at `store_path`.

    ``tables``: TorchRec table names (all tables of the model when None). ``dtype``: row format
    in the store, ``float32`` (exact), ``float16`` or ``int8`` (FBGEMM's row-wise layout with a
    per-row scale and bias), one for all tables or a dict per table. Creates the store when
    needed; a table that exists must have the same shape and row format. Returns, per table,
    rows, dim, dtype and the bytes a row takes in the store.
    """
    from recflash.ndp import EmbeddingStore
    from recflash.reader import Store, StoreOptions

    state = _weights_of(model_or_state_dict)
    if tables is None:
        tables = sorted({k.split("embedding_bags.", 1)[1].rsplit(".", 1)[0] for k in state
                         if "embedding_bags." in k and k.endswith(".weight")})
    tables = list(tables)
    if not tables:
        raise InvalidArgumentError("export_tables: no tables to export")
    weights = {t: find_table_weight(state, t) for t in tables}
    dtypes = {t: (dtype.get(t, "float32") if isinstance(dtype, dict) else dtype) for t in tables}
    for t, d in dtypes.items():
        if d not in ROW_DTYPES:
            raise InvalidArgumentError(f"table '{t}': row dtype must be one of {', '.join(ROW_DTYPES)}, got {d!r}")
    for t, w in weights.items():
        if w.dim() != 2 or not torch.is_floating_point(w):
            raise SchemaError(f"table '{t}': expected a 2-D float weight, got {tuple(w.shape)} {w.dtype}")
    out = {}
    # Bulk-load mode: the rows go to pages without a WAL copy (load_table's compact() and the
    # final sync are the durability points), as `recflash import` writes.
    with Store.open(os.fspath(store_path), StoreOptions(bulk_load=True)) as store:
        emb = EmbeddingStore(store)
        for t in tables:
            w = weights[t].detach().to("cpu", torch.float32)
            rows, dim = w.shape
            info = emb.create_table(t, num_rows=rows, dim=dim, dtype=dtypes[t])
            emb.load_table(t, w.numpy() if w.is_contiguous() else np.ascontiguousarray(w.numpy()), progress=progress)
            out[t] = {"rows": rows, "dim": dim, "dtype": info.dtype, "row_bytes": info.row_bytes}
        store.sync()
    return out
