"""recflash.reader — the READER store: key-value items grouped by feature on an SSD.

>>> from recflash.reader import Store, StoreOptions
>>> with Store.open("/data/store", StoreOptions()) as store:
...     store.create_feature("rating", "float32")
...     store.put("rating", keys, values)
...     table = store.scan("rating")
"""

from recflash.reader.errors import (  # noqa: F401
    CorruptionError,
    DiskFullError,
    FeatureExistsError,
    InvalidArgumentError,
    NotAStoreError,
    ReadOnlyError,
    RecflashError,
    SchemaError,
    StaleSnapshotError,
    StoreClosedError,
    StoreLockedError,
    UnknownFeatureError,
    ValueTooLargeError,
)
from recflash.reader.store import Store, StoreOptions  # noqa: F401

__all__ = [
    "Store",
    "StoreOptions",
    "RecflashError",
    "UnknownFeatureError",
    "FeatureExistsError",
    "SchemaError",
    "InvalidArgumentError",
    "ValueTooLargeError",
    "NotAStoreError",
    "CorruptionError",
    "StoreLockedError",
    "StoreClosedError",
    "ReadOnlyError",
    "StaleSnapshotError",
    "DiskFullError",
]
