"""Every error of the contract: right class, a message naming what and where, and the store
keeps working (nothing synced lost) after the error."""

from __future__ import annotations

import os
import re
import subprocess
import sys

import numpy as np
import pyarrow as pa
import pytest

from recflash.reader import Store
from recflash.reader.errors import (CorruptionError, FeatureExistsError, InvalidArgumentError,
                                    NotAStoreError, RecflashError, SchemaError,
                                    StoreClosedError, StoreLockedError, UnknownFeatureError,
                                    ValueTooLargeError)
from storeutil import FSL_TYPE, PAGE_SIZE

U64 = np.uint64


def keys_of(*ks):
    return np.array(ks, dtype=U64)


@pytest.fixture
def store(open_store):
    s = open_store()
    s.create_feature("rating", "float32")
    s.create_feature("count", "int64")
    s.create_feature("hist", "list<int64>")
    s.create_feature("wts", "list<float32>")
    s.create_feature("emb", FSL_TYPE)
    s.create_feature("blob", "binary")
    s.put("rating", keys_of(1, 2, 3), np.array([1.0, 2.0, 3.0], dtype=np.float32))
    s.put("count", keys_of(1, 2), np.array([10, 20]))
    s.put("blob", keys_of(7), [b"seven"])
    s.sync()
    return s


def assert_intact(s):
    """The data written by the `store` fixture is all still there and the store accepts writes."""
    assert s.scan("rating").column("value").to_pylist() == [1.0, 2.0, 3.0]
    assert s.scan("count").column("value").to_pylist() == [10, 20]
    assert s.get("blob", keys_of(7)).to_pylist() == [b"seven"]
    s.put("count", keys_of(3), np.array([30]))
    s.flush()
    assert s.scan("count").column("value").to_pylist() == [10, 20, 30]


def test_error_hierarchy():
    for cls in (UnknownFeatureError, FeatureExistsError, SchemaError, InvalidArgumentError,
                ValueTooLargeError, NotAStoreError, CorruptionError, StoreLockedError,
                StoreClosedError):
        assert issubclass(cls, RecflashError)


# ----------------------------------------------------------------------------------------------
# unknown feature, schema, arguments


@pytest.mark.parametrize("op", ["put", "delete", "scan", "get", "scan_many", "scan_many_2"])
def test_unknown_feature(store, op):
    name = "no_such_feature_xyz"
    with pytest.raises(UnknownFeatureError) as ei:
        if op == "put":
            store.put(name, keys_of(1), np.array([1.0], dtype=np.float32))
        elif op == "delete":
            store.delete(name, keys_of(1))
        elif op == "scan":
            store.scan(name)
        elif op == "get":
            store.get(name, keys_of(1))
        elif op == "scan_many":
            store.scan_many([name])
        else:
            store.scan_many(["rating", name])
    assert name in str(ei.value)
    assert_intact(store)


@pytest.mark.parametrize("feature,values", [
    ("rating", ["a", "b"]),
    ("rating", np.array(["a", "b"])),
    ("rating", [[1.0], [2.0]]),
    ("rating", np.ones((2, 2), dtype=np.float32)),
    ("count", np.array([1.5, 2.5])),
    ("count", np.array([1.0, 2.0], dtype=np.float32)),
    ("emb", np.ones((2, 4), dtype=np.float32)),
    ("emb", np.ones((2, 9), dtype=np.float32)),
    ("emb", np.ones(2, dtype=np.float32)),
    ("emb", pa.FixedSizeListArray.from_arrays(pa.array(np.ones(8, dtype=np.float32)), 4)),
    ("hist", [[1.5], [2.7, 3.9]]),
    ("hist", [np.array([1.0, 2.5]), [1]]),
    ("hist", [["1"], ["2"]]),
    ("hist", [[True], [False]]),
    ("hist", [[2**64], [1]]),
], ids=["float-str-list", "float-str-array", "float-lists", "float-2d", "int-float64",
        "int-float32", "emb-dim4", "emb-dim9", "emb-1d", "emb-arrow-dim4", "intlist-pyfloats",
        "intlist-float-arrays", "intlist-strings", "intlist-bools", "intlist-overflow"])
def test_wrong_dtype_schema_error(store, feature, values):
    with pytest.raises(SchemaError) as ei:
        store.put(feature, keys_of(5, 6), values)
    assert feature in str(ei.value)
    assert_intact(store)
    assert store.get(feature, keys_of(5, 6)).null_count == 2  # nothing of the bad put applied


def test_length_mismatch(store):
    with pytest.raises(InvalidArgumentError) as ei:
        store.put("count", keys_of(5, 6, 7), np.array([1, 2]))
    assert "count" in str(ei.value)
    with pytest.raises(InvalidArgumentError):
        store.put("blob", keys_of(5), [b"a", b"b"])
    with pytest.raises(InvalidArgumentError):
        store.put("emb", keys_of(5, 6), np.ones((3, 8), dtype=np.float32))
    assert store.get("count", keys_of(5, 6, 7)).null_count == 3
    assert_intact(store)


@pytest.mark.parametrize("key_range", [(10, 5), (-1, 5), (1, 2, 3), ("a", "b")])
def test_bad_key_range(store, key_range):
    with pytest.raises(InvalidArgumentError):
        store.scan("rating", key_range=key_range)
    with pytest.raises(InvalidArgumentError):
        store.scan_many(["rating", "count"], key_range=key_range)
    assert_intact(store)


def test_keys_not_uint64_castable(store):
    with pytest.raises(InvalidArgumentError):
        store.put("count", np.array(["x", "y"]), np.array([1, 2]))
    with pytest.raises(InvalidArgumentError):
        store.get("count", np.array(["x"]))
    with pytest.raises(InvalidArgumentError):
        store.delete("count", np.array(["x"]))
    assert_intact(store)


def test_value_too_large(store):
    with pytest.raises(ValueTooLargeError) as ei:
        store.put("blob", keys_of(8, 9), [b"ok", b"z" * PAGE_SIZE])
    assert "blob" in str(ei.value)
    with pytest.raises(ValueTooLargeError):
        store.put("hist", keys_of(8), [list(range(PAGE_SIZE // 8 + 1))])
    with pytest.raises(ValueTooLargeError):
        store.create_feature("huge", "fixed_size_list<float32, 2048>")  # 8 KiB rows
        store.put("huge", keys_of(1), np.ones((1, 2048), dtype=np.float32))
    # the put is rejected as a whole
    assert store.get("blob", keys_of(8, 9)).to_pylist() == [None, None]
    # a value that fits (well under a page) is fine
    store.put("blob", keys_of(8), [b"y" * (PAGE_SIZE // 2)])
    store.flush()
    assert store.get("blob", keys_of(8)).to_pylist() == [b"y" * (PAGE_SIZE // 2)]
    assert_intact(store)


def test_feature_exists_with_other_type(store):
    with pytest.raises(FeatureExistsError) as ei:
        store.create_feature("rating", "int64")
    assert "rating" in str(ei.value)
    store.create_feature("rating", "float32")  # same type: no-op
    assert store.features()["rating"] == "float32"
    assert_intact(store)


@pytest.mark.parametrize("type_str", ["float64", "list<int32>", "fixed_size_list<float32, 0>",
                                      "fixed_size_list<int64, 8>", ""])
def test_bad_type_string(store, type_str):
    with pytest.raises((SchemaError, InvalidArgumentError)):
        store.create_feature("weird", type_str)
    assert "weird" not in store.features()
    assert_intact(store)


# ----------------------------------------------------------------------------------------------
# paths, locking, closing


def test_path_is_regular_file(tmp_path, opts):
    p = tmp_path / "a_file"
    p.write_bytes(b"hello")
    with pytest.raises(NotAStoreError) as ei:
        Store.open(str(p), opts)
    assert str(p) in str(ei.value)
    assert p.read_bytes() == b"hello"


def test_path_is_unrelated_directory(tmp_path, opts):
    d = tmp_path / "photos"
    d.mkdir()
    (d / "cat.jpg").write_bytes(b"\xff\xd8meow")
    (d / "sub").mkdir()
    with pytest.raises(NotAStoreError) as ei:
        Store.open(str(d), opts)
    assert str(d) in str(ei.value)
    assert sorted(os.listdir(d)) == ["cat.jpg", "sub"]  # nothing created or deleted


def test_second_open_same_process(store, store_path, opts):
    with pytest.raises(StoreLockedError) as ei:
        Store.open(store_path, opts)
    assert os.path.basename(store_path) in str(ei.value)
    assert_intact(store)
    store.close()
    with Store.open(store_path, opts) as s2:  # free again after close
        assert s2.scan("count").column("value").to_pylist() == [10, 20, 30]


LOCK_CHILD = r'''
import sys
from recflash.reader import Store, StoreOptions
try:
    s = Store.open(sys.argv[1], StoreOptions(page_size=4096, write_buffer_bytes=1 << 20))
except Exception as e:
    print(type(e).__name__)
    print(str(e))
else:
    print("OPENED")
    print(sorted(s.features()))
    s.close()
'''


def _open_in_child(tmp_path, path):
    script = tmp_path / "lock_child.py"
    script.write_text(LOCK_CHILD)
    cp = subprocess.run([sys.executable, str(script), path], cwd=str(tmp_path),
                        capture_output=True, text=True, timeout=120)
    assert cp.returncode == 0, cp.stderr[-3000:]
    return cp.stdout.splitlines()


def test_second_open_other_process(store, store_path, tmp_path):
    out = _open_in_child(tmp_path, store_path)
    assert out[0] == "StoreLockedError", out
    assert os.path.basename(store_path) in out[1], out
    assert_intact(store)
    store.close()
    out = _open_in_child(tmp_path, store_path)
    assert out[0] == "OPENED", out


@pytest.mark.parametrize("op", ["put", "delete", "scan", "scan_many", "get", "flush", "sync",
                                "stats", "features", "create_feature", "last_read_stats"])
def test_use_after_close(store, store_path, opts, op):
    store.close()
    calls = {
        "put": lambda: store.put("count", keys_of(1), np.array([1])),
        "delete": lambda: store.delete("count", keys_of(1)),
        "scan": lambda: store.scan("count"),
        "scan_many": lambda: store.scan_many(["count"]),
        "get": lambda: store.get("count", keys_of(1)),
        "flush": store.flush,
        "sync": store.sync,
        "stats": store.stats,
        "features": store.features,
        "create_feature": lambda: store.create_feature("new", "int64"),
        "last_read_stats": store.last_read_stats,
    }
    with pytest.raises(StoreClosedError) as ei:
        calls[op]()
    assert str(ei.value)
    store.close()  # closing twice is harmless
    with Store.open(store_path, opts) as s:
        assert_intact(s)


def test_context_manager_closes(store_path, opts):
    with Store.open(store_path, opts) as s:
        s.create_feature("n", "int64")
        s.put("n", keys_of(1), np.array([1]))
    with pytest.raises(StoreClosedError):
        s.scan("n")
    with pytest.raises(ZeroDivisionError):
        with Store.open(store_path, opts) as s:
            s.put("n", keys_of(2), np.array([2]))
            1 / 0
    with Store.open(store_path, opts) as s:  # closed (and flushed) despite the exception
        assert s.scan("n").column("value").to_pylist() == [1, 2]


# ----------------------------------------------------------------------------------------------
# corruption


def _nonzero_pages(path, page_size):
    pages = []
    with open(path, "rb") as fh:
        i = 0
        while True:
            b = fh.read(page_size)
            if not b:
                break
            if any(b):
                pages.append(i)
            i += 1
    return pages


def test_corrupt_page(store_path, opts):
    rng = np.random.default_rng(0)
    with Store.open(store_path, opts) as s:
        s.create_feature("a", "int64")
        s.create_feature("b", "binary")
        keys = np.arange(6000, dtype=U64)
        s.put("a", keys, keys.astype(np.int64))
        s.put("b", keys[:2000], [rng.bytes(20) for _ in range(2000)])
        s.flush()
    pages_dat = os.path.join(store_path, "pages.dat")
    used = _nonzero_pages(pages_dat, PAGE_SIZE)
    assert len(used) > 10, used
    k = used[len(used) // 2]
    with open(pages_dat, "r+b") as fh:
        fh.seek(PAGE_SIZE * k + 100)
        b = bytearray(fh.read(16))
        fh.seek(PAGE_SIZE * k + 100)
        fh.write(bytes(x ^ 0xA5 for x in b))
    err = None
    s = None
    try:
        s = Store.open(store_path, opts)
        for f in ("a", "b"):
            s.scan(f)
        s.scan_many(["a", "b"])
    except CorruptionError as e:
        err = e
    finally:
        if s is not None:
            try:
                s.close()
            except RecflashError:
                pass
    assert err is not None, f"flipped bytes in page {k} of {pages_dat} went unnoticed"
    msg = str(err)
    assert pages_dat in msg, msg
    # the page id (page ids are slot indexes in pages.dat)
    assert k in [int(x) for x in re.findall(r"\d+", msg)], (k, msg)


WAL_CHILD = r'''
import os, signal, sys
import numpy as np
from recflash.reader import Store, StoreOptions
s = Store.open(sys.argv[1], StoreOptions(page_size=4096, write_buffer_bytes=1 << 20))
s.create_feature("n", "int64")
s.put("n", np.array([1, 2, 3], dtype=np.uint64), np.array([1, 2, 3]))
s.sync()
os.kill(os.getpid(), signal.SIGKILL)
'''


def test_torn_wal_tail_after_crash(store_path, tmp_path, opts):
    """Garbage after the last WAL record (a torn append at crash time) must not make synced data
    unreadable: the store opens with all synced data, or it reports CorruptionError naming the
    WAL. It must not silently drop synced records."""
    script = tmp_path / "wal_child.py"
    script.write_text(WAL_CHILD)
    cp = subprocess.run([sys.executable, str(script), store_path], cwd=str(tmp_path),
                        capture_output=True, text=True, timeout=120)
    assert cp.returncode == -9, cp.stderr[-3000:]
    wal_dir = os.path.join(store_path, "wal")
    segs = sorted(f for f in os.listdir(wal_dir) if os.path.getsize(os.path.join(wal_dir, f)))
    assert segs, f"no non-empty WAL segment after a synced put: {os.listdir(wal_dir)}"
    with open(os.path.join(wal_dir, segs[-1]), "ab") as fh:
        fh.write(b"\x13\x37" * 50)
    try:
        with Store.open(store_path, opts) as s:
            assert s.scan("n").column("value").to_pylist() == [1, 2, 3]
    except CorruptionError as e:
        assert "wal" in str(e).lower(), str(e)


WAL_BATCHES_CHILD = r'''
import os, sys
import numpy as np
from recflash.reader import Store, StoreOptions
s = Store.open(sys.argv[1], StoreOptions(page_size=4096, write_buffer_bytes=1 << 20))
s.create_feature("x", "int64")
s.put("x", np.arange(100, dtype=np.uint64), np.zeros(100, np.int64))
s.flush()
for b in range(5):  # five synced batches, each one WAL record
    s.put("x", np.arange(b * 10, b * 10 + 10, dtype=np.uint64), np.full(10, b + 1, np.int64))
    s.sync()
os._exit(0)  # no close: the batches are only in the WAL
'''


def _wal_store(tmp_path):
    path = str(tmp_path / "walstore")
    subprocess.run([sys.executable, "-P", "-c", WAL_BATCHES_CHILD, path], check=True, timeout=120)
    wal_dir = os.path.join(path, "wal")
    segs = sorted(f for f in os.listdir(wal_dir) if os.path.getsize(os.path.join(wal_dir, f)))
    assert len(segs) == 1, segs
    return path, os.path.join(wal_dir, segs[-1])


def test_damaged_wal_record_with_later_records_fails_the_open(tmp_path):
    """A flipped byte in a WAL record that later synced records follow is damage, not a torn
    append: replaying up to it would silently drop those records. The open fails naming the
    file and byte; StoreOptions(wal_recovery="point_in_time") opens the store as of the record
    before it and counts what it passed over."""
    from recflash.reader import StoreOptions

    path, wal = _wal_store(tmp_path)
    data = bytearray(open(wal, "rb").read())
    rec = len(data) // 5  # five records of equal size
    assert rec * 5 == len(data), len(data)
    data[2 * rec + 20] ^= 0xFF  # inside the third record's payload
    open(wal, "wb").write(bytes(data))
    opts = StoreOptions(page_size=4096, write_buffer_bytes=1 << 20)
    for ro in (False, True):
        with pytest.raises(CorruptionError) as e:
            Store.open(path, StoreOptions(page_size=4096, write_buffer_bytes=1 << 20, read_only=ro))
        msg = str(e.value)
        assert wal in msg and f"byte {2 * rec}" in msg and "point_in_time" in msg, msg
    assert open(wal, "rb").read() == bytes(data), "a failed open must leave the WAL as it was"
    pit = StoreOptions(page_size=4096, write_buffer_bytes=1 << 20, wal_recovery="point_in_time")
    with Store.open(path, pit) as s:
        got = s.get("x", np.arange(50, dtype=U64)).to_pylist()
        assert got == [1] * 10 + [2] * 10 + [0] * 30, got  # the first two batches only
        st = s.stats()
        assert st["recovered_wal_records"] == 2 and st["wal_bytes_dropped"] == 3 * rec, st
    with Store.open(path, opts) as s:  # the point-in-time state is now the store's
        assert s.get("x", keys_of(25)).to_pylist() == [0]
    with pytest.raises(InvalidArgumentError, match="wal_recovery"):
        Store.open(path, StoreOptions(wal_recovery="skip"))


def test_damaged_last_wal_record_is_a_torn_tail(tmp_path):
    """The last record failing its checksum (a torn append) ends replay without an error."""
    path, wal = _wal_store(tmp_path)
    data = bytearray(open(wal, "rb").read())
    data[-3] ^= 0xFF
    open(wal, "wb").write(bytes(data))
    with Store.open(path) as s:
        assert s.get("x", keys_of(5, 15, 25, 35, 45)).to_pylist() == [1, 2, 3, 4, 0]
        assert s.stats()["wal_bytes_dropped"] == len(data) // 5


def test_directory_in_place_of_a_wal_file_is_corruption(tmp_path):
    path, wal = _wal_store(tmp_path)
    os.unlink(wal)
    os.mkdir(wal)
    with pytest.raises(CorruptionError, match="not a regular file"):
        Store.open(path)


META_CHILD = r'''
import os, sys
import numpy as np
from recflash.reader import Store, StoreOptions
s = Store.open(sys.argv[1], StoreOptions(page_size=4096, write_buffer_bytes=1 << 20))
s.create_feature("x", "int64")
for v in range(1, 11):
    s.put("x", np.arange(1000, dtype=np.uint64), np.full(1000, v, np.int64))
    s.flush()
s.delete("x", np.arange(100, dtype=np.uint64))
s.flush()
os._exit(0)
'''


@pytest.mark.parametrize("keep", ["last-6", "100", "1000"])
def test_metadata_that_lost_commits_fails_the_open(tmp_path, keep):
    """RocksDB's log cut short (its last commits gone) leaves the metadata older than the WAL
    files: their items were in WAL files the lost commits deleted. The open must say so
    (CorruptionError), not mix the old state with later WAL records or report an empty store,
    and a failed writable open must not shrink pages.dat (the lost commits' pages are there)."""
    import glob

    path = str(tmp_path / "s")
    subprocess.run([sys.executable, "-P", "-c", META_CHILD, path], check=True, timeout=120)
    log = sorted(glob.glob(os.path.join(path, "meta", "*.log")))[-1]
    size = os.path.getsize(log)
    os.truncate(log, size - 6 if keep == "last-6" else min(int(keep), size))
    pages = os.path.getsize(os.path.join(path, "pages.dat"))
    for ro in (True, False):
        try:
            with Store.open(path, read_only=ro) as s:
                got = s.scan("x")
        except CorruptionError as e:
            assert "lost commits" in str(e) and "wal" in str(e), str(e)
        else:  # only if nothing committed was cut: then it is the final state
            assert got.num_rows == 900 and set(got.column("value").to_pylist()) == {10}, keep
    assert os.path.getsize(os.path.join(path, "pages.dat")) == pages


@pytest.mark.parametrize("how", ["deleted", "cut"])
def test_page_file_shorter_than_the_metadata_fails_the_open(tmp_path, how):
    """pages.dat deleted or cut below the pages the metadata lists: the open says so, in both
    modes, instead of creating an empty file and failing every later read of those pages."""
    path = str(tmp_path / "s")
    with Store.open(path) as s:
        s.create_feature("x", "int64")
        s.put("x", np.arange(50000, dtype=U64), np.arange(50000))
    pages = os.path.join(path, "pages.dat")
    if how == "deleted":
        os.unlink(pages)
    else:
        os.truncate(pages, os.path.getsize(pages) // 2)
    for ro in (True, False):
        with pytest.raises(CorruptionError, match="the page file was truncated") as e:
            Store.open(path, read_only=ro)
        assert pages in str(e.value)


def test_python_int_keys_above_int64_and_null_keys(store):
    """Python ints up to 2**64 - 1 are keys (numpy alone would infer float64 and round them);
    out-of-range ints and null Arrow keys are named."""
    store.put("count", [2**64 - 1, 2**63 + 5], [7, 8])
    assert store.get("count", [2**63 + 5, 2**64 - 1]).to_pylist() == [8, 7]
    assert store.get("count", [np.uint64(2**64 - 1), 3]).to_pylist() == [7, None]
    with pytest.raises(InvalidArgumentError, match=r"keys must be in \[0, 2\*\*64\), got 18446744073709551616"):
        store.get("count", [2**64, 1])
    with pytest.raises(InvalidArgumentError, match="got -1"):
        store.put("count", [-1, 2], [1, 2])
    with pytest.raises(InvalidArgumentError, match="null"):
        store.get("count", pa.array([1, None], pa.uint64()))
    store.delete("count", [2**64 - 1, 2**63 + 5])
    assert_intact(store)


def test_deleted_wal_directory_fails_the_open(tmp_path):
    """wal/ deleted from a store with committed state: the open says what was lost (in both
    modes, and again on the next try) instead of recreating it silently."""
    import shutil

    path, _ = _wal_store(tmp_path)
    shutil.rmtree(os.path.join(path, "wal"))
    for ro in (False, True, False):
        with pytest.raises(CorruptionError, match="WAL directory"):
            Store.open(path, read_only=ro)


def test_deleted_first_wal_file_fails_the_open(tmp_path):
    """The WAL file the metadata names as the first to replay is kept until a commit moves
    past it, so its absence is damage even with no later file: synced records went with it."""
    path, wal = _wal_store(tmp_path)
    os.unlink(wal)
    for ro in (True, False):
        with pytest.raises(CorruptionError, match="it was deleted"):
            Store.open(path, read_only=ro)
