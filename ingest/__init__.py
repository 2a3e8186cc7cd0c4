"""recflash.ingest — the `recflash import` CLI, Arrow conversion, preprocessing to TorchRec batches and Ray Data loaders over a store."""
