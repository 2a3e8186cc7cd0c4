"""Index placement on several threads (StoreOptions.scan_threads).

A large fragmented feature (pages overlapping after updates, resolved through its key index)
is read and placed by lanes: each reads its share of the pages on a ring of its own, the
placement plan is made in parts by all of them, and each places the pages it read. The result
must equal the one-thread scan and the model for every lane count, with deletes, buffered
writes (the plan then in one part), key ranges, concurrent scans sharing the helpers, a
read-only handle and read errors in any lane.
"""
from __future__ import annotations

import errno
import os
import threading

import numpy as np
import pytest

from recflash.reader import InvalidArgumentError, Store, StoreOptions
from recflash.reader.errors import IOError_, StoreClosedError
from recflash.reader import testing

N = 60000  # entries: above the lanes' threshold (16384) on 4 KiB pages


def _opts(**kw) -> StoreOptions:
    args = dict(page_size=4096, write_buffer_bytes=256 << 10)
    args.update(kw)
    return StoreOptions(**args)


class _State:
    """What the store holds per feature: a sorted key pool, its values and which are live."""

    def __init__(self, keys, vals):
        self.keys, self.vals = keys, vals
        self.live = np.ones(len(keys), bool)

    def expect(self, lo=0, hi=None):
        m = self.live & (self.keys >= lo)
        if hi is not None:
            m &= self.keys < hi
        return self.keys[m], self.vals[m]


def _fill(path, rng, rounds=6, leave_buffered=False, deletes=True):
    """int64 and float32 features over sparse keys, updated (a quarter of the keys) and
    partly deleted in rounds, each flushed: every page overlaps others, with stale records
    and tombstones (none with deletes=False: the scans then make the one-pass plan)."""
    st = Store.open(path, _opts())
    state = {}
    for name, dt in (("i", np.int64), ("f", np.float32)):
        st.create_feature(name, "int64" if dt is np.int64 else "float32")
        keys = np.unique(rng.integers(0, 1 << 62, N, dtype=np.uint64))
        vals = rng.integers(-(1 << 40), 1 << 40, len(keys)).astype(dt)
        st.put(name, keys, vals)
        state[name] = _State(keys, vals.copy())
    st.flush()
    for r in range(rounds + (1 if leave_buffered else 0)):
        for name, s in state.items():
            idx = np.unique(rng.integers(0, len(s.keys), len(s.keys) // 4))
            v = rng.integers(-(1 << 40), 1 << 40, len(idx)).astype(s.vals.dtype)
            st.put(name, s.keys[idx], v)
            s.vals[idx] = v
            s.live[idx] = True
            if deletes and r % 2 == 1:
                d = np.unique(rng.integers(0, len(s.keys), len(s.keys) // 30))
                st.delete(name, s.keys[d])
                s.live[d] = False
        if r < rounds:
            st.flush()
    return st, state


def _check(st, state, name, lo=0, hi=None):
    tab = st.scan(name) if hi is None and lo == 0 else st.scan(name, key_range=(lo, hi))
    k, v = state[name].expect(lo, hi)
    got_k = tab.column("key").to_numpy()
    got_v = tab.column("value").to_numpy()
    assert np.array_equal(got_k, k), f"{name} [{lo}, {hi}): keys differ ({len(got_k)} vs {len(k)})"
    assert np.array_equal(got_v, v), f"{name} [{lo}, {hi}): values differ"


def _ranges(state, name):
    ks = state[name].keys
    return [(0, None), (int(ks[len(ks) // 7]), int(ks[len(ks) * 5 // 6])), (int(ks[3]), int(ks[40000]))]


@pytest.mark.parametrize("threads", [1, 2, 3])
def test_lanes_equal_model(store_path, threads):
    rng = np.random.default_rng(21)
    st, state = _fill(store_path, rng)
    st.close()
    with Store.open(store_path, _opts(scan_threads=threads)) as st:
        for name in state:
            for lo, hi in _ranges(state, name):
                _check(st, state, name, lo, hi)
        s = st.stats()
        assert s["index_merges"] > 0, s
        assert s["index_merge_fallbacks"] == 0, s
        if threads == 1:
            assert s["lane_scans"] == 0, s
        else:
            assert s["lane_scans"] >= 2 * len(state), s


@pytest.mark.parametrize("threads", [1, 2, 3])
def test_lanes_equal_model_after_updates_alone(store_path, threads):
    """Updates without deletes, nothing buffered: each lane scan makes its placement plan in
    one pass (each lane's slots in room of their own per page). Equal to the model for whole
    scans (the one-pass plan) and ranges (the two-pass one), on every lane count."""
    rng = np.random.default_rng(29)
    st, state = _fill(store_path, rng, deletes=False)
    st.close()
    with Store.open(store_path, _opts(scan_threads=threads)) as st:
        for name in state:
            for lo, hi in _ranges(state, name):
                _check(st, state, name, lo, hi)
            _check(st, state, name)  # again, the plan from scratch
        s = st.stats()
        assert s["index_merges"] > 0, s
        assert s["index_merge_fallbacks"] == 0, s
        assert s["lane_scans"] == (0 if threads == 1 else 4 * len(state)), s


@pytest.mark.parametrize("threads", [1, 2, 3])
def test_lanes_share_the_scans_inflight_budget(store_path, threads):
    """read_inflight_bytes is the scan's budget whatever its lane count: each lane reads with
    its share, so the lanes' peaks add up to at most the budget (each with the whole budget,
    two lanes had twice as much in flight). Reads of 16 KiB, no larger than a lane's share."""
    rng = np.random.default_rng(23)
    st, state = _fill(store_path, rng)
    st.close()
    budget = 96 << 10
    with Store.open(store_path, _opts(scan_threads=threads, max_io_bytes=16 << 10, read_inflight_bytes=budget)) as st:
        for name in state:
            before = st.stats()["lane_scans"]
            _check(st, state, name)
            rs = st.last_read_stats()
            assert st.stats()["lane_scans"] - before == (0 if threads == 1 else 1)
            assert 0 < rs["peak_inflight_bytes"] <= budget, rs
            # Every lane kept its share in flight at some point (its pages far exceed it).
            assert rs["peak_inflight_bytes"] >= budget - threads * (16 << 10), rs


@pytest.mark.parametrize("window", [32 << 10, 64 << 10, 0])
def test_single_lane_scan_keeps_its_window_in_flight(store_path, window):
    """A scan on one lane (a packed feature, scan_many, scan_keys) keeps
    single_lane_inflight_bytes of the budget in flight, and no more: the next window is read
    while the last is decoded. 0: all of read_inflight_bytes. Reads of 16 KiB."""
    budget = 96 << 10
    kw = dict(max_io_bytes=16 << 10, read_inflight_bytes=budget, single_lane_inflight_bytes=window)
    with Store.open(store_path, _opts(**kw)) as st:
        st.create_feature("p", "int64")
        keys = np.unique(np.random.default_rng(5).integers(0, 1 << 60, 60_000, dtype=np.uint64))
        st.put("p", keys, keys.astype(np.int64) * 3)
        st.flush()
        want = window or budget
        assert StoreOptions(**kw).single_lane_budget() == want
        t = st.scan("p")
        rs = st.last_read_stats()
        assert np.array_equal(t.column("value").to_numpy(), keys.astype(np.int64) * 3)
        assert rs["bytes_read"] > 4 * budget, rs  # many windows' worth of pages
        assert want - (16 << 10) <= rs["peak_inflight_bytes"] <= want, rs
        assert st.stats()["lane_scans"] == 0
        t = st.scan_many(["p"])
        assert np.array_equal(t.column("key").to_numpy(), keys)
        assert want - (16 << 10) <= st.last_read_stats()["peak_inflight_bytes"] <= want
        assert np.array_equal(np.asarray(st.scan_keys("p")), keys)
        assert want - (16 << 10) <= st.last_read_stats()["peak_inflight_bytes"] <= want
    # larger than the scan's budget: the budget bounds it
    with Store.open(store_path, _opts(**dict(kw, single_lane_inflight_bytes=4 * budget))) as st:
        st.scan("p")
        assert budget - (16 << 10) <= st.last_read_stats()["peak_inflight_bytes"] <= budget


def test_lanes_with_buffered_items_and_read_only_handle(store_path):
    """Unflushed puts and deletes in the range: the plan runs in one part, the placement in
    lanes. A read-only handle (its index from the checkpoint close wrote) scans in lanes too."""
    rng = np.random.default_rng(22)
    st, state = _fill(store_path, rng, leave_buffered=True)
    try:
        for name in state:
            for lo, hi in _ranges(state, name):
                _check(st, state, name, lo, hi)
        assert st.stats()["lane_scans"] > 0
    finally:
        st.close()
    with Store.open(store_path, _opts(read_only=True)) as ro:
        for name in state:
            _check(ro, state, name)
        assert ro.stats()["lane_scans"] > 0


def test_concurrent_scans_share_the_helpers(store_path):
    """More scanning threads than helpers: each scan takes the helpers idle at that moment or
    runs on its own thread; every result is right."""
    rng = np.random.default_rng(23)
    st, state = _fill(store_path, rng, rounds=4)
    st.close()
    errors = []
    with Store.open(store_path, _opts(scan_threads=2)) as st:
        def worker(t):
            try:
                for i in range(6):
                    name = "i" if (t + i) % 2 else "f"
                    lo, hi = _ranges(state, name)[(t + i) % 3]
                    _check(st, state, name, lo, hi)
            except Exception as e:  # reported below
                errors.append(e)

        ts = [threading.Thread(target=worker, args=(t,)) for t in range(4)]
        for t in ts:
            t.start()
        for t in ts:
            t.join()
        assert not errors, errors
        assert st.stats()["lane_scans"] > 0


@pytest.mark.parametrize("nth", [1, 2, 5, 17])
def test_read_error_in_a_lane(store_path, nth):
    """A failed page read in either lane fails the scan with the read's error (no lane left
    waiting for the other); the next scan is right."""
    rng = np.random.default_rng(24)
    st, state = _fill(store_path, rng, rounds=3)
    st.close()
    with Store.open(store_path, _opts(scan_threads=2)) as st:
        testing.arm("page_read", nth=nth, errno=errno.EIO)
        try:
            with pytest.raises(IOError_) as ei:
                st.scan("i")
        finally:
            testing.disarm()
        assert ei.value.errno == errno.EIO
        assert "pages.dat" in str(ei.value)
        _check(st, state, "i")
        assert st.stats()["lane_scans"] >= 2


@pytest.mark.parametrize("bad", [0, 17])
def test_scan_threads_checked(store_path, bad):
    with pytest.raises(InvalidArgumentError, match="scan_threads"):
        Store.open(store_path, _opts(scan_threads=bad))


def _scan_held_at(st, point, change, what):
    """st.scan("i") in a thread, held at the engine's pause point `point` while `change()` runs
    (a writer moving the store on); returns the scan's table and its read stats."""
    out = {}

    def scan():
        try:
            out["tab"] = st.scan("i")
            out["stats"] = st.last_read_stats()
        except BaseException as e:  # noqa: BLE001 - re-raised below
            out["err"] = e

    testing.arm_pause_point(point)
    try:
        t = threading.Thread(target=scan)
        t.start()
        assert testing.wait_paused(30), f"the scan never reached {what}"
        change()
    finally:
        testing.release_pause()
        testing.disarm()
    t.join(60)
    assert not t.is_alive()
    if "err" in out:
        raise out["err"]
    return out["tab"], out["stats"]


@pytest.mark.parametrize("decoded", [True, False])
@pytest.mark.parametrize("threads", [1, 2])
def test_index_changed_before_its_copy(store_path, threads, decoded):
    """A scan submits its reads before it copies the key index. A writer that flushes in
    between (the scan held at that point) moves the index past the scan's snapshot: the scan
    must not mix the two states. It reads the feature again through the chunk merges and
    returns one whole state (the write completed before the scan did, so either is a valid
    answer); the next scan returns the new one. Not `decoded`: the index is still the
    checkpoint's, and the held scan has just decoded it with its first reads in flight."""
    rng = np.random.default_rng(24)
    st, state = _fill(store_path, rng, rounds=4)
    st.close()
    with Store.open(store_path, _opts(scan_threads=threads)) as st:
        if decoded:
            _check(st, state, "i")  # the index decoded, so the race is only the copy
        before = st.stats()
        s = state["i"]
        idx = np.unique(rng.integers(0, len(s.keys), len(s.keys) // 5))
        newv = rng.integers(-(1 << 40), 1 << 40, len(idx)).astype(np.int64)
        old_k, old_v = s.expect()
        old_pages = np.unique(st.key_ranges("i")["page"])  # what the raced scan's first pass reads

        def writer():
            st.put("i", s.keys[idx], newv)
            st.flush()

        tab, raced = _scan_held_at(st, "scan.before_index_copy", writer, "the point before its index snapshot")
        after = st.stats()
        assert after["index_merge_fallbacks"] == before["index_merge_fallbacks"] + 1, after
        s.vals[idx] = newv
        s.live[idx] = True
        new_k, new_v = s.expect()
        got_k, got_v = tab.column("key").to_numpy(), tab.column("value").to_numpy()
        assert any(np.array_equal(got_k, k) and np.array_equal(got_v, v)
                   for k, v in ((old_k, old_v), (new_k, new_v))), "the scan mixed two states"
        _check(st, state, "i")
        assert st.stats()["index_merge_fallbacks"] == after["index_merge_fallbacks"]
        # the raced scan's statistics count both of its passes: the first read the old state's
        # pages, the second the pages a plain scan of the new state reads
        st.scan("i")
        plain = st.last_read_stats()
        assert raced["pages_read"] == len(old_pages) + plain["pages_read"], (raced, plain)
        if threads == 1:  # one ring: a request per run of adjacent pages, at most max_io_bytes each
            per = StoreOptions().max_io_bytes // st.page_size
            runs = np.split(old_pages, np.flatnonzero(np.diff(old_pages) != 1) + 1)
            first = sum(-(-len(r) // per) for r in runs)
            assert raced["read_requests"] == first + plain["read_requests"], (raced, plain, first)


@pytest.mark.parametrize("threads", [1, 2])
def test_index_changed_after_its_snapshot(store_path, threads):
    """A scan shares its feature's key index (a snapshot) instead of copying it. A writer
    that updates and flushes the feature while the scan holds the snapshot, its pages not yet
    placed, changes a copy of the index (copy-on-write): the scan places the state it started
    from, exactly and without falling back to the chunk merges, and the next scan sees the
    update. A snapshot changed under its reader would name the update's pages, which the scan
    does not read: its placement would fail (a fallback) or place wrong values."""
    rng = np.random.default_rng(25)
    st, state = _fill(store_path, rng, rounds=4)
    st.close()
    with Store.open(store_path, _opts(scan_threads=threads)) as st:
        _check(st, state, "i")  # the index decoded: the scan below shares it at once
        before = st.stats()
        s = state["i"]
        idx = np.unique(rng.integers(0, len(s.keys), len(s.keys) // 5))
        newv = rng.integers(-(1 << 40), 1 << 40, len(idx)).astype(np.int64)
        new_keys = np.setdiff1d(rng.integers(0, 1 << 62, 3000, dtype=np.uint64), s.keys)
        old_k, old_v = s.expect()

        def writer():
            st.put("i", s.keys[idx], newv)  # updates: locations change in place
            st.put("i", new_keys, np.arange(len(new_keys), dtype=np.int64))  # inserts: the arrays grow
            st.delete("i", s.keys[:50])
            st.flush()

        tab, _ = _scan_held_at(st, "scan.after_index_snapshot", writer, "its index snapshot")
        got_k, got_v = tab.column("key").to_numpy(), tab.column("value").to_numpy()
        assert np.array_equal(got_k, old_k) and np.array_equal(got_v, old_v), "the scan saw the later write"
        assert st.stats()["index_merge_fallbacks"] == before["index_merge_fallbacks"]
        s.vals[idx] = newv
        s.live[idx] = True
        s.live[:50] = False
        keys = np.concatenate([s.keys, new_keys])
        order = np.argsort(keys)
        state["i"] = _State(keys[order], np.concatenate([s.vals, np.arange(len(new_keys), dtype=np.int64)])[order])
        state["i"].live = np.concatenate([s.live, np.ones(len(new_keys), bool)])[order]
        _check(st, state, "i")
        assert st.stats()["index_merge_fallbacks"] == before["index_merge_fallbacks"]


def test_close_stops_the_lane_helpers(store_path):
    """The parked lane helpers are threads of the handle: close() stops them, whether or not
    the Store object is still referenced."""
    def threads():
        return len(os.listdir("/proc/self/task"))

    st, state = _fill(store_path, np.random.default_rng(21), rounds=2)
    st.close()
    before = threads()
    st = Store.open(store_path, _opts(scan_threads=3))
    _check(st, state, "i")
    assert st.stats()["lane_scans"] > 0
    assert threads() >= before + 2  # the two parked helpers
    st.close()
    assert threads() == before
    with pytest.raises(StoreClosedError):
        st.scan("i")


@pytest.mark.parametrize("threads", [2, 3])
@pytest.mark.parametrize("kind,words", [("page_read", "read of pages"), ("ring_submit", "io_uring_submit")])
@pytest.mark.parametrize("nth", [1, 2, 3])
def test_lane_read_errors(store_path, threads, kind, words, nth):
    """A scan in lanes reads on one ring per lane. An I/O error at any lane's submission or
    read (the nth call of the scan, when the scan makes that many) fails the scan with the
    operation and the file named, every lane drains its ring, and the same handle's next
    scans, in lanes again, return the right data. (How many submissions a scan makes depends
    on how its completions arrive: at least one per lane.)"""
    rng = np.random.default_rng(25)
    st, state = _fill(store_path, rng)
    st.close()
    with Store.open(store_path, _opts(scan_threads=threads)) as st:
        _check(st, state, "i")  # the index decoded: the faulted scan's calls are its own reads
        lanes0 = st.stats()["lane_scans"]
        testing.arm(kind, nth=nth, errno=errno.EIO)
        try:
            try:
                tab, err = st.scan("i"), None
            except IOError_ as e:
                tab, err = None, e
            calls = testing.calls(kind)
        finally:
            testing.disarm()
        assert st.stats()["lane_scans"] == lanes0 + 1
        if calls >= nth:
            assert err is not None, f"the {nth}th {kind} of {calls} failed, the scan did not"
            assert words in str(err) and "pages.dat" in str(err), str(err)
        else:
            assert err is None, err
            k, v = state["i"].expect()
            assert np.array_equal(tab.column("value").to_numpy(), v)
        for name in state:
            _check(st, state, name)
        assert st.stats()["lane_scans"] >= lanes0 + 1 + len(state)
