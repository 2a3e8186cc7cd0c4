"""The Ray Data loader and the preprocessing step given awkward inputs (recflash.ingest.ray,
recflash.ingest.preprocess): row counts Ray takes from the read tasks, select_columns that must
not change the rows, argument checks in the driver, reads while a writer is busy, batches()
arguments and key bounds, column types per role and table_sizes mappings, and the README's Ray
snippet run as written.

Tests that need Ray share one small local cluster (2 CPUs, no dashboard) that the module starts
and shuts down itself."""

from __future__ import annotations

import errno
import logging
import os
import subprocess
import sys
import time

import numpy as np
import pyarrow as pa
import pytest

from recflash.reader import Store, StoreOptions
from recflash.reader.errors import (IOError_, InvalidArgumentError, RecflashError, SchemaError,
                                    StaleSnapshotError)

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
MAX = (1 << 64) - 1


@pytest.fixture(scope="module")
def store(tmp_path_factory):
    """Features with different key sets (so the rows of a read are a union) and updated keys
    (so page item counts include older versions): what makes a split's row estimate inexact.
    Also a key at 2**64 - 1."""
    path = str(tmp_path_factory.mktemp("inputs") / "store")
    with Store.open(path, StoreOptions(page_size=4096)) as s:
        s.create_feature("label", "float32")
        s.create_feature("a", "int64")
        s.create_feature("b", "float32")
        s.create_feature("l", "list<int64>")
        s.create_feature("e", "fixed_size_list<float32, 4>")
        s.create_feature("bin", "binary")
        ka = np.arange(0, 6000, 2, dtype=np.uint64)
        kb = np.arange(0, 6000, 3, dtype=np.uint64)
        s.put("label", np.arange(6000, dtype=np.uint64), np.arange(6000, dtype=np.float32) % 2)
        s.put("a", ka, np.arange(len(ka), dtype=np.int64))
        s.put("b", kb, np.arange(len(kb), dtype=np.float32))
        kl = np.arange(0, 600, 5, dtype=np.uint64)
        s.put("l", kl, pa.array([list(range(i % 4)) for i in range(len(kl))], pa.list_(pa.int64())))
        s.put("e", kl, np.ones((len(kl), 4), dtype=np.float32))
        s.put("bin", kl, [b"12"] * len(kl))
        s.flush()
        s.put("b", kb[:1500], np.full(1500, 7.0, dtype=np.float32))  # older versions stay in pages
        s.flush()
        top = np.array([1 << 63, MAX - 1, MAX], dtype=np.uint64)
        s.put("a", top, np.array([1, 2, 3], dtype=np.int64))
        s.put("label", top, np.ones(3, dtype=np.float32))
    return path


def _scan(path, features, key_range=None):
    with Store.open(path, read_only=True) as s:
        return s.scan_many(features, key_range=key_range)


def _rows(ray, ds) -> pa.Table:
    tables = ray.get(ds.to_arrow_refs())
    return pa.concat_tables(tables).sort_by("key") if tables else None


# -- 1. count() --------------------------------------------------------------------------------
def test_count_reads_the_rows_instead_of_the_split_estimate(cluster, store):
    from recflash.ingest.ray import RecFlashDatasource, read_store

    want = _scan(store, ["b", "a"]).num_rows
    src = RecFlashDatasource(store, features=["b", "a"], rows_per_task=500)
    tasks = src.get_read_tasks(1)
    assert len(tasks) > 1 and all(t.metadata.num_rows is None for t in tasks)
    assert all(t.metadata.size_bytes > 0 for t in tasks)  # the size stays an estimate for Ray
    ds = read_store(store, features=["b", "a"], rows_per_task=500)
    assert ds.count() == want
    assert read_store(store, features=["b", "a"]).count() == want
    assert ds.limit(want - 7).count() == want - 7
    assert ds.limit(want + 5).count() == want
    assert ds.materialize().count() == want


# -- 2. select_columns keeps the rows ------------------------------------------------------------
def test_select_columns_never_changes_the_rows(cluster, store):
    from recflash.ingest.ray import read_store

    ds = read_store(store, features=["b", "a"], rows_per_task=700)
    ref = _scan(store, ["b", "a"])
    for cols in (["key", "a"], ["a", "key"], ["key"], ["key", "b", "a"]):
        pushed = ds.select_columns(cols)
        plain = ds.map_batches(lambda t: t, batch_format="pyarrow").select_columns(cols)  # no pushdown
        got, want = _rows(cluster, pushed), _rows(cluster, plain)
        assert got.column_names == cols and got.equals(want) and got.num_rows == ref.num_rows, cols
        assert pushed.count() == ref.num_rows
    assert ds.select_columns(["a"]).count() == ds.select_columns([]).count() == ref.num_rows
    # A rename above the read (Ray keeps the Project) with a selection pushed under it.
    got = _rows(cluster, ds.rename_columns({"a": "x"}).select_columns(["key", "x"]))
    assert got.equals(ref.select(["key", "a"]).rename_columns(["key", "x"]))


def test_select_columns_unknown_name_is_a_recflash_error(cluster, store):
    from recflash.ingest.ray import ColumnSelectionError, read_store

    class Records(logging.Handler):
        def __init__(self):
            super().__init__(logging.DEBUG)
            self.messages = []

        def emit(self, record):
            self.messages.append(record.getMessage())

    # Ray Data's loggers do not propagate to the root logger (caplog): listen where it reports.
    log = logging.getLogger("ray.data.exceptions")
    records = Records()
    log.addHandler(records)
    try:
        ds = read_store(store, features=["a"])
        for bad in (["zzz"], ["key", "b"]):  # b is in the store, not in this dataset
            with pytest.raises(ColumnSelectionError, match=rf"select_columns: no column\(s\) \['{bad[-1]}'\].*key, a"):
                ds.select_columns(bad).take_all()
    finally:
        log.removeHandler(records)
    assert issubclass(ColumnSelectionError, InvalidArgumentError)
    assert records.messages  # Ray did report it ...
    assert not [m for m in records.messages if "open an issue" in m]  # ... not as an internal error of Ray Data


@pytest.fixture(scope="module")
def wide_store(tmp_path_factory):
    """A feature to select and features to drop that hold keys it lacks, one per way a read
    task learns a dropped feature's keys: `run`, a dense run of keys (the page table);
    `upd`, sparse keys updated and deleted after the load (the key index, from the CHECKPOINT
    of the writer's clean close); `bin`, sparse keys only ever loaded (no index holds them:
    its pages are read, for their keys alone)."""
    path = str(tmp_path_factory.mktemp("wide") / "store")
    with Store.open(path, StoreOptions(page_size=4096)) as s:
        for name, t in (("sel", "float32"), ("run", "int64"), ("upd", "list<int64>"), ("bin", "binary")):
            s.create_feature(name, t)
        ks = np.arange(0, 6000, 2, dtype=np.uint64)
        s.put("sel", ks, np.arange(len(ks), dtype=np.float32))
        s.put("run", np.arange(3000, 9000, dtype=np.uint64), np.arange(6000, dtype=np.int64))
        ku = np.arange(1, 12000, 5, dtype=np.uint64)
        s.put("upd", ku, pa.array([[int(k)] for k in ku], pa.list_(pa.int64())))
        kb = np.arange(3, 15000, 7, dtype=np.uint64)
        s.put("bin", kb, [b"v%d" % k for k in kb])
        s.flush()
        s.put("upd", ku[::3], pa.array([[0, 1]] * len(ku[::3]), pa.list_(pa.int64())))
        s.delete("upd", ku[1::4])
        s.delete("sel", ks[:50])
    return path


def test_projection_rows_and_values_equal_the_unprojected_read(cluster, wide_store):
    from recflash.ingest.ray import read_store

    feats = ["sel", "run", "upd", "bin"]
    ref = _scan(wide_store, feats)
    # The dropped features hold keys the selected one lacks (rows where `sel` is null).
    assert ref.column("sel").null_count > 1000
    ds = read_store(wide_store, features=feats, rows_per_task=1500)
    assert _rows(cluster, ds).equals(ref)
    for cols in (["key", "sel"], ["sel", "key"], ["key"], ["key", "sel", "bin"], ["upd", "key"]):
        got = _rows(cluster, ds.select_columns(cols))
        assert got.column_names == cols and got.equals(ref.select(cols)), cols
    assert ds.select_columns(["sel"]).count() == ds.select_columns([]).count() == ds.count() == ref.num_rows


def test_projected_read_task_reads_only_the_selected_values(wide_store):
    """A read task called directly, as a Ray worker runs it: the projected task returns the
    unprojected task's rows and selected columns, and its engine read statistics show that
    dropped features whose keys the page table or the key index knows cost no bytes at all,
    and one whose keys only its pages hold costs those pages alone."""
    from recflash.ingest.ray import KEY, RecFlashDatasource, _read_range

    def task(src, lo=0, hi=None):
        stats = {}
        (table,) = _read_range(wide_store, src._features, src._columns(), lo, hi, stats)
        return table, stats

    with Store.open(wide_store, read_only=True) as r:
        r.scan_many(["sel"])
        sel_only = r.last_read_stats()["bytes_read"]
        r.scan_keys("bin")
        bin_keys = r.last_read_stats()["bytes_read"]
        r.scan("bin")
        assert bin_keys == r.last_read_stats()["bytes_read"] > 0  # the same pages a scan reads
    for feats in (["sel", "run", "upd"], ["sel", "run", "upd", "bin"]):
        src = RecFlashDatasource(wide_store, features=feats, rows_per_task=1 << 30)
        for lo, hi in ((0, None), (2500, 7001)):
            full, full_st = task(src, lo, hi)
            assert full.column_names == [KEY] + feats
            for cols in ([KEY, "sel"], ["sel"], []):
                proj, st = task(src.apply_projection({c: c for c in cols}), lo, hi)
                if cols:
                    assert proj.equals(full.select(cols)), (feats, cols)
                else:
                    assert proj.num_rows == full.num_rows
                assert st["bytes_read"] < full_st["bytes_read"], (feats, cols, st, full_st)
                if (lo, hi) == (0, None):
                    # run: page table, upd: the CHECKPOINT's key index; bin: its pages
                    assert st["bytes_read"] == (sel_only if cols else 0) + (bin_keys if "bin" in feats else 0), (
                        feats, cols)


# -- 3. the README snippet ----------------------------------------------------------------------
def test_readme_ray_snippet_runs_as_written(cluster, tmp_path):
    from recflash.ingest import ImportOptions, SyntheticSource, run_import

    path = str(tmp_path / "store")
    run_import(SyntheticSource("criteo-kaggle", 3000, seed=1, chunk_rows=4096), path, ImportOptions(write_buffer_mb=4))
    readme = open(os.path.join(ROOT, "README.md")).read()
    section = readme[readme.index("### Ray Data loaders and DLRM training"):]
    start = section.index("```python\n") + len("```python\n")
    code = section[start:section.index("\n```", start)]
    assert '"/data/store"' in code
    code = code.replace('"/data/store"', repr(path))
    code += "\n    n_rows += batch.labels.shape[0]\n"  # inside the snippet's loop
    env = {"n_rows": 0}
    exec(compile("n_rows = 0\n" + code, "README.md", "exec"), env)
    assert env["n_rows"] == _scan(path, env["pre"].features).num_rows == 3000
    assert type(env["batch"]).__name__ == "Batch"


# -- 10. read_store arguments ------------------------------------------------------------------
@pytest.mark.parametrize("kwargs,needle", [
    ({"key_range": (0, 2**64)}, "key_range=(0, 18446744073709551616)"),
    ({"key_range": (2**64, None)}, "key_range=(18446744073709551616, None)"),
    ({"key_range": 5}, "key_range must be None or a (lo, hi) pair"),
    ({"key_range": (1, 2, 3)}, "got (1, 2, 3)"),
    ({"key_range": ("a", None)}, "got ('a', None)"),
    ({"key_range": (1.5, 3)}, "got (1.5, 3)"),
    ({"key_range": (-1, 5)}, "key_range=(-1, 5)"),
    ({"key_range": (10, 5)}, "key_range=(10, 5)"),
    ({"rows_per_task": "x"}, "rows_per_task must be a positive integer, got 'x'"),
    ({"rows_per_task": 2.5}, "rows_per_task must be a positive integer, got 2.5"),
    ({"rows_per_task": 0}, "rows_per_task must be a positive integer, got 0"),
    ({"rows_per_task": True}, "rows_per_task must be a positive integer, got True"),
    ({"features": "label"}, "features must be a list of feature names, got the string 'label'"),
    ({"features": [1]}, "got 1 in [1]"),
    ({"features": ["nope"]}, "unknown feature 'nope'"),
])
def test_datasource_arguments_are_checked_at_construction(store, kwargs, needle):
    from recflash.ingest.ray import RecFlashDatasource

    with pytest.raises(InvalidArgumentError) as ei:
        RecFlashDatasource(store, **kwargs)
    assert needle in str(ei.value)


def test_read_store_edge_key_ranges(cluster, store):
    from recflash.ingest.ray import read_store

    with pytest.raises(InvalidArgumentError, match="key_range"):
        read_store(store, features=["a"], key_range=(0, 2**64))
    with pytest.raises(InvalidArgumentError, match="features must be a list"):
        read_store(store, features="a")
    for kr in ((MAX, None), (5, MAX), (1 << 63, None), (0, None)):
        got = _rows(cluster, read_store(store, features=["a"], key_range=kr, rows_per_task=400))
        assert got.equals(_scan(store, ["a"], kr)), kr
    assert int(_rows(cluster, read_store(store, features=["a"], key_range=(MAX, None))).column("key")[0].as_py()) == MAX


# -- 4. reads while a writer is busy ----------------------------------------------------------------
_WRITER = """\
import sys, time
import numpy as np
from recflash.reader import Store, StoreOptions
path, n, secs = sys.argv[1], int(sys.argv[2]), float(sys.argv[3])
keys = np.arange(n, dtype=np.uint64) * 7
with Store.open(path, StoreOptions(write_buffer_bytes=1 << 20)) as w:
    print("ready", flush=True)
    t0, v = time.time(), 1
    while time.time() - t0 < secs:  # new WAL files, page rewrites and retired WAL files, fast
        sub = keys[(v * 997) % n::max(1, n // 200)]
        w.put("v", sub, np.full(len(sub), v, np.int64))
        w.put("w", sub, np.full(len(sub), v, np.int64))
        w.sync()
        w.flush()
        v += 1
print("versions", v, flush=True)
"""


def test_reads_retry_while_a_writer_is_busy(cluster, tmp_path, monkeypatch):
    from recflash.ingest import ray as rr

    path, n = str(tmp_path / "busy"), 20_000
    keys = np.arange(n, dtype=np.uint64) * 7
    with Store.open(path) as w:
        w.create_feature("v", "int64")
        w.create_feature("w", "int64")
        w.put("v", keys, np.zeros(n, np.int64))
        w.put("w", keys, np.zeros(n, np.int64))
    opens = []
    real_open = rr._open_ro
    monkeypatch.setattr(rr, "_open_ro", lambda p: (opens.append(p), real_open(p))[1])
    wp = subprocess.Popen([sys.executable, "-c", _WRITER, path, str(n), "4"], stdout=subprocess.PIPE, text=True)
    try:
        assert wp.stdout.readline().strip() == "ready"
        reads = 0
        t_end = time.time() + 3.0
        while time.time() < t_end and wp.poll() is None:
            # the read task's body in this process (its reopens are counted), then a Ray read
            t = rr._read_range(path, ["v", "w"], ["key", "v", "w"], 0, None)[0]
            assert np.array_equal(t.column("key").to_numpy(), keys) and t.column("v").null_count == 0
            reads += 1
            if reads % 10 == 0:
                got = _rows(cluster, rr.read_store(path, rows_per_task=6000))
                assert np.array_equal(got.column("key").to_numpy(), keys)
        assert reads >= 3
    finally:
        out, _ = wp.communicate(timeout=60)
    assert wp.returncode == 0 and "versions" in out
    assert len(opens) >= reads  # retries, if any, were reopens


def test_snapshot_retry_rules(tmp_path, monkeypatch):
    """Which errors a read task retries on a fresh open (StaleSnapshotError at open or scan,
    among them the engine's own for a WAL file a writer retired during the open), which it
    raises at once (every other error, an ENOENT on a file under wal/ included: the engine says
    Stale when that is a writer moving on), and the one error after the last try."""
    from recflash.ingest import ray as rr
    from recflash.reader import testing

    path = str(tmp_path / "s")
    with Store.open(path) as s:
        s.create_feature("x", "int64")
        s.put("x", np.arange(10, dtype=np.uint64), np.arange(10))
    monkeypatch.setattr(rr, "_RETRY_DELAY", 0.0)
    monkeypatch.setattr(rr, "_RETRY_DELAY_MAX", 0.0)
    real_open = rr._open_ro

    def io_error(p, err=errno.ENOENT):
        e = IOError_(f"open failed on '{p}': No such file or directory (errno {err})")
        e.errno = err
        return e

    engine_errors = []

    def wal_retired(p):
        """The engine's real open with every WAL file gone at its open for replay (what a
        writer retiring it between the open's listing and its read looks like)."""
        testing.arm("wal_open", nth=1, errno=errno.ENOENT, sticky=True, path=os.sep + "wal" + os.sep)
        try:
            return real_open(p)
        except BaseException as e:
            engine_errors.append(e)
            raise
        finally:
            testing.disarm()

    def scripted(errors):
        calls = []

        def fake(p):
            calls.append(p)
            if len(calls) <= len(errors):
                step = errors[len(calls) - 1]
                if callable(step):
                    return step(p)
                raise step
            return real_open(p)
        return fake, calls

    fake, calls = scripted([StaleSnapshotError("changed at open"), wal_retired, StaleSnapshotError("again")])
    monkeypatch.setattr(rr, "_open_ro", fake)
    assert rr._read_range(path, ["x"], ["key", "x"], 0, None)[0].num_rows == 10
    assert len(calls) == 4
    assert len(engine_errors) == 1 and isinstance(engine_errors[0], StaleSnapshotError), engine_errors
    assert os.path.join(path, "wal") + os.sep in str(engine_errors[0]) and "retired" in str(engine_errors[0])
    # Any other I/O error is not a writer moving on: raised at once.
    for other in (io_error(os.path.join(path, "pages.dat")), io_error(os.path.join(path, "wal", "001763.log"))):
        fake, calls = scripted([other])
        monkeypatch.setattr(rr, "_open_ro", fake)
        with pytest.raises(IOError_) as ei:
            rr._read_range(path, ["x"], ["key", "x"], 0, None)
        assert ei.value is other
        assert len(calls) == 1
    # A writer that outruns every try: one StaleSnapshotError that says so.
    fake, calls = scripted([StaleSnapshotError("stale")] * 100)
    monkeypatch.setattr(rr, "_open_ro", fake)
    with pytest.raises(StaleSnapshotError, match=r"changed under each of 11 read-only opens"):
        rr._read_range(path, ["x"], ["key", "x"], 5, None)
    assert len(calls) == rr.OPEN_RETRIES + 1 == 11


# -- 5., 6., 7. Preprocessor.batches ----------------------------------------------------------------
def test_batches_arguments_are_checked_when_called(store):
    from recflash.ingest import Preprocessor

    pre = Preprocessor(dense=["b"], sparse=["a"], label="label")
    with Store.open(store, read_only=True) as s:
        for bad, needle in ((-4, "got -4"), (0, "got 0"), (2.5, "got 2.5"), (True, "got True")):
            with pytest.raises(InvalidArgumentError, match=f"batch_size must be a positive integer, {needle}"):
                pre.batches(s, batch_size=bad)  # no next(): raised by the call
        for bad in (0, -1, 1.5):
            with pytest.raises(InvalidArgumentError, match="scan_keys must be a positive integer"):
                pre.batches(s, 10, scan_keys=bad)
            with pytest.raises(InvalidArgumentError, match="scan_keys"):
                pre.tables(s, scan_keys=bad)
        with pytest.raises(InvalidArgumentError, match=r"key_range=\(19995, 18446744073709551616\): hi must be"):
            pre.batches(s, 10, key_range=(19995, 2**64))
        for bad in (5, (1, 2, 3), ("a", None), (10, 5), (-1, None)):
            with pytest.raises(InvalidArgumentError, match="key_range"):
                pre.batches(s, 10, key_range=bad)
        # hi=None: no upper bound, as in read_store / scan_many
        got = sum(b.labels.shape[0] for b in pre.batches(s, 100, key_range=(10, None), scan_keys=64))
        assert got == s.scan_many(pre.features, key_range=(10, None)).num_rows


def test_batches_cover_every_key_including_the_largest(store):
    from recflash.ingest import Preprocessor

    pre = Preprocessor(sparse=["a"], label="label")
    with Store.open(store, read_only=True) as s:
        everything = s.scan_many(pre.features)
        assert everything.column("key")[-1].as_py() == MAX
        for kr in (None, (0, None), (MAX - 1, None), (MAX, None)):
            want = s.scan_many(pre.features, key_range=kr)
            batches = list(pre.batches(s, 1000, key_range=kr, scan_keys=1500))
            assert sum(b.labels.shape[0] for b in batches) == want.num_rows, kr
            assert np.concatenate([b.labels.numpy() for b in batches]).tolist() == \
                want.column("label").to_numpy(zero_copy_only=False).tolist()
        # a half-open range ending at 2**64 - 1 excludes that key, as scan_many does
        assert sum(b.labels.shape[0] for b in pre.batches(s, 7, key_range=(MAX - 1, MAX))) == 1


# -- 8. column types per role ---------------------------------------------------------------------
def test_column_types_are_checked_per_role(store):
    from recflash.ingest import Preprocessor
    from recflash.ingest.ray import TorchRecCollate

    t = _scan(store, ["label", "a", "b", "l", "e", "bin"], key_range=(0, 50))
    cases = [
        (dict(sparse=["e"]), "sparse feature 'e' has type fixed_size_list"),
        (dict(sparse=["b"]), "sparse feature 'b' has type float"),
        (dict(sparse=["bin"]), "sparse feature 'bin' has type binary"),
        (dict(dense=["l"]), "dense feature 'l' has type list<item: int64>"),
        (dict(dense=["e"]), "dense feature 'e' has type fixed_size_list"),
        (dict(dense=["bin"]), "dense feature 'bin' has type binary"),
        (dict(dense=["b"], label="l"), "label feature 'l' has type list"),
        (dict(dense=["b"], label="bin"), "label feature 'bin' has type binary"),
    ]
    for kw, needle in cases:
        pre = Preprocessor(**kw)
        for fn in (pre, TorchRecCollate(pre)):
            with pytest.raises(SchemaError) as ei:
                fn(t)
            assert needle in str(ei.value), (kw, str(ei.value))
    # Values that a cast would have taken silently: whole-number floats, digit strings.
    whole = pa.table({"key": pa.array([0, 1], pa.uint64()), "s": pa.array([1.0, 2.0], pa.float32()),
                      "d": pa.array([b"12", b"3"])})
    with pytest.raises(SchemaError, match="sparse feature 's' has type float"):
        Preprocessor(sparse=["s"])(whole)
    with pytest.raises(SchemaError, match="sparse feature 'd' has type binary"):
        Preprocessor(sparse=["d"])(whole)
    with pytest.raises(InvalidArgumentError, match=r"lacks column\(s\) \['zz'\]"):
        Preprocessor(dense=["zz"])(t)
    with pytest.raises(InvalidArgumentError, match="no column 'zz'.*dense feature"):
        Preprocessor(dense=["zz"]).dense_matrix(t)
    with pytest.raises(InvalidArgumentError, match="TorchRecCollate needs a recflash.ingest.Preprocessor, got int"):
        TorchRecCollate(5)
    # the accepted types still convert: list<int64> sparse, int64 sparse, float dense, float label
    b = Preprocessor(dense=["b"], sparse=["a", "l"], label="label", table_sizes=3)(t)
    assert b.sparse_features.keys() == ["a", "l"] and b.dense_features.shape == (t.num_rows, 1)
    # batches() checks the store's types when called
    with Store.open(store, read_only=True) as s:
        with pytest.raises(SchemaError, match="Preprocessor.batches: sparse feature 'b' has type float"):
            Preprocessor(sparse=["b"]).batches(s, 10)


# -- 8., 9. constructor arguments ----------------------------------------------------------------
@pytest.mark.parametrize("kwargs,needle", [
    (dict(sparse=["i"], table_sizes={"x": 7}), "table_sizes names ['x'], which are not sparse features"),
    (dict(sparse=["i", "l"], table_sizes={"i": 7}), "table_sizes lacks a size for sparse feature(s) ['l']"),
    (dict(sparse=["i"], table_sizes={"i": 2.5}), "size of sparse feature 'i' must be a positive integer, got 2.5"),
    (dict(sparse=["i"], table_sizes=0), "table_sizes must be positive, got 0"),
    (dict(sparse=["i"], table_sizes=[1, 2]), "2 table sizes for 1 sparse features"),
    (dict(sparse=["i"], table_sizes="7"), "table_sizes must be None, a positive integer"),
    (dict(dense="I1"), "dense must be a list of feature names, got the string 'I1'"),
    (dict(sparse=["i", "i"]), "duplicate feature name(s) ['i'] in sparse"),
    (dict(sparse=["i"], label=3), "label must be a feature name or None, got 3"),
    (dict(sparse=["i"], sparse_fill=1.5), "sparse_fill must be an integer id or None, got 1.5"),
    (dict(sparse=["i"], dense_fill="x"), "dense_fill must be a number, got 'x'"),
    (dict(sparse=["i"], hash_ids=True), "hash_ids=True needs a table size for every sparse feature"),
    (dict(dense=["i"], dense_transform="log"), "dense_transform must be 'log1p' or None, got 'log'"),
    (dict(), "needs at least one dense or sparse feature"),
])
def test_preprocessor_constructor_errors(kwargs, needle):
    from recflash.ingest import Preprocessor

    with pytest.raises(InvalidArgumentError) as ei:
        Preprocessor(**kwargs)
    assert needle in str(ei.value)
    assert isinstance(ei.value, (RecflashError, ValueError))


def test_preprocessor_accepts_the_documented_table_sizes():
    from recflash.ingest import Preprocessor

    assert Preprocessor(sparse=["i", "j"], table_sizes={"j": 5, "i": np.int64(3)}).table_sizes == {"i": 3, "j": 5}
    assert Preprocessor(sparse=["i", "j"], table_sizes=[3, 5]).table_sizes == {"i": 3, "j": 5}
    assert Preprocessor(sparse=["i", "j"], table_sizes=np.int32(4)).table_sizes == {"i": 4, "j": 4}
    assert Preprocessor(sparse=["i"]).table_sizes == {}
    # one feature in two roles is scanned once
    assert Preprocessor(dense=["f"], sparse=["f"], label="f").features == ["f"]
