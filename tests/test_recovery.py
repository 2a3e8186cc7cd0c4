"""Recovery paths of the store: the clean-shutdown checkpoint and the full rebuild from pages.

A clean close() writes CHECKPOINT (key indexes and valid counts) so that reopening reads no
pages; open() consumes it. Any doubt about it — stale, corrupt, missing — must fall back to the
rebuild from pages and still give exactly the same store."""

from __future__ import annotations

import os
import shutil

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
        "features": {f: {k: v for k, v in d.items() if k != "key_index_bytes"} for f, d in st["features"].items()},
    }


def test_clean_reopen_uses_checkpoint_and_matches_rebuild(store_path):
    rng = np.random.default_rng(7)
    with Store.open(store_path, small_options()) as s:
        _fill(s, rng)
    assert os.path.exists(os.path.join(store_path, "CHECKPOINT"))
    with Store.open(store_path, small_options()) as s:
        assert s.stats()["opened_from_checkpoint"] is True
        assert s.stats()["pages_read"] == 0
        assert not os.path.exists(os.path.join(store_path, "CHECKPOINT")), "open must consume the checkpoint"
        via_checkpoint = _snapshot(s)
    os.remove(os.path.join(store_path, "CHECKPOINT"))
    with Store.open(store_path, small_options()) as s:
        assert s.stats()["opened_from_checkpoint"] is False
        assert s.stats()["pages_read"] > 0
        via_rebuild = _snapshot(s)
    assert via_checkpoint == via_rebuild


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
