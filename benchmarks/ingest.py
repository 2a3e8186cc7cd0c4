"""Ingest benchmark: `recflash import criteo` throughput and memory, and preprocessing into
TorchRec batches.

    python benchmarks/ingest.py [--quick] --json OUT [--plot OUT.png] [--dir DIR] [--keep]
        [--tsv-gb G] [--write-buffer-mb M] [--block-mb B]

1. Generates a Criteo-like TSV (Kaggle layout, Kaggle missing rates and cardinalities, Zipf
   ids; recflash.ingest.synthetic): >= 2 GB in full mode (--tsv-gb, default 2.1), ~36 MB with
   --quick. Under --dir (default /tmp/ingest-bench/run-PID), deleted afterwards unless --keep.
2. Imports it with the CLI in a child process (`recflash import criteo FILE --store DIR`) and
   measures wall time, MB/s of TSV, rows/s and the child's peak RSS (its VmHWM); samples
   its RSS and the journal's row count over time for the plot.
3. Verifies the store: every feature's item count equals the file's non-empty fields
   (generator truth), and the values of sampled chunks (all rows with --quick) equal the
   generator's.
4. Profile split, in this process: the reader alone (read + parse + convert, no store) on the
   first 256 MiB, and the store alone (put + sync + close of already converted chunks, the
   same 40 features, bulk-load mode as the importer uses) on 300 k rows; wall and CPU time.
   CPU seconds of the import itself come from wait4: with other processes loading this
   shared machine, MB per CPU second is the figure that does not depend on them.
5. Preprocessing: `Preprocessor.criteo(table_sizes=...)` on tables of the store
   (`scan_joined`, equal to `Store.scan_many`), samples/s into `Batch` for batch sizes
   4096..65536; end to end (`Preprocessor.batches`: scans + join + batches); and
   `Store.scan_many` vs `scan_joined` for one window of 262144 keys.

Targets (issue 4), never loosened: import >= 100 MB/s of TSV on this 2-core machine, peak RSS
<= 2 GiB regardless of input size, preprocessing >= 1 M samples/s for the 39 Criteo features
(batch size 8192). And the import against its peer, pyarrow's streaming CSV reader writing
Parquet (``pyarrow_csv_to_parquet``) on the same file in the same run: >= 3 x. The JSON says which are met; the figures are what this machine measured.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

BENCH_DIR = os.path.dirname(os.path.abspath(__file__))
if BENCH_DIR not in sys.path:  # benchmarks/harness.py, also under python -P
    sys.path.insert(0, BENCH_DIR)

import numpy as np

from harness import make_log, remove_workdir, write_report

TARGET_IMPORT_MB_S = 100.0
TARGET_PEAK_RSS_MB = 2048.0
TARGET_PREPROCESS_SAMPLES_S = 1_000_000.0
# The performance round: the import against its peer on the same file in the same run.
TARGET_IMPORT_VS_PYARROW = 3.0  # recflash import MB/s / pyarrow streaming CSV -> Parquet MB/s
MiB = 1 << 20


log = make_log("ingest-bench")


def recflash_exe() -> str:
    exe = Path(sys.executable).with_name("recflash")
    if not exe.exists():
        raise SystemExit(f"{exe} not found: run with the venv's python (.venv/bin/python benchmarks/ingest.py)")
    return str(exe)


# ---------------------------------------------------------------------------------------------
# 1. data


def generate(path: Path, target_bytes: int, seed: int) -> dict:
    from recflash.ingest import synthetic

    sample = path.with_suffix(".sample")
    per_row = synthetic.write_criteo_tsv(sample, 20_000, seed=seed + 1) / 20_000
    sample.unlink()
    rows = int(target_bytes / per_row) + 1
    t0 = time.perf_counter()
    size = synthetic.write_criteo_tsv(path, rows, seed=seed)
    while size < target_bytes:  # the estimate fell short: a few more rows
        rows += int((target_bytes - size) / per_row) + 1000
        size = synthetic.write_criteo_tsv(path, rows, seed=seed)
    return {"rows": rows, "bytes": size, "seconds": time.perf_counter() - t0}


# ---------------------------------------------------------------------------------------------
# 2. import in a child process


def _rss_mb(pid: int) -> tuple[float | None, float | None]:
    """(VmRSS, VmHWM) of pid in MiB, None where /proc does not say."""
    got: dict[str, float] = {}
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                if line.startswith(("VmRSS:", "VmHWM:")):
                    got[line[:5]] = int(line.split()[1]) / 1024
    except OSError:
        pass
    return got.get("VmRSS"), got.get("VmHWM")


def _journal_rows(store: Path) -> int:
    d = store / "imports"
    try:
        for p in d.iterdir():
            if p.suffix == ".json":
                return int(json.loads(p.read_text()).get("rows", 0))
    except (OSError, ValueError):
        pass
    return 0


def run_import(tsv: Path, store: Path, summary: Path, write_buffer_mb: float, block_mb: float) -> dict:
    cmd = [recflash_exe(), "import", "criteo", str(tsv), "--store", str(store), "-q",
           "--write-buffer-mb", str(write_buffer_mb), "--block-mb", str(block_mb), "--summary-json", str(summary)]
    log("$ " + " ".join(cmd))
    t0 = time.perf_counter()
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd="/tmp")
    timeline: list[tuple[float, float, int]] = []
    stop = threading.Event()

    # The import's peak RSS: its high-water mark (VmHWM) as last sampled. wait4's ru_maxrss
    # also counts the moment between fork and exec, when the child still shares this process's
    # memory (the generated data, ~1 GB): it reported 984 MiB for an import whose own peak was
    # 316 MiB. Both are kept.
    hwm = [0.0]

    def sample() -> None:
        while not stop.is_set():
            r, h = _rss_mb(proc.pid)
            if h is not None:
                hwm[0] = max(hwm[0], h)
            if r is not None:
                timeline.append((time.perf_counter() - t0, r, _journal_rows(store)))
            stop.wait(0.25)

    th = threading.Thread(target=sample, daemon=True)
    th.start()
    load_start = os.getloadavg()
    _, status, usage = os.wait4(proc.pid, 0)
    wall = time.perf_counter() - t0
    load_end = os.getloadavg()
    stop.set()
    th.join()
    proc.returncode = os.waitstatus_to_exitcode(status)
    out, err = proc.stdout.read(), proc.stderr.read()
    if proc.returncode != 0:
        raise SystemExit(f"import failed (exit {proc.returncode}):\n{out}\n{err}")
    log(out.strip())
    s = json.loads(summary.read_text())
    return {"command": " ".join(cmd), "wall_seconds": wall,
            "peak_rss_mb": hwm[0] or usage.ru_maxrss / 1024, "wait4_maxrss_mb": usage.ru_maxrss / 1024,
            "cpu_seconds": usage.ru_utime + usage.ru_stime, "loadavg": [load_start[0], load_end[0]],
            "summary": s, "timeline": timeline, "stdout": out.strip()}


def _rates(timeline: list, windows: int = 10) -> list:
    """[(start s, end s, rows/s committed)] over ~equal time windows: shows whether the import
    slows down as the store grows."""
    pts = [(t, rows) for t, _, rows in timeline if rows > 0]
    if len(pts) < 2:
        return []
    t_end = pts[-1][0]
    out = []
    for w in range(windows):
        a, b = t_end * w / windows, t_end * (w + 1) / windows
        seg = [p for p in pts if a <= p[0] <= b]
        if len(seg) >= 2 and seg[-1][0] > seg[0][0]:
            out.append((round(a, 1), round(b, 1), round((seg[-1][1] - seg[0][1]) / (seg[-1][0] - seg[0][0]))))
    return out


# ---------------------------------------------------------------------------------------------
# 3. verification


def verify(store: Path, rows: int, seed: int, full: bool) -> dict:
    from recflash.ingest import criteo, synthetic
    from recflash.reader import Store

    chunk = synthetic.DEFAULT_CHUNK_ROWS
    n_chunks = (rows + chunk - 1) // chunk
    counts = {n: 0 for n in criteo.FEATURE_NAMES}
    checked_rows = 0
    pick = set(range(n_chunks)) if full else {0, n_chunks // 2, n_chunks - 1}
    t0 = time.perf_counter()
    with Store.open(str(store)) as s:
        stats = s.stats()
        for first, t in synthetic.chunks("criteo-kaggle", rows, seed=seed):
            for n in criteo.FEATURE_NAMES:
                counts[n] += len(t) - t.column(n).null_count
            if first // chunk in pick:
                got = s.scan_many(criteo.FEATURE_NAMES, key_range=(first, first + len(t)))
                if got.num_rows != len(t):
                    return {"verified": False, "reason": f"rows {first}..: {got.num_rows} != {len(t)}"}
                for n in criteo.FEATURE_NAMES:
                    if not got.column(n).equals(t.column(n).cast(got.schema.field(n).type)):
                        return {"verified": False, "reason": f"feature {n} differs in rows {first}.."}
                checked_rows += len(t)
        per = stats.get("features") or {}
        for n in criteo.FEATURE_NAMES:
            if int(per[n]["items"]) != counts[n]:
                return {"verified": False, "reason": f"feature {n}: {per[n]['items']} items, expected {counts[n]}"}
    return {"verified": True, "rows_value_checked": checked_rows, "items": int(sum(counts.values())),
            "verify_seconds": time.perf_counter() - t0,
            "store": {k: stats.get(k) for k in ("live_items", "pages_in_use", "file_bytes", "space_amplification",
                                                  "write_amplification", "metadata_dram_bytes",
                                                  "metadata_dram_bytes_per_item", "disk_bytes_per_item",
                                                  "flushes")}}


# ---------------------------------------------------------------------------------------------
# 4. profile split


def profile_reader(tsv: Path, limit_bytes: int, block_mb: float) -> dict:
    from recflash.ingest.sources import CriteoSource

    src = CriteoSource([str(tsv)], block_bytes=int(block_mb * MiB))
    src.prepare()
    t0, c0 = time.perf_counter(), _cpu()
    rows = nbytes = 0
    for ch in src.chunks(None):
        rows += ch.n_rows
        nbytes += ch.input_bytes
        if nbytes >= limit_bytes:
            break
    dt, cpu = time.perf_counter() - t0, _cpu() - c0
    return {"rows": rows, "bytes": nbytes, "seconds": dt, "mb_per_s": nbytes / 1e6 / dt, "rows_per_s": rows / dt,
            "cpu_seconds": cpu, "mb_per_cpu_s": nbytes / 1e6 / cpu}


def pyarrow_csv_to_parquet(tsv: Path, out: Path, block_mb: float) -> dict:
    """The peer: pyarrow's streaming CSV reader (tab-separated, Criteo's 40 columns typed as
    their content: label and I1..I13 int64, C1..C26 strings) into one Parquet file by
    ParquetWriter with its defaults, fsynced — the usual way to land a TSV as a columnar dataset."""
    import pyarrow as pa
    import pyarrow.csv as pcsv
    import pyarrow.parquet as pq

    names = ["label"] + [f"I{i}" for i in range(1, 14)] + [f"C{i}" for i in range(1, 27)]
    types = {n: (pa.int64() if n[0] in "lI" else pa.string()) for n in names}
    t0, c0 = time.perf_counter(), _cpu()
    reader = pcsv.open_csv(str(tsv), read_options=pcsv.ReadOptions(column_names=names, block_size=int(block_mb * MiB)),
                           parse_options=pcsv.ParseOptions(delimiter="\t"),
                           convert_options=pcsv.ConvertOptions(column_types=types))
    rows = 0
    with pq.ParquetWriter(str(out), reader.schema) as w:
        for batch in reader:
            w.write_batch(batch)
            rows += batch.num_rows
    fd = os.open(str(out), os.O_RDONLY)
    os.fsync(fd)
    os.close(fd)
    dt, cpu = time.perf_counter() - t0, _cpu() - c0
    nbytes = tsv.stat().st_size
    res = {"rows": rows, "bytes": nbytes, "seconds": dt, "mb_per_s": nbytes / 1e6 / dt, "cpu_seconds": cpu,
           "mb_per_cpu_s": nbytes / 1e6 / cpu, "parquet_bytes": out.stat().st_size}
    out.unlink()
    return res


def _cpu() -> float:
    """CPU seconds of this process, all threads (pyarrow's parse threads included)."""
    t = os.times()
    return t.user + t.system


def profile_store(tsv: Path, workdir: Path, rows_wanted: int, write_buffer_mb: float, block_mb: float) -> dict:
    from recflash.ingest.importer import ImportOptions, _chunk_puts, _open_store, _write_chunk
    from recflash.ingest.sources import CriteoSource

    src = CriteoSource([str(tsv)], block_bytes=int(block_mb * MiB))
    schema = src.prepare()
    chunks, rows, nbytes = [], 0, 0
    for ch in src.chunks(None):
        if ch.n_rows == 0:
            continue
        chunks.append(ch)
        rows += ch.n_rows
        nbytes += ch.input_bytes
        if rows >= rows_wanted:
            break
    path = workdir / "store-only"
    shutil.rmtree(path, ignore_errors=True)
    t0, c0 = time.perf_counter(), _cpu()
    # the importer's own store options (bulk load, compact pages) and one sync per write buffer
    s = _open_store(str(path), ImportOptions(write_buffer_mb=write_buffer_mb))
    for n, t in schema.items():
        s.create_feature(n, t)
    key = items = 0
    t_put = 0.0
    since_sync = 0
    for ch in chunks:
        a = time.perf_counter()
        n, b = _write_chunk(s, _chunk_puts(ch, key))
        items += n
        since_sync += b
        if since_sync + b >= write_buffer_mb * MiB:
            s.sync()
            since_sync = 0
        t_put += time.perf_counter() - a
        key += ch.n_rows
    a = time.perf_counter()
    s.sync()
    s.close()
    t_close = time.perf_counter() - a
    dt, cpu = time.perf_counter() - t0, _cpu() - c0
    shutil.rmtree(path, ignore_errors=True)
    return {"rows": rows, "items": items, "tsv_bytes_equivalent": nbytes, "seconds": dt, "put_sync_seconds": t_put,
            "close_seconds": t_close, "rows_per_s": rows / dt, "items_per_s": items / dt,
            "mb_per_s_equivalent": nbytes / 1e6 / dt, "cpu_seconds": cpu, "cpu_ns_per_item": cpu / items * 1e9,
            "mb_per_cpu_s_equivalent": nbytes / 1e6 / cpu}


# ---------------------------------------------------------------------------------------------
# 5. preprocessing


def bench_preprocess(store: Path, rows: int, quick: bool) -> dict:
    from recflash.ingest import Preprocessor
    from recflash.ingest.preprocess import scan_joined
    from recflash.reader import Store

    p = Preprocessor.criteo(table_sizes=[1_000_000] * 26)
    window = 1 << 18
    out: dict = {"features": len(p.dense) + len(p.sparse), "table_size": 1_000_000, "by_batch_size": {}}
    with Store.open(str(store)) as s:
        n_tables = 1 if quick else 4
        tables = []
        t0 = time.perf_counter()
        for i in range(n_tables):
            lo = i * window
            if lo >= rows:
                break
            tables.append(scan_joined(s, p.features, key_range=(lo, lo + window)))
        t_join = time.perf_counter() - t0
        join_rows = sum(t.num_rows for t in tables)
        t0 = time.perf_counter()
        ref = s.scan_many(p.features, key_range=(0, window))
        t_many = time.perf_counter() - t0
        out["scan_many_rows_per_s"] = ref.num_rows / t_many
        out["scan_joined_rows_per_s"] = join_rows / t_join
        out["scan_joined_equals_scan_many"] = bool(ref.equals(tables[0]))
        del ref
        p(tables[0].slice(0, 1024))  # warm-up: imports torch, first KJT
        reps = 2 if quick else 3
        for bs in (4096, 8192, 16384, 65536):
            n = 0
            t0 = time.perf_counter()
            for _ in range(reps):
                for t in tables:
                    for lo in range(0, t.num_rows - bs + 1, bs):
                        p(t.slice(lo, bs))
                        n += bs
            dt = time.perf_counter() - t0
            out["by_batch_size"][str(bs)] = n / dt
            log(f"preprocess batch {bs}: {n / dt:,.0f} samples/s")
        out["batch_size"] = 8192
        out["samples_per_s"] = out["by_batch_size"]["8192"]
        limit = min(rows, (1 << 18) if quick else 2_000_000)
        n = 0
        t0 = time.perf_counter()
        for b in p.batches(s, batch_size=8192, key_range=(0, limit)):
            n += b.labels.shape[0]
        dt = time.perf_counter() - t0
        out["end_to_end_samples_per_s"] = n / dt
        out["end_to_end_rows"] = n
        log(f"end to end (scan + join + Batch): {n / dt:,.0f} samples/s over {n:,} rows")
    return out


# ---------------------------------------------------------------------------------------------
# plot


def plot(path: Path, res: dict) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    imp = res["import"]
    fig, axes = plt.subplots(1, 3, figsize=(16, 4.6))
    ax = axes[0]
    tl = imp.get("timeline") or []
    if tl:
        t = [x[0] for x in tl]
        ax.plot(t, [x[1] for x in tl], color="tab:red", label="RSS (MiB)")
        ax.axhline(TARGET_PEAK_RSS_MB, color="tab:red", ls="--", lw=0.8, label="RSS target")
        ax.set_xlabel("seconds")
        ax.set_ylabel("RSS MiB")
        ax2 = ax.twinx()
        ax2.plot(t, [x[2] / 1e6 for x in tl], color="tab:blue", label="rows committed (M)")
        ax2.set_ylabel("rows committed (millions)")
        ax.legend(loc="upper left", fontsize=8)
        ax2.legend(loc="lower right", fontsize=8)
    ax.set_title(f"import {imp['tsv_bytes'] / 1e9:.2f} GB TSV: {imp['mb_per_s']:.1f} MB/s, "
                 f"peak RSS {imp['peak_rss_mb']:,.0f} MiB", fontsize=9)
    ax = axes[1]
    st = res["profile"]["store"]
    labels = ["import\n(end to end)", "reader only\n(parse+convert)",
              f"store only\n(put+sync+close,\n{st['rows'] / 1e3:,.0f} k rows, fresh store)"]
    vals = [imp["mb_per_s"], res["profile"]["reader"]["mb_per_s"], res["profile"]["store"]["mb_per_s_equivalent"]]
    per_cpu = [imp.get("mb_per_cpu_s", 0), res["profile"]["reader"].get("mb_per_cpu_s", 0),
               res["profile"]["store"].get("mb_per_cpu_s_equivalent", 0)]
    x = np.arange(len(labels))
    ax.bar(x - 0.2, vals, 0.4, color=["tab:blue", "tab:green", "tab:orange"], label="MB/s (wall)")
    ax.bar(x + 0.2, per_cpu, 0.4, color=["tab:blue", "tab:green", "tab:orange"], alpha=0.45, hatch="//",
           label="MB per CPU second")
    ax.set_xticks(x, labels)
    la = imp.get("loadavg_start_end")
    if la:
        ax.text(0.02, 0.97, f"load average {la[0]:.1f} -> {la[1]:.1f} on {os.cpu_count()} cores", transform=ax.transAxes,
                va="top", fontsize=8)
    ax.axhline(TARGET_IMPORT_MB_S, color="k", ls="--", lw=0.8, label=f"target {TARGET_IMPORT_MB_S:.0f} MB/s")
    ax.set_ylabel("MB/s of TSV")
    ax.set_title("where import time goes", fontsize=9)
    ax.legend(fontsize=8)
    ax = axes[2]
    pre = res["preprocess"]
    bs = list(pre["by_batch_size"])
    ax.bar(bs + ["end to end\n(8192)"], [pre["by_batch_size"][b] / 1e6 for b in bs]
           + [pre["end_to_end_samples_per_s"] / 1e6], color=["tab:purple"] * len(bs) + ["tab:gray"])
    ax.axhline(TARGET_PREPROCESS_SAMPLES_S / 1e6, color="k", ls="--", lw=0.8, label="target 1 M/s")
    ax.set_ylabel("M samples/s")
    ax.set_xlabel("batch size")
    ax.set_title("Preprocessor: Arrow table -> TorchRec Batch (39 features)", fontsize=9)
    ax.legend(fontsize=8)
    fig.suptitle(f"recflash ingest ({'quick' if res['quick'] else 'full'}, {os.cpu_count()} cores)", fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


# ---------------------------------------------------------------------------------------------


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true", help="~36 MB TSV, < 60 s")
    ap.add_argument("--json", required=True, help="write the results here")
    ap.add_argument("--plot", help="write a PNG here (default: next to --json, .png)")
    ap.add_argument("--dir", help="work directory (default /tmp/ingest-bench/run-PID); removed afterwards")
    ap.add_argument("--keep", action="store_true", help="keep the TSV and the store")
    ap.add_argument("--tsv-gb", type=float, default=2.1, help="TSV size in full mode (default 2.1 GB)")
    ap.add_argument("--write-buffer-mb", type=float, default=64.0)
    ap.add_argument("--block-mb", type=float, default=16.0)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--rounds", type=int, default=None,
                    help="import and peer rounds, alternating; medians reported (default 3, --quick 1)")
    args = ap.parse_args()

    work = Path(args.dir) if args.dir else Path(tempfile.gettempdir()) / "ingest-bench" / f"run-{os.getpid()}"
    if work.exists() and any(work.iterdir()):
        raise SystemExit(f"{work} exists and is not empty")
    work.mkdir(parents=True, exist_ok=True)
    t_start = time.perf_counter()
    res: dict = {"quick": args.quick, "machine": {"cpus": os.cpu_count(), "platform": platform.platform(),
                                                  "loadavg_at_start": os.getloadavg()}}
    try:
        tsv = work / "criteo.tsv"
        target = 36e6 if args.quick else args.tsv_gb * 1e9
        log(f"generating {target / 1e9:.2f} GB of Criteo-like TSV in {work}")
        gen = generate(tsv, int(target), args.seed)
        log(f"{gen['rows']:,} rows, {gen['bytes'] / 1e9:.3f} GB in {gen['seconds']:.1f} s")
        res["data"] = gen
        # The generated file is still being written back: flushed first, so neither the import
        # nor its peer shares the device with that writeback (the import used to run during it).
        t_sync = time.perf_counter()
        os.sync()
        log(f"generated file flushed to the device ({time.perf_counter() - t_sync:.1f} s)")
        store = work / "store"
        # Rounds, the import and its peer alternating (the machine is shared: both see the same
        # drift); each side reports its median round.
        rounds = args.rounds or (1 if args.quick else 3)
        imps, peers = [], []
        for r in range(rounds):
            if r:
                shutil.rmtree(store, ignore_errors=True)
            imps.append(run_import(tsv, store, work / "summary.json", args.write_buffer_mb, args.block_mb))
            log("peer: pyarrow streaming CSV reader -> Parquet writer on the same file")
            peers.append(pyarrow_csv_to_parquet(tsv, work / "peer.parquet", args.block_mb))
            log(f"round {r + 1}/{rounds}: import {imps[-1]['summary']['mb_per_s']:.1f} MB/s, "
                f"pyarrow CSV -> Parquet {peers[-1]['mb_per_s']:.1f} MB/s")
        imp = sorted(imps, key=lambda x: x["summary"]["mb_per_s"])[len(imps) // 2]
        peer = sorted(peers, key=lambda x: x["mb_per_s"])[len(peers) // 2]
        s = imp["summary"]
        res["import"] = {
            "command": imp["command"], "rows": s["rows"], "items": s["items"], "tsv_bytes": s["input_bytes"],
            "seconds": s["seconds"], "wall_seconds_with_startup": imp["wall_seconds"],
            "mb_per_s": s["mb_per_s"], "rows_per_s": s["rows_per_s"],
            "store_write_seconds": s["write_seconds"], "store_close_seconds": s["close_seconds"],
            "peak_rss_mb": imp["peak_rss_mb"], "wait4_maxrss_mb": imp["wait4_maxrss_mb"], "write_buffer_mb": args.write_buffer_mb, "block_mb": args.block_mb,
            # CPU time of the import process (startup included): what the import costs
            # independent of other processes' load on this shared machine
            "cpu_seconds": imp["cpu_seconds"], "mb_per_cpu_s": s["input_bytes"] / 1e6 / imp["cpu_seconds"],
            "cores_used": imp["cpu_seconds"] / imp["wall_seconds"], "loadavg_start_end": imp["loadavg"],
            "timeline": [(round(a, 2), round(b, 1), c) for a, b, c in imp["timeline"]],
        }
        res["import"]["rows_per_s_over_time"] = _rates(imp["timeline"])
        res["import"]["rounds_mb_per_s"] = [x["summary"]["mb_per_s"] for x in imps]
        log(f"import: {s['mb_per_s']:.1f} MB/s, {s['rows_per_s']:,.0f} rows/s, peak RSS {imp['peak_rss_mb']:,.0f} MiB; "
            f"{imp['cpu_seconds']:.1f} CPU s ({res['import']['mb_per_cpu_s']:.1f} MB per CPU second, "
            f"{res['import']['cores_used']:.2f} cores used; load average {imp['loadavg'][0]:.1f} -> {imp['loadavg'][1]:.1f})")
        v = verify(store, gen["rows"], args.seed, full=args.quick)
        res["import"]["verified"] = v.pop("verified")
        res["import"].update(v)
        if not res["import"]["verified"]:
            log(f"VERIFICATION FAILED: {v.get('reason')}")
        meta = (v.get("store") or {}).get("metadata_dram_bytes")
        if meta:
            res["import"]["engine_metadata_dram_mb"] = meta / MiB
        peer["rounds_mb_per_s"] = [x["mb_per_s"] for x in peers]
        peer["import_ratio"] = res["import"]["mb_per_s"] / peer["mb_per_s"]
        res["peer_pyarrow_csv_to_parquet"] = peer
        log(f"pyarrow CSV -> Parquet (median of {rounds}): {peer['mb_per_s']:.1f} MB/s ({peer['mb_per_cpu_s']:.1f} MB per "
            f"CPU second); recflash import (median) {res['import']['mb_per_s']:.1f} MB/s = {peer['import_ratio']:.2f} x")
        log("profile: reader alone, store alone")
        res["profile"] = {
            "reader": profile_reader(tsv, min(gen["bytes"], 256 * MiB), args.block_mb),
            "store": profile_store(tsv, work, min(gen["rows"], 300_000), args.write_buffer_mb, args.block_mb),
        }
        log(f"reader alone {res['profile']['reader']['mb_per_s']:.1f} MB/s "
            f"({res['profile']['reader']['mb_per_cpu_s']:.1f} MB per CPU second); store alone "
            f"{res['profile']['store']['mb_per_s_equivalent']:.1f} MB/s-equivalent "
            f"({res['profile']['store']['items_per_s']:,.0f} items/s, "
            f"{res['profile']['store']['cpu_ns_per_item']:.0f} CPU ns per item)")
        res["preprocess"] = bench_preprocess(store, gen["rows"], args.quick)
        res["targets"] = {
            "import_mb_per_s": {"target": TARGET_IMPORT_MB_S, "measured": res["import"]["mb_per_s"],
                                "met": res["import"]["mb_per_s"] >= TARGET_IMPORT_MB_S},
            "peak_rss_mb": {"target": TARGET_PEAK_RSS_MB, "measured": res["import"]["peak_rss_mb"],
                            "met": res["import"]["peak_rss_mb"] <= TARGET_PEAK_RSS_MB,
                            "note": "full mode only is meaningful (>= 2 GB input)"},
            "import_vs_pyarrow_csv_to_parquet": {"target": TARGET_IMPORT_VS_PYARROW,
                                                 "measured": res["peer_pyarrow_csv_to_parquet"]["import_ratio"],
                                                 "met": res["peer_pyarrow_csv_to_parquet"]["import_ratio"]
                                                 >= TARGET_IMPORT_VS_PYARROW,
                                                 "note": "MB/s of TSV, same file, same run"},
            "preprocess_samples_per_s": {"target": TARGET_PREPROCESS_SAMPLES_S,
                                         "measured": res["preprocess"]["samples_per_s"],
                                         "met": res["preprocess"]["samples_per_s"] >= TARGET_PREPROCESS_SAMPLES_S},
        }
        res["seconds"] = time.perf_counter() - t_start
        write_report(res, args.json, args.plot, plot, log)
        return 0 if res["import"]["verified"] else 1
    finally:
        if not args.keep:
            remove_workdir(work, parent_too=not args.dir)


if __name__ == "__main__":
    sys.exit(main())
