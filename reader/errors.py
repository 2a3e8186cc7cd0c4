"""Exceptions raised by the recflash store.

Every error names what was wrong and where (feature, key, page, path), so a user can act on
it without reading a traceback from inside the engine. All derive from :class:`RecflashError`.
"""


class RecflashError(Exception):
    """Base class of every recflash error."""


class UnknownFeatureError(RecflashError, KeyError):
    """A feature name that the store does not know."""

    def __str__(self) -> str:  # KeyError would quote the message
        return str(self.args[0]) if self.args else ""


class FeatureExistsError(RecflashError, ValueError):
    """create_feature() with a name that exists with a different type."""


class SchemaError(RecflashError, TypeError):
    """Values whose type or shape does not match the feature's declared type."""


class InvalidArgumentError(RecflashError, ValueError):
    """Bad arguments: length mismatch between keys and values, bad key range, bad option."""


class ValueTooLargeError(RecflashError, ValueError):
    """A single value that cannot fit into one page."""


class NotAStoreError(RecflashError):
    """The path exists but is not a recflash store (or was made with an incompatible format)."""


class CorruptionError(RecflashError):
    """On-disk data failed verification (page checksum, page identity, WAL record)."""


class StoreLockedError(RecflashError):
    """Another process (or another Store object) holds the store open for writing."""


class StoreClosedError(RecflashError):
    """An operation on a Store after close()."""


class ReadOnlyError(RecflashError):
    """A write (put, delete, flush, compact, create_feature, sync) on a store opened read-only."""


class StaleSnapshotError(RecflashError):
    """A read-only handle read a page that a writer rewrote or freed since the handle opened.
    Nothing wrong was returned; reopen the store (read-only again) to read the current data."""


class IOError_(RecflashError, OSError):
    """An operating-system I/O error from the engine (errno and path in the message)."""


class DiskFullError(IOError_):
    """The filesystem is full (ENOSPC): the write that hit it failed and the store refuses
    further writes until reopened. Everything synced before it stays readable."""


__all__ = [
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
    "IOError_",
    "DiskFullError",
    "ReadOnlyError",
    "StaleSnapshotError",
]


def _check_status_codes() -> None:
    """Every status code of the engine (one list, reader/csrc/status.h) names a class here: a
    code added on one side only fails at import instead of raising the wrong class later."""
    try:
        from recflash import _native
    except ImportError:  # no engine (e.g. a CLI reporting that): nothing to check against
        return
    for code, name, cls_name in _native.STATUS_CODES:
        cls = globals().get(cls_name)
        if not (isinstance(cls, type) and issubclass(cls, RecflashError)):
            raise ImportError(f"the recflash engine's status code {name} ({code}) maps to {cls_name!r}, which "
                              f"recflash.reader.errors does not define: the engine and the Python package differ "
                              f"(rebuild with `make build`)")


_check_status_codes()
