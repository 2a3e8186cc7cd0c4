"""Store.scan_keys: a feature's live keys without its values. Whatever serves it — the page
table (segments holding a dense run of keys), the key index (a writer's, or a read-only
handle's from a CHECKPOINT of its snapshot or after build_key_index), or the pages with the
keys alone decoded — it must return exactly the key column scan() returns: on a fresh store,
after updates and deletes, with buffered writes, with WAL-only writes seen by a read-only
handle, at the edges of key ranges, for empty and unknown features, on both kinds of handle.
Where the page table or the index knows the keys, no page is read (last_read_stats). And
scan_many(rows_of=...), which the Ray loader's projections use: the rows of every feature,
the columns of some."""

from __future__ import annotations

import os

import numpy as np
import pytest

from storeutil import FSL_TYPE, TYPES, gen_values, small_options

from recflash.reader import Store, StoreOptions
from recflash.reader.errors import (CorruptionError, InvalidArgumentError, StaleSnapshotError, StoreClosedError,
                                    UnknownFeatureError)
from recflash.reader.store import FILE_NAMES

MAX = (1 << 64) - 1


def _same(store: Store, feature: str, key_range=None) -> dict:
    """scan_keys equals scan()'s key column; returns scan_keys' read stats."""
    want = store.scan(feature, key_range=key_range).column("key").to_numpy()
    scan_items = store.last_read_stats()["items"]
    got = store.scan_keys(feature, key_range=key_range)
    st = store.last_read_stats()
    assert isinstance(got, np.ndarray) and got.dtype == np.uint64 and got.ndim == 1
    assert np.array_equal(got, want), (f"scan_keys({feature!r}, {key_range}): {len(got)} keys, scan() has "
                                       f"{len(want)}; first differences at {np.flatnonzero(got[:len(want)] != want[:len(got)])[:5]}")
    assert st["items"] == scan_items  # (both count a key 2**64 - 1 that a range ending there drops)
    return st


def _ranges(keys: np.ndarray) -> list:
    """Key ranges at the edges of the keys' span, of pages and of the uint64 space."""
    k = np.unique(keys)
    lo, hi = int(k[0]), int(k[-1])
    mid = int(k[len(k) // 2])

    def c(x: int) -> int:
        return min(x, MAX)

    return [None, (0, 0), (0, 1), (lo, c(lo + 1)), (c(lo + 1), hi), (mid, c(mid + 1)), (mid, mid), (mid, None),
            (c(mid + 1), c(hi + 1)), (hi, None), (c(hi + 1), None), (0, MAX), (MAX - 1, None), (MAX, None),
            (MAX, MAX)]


def _fill(s: Store, rng: np.random.Generator) -> dict:
    """Features of every type and key shape: dense row numbers, every third key, random
    64-bit ids, and one holding 0 and 2**64 - 1. Returns name -> keys."""
    shapes = {
        "dense": np.arange(0, 5000, dtype=np.uint64),
        "third": np.arange(7, 9000, 3, dtype=np.uint64),
        "ids": np.unique(rng.integers(0, MAX, 1500, dtype=np.uint64, endpoint=True)),
        "edges": np.array([0, 1, 2, 1 << 63, MAX - 1, MAX], dtype=np.uint64),
    }
    keys = {}
    for t in TYPES:
        for shape, k in shapes.items():
            name = f"{shape}_{t}"
            s.create_feature(name, t)
            vals, _ = gen_values(t, len(k), rng)
            s.put(name, k, vals)
            keys[name] = k
    return keys


# -- 1. fresh store, writable and read-only ----------------------------------------------------
def test_fresh_store_equals_scan_on_both_handles(store_path):
    rng = np.random.default_rng(1)
    with Store.open(store_path, small_options()) as s:
        keys = _fill(s, rng)
        s.flush()
        for name, k in keys.items():
            for kr in _ranges(k):
                _same(s, name, kr)
        # A dense run of keys (row numbers of a load) comes from the page table: no page read.
        for t in TYPES:
            st = _same(s, f"dense_{t}")
            assert st["pages_read"] == 0 and st["bytes_read"] == 0, t
            assert st["useful_bytes"] == 8 * 5000
    with Store.open(store_path, read_only=True) as r:
        for name, k in keys.items():
            for kr in _ranges(k):
                _same(r, name, kr)
        assert r.scan_keys("dense_float32", (100, 200)).tolist() == list(range(100, 200))
        assert r.last_read_stats()["bytes_read"] == 0
        # Sparse keys of a feature only ever appended to: no key index holds them, so its pages
        # are read (for their keys), exactly the pages a scan reads.
        r.scan("third_int64")
        scan_pages = r.last_read_stats()["pages_read"]
        st = _same(r, "third_int64")
        assert st["pages_read"] == scan_pages > 0 and st["bytes_read"] == scan_pages * r.page_size


# -- 2. updates and deletes --------------------------------------------------------------------
def test_updates_and_deletes_are_served_from_the_key_index(store_path):
    rng = np.random.default_rng(2)
    with Store.open(store_path, small_options(merger_enabled=False)) as s:
        keys = _fill(s, rng)
        s.flush()
        for name, k in keys.items():
            t = s.features()[name]
            upd = k[::4]
            s.put(name, upd, gen_values(t, len(upd), rng)[0])
            s.put(name, np.array([9999, 123456789], dtype=np.uint64), gen_values(t, 2, rng)[0])  # new keys
            s.delete(name, k[1::5])
            s.delete(name, np.array([424242], dtype=np.uint64))  # never written
        s.flush()
        s.delete("dense_float32", np.arange(2000, 2100, dtype=np.uint64))
        s.flush()
        for name, k in keys.items():
            for kr in _ranges(k):
                st = _same(s, name, kr)
                # A writer's key index knows every key: no page is read.
                assert st["bytes_read"] == 0, (name, kr)
    # After the writer's clean close its CHECKPOINT describes the snapshot: a read-only handle
    # takes the indexes from it, again without a page read.
    with Store.open(store_path, read_only=True) as r:
        for name, k in keys.items():
            for kr in _ranges(k)[:6]:
                assert _same(r, name, kr)["bytes_read"] == 0, (name, kr)


def test_read_only_handle_without_a_matching_checkpoint_reads_keys_from_pages(store_path):
    opts = small_options(merger_enabled=False)
    k = np.arange(0, 20000, 2, dtype=np.uint64)
    d = np.arange(0, 20000, dtype=np.uint64)
    with Store.open(store_path, opts) as s:
        s.create_feature("f", "int64")
        s.create_feature("d", "float32")
        s.put("f", k, np.arange(len(k), dtype=np.int64))
        s.put("d", d, np.zeros(len(d), dtype=np.float32))
        s.flush()
    w = Store.open(store_path, opts)  # the writer's commit below retires the CHECKPOINT
    try:
        for name, keys in (("f", k), ("d", d)):
            dtype = np.int64 if name == "f" else np.float32
            w.put(name, keys[::7], np.ones(len(keys[::7]), dtype=dtype))
            w.put(name, np.array([40001, 40003], dtype=np.uint64), np.ones(2, dtype=dtype))
            w.delete(name, keys[3::11])
        w.flush()
        w.put("d", d[5::13], np.ones(len(d[5::13]), dtype=np.float32))  # then deleted again, in the WAL only
        w.delete("d", d[5::26])
        w.sync()
        with Store.open(store_path, read_only=True) as r:
            for name, keys in (("f", k), ("d", d)):
                for kr in _ranges(keys):
                    _same(r, name, kr)
            st = _same(r, "f")
            assert st["pages_read"] > 0 and st["useful_bytes"] == 8 * st["items"]
            # "d": the load's pages hold dense runs (their keys come from the page table, merged
            # by seq with the keys read from the update pages): fewer pages read than a scan.
            r.scan("d")
            scanned = r.last_read_stats()["pages_read"]
            assert 0 < _same(r, "d")["pages_read"] < scanned
            # Once the handle has its key index (read from the pages once), no page is read.
            assert r.build_key_index()
            assert _same(r, "f")["bytes_read"] == 0 and _same(r, "d")["bytes_read"] == 0
    finally:
        w.close()


# -- 3. buffered writes and WAL-only writes ----------------------------------------------------
def test_buffered_writes_and_deletes_are_included(store_path):
    rng = np.random.default_rng(3)
    with Store.open(store_path, StoreOptions(page_size=4096, write_buffer_bytes=64 << 20)) as s:
        keys = _fill(s, rng)
        s.flush()
        for name, k in keys.items():
            t = s.features()[name]
            s.put(name, np.array([3, 5000, 77777], dtype=np.uint64), gen_values(t, 3, rng)[0])
            s.delete(name, k[::9])
            s.delete(name, np.array([4, 31337], dtype=np.uint64))
        s.create_feature("only_buffered", "float32")  # no page at all
        s.put("only_buffered", np.array([5, 1, 9], dtype=np.uint64), np.ones(3, dtype=np.float32))
        s.delete("only_buffered", np.array([9], dtype=np.uint64))
        assert s.stats()["buffered_items"] > 0  # nothing above was flushed
        for name, k in keys.items():
            for kr in _ranges(k):
                _same(s, name, kr)
        assert s.scan_keys("only_buffered").tolist() == [1, 5]
        assert s.last_read_stats()["bytes_read"] == 0


def test_wal_only_writes_seen_by_a_read_only_handle(store_path):
    rng = np.random.default_rng(4)
    w = Store.open(store_path, StoreOptions(page_size=4096, write_buffer_bytes=64 << 20))
    try:
        keys = _fill(w, rng)
        w.flush()
        for name, k in keys.items():
            t = w.features()[name]
            w.put(name, np.array([6, 6001, MAX], dtype=np.uint64), gen_values(t, 3, rng)[0])
            w.delete(name, k[2::6])
        w.create_feature("wal_only", "binary")
        w.put("wal_only", np.array([10, 20, 30], dtype=np.uint64), [b"a", b"b", b"c"])
        w.delete("wal_only", np.array([20], dtype=np.uint64))
        w.sync()  # in the WAL, not in any page
        with Store.open(store_path, read_only=True) as r:
            for name, k in keys.items():
                for kr in _ranges(k):
                    _same(r, name, kr)
                assert np.array_equal(r.scan_keys(name), w.scan_keys(name)), name
            assert r.scan_keys("wal_only").tolist() == [10, 30]
    finally:
        w.close()


# -- 4. empty, unknown, closed ---------------------------------------------------------------
def test_empty_unknown_and_closed(store_path):
    with Store.open(store_path, small_options()) as s:
        s.create_feature("empty", "list<float32>")
        s.create_feature("x", "float32")
        s.put("x", np.arange(10, dtype=np.uint64), np.zeros(10, dtype=np.float32))
        for kr in (None, (0, 5), (MAX, None)):
            got = s.scan_keys("empty", kr)
            assert got.dtype == np.uint64 and len(got) == 0
            assert s.last_read_stats()["bytes_read"] == 0
        with pytest.raises(UnknownFeatureError, match=r"unknown feature 'nope' in store .*known: .*x"):
            s.scan_keys("nope")
        with pytest.raises(InvalidArgumentError, match=r"key_range \(5, 3\)"):
            s.scan_keys("x", (5, 3))
    with Store.open(store_path, read_only=True) as r:
        assert len(r.scan_keys("empty")) == 0
        with pytest.raises(UnknownFeatureError, match="'nope'"):
            r.scan_keys("nope")
    r.close()
    with pytest.raises(StoreClosedError):
        r.scan_keys("x")


def test_pages_read_for_keys_are_verified(store_path):
    """Keys read from pages are checked as a scan's are: a page a writer rewrote since a
    read-only handle's open is StaleSnapshotError, a damaged page CorruptionError."""
    opts = small_options(merger_enabled=False)
    k = np.arange(0, 30000, 3, dtype=np.uint64)  # sparse: no dense run, no key index yet
    w = Store.open(store_path, opts)
    w.create_feature("a", "float32")
    w.put("a", k, np.zeros(len(k), dtype=np.float32))
    w.flush()
    r = Store.open(store_path, read_only=True)
    try:
        for i in range(3):  # updates and a full merge rewrite (and reuse) the pages r names
            w.put("a", k, np.full(len(k), i, dtype=np.float32))
            w.flush()
        w.compact()
        w.put("a", k[::2], np.ones(len(k[::2]), dtype=np.float32))
        w.flush()
        with pytest.raises(StaleSnapshotError, match="reopen"):
            r.scan_keys("a")
    finally:
        r.close()
        w.close()
    with Store.open(store_path, small_options(merger_enabled=False)) as s:
        s.create_feature("b", "int64")
        s.put("b", k, np.arange(len(k), dtype=np.int64))  # appended: its index stays deferred
    with Store.open(store_path, read_only=True) as r:
        page = int(r.key_ranges("b")["page"][0])
        page_size = r.page_size
    with open(os.path.join(store_path, FILE_NAMES["pages"]), "r+b") as f:
        f.seek(page * page_size + page_size // 2)
        b = f.read(1)
        f.seek(page * page_size + page_size // 2)
        f.write(bytes([b[0] ^ 0xFF]))
    with Store.open(store_path, read_only=True) as r:
        with pytest.raises(CorruptionError, match=f"page {page} .*pages"):
            r.scan_keys("b")


# -- 5. random histories ------------------------------------------------------------------------
@pytest.mark.parametrize("seed", [11, 12, 13])
def test_random_histories_equal_scan(store_path, seed):
    """Random puts, deletes, flushes (merges run) and compactions over features of every type;
    scan_keys checked against scan() along the way (writer) and at the end (read-only)."""
    rng = np.random.default_rng(seed)
    names = {f"f_{t}": t for t in TYPES}
    with Store.open(store_path, small_options(write_buffer_bytes=64 << 10)) as s:
        for n, t in names.items():
            s.create_feature(n, t)
        space = int(rng.choice([3000, 1 << 40]))
        for step in range(40):
            n = str(rng.choice(list(names)))
            op = rng.random()
            if op < 0.6:
                k = rng.integers(0, space, int(rng.integers(1, 400)), dtype=np.uint64)
                s.put(n, k, gen_values(names[n], len(k), rng)[0])
            elif op < 0.85:
                s.delete(n, rng.integers(0, space, int(rng.integers(1, 200)), dtype=np.uint64))
            elif op < 0.95:
                s.flush()
            else:
                s.compact([n])
            if step % 8 == 7:
                for f in names:
                    a, b = sorted(int(x) for x in rng.integers(0, space, 2))
                    for kr in (None, (a, b), (b, None)):
                        _same(s, f, kr)
        # A read-only handle while the writer is open (its commits retired the CHECKPOINT):
        # the pages' keys merged by seq, the WAL's writes over them.
        s.put("f_int64", rng.integers(0, space, 50, dtype=np.uint64), np.zeros(50, dtype=np.int64))
        s.delete("f_float32", rng.integers(0, space, 50, dtype=np.uint64))
        s.sync()
        with Store.open(store_path, read_only=True) as r:
            for f in names:
                for kr in (None, (0, space // 2), (space // 3, None)):
                    _same(r, f, kr)
    # After the clean close: the CHECKPOINT's indexes.
    with Store.open(store_path, read_only=True) as r:
        for f in names:
            for kr in (None, (0, space // 2), (space // 3, None)):
                _same(r, f, kr)


# -- 6. scan_many(rows_of=...) ------------------------------------------------------------------
def test_scan_many_rows_of_has_the_rows_of_every_feature(store_path):
    with Store.open(store_path, small_options()) as s:
        s.create_feature("sel", "float32")
        s.create_feature("other", "binary")
        s.create_feature("more", FSL_TYPE)
        s.put("sel", np.arange(0, 1000, 2, dtype=np.uint64), np.ones(500, dtype=np.float32))
        s.put("other", np.arange(1000, 3000, 3, dtype=np.uint64), [b"xy"] * len(range(1000, 3000, 3)))
        s.put("more", np.array([1, 5, 4000], dtype=np.uint64), np.zeros((3, 8), dtype=np.float32))
        s.flush()
        s.delete("sel", np.arange(0, 100, 2, dtype=np.uint64))
    with Store.open(store_path, read_only=True) as r:
        for kr in (None, (0, 1), (3, 1500), (2999, None), (5000, None)):
            full = r.scan_many(["sel", "other", "more"], key_range=kr)
            got = r.scan_many(["sel"], key_range=kr, rows_of=["other", "more"])
            assert got.column_names == ["key", "sel"]
            assert got.equals(full.select(["key", "sel"])), kr
            st = r.last_read_stats()
            parts = []
            r.scan_many(["sel"], key_range=kr)
            parts.append(r.last_read_stats())
            for f in ("other", "more"):
                r.scan_keys(f, kr)
                parts.append(r.last_read_stats())
            for field in ("pages_read", "bytes_read", "items", "useful_bytes"):
                assert st[field] == sum(p[field] for p in parts), (field, kr)
            # No column but the key: the rows alone.
            keys_only = r.scan_many([], key_range=kr, rows_of=["sel", "other", "more"])
            assert keys_only.column_names == ["key"] and keys_only.equals(full.select(["key"]))
        assert r.scan_many(["sel"], rows_of="other").equals(r.scan_many(["sel", "other"]).select(["key", "sel"]))
        with pytest.raises(InvalidArgumentError, match="duplicate feature names"):
            r.scan_many(["sel"], rows_of=["sel"])
        with pytest.raises(InvalidArgumentError, match="at least one feature"):
            r.scan_many([], rows_of=[])
        with pytest.raises(InvalidArgumentError, match="rows_of must list feature names"):
            r.scan_many(["sel"], rows_of=[3])
        with pytest.raises(UnknownFeatureError, match="'zz'"):
            r.scan_many(["sel"], rows_of=["zz"])


def test_rows_of_not_read_once_a_feature_covers_the_range(store_path):
    """A feature holding every key of the range (a label over row numbers) makes the rows the
    whole range: the rows_of features are then not read, and the rows are still the union."""
    with Store.open(store_path, small_options()) as s:
        s.create_feature("label", "float32")
        s.create_feature("sparse", "int64")
        s.create_feature("sparse2", "binary")
        s.put("label", np.arange(0, 3000, dtype=np.uint64), np.ones(3000, dtype=np.float32))
        s.put("sparse", np.arange(0, 3000, 7, dtype=np.uint64), np.arange(0, 3000, 7, dtype=np.int64))
        s.put("sparse2", np.array([5, 3100], dtype=np.uint64), [b"a", b"b"])
        s.flush()
        s.delete("label", np.array([14], dtype=np.uint64))  # a hole: key 14 is then sparse's alone
    with Store.open(store_path, read_only=True) as r:
        for kr, covered in (((0, 10), True), ((100, 2000), True), ((15, 3000), True), ((0, 3000), False),
                            ((5, 20), False), ((2990, None), False), (None, False)):
            full = r.scan_many(["label", "sparse", "sparse2"], key_range=kr)
            got = r.scan_many(["label"], key_range=kr, rows_of=["sparse", "sparse2"])
            st = r.last_read_stats()
            assert got.equals(full.select(["key", "label"])), kr
            r.scan_many(["label"], key_range=kr)
            alone = r.last_read_stats()
            if covered:  # only the label was read
                assert all(st[f] == alone[f] for f in ("pages_read", "items", "useful_bytes")), (kr, st, alone)
            else:  # the rows_of features were read too
                assert st["items"] > alone["items"], (kr, st, alone)
            # rows_of alone: reading stops at the first feature that covers the range
            assert r.scan_many([], key_range=kr, rows_of=["label", "sparse", "sparse2"]).equals(full.select(["key"]))
        assert r.scan_many(["label"], key_range=(0, 10), rows_of=["sparse"]).num_rows == 10
        keys = r.scan_many(["label"], key_range=(0, 3000), rows_of=["sparse"]).column("key").to_pylist()
        assert keys == list(range(3000))  # key 14 from sparse
