"""How a flush writes its appends (reader/csrc/page_batch.h).

A large flush builds its appends on `build_threads` threads, and an append to a feature whose
key index is materialized (after an update or a merge) is written as a run whose keys then join
the index. Both must give back exactly what was put — by scan, by get, after reopening — and
the threads must not change what a store holds, only where page boundaries fall.
"""

from __future__ import annotations

import numpy as np
import pytest

from recflash.reader import Store, StoreOptions

N = 400_000  # per feature and flush: above the per-thread minimum (256 Ki items), so 2 threads build


def _options(threads: int) -> StoreOptions:
    return StoreOptions(bulk_load=True, compact_pages=True, build_threads=threads, write_buffer_bytes=256 << 20)


def _values(kind: str, keys: np.ndarray, version: int):
    if kind == "int64":
        return ((keys * 2654435761 + version) % 5000).astype(np.int64)
    return (keys.astype(np.float32) * 0.5 + version)


def _load(path: str, threads: int) -> dict[str, np.ndarray]:
    """Three flushes: a bulk append, an update (materializes the index), another append."""
    want: dict[str, np.ndarray] = {}
    rng = np.random.default_rng(3)
    with Store.open(path, _options(threads)) as s:
        for name, kind in (("a", "int64"), ("b", "float32"), ("c", "int64")):
            s.create_feature(name, kind)
        first = np.arange(N, dtype=np.uint64)
        for name, kind in (("a", "int64"), ("b", "float32"), ("c", "int64")):
            s.put(name, first, _values(kind, first, 0))
            want[name] = _values(kind, first, 0)
        s.sync()
        upd = np.sort(rng.choice(N, 1000, replace=False)).astype(np.uint64)
        s.put("a", upd, _values("int64", upd, 1))
        want["a"][upd] = _values("int64", upd, 1)
        s.sync()
        more = np.arange(N, 2 * N, dtype=np.uint64)
        for name, kind in (("a", "int64"), ("b", "float32"), ("c", "int64")):
            s.put(name, more, _values(kind, more, 2))
            want[name] = np.concatenate([want[name], _values(kind, more, 2)])
        s.sync()
        _check(s, want)
    return want


def _check(s: Store, want: dict[str, np.ndarray]) -> None:
    probe = np.array([0, 1, N - 1, N, N + 1, 2 * N - 1], dtype=np.uint64)
    for name, values in want.items():
        t = s.scan(name)
        keys = t.column(0).to_numpy()
        assert np.array_equal(keys, np.arange(2 * N, dtype=np.uint64)), name
        assert np.array_equal(t.column(1).to_numpy(), values), name
        assert np.array_equal(s.get(name, probe).to_numpy(), values[probe.astype(np.int64)]), name


@pytest.mark.parametrize("threads", [1, 2])
def test_appends_after_an_update_and_on_threads_read_back(tmp_path, threads):
    path = str(tmp_path / "s")
    want = _load(path, threads)
    with Store.open(path, _options(threads)) as s:  # from the checkpoint
        _check(s, want)
        # the appended keys are in the materialized index: updating them replaces, not adds
        k = np.array([N + 5, 2 * N - 2], dtype=np.uint64)
        s.put("a", k, np.array([-1, -2], dtype=np.int64))
        s.sync()
        assert s.get("a", k).to_pylist() == [-1, -2]
        assert s.scan("a").num_rows == 2 * N


def test_threads_change_page_boundaries_only(tmp_path):
    pages = {}
    for threads in (1, 2):
        path = str(tmp_path / f"s{threads}")
        _load(path, threads)
        with Store.open(path, _options(threads)) as s:
            st = s.stats()
            pages[threads] = st["pages_in_use"]
            assert st["live_items"] == 3 * 2 * N
    # each extra thread can cost one partly filled page per flush (three flushes here)
    assert abs(pages[2] - pages[1]) <= 3, pages
