"""Shared pieces of the TorchRec tests; importable by spawned rank processes."""

from __future__ import annotations

import os
import socket
import tempfile
from typing import Dict, List, Optional, Sequence

import numpy as np
import torch
import torch.distributed as dist

from torchrec import EmbeddingBagCollection, EmbeddingBagConfig, KeyedJaggedTensor, PoolingType

TABLES = [  # name, rows, dim, features
    ("user", 5000, 16, ["user_id"]),
    ("item", 3000, 8, ["item_id", "item_hist"]),   # one table, two features
    ("cat", 200, 4, ["category"]),
    ("geo", 1000, 12, ["geo_id"]),
]
FEATURES = [f for _, _, _, fs in TABLES for f in fs]


def table_configs(pooling: str = "sum", tables=TABLES) -> List[EmbeddingBagConfig]:
    p = PoolingType.MEAN if pooling == "mean" else PoolingType.SUM
    return [EmbeddingBagConfig(name=n, num_embeddings=r, embedding_dim=d, feature_names=list(fs), pooling=p)
            for n, r, d, fs in tables]


def reference_ebc(pooling: str = "sum", weighted: bool = False, seed: int = 0, tables=TABLES) -> EmbeddingBagCollection:
    torch.manual_seed(seed)
    ebc = EmbeddingBagCollection(tables=table_configs(pooling, tables), is_weighted=weighted, device=torch.device("cpu"))
    with torch.no_grad():
        for p in ebc.parameters():
            p.uniform_(-1.0, 1.0)
    return ebc


def make_kjt(batch: int, seed: int, weighted: bool = False, tables=TABLES, max_len: int = 6) -> KeyedJaggedTensor:
    g = torch.Generator().manual_seed(seed)
    keys, lengths, values = [], [], []
    for _, rows, _, fs in tables:
        for f in fs:
            ln = torch.randint(0, max_len + 1, (batch,), generator=g)
            keys.append(f)
            lengths.append(ln)
            values.append(torch.randint(0, rows, (int(ln.sum()),), generator=g))
    lengths = torch.cat(lengths)
    values = torch.cat(values)
    weights = torch.rand(values.numel(), generator=g) if weighted else None
    return KeyedJaggedTensor.from_lengths_sync(keys=keys, values=values, lengths=lengths, weights=weights)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def init_single_rank() -> None:
    """A one-rank gloo process group for tests that run in the pytest process."""
    if dist.is_initialized():
        return
    store = dist.FileStore(tempfile.mktemp(prefix="recflash-pg-"), 1)
    dist.init_process_group("gloo", store=store, rank=0, world_size=1)


def shard(model, plan, store_path, **sls_options):
    from torchrec.distributed.model_parallel import DistributedModelParallel

    from recflash.torchrec_ext import SsdEmbeddingBagCollectionSharder

    return DistributedModelParallel(model, device=torch.device("cpu"), plan=plan,
                                    sharders=[SsdEmbeddingBagCollectionSharder(store_path, **sls_options)])


def forward_dict(module, kjt) -> Dict[str, np.ndarray]:
    out = module(kjt)
    if hasattr(out, "wait"):
        out = out.wait()
    return {k: out[k].detach().numpy().copy() for k in out.keys()}


def sharded_rank_run(rank: int, world_size: int, store_path: str, ssd_tables: Sequence[str], pooling: str,
                     weighted: bool, batch: int, seeds: Sequence[int]) -> Dict[str, float]:
    """One rank: shard a meta-device EBC with SSD and DRAM tables, load the DRAM weights, run
    batches, and return the largest difference from the unsharded reference per feature."""
    from torchrec.distributed.test_utils.multi_process import MultiProcessContext

    from recflash.torchrec_ext import close_backends, plan_offload

    with MultiProcessContext(rank, world_size, "gloo", use_deterministic_algorithms=False):
        ref = reference_ebc(pooling, weighted)
        model = EmbeddingBagCollection(tables=table_configs(pooling), is_weighted=weighted, device=torch.device("meta"))
        plan = plan_offload(model, world_size=world_size, ssd_tables=list(ssd_tables), print_table=False)
        dmp = shard(model, plan, store_path)
        state = {k: v for k, v in ref.state_dict().items() if not any(f".{t}." in k for t in ssd_tables)}
        dmp.load_state_dict(state, strict=False)
        diffs: Dict[str, float] = {}
        for s in seeds:
            kjt = make_kjt(batch, seed=1000 * s + rank, weighted=weighted)
            got, exp = forward_dict(dmp, kjt), forward_dict(ref, kjt)
            for k in exp:
                diffs[k] = max(diffs.get(k, 0.0), float(np.abs(got[k] - exp[k]).max()))
        ranks = {t: list(plan.plan[""][t].ranks) for t in ssd_tables}
        close_backends()
        return {"diffs": diffs, "ranks": ranks}


def env_for_spawn() -> None:
    os.environ.setdefault("GLOO_SOCKET_IFNAME", "lo")
