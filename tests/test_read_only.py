"""Read-only store handles: many readers (threads, processes) at once and alongside a writer,
snapshot semantics, stale-page detection, key ranges for splitting scans, and a WAL file a
writer retires while a read-only open replays the WAL."""

from __future__ import annotations

import errno
import multiprocessing as mp
import os

import numpy as np
import pyarrow as pa
import pytest

from recflash.reader import (NotAStoreError, ReadOnlyError, StaleSnapshotError, Store, StoreLockedError,
                             StoreOptions)


def _opts(**kw):
    return StoreOptions(page_size=4096, write_buffer_bytes=256 << 10, **kw)


def _fill(path, n=20000):
    s = Store.open(path, _opts())
    s.create_feature("a", "float32")
    s.create_feature("b", "int64")
    s.create_feature("h", "list<int64>")
    k = np.arange(n, dtype=np.uint64)
    s.put("a", k, k.astype(np.float32))
    s.put("b", k[::3], (k[::3] * 7).astype(np.int64))
    s.put("h", k[::5], pa.array([[int(x), int(x) + 1] for x in k[::5]], type=pa.list_(pa.int64())))
    s.flush()
    return s, k


def test_read_only_sees_pages_and_wal(store_path):
    w, k = _fill(store_path)
    w.put("a", k[:10], np.full(10, -1.0, np.float32))  # in the writer's buffer / WAL only
    w.delete("b", k[:3])
    w.sync()
    r = Store.open(store_path, read_only=True)  # alongside the writer: no StoreLockedError
    assert r.read_only
    feats = ["a", "b", "h"]
    assert r.scan_many(feats).equals(w.scan_many(feats))
    assert r.get("a", k[:12]).to_pylist() == w.get("a", k[:12]).to_pylist()
    r.close()
    w.close()


def test_read_only_refuses_writes_and_changes_nothing(store_path):
    w, k = _fill(store_path)
    w.close()
    assert os.path.exists(os.path.join(store_path, "CHECKPOINT"))
    before = sorted(os.listdir(store_path)), sorted(os.listdir(os.path.join(store_path, "wal")))
    r = Store.open(store_path, StoreOptions(read_only=True))
    for call in (lambda: r.put("a", k[:1], np.zeros(1, np.float32)), lambda: r.delete("a", k[:1]),
                 lambda: r.flush(), lambda: r.compact(), lambda: r.sync(),
                 lambda: r.create_feature("z", "float32")):
        with pytest.raises(ReadOnlyError, match="read-only"):
            call()
    assert r.scan("a").num_rows == len(k)
    r.close()
    assert (sorted(os.listdir(store_path)), sorted(os.listdir(os.path.join(store_path, "wal")))) == before
    # The checkpoint was left for the next writer: a clean writer reopen reads no pages.
    w = Store.open(store_path, _opts())
    assert w.stats()["opened_from_checkpoint"]
    w.close()


def test_read_only_needs_an_existing_store(tmp_path):
    with pytest.raises(NotAStoreError, match="read-only"):
        Store.open(str(tmp_path / "nothing"), read_only=True)
    assert not (tmp_path / "nothing").exists()


def test_writer_lock_still_exclusive(store_path):
    w, _ = _fill(store_path)
    r = Store.open(store_path, read_only=True)
    with pytest.raises(StoreLockedError):
        Store.open(store_path, _opts())
    r.close()
    w.close()


def test_rewritten_pages_raise_stale_then_reopen_reads_new_data(store_path):
    w, k = _fill(store_path)
    r = Store.open(store_path, read_only=True)
    old = r.scan("a")
    for i in range(3):  # updates + a full merge rewrite (and reuse) the pages r's snapshot names
        w.put("a", k, (k + 100 + i).astype(np.float32))
        w.flush()
    w.compact()
    w.put("b", k, k.astype(np.int64))
    w.flush()
    with pytest.raises(StaleSnapshotError) as e:
        r.scan_many(["a", "b"])
    assert store_path in str(e.value) and "reopen" in str(e.value)
    r.close()
    r = Store.open(store_path, read_only=True)
    new = r.scan("a")
    assert new.num_rows == old.num_rows
    assert np.array_equal(new.column("value").to_numpy(), (k + 102).astype(np.float32))
    r.close()
    w.close()


def test_key_ranges_and_open_ended_range(store_path):
    w, k = _fill(store_path)
    w.close()
    r = Store.open(store_path, read_only=True)
    kr = r.key_ranges("a")
    assert int(kr["items"].sum()) == len(k)
    assert kr["page"].dtype == np.uint32 and len(kr["page"]) == len(kr["min_key"])
    assert r.account_scan("a")["pages_read"] == len(np.unique(kr["page"]))
    assert np.all(np.diff(kr["min_key"].astype(np.int64)) > 0)
    assert np.all(kr["min_key"] <= kr["max_key"])
    cut = int(kr["min_key"][len(kr["min_key"]) // 2])
    lo = r.scan_many(["a", "b"], key_range=(0, cut))
    hi = r.scan_many(["a", "b"], key_range=(cut, None))
    assert pa.concat_tables([lo, hi]).equals(r.scan_many(["a", "b"]))
    r.close()


def _scan_in_child(path, q):
    r = Store.open(path, read_only=True)
    t = r.scan_many(["a", "b", "h"])
    q.put((t.num_rows, float(pa.compute.sum(t.column("a").cast(pa.float64())).as_py()), int(pa.compute.sum(t.column("b")).as_py())))
    r.close()


def test_two_processes_read_only_at_once(store_path):
    w, k = _fill(store_path)
    w.close()
    ctx = mp.get_context("spawn")
    q = ctx.Queue()
    ps = [ctx.Process(target=_scan_in_child, args=(store_path, q)) for _ in range(2)]
    for p in ps:
        p.start()
    got = [q.get(timeout=120) for _ in ps]
    for p in ps:
        p.join(timeout=60)
        assert p.exitcode == 0
    want = (len(k), float(k.astype(np.float64).sum()), int((k[::3] * 7).sum()))
    assert got == [want, want]


def _fragmented(path, n=20000, rounds=3, seed=7):
    """A store whose features' pages overlap (updates not merged away): scans need the
    index-guided merge. Returns the open writer and what a scan must return."""
    w = Store.open(path, _opts(merger_enabled=False))
    w.create_feature("a", "float32")
    w.create_feature("b", "int64")
    k = np.arange(n, dtype=np.uint64) * 5 + 1  # sparse keys: a dense run needs no index
    w.put("a", k, k.astype(np.float32))
    w.put("b", k, k.astype(np.int64))
    w.flush()
    rng = np.random.default_rng(seed)
    for r in range(rounds):
        u = np.sort(rng.choice(k, n // 10, replace=False))
        w.put("a", u, np.full(len(u), -1.0 - r, np.float32))
        w.put("b", u, (u * 10 + r).astype(np.int64))
        w.flush()
    w.delete("b", k[5:50:3])
    w.flush()
    return w, w.scan_many(["a", "b"])


def test_read_only_scans_take_the_index_from_a_matching_checkpoint(store_path):
    w, expected = _fragmented(store_path)
    assert w.stats()["items_exact"] is True  # a writer has its key index
    w.close()  # a clean close writes the checkpoint with every feature's key index
    r = Store.open(store_path, read_only=True)
    st0 = r.stats()
    assert st0["opened_from_checkpoint"] is False  # the open itself reads no index
    # counts are upper bounds until the index is in (stale records counted), and say so
    assert st0["items_exact"] is False and st0["live_items"] > len(expected)
    assert r.scan("a").equals(expected.select(["key", "a"]).rename_columns(["key", "value"]))
    assert r.scan_many(["a", "b"]).equals(expected)
    st = r.stats()
    assert st["opened_from_checkpoint"] is True
    assert st["items_exact"] is True and st["live_items"] == 2 * len(expected) - 15  # b lost 15 keys
    assert st["index_merges"] >= 3 and st["index_merge_fallbacks"] == 0
    assert r.get("b", np.arange(40, dtype=np.uint64)).equals(_get_reference(expected, "b", 40))
    r.close()


def _get_reference(table, feature, n):
    d = dict(zip(table.column("key").to_pylist(), table.column(feature).to_pylist()))
    return pa.array([d.get(i) for i in range(n)], type=table.schema.field(feature).type)


def test_read_only_scans_without_a_matching_checkpoint_merge_pages(store_path):
    w, expected = _fragmented(store_path)
    w.close()
    w = Store.open(store_path, _opts(merger_enabled=False))
    # A writer's first commit retires the checkpoint (its open alone keeps it, see
    # test_writer_that_commits_nothing_keeps_the_checkpoint).
    u = np.arange(2000, dtype=np.uint64) * 5 + 1  # more than the pinner keeps in DRAM
    w.put("a", u, np.full(len(u), 7.0, np.float32))
    w.flush()
    assert not os.path.exists(os.path.join(store_path, "CHECKPOINT"))
    assert w.stats()["checkpoint_current"] is False
    expected = w.scan_many(["a", "b"])
    r = Store.open(store_path, read_only=True)
    assert r.scan_many(["a", "b"]).equals(expected)
    st = r.stats()
    assert st["opened_from_checkpoint"] is False and st["index_merges"] == 0
    r.close()
    # A checkpoint of another state (the writer changed the store and closed after this
    # handle's open) is not taken either: the snapshot is what the handle reads.
    r = Store.open(store_path, read_only=True)
    w.put("a", np.arange(3, dtype=np.uint64), np.full(3, 9.0, np.float32))
    w.close()
    assert r.scan_many(["a", "b"]).equals(expected)
    assert r.stats()["opened_from_checkpoint"] is False
    r.close()


def test_read_only_threads_scan_while_the_checkpoint_index_loads(store_path):
    import threading

    w, expected = _fragmented(store_path)
    w.close()
    r = Store.open(store_path, read_only=True)
    results, errors = [], []
    start = threading.Barrier(4)

    def scan():
        try:
            start.wait()
            for _ in range(3):
                results.append(r.scan_many(["a", "b"]).equals(expected))
        except Exception as e:  # reported below, not lost in the thread
            errors.append(e)

    threads = [threading.Thread(target=scan) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors and len(results) == 12 and all(results)
    assert r.stats()["opened_from_checkpoint"] is True
    r.close()


# -- a WAL file retired between an open's listing of wal/ and its replay of that file ------------
def _wal_files(path):
    wal = os.path.join(path, "wal")
    return sorted(os.path.join(wal, f) for f in os.listdir(wal))


def _open_held_before_wal_replay(path, options, change):
    """Store.open(path, options) in a thread, held at the pause point where it has listed the
    WAL files and is about to open one for replay; `change()` runs meanwhile. Returns the store
    (or the exception the open raised) and how many WAL files the open(s) opened for replay."""
    import threading

    from recflash.reader import testing

    out = {}

    def run():
        try:
            out["store"] = Store.open(path, options)
        except BaseException as e:  # noqa: BLE001 - returned to the test
            out["err"] = e

    testing.disarm()
    testing.arm("wal_open", nth=1 << 40)  # counts the WAL files opened for replay, fails none
    testing.arm_pause_point("wal.replay.before_open")
    t = threading.Thread(target=run)
    try:
        t.start()
        assert testing.wait_paused(30), "the open never reached its WAL replay"
        change()
    finally:
        testing.release_pause()
        t.join(60)
        opened = testing.calls("wal_open")
        testing.disarm()
    assert not t.is_alive()
    return out.get("store", out.get("err")), opened


def test_wal_file_retired_by_the_writer_during_a_read_only_open(store_path):
    """The writer flushes (committing a new WAL start and deleting the file) while a read-only
    open has listed that file but not opened it yet. The open's snapshot is stale, not damaged:
    the engine reopens and returns the newer state (before, this was an IOError naming the
    vanished file)."""
    w, k = _fill(store_path)
    w.put("a", k[:10], np.full(10, -1.0, np.float32))  # only in the WAL file the open will list
    w.sync()
    listed = [f for f in _wal_files(store_path) if os.path.getsize(f)]
    assert len(listed) == 1, listed

    def writer_moves_on():
        w.put("a", k, np.full(len(k), -2.0, np.float32))  # enough to flush (a few items stay pinned)
        w.flush()  # pages committed past the listed file, which it then deletes
        assert not os.path.exists(listed[0])

    r, opened = _open_held_before_wal_replay(store_path, StoreOptions(read_only=True), writer_moves_on)
    assert isinstance(r, Store), repr(r)
    assert opened >= 2  # the vanished file, then the reopen's WAL
    assert r.get("a", k[:12]).to_pylist() == [-2.0] * 12  # the newer snapshot
    assert r.scan_many(["a", "b", "h"]).equals(w.scan_many(["a", "b", "h"]))
    r.close()
    w.close()


_WAL_ONLY_CHILD = r"""
import os, sys
import numpy as np
from recflash.reader import Store, StoreOptions
s = Store.open(sys.argv[1], StoreOptions(page_size=4096, write_buffer_bytes=256 << 10))
s.create_feature("x", "int64")
s.put("x", np.arange(100, dtype=np.uint64), np.zeros(100, np.int64))
s.flush()
s.put("x", np.arange(10, dtype=np.uint64), np.ones(10, np.int64))
s.sync()
os._exit(0)  # no close: the last put is only in the WAL, and no writer holds the LOCK
"""


@pytest.mark.parametrize("ro", [True, False], ids=["read-only", "writable"])
def test_wal_file_deleted_during_an_open_with_no_writer(store_path, ro):
    """The same file vanishing with no writer: a read-only open takes it as stale and reopens,
    and the reopen finds the metadata's first WAL file missing with nobody holding the LOCK,
    which stays CorruptionError (it was deleted with what it logged). A writable open holds the
    LOCK, so the vanished file is an I/O error naming it, never Stale."""
    import subprocess
    import sys

    from recflash.reader import CorruptionError
    from recflash.reader.errors import IOError_

    subprocess.run([sys.executable, "-P", "-c", _WAL_ONLY_CHILD, store_path], check=True, timeout=120)
    listed = [f for f in _wal_files(store_path) if os.path.getsize(f)]
    assert len(listed) == 1, listed
    err, opened = _open_held_before_wal_replay(store_path, _opts(read_only=ro), lambda: os.unlink(listed[0]))
    if ro:
        assert isinstance(err, CorruptionError) and not isinstance(err, StaleSnapshotError), repr(err)
        assert "it was deleted" in str(err) and listed[0] in str(err), str(err)
        assert opened == 1  # the reopen failed at its listing, before opening any file
    else:
        assert isinstance(err, IOError_) and not isinstance(err, StaleSnapshotError), repr(err)
        assert err.errno == errno.ENOENT and listed[0] in str(err), str(err)
        assert opened == 1
