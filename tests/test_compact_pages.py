"""Compact pages (StoreOptions.compact_pages): int64 values packed frame-of-reference and key
bitmaps. Bulk appends go through PageBuilder::AddRun, which sizes a run of items at once; these
tests check it packs pages as densely as the per-item path and round-trips every value width."""
import math

import numpy as np
import pytest

from recflash.reader import Store, StoreOptions

PAGE = 16384
# Header, one directory entry, the segment body header and the packed segment's i64 base.
PAGE_OVERHEAD = 40 + 32 + 8 + 8


def _write(path, keys, vals, bulk_load=True):
    with Store.open(path, StoreOptions(compact_pages=True, bulk_load=bulk_load)) as st:
        st.create_feature("a", "int64")
        st.put("a", keys, vals)
        st.sync()
        return st.stats()["features"]["a"]["pages"]


def _scan(path):
    with Store.open(path) as st:
        tab = st.scan("a")
        return tab.column("key").to_numpy(), tab.column("value").to_numpy()


@pytest.mark.parametrize("value_range,pack", [(200, 1), (60000, 2), (2**31, 4)])
def test_bulk_appends_pack_values_to_page_capacity(tmp_path, value_range, pack):
    n = 300_000
    keys = np.arange(n, dtype=np.uint64)
    vals = (np.arange(n, dtype=np.int64) * 7919) % value_range - 5
    pages = _write(str(tmp_path / "s"), keys, vals)
    per_page = (PAGE - PAGE_OVERHEAD) // pack
    assert pages == math.ceil(n / per_page)
    k, v = _scan(str(tmp_path / "s"))
    assert np.array_equal(k, keys) and np.array_equal(v, vals)


def test_bulk_appends_use_key_bitmaps_for_near_dense_keys(tmp_path):
    n = 200_000
    keys = np.arange(0, 2 * n, 2, dtype=np.uint64)  # every other key: 2 bits of bitmap per item
    vals = np.arange(n, dtype=np.int64) % 100
    pages = _write(str(tmp_path / "s"), keys, vals)
    # 1 byte of value + 1/4 byte of bitmap per item (varint deltas would cost a whole byte)
    assert pages <= math.ceil(n / ((PAGE - PAGE_OVERHEAD) / 1.25)) + 1
    k, v = _scan(str(tmp_path / "s"))
    assert np.array_equal(k, keys) and np.array_equal(v, vals)


def test_value_range_widening_mid_run_round_trips(tmp_path):
    """Outliers widen a page's packed width from 1 to 8 bytes part-way through a run; the
    run stops exactly where the wider segment no longer fits."""
    rng = np.random.default_rng(3)
    n = 150_000
    keys = np.cumsum(rng.integers(1, 40, n)).astype(np.uint64)
    vals = rng.integers(0, 100, n).astype(np.int64)
    for at, v in [(5000, 1000), (9000, 10**6), (20000, 2**40), (60000, -(2**62)), (61000, 2**62)]:
        vals[at] = v
    _write(str(tmp_path / "bulk"), keys, vals)
    k, v = _scan(str(tmp_path / "bulk"))
    assert np.array_equal(k, keys) and np.array_equal(v, vals)


def test_bulk_and_per_item_paths_agree(tmp_path):
    """The same items through AddRun (bulk appends) and through per-item adds (a normal
    store whose second put overlaps the first, so the flush merges records item by item)
    take the same number of pages."""
    rng = np.random.default_rng(11)
    n = 100_000
    keys = np.sort(rng.choice(4 * n, n, replace=False)).astype(np.uint64)
    vals = rng.integers(-300, 300, n).astype(np.int64)
    bulk = _write(str(tmp_path / "bulk"), keys, vals)
    with Store.open(str(tmp_path / "item"), StoreOptions(compact_pages=True)) as st:
        st.create_feature("a", "int64")
        odd = np.arange(n) % 2 == 1
        st.put("a", keys[odd], vals[odd])  # interleaved: not an append run
        st.put("a", keys[~odd], vals[~odd])
        st.sync()
        st.compact()
        item = st.stats()["features"]["a"]["pages"]
        tab = st.scan("a")
    assert np.array_equal(tab.column("key").to_numpy(), keys)
    assert np.array_equal(tab.column("value").to_numpy(), vals)
    assert bulk == item


# -- dictionary packing (page format 4) ----------------------------------------------------------

@pytest.mark.parametrize("distinct", [1, 2, 300, 4096, 5000])
def test_few_distinct_ids_are_dictionary_packed(tmp_path, distinct):
    """Hashed categorical ids span 32 bits (4 bytes each packed by range); a page's few hundred
    distinct ids take a dictionary and DictBits(distinct) bits per record instead."""
    rng = np.random.default_rng(distinct)
    n = 200_000
    ids = rng.integers(0, 2**32, distinct, dtype=np.int64)
    ids[0] = 2**32 - 1  # the range needs 4 bytes
    vals = ids[rng.integers(0, distinct, n)]
    keys = np.arange(n, dtype=np.uint64)
    pages = _write(str(tmp_path / "s"), keys, vals)
    by_range = math.ceil(n / ((PAGE - PAGE_OVERHEAD) // 4))
    bits = 0 if distinct == 1 else math.ceil(math.log2(distinct))
    if bits and bits < 12:
        # a page's values cost about bits/8 bytes each plus the dictionary
        assert pages <= math.ceil(n * bits / 8 / (PAGE - PAGE_OVERHEAD - 16 - 4 * distinct)) + 1
    if distinct == 1:
        assert pages <= 2  # keys run, values one entry: nothing per record
    if distinct >= 4096:
        assert pages <= by_range  # never worse than packing by range
    k, v = _scan(str(tmp_path / "s"))
    assert np.array_equal(k, keys) and np.array_equal(v, vals)


def test_dictionary_segments_through_updates_deletes_and_full_int64_range(tmp_path):
    """The per-item path (updates, tombstones) sizes dictionaries too; entries spanning the whole
    int64 range are stored 8 bytes each; merges and compact() re-encode them."""
    path = str(tmp_path / "s")
    rng = np.random.default_rng(5)
    n = 60_000
    keys = np.arange(n, dtype=np.uint64) * 3
    pool = np.array([-(2**63), 2**63 - 1, 0, -1, 12345, 2**40], np.int64)
    vals = pool[rng.integers(0, len(pool), n)]
    ref = dict(zip(keys.tolist(), vals.tolist()))
    with Store.open(path, StoreOptions(compact_pages=True, write_buffer_bytes=1 << 20)) as st:
        st.create_feature("a", "int64")
        st.put("a", keys, vals)
        st.flush()
        for r in range(3):
            upd = rng.choice(n, 5000, replace=False)
            newv = pool[rng.integers(0, len(pool), 5000)]
            st.put("a", keys[upd], newv)
            ref.update(zip(keys[upd].tolist(), newv.tolist()))
            gone = rng.choice(n, 1000, replace=False)
            st.delete("a", keys[gone])
            for g in keys[gone].tolist():
                ref.pop(g, None)
            st.flush()
        tab = st.scan("a")
        assert dict(zip(tab.column("key").to_pylist(), tab.column("value").to_pylist())) == ref
        st.compact()
        got = st.get("a", keys[:500])
        assert [x for x in got.to_pylist() if x is not None] == [ref[k] for k in keys[:500].tolist() if k in ref]
    with Store.open(path) as st:
        tab = st.scan("a")
        assert dict(zip(tab.column("key").to_pylist(), tab.column("value").to_pylist())) == ref
