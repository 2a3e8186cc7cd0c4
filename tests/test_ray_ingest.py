"""Ray Data loaders over a store (recflash.ingest.ray): datasource rows and values, projection
pushdown, key-range splits, parallel read tasks, the TorchRec collate, a short run of the DLRM
training example and the benchmark's --quick mode.

The module starts its own small local Ray cluster (2 CPUs, no dashboard) and shuts it down.
The benchmark test runs first, before that cluster exists (the benchmark starts its own)."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import numpy as np
import pyarrow as pa
import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PY = sys.executable
ROWS = 20_000


def _env():
    env = dict(os.environ)
    env.pop("RAY_ADDRESS", None)
    return env


def test_benchmark_quick_writes_valid_json(tmp_path):
    out = tmp_path / "ray_ingest.json"
    r = subprocess.run([PY, "-P", os.path.join(ROOT, "benchmarks", "ray_ingest.py"), "--quick", "--rows", "20000",
                        "--no-device", "--json", str(out), "--dir", str(tmp_path / "work")],
                       capture_output=True, text=True, timeout=600, env=_env(), cwd=str(tmp_path))
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    res = json.loads(out.read_text())
    for s in ("8", "39"):
        for kind in ("recflash", "parquet_cold", "parquet_warm"):
            assert res["read"][s][kind]["samples_per_s"] > 0
    u = res["update"]
    assert u["items"] == 1000 and u["recflash_upsert_seconds"] > 0
    # --quick: two update rounds of different keys (the run verified every key's last value)
    assert u["rounds"] == 2 and len(u["recflash_upsert_seconds_rounds"]) == 2
    assert len(u["parquet_rewrite_seconds_rounds"]) == 2 and 1000 < u["distinct_keys_updated"] <= 2000
    assert res["disk"]["store_bytes_per_item"] > 0 and res["disk"]["parquet_none_bytes_per_item"] > 0
    assert set(res["targets"]) == {"read_8_of_39_vs_parquet", "update_5pct_speedup",
                                   "bytes_per_item_vs_uncompressed_parquet",
                                   # the performance round's bars, beside round 1's
                                   "read_8_of_39_vs_parquet_2x", "read_all_39_vs_parquet", "update_5pct_speedup_20x",
                                   "pages_allocated_bytes_per_item", "pages_allocated_vs_uncompressed_parquet"}
    for t in res["targets"].values():
        assert isinstance(t["met"], bool) and t["measured"] > 0
    assert (tmp_path / "ray_ingest.png").stat().st_size > 0
    assert "target read_8_of_39_vs_parquet" in r.stdout


_OWN_RAY_SCRIPT = """\
import sys
import ray
from recflash.ingest.ray import read_store
from recflash.reader import Store

ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False, configure_logging=False)
rows = read_store(sys.argv[1], ["I1", "C1"], rows_per_task=4096).take_all()
with Store.open(sys.argv[1], read_only=True) as s:
    want = s.scan_many(["I1", "C1"]).num_rows
assert len(rows) == want > 0, (len(rows), want)
print("rows", len(rows))
"""


def test_own_ray_init_from_repository_root(tmp_path):
    """A user's script that calls ray.init() itself and then read_store(), run with the
    repository root as its working directory (Ray puts it on every worker's sys.path), and
    importing recflash from there: nothing in the root shadows the installed package."""
    from recflash.ingest import ImportOptions, SyntheticSource, run_import

    path = str(tmp_path / "store")
    run_import(SyntheticSource("criteo-kaggle", 10_000, seed=5, chunk_rows=4096), path, ImportOptions(write_buffer_mb=4))
    script = tmp_path / "own_ray.py"
    script.write_text(_OWN_RAY_SCRIPT)
    r = subprocess.run([PY, "-c", "import recflash.reader, recflash.ndp, recflash.ingest"], capture_output=True,
                       text=True, timeout=300, env=_env(), cwd=ROOT)
    assert r.returncode == 0, r.stderr[-3000:]
    r = subprocess.run([PY, str(script), path], capture_output=True, text=True, timeout=600, env=_env(), cwd=ROOT)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    assert "rows " in r.stdout


@pytest.fixture(scope="module")
def store(tmp_path_factory):
    """A Criteo-like store made with the import code (label, I1..I13, C1..C26; some empties)."""
    from recflash.ingest import ImportOptions, SyntheticSource, run_import

    path = str(tmp_path_factory.mktemp("ray") / "store")
    run_import(SyntheticSource("criteo-kaggle", ROWS, seed=3, chunk_rows=4096), path, ImportOptions(write_buffer_mb=4))
    return path


def _reference(path, features):
    from recflash.reader import Store

    with Store.open(path, read_only=True) as s:
        return s.scan_many(features)


def _all(ds) -> pa.Table:
    import ray

    return pa.concat_tables(ray.get(ds.to_arrow_refs())).sort_by("key")


def test_datasource_rows_and_values_equal_scan_many(cluster, store):
    from recflash.ingest.ray import read_store
    from recflash.reader import Store

    with Store.open(store, read_only=True) as s:
        feats = list(s.features())
    ds = read_store(store, rows_per_task=6000)
    got = _all(ds)
    ref = _reference(store, feats)
    assert got.num_rows == ROWS
    assert got.column_names == ["key"] + feats
    assert got.equals(ref)
    assert ds.schema().names == ["key"] + feats


def test_one_block_per_read_task(cluster, store):
    """read_store asks Ray for one block per read task: left to itself Ray cuts each task's
    table into ~1 MiB blocks, which cost most of an epoch's time (benchmarks/ray_ingest.py)."""
    from recflash.ingest.ray import RecFlashDatasource, read_store

    feats = ["label", "I1", "C1", "C2"]
    n_tasks = RecFlashDatasource(store, features=feats, rows_per_task=6000).num_read_tasks()
    assert n_tasks > 1
    ds = read_store(store, features=feats, rows_per_task=6000).select_columns(feats + ["key"]).materialize()
    assert ds.num_blocks() == n_tasks
    assert _all(ds).select(["key"] + feats).equals(_reference(store, feats))
    # An explicit override_num_blocks is the caller's and is kept.
    ds2 = read_store(store, features=feats, rows_per_task=6000, override_num_blocks=2 * n_tasks).materialize()
    assert ds2.num_blocks() == 2 * n_tasks
    assert _all(ds2).equals(_reference(store, feats))


def test_projection_reaches_the_read(cluster, store, capsys):
    from recflash.ingest.ray import RecFlashDatasource, _split_reads, read_store

    ds = read_store(store, rows_per_task=6000).select_columns(["C3", "key", "I1"])
    got = _all(ds)
    assert got.column_names == ["C3", "key", "I1"]
    # select_columns never changes the rows (Ray's semantics): the union of every feature's keys
    from recflash.reader import Store

    with Store.open(store, read_only=True) as s:
        allf = list(s.features())
    assert got.select(["key", "I1", "C3"]).equals(_reference(store, allf).select(["key", "I1", "C3"]))
    # The optimized plan has no Project left above the read: the projection was pushed down.
    ds.explain()
    plan = capsys.readouterr().out
    optimized = plan.split("Logical Plan (Optimized)")[1].split("Physical Plan")[0]
    assert "Project" not in optimized and "ReadRecFlash" in optimized, plan
    # ...and the pushed-down datasource reads the selected feature's values and every other
    # feature's keys alone (for its rows), returning the selected columns only.
    src = RecFlashDatasource(store, rows_per_task=6000).apply_projection({"I1": "I1", "key": "key"})
    assert _split_reads(src._features, src._columns()) == (["I1"], [f for f in src._features if f != "I1"])
    block = pa.concat_tables([b for t in src.get_read_tasks(1) for b in t()])
    assert block.column_names == ["I1", "key"]
    assert block.sort_by("key").equals(_reference(store, allf).select(["I1", "key"]))


def test_key_range_split_covers_every_key_once(store):
    from recflash.ingest.ray import RecFlashDatasource, split_key_range
    from recflash.reader import Store

    for key_range, rows_per_task in ((None, 3000), ((1234, 17001), 2500), ((500, None), 100000)):
        src = RecFlashDatasource(store, features=["label", "I2", "C7"], key_range=key_range, rows_per_task=rows_per_task)
        tasks = src.get_read_tasks(1)
        lo = 0 if key_range is None else key_range[0]
        hi = ROWS if key_range is None or key_range[1] is None else key_range[1]
        if rows_per_task < hi - lo:
            assert len(tasks) > 1
        keys = np.concatenate([b.column("key").to_numpy() for t in tasks for b in t()])
        assert np.array_equal(np.sort(keys), np.arange(lo, hi, dtype=np.uint64))  # each key exactly once
        assert all(t.metadata.num_rows is None for t in tasks)  # an estimate is not a row count
        est = sum(rows for _, _, rows in src._splits(1))
        assert abs(est - (hi - lo)) <= 0.05 * (hi - lo) + 64
    with Store.open(store, read_only=True) as s:
        splits = split_key_range(s.key_ranges("label"), 4000)
    assert splits[0][0] == 0 and splits[-1][1] is None
    assert all(a[1] == b[0] for a, b in zip(splits, splits[1:]))  # contiguous, disjoint


def test_two_read_tasks_in_parallel(cluster, store):
    """Two read tasks run at once in two Ray workers, each opening the store read-only."""
    import ray

    from recflash.ingest.ray import RecFlashDatasource

    src = RecFlashDatasource(store, features=["label", "C1", "I4"], rows_per_task=ROWS // 2 + 1)
    tasks = src.get_read_tasks(2)
    assert len(tasks) == 2

    @ray.remote(num_cpus=1)
    def run(task):
        import os
        import time

        t0 = time.time()
        blocks = list(task())
        return os.getpid(), t0, time.time(), pa.concat_tables(blocks)

    outs = ray.get([run.remote(t) for t in tasks])
    assert len({o[0] for o in outs}) == 2  # two worker processes
    got = pa.concat_tables([o[3] for o in outs]).sort_by("key")
    assert got.equals(_reference(store, ["label", "C1", "I4"]))


def test_reads_alongside_an_open_writer(cluster, store, tmp_path):
    """A writer holds the store open (its LOCK) with unflushed updates: read tasks still open
    it read-only and see everything the writer has logged."""
    import shutil

    from recflash.ingest.ray import read_store
    from recflash.reader import Store

    path = str(tmp_path / "copy")
    shutil.copytree(store, path)
    w = Store.open(path)
    try:
        w.put("I1", np.arange(10, dtype=np.uint64), np.full(10, 777, dtype=np.int64))
        w.sync()
        got = _all(read_store(path, features=["I1"], rows_per_task=5000))
        assert got.column("I1").to_numpy(zero_copy_only=False)[:10].tolist() == [777] * 10
        assert got.equals(w.scan_many(["I1"]))
    finally:
        w.close()


def test_torchrec_collate(cluster, store):
    import torch
    from torchrec.datasets.utils import Batch

    from recflash.ingest import Preprocessor
    from recflash.ingest.ray import TorchRecCollate, read_store

    pre = Preprocessor(dense=["I1", "I2", "I3"], sparse=["C1", "C2"], label="label", table_sizes=1000)
    ds = read_store(store, features=pre.features, rows_per_task=ROWS)
    batches = list(ds.iter_torch_batches(batch_size=4096, collate_fn=TorchRecCollate(pre)))
    assert all(isinstance(b, Batch) for b in batches)
    assert sum(b.labels.shape[0] for b in batches) == ROWS
    b0 = batches[0]
    assert b0.dense_features.shape == (4096, 3) and b0.dense_features.dtype == torch.float32
    assert b0.sparse_features.keys() == ["C1", "C2"]
    want = pre(_reference(store, pre.features).slice(0, 4096))  # the first batch is keys 0..4095 in order
    assert torch.equal(b0.dense_features, want.dense_features)
    assert torch.equal(b0.labels, want.labels)
    assert torch.equal(b0.sparse_features.values(), want.sparse_features.values())
    assert torch.equal(b0.sparse_features.lengths(), want.sparse_features.lengths())
    with pytest.raises(Exception, match="lacks column"):
        list(read_store(store, features=["I1"], rows_per_task=ROWS).iter_torch_batches(
            batch_size=128, collate_fn=TorchRecCollate(pre)))


def test_bad_arguments_name_the_store(store):
    from recflash.ingest.ray import RecFlashDatasource
    from recflash.reader.errors import InvalidArgumentError, NotAStoreError

    with pytest.raises(InvalidArgumentError, match="unknown feature 'nope'.*" + os.path.basename(store)):
        RecFlashDatasource(store, features=["nope"])
    with pytest.raises(InvalidArgumentError, match="rows_per_task"):
        RecFlashDatasource(store, rows_per_task=0)
    with pytest.raises(NotAStoreError):
        RecFlashDatasource(store + "-missing")


@pytest.mark.slow
def test_training_example_short_run(tmp_path):
    """examples/train_dlrm_ray.py end to end (its own Ray cluster): Ray Train TorchTrainer,
    2 CPU workers, DLRM under DistributedModelParallel on gloo, data through
    get_dataset_shard from the store."""
    out = tmp_path / "metrics.json"
    r = subprocess.run([PY, "-P", os.path.join(ROOT, "examples", "train_dlrm_ray.py"), "--rows", "20000", "--steps",
                        "8", "--batch-size", "256", "--table-rows", "2000", "--store", str(tmp_path / "store"),
                        "--json", str(out)], capture_output=True, text=True, timeout=600, env=_env(), cwd=str(tmp_path))
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    m = json.loads(out.read_text())
    assert m["steps"] == 8
    assert 0.0 <= m["auc"] <= 1.0 and m["eval_samples"] > 0
    assert np.isfinite(m["loss_first"]) and np.isfinite(m["loss_last"])
    assert "held-out AUC" in r.stdout
