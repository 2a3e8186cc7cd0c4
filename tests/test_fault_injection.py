"""Injected I/O errors and a full disk at every I/O site class of the engine.

For each site (page write, page read, page sync, WAL append, WAL sync, fallocate, punch hole,
RocksDB metadata commit, checkpoint write, io_uring submit) and errno (EIO, ENOSPC) the
failing call raises a clear RecflashError subclass naming the operation and the path
(DiskFullError for ENOSPC), nothing acknowledged (synced) is lost, a write error leaves the
store refusing further writes (as RocksDB does) with the same error, and after the fault
clears the store reopens with every synced item. A WAL file missing at its open for replay
(ENOENT) is a stale snapshot for a read-only open and an I/O error for a writable one.
"""

from __future__ import annotations

import errno
import os
import re

import numpy as np
import pytest

from recflash.reader import DiskFullError, RecflashError, StaleSnapshotError, Store, StoreOptions, testing
from recflash.reader.errors import IOError_
from storeutil import small_options

N = 3000


@pytest.fixture(autouse=True)
def _disarm():
    testing.disarm()
    yield
    testing.disarm()


def _opts(**kw):
    # merges and reclamation stay on: they are part of what a flush does
    return small_options(write_buffer_bytes=1 << 20, **kw)


def _bin(keys, tag):
    return [f"{tag}:{int(k)}".encode() for k in keys]


def _populate(path):
    """A store holding synced items: ints 0..N-1 (value = 3k) and binaries (k even)."""
    s = Store.open(path, _opts())
    s.create_feature("i", "int64")
    s.create_feature("b", "binary")
    keys = np.arange(N, dtype=np.uint64)
    s.put("i", keys, (keys * 3).astype(np.int64))
    bk = keys[::2]
    s.put("b", bk, _bin(bk, "v0"))
    s.sync()
    model_i = {int(k): int(k) * 3 for k in keys}
    model_b = {int(k): f"v0:{int(k)}".encode() for k in bk}
    return s, model_i, model_b


def _check(path, model_i, model_b, maybe_i=None, maybe_b=None):
    """Every acknowledged item with its value; anything else only from the unacknowledged call."""
    maybe_i, maybe_b = maybe_i or {}, maybe_b or {}
    with Store.open(path, _opts()) as s:
        for feat, model, maybe in (("i", model_i, maybe_i), ("b", model_b, maybe_b)):
            t = s.scan(feat)
            keys = t.column("key").to_numpy().astype(np.uint64)
            assert np.all(np.diff(keys.astype(np.float64)) > 0) or len(keys) < 2
            got = dict(zip((int(k) for k in keys), t.column("value").to_pylist()))
            for k, v in model.items():
                assert k in got or k in maybe, f"{feat}: acknowledged key {k} lost"
                assert got.get(k) == v or (k in maybe and got.get(k, None) in (maybe[k], None)), \
                    f"{feat}: key {k} = {got.get(k)!r}, acknowledged {v!r}"
            for k, v in got.items():
                assert k in model or k in maybe, f"{feat}: key {k} resurrected or invented"
                if k not in model:
                    assert v == maybe[k]
        st = s.stats()
        return st


def _expect(kind, err, fn, words):
    with pytest.raises(RecflashError) as ei:
        fn()
    e = ei.value
    assert isinstance(e, IOError_), repr(e)
    if err == errno.ENOSPC:
        assert isinstance(e, DiskFullError), repr(e)
    assert e.errno == err
    msg = str(e)
    for w in words:
        assert w in msg, f"{kind}: '{w}' not in {msg!r}"
    return e


# (kind, path fragment named in the message, operation word in the message)
WRITE_SITES = [
    ("wal_append", "/wal/", "write"),
    ("wal_sync", "/wal/", "fdatasync"),
    ("page_write", "pages.dat", "write of pages"),
    ("page_sync", "pages.dat", "fdatasync"),
    ("fallocate", "pages.dat", "fallocate"),
    ("meta_commit", "meta", "metadata commit"),
]


@pytest.mark.parametrize("err", [errno.EIO, errno.ENOSPC], ids=["EIO", "ENOSPC"])
@pytest.mark.parametrize("kind,where,op", WRITE_SITES, ids=[w[0] for w in WRITE_SITES])
def test_write_fault(store_path, kind, where, op, err):
    s, mi, mb = _populate(store_path)
    new = np.arange(N, N + 500, dtype=np.uint64)
    maybe_i = {int(k): int(k) * 3 for k in new}
    testing.arm(kind, nth=1, errno=err, sticky=(err == errno.ENOSPC))  # a full disk stays full
    if kind in ("wal_append", "wal_sync"):
        def action():
            s.put("i", new, (new * 3).astype(np.int64))
            s.sync()
    else:
        s.put("i", new, (new * 3).astype(np.int64))

        def action():
            s.flush()
    e = _expect(kind, err, action, [where, op])
    assert testing.calls(kind) >= 1
    testing.disarm()
    # The store refuses further writes with the same error until reopened.
    with pytest.raises(type(e)) as again:
        s.put("i", np.array([N + 9999], dtype=np.uint64), np.array([1], dtype=np.int64))
        s.sync()
    assert str(again.value) == str(e)
    # Reads still answer from what is there.
    assert s.get("i", np.array([0, 7], dtype=np.uint64)).to_pylist() == [0, 21]
    s.close()
    _check(store_path, mi, mb, maybe_i)


def test_fallocate_fault_is_reached(store_path):
    # fallocate runs when the page file grows; the first flush of a new store grows it.
    s, mi, mb = _populate(store_path)
    testing.arm("fallocate", nth=1, errno=errno.ENOSPC, sticky=True)
    with pytest.raises(DiskFullError):
        s.flush()
    assert testing.calls("fallocate") == 2  # the allocation ahead, then exactly what is needed
    testing.disarm()
    s.close()
    _check(store_path, mi, mb)


def test_fallocate_ahead_falls_back_to_what_is_needed(store_path):
    # No room for the allocation ahead, room for the flush's pages: the flush succeeds.
    s, mi, mb = _populate(store_path)
    testing.arm("fallocate", nth=1, errno=errno.ENOSPC)
    s.flush()
    assert testing.calls("fallocate") == 2
    s.close()
    _check(store_path, mi, mb)


@pytest.mark.parametrize("reserve", [0.0, None], ids=["punched-at-flush", "punched-at-close"])
def test_punch_hole_failure_is_counted_not_fatal(store_path, reserve):
    s, mi, mb = _populate(store_path)
    s.flush()
    if reserve is not None:  # freed slots punched by the flush that frees them
        s.close()
        s = Store.open(store_path, _opts(free_reserve_buffers=reserve))
    testing.arm("punch_hole", nth=1, errno=errno.EIO, sticky=True)
    # Overwrite everything twice: the old pages are freed (and punched, or kept for reuse).
    for r in (1, 2):
        keys = np.arange(N, dtype=np.uint64)
        s.put("i", keys, (keys * 3 + r).astype(np.int64))
        s.flush()
        mi = {int(k): int(k) * 3 + r for k in keys}
    if reserve is not None:
        assert testing.calls("punch_hole") >= 1
        assert s.stats()["punch_failures"] >= 1
    else:  # the default reserve keeps the freed slots; close() punches them, and fails to
        assert s.stats()["kept_free_slots"] > 0
    s.close()
    assert testing.calls("punch_hole") >= 1
    testing.disarm()
    _check(store_path, mi, mb)


@pytest.mark.parametrize("err", [errno.EIO, errno.ENOSPC], ids=["EIO", "ENOSPC"])
def test_checkpoint_write_fault(store_path, err):
    s, mi, mb = _populate(store_path)
    testing.arm("checkpoint_write", nth=1, errno=err, path="CHECKPOINT")
    _expect("checkpoint_write", err, s.close, ["CHECKPOINT.tmp", "write"])
    testing.disarm()
    st = _check(store_path, mi, mb)
    assert st["opened_from_checkpoint"] in (False, 0)


@pytest.mark.parametrize("kind,words", [("page_read", ["read of pages", "pages.dat"]),
                                        ("ring_submit", ["io_uring_submit", "pages.dat"])])
def test_read_fault(store_path, kind, words):
    s, mi, mb = _populate(store_path)
    s.close()
    s = Store.open(store_path, _opts())
    testing.arm(kind, nth=1, errno=errno.EIO)
    _expect(kind, errno.EIO, lambda: s.scan("i"), words)
    testing.disarm()
    # A read error is not sticky: the next read returns the right values.
    t = s.scan("i")
    assert t.column("value").to_pylist() == [mi[k] for k in sorted(mi)]
    s.put("i", np.array([1], dtype=np.uint64), np.array([5], dtype=np.int64))
    s.sync()
    mi[1] = 5
    s.close()
    _check(store_path, mi, mb)


def _wal_file_named(msg, store_path):
    """The WAL file path an error message names (it must name one of the store's)."""
    m = re.search(re.escape(os.path.join(store_path, "wal")) + r"/\d+\.log", msg)
    assert m, f"no WAL file of {store_path} named in {msg!r}"
    return m.group(0)


def test_wal_file_gone_at_its_open_is_stale_for_a_read_only_open(store_path):
    """A WAL file the open listed but cannot open for replay (ENOENT: a writer retired it in
    between) makes a read-only open's snapshot stale: StaleSnapshotError naming the file, after
    the engine's own reopens; one such miss is absorbed by them. A writable open holds the LOCK
    (nobody else may retire its files): there the same miss stays an I/O error, not Stale."""
    s, mi, mb = _populate(store_path)  # the writer stays open: its synced items are only in the WAL
    testing.arm("wal_open", nth=1, errno=errno.ENOENT, sticky=True, path="/wal/")
    with pytest.raises(StaleSnapshotError) as ei:
        Store.open(store_path, StoreOptions(read_only=True))
    msg = str(ei.value)
    assert not isinstance(ei.value, IOError_), repr(ei.value)
    wal = _wal_file_named(msg, store_path)
    assert os.path.exists(wal)  # only hidden from the open by the fault
    assert "read-only open" in msg and "retired it during the open" in msg and "reopen" in msg, msg
    assert testing.calls("wal_open") > 1  # the engine reopened before giving up
    testing.disarm()
    # Gone at one open only: the engine's reopen reads the (here unchanged) newer state.
    testing.arm("wal_open", nth=1, errno=errno.ENOENT, path="/wal/")
    with Store.open(store_path, StoreOptions(read_only=True)) as r:
        t = r.scan("i")
        assert t.column("value").to_pylist() == [mi[k] for k in sorted(mi)]
    assert testing.calls("wal_open") >= 2
    testing.disarm()
    s.close()
    testing.arm("wal_open", nth=1, errno=errno.ENOENT, sticky=True, path="/wal/")
    with pytest.raises(IOError_) as ei:
        Store.open(store_path, _opts())
    assert not isinstance(ei.value, StaleSnapshotError) and ei.value.errno == errno.ENOENT, repr(ei.value)
    assert "open" in str(ei.value)
    _wal_file_named(str(ei.value), store_path)
    assert testing.calls("wal_open") == 1  # no reopen: a writable open is not retried
    testing.disarm()
    _check(store_path, mi, mb)


def test_faults_off_cost_nothing_observable(store_path):
    # Nothing armed: no call is counted (the hooks return after one atomic load).
    s, mi, mb = _populate(store_path)
    s.flush()
    s.close()
    assert all(testing.calls(k) == 0 for k in testing.KINDS)
    _check(store_path, mi, mb)


# Writes synced items and ends without close(): its WAL file keeps them, so the next session
# logs to a new file, which its first write records in the metadata.
_CRASHED_WRITER = r'''
import os, sys
import numpy as np
from recflash.reader import Store
from storeutil import small_options
s = Store.open(sys.argv[1], small_options(write_buffer_bytes=1 << 20))
s.create_feature("i", "int64")
s.create_feature("b", "binary")
keys = np.arange(int(sys.argv[2]), dtype=np.uint64)
s.put("i", keys, (keys * 3).astype(np.int64))
s.sync()
os._exit(0)
'''


@pytest.mark.parametrize("err", [errno.EIO, errno.ENOSPC], ids=["EIO", "ENOSPC"])
def test_failed_record_of_the_sessions_wal_file_fails_the_write_alone(store_path, err):
    """A session's first write commits its WAL file as the newest to the metadata before any
    record goes there. When that commit fails, the write fails with it (nothing was logged, so
    nothing is lost or half-written) and the store keeps taking writes: the next one records the
    file again. Every acknowledged item is there after a reopen."""
    import subprocess
    import sys

    env = dict(os.environ, PYTHONPATH=os.path.dirname(os.path.abspath(__file__)))
    subprocess.run([sys.executable, "-P", "-c", _CRASHED_WRITER, store_path, str(N)], check=True, timeout=120, env=env)
    wal = sorted(os.listdir(os.path.join(store_path, "wal")))
    s = Store.open(store_path, _opts())  # replays the crashed session's file, logs to a new one
    assert len(os.listdir(os.path.join(store_path, "wal"))) == len(wal) + 1
    new = np.arange(N, N + 100, dtype=np.uint64)
    testing.arm("meta_commit", nth=1, errno=err)
    _expect("meta_commit", err, lambda: s.put("i", new, (new * 3).astype(np.int64)), ["meta", "metadata commit"])
    assert testing.calls("meta_commit") == 1
    testing.disarm()
    assert s.get("i", new[:3]).to_pylist() == [None, None, None]  # the failed put left nothing
    assert s.get("i", np.array([0, 7], dtype=np.uint64)).to_pylist() == [0, 21]
    s.put("i", new, (new * 3).astype(np.int64))  # records the file, then logs
    s.sync()
    assert s.get("i", new[:3]).to_pylist() == [3 * N, 3 * N + 3, 3 * N + 6]
    s.close()
    _check(store_path, {k: 3 * k for k in range(N + 100)}, {})
