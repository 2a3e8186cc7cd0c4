"""Recovery paths of the store: the clean-shutdown checkpoint and the full rebuild from pages.

A clean close() writes CHECKPOINT (key indexes and valid counts) so that reopening reads no
pages. A writer keeps the checkpoint it loaded while it commits nothing (close then leaves it
as it is) and deletes it before its first commit, so a crash never meets a checkpoint of an
older state. Any doubt about it — stale, corrupt, missing — must fall back to the rebuild from
pages and still give exactly the same store."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import textwrap

import numpy as np
import pytest

from recflash.reader import Store
from storeutil import small_options


def _fill(s: Store, rng: np.random.Generator, rounds: int = 30) -> None:
    for f, t in (("a", "float32"), ("b", "list<int64>"), ("c", "int64")):
        s.create_feature(f, t)
    for r in range(rounds):
        k = rng.integers(0, 3000, 400).astype(np.uint64)
        s.put("a", k, rng.random(400).astype(np.float32))
        s.put("b", k[:50], [[int(x), r] for x in k[:50]])
        s.put("c", k[:200], np.full(200, r, dtype=np.int64))
        s.delete("a", rng.integers(0, 3000, 20).astype(np.uint64))
        if r % 5 == 4:
            s.flush()


def _snapshot(s: Store) -> dict:
    st = s.stats()
    return {
        "tables": {f: s.scan(f).to_pylist() for f in ("a", "b", "c")},
        "live_items": st["live_items"],
        "pages_in_use": st["pages_in_use"],
        "fragmentation": st["fragmentation"],
        # the key index's in-memory form (its bytes; a key array, a dense run, or deferred after
        # a clean reopen) may differ between sessions holding the same data
        "features": {f: {k: v for k, v in d.items() if k not in ("key_index_bytes", "dense_keys")}
                     for f, d in st["features"].items()},
    }


def test_clean_reopen_uses_checkpoint_and_matches_rebuild(store_path):
    rng = np.random.default_rng(7)
    with Store.open(store_path, small_options()) as s:
        _fill(s, rng)
    assert os.path.exists(os.path.join(store_path, "CHECKPOINT"))
    with Store.open(store_path, small_options()) as s:
        assert s.stats()["opened_from_checkpoint"] is True
        assert s.stats()["pages_read"] == 0
        assert s.stats()["checkpoint_current"] is True  # kept: it still describes the store
        via_checkpoint = _snapshot(s)
    os.remove(os.path.join(store_path, "CHECKPOINT"))
    with Store.open(store_path, small_options()) as s:
        assert s.stats()["opened_from_checkpoint"] is False
        assert s.stats()["pages_read"] > 0
        via_rebuild = _snapshot(s)
    assert via_checkpoint == via_rebuild


def _file_identity(path: str) -> tuple:
    st = os.stat(path)
    return st.st_ino, st.st_mtime_ns, st.st_size


def test_writer_that_commits_nothing_keeps_the_checkpoint(store_path):
    rng = np.random.default_rng(11)
    with Store.open(store_path, small_options()) as s:
        _fill(s, rng)
    ckpt = os.path.join(store_path, "CHECKPOINT")
    before = _file_identity(ckpt)
    # A session that only reads: the checkpoint is neither deleted at open nor rewritten at close.
    s = Store.open(store_path, small_options())
    expected = _snapshot(s)
    s.get("a", np.arange(100, dtype=np.uint64))
    st = s.stats()
    assert st["opened_from_checkpoint"] is True and st["checkpoint_current"] is True
    assert st["checkpoints_written"] == 0
    s.close()
    assert _file_identity(ckpt) == before
    # The next session still opens from it, and sees the same store.
    s = Store.open(store_path, small_options())
    assert s.stats()["opened_from_checkpoint"] is True
    assert _snapshot(s) == expected
    # The first commit retires it before it lands; close writes the new state's.
    s.put("c", np.arange(3000, dtype=np.uint64), np.full(3000, -5, dtype=np.int64))  # beyond what pins
    assert os.path.exists(ckpt)  # buffered only: nothing committed yet
    s.flush()
    assert not os.path.exists(ckpt)
    assert s.stats()["checkpoint_current"] is False
    expected = _snapshot(s)
    s.close()
    assert _file_identity(ckpt) != before
    with Store.open(store_path, small_options()) as s:
        assert s.stats()["opened_from_checkpoint"] is True
        assert _snapshot(s) == expected


def test_create_feature_retires_the_checkpoint(store_path):
    with Store.open(store_path, small_options()) as s:
        _fill(s, np.random.default_rng(12), rounds=5)
    with Store.open(store_path, small_options()) as s:
        assert s.stats()["opened_from_checkpoint"] is True
        s.create_feature("d", "int64")
        assert not os.path.exists(os.path.join(store_path, "CHECKPOINT"))
    with Store.open(store_path, small_options()) as s:
        assert s.stats()["opened_from_checkpoint"] is True
        assert s.scan("d").num_rows == 0 and "d" in s.features()


CRASH_AFTER_LOAD = textwrap.dedent(
    r'''
    import sys
    import numpy as np
    from recflash.reader import Store, testing
    from storeutil import small_options
    path, point = sys.argv[1], sys.argv[2]
    s = Store.open(path, small_options())
    assert s.stats()["opened_from_checkpoint"], "the child must start from the checkpoint"
    testing.arm_kill_point(point, 1)
    s.put("c", np.arange(5000, 8000, dtype=np.uint64), np.full(3000, 77, dtype=np.int64))
    s.flush()
    raise SystemExit("the kill point did not fire")
    '''
)


@pytest.mark.parametrize("point", ["meta.commit.before", "meta.commit.after"])
def test_crash_after_a_checkpointed_open_rebuilds(store_path, point):
    """A writer that loaded the checkpoint and dies around its first commit: the next open
    must not take that checkpoint (it describes the state before the commit)."""
    with Store.open(store_path, small_options()) as s:
        _fill(s, np.random.default_rng(13), rounds=10)
        before = _snapshot(s)
    env = dict(os.environ, PYTHONPATH=os.path.dirname(os.path.abspath(__file__)))
    r = subprocess.run([sys.executable, "-P", "-c", CRASH_AFTER_LOAD, store_path, point], capture_output=True,
                       text=True, timeout=120, env=env)
    assert r.returncode != 0 and "did not fire" not in r.stderr, r.stderr[-2000:]
    assert not os.path.exists(os.path.join(store_path, "CHECKPOINT"))
    with Store.open(store_path, small_options()) as s:
        st = s.stats()
        assert st["opened_from_checkpoint"] is False
        after = _snapshot(s)
    # The flush synced the WAL before its commit: the puts survive either way (replayed or
    # committed), on top of exactly the state before.
    c = {row["key"]: row["value"] for row in after["tables"]["c"]}
    assert all(c[k] == 77 for k in range(5000, 8000))
    assert after["tables"]["a"] == before["tables"]["a"] and after["tables"]["b"] == before["tables"]["b"]
    assert [row for row in after["tables"]["c"] if row["key"] < 5000] == before["tables"]["c"]


def _index_runs(data: bytes) -> dict:
    """Feature id -> [(byte offset of the run's location, location, count)] of a CHECKPOINT
    (store_checkpoint.cc WriteCheckpoint, key_index.cc Serialize), for dense and raw-key indexes."""
    import struct
    at = 8 + 8 + 8
    (nf,) = struct.unpack_from("<I", data, at)
    at += 4
    out = {}
    for _ in range(nf):
        fid, _items, _bytes, _tombs = struct.unpack_from("<IQQQ", data, at)
        at += 28
        mode, track, _base, n = struct.unpack_from("<BBQQ", data, at)
        at += 18
        assert mode in (1, 3) and not track, "the test writes dense or raw keys only"
        if mode == 3:
            at += 8 * n
        (nruns,) = struct.unpack_from("<Q", data, at)
        at += 8
        out[fid] = [(at + 8 * r, *struct.unpack_from("<II", data, at + 8 * r)) for r in range(nruns)]
        at += 8 * nruns
    return out


def test_checkpoint_naming_another_features_page_is_refused(store_path):
    """A checkpoint whose bytes are intact (crc) but whose key index sends a feature's keys to a
    page holding only another feature is refused: the open rebuilds from the pages."""
    from recflash.reader import testing
    with Store.open(store_path, small_options()) as s:
        for f in ("a", "b"):
            s.create_feature(f, "int64")
        k = np.arange(4000, dtype=np.uint64)
        s.put("a", k, k.astype(np.int64))
        s.flush()  # a's pages, then b's: no page holds both
        s.put("b", k, (k * 3).astype(np.int64))
        s.flush()
        for f in ("a", "b"):  # an update each (its own flush): indexes, not append-only
            s.put(f, k[::7], np.full(len(k[::7]), -1, np.int64))
            s.flush()
        expected = {f: s.scan(f).to_pylist() for f in ("a", "b")}
    path = os.path.join(store_path, "CHECKPOINT")
    data = bytearray(open(path, "rb").read())
    runs = _index_runs(bytes(data))
    (fa, ra), (fb, rb) = sorted(runs.items())
    assert {loc for _, loc, _ in ra}.isdisjoint({loc for _, loc, _ in rb})
    off, _, _ = ra[0]
    data[off:off + 4] = rb[0][1].to_bytes(4, "little")  # a's first keys "live" on b's page
    data[-4:] = testing.crc32c(bytes(data[:-4])).to_bytes(4, "little")
    open(path, "wb").write(bytes(data))
    with Store.open(store_path, small_options()) as s:
        assert s.stats()["opened_from_checkpoint"] is False
        assert {f: s.scan(f).to_pylist() for f in ("a", "b")} == expected


def test_stale_checkpoint_is_ignored(store_path, tmp_path):
    rng = np.random.default_rng(8)
    with Store.open(store_path, small_options()) as s:
        _fill(s, rng, rounds=10)
    stale = str(tmp_path / "stale-checkpoint")
    shutil.copy(os.path.join(store_path, "CHECKPOINT"), stale)
    with Store.open(store_path, small_options()) as s:
        s.put("a", np.arange(5000, 6000, dtype=np.uint64), np.ones(1000, np.float32))
        s.delete("c", np.arange(0, 3000, dtype=np.uint64))
    with Store.open(store_path, small_options()) as s:
        expected = _snapshot(s)
    shutil.copy(stale, os.path.join(store_path, "CHECKPOINT"))  # an old state's checkpoint
    with Store.open(store_path, small_options()) as s:
        assert s.stats()["opened_from_checkpoint"] is False
        assert _snapshot(s) == expected


@pytest.mark.parametrize("damage", ["flip", "truncate", "empty"])
def test_corrupt_checkpoint_falls_back_to_rebuild(store_path, damage):
    rng = np.random.default_rng(9)
    with Store.open(store_path, small_options()) as s:
        _fill(s, rng, rounds=10)
    with Store.open(store_path, small_options()) as s:
        expected = _snapshot(s)
    ck = os.path.join(store_path, "CHECKPOINT")
    data = bytearray(open(ck, "rb").read())
    if damage == "flip":
        data[len(data) // 2] ^= 0xFF
    elif damage == "truncate":
        data = data[: len(data) // 2]
    else:
        data = bytearray()
    open(ck, "wb").write(bytes(data))
    with Store.open(store_path, small_options()) as s:
        assert s.stats()["opened_from_checkpoint"] is False
        assert _snapshot(s) == expected


def test_lifetime_write_counters_survive_reopen(store_path):
    rng = np.random.default_rng(10)
    with Store.open(store_path, small_options()) as s:
        _fill(s, rng, rounds=10)
    with Store.open(store_path, small_options()) as s:
        st = s.stats()
        assert st["user_bytes_written"] > 0 and st["bytes_written"] > 0
        assert st["write_amplification"] > 0


def test_empty_wal_segments_do_not_pile_up(store_path):
    with Store.open(store_path, small_options()) as s:
        s.create_feature("a", "float32")
        s.put("a", np.arange(10, dtype=np.uint64), np.ones(10, np.float32))
    for _ in range(5):
        Store.open(store_path, small_options()).close()
    assert len(os.listdir(os.path.join(store_path, "wal"))) <= 1


def test_clean_close_leaves_no_metadata_log_to_replay(store_path):
    """A clean close moves RocksDB's log into a table file, so the next open (every Ray read
    task opens the store) reads a table instead of replaying the whole session's commits."""
    rng = np.random.default_rng(11)
    with Store.open(store_path, small_options()) as s:
        _fill(s, rng)
        s.create_feature("x", "int64")
        for lo in range(0, 1_500_000, 100_000):  # ~3,000 pages: a page table worth a table file
            s.put("x", np.arange(lo, lo + 100_000, dtype=np.uint64), rng.integers(0, 2**62, 100_000))
        want = {f: s.scan(f) for f in ("a", "b", "c", "x")}
    meta = os.path.join(store_path, "meta")
    logs = [f for f in os.listdir(meta) if f.endswith(".log")]
    assert logs and all(os.path.getsize(os.path.join(meta, f)) == 0 for f in logs), logs
    assert any(f.endswith(".sst") for f in os.listdir(meta))
    for ro in (True, False):
        with Store.open(store_path, small_options(), read_only=ro) as s:
            for f, t in want.items():
                assert s.scan(f).equals(t), f


def test_checkpoint_key_outside_its_page_fails_the_first_scan(store_path):
    """A checkpoint whose bytes are intact (crc) and whose locations and per-page counts agree
    with the page table, but which places two keys in each other's page (neither page's segment
    covers the key it is given), is caught when the feature's key index is decoded — its first
    scan after the open: the scan fails naming the key and the page, and returns no data."""
    from recflash.reader import CorruptionError, testing
    rng = np.random.default_rng(3)
    with Store.open(store_path, small_options()) as s:
        s.create_feature("a", "int64")
        k = np.unique(rng.integers(0, 1 << 62, 6000, dtype=np.uint64))  # wide gaps: raw keys (mode 3)
        s.put("a", k, (k >> np.uint64(2)).astype(np.int64))
        s.flush()
        s.put("a", k[::3], np.full(len(k[::3]), -1, np.int64))  # an update: a key index, not append-only
        s.flush()
        kr = s.key_ranges("a")
    ranges = {int(p): (int(lo), int(hi)) for p, lo, hi in zip(kr["page"], kr["min_key"], kr["max_key"])}
    path = os.path.join(store_path, "CHECKPOINT")
    data = bytearray(open(path, "rb").read())
    (_, runs), = _index_runs(bytes(data)).items()
    # Each entry's key, in index order: the runs cover the keys ascending.
    keys, at = [], 0
    for _, _, cnt in runs:
        keys.append(int(k[at]))
        at += cnt
    # Two single-entry runs on different pages, each key outside the other's page.
    pick = None
    for i, (_, li, ci) in enumerate(runs):
        for j in range(len(runs) - 1, i, -1):
            _, lj, cj = runs[j]
            if ci == cj == 1 and li != lj:
                (alo, ahi), (blo, bhi) = ranges[lj], ranges[li]
                if not alo <= keys[i] <= ahi and not blo <= keys[j] <= bhi:
                    pick = (i, j)
                    break
        if pick:
            break
    assert pick, "the layout offers no two single-entry runs on pages of disjoint ranges"
    i, j = pick
    data[runs[i][0]:runs[i][0] + 4] = runs[j][1].to_bytes(4, "little")
    data[runs[j][0]:runs[j][0] + 4] = runs[i][1].to_bytes(4, "little")
    data[-4:] = testing.crc32c(bytes(data[:-4])).to_bytes(4, "little")
    open(path, "wb").write(bytes(data))
    with Store.open(store_path, small_options(), read_only=True) as s:
        with pytest.raises(CorruptionError, match=f"places key {keys[i]} in page {runs[j][1]}, whose segment"):
            s.scan("a")


@pytest.mark.parametrize("read_only", [False, True])
def test_first_full_scan_decodes_the_checkpointed_index_while_reading(store_path, read_only):
    """A fragmented feature's key index stays encoded after a clean reopen; its first full
    scan decodes it while the scan's first reads are in flight (one feature on the scan's ring,
    one large enough for the scan's lanes). Both scans are index merges with no fallback and
    return exactly what was written; a ranged scan, which decodes first, and a lookup after
    them agree too."""
    rng = np.random.default_rng(11)
    want = {}
    with Store.open(store_path, small_options()) as s:
        for name, n in (("small", 3000), ("large", 40000)):
            s.create_feature(name, "int64")
            k = np.unique(rng.integers(0, 1 << 40, n, dtype=np.uint64))
            s.put(name, k, k.astype(np.int64))
            s.flush()
            upd = k[rng.random(len(k)) < 0.3]  # updates: overlapping pages, a key index
            s.put(name, upd, -upd.astype(np.int64))
            s.flush()
            v = k.astype(np.int64)
            v[np.isin(k, upd)] *= -1
            want[name] = (k, v)
    with Store.open(store_path, small_options(), read_only=read_only) as s:
        # (A read-only handle swaps the checkpoint's indexes in at its first scan that needs one.)
        assert s.stats()["opened_from_checkpoint"] is not read_only
        before = s.stats()
        for name, (k, v) in want.items():
            t = s.scan(name)
            np.testing.assert_array_equal(t.column("key").to_numpy(), k)
            np.testing.assert_array_equal(t.column("value").to_numpy(), v)
        after = s.stats()
        assert after["index_merges"] - before["index_merges"] == 2
        assert after["index_merge_fallbacks"] == before["index_merge_fallbacks"]
        assert after["lane_scans"] - before["lane_scans"] == 1
        k, v = want["large"]
        got = s.get("large", k[::7])
        np.testing.assert_array_equal(got.to_numpy(), v[::7])
    with Store.open(store_path, small_options(), read_only=read_only) as s:
        k, v = want["large"]
        lo, hi = int(k[1000]), int(k[30000])
        t = s.scan("large", (lo, hi))
        np.testing.assert_array_equal(t.column("key").to_numpy(), k[1000:30000])
        np.testing.assert_array_equal(t.column("value").to_numpy(), v[1000:30000])
        np.testing.assert_array_equal(s.scan("large").column("value").to_numpy(), v)
