"""recflash.ndp — near-data processing: embedding tables in the store, SLS/MLP offload, row and pooled caches, the device server."""

from recflash.ndp.embedding import EmbeddingStore, TableInfo  # noqa: E402,F401
from recflash.ndp.sls import SlsEngine, SlsRequest  # noqa: E402,F401


def __getattr__(name):
    # The device client pulls in grpc: load it only when asked for.
    if name in ("DeviceClient", "DeviceError", "DeviceUnavailableError", "DeviceAuthError"):
        from recflash.ndp import client

        return getattr(client, name)
    if name == "NdpServer":
        from recflash.ndp.server import NdpServer

        return NdpServer
    raise AttributeError(f"module 'recflash.ndp' has no attribute {name!r}")
