"""recflash.ndp — near-data processing: embedding tables in the store, SLS/MLP offload, row and pooled caches, the device server."""
