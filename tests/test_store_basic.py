"""Basic behaviour of the READER store, against docs/store-api.md."""

from __future__ import annotations

import os

import numpy as np
import pyarrow as pa
import pytest

from recflash.reader import Store
from storeutil import (ARROW_TYPES, FSL_TYPE, KEY_MAX, PAGE_SIZE, TYPE_FEATURE, TYPES, U64_MAX,
                       Model,
                       check_get, check_scan, check_scan_many, gen_keys, gen_values,
                       small_options)

U64 = np.uint64

STATS_KEYS = [
    "pages_in_use", "file_bytes", "live_items", "live_item_bytes", "space_amplification",
    "read_amplification", "write_amplification", "pages_read", "bytes_read",
    "useful_bytes_read", "pages_written", "bytes_written", "user_bytes_written",
    "wal_bytes_written", "metadata_dram_bytes", "metadata_dram_bytes_per_item",
    "disk_bytes_per_item", "flushes", "fragmentation", "features", "pinner", "merger",
    "reclaimer",
]
READ_STATS_KEYS = ["pages_read", "read_requests", "io_wait_seconds", "bytes_read", "useful_bytes", "seconds", "read_amplification",
                   "peak_inflight_bytes"]


def keys_of(*ks):
    return np.array(ks, dtype=U64)


# ----------------------------------------------------------------------------------------------
# create / reopen / features


def test_create_and_reopen_features(store_path, opts):
    with Store.open(store_path, opts) as s:
        assert s.features() == {}
        for t in TYPES:
            s.create_feature(TYPE_FEATURE[t], t)
        want = {TYPE_FEATURE[t]: t for t in TYPES}
        assert s.features() == want
    # the store directory has the documented layout
    names = set(os.listdir(store_path))
    for required in ("pages.dat", "meta", "wal", "RECFLASH"):
        assert required in names, (required, names)
    assert os.path.isdir(os.path.join(store_path, "meta"))
    assert os.path.isdir(os.path.join(store_path, "wal"))
    with Store.open(store_path, opts) as s:
        assert s.features() == want
        for t in TYPES:  # empty features scan to empty tables of the right schema
            tab = s.scan(TYPE_FEATURE[t])
            assert tab.num_rows == 0
            assert tab.column_names == ["key", "value"]
            assert tab.schema.field("key").type == pa.uint64()
            assert tab.schema.field("value").type == ARROW_TYPES[t]


def test_create_feature_same_type_is_noop(open_store):
    s = open_store()
    s.create_feature("rating", "float32")
    s.put("rating", keys_of(1, 2), np.array([1.5, 2.5], dtype=np.float32))
    s.create_feature("rating", "float32")  # same type: no-op, data kept
    assert s.features() == {"rating": "float32"}
    assert s.scan("rating").column("value").to_pylist() == [1.5, 2.5]


def test_other_fixed_size_dims(open_store):
    s = open_store()
    s.create_feature("e3", "fixed_size_list<float32, 3>")
    s.create_feature("e64", "fixed_size_list<float32, 64>")
    a3 = np.arange(12, dtype=np.float32).reshape(4, 3)
    a64 = np.arange(128, dtype=np.float32).reshape(2, 64)
    s.put("e3", keys_of(4, 3, 2, 1), a3)
    s.put("e64", keys_of(9, 8), a64)
    s.flush()
    t3 = s.scan("e3")
    assert t3.schema.field("value").type == pa.list_(pa.float32(), 3)
    assert t3.column("value").to_pylist() == a3[::-1].tolist()
    t64 = s.scan("e64")
    assert t64.schema.field("value").type == pa.list_(pa.float32(), 64)
    assert t64.column("value").to_pylist() == a64[::-1].tolist()


# ----------------------------------------------------------------------------------------------
# round trips of every type


@pytest.mark.parametrize("as_arrow", [False, True], ids=["numpy", "arrow"])
@pytest.mark.parametrize("type_str", TYPES)
def test_roundtrip_each_type(store_path, opts, type_str, as_arrow):
    rng = np.random.default_rng(abs(hash((type_str, as_arrow))) % 2**32)
    f = TYPE_FEATURE[type_str]
    m = Model()
    m.create(f, type_str)
    s = Store.open(store_path, opts)
    try:
        s.create_feature(f, type_str)
        for _ in range(3):
            keys = gen_keys(rng, 700, space=5000)
            vin, vpy = gen_values(type_str, len(keys), rng, as_arrow=as_arrow)
            s.put(f, keys, vin)
            m.put(f, keys, vpy)
        # visible from the write buffer, before any explicit flush
        check_scan(s.scan(f), m, f)
        probe = np.concatenate([gen_keys(rng, 200, space=5000), keys_of(0, KEY_MAX, 123456789)])
        check_get(s.get(f, probe), m, f, probe)
        s.flush()
        check_scan(s.scan(f), m, f)
        check_get(s.get(f, probe), m, f, probe)
        # overwrite some after the flush: mix of page-resident and buffered versions
        keys = gen_keys(rng, 300, space=5000)
        vin, vpy = gen_values(type_str, len(keys), rng, as_arrow=as_arrow)
        s.put(f, keys, vin)
        m.put(f, keys, vpy)
        check_scan(s.scan(f), m, f)
        check_get(s.get(f, probe), m, f, probe)
    finally:
        s.close()
    with Store.open(store_path, opts) as s:
        assert s.features() == {f: type_str}
        check_scan(s.scan(f), m, f)
        check_get(s.get(f, probe), m, f, probe)
        assert s.stats()["live_items"] == len(m.data[f])


def test_float_inputs_cast(open_store):
    s = open_store()
    s.create_feature("r", "float32")
    s.put("r", keys_of(1, 2, 3), np.array([0.1, 1e10, -2.5], dtype=np.float64))
    got = s.scan("r").column("value").to_pylist()
    assert got == [float(np.float32(x)) for x in (0.1, 1e10, -2.5)]
    s.create_feature("n", "int64")
    s.put("n", keys_of(1, 2), np.array([7, -7], dtype=np.int32))  # any integer dtype
    assert s.scan("n").column("value").to_pylist() == [7, -7]


def test_keys_castable_to_uint64_accepted(open_store):
    s = open_store()
    s.create_feature("n", "int64")
    s.put("n", np.array([5, 1, 3], dtype=np.int64), np.array([50, 10, 30]))
    s.put("n", [7, 2], np.array([70, 20]))
    assert s.scan("n").column("key").to_pylist() == [1, 2, 3, 5, 7]
    assert s.scan("n").column("value").to_pylist() == [10, 20, 30, 50, 70]
    assert s.get("n", [3, 4]).to_pylist() == [30, None]


def test_empty_put_get_delete(open_store):
    s = open_store()
    s.create_feature("n", "int64")
    s.put("n", np.array([], dtype=U64), np.array([], dtype=np.int64))
    s.delete("n", np.array([], dtype=U64))
    g = s.get("n", np.array([], dtype=U64))
    assert len(g) == 0 and g.type == pa.int64()
    assert s.scan("n").num_rows == 0


# ----------------------------------------------------------------------------------------------
# scan order, key ranges


def test_scan_keys_ascending_and_types(open_store):
    s = open_store()
    m = Model()
    rng = np.random.default_rng(1)
    for t in TYPES:
        s.create_feature(TYPE_FEATURE[t], t)
        m.create(TYPE_FEATURE[t], t)
    for rnd in range(4):
        for t in TYPES:
            f = TYPE_FEATURE[t]
            keys = gen_keys(rng, 400, space=3000, skew=bool(rnd % 2))
            vin, vpy = gen_values(t, len(keys), rng)
            s.put(f, keys, vin)
            m.put(f, keys, vpy)
        if rnd % 2:
            s.flush()
        for t in TYPES:
            check_scan(s.scan(TYPE_FEATURE[t]), m, TYPE_FEATURE[t])


def test_key_range_half_open(open_store):
    s = open_store()
    s.create_feature("n", "int64")
    m = Model()
    m.create("n", "int64")
    flushed = np.arange(0, 2000, 2, dtype=U64)  # even keys on pages
    s.put("n", flushed, flushed.astype(np.int64) * 10)
    m.put("n", flushed, [int(k) * 10 for k in flushed])
    s.flush()
    buffered = np.arange(1, 2000, 6, dtype=U64)  # some odd keys only in the write buffer
    s.put("n", buffered, buffered.astype(np.int64) * 10)
    m.put("n", buffered, [int(k) * 10 for k in buffered])
    edge = keys_of(KEY_MAX, KEY_MAX - 1)
    s.put("n", edge, np.array([-1, -2]))
    m.put("n", edge, [-1, -2])
    for rng_ in [(10, 20), (11, 20), (10, 21), (10, 10), (20, 10 + 10), (0, 1), (0, 2),
                 (1999, 2000), (1998, 1999), (0, 2**63), (5000, U64_MAX), (0, U64_MAX),
                 (KEY_MAX - 1, KEY_MAX), (KEY_MAX, U64_MAX), (U64_MAX, U64_MAX)]:
        check_scan(s.scan("n", key_range=rng_), m, "n", rng_)
    t = s.scan("n", key_range=(10, 20))
    assert t.column("key").to_pylist() == [10, 12, 13, 14, 16, 18, 19]
    assert s.scan("n", key_range=(0, KEY_MAX)).column("key").to_pylist()[-1] == KEY_MAX - 1
    assert s.scan("n").column("key").to_pylist()[-1] == KEY_MAX
    # numpy scalars are acceptable bounds as well
    check_scan(s.scan("n", key_range=(U64(100), U64(300))), m, "n", (100, 300))


def test_max_uint64_key(open_store):
    """The contract makes keys uint64, so 2**64 - 1 is a key like any other: a full scan (no
    key_range) returns it, get finds it, delete removes it. (No half-open range can hold it.)"""
    s = open_store()
    s.create_feature("n", "int64")
    s.put("n", keys_of(U64_MAX, 1), np.array([7, 1]))
    assert s.scan("n").column("key").to_pylist() == [1, U64_MAX]
    assert s.get("n", keys_of(U64_MAX, 2)).to_pylist() == [7, None]
    s.flush()
    assert s.scan("n").column("value").to_pylist() == [1, 7]
    assert s.scan("n", key_range=(0, U64_MAX)).column("key").to_pylist() == [1]
    s.delete("n", keys_of(U64_MAX))
    assert s.scan("n").column("key").to_pylist() == [1]


@pytest.mark.parametrize("type_str", TYPES)
def test_scan_table_owns_engine_buffers(store_path, opts, type_str):
    """scan()'s table is made in the binding over the engine's buffers (no copy): it is valid
    after the store is closed and other scans reused the engine's freed blocks; it passes
    Arrow's full validation, slices and converts like any table; a range scan and an empty
    feature give the same schema."""
    import gc

    rng = np.random.default_rng(7)
    name = TYPE_FEATURE[type_str]
    keys = np.unique(rng.integers(0, 1 << 40, 3000, dtype=U64))
    vals, expect = gen_values(type_str, len(keys), rng)
    s = Store.open(store_path, opts)
    s.create_feature(name, type_str)
    s.create_feature("empty", type_str)
    s.put(name, keys, vals)
    s.flush()
    t = s.scan(name)
    part = s.scan(name, key_range=(int(keys[100]), int(keys[200])))
    empty = s.scan("empty")
    for _ in range(3):  # freed result blocks are cached and handed to later reads
        s.scan(name)
    s.close()
    gc.collect()
    for tab in (t, part, empty):
        tab.validate(full=True)
        assert tab.schema == pa.schema([("key", pa.uint64()), ("value", ARROW_TYPES[type_str])])
    assert t.column("key").to_pylist() == keys.tolist()
    assert t.column("value").to_pylist() == expect
    assert part.column("key").to_pylist() == keys[100:200].tolist()
    assert part.column("value").to_pylist() == expect[100:200]
    assert empty.num_rows == 0
    assert t.slice(10, 5).column("value").to_pylist() == expect[10:15]


# ----------------------------------------------------------------------------------------------
# scan_many


def _three_features(s, m):
    s.create_feature("a", "float32")
    s.create_feature("b", "int64")
    s.create_feature("c", "binary")
    for f, t in (("a", "float32"), ("b", "int64"), ("c", "binary")):
        m.create(f, t)
    ka = np.arange(0, 300, 2, dtype=U64)
    kb = np.arange(0, 300, 3, dtype=U64)
    kc = np.arange(100, 130, dtype=U64)
    va = (ka.astype(np.float32) / 4)
    s.put("a", ka, va)
    m.put("a", ka, [float(x) for x in va])
    s.put("b", kb, kb.astype(np.int64) * -3)
    m.put("b", kb, [int(k) * -3 for k in kb])
    vc = [b"c%d" % k for k in kc]
    s.put("c", kc, vc)
    m.put("c", kc, vc)


def test_scan_many_outer_join(open_store, store_path, opts):
    s = open_store()
    m = Model()
    _three_features(s, m)
    for phase in ("buffer", "flushed", "reopened"):
        if phase == "flushed":
            s.flush()
        if phase == "reopened":
            s.close()
            s = open_store()
        for feats in (["a", "b", "c"], ["c", "a"], ["b"], ["a", "c", "b"]):
            check_scan_many(s.scan_many(feats), m, feats)
            for kr in ((0, 10), (99, 131), (129, 1000), (50, 50), (7, 8)):
                check_scan_many(s.scan_many(feats, key_range=kr), m, feats, kr)
        t = s.scan_many(["a", "b", "c"], key_range=(0, 7))
        assert t.column("key").to_pylist() == [0, 2, 3, 4, 6]
        assert t.column("a").to_pylist() == [0.0, 0.5, None, 1.0, 1.5]
        assert t.column("b").to_pylist() == [0, None, -9, None, -18]
        assert t.column("c").to_pylist() == [None] * 5
    # deletes are respected: a key deleted from every feature disappears from the join
    s.delete("a", keys_of(102, 104))
    s.delete("b", keys_of(102))
    s.delete("c", keys_of(102))
    m.delete("a", [102, 104])
    m.delete("b", [102])
    m.delete("c", [102])
    check_scan_many(s.scan_many(["a", "b", "c"]), m, ["a", "b", "c"])
    assert 102 not in s.scan_many(["a", "b", "c"]).column("key").to_pylist()


def test_scan_many_reads_shared_pages_once(store_path, opts):
    """Small features written in the same flush share pages; scan_many reads each page once."""
    rng = np.random.default_rng(7)
    names = [f"f{i}" for i in range(6)]
    m = Model()
    with Store.open(store_path, opts) as s:
        for i, f in enumerate(names):
            t = TYPES[i % len(TYPES)]
            s.create_feature(f, t)
            m.create(f, t)
            keys = np.arange(i * 7, i * 7 + 60, dtype=U64)
            vin, vpy = gen_values(t, len(keys), rng)
            s.put(f, keys, vin)
            m.put(f, keys, vpy)
        s.flush()
    with Store.open(store_path, opts) as s:  # everything on pages now
        individual = {}
        for f in names:
            check_scan(s.scan(f), m, f)
            individual[f] = s.last_read_stats()["pages_read"]
        assert all(v > 0 for v in individual.values()), individual
        for subset in (names, names[:3], names[::2], list(reversed(names))):
            t = s.scan_many(subset)
            st = s.last_read_stats()
            check_scan_many(t, m, subset)
            total = sum(individual[f] for f in subset)
            assert 0 < st["pages_read"] <= total, (subset, st, individual)
        # six features of ~1-2 KiB written in one flush share 4 KiB pages (pages carry a
        # per-feature directory), so separate scans re-read shared pages and scan_many does not
        s.scan_many(names)
        together = s.last_read_stats()["pages_read"]
        assert together < sum(individual.values()), (together, individual)


# ----------------------------------------------------------------------------------------------
# get, duplicates, deletes, write buffer visibility


def test_get_nulls_for_absent_keys(open_store):
    s = open_store()
    s.create_feature("v", FSL_TYPE)
    s.create_feature("l", "list<int64>")
    vals = np.arange(40, dtype=np.float32).reshape(5, 8)
    s.put("v", keys_of(10, 20, 30, 40, 50), vals)
    s.put("l", keys_of(1, 2), [[1, 2, 3], []])
    s.flush()
    s.delete("v", keys_of(30))
    q = keys_of(50, 5, 10, 30, 10, KEY_MAX, 0)
    g = s.get("v", q)
    assert g.type == pa.list_(pa.float32(), 8)
    assert g.to_pylist() == [vals[4].tolist(), None, vals[0].tolist(), None, vals[0].tolist(),
                             None, None]
    assert g.null_count == 4
    g = s.get("l", keys_of(2, 3, 1))
    assert g.type == pa.list_(pa.int64())
    assert g.to_pylist() == [[], None, [1, 2, 3]]  # an empty list is not a null


@pytest.mark.parametrize("flush_between", [False, True])
def test_duplicate_keys_last_wins(open_store, flush_between):
    s = open_store()
    s.create_feature("n", "int64")
    s.create_feature("b", "binary")
    s.put("n", keys_of(5, 3, 5, 7, 3, 5), np.array([1, 2, 3, 4, 5, 6]))
    s.put("b", keys_of(9, 9, 9), [b"first", b"second", b"third"])
    if flush_between:
        s.flush()
    assert s.scan("n").column("key").to_pylist() == [3, 5, 7]
    assert s.scan("n").column("value").to_pylist() == [5, 6, 4]
    assert s.scan("b").to_pylist() == [{"key": 9, "value": b"third"}]
    assert s.get("n", keys_of(3, 5, 7)).to_pylist() == [5, 6, 4]
    # across puts: the later put wins, also when the earlier one is on pages
    s.put("n", keys_of(7, 3), np.array([40, 50]))
    s.put("n", keys_of(3), np.array([500]))
    assert s.scan("n").column("value").to_pylist() == [500, 6, 40]
    s.flush()
    assert s.scan("n").column("value").to_pylist() == [500, 6, 40]
    s.close()
    s = open_store()
    assert s.scan("n").column("value").to_pylist() == [500, 6, 40]
    assert s.scan("b").to_pylist() == [{"key": 9, "value": b"third"}]
    # stats()["live_items"] counts items on pages (the buffer is reported as buffered_items);
    # after close + reopen everything is on pages
    assert s.stats()["live_items"] == 4


def test_delete_then_scan(open_store, store_path, opts):
    s = open_store()
    s.create_feature("n", "int64")
    keys = np.arange(1000, dtype=U64)
    s.put("n", keys, keys.astype(np.int64))
    s.flush()
    s.delete("n", np.arange(0, 1000, 3, dtype=U64))  # deletes of page-resident keys
    s.delete("n", keys_of(5000, 6000))  # absent keys: no-op
    want = [k for k in range(1000) if k % 3]
    assert s.scan("n").column("key").to_pylist() == want
    assert s.get("n", keys_of(0, 1, 3)).to_pylist() == [None, 1, None]
    s.put("n", keys_of(1001, 1002), np.array([1, 2]))
    s.delete("n", keys_of(1001))  # delete of a key that only lives in the write buffer
    want.append(1002)
    assert s.scan("n").column("key").to_pylist() == want
    s.flush()
    assert s.scan("n").column("key").to_pylist() == want
    s.put("n", keys_of(3), np.array([33]))  # re-insert after delete
    s.delete("n", keys_of(4))
    s.put("n", keys_of(4), np.array([44]))  # put after delete in the same buffer
    want = sorted(set(want) | {3, 4})
    s.close()
    s = open_store()
    t = s.scan("n")
    assert t.column("key").to_pylist() == want
    assert s.get("n", keys_of(3, 4, 6, 1001)).to_pylist() == [33, 44, None, None]
    assert s.stats()["live_items"] == len(want)
    assert s.stats()["features"]["n"]["items"] == len(want)


def test_delete_everything_then_reuse(open_store):
    s = open_store()
    s.create_feature("x", "binary")
    keys = np.arange(3000, dtype=U64)
    s.put("x", keys, [b"v" * 40] * len(keys))
    s.flush()
    s.delete("x", keys)
    s.flush()
    assert s.scan("x").num_rows == 0
    assert s.stats()["live_items"] == 0
    s.put("x", keys_of(1), [b"again"])
    s.flush()
    assert s.scan("x").to_pylist() == [{"key": 1, "value": b"again"}]


def test_data_visible_before_and_after_flush(open_store):
    s = open_store(options=small_options(write_buffer_bytes=1 << 20))
    s.create_feature("n", "int64")
    s.put("n", keys_of(1, 2, 3), np.array([10, 20, 30]))
    before = s.stats()
    assert s.scan("n").column("value").to_pylist() == [10, 20, 30]
    assert s.get("n", keys_of(2)).to_pylist() == [20]
    assert s.stats()["pages_written"] == before["pages_written"]  # still only in the buffer
    s.flush()
    assert s.scan("n").column("value").to_pylist() == [10, 20, 30]
    s.put("n", np.arange(100, 5000, dtype=U64), np.arange(100, 5000))  # too big to be pinned
    s.flush()
    assert s.stats()["flushes"] >= 1
    assert s.stats()["pages_written"] > before["pages_written"]
    assert s.get("n", keys_of(1, 4999)).to_pylist() == [10, 4999]


def test_close_reopen_keeps_everything(store_path, opts):
    rng = np.random.default_rng(3)
    m = Model()
    with Store.open(store_path, opts) as s:
        for t in TYPES:
            s.create_feature(TYPE_FEATURE[t], t)
            m.create(TYPE_FEATURE[t], t)
        for i in range(5):
            for t in TYPES:
                f = TYPE_FEATURE[t]
                keys = gen_keys(rng, 500, space=2000, skew=True)
                vin, vpy = gen_values(t, len(keys), rng)
                s.put(f, keys, vin)
                m.put(f, keys, vpy)
                dk = gen_keys(rng, 50, space=2000)
                s.delete(f, dk)
                m.delete(f, dk)
            if i == 2:
                s.flush()
        # the last rounds are (partly) only in the write buffer: close() must flush them
    for _ in range(2):
        with Store.open(store_path, opts) as s:
            for t in TYPES:
                check_scan(s.scan(TYPE_FEATURE[t]), m, TYPE_FEATURE[t])
            assert s.stats()["live_items"] == m.live_items()


def test_reopen_with_different_buffer_size(store_path):
    with Store.open(store_path, small_options()) as s:
        s.create_feature("n", "int64")
        s.put("n", np.arange(100, dtype=U64), np.arange(100))
    with Store.open(store_path, small_options(write_buffer_bytes=64 << 10)) as s:
        assert s.scan("n").column("value").to_pylist() == list(range(100))


# ----------------------------------------------------------------------------------------------
# statistics


def test_last_read_stats(store_path, opts):
    with Store.open(store_path, opts) as s:
        s.create_feature("n", "int64")
        s.create_feature("tiny", "int64")
        keys = np.arange(20000, dtype=U64)
        s.put("n", keys, keys.astype(np.int64))
        s.put("tiny", keys_of(5), np.array([5]))
    with Store.open(store_path, opts) as s:
        s.scan("n")
        full = s.last_read_stats()
        for k in READ_STATS_KEYS:
            assert k in full, (k, full)
        # 20000 int64 values (160 KB; dense keys may be stored compressed) need >= 39 pages
        assert full["pages_read"] >= 20000 * 8 // PAGE_SIZE, full
        assert full["bytes_read"] >= full["pages_read"] * 512, full
        # useful bytes are logical item bytes: 8 key bytes + the value
        assert full["useful_bytes"] == 20000 * 16, full
        assert full["seconds"] >= 0
        # the time blocked on the device is part of the read's time
        assert 0 <= full["io_wait_seconds"] <= full["seconds"], full
        # reads in flight: at least one read, at most the budget (reads no larger than it)
        assert 0 < full["peak_inflight_bytes"] <= max(opts.read_inflight_bytes, opts.max_io_bytes), full
        assert full["read_amplification"] == pytest.approx(
            full["bytes_read"] / full["useful_bytes"], rel=1e-4)
        # a packed, never-updated feature: little read amplification (it may be < 1 because
        # dense keys are stored compressed while useful bytes count 8 bytes per key)
        assert 0 < full["read_amplification"] < 3.0, full
        # per-page key ranges: a narrow key range reads a few pages, not the feature
        s.scan("n", key_range=(10000, 10100))
        part = s.last_read_stats()
        assert 0 < part["pages_read"] <= 3, part
        s.get("n", keys_of(12345))
        one = s.last_read_stats()
        assert 0 < one["pages_read"] <= 2, one
        s.get("n", keys_of(1, 10001, 19999))
        three = s.last_read_stats()
        assert 0 < three["pages_read"] <= 6, three
        assert 0 < three["peak_inflight_bytes"] <= three["bytes_read"], three
        s.scan("tiny")
        tiny = s.last_read_stats()
        assert tiny["pages_read"] <= 1, tiny
        agg = s.stats()
        assert agg["pages_read"] >= full["pages_read"] + part["pages_read"] + one["pages_read"]
        assert agg["bytes_read"] > 0 and agg["useful_bytes_read"] > 0
        assert agg["read_amplification"] == pytest.approx(
            agg["bytes_read"] / agg["useful_bytes_read"], rel=1e-4)


def test_read_requests_count_runs_of_adjacent_pages(store_path):
    """read_requests counts the device reads a scan's pages took: runs of adjacent pages, each
    up to max_io_bytes; pages of a feature written in separate flushes between another
    feature's pages each cost a read of their own."""
    rng = np.random.default_rng(7)
    per_read = 4
    opts = small_options(max_io_bytes=per_read * PAGE_SIZE, merger_enabled=False, pinner_enabled=False)
    with Store.open(store_path, opts) as s:
        for f in ("packed", "a", "b"):
            s.create_feature(f, "int64")
        keys = np.sort(rng.choice(1 << 40, 6000, replace=False)).astype(U64)
        s.put("packed", keys, rng.integers(0, 1 << 62, keys.size))
        s.flush()
        # "a" and "b" alternate, one page-sized batch per flush: their pages interleave.
        per_page = PAGE_SIZE // 20
        for i in range(5):
            for f in ("a", "b"):
                k = np.sort(rng.choice(1 << 40, per_page, replace=False)).astype(U64)
                s.put(f, k, rng.integers(0, 1 << 62, k.size))
                s.flush()
    with Store.open(store_path, opts) as s:
        s.scan("packed")
        packed = s.last_read_stats()
        assert packed["pages_read"] > per_read, packed
        assert packed["read_requests"] == -(-packed["pages_read"] // per_read), packed
        assert s.account_scan("packed")["read_requests"] == packed["read_requests"]
        s.scan("a")
        a = s.last_read_stats()
        assert a["pages_read"] >= 5 and a["read_requests"] == a["pages_read"], a
        assert s.account_scan("a")["read_requests"] == a["read_requests"]
        # key_ranges names the pages the scan read: "a"'s pages lie between "b"'s, one apart.
        pa_ = np.sort(s.key_ranges("a")["page"])
        pb_ = np.sort(s.key_ranges("b")["page"])
        assert pa_.dtype == np.uint32 and len(pa_) == a["pages_read"] and len(np.unique(pa_)) == len(pa_)
        assert not set(pa_.tolist()) & set(pb_.tolist())
        assert np.all(np.diff(pa_.astype(np.int64)) > 1), pa_
        pp = np.sort(s.key_ranges("packed")["page"])
        assert len(pp) == packed["pages_read"] and np.all(np.diff(pp.astype(np.int64)) == 1), pp
        total = s.stats()["read_requests"]
        assert total == packed["read_requests"] + a["read_requests"]


def test_stats_keys_and_sane_values(store_path, opts):
    rng = np.random.default_rng(11)
    m = Model()
    # sparse random 64-bit keys: stored keys cannot be compressed below their 8 logical bytes,
    # so on-disk bytes >= live item bytes and space amplification is >= 1
    pool = np.unique(rng.integers(0, 2**63, 1500, dtype=np.uint64) * np.uint64(2))
    with Store.open(store_path, opts) as s:
        st0 = s.stats()
        for k in STATS_KEYS:
            assert k in st0, (k, sorted(st0))
        assert st0["live_items"] == 0
        assert st0["pages_in_use"] == 0
        for d in ("fragmentation", "features", "pinner", "merger", "reclaimer"):
            assert isinstance(st0[d], dict), (d, st0[d])
        for t in TYPES:
            f = TYPE_FEATURE[t]
            s.create_feature(f, t)
            m.create(f, t)
        for i in range(6):
            for t in TYPES:
                f = TYPE_FEATURE[t]
                keys = pool[gen_keys(rng, 400, space=len(pool), skew=bool(i % 2), edges=False)
                            .astype(np.int64)]
                vin, vpy = gen_values(t, len(keys), rng)
                s.put(f, keys, vin)
                m.put(f, keys, vpy)
            dk = pool[rng.integers(0, len(pool), 100)]
            s.delete("count", dk)
            m.delete("count", dk)
            s.flush()
        st = s.stats()
        # live_items counts items on pages; the pinner may still hold a few in DRAM
        assert 0 < st["live_items"] <= m.live_items()
        for t in TYPES:
            f = TYPE_FEATURE[t]
            for k in ("items", "pages", "valid_bytes", "fragmentation"):
                assert k in st["features"][f], (f, st["features"][f])
            assert f in st["fragmentation"]
        assert st["flushes"] >= 6
        assert st["pages_written"] > 0 and st["pages_in_use"] > 0
        assert st["bytes_written"] >= st["pages_written"] * 512  # device writes happened
        assert st["user_bytes_written"] > 0
        assert st["wal_bytes_written"] >= st["user_bytes_written"] * 0.5
        assert 0 < st["write_amplification"] < 1000
        assert st["live_item_bytes"] > 0
        assert st["file_bytes"] >= st["pages_in_use"] * PAGE_SIZE * 0.5
        assert st["metadata_dram_bytes"] > 0
        assert st["metadata_dram_bytes_per_item"] == pytest.approx(
            st["metadata_dram_bytes"] / st["live_items"], rel=0.05)
        assert st["disk_bytes_per_item"] > 0
        # every item must be stored somewhere: bytes in use cover the live bytes
        assert st["space_amplification"] >= 1.0, st["space_amplification"]
    with Store.open(store_path, opts) as s:
        st = s.stats()
        assert st["live_items"] == m.live_items()
        assert st["pages_in_use"] > 0
        assert st["space_amplification"] >= 1.0
        assert st["pages_in_use"] * PAGE_SIZE >= st["live_item_bytes"] * 0.9
        for t in TYPES:
            f = TYPE_FEATURE[t]
            assert st["features"][f]["items"] == len(m.data[f])
            assert st["features"][f]["pages"] >= 1
            assert st["features"][f]["valid_bytes"] > 0
            assert st["features"][f]["fragmentation"] >= 1.0 - 1e-9


def test_merger_pinner_reclaimer_run_under_updates(store_path):
    """Many update rounds with a small buffer: the pinner and the merger must really act, space
    stays bounded and the data stays right."""
    opts = small_options(write_buffer_bytes=96 << 10)
    rng = np.random.default_rng(5)
    m = Model()
    # a few big features updated uniformly + several small, frequently updated ones
    feats = {"big0": "int64", "big1": "float32", "big2": "binary", "big3": FSL_TYPE}
    feats.update({f"hot{i}": "int64" for i in range(6)})
    space_amp = []
    with Store.open(store_path, opts) as s:
        for f, t in feats.items():
            s.create_feature(f, t)
            m.create(f, t)
        for f, t in feats.items():  # initial load
            n = 3000 if f.startswith("big") else 200
            keys = np.arange(n, dtype=U64)
            vin, vpy = gen_values(t, n, rng)
            s.put(f, keys, vin)
            m.put(f, keys, vpy)
        s.flush()
        for rnd in range(40):
            for f, t in feats.items():
                if f.startswith("big"):
                    keys = np.unique(gen_keys(rng, 300, space=3000, edges=False))
                else:
                    keys = np.unique(gen_keys(rng, 8, space=200, skew=True, edges=False))
                vin, vpy = gen_values(t, len(keys), rng)
                s.put(f, keys, vin)
                m.put(f, keys, vpy)
            s.flush()
            space_amp.append(s.stats()["space_amplification"])
        st = s.stats()
        for f in feats:
            check_scan(s.scan(f), m, f)
        merger, pinner, reclaimer = st["merger"], st["pinner"], st["reclaimer"]
        # the hot features' 8-item batches stay under 1/4 page: the pinner keeps them back
        assert pinner["features_pinned"] > 0 and pinner["items_pinned"] > 0, pinner
        assert pinner["released_threshold"] + pinner["released_age"] > 0, pinner
        # uniform updates scatter the big features: the merger re-packs them
        assert merger["victims"] > 0 and merger["items_moved"] > 0, merger
        assert merger["pages_written"] > 0 and merger["pages_released"] > 0, merger
        for k in ("runs", "pages_cleaned", "items_moved", "pages_released"):
            assert k in reclaimer, reclaimer
        for name, fr in st["fragmentation"].items():
            assert fr < 3.0, (name, st["fragmentation"])  # merges keep features packed
        # reclamation keeps space bounded under endless uniform updates
        assert max(space_amp[20:]) < 4.0, space_amp
        assert max(space_amp[30:]) <= max(space_amp[10:20]) * 1.5 + 0.5, space_amp
    with Store.open(store_path, opts) as s:
        for f in feats:
            check_scan(s.scan(f), m, f)
        assert s.stats()["live_items"] == m.live_items()


def test_flush_on_empty_and_repeated_flush_sync(open_store):
    s = open_store()
    s.flush()
    s.sync()
    s.create_feature("n", "int64")
    s.flush()
    s.put("n", keys_of(1), np.array([1]))
    s.sync()
    s.sync()
    s.flush()
    s.flush()
    assert s.scan("n").to_pylist() == [{"key": 1, "value": 1}]


@pytest.mark.parametrize("merger_enabled", [True, False], ids=["merger", "reclaimer-only"])
def test_space_bounded_under_endless_uniform_updates(store_path, merger_enabled):
    """SPEC §1 space reclamation: under endless uniform updates over many features (so pages
    mix features and old pages keep a few valid items) the pages in use stop growing. With the
    merger switched off (StoreOptions.merger_enabled, an engine knob) reclamation alone must
    bound it."""
    rng = np.random.default_rng(8)
    opts = small_options(write_buffer_bytes=64 << 10, merger_enabled=merger_enabled)
    feats = [f"f{i}" for i in range(40)]
    m = Model()
    pages = []
    with Store.open(store_path, opts) as s:
        for f in feats:
            s.create_feature(f, "int64")
            m.create(f, "int64")
            keys = np.arange(2000, dtype=U64)
            s.put(f, keys, keys.astype(np.int64))
            m.put(f, keys, list(range(2000)))
        s.flush()
        initial = s.stats()["pages_in_use"]
        for rnd in range(150):
            for f in feats:
                k = np.unique(rng.integers(0, 2000, 20)).astype(U64)
                v = rng.integers(-1000, 1000, len(k))
                s.put(f, k, v)
                m.put(f, k, v.tolist())
            s.flush()
            pages.append(s.stats()["pages_in_use"])
        st = s.stats()
        if not merger_enabled:
            assert st["reclaimer"]["runs"] > 0 and st["reclaimer"]["pages_released"] > 0, \
                st["reclaimer"]
        assert max(pages[100:]) <= 1.35 * max(pages[40:80]), pages
        assert max(pages) <= 3 * initial, (initial, pages)
        for f in feats[:5]:
            check_scan(s.scan(f), m, f)
    with Store.open(store_path, opts) as s:
        for f in feats:
            check_scan(s.scan(f), m, f)
        assert s.stats()["live_items"] == m.live_items()


def test_merge_run_weight_leaves_fewer_device_reads(tmp_path):
    """merge_run_weight makes merges gather a feature's lone pages before pages inside its runs
    of adjacent pages: after the same uniform updates, scanning every feature takes fewer
    device reads, and the data is the same."""
    def build(path, weight):
        rng = np.random.default_rng(11)
        opts = small_options(write_buffer_bytes=64 << 10, merge_run_weight=weight)
        names = [f"f{i}" for i in range(6)]
        keys = {f: np.sort(rng.choice(1 << 40, 5000, replace=False)).astype(U64) for f in names}
        with Store.open(path, opts) as s:
            for f in names:
                s.create_feature(f, "int64")
                s.put(f, keys[f], rng.integers(0, 1 << 62, keys[f].size))
            s.flush()
            for _ in range(30):
                for f in names:
                    k = np.unique(rng.choice(keys[f], 400))
                    s.put(f, k, rng.integers(0, 1 << 62, k.size))
                s.flush()
        requests, data = 0, {}
        with Store.open(path, opts) as s:
            assert s.stats()["merger"]["run_weight"] == weight
            for f in names:
                t = s.scan(f)
                data[f] = (t.column(0).to_numpy(), t.column(1).to_numpy())
                requests += s.last_read_stats()["read_requests"]
        return requests, data

    plain, d0 = build(str(tmp_path / "plain"), 0.0)
    runs, d1 = build(str(tmp_path / "runs"), 1.0)
    for f in d0:
        assert np.array_equal(d0[f][0], d1[f][0]) and np.array_equal(d0[f][1], d1[f][1]), f
    assert runs < plain, (runs, plain)


def test_current_index_of_gapless_rows_stays_deferred_across_a_clean_reopen(store_path):
    """A fixed-width feature whose live records are all current, in disjoint gapless key ranges
    and without tombstones (an embedding table, updated, then compact()ed) reopens from the
    checkpoint with no per-key index: lookups name pages through the page table, so DRAM stays
    O(pages) instead of 4 bytes per key. The first update builds the index again from the page
    table, with no page read; every read stays exact. A feature with gaps keeps its index."""
    n = 20000
    keys = np.arange(n, dtype=U64)
    rng = np.random.default_rng(5)
    vals = rng.standard_normal((n, 8)).astype(np.float32)
    opts = small_options()
    with Store.open(store_path, opts) as s:
        s.create_feature("e", FSL_TYPE)
        s.create_feature("sparse", FSL_TYPE)
        s.put("sparse", keys * 3, vals)
        s.put("e", keys, vals)
        s.flush()
        s.put("e", keys[::7], vals[::7] + 1)  # an update: the index is built, pages overlap
        vals[::7] += 1
        s.flush()
        s.put("sparse", keys[::7] * 3, vals[::7])
        s.compact(["e", "sparse"])
        assert s.stats()["features"]["e"]["key_index_bytes"] >= 4 * n
    probe = keys[[0, 1, 7, 4999, n - 1]]

    def scan_equals(s):
        t = s.scan("e")
        np.testing.assert_array_equal(t.column("key").to_numpy(), keys)
        np.testing.assert_array_equal(t.column("value").combine_chunks().flatten().to_numpy().reshape(-1, 8), vals)

    with Store.open(store_path, opts) as s:
        for _ in range(2):  # before and after the first lookup decodes the checkpoint's index
            got = s.get("e", probe)
            np.testing.assert_array_equal(got.flatten().to_numpy().reshape(-1, 8), vals[[0, 1, 7, 4999, n - 1]])
            rows, _ = s.gather_rows("e", probe)
            np.testing.assert_array_equal(rows, vals[[0, 1, 7, 4999, n - 1]])
            assert s.stats()["features"]["e"]["key_index_bytes"] < 64, "deferred: no per-key state"
        r0 = s.stats()["pages_read"]
        np.testing.assert_array_equal(s.scan_keys("e"), keys)
        assert s.stats()["pages_read"] == r0, "keys-only scan of gapless segments: from the page table"
        ks = s.scan_keys("sparse")
        np.testing.assert_array_equal(ks, keys * 3)
        assert s.stats()["features"]["sparse"]["key_index_bytes"] >= 4 * n, "gaps: the checkpoint's index"
        scan_equals(s)
        read0 = s.stats()["pages_read"]
        s.put("e", keys[[2, 4]], np.zeros((2, 8), np.float32))
        vals[[2, 4]] = 0
        s._s.flush(True)  # past the pinner, which would keep two items back
        read = s.stats()["pages_read"] - read0
        assert read == 0, f"the index of gapless segments comes from the page table, not {read} page reads"
        assert s.stats()["features"]["e"]["key_index_bytes"] >= 4 * n
        rows, _ = s.gather_rows("e", keys[:8])
        np.testing.assert_array_equal(rows, vals[:8])
    with Store.open(store_path, opts) as s:  # updated: two versions of keys 2 and 4 on disk
        rows, _ = s.gather_rows("e", keys[:8])
        np.testing.assert_array_equal(rows, vals[:8])
        scan_equals(s)
        assert s.stats()["features"]["e"]["key_index_bytes"] > 64
