"""Accounting mode: the same engine decides the same layout without any page I/O."""

from __future__ import annotations

import os

import numpy as np
import pytest

from recflash.reader import Store, StoreOptions
from recflash.reader.errors import InvalidArgumentError


def _workload(s: Store, seed: int = 11) -> None:
    rng = np.random.default_rng(seed)
    sizes = [3000, 800, 120, 5000, 40]
    for i, n in enumerate(sizes):
        s.create_feature(f"f{i}", "int64" if i % 2 else "list<int64>")
    keys = {}
    for i, n in enumerate(sizes):
        k = keys[f"f{i}"] = np.sort(rng.choice(1 << 40, n, replace=False)).astype(np.uint64)
        vals = np.arange(n, dtype=np.int64) if i % 2 else [[j, j] for j in range(n)]
        s.put(f"f{i}", k, vals)
    s.flush()
    for r in range(40):
        for i, n in enumerate(sizes):
            pick = keys[f"f{i}"][rng.integers(0, n, max(1, n // 20))]
            if i % 2:
                s.put(f"f{i}", pick, np.full(len(pick), r, dtype=np.int64))
            else:
                s.put(f"f{i}", pick, [[r] * (1 + r % 3)] * len(pick))
        if r % 7 == 3:
            s.delete("f3", keys["f3"][rng.integers(0, 5000, 30)])
    s.flush()


def _layout(s: Store) -> dict:
    st = s.stats()
    keep = ("pages_in_use", "live_items", "live_item_bytes", "tombstones", "pages_written", "user_bytes_written",
            "write_amplification", "fragmentation")
    out = {k: st[k] for k in keep}
    out["merger"] = {k: v for k, v in st["merger"].items()}
    out["reclaimer"] = st["reclaimer"]
    out["scans"] = {f: {k: v for k, v in s.account_scan(f).items() if k != "seconds"} for f in st["features"]}
    return out


def test_accounting_mode_matches_real_io(tmp_path):
    opts = dict(page_size=4096, write_buffer_bytes=64 << 10)
    with Store.open(str(tmp_path / "io"), StoreOptions(**opts)) as real:
        _workload(real)
        want = _layout(real)
    with Store.open(str(tmp_path / "io"), StoreOptions(**opts)) as real:
        # account_scan agrees with what a real scan reads (nothing buffered after a reopen)
        for f in want["scans"]:
            real.scan(f)
            r = real.last_read_stats()
            a = real.account_scan(f)
            assert r["pages_read"] == a["pages_read"] and r["useful_bytes"] == a["useful_bytes"], f
    with Store.open(str(tmp_path / "acct"), StoreOptions(accounting=True, **opts)) as acct:
        _workload(acct)
        got = _layout(acct)
        with pytest.raises(InvalidArgumentError, match="accounting mode"):
            acct.scan("f0")
    assert got == want
    # nothing reached the page file, the WAL or the metadata
    assert os.path.getsize(tmp_path / "acct" / "pages.dat") == 0
    assert not any(os.path.getsize(tmp_path / "acct" / "wal" / f) for f in os.listdir(tmp_path / "acct" / "wal"))


def test_accounting_mode_needs_a_new_store(tmp_path):
    path = str(tmp_path / "s")
    with Store.open(path) as s:
        s.create_feature("a", "int64")
        s.put("a", np.arange(10, dtype=np.uint64), np.arange(10))
    with pytest.raises(InvalidArgumentError, match="accounting mode needs a new store"):
        Store.open(path, StoreOptions(accounting=True))
