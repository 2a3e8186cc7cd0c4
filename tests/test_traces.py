"""recflash.ndp.traces: distributions, RecSSD K-locality, model shapes, batches, trace files."""

from __future__ import annotations

import numpy as np
import pytest

from recflash.ndp import SlsRequest
from recflash.ndp import traces as T


def test_model_shapes_and_scale():
    assert (T.RM1.num_tables, T.RM1.num_rows, T.RM1.dim, T.RM1.lookups) == (8, 4_000_000, 32, 80)
    assert (T.RM2.num_tables, T.RM2.num_rows, T.RM2.dim, T.RM2.lookups) == (32, 500_000, 64, 120)
    assert (T.RM3.num_tables, T.RM3.num_rows, T.RM3.dim, T.RM3.lookups) == (10, 2_000_000, 32, 20)
    s = T.model_shape("rm1", 0.25)
    assert s.num_rows == 1_000_000 and s.num_tables == 8 and s.dim == 32 and s.lookups == 80
    assert s.row_bytes == 128 and s.total_bytes == 8 * 1_000_000 * 128
    # scaling is relative to the published shape, not compounded
    assert s.scaled(0.5).num_rows == 2_000_000
    assert T.model_shape("RM2", 1e-9).num_rows == 1024  # min_rows floor
    assert T.model_shape("RM3", 0.01, lookups=7, tables=2).lookups == 7
    assert T.model_shape("RM3", 0.01, tables=2).table_names() == ["rm3_t0", "rm3_t1"]
    with pytest.raises(ValueError):
        T.model_shape("RM9")
    with pytest.raises(ValueError):
        T.model_shape("RM1", 0)


def test_uniform_ids_in_range_and_spread():
    ids = T.uniform_ids(1000, 200_000, 1)
    assert ids.dtype == np.int64 and ids.min() >= 0 and ids.max() < 1000
    counts = np.bincount(ids, minlength=1000)
    assert counts.min() > 100 and counts.max() < 320


def test_zipf_skew_matches_alpha():
    n, N = 400_000, 100_000
    ids = T.zipf_ids(N, n, 1.05, 3, scatter=False)
    assert ids.min() >= 0 and ids.max() < N
    counts = np.bincount(ids, minlength=N)
    # P(rank r) ~ r^-alpha: rank 1 vs rank 10 is about 10**1.05
    assert 8 < counts[0] / counts[9] < 16
    assert counts[0] > counts[1] > counts[3]
    # scattered: the same popularity profile under a bijection of the row ids
    sc = T.zipf_ids(N, n, 1.05, 3, scatter=True)
    c2 = np.bincount(sc, minlength=N)
    assert np.array_equal(np.sort(counts), np.sort(c2))
    top = np.argsort(-c2)[:100]
    assert np.ptp(top) > N // 4, "hot rows are spread over the table"
    # a larger alpha concentrates more
    assert T.hot_mass(T.zipf_ids(N, n, 1.4, 4), N, 0.01) > T.hot_mass(sc, N, 0.01)
    with pytest.raises(ValueError):
        T.zipf_ids(N, 10, 0)


def test_zipf_is_a_bijection_of_ranks():
    N = 12_345
    a = T._coprime_multiplier(N, 3)
    r = np.arange(N, dtype=np.uint64)
    rows = (r * np.uint64(a) + np.uint64(3)) % np.uint64(N)
    assert np.unique(rows).size == N


@pytest.mark.parametrize("k,unique,lru", [(0, 0.13, 0.84), (1, 0.54, 0.44), (2, 0.72, 0.28)])
def test_k_locality_matches_recssd(k, unique, lru):
    ids = T.k_locality_ids(2_000_000, 300_000, k, 11)
    assert ids.min() >= 0 and ids.max() < 2_000_000
    # RecSSD §6.1: K = 0, 1, 2 -> 13 %, 54 %, 72 % unique accesses
    assert abs(T.unique_fraction(ids) - unique) < 0.01
    # ... and a 2 K-entry LRU host cache hits about 84 / 44 / 28 % (their Figure 10)
    assert abs(T.lru_hit_rate(ids[:100_000], 2048) - lru) < 0.04


def test_k_unique_fraction_monotone_and_reuse_distance():
    fr = [T.k_unique_fraction(k) for k in (0, 0.5, 1, 1.5, 2, 3, 5)]
    assert all(a < b for a, b in zip(fr, fr[1:])) and fr[-1] < 1
    assert T.k_unique_fraction(1) == pytest.approx(0.54)
    with pytest.raises(ValueError):
        T.k_unique_fraction(-1)
    # reuses come back within a short distance: a small LRU already catches nearly all of them
    ids = T.k_locality_ids(10**6, 100_000, 0, 5, mean_reuse=16)
    assert T.lru_hit_rate(ids, 256) > 0.85
    far = T.k_locality_ids(10**6, 100_000, 0, 5, mean_reuse=4096)
    assert T.lru_hit_rate(far, 256) < 0.3


def test_binomial_is_bimodal():
    N = 100_000
    ids = T.binomial_ids(N, 100_000, 2)
    near = lambda c: np.mean(np.abs(ids - c * N) < 0.05 * N)  # noqa: E731
    assert near(0.25) > 0.45 and near(0.75) > 0.45 and near(0.5) < 0.01


def test_make_batches_shapes_and_streams():
    s = T.model_shape("RM3", 0.001, tables=3)
    bs = T.make_batches(s, 4, 5, dist="klocality", k=0, seed=7)
    assert len(bs) == 5 and all(len(b) == 3 for b in bs)
    for b in bs:
        for t, r in enumerate(b):
            assert isinstance(r, SlsRequest) and r.table == f"rm3_t{t}" and r.mode == "sum"
            assert r.indices.dtype == np.int64 and r.indices.size == 4 * s.lookups
            assert np.array_equal(r.offsets, np.arange(4) * s.lookups)
            assert r.indices.max() < s.num_rows
    # deterministic per seed, different per table and per seed
    again = T.make_batches(s, 4, 5, dist="klocality", k=0, seed=7)
    assert all(np.array_equal(a.indices, b.indices) for x, y in zip(bs, again) for a, b in zip(x, y))
    assert not np.array_equal(bs[0][0].indices, bs[0][1].indices)
    other = T.make_batches(s, 4, 5, dist="klocality", k=0, seed=8)
    assert not np.array_equal(bs[0][0].indices, other[0][0].indices)
    # variable bag lengths: offsets consistent with the indices
    var = T.make_batches(s, 16, 2, lengths="uniform", lookups=10, table_names=["a", "b", "c"])
    for b in var:
        for r in b:
            assert r.offsets[0] == 0 and np.all(np.diff(r.offsets) >= 1) and r.indices.size >= r.offsets[-1] + 1
    for dist in T.DISTRIBUTIONS:
        assert len(T.make_batches(s, 2, 2, dist=dist)) == 2
    with pytest.raises(ValueError):
        T.make_batches(s, 2, 2, dist="nope")
    with pytest.raises(ValueError):
        T.make_batches(s, 0, 2)


def test_trace_file_round_trip(tmp_path):
    s = T.model_shape("RM1", 0.001, tables=2)
    bs = T.make_batches(s, 3, 4, dist="zipf", lengths="uniform", lookups=6)
    bs[1][0].mode = "mean"
    names = s.table_names()
    path = str(tmp_path / "t.bin")
    n = T.save_trace(path, bs, {name: i for i, name in enumerate(names)})
    assert n == (tmp_path / "t.bin").stat().st_size
    back = T.load_trace(path, names)
    assert len(back) == len(bs)
    for x, y in zip(bs, back):
        for a, b in zip(x, y):
            assert a.table == b.table and a.mode == b.mode
            assert np.array_equal(a.indices, b.indices) and np.array_equal(a.offsets, b.offsets)
    with open(path, "r+b") as f:
        f.write(b"XXXX")
    with pytest.raises(ValueError):
        T.load_trace(path, names)


def test_lru_and_hot_mass_diagnostics():
    ids = np.array([1, 2, 1, 3, 1, 2, 4, 4])
    assert T.lru_hit_rate(ids, 2) == pytest.approx(3 / 8)  # hits: 1, 1, 4
    assert T.lru_hit_rate(ids, 0) == 0
    assert T.unique_fraction(ids) == pytest.approx(4 / 8)
    assert T.hot_mass(ids, 10, 0.1) == pytest.approx(3 / 8)  # the hottest row (1) of 10
