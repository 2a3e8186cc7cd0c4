"""recflash.torchrec_ext — TorchRec inference with SSD-offloaded embedding tables.

    export_tables(trained_model, "/data/emb_store", tables=["user_id", "item_id"])
    plan = plan_offload(model, world_size=1, ssd_tables=["user_id", "item_id"])
    dmp = DistributedModelParallel(model, device=torch.device("cpu"), plan=plan,
                                   sharders=[SsdEmbeddingBagCollectionSharder("/data/emb_store")])

Tables the plan puts on ``CUSTOMIZED_KERNEL`` run through recflash's SLS engine (or an NDP device
server); the rest keep TorchRec's CPU kernels. See ``sharding.py`` for the chain, ``planner.py``
for the DRAM/SSD tiering, ``quant.py`` for TorchRec's quantized inference path.
"""

from recflash.torchrec_ext.backend import close_backends, open_backend  # noqa: F401
from recflash.torchrec_ext.export import export_tables  # noqa: F401
from recflash.torchrec_ext.sharding import (SSD_KERNEL, ShardedSsdEmbeddingBagCollection,  # noqa: F401
                                            SsdEmbeddingBagCollectionSharder, find_ssd_modules, update_rows)
from recflash.torchrec_ext.planner import (OffloadPlan, TieringReport, engine_dram_bytes,  # noqa: F401
                                           measure_device_iops, plan_offload, plan_quant_offload, ssd_resident_bytes,
                                           stored_row_bytes, tier_tables)
from recflash.torchrec_ext.quant import (SsdQuantEmbeddingBag, export_quantized_tables,  # noqa: F401
                                         shard_quant_model_with_ssd)
