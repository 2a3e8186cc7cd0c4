"""Where an SSD-offloaded table's lookups go: an embedded store or an NDP device server.

The sharder reaches SSD tables through one small surface, the *SLS backend*:

    sls(requests) -> list of pooled [B, dim] float32      (recflash.ndp.SlsEngine.sls semantics)
    info(table) -> TableInfo, tables() -> {name: TableInfo}
    read_rows(table, ids) -> [n, dim] float32, update_rows(table, ids, rows)
    cache_stats() -> dict, last_stats (dict), close()

`EmbeddedBackend` opens the store in this process and runs `SlsEngine` on it; a device address
(``unix:PATH``, ``HOST:PORT`` or a ready ``recflash.ndp.DeviceClient``) is served by the NDP
device server instead, so the same sharding plan runs either way.

Backends are shared per process: every sharded module (and every group of one) that names the
same store on the same rank uses one store handle and one engine, so its caches are shared and
the store is opened once.
"""

from __future__ import annotations

import os
import re
import threading
from typing import Dict, Optional, Tuple

import numpy as np

from recflash import _native
from recflash.reader.errors import InvalidArgumentError, NotAStoreError, RecflashError

# SlsEngine's cache options, accepted by the sharder as **sls_options: the engine's own list
# (recflash._native.SLS_OPTION_NAMES) less what SlsEngine derives itself.
SLS_OPTION_NAMES = tuple(n for n in _native.SLS_OPTION_NAMES if n != "expected_tables")
# Options of the backend itself (not passed to the engine).
BACKEND_OPTION_NAMES = ("writable", "token", "timeout")

_ADDRESS = re.compile(r"^(unix:|unix-abstract:|dns:|ipv4:|ipv6:|grpc://)|^[A-Za-z0-9_.\-\[\]:]+:\d+$")


def is_device_address(location) -> bool:
    """True for a device server address (``unix:PATH``, ``HOST:PORT``) or a client object."""
    if not isinstance(location, (str, os.PathLike)):
        return hasattr(location, "sls")
    s = os.fspath(location)
    return bool(_ADDRESS.match(s)) and not os.path.exists(s)


def resolve_location(location, rank: int):
    """``{rank}`` in a store path or address becomes this process's rank."""
    if isinstance(location, (str, os.PathLike)):
        s = os.fspath(location)
        return s.replace("{rank}", str(rank)) if "{rank}" in s else s
    return location


def check_sls_options(options: dict) -> None:
    unknown = sorted(set(options) - set(SLS_OPTION_NAMES) - set(BACKEND_OPTION_NAMES))
    if unknown:
        raise InvalidArgumentError(
            f"unknown SSD table option(s) {', '.join(map(repr, unknown))}; the SLS engine takes "
            f"{', '.join(SLS_OPTION_NAMES)} (and the backend {', '.join(BACKEND_OPTION_NAMES)})")


class EmbeddedBackend:
    """A store opened in this process plus an `SlsEngine` over its tables."""

    def __init__(self, path: str, writable: bool, sls_options: dict):
        from recflash.ndp import EmbeddingStore, SlsEngine
        from recflash.reader import Store

        if not os.path.isdir(path):
            raise NotAStoreError(f"embedding store '{path}' does not exist (export the tables with "
                                 f"recflash.torchrec_ext.export_tables first)")
        self.path = path
        self.writable = writable
        self.store = Store.open(path, read_only=not writable)
        self._sls_options = dict(sls_options)
        try:
            self.tables_ = EmbeddingStore(self.store)
            self.engine = SlsEngine(self.tables_, **sls_options)
        except BaseException:
            self.store.close()
            raise
        self._mu = threading.Lock()  # one engine call at a time (its caches are not thread-safe)

    # -- the SLS backend surface -------------------------------------------------------------
    def sls(self, requests):
        with self._mu:
            return self.engine.sls(requests)

    @property
    def last_stats(self) -> dict:
        return self.engine.last_stats

    def info(self, table: str):
        return self.tables_.info(table)

    def tables(self):
        return self.tables_.tables()

    def read_rows(self, table: str, ids) -> np.ndarray:
        with self._mu:
            return self.tables_.read_rows(table, ids)

    def load_table(self, table: str, weight) -> None:
        """Every row of `table` at once (a checkpoint load): bulk load + compaction into the packed
        layout, then fresh caches."""
        from recflash.ndp import SlsEngine

        self._check_writable(table)
        with self._mu:
            self.tables_.load_table(table, weight, progress=False)
            self.engine = SlsEngine(self.tables_, **self._sls_options)  # no cached row survives

    def update_rows(self, table: str, ids, rows) -> None:
        self._check_writable(table)
        with self._mu:
            self.tables_.update_rows(table, ids, rows)
            self.store.sync()

    def _check_writable(self, table: str) -> None:
        if not self.writable:
            raise RecflashError(
                f"cannot update table '{table}': the store '{self.path}' is open read-only in this "
                f"process (a plain store path shared by several ranks is opened read-only by each "
                f"of them). Use a store per rank ('{{rank}}' in the path), a device "
                f"server (the only writer), or writable=True when one process serves the store")

    def cache_stats(self) -> dict:
        return self.engine.cache_stats()

    def close(self) -> None:
        self.store.close()


_registry: Dict[Tuple, object] = {}
_registry_mu = threading.Lock()


def open_backend(location, rank: int, world_size: int, sls_options: Optional[dict] = None):
    """The backend for `location` on `rank`, shared by every caller in this process.

    A plain store path is opened read-only when several ranks share it (each rank of a host
    opens the same store) and read-write when one process serves it or the path holds
    ``{rank}`` (a store per rank); ``writable=`` overrides.
    """
    opts = dict(sls_options or {})
    check_sls_options(opts)
    if not isinstance(location, (str, os.PathLike)) and hasattr(location, "sls"):
        return location  # a ready client or backend
    per_rank = isinstance(location, (str, os.PathLike)) and "{rank}" in os.fspath(location)
    loc = resolve_location(location, rank)
    writable = opts.pop("writable", None)
    token = opts.pop("token", None)
    timeout = opts.pop("timeout", None)
    key = (loc, tuple(sorted(opts.items())))
    with _registry_mu:
        b = _registry.get(key)
        if b is not None:
            return b
        if is_device_address(loc):
            try:
                from recflash.ndp import DeviceClient  # the NDP device server's client
            except ImportError as e:
                raise RecflashError(f"'{loc}' is a device address, but this build has no NDP device "
                                    f"client ({e})") from None
            kw = {} if timeout is None else {"timeout": timeout}
            b = DeviceClient(loc, token=token, **kw)
        else:
            if writable is None:
                writable = per_rank or world_size == 1
            b = EmbeddedBackend(os.path.abspath(loc), bool(writable), opts)
        _registry[key] = b
        return b


def close_backends() -> None:
    """Closes every backend this process opened (tests, and a server shutting down)."""
    with _registry_mu:
        for b in _registry.values():
            try:
                b.close()
            except Exception:  # noqa: BLE001 - closing is best effort at shutdown
                pass
        _registry.clear()
