"""Disk space a user pays: the page file's allocated bytes (st_blocks), not only its pages in use.

The engine allocates the page file ahead of its writes (PageFile::Reserve) and must give the
unused tail back when an explicit flush or the close ends (Store::TrimFileLocked). A seeded
import pins both the page count (the layout) and the allocated bytes, so a change of either
fails here instead of surfacing as a benchmark drift.
"""

from __future__ import annotations

import os

import numpy as np
import pytest
from typer.testing import CliRunner

from recflash.cli import app
from recflash.reader import InvalidArgumentError, Store, StoreOptions

# 300,000 synthetic Criteo rows (seed 11) import into exactly this many 16 KiB pages. A change
# of the page format or the importer's layout moves it: update it together with the
# benchmark figures (benchmarks/ray_ingest.py), never to make this test pass.
# 2200 before dictionary-packed int64 segments (page format 4); 1319 before appends to merged
# features were written as runs and a flush's appends were built on two threads (PageBatch);
# 1316 (and no free slot) before merges gathered a feature's pages outside its runs first
# (merge_run_weight 1): one merge during the import then freed a slot inside the file;
# 1315 and that free slot before a bulk load merged only features past 2x their ideal pages
# (merge_threshold_bulk_load): the import now merges nothing, and no slot is freed.
SEEDED_IMPORT_PAGES = 1308
SEEDED_IMPORT_FREE_SLOTS = 0
# Allocation beyond the pages in use that a filesystem may keep for its own metadata
# (an extent-tree block, say); space allocated ahead by the engine is much larger than this.
FS_SLACK = 64 << 10


def _allocated(path: str) -> int:
    return os.stat(os.path.join(path, "pages.dat")).st_blocks * 512


def test_seeded_import_pins_pages_and_allocated_bytes(tmp_path):
    store = str(tmp_path / "s")
    r = CliRunner().invoke(app, ["import", "synthetic", "--store", store, "--rows", "300000", "--seed", "11"],
                           catch_exceptions=False)
    assert r.exit_code == 0, r.output
    with Store.open(store) as s:
        st = s.stats()
        pages, ps = st["pages_in_use"], st["page_size"]
        assert pages == SEEDED_IMPORT_PAGES, f"seeded import now takes {pages} pages (pinned: {SEEDED_IMPORT_PAGES})"
        assert st["free_slots"] == SEEDED_IMPORT_FREE_SLOTS, st
        assert st["file_slots"] == pages + st["free_slots"] and st["kept_free_slots"] == 0, st
    alloc = _allocated(store)
    assert pages * ps <= alloc <= pages * ps + FS_SLACK, \
        f"pages.dat allocates {alloc:,} B for {pages * ps:,} B of pages: space allocated ahead was not given back"


def test_flush_and_close_give_back_the_tail(tmp_path):
    path = str(tmp_path / "s")
    o = StoreOptions(page_size=16384, write_buffer_bytes=1 << 20)
    keys = np.arange(200_000, dtype=np.uint64)
    with Store.open(path, o) as s:
        s.create_feature("x", "float32")
        s.put("x", keys, np.arange(len(keys), dtype=np.float32))
        s.flush()
        st = s.stats()
        # after the explicit flush: file ends at the last page in use
        assert st["file_slots"] == st["pages_in_use"] + st["free_slots"]
        assert _allocated(path) <= st["file_slots"] * st["page_size"] + FS_SLACK
        s.delete("x", keys[-150_000:])  # the tail's pages become free
        s.flush()
    with Store.open(path, o) as s:
        st = s.stats()
        assert s.scan("x").num_rows == 50_000
        used = st["pages_in_use"] * st["page_size"]
        assert _allocated(path) <= used + st["free_slots"] * st["page_size"] + FS_SLACK
    # the trimmed store reopens, takes writes past its old end, and reads them back
    with Store.open(path, o) as s:
        s.put("x", keys[-10:], np.full(10, 7.0, np.float32))
        s.flush()
        assert s.get("x", keys[-10:]).to_pylist() == [7.0] * 10


def test_freed_slots_kept_for_reuse_up_to_the_reserve_and_returned_at_close(tmp_path):
    """Slots that merges free stay allocated (up to free_reserve_buffers write buffers) so the
    next flushes overwrite them in place instead of refilling punched holes; the rest are
    punched at once, and close() punches all of them."""
    path = str(tmp_path / "s")
    buf = 1 << 20
    keys = np.arange(300_000, dtype=np.uint64)
    rng = np.random.default_rng(5)
    for reserve in (2.0, 0.0):
        o = StoreOptions(page_size=16384, write_buffer_bytes=buf, free_reserve_buffers=reserve)
        p = f"{path}-{reserve}"
        with Store.open(p, o) as s:
            s.create_feature("x", "float32")
            s.put("x", keys, np.zeros(len(keys), np.float32))
            s.flush()
            expected = np.zeros(len(keys), np.float32)
            for r in range(6):  # uniform overwrites: merges gather and free pages
                k = np.unique(rng.integers(0, len(keys), 120_000)).astype(np.uint64)
                expected[k] = r + 1
                s.put("x", k, np.full(len(k), r + 1, np.float32))
            s.flush()
            st = s.stats()
            ps, used, kept = st["page_size"], st["pages_in_use"], st["kept_free_slots"]
            assert st["merger"]["pages_released"] > 0, "the updates freed no page: nothing exercised"
            if reserve:
                assert 0 < kept <= reserve * buf / ps
            else:
                assert kept == 0
            alloc = _allocated(p)
            assert (used + kept) * ps - FS_SLACK <= alloc <= (used + kept) * ps + FS_SLACK, \
                f"pages.dat allocates {alloc:,} B; in use {used} + kept {kept} slots of {ps} B"
            got = s.scan("x")
            assert np.array_equal(got.column(1).to_numpy(), expected)  # kept slots were overwritten correctly
        used_at_close = used
        with Store.open(p, o) as s:
            st = s.stats()
            assert st["kept_free_slots"] == 0 and st["pages_in_use"] == used_at_close
            assert _allocated(p) <= used_at_close * st["page_size"] + FS_SLACK, "close() did not return the kept slots"
            assert np.array_equal(s.scan("x").column(1).to_numpy(), expected)


def test_free_reserve_option_is_checked(tmp_path):
    for bad in (-1.0, float("nan"), 2000.0):
        with pytest.raises(InvalidArgumentError, match="free_reserve_buffers"):
            Store.open(str(tmp_path / "s"), StoreOptions(free_reserve_buffers=bad))


_CRASHED_SESSION = """
import os, sys
import numpy as np
from recflash.reader import Store, StoreOptions
s = Store.open(sys.argv[1], StoreOptions(page_size=16384, write_buffer_bytes=1 << 20, free_reserve_buffers=8.0))
s.create_feature("x", "float32")
keys = np.arange(300_000, dtype=np.uint64)
s.put("x", keys, np.zeros(len(keys), np.float32))
s.flush()
rng = np.random.default_rng(5)
for r in range(6):
    k = np.unique(rng.integers(0, len(keys), 120_000)).astype(np.uint64)
    s.put("x", k, np.full(len(k), r + 1, np.float32))
s.flush()
st = s.stats()
print(st["pages_in_use"], st["kept_free_slots"], flush=True)
os._exit(0)  # no close(): the kept free slots stay allocated
"""


def test_open_returns_slots_a_crashed_session_left_allocated(tmp_path):
    """A session that ends without close() leaves the free slots it kept for reuse allocated.
    The next writable open finds the file allocating more than its pages in use and punches
    every free run; after a clean close the open has nothing to return."""
    import subprocess
    import sys

    path = str(tmp_path / "s")
    out = subprocess.run([sys.executable, "-c", _CRASHED_SESSION, path], capture_output=True, text=True,
                         check=True).stdout.split()
    used, kept = int(out[0]), int(out[1])
    assert kept > 16, "the session kept no freed slot: nothing exercised"
    assert _allocated(path) >= (used + kept) * 16384 - FS_SLACK, "the kept slots are not allocated after the crash"
    expected = np.zeros(300_000, np.float32)
    rng = np.random.default_rng(5)
    for r in range(6):
        expected[np.unique(rng.integers(0, len(expected), 120_000))] = r + 1
    o = StoreOptions(page_size=16384, write_buffer_bytes=1 << 20)
    with Store.open(path, o) as s:
        st = s.stats()
        assert st["open_returned_slots"] >= kept, st
        assert st["punch_failures"] == 0
        assert _allocated(path) <= st["pages_in_use"] * 16384 + FS_SLACK, \
            f"{_allocated(path):,} B allocated for {st['pages_in_use']} pages after the open"
        assert np.array_equal(s.scan("x").column(1).to_numpy(), expected)
    with Store.open(path, o) as s:
        assert s.stats()["open_returned_slots"] == 0
        assert np.array_equal(s.scan("x").column(1).to_numpy(), expected)
