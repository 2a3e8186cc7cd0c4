"""Scan resolution paths for features whose pages overlap after updates.

Sparse-key features are resolved through a private copy of the key index (one pass in key
order, a cursor per page); dense-key features through the slot scatter. Both must equal the
in-memory model for every value type, with deletes, buffered writes and key ranges; the
store's counters show which path ran.
"""
from __future__ import annotations

import os

import numpy as np
import pytest

from recflash.reader import Store
from storeutil import TYPES, Model, check_scan, check_scan_many, gen_values, small_options


def _fill(store_path, rng, sparse: bool, types=TYPES, rounds: int = 12, n0: int = 1500):
    """Loads a few features and updates/deletes them in rounds with flushes in between, so
    every feature spans several overlapping pages with stale records and tombstones."""
    model = Model()
    st = Store.open(store_path, small_options(write_buffer_bytes=64 << 10))
    names = [f"f{i}" for i in range(len(types))]
    space = (1 << 63) if sparse else 4 * n0
    pools = {}
    for name, t in zip(names, types):
        st.create_feature(name, t)
        model.create(name, t)
        keys = np.unique(rng.integers(0, space, n0, dtype=np.uint64))
        pools[name] = keys
        vals, py = gen_values(t, len(keys), rng)
        st.put(name, keys, vals)
        model.put(name, keys, py)
    st.flush()
    for r in range(rounds):
        for name, t in zip(names, types):
            pool = pools[name]
            upd = pool[rng.integers(0, len(pool), len(pool) // 4)]
            vals, py = gen_values(t, len(upd), rng)
            st.put(name, upd, vals)
            model.put(name, upd, py)
            if r % 3 == 1:
                dels = pool[rng.integers(0, len(pool), len(pool) // 20)]
                st.delete(name, dels)
                model.delete(name, dels)
        if r % 4 != 3:  # leave some rounds in the write buffer
            st.flush()
    return st, model, names


@pytest.mark.parametrize("sparse", [True, False], ids=["sparse", "dense"])
def test_overlapping_pages_scan_equals_model(store_path, sparse):
    rng = np.random.default_rng(7 if sparse else 8)
    st, model, names = _fill(store_path, rng, sparse)
    try:
        for name in names:
            check_scan(st.scan(name), model, name)
            keys = sorted(model.data[name])
            lo, hi = keys[len(keys) // 5], keys[len(keys) * 3 // 4]
            check_scan(st.scan(name, key_range=(lo, hi)), model, name, key_range=(lo, hi))
        check_scan_many(st.scan_many(names), model, names)
        s = st.stats()
        if sparse:
            assert s["index_merges"] > 0, s
        assert s["index_merge_fallbacks"] == 0, s
    finally:
        st.close()
    # After reopening (checkpoint: nothing buffered) the same holds.
    with Store.open(store_path) as st:
        for name in names:
            check_scan(st.scan(name), model, name)


def test_index_guided_scan_during_flushes(store_path):
    """Scans interleaved with a writer's flushes and merges in another thread see a
    consistent snapshot; a scan that meets the index mid-install falls back to the merge."""
    import threading

    rng = np.random.default_rng(11)
    st, model, names = _fill(store_path, rng, True, types=["int64"], rounds=4, n0=20000)
    name = names[0]
    pool = np.array(sorted(model.data[name]), dtype=np.uint64)
    stop = threading.Event()
    errors = []

    def writer():
        wrng = np.random.default_rng(3)
        try:
            while not stop.is_set():
                upd = pool[wrng.integers(0, len(pool), 2000)]
                # values encode the key: any version a reader sees is checkable
                st.put(name, upd, (upd % np.uint64(1 << 40)).astype(np.int64) * 2)
                st.flush()
        except Exception as e:  # pragma: no cover - reported below
            errors.append(e)

    t = threading.Thread(target=writer)
    t.start()
    try:
        live = set(int(k) for k in pool)
        for _ in range(30):
            tab = st.scan(name)
            keys = tab.column("key").to_numpy()
            assert np.all(keys[1:] > keys[:-1])
            assert set(keys.tolist()) == live  # no key lost or duplicated, none deleted
    finally:
        stop.set()
        t.join()
        st.close()
    assert not errors, errors


def test_random_64bit_keys_roundtrip_and_store_format(store_path):
    """Random 64-bit ids (stored raw: varint deltas of 6-8 bytes decode slower than they
    save) round-trip through flushes, merges and compact(); the store marker names format 5,
    format 2 and 4 stores still open (a writable open upgrades their marker), an unknown
    format is refused by name."""
    from recflash.reader import NotAStoreError

    rng = np.random.default_rng(5)
    keys = np.unique(rng.integers(0, 2**64 - 1, 20000, dtype=np.uint64))
    vals = rng.integers(-(2**62), 2**62, len(keys), dtype=np.int64)
    with Store.open(store_path, small_options()) as st:
        st.create_feature("ids", "int64")
        st.put("ids", keys, vals)
        st.flush()
        upd = rng.choice(len(keys), 5000, replace=False)
        vals[upd] = -vals[upd]
        st.put("ids", keys[upd], vals[upd])
        st.flush()
        for compact in (False, True):
            if compact:
                st.compact()
            tab = st.scan("ids")
            assert np.array_equal(tab.column("key").to_numpy(), keys)
            assert np.array_equal(tab.column("value").to_numpy(), vals)
    marker = os.path.join(store_path, "RECFLASH")
    text = open(marker).read()
    assert "format 5" in text
    for old in ("format 2", "format 4"):
        with open(marker, "w") as f:
            f.write(text.replace("format 5", old))
        # a read-only open reads an older store as it is and leaves its marker alone
        with Store.open(store_path, read_only=True) as st:
            assert np.array_equal(st.scan("ids").column("key").to_numpy(), keys)
        assert old in open(marker).read()
        # a writable open may write what the older format lacks: the marker says so first,
        # and an older build then refuses the store by its format
        with Store.open(store_path) as st:
            assert np.array_equal(st.scan("ids").column("key").to_numpy(), keys)
        assert open(marker).read() == text
    with open(marker, "w") as f:
        f.write(text.replace("format 5", "format 9"))
    with pytest.raises(NotAStoreError, match="format 9"):
        Store.open(store_path)


def test_large_dense_features_swept_in_windows(store_path):
    """Dense-key features large enough for their scan's sweep to run on a helper thread while
    the pages (read in key order) are staged: full scans, cut ranges and scan_many after
    uniform updates, deletes and buffered writes equal a numpy model, before and after a
    reopen."""
    rng = np.random.default_rng(11)
    n = 600_000  # more slots than the helper-thread threshold
    types = {"big32": ("float32", np.float32), "big64": ("int64", np.int64)}
    want = {name: rng.integers(0, 1 << 30, n).astype(dt) for name, (_, dt) in types.items()}
    live = {name: np.ones(n, dtype=bool) for name in types}
    st = Store.open(store_path, small_options(write_buffer_bytes=1 << 20))
    try:
        for name, (t, _) in types.items():
            st.create_feature(name, t)
            st.put(name, np.arange(n, dtype=np.uint64), want[name])
        st.flush()
        for r in range(6):
            for name, (_, dt) in types.items():
                keys = rng.integers(0, n, n // 10).astype(np.uint64)
                vals = rng.integers(0, 1 << 30, keys.size).astype(dt)
                st.put(name, keys, vals)
                # the last write of a key in one put wins
                last = keys.size - 1 - np.unique(keys[::-1], return_index=True)[1]
                want[name][keys[last]] = vals[last]
                live[name][keys] = True
                if r % 2 == 1:
                    dels = rng.integers(0, n, n // 50).astype(np.uint64)
                    st.delete(name, dels)
                    live[name][dels] = False
            if r != 5:  # the last round stays buffered
                st.flush()

        def check(table, name, lo=0, hi=n):
            keys = table.column("key").to_numpy()
            exp = np.nonzero(live[name][lo:hi])[0].astype(np.uint64) + np.uint64(lo)
            np.testing.assert_array_equal(keys, exp)
            np.testing.assert_array_equal(table.column("value").to_numpy(), want[name][exp.astype(np.int64)])

        for _ in range(2):
            for name in types:
                check(st.scan(name), name)
                assert st.last_read_stats()["pages_read"] > 10
                check(st.scan(name, key_range=(12_345, 456_789)), name, 12_345, 456_789)
            assert st.stats()["index_merges"] == 0  # dense placement, not the key index
            both = st.scan_many(list(types))
            union = np.nonzero(live["big32"] | live["big64"])[0]
            np.testing.assert_array_equal(both.column("key").to_numpy(), union.astype(np.uint64))
            for name in types:
                col = both.column(name).combine_chunks()
                valid = col.is_valid().to_numpy(zero_copy_only=False)
                np.testing.assert_array_equal(valid, live[name][union])
                np.testing.assert_array_equal(col.drop_null().to_numpy(), want[name][union[valid]])
            st.close()
            st = Store.open(store_path, small_options(write_buffer_bytes=1 << 20))
    finally:
        st.close()
