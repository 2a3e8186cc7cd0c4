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
