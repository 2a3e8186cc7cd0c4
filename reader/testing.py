"""Test-only controls of the engine: injected I/O errors, kill points, power-loss simulation.

Nothing here is product API. Every control is off unless armed, and costs the engine one
relaxed atomic load per I/O call while off.

>>> from recflash.reader import testing
>>> with testing.fault("wal_sync", nth=1, errno=errno.EIO):
...     store.sync()          # raises IOError_ naming fdatasync and the WAL file

Kinds (site classes): page_write, page_read, page_sync, wal_append, wal_sync, fallocate,
punch_hole, meta_commit, checkpoint_write, ring_submit, wal_open (a WAL file opened for replay;
errno=ENOENT there is a listed file retired before its open).
"""

from __future__ import annotations

import contextlib
import errno as _errno
from typing import Iterator

from recflash import _native

_t = _native._testing

KINDS: list[str] = list(_t.kinds())
KILL_POINTS: list[str] = list(_t.kill_points())


def arm(kind: str, nth: int = 1, errno: int = _errno.EIO, sticky: bool = False, path: str = "") -> None:
    """Fail the nth call (counted from now) of `kind` with `errno`; with sticky, every later
    call too (a disk that stays full). `path`: only calls on paths containing it count."""
    _t.arm(kind, nth, errno, sticky, path)


def disarm() -> None:
    """Disarm every fault and kill point, stop power-loss tracking, reset the counters."""
    _t.disarm()


def calls(kind: str) -> int:
    """Calls of `kind` counted while anything was armed."""
    return int(_t.calls(kind))


@contextlib.contextmanager
def fault(kind: str, nth: int = 1, errno: int = _errno.EIO, sticky: bool = False, path: str = "") -> Iterator[None]:
    arm(kind, nth, errno, sticky, path)
    try:
        yield
    finally:
        disarm()


def arm_kill_point(name: str, nth: int = 1, power_loss: bool = False, seed: int = 0) -> None:
    """Die at the nth hit of kill point `name` ("any": of any point): SIGKILL, or with
    power_loss a simulated power loss (unsynced data dropped or torn) and exit code 86."""
    _t.arm_kill_point(name, nth, power_loss, seed)


def kill_point_hits() -> dict[str, int]:
    return dict(_t.kill_point_hits())


def arm_pause_point(name: str) -> None:
    """Hold the first thread that reaches pause point `name` until release_pause() (or
    disarm()): a test makes a race happen by changing the store meanwhile. Points:
    "scan.before_index_copy" (a scan's reads are in flight, its key index snapshot not taken);
    "scan.after_index_snapshot" (the scan holds its key index snapshot, no page placed yet);
    "meta.read_only.before_log_listing" (a read-only open's RocksDB has read the metadata's
    MANIFEST and is about to list the logs to replay);
    "wal.replay.before_open" (an open listed the WAL files and is about to open one for replay)."""
    _t.arm_pause_point(name)


def wait_paused(timeout_s: float = 30.0) -> bool:
    """Wait until a thread is held at the armed pause point (False after the timeout)."""
    return bool(_t.wait_paused(timeout_s))


def release_pause() -> None:
    _t.release_pause()


def track_power_loss(on: bool = True, seed: int = 0) -> None:
    """Start remembering what is written and not yet durable (call before opening the store)."""
    _t.track_power_loss(on, seed)


def power_loss(exit_code: int = 86) -> None:
    """Simulate a power loss now: drop or tear everything not durable, then exit the process."""
    _t.power_loss(exit_code)


def status_to_string(code: int, message: str) -> str:
    return _t.status_to_string(code, message)


TestRing = _t.TestRing


def crc32c(data: bytes) -> int:
    """The engine's crc32c (Castagnoli) of `data`: for tests that craft file contents whose
    checksums must still hold."""
    return _t.crc32c(data)
