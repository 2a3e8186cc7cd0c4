"""StoreOptions.read_poll_us (every read) and lane_read_poll_us (a scan on several lanes): a
reading thread polls its completion queue for a while before it sleeps in the kernel. The reads'
results must not depend on it: scans on one and several lanes, ranged scans, scan_keys, get and
gather_rows give what the same store gives without polling, and an out-of-range value is refused
at the open."""
from __future__ import annotations

import numpy as np
import pytest

from recflash.reader import InvalidArgumentError, Store, StoreOptions


def _opts(**kw) -> StoreOptions:
    args = dict(page_size=4096, write_buffer_bytes=256 << 10)
    args.update(kw)
    return StoreOptions(**args)


def _fill(path):
    """A fragmented sparse-key feature (updates over several flushes, large enough for lane
    scans), a packed one and an embedding table."""
    rng = np.random.default_rng(5)
    with Store.open(path, _opts()) as st:
        st.create_feature("frag", "int64")
        keys = np.unique(rng.integers(0, 1 << 60, 40000, dtype=np.uint64))
        st.put("frag", keys, rng.integers(0, 1 << 40, len(keys)))
        st.flush()
        for _ in range(4):
            idx = np.unique(rng.integers(0, len(keys), len(keys) // 4))
            st.put("frag", keys[idx], rng.integers(0, 1 << 40, len(idx)))
            st.flush()
        st.create_feature("packed", "float32")
        st.put("packed", np.arange(20000, dtype=np.uint64), rng.random(20000, dtype=np.float32))
        st.create_feature("emb", "fixed_size_list<float32, 16>")
        st.put("emb", np.arange(3000, dtype=np.uint64), rng.random((3000, 16), dtype=np.float32))
        st.flush()
    return keys


def _reads(st, keys):
    lo, hi = int(keys[len(keys) // 5]), int(keys[len(keys) * 3 // 4])
    ids = np.array([2, 5, 17, 1200, 2999], np.uint64)
    return [st.scan("frag"), st.scan("frag", key_range=(lo, hi)), st.scan("packed"),
            st.scan_many(["frag", "packed"]), st.scan_keys("frag"),
            st.get("frag", keys[::97]), st.get("packed", np.arange(0, 20000, 7, dtype=np.uint64)),
            st.gather_rows("emb", ids)[0]]


@pytest.mark.parametrize("poll", [dict(read_poll_us=500), dict(lane_read_poll_us=300)])
@pytest.mark.parametrize("threads", [1, 2])
def test_polling_reads_equal_sleeping_ones(store_path, threads, poll):
    keys = _fill(store_path)
    with Store.open(store_path, _opts(scan_threads=threads, lane_read_poll_us=0)) as st:
        want = _reads(st, keys)
    with Store.open(store_path, _opts(scan_threads=threads, **poll)) as st:
        got = _reads(st, keys)
        lanes = st.stats()["lane_scans"]
    assert lanes > 0 if threads == 2 else lanes == 0
    for i, (w, g) in enumerate(zip(want, got)):
        if isinstance(w, np.ndarray):
            assert np.array_equal(w, g), i
        else:
            assert w.equals(g), i


@pytest.mark.parametrize("name", ["read_poll_us", "lane_read_poll_us"])
def test_poll_time_out_of_range_is_refused(store_path, name):
    Store.open(store_path, _opts()).close()
    with pytest.raises(InvalidArgumentError, match=name):
        Store.open(store_path, _opts(**{name: 10001}))
    with Store.open(store_path, _opts(**{name: 10000})) as st:
        assert st.features() == {}


def test_lane_scans_poll_by_default():
    # (what the option's comment measured; every other read sleeps at once by default)
    assert StoreOptions().lane_read_poll_us == 300 and StoreOptions().read_poll_us == 0
