"""A real full disk: a 64 MiB ext4 image on a loop device, filled by puts and by an import.

ENOSPC surfaces as DiskFullError (an IOError_ with errno ENOSPC) naming the operation and the
file; the store reopens with everything that was synced; deleting data (or freeing space)
then lets it continue. Needs root, losetup, mkfs.ext4 and mount: skipped with the reason
where any is missing (containers without loop devices).
"""

from __future__ import annotations

import errno
import os
import shutil
import subprocess
import sys

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from recflash.reader import DiskFullError, RecflashError, Store, StoreOptions

MIB = 1 << 20


def _run(*cmd):
    return subprocess.run(list(cmd), capture_output=True, text=True, timeout=120)


@pytest.fixture
def small_fs(tmp_path):
    if os.geteuid() != 0:
        pytest.skip("needs root to attach a loop device and mount it")
    for tool in ("losetup", "mkfs.ext4", "mount", "umount"):
        if not shutil.which(tool):
            pytest.skip(f"needs {tool} (not installed)")
    img = tmp_path / "disk.img"
    with open(img, "wb") as f:
        f.truncate(64 * MIB)
    # -m 0: no blocks reserved for root (the tests run as root and would use them)
    r = _run("mkfs.ext4", "-q", "-F", "-m", "0", str(img))
    if r.returncode:
        pytest.skip(f"mkfs.ext4 failed: {r.stderr.strip()}")
    r = _run("losetup", "-f", "--show", str(img))
    if r.returncode:
        pytest.skip(f"no loop device available: {r.stderr.strip()}")
    dev = r.stdout.strip()
    mnt = tmp_path / "mnt"
    mnt.mkdir()
    r = _run("mount", dev, str(mnt))
    if r.returncode:
        _run("losetup", "-d", dev)
        pytest.skip(f"cannot mount a loop device here: {r.stderr.strip()}")
    try:
        yield mnt
    finally:
        if _run("umount", str(mnt)).returncode:
            _run("umount", "-l", str(mnt))  # a store a failed test left open keeps it busy
        _run("losetup", "-d", dev)


def _values(keys, rnd):
    return [bytes([int(k) % 251]) * 8 + rnd for k in keys]


def test_puts_fill_the_disk(small_fs):
    filler = small_fs / "filler"
    with open(filler, "wb") as f:
        f.write(b"\0" * (8 * MIB))
        os.fsync(f.fileno())
    path = str(small_fs / "store")
    opts = StoreOptions(page_size=16384, write_buffer_bytes=2 * MIB)
    s = Store.open(path, opts)
    s.create_feature("b", "binary")
    rng = np.random.default_rng(1)
    synced = {}
    batch = 0
    err = None
    while batch < 1000:
        keys = np.arange(batch * 500, (batch + 1) * 500, dtype=np.uint64)
        rnd = rng.bytes(2000)
        try:
            s.put("b", keys, _values(keys, rnd))
            s.sync()
        except RecflashError as e:
            err = e
            break
        synced.update({int(k): v for k, v in zip(keys, _values(keys, rnd))})
        batch += 1
    assert err is not None, "64 MiB never filled"
    assert isinstance(err, DiskFullError) and err.errno == errno.ENOSPC, repr(err)
    assert "No space left on device" in str(err) and path in str(err), str(err)
    # The store refuses more writes (same error) until reopened; close still releases it.
    with pytest.raises(DiskFullError):
        s.put("b", np.array([10**9], dtype=np.uint64), [b"x"])
        s.sync()
    try:
        s.close()
    except RecflashError:
        pass
    # Reopens with everything synced.
    s = Store.open(path, opts)
    t = s.scan("b")
    got = dict(zip(t.column("key").to_pylist(), t.column("value").to_pylist()))
    missing = [k for k, v in synced.items() if got.get(k) != v]
    assert not missing, f"{len(missing)} synced items lost, e.g. key {missing[0]}"
    # Deleting data frees space: the store continues (a full disk first needs room for the
    # deletes themselves: the filler goes first, then most of the store's own items).
    s.close()
    os.unlink(filler)
    os.sync()  # ext4 reuses freed blocks once the unlink's journal transaction committed
    s = Store.open(path, opts)
    keys = np.array(sorted(synced), dtype=np.uint64)
    drop = keys[: len(keys) * 3 // 4]
    s.delete("b", drop)
    s.compact(["b"])
    for k in drop.tolist():
        synced.pop(k)
    more = np.arange(2 * 10**6, 2 * 10**6 + 500, dtype=np.uint64)
    rnd = rng.bytes(2000)
    s.put("b", more, _values(more, rnd))
    s.sync()
    synced.update({int(k): v for k, v in zip(more, _values(more, rnd))})
    s.close()
    with Store.open(path, opts) as s:
        t = s.scan("b")
        assert dict(zip(t.column("key").to_pylist(), t.column("value").to_pylist())) == synced


def test_import_fills_the_disk_then_resumes(small_fs, tmp_path):
    # ~31 MB of rows in 6 files (the import takes them in order and syncs after each); a
    # 30 MiB filler leaves too little room, removing it lets the import finish.
    n, files = 150_000, 6
    rng = np.random.default_rng(2)
    blob = rng.bytes(n * 200)
    vals = pa.array([blob[i * 200:(i + 1) * 200] for i in range(n)], pa.binary())
    ids = pa.array(rng.integers(0, 2**62, n), pa.int64())
    srcs = []
    per = n // files
    for i in range(files):
        src = tmp_path / f"rows{i}.parquet"
        pq.write_table(pa.table({"id": ids[i * per:(i + 1) * per], "payload": vals[i * per:(i + 1) * per]}), src,
                       compression="none")
        srcs.append(str(src))
    filler = small_fs / "filler"
    with open(filler, "wb") as f:
        f.write(b"\0" * (30 * MIB))
        os.fsync(f.fileno())
    store = str(small_fs / "store")
    cmd = [sys.executable, "-P", "-m", "recflash.cli", "import", "parquet", *srcs, "--store", store,
           "--write-buffer-mb", "4", "--quiet"]
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
    assert r.returncode != 0, r.stdout + r.stderr
    assert "DiskFullError" in r.stderr and "No space left on device" in r.stderr, r.stderr
    assert "Traceback" not in r.stderr, r.stderr
    # What the import synced before the disk filled is in the store, and it opens.
    with Store.open(store, StoreOptions(read_only=True)) as s:
        partial = s.scan("payload").num_rows
    assert 0 < partial < n  # some chunks were synced before the disk filled
    os.unlink(filler)
    os.sync()  # ext4 reuses freed blocks once the unlink's journal transaction committed
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stderr
    with Store.open(store, StoreOptions(read_only=True)) as s:
        t = s.scan("payload")
        assert t.num_rows == n
        assert t.column("value").to_pylist()[:3] == vals.to_pylist()[:3]
        assert t.column("value").to_pylist()[-1] == vals.to_pylist()[-1]
    assert partial <= n
