"""recflash.ingest — the `recflash import` CLI, Arrow conversion, preprocessing to TorchRec batches and Ray Data loaders over a store."""

# Lazy exports: importing recflash.ingest (the CLI does) must not import torch.
_EXPORTS = {
    "Preprocessor": "recflash.ingest.preprocess",
    "run_import": "recflash.ingest.importer",
    "ImportOptions": "recflash.ingest.importer",
    "ImportResult": "recflash.ingest.importer",
    "Interrupted": "recflash.ingest.importer",
    "BadInputError": "recflash.ingest.errors",
    "BadLine": "recflash.ingest.errors",
    "CriteoSource": "recflash.ingest.sources",
    "CsvSource": "recflash.ingest.sources",
    "ParquetSource": "recflash.ingest.sources",
    "ArrowSource": "recflash.ingest.sources",
    "SyntheticSource": "recflash.ingest.sources",
    "write_criteo_tsv": "recflash.ingest.synthetic",
}

__all__ = sorted(_EXPORTS)


def __getattr__(name):
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'recflash.ingest' has no attribute {name!r}")
    import importlib

    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value
