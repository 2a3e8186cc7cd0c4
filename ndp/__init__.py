"""recflash.ndp — near-data processing: embedding tables in the store, SLS/MLP offload, row and pooled caches, the device server."""

from recflash.ndp.embedding import EmbeddingStore, TableInfo  # noqa: E402,F401
from recflash.ndp.sls import SlsEngine, SlsRequest  # noqa: E402,F401
