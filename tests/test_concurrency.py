"""Readers in threads while the main thread writes, flushes and forces merges.

What the contract guarantees and these tests check: a single put()/delete() call is applied
atomically relative to scans, and flush/merge never expose partial states. So for a feature
changed by a known sequence of calls, every scan (and every get() of all keys, and every
scan_many column) must equal the feature's state after *some* prefix of that call sequence;
and successive reads by one thread never go back in time (monotonic reads).
"""

from __future__ import annotations

import hashlib
import threading
import time

import numpy as np
import pytest

from recflash.reader import Store
from storeutil import small_options

N_KEYS = 1500


def _digest(keys, values) -> bytes:
    h = hashlib.blake2b(digest_size=16)
    h.update(np.asarray(keys, dtype=np.uint64).tobytes())
    h.update(np.asarray(values, dtype=np.int64).tobytes())
    return h.digest()


class Timeline:
    """The planned sequence of calls on one int64 feature and the digest of its state after
    each call (index 0 = before any call). Digests are computed up front, so readers can
    check states the writer has not reached yet without races."""

    def __init__(self, feature: str, calls: list, initial: dict[int, int]):
        self.feature = feature
        self.calls = calls
        self.index: dict[bytes, list[int]] = {}
        state = dict(initial)
        self._add(state, 0)
        for i, (kind, keys, vals) in enumerate(calls, start=1):
            if kind == "put":
                for k, v in zip(keys.tolist(), vals.tolist()):
                    state[k] = v
            else:
                for k in keys.tolist():
                    state.pop(k, None)
            self._add(state, i)

    def _add(self, state, i):
        ks = sorted(state)
        self.index.setdefault(_digest(ks, [state[k] for k in ks]), []).append(i)

    def positions(self, keys, values) -> list[int]:
        return self.index.get(_digest(keys, values), [])


def _plan(rng, feature: str, rounds: int, initial: dict[int, int], with_deletes: bool):
    calls = []
    for r in range(1, rounds + 1):
        # every put writes round-unique values, to a random subset (some rounds: all keys)
        if r % 5 == 0:
            keys = np.arange(N_KEYS, dtype=np.uint64)
        else:
            keys = np.unique(rng.integers(0, N_KEYS, int(rng.integers(1, 600)))).astype(np.uint64)
        vals = np.full(len(keys), r, dtype=np.int64) * 100000 + keys.astype(np.int64)
        calls.append(("put", keys, vals))
        if with_deletes and r % 3 == 0:
            dk = np.unique(rng.integers(0, N_KEYS, int(rng.integers(1, 200)))).astype(np.uint64)
            calls.append(("del", dk, None))
    return calls


class Reader(threading.Thread):
    def __init__(self, store, timelines, mode, stop):
        super().__init__(daemon=True)
        self.store, self.timelines, self.mode, self.stop_ev = store, timelines, mode, stop
        self.error: BaseException | None = None
        self.reads = 0
        self.lo = {tl.feature: 0 for tl in timelines}  # monotonic-read lower bounds

    def _check(self, tl, keys, values, what):
        cands = [c for c in tl.positions(keys, values) if c >= self.lo[tl.feature]]
        if not cands:
            older = tl.positions(keys, values)
            raise AssertionError(
                f"{what} of {tl.feature!r} saw a state that no prefix of the writes produces "
                f"({len(keys)} keys; matches older positions {older[:5]}, reader was already at "
                f"{self.lo[tl.feature]})")
        self.lo[tl.feature] = min(cands)

    def run(self):
        try:
            all_keys = np.arange(N_KEYS, dtype=np.uint64)
            while not self.stop_ev.is_set():
                if self.mode == "scan_many":
                    names = [x.feature for x in self.timelines]
                    t = self.store.scan_many(names)
                    keys = t.column("key").to_numpy()
                    for x in self.timelines:
                        col = t.column(x.feature).combine_chunks()
                        present = ~np.asarray(col.is_null().to_numpy(zero_copy_only=False))
                        vals = np.asarray(col.fill_null(0).to_numpy(zero_copy_only=False))
                        self._check(x, keys[present], vals[present], "scan_many")
                    self.reads += 1
                    continue
                for tl in self.timelines:
                    if self.mode == "scan":
                        t = self.store.scan(tl.feature)
                        keys = t.column("key").to_numpy()
                        vals = t.column("value").to_numpy()
                        self._check(tl, keys, vals, "scan")
                    elif self.mode == "get":
                        arr = self.store.get(tl.feature, all_keys)
                        present = ~np.asarray(arr.is_null().to_numpy(zero_copy_only=False))
                        vals = np.asarray(arr.fill_null(0).to_numpy(zero_copy_only=False))
                        self._check(tl, all_keys[present], vals[present], "get")
                    self.reads += 1
        except BaseException as e:  # noqa: BLE001 - reported by the main thread
            self.error = e


@pytest.mark.parametrize("with_deletes", [False, True])
def test_readers_see_consistent_snapshots(store_path, with_deletes):
    rng = np.random.default_rng(42 + with_deletes)
    opts = small_options(write_buffer_bytes=64 << 10)
    s = Store.open(store_path, opts)
    try:
        s.create_feature("x", "int64")
        s.create_feature("y", "int64")
        s.create_feature("noise", "binary")
        init_keys = np.arange(N_KEYS, dtype=np.uint64)
        init_vals = init_keys.astype(np.int64)
        s.put("x", init_keys, init_vals)
        s.put("y", init_keys, init_vals)
        s.flush()
        initial = dict(zip(init_keys.tolist(), init_vals.tolist()))
        rounds = 120
        tls = [Timeline("x", _plan(rng, "x", rounds, initial, with_deletes), initial),
               Timeline("y", _plan(rng, "y", rounds, initial, with_deletes), initial)]
        stop = threading.Event()
        readers = [Reader(s, tls, mode, stop) for mode in ("scan", "scan", "get", "scan_many")]
        for r in readers:
            r.start()
        t0 = time.monotonic()
        calls = list(zip(tls[0].calls, tls[1].calls))
        for i, (cx, cy) in enumerate(calls):
            for tl, (kind, keys, vals) in zip(tls, (cx, cy)):
                if kind == "put":
                    s.put(tl.feature, keys, vals)
                else:
                    s.delete(tl.feature, keys)
            # unrelated traffic mixes pages, so flushes fragment x and y and merges kick in
            nk = rng.integers(0, 10**6, 200).astype(np.uint64)
            s.put("noise", nk, [b"n" * int(rng.integers(1, 60)) for _ in range(len(nk))])
            if i % 4 == 3:
                s.flush()
            if any(r.error for r in readers):
                break
        s.flush()
        time.sleep(0.2)
        stop.set()
        for r in readers:
            r.join(timeout=60)
        for r in readers:
            if r.error is not None:
                raise r.error
        assert all(not r.is_alive() for r in readers)
        assert all(r.reads > 0 for r in readers), [r.reads for r in readers]
        # the final state is the end of the timeline
        n = len(tls[0].calls)
        t = s.scan("x")
        assert n in tls[0].positions(t.column("key").to_numpy(), t.column("value").to_numpy())
        st = s.stats()
        assert st["flushes"] >= len(calls) // 4
        # the readers really ran across merges (pages rewritten and released under them)
        assert st["merger"]["victims"] > 0 and st["merger"]["pages_released"] > 0, st["merger"]
        print("concurrency:", [r.reads for r in readers], "index copies past the snapshot:",
              st["index_merge_fallbacks"], st["merger"], st["reclaimer"])
        assert time.monotonic() - t0 < 120
    finally:
        s.close()


def test_last_read_stats_is_per_thread(store_path):
    opts = small_options()
    with Store.open(store_path, opts) as s:
        s.create_feature("big", "int64")
        s.create_feature("small", "int64")
        s.put("big", np.arange(20000, dtype=np.uint64), np.arange(20000))
        s.put("small", np.arange(10, dtype=np.uint64), np.arange(10))
    with Store.open(store_path, opts) as s:
        s.scan("big")
        big = s.last_read_stats()["useful_bytes"]
        s.scan("small")
        small = s.last_read_stats()["useful_bytes"]
        assert big > small > 0
        errors = []
        barrier = threading.Barrier(2)

        def worker(feature, expected):
            try:
                barrier.wait()
                for _ in range(60):
                    s.scan(feature)
                    time.sleep(0)  # let the other thread scan in between
                    got = s.last_read_stats()["useful_bytes"]
                    assert got == expected, (feature, got, expected)
            except BaseException as e:  # noqa: BLE001
                errors.append(e)

        ts = [threading.Thread(target=worker, args=("big", big)),
              threading.Thread(target=worker, args=("small", small))]
        for t in ts:
            t.start()
        for t in ts:
            t.join(timeout=120)
        if errors:
            raise errors[0]


def test_concurrent_writers_threads(store_path):
    """put() from several threads at once (group commit path): nothing lost, no torn puts."""
    opts = small_options(write_buffer_bytes=64 << 10)
    with Store.open(store_path, opts) as s:
        s.create_feature("w", "int64")
        errors = []

        def writer(tid):
            try:
                rng = np.random.default_rng(tid)
                for r in range(60):
                    keys = np.unique(rng.integers(0, 500, 50)).astype(np.uint64)
                    # each thread owns a key block, so the final value per key is known
                    s.put("w", keys + np.uint64(tid * 1000),
                          np.full(len(keys), tid * 1000 + r, dtype=np.int64))
                    if r % 10 == 0:
                        s.sync()
            except BaseException as e:  # noqa: BLE001
                errors.append(e)

        # expected: last round that touched each key of each thread
        want = {}
        for tid in range(4):
            rng = np.random.default_rng(tid)
            for r in range(60):
                keys = np.unique(rng.integers(0, 500, 50))
                for k in keys.tolist():
                    want[tid * 1000 + k] = tid * 1000 + r
        ts = [threading.Thread(target=writer, args=(i,)) for i in range(4)]
        for t in ts:
            t.start()
        for t in ts:
            t.join(timeout=120)
        if errors:
            raise errors[0]
        t = s.scan("w")
        assert dict(zip(t.column("key").to_pylist(), t.column("value").to_pylist())) == want
    with Store.open(store_path, opts) as s:
        t = s.scan("w")
        assert dict(zip(t.column("key").to_pylist(), t.column("value").to_pylist())) == want


def test_lazy_index_loads_while_writer_grows_page_table(store_path):
    """After a clean reopen each feature's key index is decoded on first use (from the
    checkpoint). Readers doing that first decode must not read the writer's page table, which
    a concurrent flush of another feature grows (make tsan-test runs this under TSan). Every
    read must still return the feature's exact contents."""
    opts = small_options(write_buffer_bytes=64 << 10)
    rng = np.random.default_rng(5)
    want = {}
    with Store.open(store_path, opts) as s:
        for f in range(24):
            name = f"lazy{f}"
            s.create_feature(name, "int64")
            keys = np.unique(rng.integers(0, 1 << 40, 3000)).astype(np.uint64)
            s.put(name, keys, keys.astype(np.int64) + f)
            # an overlapping update, so the reads go through the key index
            upd = keys[::7]
            s.put(name, upd, upd.astype(np.int64) * 3 + f)
            vals = keys.astype(np.int64) + f
            vals[::7] = upd.astype(np.int64) * 3 + f
            want[name] = (keys, vals)
        s.create_feature("grow", "int64")
    with Store.open(store_path, opts) as s:
        assert s.stats()["opened_from_checkpoint"]
        errors = []
        done = threading.Event()

        def writer():
            try:
                base = 0
                while not done.is_set():
                    keys = np.arange(base, base + 4000, dtype=np.uint64)
                    s.put("grow", keys, keys.astype(np.int64))
                    base += 4000
            except BaseException as e:  # noqa: BLE001
                errors.append(e)

        def reader(part):
            try:
                for f in range(part, 24, 3):
                    name = f"lazy{f}"
                    keys, vals = want[name]
                    if f % 2:
                        t = s.scan(name)
                        assert np.array_equal(t.column("key").to_numpy(), keys), name
                        assert np.array_equal(t.column("value").to_numpy(), vals), name
                    else:
                        got = s.get(name, keys[::5])
                        assert np.array_equal(np.asarray(got), vals[::5]), name
            except BaseException as e:  # noqa: BLE001
                errors.append(e)

        w = threading.Thread(target=writer)
        w.start()
        rs = [threading.Thread(target=reader, args=(p,)) for p in range(3)]
        for t in rs:
            t.start()
        for t in rs:
            t.join(timeout=120)
        done.set()
        w.join(timeout=120)
        if errors:
            raise errors[0]
