"""Ray Data ingestion benchmark: recflash's datasource vs ray.data.read_parquet on the same rows.

    python benchmarks/ray_ingest.py [--quick] --json OUT [--plot OUT.png] [--rows N] [--dir DIR]
        [--epochs E] [--batch-size B] [--keep]

1. A synthetic Criteo-like store (``recflash import synthetic --preset criteo-kaggle``: label,
   I1..I13, C1..C26 — 39 features plus the label; ~14 % of the fields empty, as in Kaggle's
   data) of N rows (default 2 M; --quick 60 k). Parquet datasets are written from the store's
   rows (the same values; row position = key, so Parquet carries no key column), one file
   per 1/8 of the rows: Parquet's default compression (snappy) and uncompressed.
2. Samples/s into TorchRec ``Batch`` through Ray Data, for a model reading 8 of the 39
   features (I1..I4, C1..C4, plus the label) and for all 39 (plus the label):
   ``read_store(...).select_columns(cols)`` vs ``ray.data.read_parquet(dir, columns=cols)``,
   both ``iter_torch_batches(batch_size=B, collate_fn=TorchRecCollate(pre))`` (the same
   collate, the same Batch). The store reads with O_DIRECT, so every epoch comes from the
   device; the Parquet files are evicted from the page cache before each epoch
   (posix_fadvise DONTNEED on our files only) for the headline "cold" figure, and read again
   without eviction ("warm", files in DRAM) for reference. Epochs alternate between the
   systems; the median epoch counts. ``read_store`` makes one Ray block per read task; Ray's
   default for Parquet cuts each file into ~1 MiB blocks, so a second cold Parquet figure
   with ``override_num_blocks`` = one block per file is reported for reference (the targets
   compare against ``read_parquet``'s defaults).
3. Update 5 % of one feature (C1, random keys, new ids): recflash through the import path
   (``run_import(ParquetSource(update file, key="key"), upsert=True)`` = ``recflash import
   parquet --upsert``: open, put, flush + merger, close, durable), vs Parquet, whose files are
   immutable: read every file, replace the column values, write every file again (fsync) and
   swap the directory. Three rounds, each a different 5 % of the keys, the sides alternating,
   each side timed after os.sync() and a 1 s pause; the median round of each side counts.
   Then one more epoch of the 8-feature read on each (the store now has C1's updated items
   in new pages overlapping its old ones).
4. On-disk bytes per item (an item = one non-null feature value of one row): the store
   directory (page file blocks allocated + RocksDB metadata + WAL + checkpoint) vs the
   Parquet datasets (default compression and uncompressed).

Targets (never loosened): samples/s reading 8 of 39 features >= 1.0 x Parquet's (cold);
the 5 % update >= 10 x faster than rewriting Parquet; store bytes per item <= 2 x
uncompressed Parquet's. The device is measured in the same run (benchmarks/device.py).
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

HERE = os.path.dirname(os.path.abspath(__file__))
if HERE not in sys.path:
    sys.path.insert(0, HERE)

from harness import make_log, remove_workdir, write_report  # noqa: E402

TARGET_READ_RATIO = 1.0       # recflash / Parquet samples/s, 8 of 39 features
TARGET_UPDATE_SPEEDUP = 10.0  # Parquet rewrite time / recflash update time
TARGET_BYTES_RATIO = 2.0      # store bytes per item / uncompressed Parquet bytes per item
# The performance round's bars (each measured in the same run as its reference).
TARGET_READ_RATIO_8 = 2.0        # 8 of 39 features, recflash / Parquet (cold)
TARGET_READ_RATIO_ALL = 1.5      # all 39
TARGET_UPDATE_SPEEDUP_2 = 20.0   # the 5 % update vs the Parquet rewrite
TARGET_PAGES_BYTES_PER_ITEM = 3.4   # pages.dat allocated bytes (st_blocks) per item
TARGET_PAGES_VS_PARQUET = 1.5       # ... / uncompressed Parquet bytes per item

LABEL = "label"
DENSE = [f"I{i}" for i in range(1, 14)]
SPARSE = [f"C{i}" for i in range(1, 27)]
SETS = {"8": (DENSE[:4], SPARSE[:4]), "39": (DENSE, SPARSE)}
UPDATE_FEATURE = "C1"
UPDATE_FRACTION = 0.05
TABLE_SIZE = 100_000
UPDATE_ROUNDS = 3      # updates per run (each a different 5 % of the keys); the median counts
UPDATE_SETTLE_S = 1.0  # pause after os.sync() before each timed side of an update round


log = make_log("ray_ingest")


def dir_bytes(path: Path) -> int:
    """Allocated bytes of every file under path (st_blocks: punched holes do not count)."""
    total = 0
    for root, _, files in os.walk(path):
        for f in files:
            try:
                total += os.stat(os.path.join(root, f)).st_blocks * 512
            except FileNotFoundError:
                pass
    return total


def file_bytes(path: Path) -> int:
    return sum(p.stat().st_size for p in path.glob("*.parquet"))


def evict(path: Path) -> None:
    """Drops our Parquet files from the page cache (not the whole machine's cache)."""
    for p in path.glob("*.parquet"):
        fd = os.open(p, os.O_RDONLY)
        try:
            os.fsync(fd)
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        finally:
            os.close(fd)


def write_parquet(table: pa.Table, out: Path, files: int, compression: str) -> float:
    t0 = time.perf_counter()
    tmp = out.with_name(out.name + ".tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    n = table.num_rows
    per = -(-n // files)
    for i in range(files):
        part = table.slice(i * per, per)
        if part.num_rows == 0:
            break
        p = tmp / f"part-{i:03d}.parquet"
        pq.write_table(part, p, compression=compression)
        fd = os.open(p, os.O_RDONLY)
        os.fsync(fd)
        os.close(fd)
    old = out.with_name(out.name + ".old")
    if out.exists():
        out.rename(old)
    tmp.rename(out)
    shutil.rmtree(old, ignore_errors=True)
    return time.perf_counter() - t0


def make_data(work: Path, rows: int, seed: int) -> dict:
    from recflash.ingest import ImportOptions, SyntheticSource, run_import
    from recflash.reader import Store

    store = work / "store"
    t0 = time.perf_counter()
    r = run_import(SyntheticSource("criteo-kaggle", rows, seed=seed), str(store), ImportOptions())
    import_s = time.perf_counter() - t0
    with Store.open(store, read_only=True) as s:
        feats = list(s.features())
        table = s.scan_many(feats)
    keys = table.column("key").to_numpy()
    if not np.array_equal(keys, np.arange(rows, dtype=np.uint64)):
        raise SystemExit("unexpected keys: the synthetic import should number rows 0..N-1")
    data = table.drop_columns(["key"])
    items = int(sum(len(c) - c.null_count for c in data.columns))
    files = 8
    pq_default = work / "parquet_snappy"
    pq_plain = work / "parquet_none"
    t_def = write_parquet(data, pq_default, files, "snappy")
    t_plain = write_parquet(data, pq_plain, files, "none")
    log(f"{rows:,} rows, {items:,} items; import {import_s:.1f} s; Parquet written in {t_def:.1f} s (snappy), "
        f"{t_plain:.1f} s (uncompressed)")
    return {"rows": rows, "features": len(feats) - 1, "columns_with_label": len(feats), "items": items,
            "import_seconds": import_s, "import_items": r.items, "parquet_files": files,
            "parquet_write_seconds": {"snappy": t_def, "none": t_plain},
            "paths": {"store": str(store), "parquet": str(pq_default), "parquet_none": str(pq_plain)}}


def _preprocessor(dense, sparse):
    from recflash.ingest import Preprocessor

    return Preprocessor(dense=dense, sparse=sparse, label=LABEL, table_sizes=TABLE_SIZE)


def epoch(kind: str, paths: dict, cols: list, pre, batch_size: int, rows_per_task: int) -> dict:
    """One pass over the data into Batches; returns seconds, samples, samples/s."""
    import ray.data

    from recflash.ingest.ray import TorchRecCollate, read_store

    if kind in ("parquet_cold", "parquet_cold_file_blocks"):
        evict(Path(paths["parquet"]))
    t0 = time.perf_counter()
    if kind == "recflash":
        ds = read_store(paths["store"], features=cols, rows_per_task=rows_per_task).select_columns(cols)
    elif kind == "parquet_cold_file_blocks":
        # Reference only: Parquet with one block per file, as read_store has one per task.
        files = len(list(Path(paths["parquet"]).glob("*.parquet")))
        ds = ray.data.read_parquet(paths["parquet"], columns=cols, override_num_blocks=files)
    else:
        ds = ray.data.read_parquet(paths["parquet"], columns=cols)
    n = 0
    checksum = 0.0
    for b in ds.iter_torch_batches(batch_size=batch_size, collate_fn=TorchRecCollate(pre)):
        n += int(b.labels.shape[0])
        checksum += float(b.labels.sum())
    dt = time.perf_counter() - t0
    return {"seconds": dt, "samples": n, "samples_per_s": n / dt, "label_sum": checksum}


def bench_reads(paths: dict, epochs: int, batch_size: int, rows: int, rows_per_task: int) -> dict:
    out = {}
    for name, (dense, sparse) in SETS.items():
        cols = [LABEL] + dense + sparse
        pre = _preprocessor(dense, sparse)
        runs = {"recflash": [], "parquet_cold": [], "parquet_warm": [], "parquet_cold_file_blocks": []}
        epoch("recflash", paths, cols, pre, batch_size, rows_per_task)  # warm-up: worker processes, imports
        epoch("parquet_warm", paths, cols, pre, batch_size, rows_per_task)
        for e in range(epochs):
            order = (["recflash", "parquet_cold", "parquet_warm"] if e % 2 == 0 else
                     ["parquet_cold", "recflash", "parquet_warm"]) + ["parquet_cold_file_blocks"]
            for kind in order:
                r = epoch(kind, paths, cols, pre, batch_size, rows_per_task)
                if r["samples"] != rows:
                    raise SystemExit(f"{kind} read {r['samples']} samples, expected {rows}")
                runs[kind].append(r)
        sums = {k: v[0]["label_sum"] for k, v in runs.items()}
        if len(set(sums.values())) != 1:
            raise SystemExit(f"the systems read different labels: {sums}")
        res = {"columns": cols}
        for kind, rs in runs.items():
            sps = [r["samples_per_s"] for r in rs]
            res[kind] = {"samples_per_s": statistics.median(sps), "epochs_samples_per_s": sps,
                         "epoch_seconds": statistics.median([r["seconds"] for r in rs])}
        res["ratio_vs_parquet_cold"] = res["recflash"]["samples_per_s"] / res["parquet_cold"]["samples_per_s"]
        res["ratio_vs_parquet_warm"] = res["recflash"]["samples_per_s"] / res["parquet_warm"]["samples_per_s"]
        res["ratio_vs_parquet_cold_file_blocks"] = (res["recflash"]["samples_per_s"]
                                                    / res["parquet_cold_file_blocks"]["samples_per_s"])
        log(f"{name} of 39 features: recflash {res['recflash']['samples_per_s']:,.0f} samples/s, Parquet cold "
            f"{res['parquet_cold']['samples_per_s']:,.0f} ({res['ratio_vs_parquet_cold']:.2f}x), warm "
            f"{res['parquet_warm']['samples_per_s']:,.0f} ({res['ratio_vs_parquet_warm']:.2f}x); reference: Parquet "
            f"cold with one block per file {res['parquet_cold_file_blocks']['samples_per_s']:,.0f} "
            f"({res['ratio_vs_parquet_cold_file_blocks']:.2f}x)")
        out[name] = res
    return out


def _settle() -> None:
    """Before each timed side of the update: the writeback of earlier phases (the Parquet
    datasets, the other side's last round) and the Ray workers' tail of the last epoch must not
    land in either side's timed section. Both sides get the same barrier."""
    os.sync()
    time.sleep(UPDATE_SETTLE_S)


def bench_update(work: Path, paths: dict, rows: int, seed: int, batch_size: int, rows_per_task: int,
                 rounds: int = UPDATE_ROUNDS) -> dict:
    """`rounds` updates, each of a different 5 % of C1's keys, alternating the two sides; each
    side's median round counts (both sides are single runs of tens of ms to seconds on a shared
    machine, so one round alone measured the machine as much as the code)."""
    from recflash.ingest import ImportOptions, ParquetSource, run_import
    from recflash.reader import Store

    n_upd = int(rows * UPDATE_FRACTION)
    expected: dict[int, int] = {}
    store_before = dir_bytes(Path(paths["store"]))
    ours, theirs, imp, patch, write, growth = [], [], [], [], [], []
    for rnd in range(rounds):
        rng = np.random.default_rng(seed + 5 + rnd)
        keys = np.sort(rng.choice(rows, size=n_upd, replace=False)).astype(np.uint64)
        vals = rng.integers(0, 1 << 31, size=n_upd, dtype=np.int64)
        expected.update(zip(keys.tolist(), vals.tolist()))
        upd_file = work / f"update-{rnd}.parquet"
        pq.write_table(pa.table({"key": pa.array(keys, pa.uint64()), UPDATE_FEATURE: pa.array(vals, pa.int64())}),
                       upd_file)

        # recflash: the import path with --upsert (open, put, flush + merger, close; durable)
        _settle()
        b0 = dir_bytes(Path(paths["store"]))
        t0 = time.perf_counter()
        r = run_import(ParquetSource([str(upd_file)], key="key"), paths["store"], ImportOptions(upsert=True))
        ours.append(time.perf_counter() - t0)
        imp.append(r.seconds)
        growth.append(dir_bytes(Path(paths["store"])) - b0)

        # Parquet: files are immutable; every file holds updated rows -> read all, patch, write all.
        _settle()
        t0 = time.perf_counter()
        table = pq.read_table(paths["parquet"])
        col = table.column(UPDATE_FEATURE).combine_chunks()
        np_vals = col.to_numpy(zero_copy_only=False).astype(np.float64)  # nulls -> NaN
        valid = np.asarray(col.is_valid())
        np_vals[keys.astype(np.int64)] = vals
        valid[keys.astype(np.int64)] = True
        new_col = pa.array(np.nan_to_num(np_vals).astype(np.int64), mask=~valid)
        table = table.set_column(table.schema.get_field_index(UPDATE_FEATURE), UPDATE_FEATURE, new_col)
        patch.append(time.perf_counter() - t0)
        files = len(list(Path(paths["parquet"]).glob("*.parquet")))
        write.append(write_parquet(table, Path(paths["parquet"]), files, "snappy"))
        theirs.append(time.perf_counter() - t0)
        del table, col, np_vals, valid, new_col
        log(f"round {rnd + 1}/{rounds}: recflash upsert of {n_upd:,} {UPDATE_FEATURE} items {ours[-1]:.3f} s "
            f"({r.items:,} items); Parquet rewrite {theirs[-1]:.2f} s (read + patch {patch[-1]:.2f} s, "
            f"write {write[-1]:.2f} s)")

    # Both now hold the same values for the updated feature: each key the last round's value.
    all_keys = np.array(sorted(expected), np.uint64)
    want = np.array([expected[k] for k in all_keys.tolist()], np.int64)
    with Store.open(paths["store"], read_only=True) as s:
        got = s.get(UPDATE_FEATURE, all_keys).to_numpy(zero_copy_only=False)
        stats = s.stats()
    if not np.array_equal(got.astype(np.int64), want):
        raise SystemExit("the store does not hold the updated values")
    pcol = pq.read_table(paths["parquet"], columns=[UPDATE_FEATURE]).column(0).to_numpy(zero_copy_only=False)
    if not np.array_equal(pcol[all_keys.astype(np.int64)].astype(np.int64), want):
        raise SystemExit("the Parquet dataset does not hold the updated values")
    med = statistics.median
    speedup = med(theirs) / med(ours)
    log(f"update, median of {rounds} rounds: recflash {med(ours):.3f} s, Parquet rewrite {med(theirs):.2f} s "
        f"({speedup:.1f}x)")

    dense, sparse = SETS["8"]
    cols = [LABEL] + dense + sparse
    pre = _preprocessor(dense, sparse)
    nxt = {k: epoch(k, paths, cols, pre, batch_size, rows_per_task) for k in ("recflash", "parquet_cold")}
    log(f"next epoch (8 features): recflash {nxt['recflash']['seconds']:.2f} s, Parquet {nxt['parquet_cold']['seconds']:.2f} s")
    frag = stats.get("fragmentation", {}).get(UPDATE_FEATURE)
    return {"feature": UPDATE_FEATURE, "fraction": UPDATE_FRACTION, "items": n_upd, "rounds": rounds,
            "timing": f"median of {rounds} rounds, each a different {UPDATE_FRACTION:.0%} of the keys, the sides "
                      "alternating; before each side os.sync() and a "
                      f"{UPDATE_SETTLE_S:g} s pause (the same barrier for both)",
            "recflash_upsert_seconds": med(ours), "recflash_import_result_seconds": med(imp),
            "parquet_rewrite_seconds": med(theirs), "parquet_read_patch_seconds": med(patch),
            "parquet_write_seconds": med(write), "speedup": speedup,
            "recflash_upsert_seconds_rounds": ours, "parquet_rewrite_seconds_rounds": theirs,
            "speedup_mean_rounds": statistics.mean(theirs) / statistics.mean(ours),
            "store_bytes_growth": dir_bytes(Path(paths["store"])) - store_before,
            "store_bytes_growth_rounds": growth, "distinct_keys_updated": len(expected),
            "fragmentation_after": frag,
            "next_epoch": {"recflash_seconds": nxt["recflash"]["seconds"],
                           "recflash_samples_per_s": nxt["recflash"]["samples_per_s"],
                           "parquet_seconds": nxt["parquet_cold"]["seconds"],
                           "parquet_samples_per_s": nxt["parquet_cold"]["samples_per_s"]}}


def performance_targets(res: dict) -> dict:
    """The performance round's bars on this run's figures (the round-1 bars stay as they were)."""
    r8 = res["read"]["8"]["ratio_vs_parquet_cold"]
    rall = res["read"]["39"]["ratio_vs_parquet_cold"]
    up = res["update"]["speedup"]
    d = res["disk"]
    pages_bpi = d["store_pages_bytes_per_item"]
    pages_ratio = pages_bpi / d["parquet_none_bytes_per_item"]
    return {
        "read_8_of_39_vs_parquet_2x": {"target": TARGET_READ_RATIO_8, "measured": r8, "met": r8 >= TARGET_READ_RATIO_8},
        "read_all_39_vs_parquet": {"target": TARGET_READ_RATIO_ALL, "measured": rall, "met": rall >= TARGET_READ_RATIO_ALL},
        "update_5pct_speedup_20x": {"target": TARGET_UPDATE_SPEEDUP_2, "measured": up, "met": up >= TARGET_UPDATE_SPEEDUP_2},
        "pages_allocated_bytes_per_item": {"target": TARGET_PAGES_BYTES_PER_ITEM, "measured": pages_bpi,
                                           "met": pages_bpi <= TARGET_PAGES_BYTES_PER_ITEM,
                                           "note": "pages.dat st_blocks * 512 / items (<= target)"},
        "pages_allocated_vs_uncompressed_parquet": {"target": TARGET_PAGES_VS_PARQUET, "measured": pages_ratio,
                                                    "met": pages_ratio <= TARGET_PAGES_VS_PARQUET},
    }


def disk_usage(paths: dict, items: int) -> dict:
    store = Path(paths["store"])
    parts = {"pages": os.stat(store / "pages.dat").st_blocks * 512,
             "meta": dir_bytes(store / "meta"), "wal": dir_bytes(store / "wal")}
    total = dir_bytes(store)
    pd_ = file_bytes(Path(paths["parquet"]))
    pn = file_bytes(Path(paths["parquet_none"]))
    res = {"items": items, "store_bytes": total, "store_parts": parts, "store_bytes_per_item": total / items,
           "store_pages_bytes_per_item": parts["pages"] / items,
           "parquet_snappy_bytes": pd_, "parquet_snappy_bytes_per_item": pd_ / items,
           "parquet_none_bytes": pn, "parquet_none_bytes_per_item": pn / items}
    res["ratio_vs_parquet_none"] = res["store_bytes_per_item"] / res["parquet_none_bytes_per_item"]
    res["ratio_vs_parquet_snappy"] = res["store_bytes_per_item"] / res["parquet_snappy_bytes_per_item"]
    log(f"bytes per item: store {res['store_bytes_per_item']:.2f} (pages {res['store_pages_bytes_per_item']:.2f}), "
        f"Parquet uncompressed {res['parquet_none_bytes_per_item']:.2f}, snappy {res['parquet_snappy_bytes_per_item']:.2f}")
    return res


def plot(path: Path, res: dict) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 3, figsize=(16, 4.6))
    ax = axes[0]
    kinds = [("recflash", "recflash", "tab:blue"), ("parquet_cold", "Parquet (cold)", "tab:orange"),
             ("parquet_warm", "Parquet (page cache)", "tab:gray"),
             ("parquet_cold_file_blocks", "Parquet (cold, one block per file)", "tab:brown")]
    kinds = [k for k in kinds if all(k[0] in res["read"][s] for s in res["read"])]
    x = np.arange(len(res["read"]))
    w = 0.8 / len(kinds)
    for i, (k, label, color) in enumerate(kinds):
        ax.bar(x + (i - (len(kinds) - 1) / 2) * w, [res["read"][s][k]["samples_per_s"] / 1e3 for s in res["read"]], w, label=label,
               color=color)
    ax.set_xticks(x, [f"{s} of 39 features" for s in res["read"]])
    ax.set_ylabel("k samples/s into TorchRec Batch")
    r8 = res["read"]["8"]["ratio_vs_parquet_cold"]
    ax.set_title(f"Ray Data read: recflash {r8:.2f}x Parquet (8 of 39, target >= {TARGET_READ_RATIO:.1f}x)", fontsize=9)
    ax.legend(fontsize=8)
    ax = axes[1]
    u = res["update"]
    labels = ["recflash\nimport --upsert", "Parquet\nrewrite", "recflash\nnext epoch", "Parquet\nnext epoch"]
    vals = [u["recflash_upsert_seconds"], u["parquet_rewrite_seconds"], u["next_epoch"]["recflash_seconds"],
            u["next_epoch"]["parquet_seconds"]]
    ax.bar(labels, vals, color=["tab:blue", "tab:orange", "tab:blue", "tab:orange"])
    ax.set_ylabel("seconds")
    ax.set_title(f"update {u['fraction'] * 100:.0f} % of {u['feature']} ({u['items']:,} items), median of "
                 f"{u.get('rounds', 1)} rounds: {u['speedup']:.1f}x faster (target >= {TARGET_UPDATE_SPEEDUP_2:.0f}x)",
                 fontsize=9)
    ax = axes[2]
    d = res["disk"]
    ax.bar(["recflash store", "Parquet\nuncompressed", "Parquet\nsnappy"],
           [d["store_bytes_per_item"], d["parquet_none_bytes_per_item"], d["parquet_snappy_bytes_per_item"]],
           color=["tab:blue", "tab:orange", "tab:gray"])
    ax.set_ylabel("on-disk bytes per item")
    ax.set_title(f"space: store {d['ratio_vs_parquet_none']:.2f}x uncompressed Parquet "
                 f"(target <= {TARGET_BYTES_RATIO:.0f}x)", fontsize=9)
    fig.suptitle(f"recflash Ray Data ingestion ({'quick' if res['quick'] else 'full'}, {res['data']['rows']:,} rows, "
                 f"{os.cpu_count()} cores, batch {res['batch_size']})", fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true", help="60 k rows, one epoch each, short device probe")
    ap.add_argument("--json", required=True, help="write the results here")
    ap.add_argument("--plot", help="write a PNG here (default: next to --json, .png)")
    ap.add_argument("--rows", type=int, help="rows (default 2,000,000; --quick 60,000)")
    ap.add_argument("--epochs", type=int, help="timed epochs per system and feature set (default 3; --quick 1)")
    ap.add_argument("--batch-size", type=int, default=8192)
    ap.add_argument("--rows-per-task", type=int, help="store read task size (default rows / 8)")
    ap.add_argument("--dir", help="work directory (default /tmp/ray-ingest-bench/run-PID); removed afterwards")
    ap.add_argument("--keep", action="store_true")
    ap.add_argument("--no-device", action="store_true", help="skip the fio device probe")
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args()
    rows = args.rows or (60_000 if args.quick else 2_000_000)
    epochs = args.epochs or (1 if args.quick else 3)
    rows_per_task = args.rows_per_task or max(4096, -(-rows // 8))

    work = Path(args.dir) if args.dir else Path(tempfile.gettempdir()) / "ray-ingest-bench" / f"run-{os.getpid()}"
    if work.exists() and any(work.iterdir()):
        raise SystemExit(f"{work} exists and is not empty")
    work.mkdir(parents=True, exist_ok=True)
    t_start = time.perf_counter()
    res: dict = {"quick": args.quick, "batch_size": args.batch_size, "rows_per_task": rows_per_task, "epochs": epochs,
                 "machine": {"cpus": os.cpu_count(), "platform": platform.platform(),
                             "loadavg_at_start": os.getloadavg()}}
    import ray

    try:
        if not args.no_device:
            from device import measure_device

            res["device"] = measure_device(str(work), quick=args.quick)
            log(f"device: sequential read {res['device'].get('seq_read_MBps', 0):,.0f} MB/s")
        res["data"] = make_data(work, rows, args.seed)
        paths = res["data"]["paths"]
        ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False, configure_logging=True,
                 logging_level="WARNING")
        ray.data.DataContext.get_current().enable_progress_bars = False
        res["disk"] = disk_usage(paths, res["data"]["items"])
        res["read"] = bench_reads(paths, epochs, args.batch_size, rows, rows_per_task)
        res["update"] = bench_update(work, paths, rows, args.seed, args.batch_size, rows_per_task,
                                     rounds=2 if args.quick else UPDATE_ROUNDS)
        res["disk_after_update"] = disk_usage(paths, res["data"]["items"])
        res["machine"]["loadavg_at_end"] = os.getloadavg()
        r8 = res["read"]["8"]["ratio_vs_parquet_cold"]
        res["targets"] = {
            "read_8_of_39_vs_parquet": {"target": TARGET_READ_RATIO, "measured": r8, "met": r8 >= TARGET_READ_RATIO,
                                        "note": "recflash samples/s / Parquet samples/s (cold), into TorchRec Batch"},
            "update_5pct_speedup": {"target": TARGET_UPDATE_SPEEDUP, "measured": res["update"]["speedup"],
                                    "met": res["update"]["speedup"] >= TARGET_UPDATE_SPEEDUP,
                                    "note": "Parquet rewrite seconds / recflash import --upsert seconds"},
            "bytes_per_item_vs_uncompressed_parquet": {
                "target": TARGET_BYTES_RATIO, "measured": res["disk"]["ratio_vs_parquet_none"],
                "met": res["disk"]["ratio_vs_parquet_none"] <= TARGET_BYTES_RATIO,
                "note": "store directory bytes per item / uncompressed Parquet bytes per item (<= target)"},
        }
        res["targets"].update(performance_targets(res))
        res["seconds"] = time.perf_counter() - t_start

        write_report(res, args.json, args.plot, plot, log)
        return 0
    finally:
        if ray.is_initialized():
            ray.shutdown()
        if not args.keep:
            remove_workdir(work, parent_too=not args.dir)


if __name__ == "__main__":
    sys.exit(main())
