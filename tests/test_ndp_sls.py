"""The NDP SLS engine against torch.nn.EmbeddingBag, model updates, layouts and bad input."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from recflash.ndp import EmbeddingStore, SlsEngine, SlsRequest
from recflash.reader import Store, StoreOptions
from recflash.reader.errors import CorruptionError, InvalidArgumentError, SchemaError, UnknownFeatureError

ROWS, DIM = 5000, 32


@pytest.fixture
def tables(tmp_path):
    store = Store.open(str(tmp_path / "s"), StoreOptions(write_buffer_bytes=4 << 20))
    t = EmbeddingStore(store)
    rng = np.random.default_rng(0)
    weights = {}
    for name, rows, dim in (("a", ROWS, DIM), ("b", 700, 16)):
        w = rng.standard_normal((rows, dim)).astype(np.float32)
        t.create_table(name, rows, dim)
        t.load_table(name, w, progress=False)
        weights[name] = w
    yield t, weights
    store.close()


def _bags(rng, rows, batch, max_len, allow_empty=True):
    lengths = rng.integers(0 if allow_empty else 1, max_len + 1, batch)
    offsets = np.concatenate([[0], np.cumsum(lengths)[:-1]]).astype(np.int64)
    indices = rng.integers(0, rows, int(lengths.sum())).astype(np.int64)
    return indices, offsets


def _reference(w, indices, offsets, mode, psw=None):
    bag = torch.nn.EmbeddingBag.from_pretrained(torch.from_numpy(w), mode=mode)
    return bag(torch.from_numpy(indices), torch.from_numpy(offsets),
               per_sample_weights=None if psw is None else torch.from_numpy(psw)).numpy()


@pytest.mark.parametrize("vector_grained,dense_page_rows", [(True, 0), (True, None), (False, None)])
@pytest.mark.parametrize("mode", ["sum", "mean"])
def test_sls_equals_embedding_bag(tables, mode, vector_grained, dense_page_rows):
    t, weights = tables
    eng = SlsEngine(t, vector_grained=vector_grained, dense_page_rows=dense_page_rows)
    rng = np.random.default_rng(1)
    ia, oa = _bags(rng, ROWS, 64, 40)
    ib, ob = _bags(rng, 700, 17, 5)
    ib[:4] = ib[0]  # duplicate ids inside and across bags
    out = eng.sls([SlsRequest("a", ia, oa, mode), SlsRequest("b", ib, ob, mode)])
    np.testing.assert_allclose(out[0], _reference(weights["a"], ia, oa, mode), rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(out[1], _reference(weights["b"], ib, ob, mode), rtol=1e-5, atol=1e-5)
    st = eng.last_stats
    assert st["lookups"] == len(ia) + len(ib)
    assert st["unique_rows"] <= st["lookups"]
    g = st["gather"]
    if vector_grained and dense_page_rows == 0:  # block reads only
        assert g["vector_rows"] == st["unique_rows"] and g["page_rows"] == 0 and g["dense_pages"] == 0
        assert g["device_bytes"] <= 512 * g["vector_rows"], "rows of <= 512 B cost at most one 512-byte block"
    elif vector_grained:  # 64 bags of up to 40 ids over 40 pages of 'a': most pages are read whole
        assert g["dense_pages"] > 0 and g["page_rows"] > 0 and g["vector_rows"] + g["page_rows"] == st["unique_rows"]


def test_per_sample_weights_empty_bags_and_torch_tensors(tables):
    t, weights = tables
    eng = SlsEngine(t)
    rng = np.random.default_rng(2)
    idx, off = _bags(rng, ROWS, 32, 8)
    off[5] = off[4]  # force an empty bag
    idx_t, off_t = torch.from_numpy(idx), torch.from_numpy(off)
    psw = rng.random(len(idx)).astype(np.float32)
    out = eng.sls([SlsRequest("a", idx_t, off_t, "sum", torch.from_numpy(psw))])[0]
    assert isinstance(out, torch.Tensor) and out.shape == (32, DIM)
    np.testing.assert_allclose(out.numpy(), _reference(weights["a"], idx, off, "sum", psw), rtol=1e-5, atol=1e-5)
    empty = eng.sls([SlsRequest("a", np.zeros(0, np.int64), np.zeros(3, np.int64))])[0]
    assert empty.shape == (3, DIM) and not empty.any()


def test_update_rows_visible_before_and_after_flush_and_compact(tables):
    t, weights = tables
    eng = SlsEngine(t, dense_page_rows=0)  # block reads only: which rows have a computed address
    ids = np.array([3, 17, 4999, 17], dtype=np.int64)
    new = np.full((4, DIM), 7.0, np.float32)
    new[3] = 9.0  # the last write of id 17 wins
    t.update_rows("a", ids, new)
    w = weights["a"].copy()
    w[[3, 4999]] = 7.0
    w[17] = 9.0
    idx = np.array([3, 17, 100, 4999, 17], dtype=np.int64)
    off = np.array([0, 2], dtype=np.int64)
    for stage in ("buffered", "flushed", "compacted"):
        if stage == "flushed":
            t.store.flush()
        if stage == "compacted":
            t.compact("a")
        for vg in (True, False):
            out = SlsEngine(t, vector_grained=vg).sls([SlsRequest("a", idx, off)])[0]
            np.testing.assert_allclose(out, _reference(w, idx, off, "sum"), rtol=1e-5, err_msg=stage)
    np.testing.assert_allclose(t.read_rows("a", [17, 3]), w[[17, 3]])
    g = eng.sls([SlsRequest("a", idx, off)]) and eng.last_stats["gather"]
    assert g["vector_rows"] == 4 and g["page_rows"] == 0, "after compact() every row is in the packed layout"


def test_rows_survive_reopen(tmp_path):
    path = str(tmp_path / "s")
    w = np.random.default_rng(3).standard_normal((1000, 8)).astype(np.float32)
    with Store.open(path) as s:
        t = EmbeddingStore(s)
        t.create_table("t", 1000, 8)
        t.load_table("t", w, progress=False)
        t.update_rows("t", [5], np.zeros((1, 8), np.float32))
    w[5] = 0
    with Store.open(path) as s:
        t = EmbeddingStore(s)
        assert t.info("t").num_rows == 1000
        np.testing.assert_allclose(t.read_rows("t", np.arange(1000)), w)


def test_bad_input(tables):
    t, _ = tables
    eng = SlsEngine(t)
    with pytest.raises(InvalidArgumentError, match="out of range for table 'a'"):
        eng.sls([SlsRequest("a", np.array([ROWS]), np.array([0]))])
    with pytest.raises(InvalidArgumentError, match="offsets decrease"):
        eng.sls([SlsRequest("a", np.array([1, 2, 3]), np.array([0, 2, 1]))])
    with pytest.raises(UnknownFeatureError, match="unknown embedding table 'nope'"):
        eng.sls([SlsRequest("nope", np.array([1]), np.array([0]))])
    with pytest.raises(SchemaError, match="weights have shape"):
        t.load_table("b", np.zeros((700, 3), np.float32), progress=False)
    with pytest.raises(SchemaError, match="rows of shape"):
        t.update_rows("a", [1, 2], np.zeros((2, DIM + 1), np.float32))
    with pytest.raises(InvalidArgumentError, match="mode"):
        eng.sls([SlsRequest("a", np.array([1]), np.array([0]), mode="max")])


CACHE_CONFIGS = {
    "row_cache": dict(row_cache_bytes=64 << 10),
    "hot_rows": dict(hot_rows_bytes=64 << 10),
    "pooled_cache": dict(pooled_cache_bytes=256 << 10, pooled_min_bag=4),
    "device_cache": dict(device_cache_bytes=256 << 10),
    "all": dict(row_cache_bytes=32 << 10, hot_rows_bytes=16 << 10, pooled_cache_bytes=256 << 10,
                pooled_min_bag=2, device_cache_bytes=64 << 10),
}


@pytest.mark.parametrize("config", sorted(CACHE_CONFIGS))
def test_caches_are_exact_hit_and_stay_coherent(tables, config):
    t, weights = tables
    w = weights["a"].copy()
    eng = SlsEngine(t, **CACHE_CONFIGS[config])
    rng = np.random.default_rng(4)
    # a skewed trace: a few hot rows recur across batches, and whole bags repeat
    hot = rng.integers(0, ROWS, 20)
    batches = []
    for _ in range(6):
        idx = np.where(rng.random(64 * 6) < 0.7, rng.choice(hot, 64 * 6), rng.integers(0, ROWS, 64 * 6))
        off = np.arange(0, 64 * 6, 6, dtype=np.int64)
        batches.append((idx.astype(np.int64), off))
    batches.append(batches[0])  # identical bags again: pooled-cache hits
    if "hot_rows_bytes" in CACHE_CONFIGS[config]:
        eng.profile([SlsRequest("a", i, o) for i, o in batches])
    for i, o in batches:
        out = eng.sls([SlsRequest("a", i, o)])[0]
        np.testing.assert_allclose(out, _reference(w, i, o, "sum"), rtol=1e-5, atol=1e-5)
    cs = eng.cache_stats()
    used = {"row_cache": ["row_cache"], "hot_rows": ["hot_rows"], "pooled_cache": ["pooled_cache"],
            "device_cache": ["device_cache"], "all": ["row_cache", "hot_rows", "pooled_cache"]}[config]
    for c in used:
        assert cs[c]["hits"] > 0, (c, cs[c])
        assert cs[c]["bytes"] <= cs[c]["budget_bytes"], (c, cs[c])
    # model update while serving: every cached copy follows
    upd = np.unique(np.concatenate([hot[:10], batches[0][0][:30]]))
    new_rows = rng.standard_normal((len(upd), DIM)).astype(np.float32)
    t.update_rows("a", upd, new_rows)
    w[upd] = new_rows
    for i, o in batches:
        out = eng.sls([SlsRequest("a", i, o)])[0]
        np.testing.assert_allclose(out, _reference(w, i, o, "sum"), rtol=1e-5, atol=1e-5,
                                   err_msg=f"{config}: stale cache after update_rows")



def test_row_cache_keeps_rows_hit_twice_through_a_scan_of_rows_seen_once(tables):
    """The row cache is a segmented LRU: 100 rows looked up twice (a hit each) outlive 800 rows
    looked up once in a cache that holds 200, and are hits again afterwards; a plain LRU would
    have evicted all of them. Rows seen once leave first, so the cache stays within budget."""
    t, weights = tables
    w = weights["a"]
    eng = SlsEngine(t, row_cache_bytes=200 * (4 * DIM + 64))  # room for 200 rows (bytes + 64 each)

    def run(ids):
        ids = np.asarray(ids, dtype=np.int64)
        off = np.arange(0, len(ids), 10, dtype=np.int64)
        out = eng.sls([SlsRequest("a", ids, off)])[0]
        np.testing.assert_allclose(out, _reference(w, ids, off, "sum"), rtol=1e-5, atol=1e-5)
        return eng.cache_stats()["row_cache"]

    hot = np.arange(0, 100)
    run(hot)
    before = run(hot)  # all hits: each row now in the protected segment
    assert before["hits"] == 100, before
    scan = np.arange(1000, 1800)  # 800 rows seen once, four times the cache
    after_scan = run(scan)
    assert after_scan["hits"] == 100 and after_scan["misses"] == 100 + 800, after_scan
    again = run(hot)
    assert again["hits"] - after_scan["hits"] == 100, again  # every hot row survived the scan
    assert again["bytes"] <= again["budget_bytes"], again
    assert again["evictions"] == 100 + 800 - 200, again

@pytest.fixture
def reverse_completions():
    """io_uring completions delivered in descending request order (a deterministic test knob)."""
    from recflash import _native

    _native._set_io_completion_order("reverse")
    yield
    _native._set_io_completion_order("arrival")


@pytest.mark.parametrize("order", ["arrival", "reverse"])
def test_page_granular_rows_correct_for_many_pages(tmp_path, request, order):
    """Pages complete in any order: every row must still land in its place (regression).

    With order="reverse" the ring hands each window of completed reads back highest page
    first, so code that walks a page's rows with a cursor assuming ascending pages loses the
    rows of every earlier page — deterministically, not only when the device reorders.
    """
    if order == "reverse":
        request.getfixturevalue("reverse_completions")
    with Store.open(str(tmp_path / "s"), StoreOptions(write_buffer_bytes=8 << 20)) as s:
        t = EmbeddingStore(s)
        rng = np.random.default_rng(12)
        ws = {}
        for name in ("p0", "p1", "p2"):
            ws[name] = rng.standard_normal((60_000, 32)).astype(np.float32)
            t.create_table(name, 60_000, 32)
            t.load_table(name, ws[name], progress=False)
        ids = rng.integers(0, 60_000, 4000)
        for name in ws:
            for vg in (False, True):
                np.testing.assert_array_equal(t.read_rows(name, ids, vector_grained=vg), ws[name][ids])
        # rows outside the packed layout (updated, flushed, not compacted) take the page path too
        upd = rng.choice(60_000, 3000, replace=False)
        new = rng.standard_normal((3000, 32)).astype(np.float32)
        t.update_rows("p1", upd, new)
        s.flush()
        ws["p1"][upd] = new
        np.testing.assert_array_equal(t.read_rows("p1", ids), ws["p1"][ids])
        idx, off = _bags(rng, 60_000, 128, 30)
        for vg in (False, True):
            out = SlsEngine(t, vector_grained=vg).sls([SlsRequest(n, idx, off) for n in ws])
            for o, n in zip(out, ws):
                np.testing.assert_allclose(o, _reference(ws[n], idx, off, "sum"), rtol=1e-5, atol=1e-5)


def _corrupt_row_on_disk(store_dir, row_bytes: bytes, page_size: int = 16384) -> list:
    """Flips one byte of the row's copies in packed (single-segment) pages of pages.dat — the
    copies vector reads serve; an older copy may linger in a mixed page. Returns the offsets."""
    path = store_dir / "pages.dat"
    data = path.read_bytes()
    offs, at = [], data.find(row_bytes)
    while at >= 0:
        page = at // page_size * page_size
        if int.from_bytes(data[page + 20:page + 22], "little") == 1:  # PageHeader.nseg
            offs.append(at + 5)
        at = data.find(row_bytes, at + 1)
    assert offs, "the row must be stored"
    with open(path, "r+b") as f:
        for off in offs:
            f.seek(off)
            f.write(bytes([data[off] ^ 0x40]))
    return offs


def _one_table(store_dir, rows=20_000, **opts):
    s = Store.open(str(store_dir), StoreOptions(write_buffer_bytes=4 << 20, **opts))
    t = EmbeddingStore(s)
    w = np.random.default_rng(5).standard_normal((rows, 32)).astype(np.float32)
    t.create_table("v", rows, 32)
    t.load_table("v", w, progress=False)
    return s, t, w


def test_vector_reads_are_verified_and_cost_one_block(tmp_path):
    s, t, w = _one_table(tmp_path / "s")
    ids = np.arange(0, 20_000, 37)
    with s:
        np.testing.assert_array_equal(t.read_rows("v", ids), w[ids])
        g = t.last_gather_stats
        # load_table took the block checksums: no first-touch page reads, one 512 B block per row
        assert g["first_touch_pages"] == 0 and g["page_rows"] == 0
        assert g["verified_blocks"] == g["device_reads"] == len(ids)
        assert g["device_bytes"] == 512 * len(ids)
        assert t.verify_table("v") == 0  # nothing left to take


def test_vector_read_of_a_corrupt_row_raises(tmp_path):
    s, t, w = _one_table(tmp_path / "s")
    s.close()  # saves the block checksums
    offs = _corrupt_row_on_disk(tmp_path / "s", w[1234].tobytes())
    with Store.open(str(tmp_path / "s"), StoreOptions()) as s:
        t = EmbeddingStore(s)
        ok = np.array([1, 5000, 19_999])
        np.testing.assert_array_equal(t.read_rows("v", ok), w[ok])
        with pytest.raises(CorruptionError, match=r"block at offset \d+ \(page \d+\) of '.*pages.dat' fails its "
                                                  r"checksum .* reading row 1234 of") as e:
            t.read_rows("v", [1234])
        block = int(str(e.value).split("block at offset ")[1].split()[0])
        assert any(block <= o < block + 512 for o in offs)
        with pytest.raises(CorruptionError, match="checksum"):  # the page path checks the page crc
            t.read_rows("v", [1234], vector_grained=False)
        eng = SlsEngine(t)
        with pytest.raises(CorruptionError, match="row 1234"):
            eng.sls([SlsRequest("v", np.array([7, 1234, 9]), np.array([0, 2]))])


def test_dense_pages_are_read_whole_in_runs(tmp_path):
    """dense_page_rows: a page from which the call needs that many rows is read whole, with its
    touched neighbours, in one request per run of adjacent pages; a lone row stays a block read."""
    s, t, w = _one_table(tmp_path / "s")
    with s:
        kr = s.key_ranges(EmbeddingStore.feature_name("v"))
        first, page = kr["min_key"].astype(np.int64), kr["page"].astype(np.int64)
        assert np.all(np.diff(page[:21]) == 1), "a load packs a table into adjacent pages"
        # pages 2-5: two rows each (dense); page 6: one row, next to page 5 (joins the run);
        # page 20: one row alone (a block read)
        ids = np.array([first[p] + k for p in (2, 3, 4, 5) for k in (1, 7)] + [first[6] + 3, first[20] + 5])
        rows, g = s.gather_rows(EmbeddingStore.feature_name("v"), ids, True, 2)
        np.testing.assert_array_equal(rows, w[ids])
        assert g["dense_pages"] == 5 and g["page_rows"] == 9 and g["vector_rows"] == 1
        assert g["device_reads"] == 2, "one run of five adjacent pages + one block"
        assert g["device_bytes"] == 5 * s.page_size + 512
        assert g["first_touch_pages"] == 0  # load_table took the sums already
        # off: every row a block read
        rows, g = s.gather_rows(EmbeddingStore.feature_name("v"), ids, True, 0)
        np.testing.assert_array_equal(rows, w[ids])
        assert g["dense_pages"] == 0 and g["vector_rows"] == len(ids) and g["device_bytes"] <= 512 * len(ids)
        # through the engine's default: the same rows pooled
        eng = SlsEngine(t)
        assert eng.dense_page_rows >= 1
        out = eng.sls([SlsRequest("v", ids, np.array([0]))])[0]
        np.testing.assert_allclose(out[0], w[ids].sum(0), rtol=1e-5, atol=1e-4)
        assert eng.last_stats["gather"]["dense_pages"] == 5
        for bad in (-1, 1.5, True, "2"):
            with pytest.raises(InvalidArgumentError, match="dense_page_rows"):
                SlsEngine(t, dense_page_rows=bad)
            with pytest.raises(InvalidArgumentError, match="dense_page_rows"):
                s.gather_rows(EmbeddingStore.feature_name("v"), ids, True, bad)


def test_cached_rows_count_towards_dense_pages_but_never_cause_a_read(tmp_path):
    """With a row cache, a cached row still counts towards its page's rows (a cache must not
    turn a dense page into block reads), and a page holding only cached rows is not read."""
    s, t, w = _one_table(tmp_path / "s")
    with s:
        first = s.key_ranges(EmbeddingStore.feature_name("v"))["min_key"].astype(np.int64)
        eng = SlsEngine(t, row_cache_bytes=8 << 20, dense_page_rows=2)

        def run(ids):
            out = eng.sls([SlsRequest("v", np.array(ids), np.array([0]))])[0]
            np.testing.assert_allclose(out[0], w[ids].sum(0), rtol=1e-5, atol=1e-4)
            return eng.last_stats["gather"]

        g = run([first[2] + 1, first[2] + 7])  # page 2, two rows: read whole; both now cached
        assert g["dense_pages"] == 1 and g["rows"] == 2
        g = run([first[2] + 1, first[2] + 9])  # one cached + one new on page 2: still two rows there
        assert g["rows"] == 1 and g["dense_pages"] == 1 and g["vector_rows"] == 0 and g["device_reads"] == 1
        assert g["page_rows"] == 1  # the cached row rewritten from the page is not counted
        g = run([first[2] + 1, first[5] + 3])  # page 2 only cached: not read; page 5 one row: a block
        assert g["rows"] == 1 and g["dense_pages"] == 0 and g["vector_rows"] == 1 and g["device_reads"] == 1
        assert g["device_bytes"] == 512
        # a batch over many pages: the cache does not add requests to what no cache would read
        rng = np.random.default_rng(3)
        ids = np.unique(rng.integers(0, 20_000, 3000))
        plain = SlsEngine(t, dense_page_rows=2)
        plain.sls([SlsRequest("v", ids, np.array([0]))])
        run(ids[::2].tolist())  # half the rows cached
        g = run(ids.tolist())
        assert g["device_reads"] <= plain.last_stats["gather"]["device_reads"]
        assert g["rows"] < len(ids)


def test_dense_pages_take_block_checksums_and_verify_the_page(tmp_path):
    s, t, w = _one_table(tmp_path / "s")
    s.close()
    (tmp_path / "s" / "BLOCKSUMS").unlink()  # no sums held
    name = EmbeddingStore.feature_name("v")
    with Store.open(str(tmp_path / "s"), StoreOptions()) as s:
        ids = np.array([3, 4])  # two rows of page 0: read whole, its block sums taken
        rows, g = s.gather_rows(name, ids, True, 2)
        np.testing.assert_array_equal(rows, w[ids])
        assert g["dense_pages"] == 1 and g["first_touch_pages"] == 0
        rows, g = s.gather_rows(name, np.array([5]), True, 2)  # a lone row of it: a verified block read
        np.testing.assert_array_equal(rows, w[[5]])
        assert g["vector_rows"] == 1 and g["verified_blocks"] == 1 and g["first_touch_pages"] == 0
    offs = _corrupt_row_on_disk(tmp_path / "s", w[77].tobytes())
    assert offs
    with Store.open(str(tmp_path / "s"), StoreOptions()) as s:
        with pytest.raises(CorruptionError, match="checksum mismatch"):  # a dense page checks its page crc
            s.gather_rows(name, np.array([76, 77]), True, 2)


def test_first_touch_takes_checksums_from_a_verified_page(tmp_path):
    s, t, w = _one_table(tmp_path / "s")
    s.close()
    (tmp_path / "s" / "BLOCKSUMS").unlink()  # no sums: every packed page is read whole once
    with Store.open(str(tmp_path / "s"), StoreOptions()) as s:
        t = EmbeddingStore(s)
        ids = np.array([3, 4, 9000])
        np.testing.assert_array_equal(t.read_rows("v", ids), w[ids])
        g = t.last_gather_stats
        assert g["first_touch_pages"] == 2 and g["page_rows"] == 3 and g["device_bytes"] == 2 * s.page_size
        np.testing.assert_array_equal(t.read_rows("v", ids), w[ids])
        g = t.last_gather_stats
        assert g["first_touch_pages"] == 0 and g["vector_rows"] == 3 and g["verified_blocks"] == g["device_reads"]
    _corrupt_row_on_disk(tmp_path / "s", w[77].tobytes())
    (tmp_path / "s" / "BLOCKSUMS").unlink()
    with Store.open(str(tmp_path / "s"), StoreOptions()) as s:
        t = EmbeddingStore(s)
        with pytest.raises(CorruptionError, match=r"checksum mismatch"):  # the first touch checks the page
            t.read_rows("v", [77])
        with pytest.raises(CorruptionError, match=r"checksum mismatch"):
            t.verify_table("v")


def test_unverified_block_reads_when_disabled(tmp_path):
    s, t, w = _one_table(tmp_path / "s", verify_block_reads=False)
    s.close()
    assert not (tmp_path / "s" / "BLOCKSUMS").exists()
    _corrupt_row_on_disk(tmp_path / "s", w[10].tobytes())
    with Store.open(str(tmp_path / "s"), StoreOptions(verify_block_reads=False)) as s:
        t = EmbeddingStore(s)
        got = t.read_rows("v", [10])  # the documented trade: returned as stored, unchecked
        assert not np.array_equal(got[0], w[10])
        assert t.last_gather_stats["verified_blocks"] == 0


@pytest.mark.parametrize("vector_grained", [True, False])
def test_one_call_many_tables_same_table_twice(tables, reverse_completions, vector_grained):
    """All tables of one sls() share one ring pass; a table may appear twice; pooling order
    does not depend on the order completions arrive in."""
    t, weights = tables
    rng = np.random.default_rng(3)
    reqs, refs = [], []
    for name, rows in (("a", ROWS), ("b", 700), ("a", ROWS), ("b", 700)):
        i, o = _bags(rng, rows, 40, 12)
        reqs.append(SlsRequest(name, i, o))
        refs.append(_reference(weights[name], i, o, "sum"))
    out = SlsEngine(t, vector_grained=vector_grained).sls(reqs)
    for got, want in zip(out, refs):
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)


def test_block_checksums_survive_reopen_and_a_damaged_file_is_ignored(tmp_path):
    s, t, w = _one_table(tmp_path / "s")
    s.close()
    ids = np.array([1, 2_000, 15_000])
    for _ in range(2):  # a reopen that takes no new sums leaves the file as it is
        with Store.open(str(tmp_path / "s"), StoreOptions()) as s:
            t = EmbeddingStore(s)
            np.testing.assert_array_equal(t.read_rows("v", ids), w[ids])
            assert t.last_gather_stats["first_touch_pages"] == 0
            assert t.last_gather_stats["verified_blocks"] == 3
    f = tmp_path / "s" / "BLOCKSUMS"
    data = bytearray(f.read_bytes())
    data[100] ^= 1
    f.write_bytes(bytes(data))
    with Store.open(str(tmp_path / "s"), StoreOptions()) as s:
        t = EmbeddingStore(s)
        np.testing.assert_array_equal(t.read_rows("v", ids), w[ids])
        assert t.last_gather_stats["first_touch_pages"] == 3  # sums taken again from verified pages
