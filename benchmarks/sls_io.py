"""The I/O methods study for SSD-resident embedding tables (seed 004 §5, SPEC §5, issue 6).

    python benchmarks/sls_io.py [--quick] --json OUT --plot OUT.png [--dir DIR] [--scale S]
        [--keep] [--reuse]

SparseLengthsSum over embedding tables that live on the SSD, fetched eight ways:

  io_buf           fseeko + fread through a 4 KiB stdio buffer (buffered, page cache)
  io_unbuf         one pread per row, O_DIRECT, logical-block (512 B) aligned
  mmap             the table file mapped, rows copied out (page faults, kernel read-around)
  ram              the whole table file in DRAM (preloaded; load time reported separately)
  ratio_1:9/5:5/9:1  the first 10 / 50 / 90 % of every table preloaded, the rest as io_unbuf
  opt              the hottest 64 KiB regions of a profiling trace (other seed) preloaded,
                   10 % of the data (the DRAM of ratio_1:9), the rest as io_unbuf
  recflash_page    recflash.ndp.SlsEngine, page-granular (16 KiB pages) io_uring reads
  recflash_vector  recflash.ndp.SlsEngine, vector-granular (512 B blocks) io_uring reads
  uring            reference (not in the thesis): raw io_uring, O_DIRECT, one 512 B read per
                   unique row, QD 128 — what the engine's I/O costs without the engine

The first six run in a C++ harness (benchmarks/csrc/sls_baselines.cc, built on first use into
build/sls-bench/) over a flat row-major float32 copy of the tables; recflash runs in a Python
worker process over the store. All of them sort and de-duplicate each table's ids, fetch each
unique row once and pool the bags (sum) — only the fetch differs. All see the same trace files.

Measured per point (one trace = batches of one batch size): batch latency (mean, p50, p90,
min, max; batches are run until the per-point time budget is used, at least one), looked-up
rows per second, the device's read requests and bytes from /proc/diskstats deltas of the block
device holding the data (found by the data file's major:minor; it includes other processes'
I/O on that device — this machine is shared), the process's own storage reads
(/proc/self/io read_bytes, which counts O_DIRECT, io_uring and page-cache fills), CPU seconds,
and memory (VmRSS / VmHWM). The page cache is dropped (echo 3 > /proc/sys/vm/drop_caches, as
root) before every batch of the buffered methods io_buf, mmap and mmap_random, outside the
timed region, so every batch of theirs is cold; the other methods use O_DIRECT and bypass it.
Points run at least --min-batches batches (3) and until the per-point time budget is used; the
machine is shared, so the median (p50) is reported next to the mean.

Experiments (full run; --quick shrinks everything to a test-sized run):
  batch_sweep    RM1 shape, uniform ids, batch 1..256, every method
  lookup_sweep   RM1 shape, uniform ids, batch 32, 10..160 lookups per bag
  models         RM2 and RM3 shapes, a few batch sizes, the main methods
  distributions  RM1, batch 64: Zipf(1.05), RecSSD K = 0/1/2, the thesis' bimodal ids (uniform:
                 the batch sweep's points); io_unbuf, ratio_1:9, opt, recflash_vector (with and
                 without a 10 % row cache)
  throughput     recflash_vector, caches off, RM1 batch 256, rounds of 4 s between fio runs:
                 device reads per second against the device's random-read IOPS limit, CPU use
  latency_rounds io_unbuf and recflash_vector back to back on one RM1 batch-64 trace (order
                 alternating), then fio 512 B QD1 / QD128 / QD256; five rounds
  caches         RM1, Zipf(1.05), batch 64, warm: caches off vs each cache of SlsEngine

Device limits in the same run: benchmarks/device.py (fio, io_uring, O_DIRECT: sequential 128 KiB,
random 16 KiB QD32, random 4 KiB QD64) and fio random 512 B reads at QD128 and QD256 (and QD1)
over the RM1 tables' flat file (fully written, same disk; read-only), before and after every
throughput round. A fio figure is the smaller of fio's own count and the reads the device served
meanwhile (/proc/diskstats): a read landing in a hole of a sparse file returns zeros without I/O.
The store's page file has such holes (freed slots are punched); fio over it is recorded once
(experiments.fio_pages_file) to show by how much it overstates the device.

The machine is shared: every point records the other processes' reads on the device meanwhile
(diskstats minus our own) and is marked clean when they stay below 2 % of our requests and 10 %
of our bytes; throughput rounds run until five are clean (at most eight), each after waiting
(bounded) for a quiet second.

Targets (issue 6, fixed, never loosened):
  - vector-granular SLS, caches off: device reads/s >= 0.85 x the device's random-read IOPS
    limit, <= 1 core (process CPU seconds / wall seconds) — median over the clean throughput
    rounds of reads/s / the larger limit measured right before and after the round (each the
    larger of fio 512 B QD128 and QD256); "strict_value" divides by the run's best device figure
  - device bytes per looked-up row <= 512 for rows <= 512 B (RM1 rows are 128 B): bytes the
    engine read from the device (O_DIRECT) per unique row (>= per lookup), worst point of the
    vector-granular batch sweep and throughput rounds; the process's /proc/self/io figure and
    the device's (clean points) are reported next to it
  - RM1 batch 64: mean latency >= 5x lower than io_unbuf (median of the latency rounds' ratios;
    the batch sweep's figure is kept as sweep_value) and >= 3x lower than mmap (batch sweep).
    io_unbuf reads one row at a time (QD1), so no method that reads every row can beat it by
    more than the device's IOPS(QD128-256) / IOPS(QD1), measured in each round
  - Zipf(1.05), row cache holding 10 % of the rows, warm: >= 2x the looked-up rows/s of caches
    off (mean of two interleaved runs each)
"""

from __future__ import annotations

import argparse
import dataclasses
import inspect
import json
import math
import os
import platform
import shutil
import subprocess
import sys
import time
import traceback

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
if HERE not in sys.path:
    sys.path.insert(0, HERE)

KiB = 1 << 10
MiB = 1 << 20
GiB = 1 << 30

TARGET_IOPS_FRACTION = 0.85
TARGET_MAX_CORES = 1.0
TARGET_BYTES_PER_ROW = 512
TARGET_VS_IO_UNBUF = 5.0
TARGET_VS_MMAP = 3.0
TARGET_ROW_CACHE_SPEEDUP = 2.0


CACHE_KWARGS = ("row_cache_bytes", "hot_rows_bytes", "pooled_cache_bytes", "pooled_min_bag", "device_cache_bytes")
ROW_CACHE_OVERHEAD = 64   # bytes the engine's RowCache charges per entry besides the row
HOT_ROWS_OVERHEAD = 32    # HotRows: index entry per row
DEVICE_CACHE_OVERHEAD = 8  # DirectMappedCache: tag per slot

METHODS = {
    "io_buf": "fseeko + fread through a 4 KiB stdio buffer (page cache dropped before each batch)",
    "io_unbuf": "one pread per unique row, O_DIRECT, 512 B aligned",
    "mmap": "file mmap'ed (default advice: faults read around, up to read_ahead_kb), rows copied out "
            "(page cache dropped before each batch)",
    "mmap_random": "extra: mmap with MADV_RANDOM (one page per fault), page cache dropped before each batch",
    "ram": "whole table file preloaded in DRAM",
    "ratio_1:9": "first 10 % of every table in DRAM, the rest as io_unbuf",
    "ratio_5:5": "first 50 % of every table in DRAM, the rest as io_unbuf",
    "ratio_9:1": "first 90 % of every table in DRAM, the rest as io_unbuf",
    "opt": "hottest 64 KiB regions of a profiling trace (10 % of the data) in DRAM, the rest as io_unbuf",
    "uring": "reference: raw io_uring, O_DIRECT, one 512 B read per unique row, QD 128",
    "recflash_page": "recflash SlsEngine, page-granular io_uring reads (16 KiB pages)",
    "recflash_vector": "recflash SlsEngine, vector-granular io_uring reads (512 B blocks)",
}
HARNESS_METHODS = {
    "io_buf": ["--method", "io_buf", "--drop-caches"],
    "io_unbuf": ["--method", "io_unbuf"],
    "mmap": ["--method", "mmap", "--drop-caches"],
    "mmap_random": ["--method", "mmap", "--madvise-random", "--drop-caches"],
    "ram": ["--method", "ram"],
    "ratio_1:9": ["--method", "ratio", "--dram-fraction", "0.1"],
    "ratio_5:5": ["--method", "ratio", "--dram-fraction", "0.5"],
    "ratio_9:1": ["--method", "ratio", "--dram-fraction", "0.9"],
    "opt": ["--method", "opt", "--dram-fraction", "0.1", "--chunk-bytes", str(64 * KiB)],
    "uring": ["--method", "uring", "--qd", "128"],
    "uring_qd256": ["--method", "uring", "--qd", "256"],
}
ALL_METHODS = list(METHODS)
# mmap's cold batches (page cache dropped before each) take seconds whatever the batch size
# (every fault reads up to read_ahead_kb): two per point keep the run within its time budget.
MIN_BATCHES_CAP = {"mmap": 2}
MAIN_METHODS = ["io_buf", "io_unbuf", "mmap", "ram", "uring", "recflash_page", "recflash_vector"]


# ---------------------------------------------------------------------------------------
# Small system helpers (the shared ones live in harness.py)

from harness import (  # noqa: E402
    CLEAN_MAX_FOREIGN_BYTES,
    CLEAN_MAX_FOREIGN_IOS,
    block_device_of,
    diskstats,
    drop_caches,
    file_holes,
    fio_randread,
    is_clean,
    loadavg,
    make_log,
)

log = make_log(None, elapsed=True, stream=sys.stderr)


def proc_read_bytes() -> int:
    with open("/proc/self/io") as f:
        for line in f:
            if line.startswith("read_bytes:"):
                return int(line.split()[1])
    return 0


def proc_mem() -> tuple:
    rss = hwm = 0
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                rss = int(line.split()[1]) * 1024
            elif line.startswith("VmHWM:"):
                hwm = int(line.split()[1]) * 1024
    return rss, hwm


def build_harness() -> str:
    """benchmarks/csrc/sls_baselines.cc, built through the project's CMake (see
    baselines.common.build_harness)."""
    from baselines.common import build_harness as cmake_harness

    return cmake_harness("sls_baselines")








def wait_quiet(dev, max_wait: float, sample: float = 1.0, max_ios_per_s: float = 500.0,
               max_MBps: float = 20.0) -> dict:
    """Waits (up to max_wait seconds) until the device has a quiet second (other processes'
    reads below the limits); returns what it saw."""
    t0 = time.perf_counter()
    seen = []
    while True:
        a = diskstats(*dev)
        time.sleep(sample)
        b = diskstats(*dev)
        if not a or not b:
            return {"waited_s": 0.0, "quiet": None}
        ios = (b["read_ios"] - a["read_ios"]) / sample
        mbps = (b["read_bytes"] - a["read_bytes"]) / sample / 1e6
        seen.append([round(ios), round(mbps, 1)])
        quiet = ios <= max_ios_per_s and mbps <= max_MBps
        if quiet or time.perf_counter() - t0 >= max_wait:
            return {"waited_s": time.perf_counter() - t0, "quiet": quiet, "samples_ios_MBps": seen[-5:]}


# ---------------------------------------------------------------------------------------
# Engine worker (runs in its own process: `sls_io.py --worker SPEC.json`)


def engine_worker(spec_path: str) -> int:
    with open(spec_path) as f:
        spec = json.load(f)
    rss_interp, _ = proc_mem()
    from recflash.ndp import EmbeddingStore, SlsEngine
    from recflash.ndp.traces import load_trace
    from recflash.reader import Store, StoreOptions

    names = spec["tables"]
    major, minor = spec["dev"]
    store = Store.open(spec["store"], StoreOptions(write_buffer_bytes=64 << 20))
    tables = EmbeddingStore(store)
    # The methods as issue 6 defines them: 512 B block reads (recflash_vector) or whole pages
    # (recflash_page), not the engine's default mix of the two (dense_page_rows).
    kwargs = dict(vector_grained=spec["vector_grained"], dense_page_rows=0)
    kwargs.update(spec.get("cache_kwargs") or {})
    eng = SlsEngine(tables, **kwargs)
    # Block checksums for verified vector reads: saved by the last clean close (BLOCKSUMS), else
    # taken here by reading the packed pages once — outside every timed region.
    t0 = time.perf_counter()
    verify_pages = sum(tables.verify_table(name) for name in names)
    verify = {"pages_read": verify_pages, "seconds": time.perf_counter() - t0}
    t0 = time.perf_counter()
    if spec.get("profile"):
        eng.profile([r for b in load_trace(spec["profile"], names) for r in b])
    profile_s = time.perf_counter() - t0
    warm = {"batches": 0, "seconds": 0.0}
    if spec.get("warmup"):
        t0 = time.perf_counter()
        for b in load_trace(spec["warmup"], names)[: spec.get("warmup_batches") or None]:
            eng.sls(b)
            warm["batches"] += 1
        warm["seconds"] = time.perf_counter() - t0
    # Touch the engine's code paths once (one row per table) so that page faults on the program's
    # own files (which the drop_caches of other methods evicted) are not counted as device reads.
    from recflash.ndp import SlsRequest

    if not spec.get("warmup"):
        outs = eng.sls([SlsRequest(name, np.zeros(1, np.int64), np.zeros(1, np.int64)) for name in names])
        float(np.concatenate([o.reshape(-1) for o in outs]).astype(np.float64).sum())  # the checksum's code path
    rss_open, _ = proc_mem()
    out = {"method": spec["name"], "rss_interpreter_bytes": rss_interp, "rss_after_open_bytes": rss_open,
           "profile_seconds": profile_s, "warmup": warm, "engine_kwargs": kwargs, "block_checksums": verify,
           "points": []}
    cache0 = eng.cache_stats() if hasattr(eng, "cache_stats") else None
    for ti, path in enumerate(spec["traces"]):
        batches = load_trace(path, names)
        lat = []
        lookups = unique = dev_reads = dev_bytes = vec_rows = page_rows = buf_rows = verified = first_touch = 0
        checksum = 0.0
        c_before = eng.cache_stats() if hasattr(eng, "cache_stats") else None
        d0 = diskstats(major, minor)
        pr0 = proc_read_bytes()
        tm0 = os.times()
        w0 = time.perf_counter()
        for bi, b in enumerate(batches):
            if bi >= spec["min_batches"] and time.perf_counter() - w0 >= spec["time_budget"]:
                break
            if spec.get("max_batches") and bi >= spec["max_batches"]:
                break
            t = time.perf_counter()
            outs = eng.sls(b)
            lat.append(time.perf_counter() - t)
            st = eng.last_stats
            lookups += st["lookups"]
            unique += st["unique_rows"]
            g = st["gather"]
            dev_reads += g["device_reads"]
            dev_bytes += g["device_bytes"]
            vec_rows += g["vector_rows"]
            page_rows += g["page_rows"]
            buf_rows += g["buffer_rows"]
            verified += g.get("verified_blocks", 0)
            first_touch += g.get("first_touch_pages", 0)
            if bi == 0:
                flat = np.concatenate([o.reshape(-1) for o in outs])
                checksum = float(flat.astype(np.float64).sum())
                if ti == 0 and spec.get("dump"):
                    flat.astype(np.float32).tofile(spec["dump"])
        wall = time.perf_counter() - w0
        tm1 = os.times()
        pr1 = proc_read_bytes()
        d1 = diskstats(major, minor)
        rss, hwm = proc_mem()
        s = sorted(lat)
        pct = lambda q: s[min(len(s) - 1, int(q * (len(s) - 1) + 0.5))] if s else None  # noqa: E731
        p = {"trace": path, "batches": len(lat), "batches_in_trace": len(batches), "page_cache_dropped": False,
             "lookups": lookups, "unique_rows": unique,
             "latency_s": {"mean": float(np.mean(s)) if s else None, "p50": pct(0.5), "p90": pct(0.9),
                           "min": s[0] if s else None, "max": s[-1] if s else None, "first": lat[0] if lat else None},
             "wall_s": wall, "cpu_s": (tm1.user - tm0.user) + (tm1.system - tm0.system),
             "proc_read_bytes": pr1 - pr0,
             "disk": ({k: d1[k] - d0[k] for k in d0} if d0 and d1 else None),
             "engine": {"device_reads": dev_reads, "device_bytes": dev_bytes, "vector_rows": vec_rows,
                        "page_rows": page_rows, "buffer_rows": buf_rows, "verified_blocks": verified,
                        "first_touch_pages": first_touch},
             "rss_bytes": rss, "hwm_bytes": hwm, "checksum": checksum}
        if c_before is not None:
            p["cache_stats"] = eng.cache_stats()
            p["cache_stats_before"] = c_before
        out["points"].append(p)
    if cache0 is not None:
        out["cache_stats_start"] = cache0
    store.close()
    print(json.dumps(out))
    return 0


# ---------------------------------------------------------------------------------------
# Orchestration


@dataclasses.dataclass
class Model:
    shape: object          # traces.ModelShape
    flat: str              # flat float32 file for the C++ harness
    store: str             # store directory
    names: list
    seed: int

    @property
    def key(self) -> str:
        return self.shape.name


class Bench:
    def __init__(self, args):
        self.args = args
        self.quick = args.quick
        self.dir = os.path.abspath(args.dir)
        self.trace_dir = os.path.join(self.dir, "traces")
        self.out_dir = os.path.join(self.dir, "out")
        self.models: dict = {}
        self.doc: dict = {"benchmark": "sls_io", "quick": self.quick, "started_at": time.time(),
                          "host": {"cpus": os.cpu_count(), "platform": platform.platform(),
                                   "loadavg_start": loadavg(), "loadavg": {}},
                          "methods": METHODS, "experiments": {}, "validation": {}, "errors": [], "notes": []}
        self.dev = None
        self.validation_ref: dict = {}
        self.trace_count = 0

    # -- setup -------------------------------------------------------------------------

    def config(self) -> dict:
        q = self.quick
        if self.args.scale:
            scales = {"RM1": self.args.scale, "RM2": self.args.scale, "RM3": self.args.scale}
        elif q:
            scales = {"RM1": 1 / 64}
        else:  # RM1 at its published size (the targets are about it); RM2, RM3 scaled to fit the time
            scales = {"RM1": 1.0, "RM2": 0.25, "RM3": 0.25}
        return dict(
            scales=scales,
            models=list(scales),
            batch_sizes=[1, 16, 64] if q else [1, 2, 4, 8, 16, 32, 64, 128, 256],
            lookup_sweep=[20, 80] if q else [10, 40, 160],
            lookup_sweep_batch=8 if q else 32,
            lookup_methods=MAIN_METHODS,
            model_batches={"RM2": [1, 4, 16], "RM3": [1, 16, 64, 256]},
            model_methods=["io_buf", "io_unbuf", "mmap", "ram", "recflash_page", "recflash_vector"],
            dist_batch=16 if q else 64,
            dists=[("zipf", {"alpha": 1.05}), ("klocality", {"k": 0}), ("klocality", {"k": 1}),
                   ("klocality", {"k": 2}), ("binomial", {})] if not q else
                  [("zipf", {"alpha": 1.05}), ("klocality", {"k": 1})],
            dist_methods=["io_unbuf", "ratio_1:9", "opt", "recflash_vector"],
            time_budget=0.25 if q else 1.0,
            lookups_per_point=20_000 if q else 250_000,
            max_batches=64,
            min_batches=1 if q else 3,
            min_trace_batches=2 if q else 3,
            large_batch_batches=None if q else 2,  # trace batches at batch >= 128 (time)
            sweep_subsets={} if q else {"mmap_random": [1, 16, 64, 256]},
            dist_min_batches=1 if q else 2,
            throughput_batch=64 if q else 256,
            throughput_seconds=0.5 if q else 4.0,
            throughput_rounds=1 if q else 5,
            throughput_max_rounds=1 if q else 8,
            quiet_wait_s=2.0 if q else 20.0,
            throughput_qd1_after=not q,
            latency_rounds=0 if q else 5,
            latency_seconds=3.0,
            fio_runtime=1.0 if q else 3.0,
            cache_batch=16 if q else 64,
            cache_warmup_batch=16 if q else 256,
            cache_warmup_batches=8 if q else 36,
            cache_measure_seconds=0.5 if q else 4.0,
            cache_configs=["off", "row"] if q else ["off", "row", "hot", "pooled", "device", "all"],
            cache_repeats=1 if q else 2,
            profile_batches=4 if q else 16,
            seed=self.args.seed,
        )

    def setup(self):
        from recflash.ndp.traces import model_shape

        cfg = self.cfg = self.config()
        self.doc["config"] = cfg
        os.makedirs(self.dir, exist_ok=True)
        os.makedirs(self.trace_dir, exist_ok=True)
        os.makedirs(self.out_dir, exist_ok=True)
        self.harness = build_harness()
        for mi, name in enumerate(cfg["models"]):
            shape = model_shape(name, cfg["scales"][name])
            self.models[name] = Model(shape, os.path.join(self.dir, f"{name.lower()}.f32"),
                                      os.path.join(self.dir, f"store_{name.lower()}"), shape.table_names(),
                                      cfg["seed"] * 100 + mi)
        self.dev = block_device_of(self.dir)
        self.doc["device_under_test"] = self.dev
        if not self.dev["in_diskstats"]:
            self.doc["notes"].append(f"{self.dir} is on device {self.dev['major']}:{self.dev['minor']}, not listed "
                                     "in /proc/diskstats: no device request / byte deltas")
        data = {}
        for name, m in self.models.items():
            data[name] = self.load_model(m)
        self.dev = block_device_of(self.models[cfg["models"][0]].flat)
        self.doc["device_under_test"] = self.dev
        self.doc["data"] = data
        dropped = drop_caches()
        self.doc["host"]["page_cache_drop_available"] = dropped
        if not dropped:
            self.doc["notes"].append("could not drop the page cache (not root?): io_buf and mmap were NOT measured cold")

    def weights(self, m: Model, t: int) -> np.ndarray:
        g = np.random.default_rng([m.seed, t])
        w = g.random((m.shape.num_rows, m.shape.dim), dtype=np.float32)
        w -= 0.5
        return w

    def load_model(self, m: Model) -> dict:
        from recflash.ndp import EmbeddingStore
        from recflash.reader import Store, StoreOptions

        s = m.shape
        manifest = os.path.join(self.dir, f"{m.key.lower()}.manifest.json")
        want = {"shape": dataclasses.asdict(s), "seed": m.seed, "format": 1}
        if self.args.reuse and os.path.exists(manifest):
            with open(manifest) as f:
                have = json.load(f)
            if have.get("want") == want:
                log(f"{m.key}: reusing the data in {self.dir}")
                return have["info"]
        log(f"{m.key}: {s.num_tables} tables x {s.num_rows} rows x dim {s.dim} "
            f"({s.total_bytes / GiB:.2f} GiB), writing the flat file and loading the store")
        shutil.rmtree(m.store, ignore_errors=True)
        t0 = time.perf_counter()
        store = Store.open(m.store, StoreOptions(write_buffer_bytes=256 << 20))
        tables = EmbeddingStore(store)
        gen_s = flat_s = load_s = 0.0
        with open(m.flat, "wb") as f:
            for t, name in enumerate(m.names):
                a = time.perf_counter()
                w = self.weights(m, t)
                b = time.perf_counter()
                w.tofile(f)
                c = time.perf_counter()
                tables.create_table(name, s.num_rows, s.dim)
                tables.load_table(name, w, progress=False)
                d = time.perf_counter()
                gen_s += b - a
                flat_s += c - b
                load_s += d - c
            f.flush()
            os.fsync(f.fileno())
        store.close()
        store_bytes = sum(os.path.getsize(os.path.join(dp, fn)) for dp, _, fns in os.walk(m.store) for fn in fns)
        info = {"shape": dataclasses.asdict(s), "published_rows_per_table": int(round(s.num_rows / s.scale)),
                "flat_file": m.flat, "flat_bytes": os.path.getsize(m.flat), "store": m.store, "store_bytes": store_bytes,
                "seconds": {"generate": gen_s, "flat_write": flat_s, "store_load": load_s,
                            "total": time.perf_counter() - t0}}
        with open(manifest, "w") as f:
            json.dump({"want": want, "info": info}, f)
        log(f"{m.key}: ready in {info['seconds']['total']:.1f}s (store load {load_s:.1f}s)")
        return info

    # -- traces ------------------------------------------------------------------------

    def trace(self, m: Model, batch: int, *, dist="uniform", lookups=None, nb=None, seed_off=0, **kw) -> str:
        from recflash.ndp.traces import make_batches, save_trace

        cfg = self.cfg
        L = lookups or m.shape.lookups
        per_batch = batch * L * m.shape.num_tables
        if nb is None:
            nb = max(cfg["min_trace_batches"], min(cfg["max_batches"], math.ceil(cfg["lookups_per_point"] / per_batch)))
        tag = "_".join(f"{k}{v}" for k, v in sorted(kw.items()))
        self.trace_count += 1
        path = os.path.join(self.trace_dir, f"{m.key.lower()}_{dist}{tag}_b{batch}_l{L}_n{nb}_s{seed_off}.bin")
        if not os.path.exists(path):
            batches = make_batches(m.shape, batch, nb, dist=dist, lookups=L, seed=self.cfg["seed"] * 1000 + seed_off, **kw)
            save_trace(path + ".tmp", batches, {n: i for i, n in enumerate(m.names)})
            os.replace(path + ".tmp", path)
        return path

    # -- running methods ---------------------------------------------------------------

    def run_method(self, method: str, m: Model, traces: list, *, profile=None, time_budget=None, dump=None,
                   cache_kwargs=None, warmup=None, warmup_batches=None, label=None, min_batches=None) -> dict:
        cfg = self.cfg
        if min_batches is None:
            min_batches = min(cfg["min_batches"], MIN_BATCHES_CAP.get(method, cfg["min_batches"]))
        budget = cfg["time_budget"] if time_budget is None else time_budget
        dev = [self.dev["major"], self.dev["minor"]] if self.dev and self.dev["in_diskstats"] else [-1, -1]
        t0 = time.perf_counter()
        if method.startswith("recflash"):
            spec = {"name": label or method, "store": m.store, "tables": m.names, "dev": dev,
                    "vector_grained": method.startswith("recflash_vector"), "traces": traces,
                    "time_budget": budget, "min_batches": min_batches, "max_batches": cfg["max_batches"],
                    "dump": dump, "cache_kwargs": cache_kwargs or {}, "profile": profile, "warmup": warmup,
                    "warmup_batches": warmup_batches}
            spec_path = os.path.join(self.out_dir, f"spec_{os.getpid()}_{self.trace_count}.json")
            self.trace_count += 1
            with open(spec_path, "w") as f:
                json.dump(spec, f)
            cmd = [sys.executable, os.path.abspath(__file__), "--worker", spec_path]
        else:
            s = m.shape
            cmd = [self.harness, "--file", m.flat, "--tables", str(s.num_tables), "--rows", str(s.num_rows),
                   "--dim", str(s.dim), "--time-budget", str(budget), "--min-batches", str(min_batches),
                   "--max-batches", str(cfg["max_batches"])] + HARNESS_METHODS[method]
            if dev[0] >= 0:
                cmd += ["--dev", f"{dev[0]}:{dev[1]}"]
            if method == "opt":
                cmd += ["--profile", profile]
            if dump:
                cmd += ["--dump", dump]
            cmd += traces
        proc = subprocess.run(cmd, capture_output=True, text=True, cwd=self.out_dir, timeout=3600)
        if proc.returncode != 0:
            raise RuntimeError(f"{method} on {m.key} failed (exit {proc.returncode}): {proc.stderr[-3000:]}")
        res = json.loads(proc.stdout.strip().splitlines()[-1])
        res["process_seconds"] = time.perf_counter() - t0
        return res

    def point_record(self, raw: dict, p: dict, m: Model, batch: int, lookups: int) -> dict:
        lat = p["latency_s"]
        lk, un = p["lookups"], p["unique_rows"]
        proc_b = p["proc_read_bytes"]
        disk = p.get("disk") or {}
        # Rates over the time spent in the batches (sum of batch latencies).
        busy = (lat["mean"] or 0) * p["batches"] or p["wall_s"]
        rec = {
            "batch": batch, "lookups_per_bag": lookups, "batches": p["batches"], "lookups": lk, "unique_rows": un,
            "latency_ms": {k: (v * 1e3 if v is not None else None) for k, v in lat.items()},
            "lookups_per_s": lk / busy if busy > 0 else None,
            "unique_rows_per_s": un / busy if busy > 0 else None,
            "proc_read_bytes": proc_b,
            "bytes_per_lookup": proc_b / lk if lk else None,
            "bytes_per_unique_row": proc_b / un if un else None,
            "disk": disk or None,
            "disk_read_ios_per_lookup": (disk.get("read_ios", 0) / lk) if disk and lk else None,
            "disk_bytes_per_lookup": (disk.get("read_bytes", 0) / lk) if disk and lk else None,
            "cpu_util": p["cpu_s"] / p["wall_s"] if p["wall_s"] > 0 else None,
            "wall_s": p["wall_s"],
            "rss_mb": p["rss_bytes"] / MiB, "hwm_mb": p["hwm_bytes"] / MiB,
            "page_cache_dropped": p.get("page_cache_dropped", False),
            "checksum": p.get("checksum"),
        }
        for k in ("dram_rows", "file_rows", "syscall_reads", "syscall_read_bytes"):
            if k in p:
                rec[k] = p[k]
        # Other processes' reads on the device meanwhile (the machine is shared).
        if disk:
            fb = max(0, disk.get("read_bytes", 0) - proc_b)
            rec["foreign_read_bytes"] = fb
            own_ios = p["engine"]["device_reads"] if "engine" in p else (p.get("syscall_reads") if raw.get("o_direct") else None)
            if own_ios is not None:
                rec["foreign_read_ios"] = max(0, disk.get("read_ios", 0) - own_ios)
                rec["clean"] = is_clean(own_ios, proc_b, rec["foreign_read_ios"], fb)
            else:
                rec["clean"] = fb <= CLEAN_MAX_FOREIGN_BYTES * max(proc_b, 1)
        if "engine" in p:
            e = p["engine"]
            rec["engine"] = e
            rec["engine_reads_per_s"] = e["device_reads"] / busy if busy > 0 else None
            rec["engine_bytes_per_unique_row"] = e["device_bytes"] / un if un else None
        else:
            reads = p.get("syscall_reads")
            rec["syscall_reads_per_s"] = reads / busy if reads is not None and busy > 0 else None
        if "cache_stats" in p:
            rec["cache_stats"] = p["cache_stats"]
            before = p.get("cache_stats_before") or {}
            delta = {}
            for cname, cs in p["cache_stats"].items():
                b0 = before.get(cname, {})
                d = {k: cs.get(k, 0) - b0.get(k, 0) for k in ("hits", "misses", "inserts", "evictions")}
                d["hit_rate"] = d["hits"] / (d["hits"] + d["misses"]) if d["hits"] + d["misses"] else None
                d["bytes"] = cs.get("bytes")
                delta[cname] = d
            rec["cache_during_point"] = delta
        if "rss_interpreter_bytes" in raw:
            rec["rss_above_interpreter_mb"] = (p["rss_bytes"] - raw["rss_interpreter_bytes"]) / MiB
        return rec

    def method_summary(self, raw: dict) -> dict:
        keep = {k: v for k, v in raw.items() if k != "points"}
        return keep

    def sweep(self, exp: str, m: Model, methods: list, points: list, *, dist="uniform", dist_kw=None,
              validate=False, subsets=None, **run_kw) -> dict:
        """points: list of (batch, lookups). One process per method runs every point (or, for a
        method in `subsets`, the points whose batch size is listed there)."""
        dist_kw = dist_kw or {}
        cfg = self.cfg
        traces = [self.trace(m, b, dist=dist, lookups=L, nb=(cfg["large_batch_batches"] if b >= 128 else None),
                             **dist_kw) for b, L in points]
        profile = None
        if "opt" in methods:
            b0 = max(b for b, _ in points)
            profile = self.trace(m, b0, dist=dist, nb=self.cfg["profile_batches"], seed_off=777, **dist_kw)
        out = {"model": m.key, "dist": dist, "dist_params": dist_kw, "points": [list(p) for p in points],
               "shape": dataclasses.asdict(m.shape), "results": {}, "method_info": {}}
        self.doc["host"]["loadavg"][exp] = loadavg()
        for meth in methods:
            dump = os.path.join(self.out_dir, f"dump_{exp}_{meth.replace(':', '')}.f32") if validate else None
            log(f"{exp}: {meth} on {m.key} ({dist}{dist_kw or ''}), {len(points)} points")
            keep = [i for i, (b, _) in enumerate(points) if not subsets or meth not in subsets or b in subsets[meth]]
            try:
                raw = self.run_method(meth, m, [traces[i] for i in keep], profile=profile, dump=dump, **run_kw)
            except Exception as e:  # keep going; the error is recorded
                self.doc["errors"].append(f"{exp}/{meth}: {e}")
                log(f"ERROR {exp}/{meth}: {e}")
                continue
            out["results"][meth] = [self.point_record(raw, p, m, points[i][0], points[i][1])
                                    for p, i in zip(raw["points"], keep)]
            out["method_info"][meth] = self.method_summary(raw)
            if validate and dump and os.path.exists(dump):
                self.validate(exp, meth, m, traces[keep[0]], dump)
        return out

    def reference(self, m: Model, trace_path: str) -> np.ndarray:
        from recflash.ndp.traces import load_trace

        if trace_path in self.validation_ref:
            return self.validation_ref[trace_path]
        batch = load_trace(trace_path, m.names)[0]
        outs = []
        for t, r in enumerate(batch):
            w = self.weights(m, m.names.index(r.table))
            idx = np.asarray(r.indices)
            off = np.asarray(r.offsets)
            rows = w[idx].astype(np.float64)
            res = np.zeros((off.size, m.shape.dim), np.float64)
            ends = np.append(off[1:], idx.size)
            for b in range(off.size):
                if ends[b] > off[b]:
                    res[b] = rows[off[b]:ends[b]].sum(0)
                    if r.mode == "mean":
                        res[b] /= ends[b] - off[b]
            outs.append(res.reshape(-1))
        ref = np.concatenate(outs)
        self.validation_ref[trace_path] = ref
        return ref

    def validate(self, exp: str, meth: str, m: Model, trace_path: str, dump: str):
        got = np.fromfile(dump, dtype=np.float32).astype(np.float64)
        ref = self.reference(m, trace_path)
        ok = got.shape == ref.shape
        err = float(np.max(np.abs(got - ref))) if ok and ref.size else (0.0 if ok else None)
        passed = bool(ok and err is not None and err <= 1e-4)
        self.doc["validation"].setdefault(exp, {})[meth] = {"max_abs_err": err, "values": int(ref.size), "passed": passed}
        if not passed:
            self.doc["notes"].append(f"VALIDATION FAILED: {meth} in {exp} differs from numpy by {err} on the first "
                                     f"batch of {os.path.basename(trace_path)}")

    # -- experiments -------------------------------------------------------------------

    def exp_batch_sweep(self):
        cfg = self.cfg
        m = self.models["RM1"]
        pts = [(b, m.shape.lookups) for b in cfg["batch_sizes"]]
        self.doc["experiments"]["batch_sweep"] = self.sweep("batch_sweep", m, ALL_METHODS, pts, validate=True,
                                                            subsets=cfg["sweep_subsets"])
        # The device's own queue-depth scaling right after the sweep: io_unbuf is one read at a
        # time (QD1), the engine keeps a deep queue, so QD-max / QD1 IOPS bounds their ratio.
        if self.quick:
            return
        log("batch_sweep: fio 512 B QD1 / QD128 / QD256")
        try:
            self.doc["experiments"]["batch_sweep"]["fio_after"] = self.fio_extra("after batch sweep", qd1=True)
        except Exception as e:
            self.doc["errors"].append(f"batch_sweep/fio: {e}")

    def exp_latency_rounds(self):
        """The batch-64 latency target, measured against a drifting device: rounds of io_unbuf
        and recflash_vector on the same RM1 trace back to back (order alternating between
        rounds), each followed by fio 512 B at QD1 and QD128/256. The batch sweep runs each
        method minutes apart, and the device's IOPS moved by up to 2x within minutes here, so
        its ratio mixes the methods with the drift; the median of per-round ratios does not."""
        cfg = self.cfg
        if not cfg.get("latency_rounds"):
            return
        m = self.models["RM1"]
        b = 64 if 64 in cfg["batch_sizes"] else max(cfg["batch_sizes"])
        dev = self.devtuple()
        rounds = []
        for k in range(cfg["latency_rounds"]):
            tr = self.trace(m, b, nb=4, seed_off=71 + k)
            if dev:
                wait_quiet(dev, cfg["quiet_wait_s"])
            order = ["io_unbuf", "recflash_vector"] if k % 2 == 0 else ["recflash_vector", "io_unbuf"]
            rec = {}
            for meth in order:
                log(f"latency round {k}: {meth}, RM1 batch {b}")
                raw = self.run_method(meth, m, [tr], time_budget=cfg["latency_seconds"], min_batches=2)
                rec[meth] = self.point_record(raw, raw["points"][0], m, b, m.shape.lookups)
            f = self.fio_extra(f"latency round {k}", qd1=True)
            u, v = rec["io_unbuf"]["latency_ms"]["mean"], rec["recflash_vector"]["latency_ms"]["mean"]
            deep, q1 = f["limit_iops"], f["rand512_qd1"].get("iops") or 0
            rounds.append({"order": order, **rec, "fio": f, "ratio": u / v if u and v else None,
                           "device_qd_ratio": deep / q1 if deep and q1 else None,
                           "clean": all(r.get("clean", True) for r in rec.values())})
            log(f"latency round {k}: io_unbuf {u:.0f} ms, recflash_vector {v:.0f} ms = {u / v:.2f}x; "
                f"device QD128-256 / QD1 {rounds[-1]['device_qd_ratio'] or 0:.2f}x")
        self.doc["experiments"]["latency_rounds"] = {"batch": b, "rounds": rounds}

    def exp_lookup_sweep(self):
        cfg = self.cfg
        m = self.models["RM1"]
        pts = [(cfg["lookup_sweep_batch"], L) for L in cfg["lookup_sweep"]]
        self.doc["experiments"]["lookup_sweep"] = self.sweep("lookup_sweep", m, cfg["lookup_methods"], pts)

    def exp_models(self):
        cfg = self.cfg
        res = {}
        for name in cfg["models"]:
            if name == "RM1":
                continue
            m = self.models[name]
            pts = [(b, m.shape.lookups) for b in cfg["model_batches"][name]]
            res[name] = self.sweep(f"models_{name}", m, cfg["model_methods"], pts, validate=True)
        self.doc["experiments"]["models"] = res

    def caches_available(self) -> bool:
        from recflash.ndp import SlsEngine

        params = inspect.signature(SlsEngine.__init__).parameters
        return all(k in params for k in CACHE_KWARGS) and hasattr(SlsEngine, "cache_stats")

    def cache_kwargs(self, m: Model, which: str) -> dict:
        s = m.shape
        rows10 = int(round(0.1 * s.num_rows * s.num_tables))
        kw = {}
        if which in ("row", "all"):
            kw["row_cache_bytes"] = rows10 * (s.row_bytes + ROW_CACHE_OVERHEAD)
        if which == "hot":
            kw["hot_rows_bytes"] = rows10 * (s.row_bytes + HOT_ROWS_OVERHEAD)
        if which in ("pooled", "all"):
            kw["pooled_cache_bytes"] = 64 * MiB
            kw["pooled_min_bag"] = 8
        if which in ("device", "all"):
            kw["device_cache_bytes"] = rows10 * (s.row_bytes + DEVICE_CACHE_OVERHEAD)
        return kw

    def exp_distributions(self):
        cfg = self.cfg
        m = self.models["RM1"]
        B = cfg["dist_batch"]
        caches = self.caches_available()
        res = {"model": "RM1", "batch": B, "lookups_per_bag": m.shape.lookups, "results": {}, "unique_fraction": {}}
        self.doc["host"]["loadavg"]["distributions"] = loadavg()
        sweep = self.doc["experiments"].get("batch_sweep", {}).get("results", {})
        uni = {meth: next((r for r in sweep.get(meth, []) if r["batch"] == B), None) for meth in cfg["dist_methods"]}
        if all(uni.values()):
            res["results"]["uniform"] = dict(uni)
            res["uniform_from"] = "batch_sweep"
        for dist, kw in cfg["dists"]:
            label = dist + "".join(f"({v})" for v in kw.values()) if kw else dist
            tr = self.trace(m, B, dist=dist, **kw)
            prof = self.trace(m, B, dist=dist, nb=cfg["profile_batches"], seed_off=777, **kw)
            from recflash.ndp.traces import load_trace, unique_fraction

            ids0 = np.concatenate([np.asarray(b[0].indices) for b in load_trace(tr, m.names)])
            res["unique_fraction"][label] = unique_fraction(ids0)
            r = {}
            methods = list(cfg["dist_methods"])
            for meth in methods:
                log(f"distributions: {meth} on {label}")
                try:
                    raw = self.run_method(meth, m, [tr], profile=prof, min_batches=cfg["dist_min_batches"])
                    r[meth] = self.point_record(raw, raw["points"][0], m, B, m.shape.lookups)
                    if meth == "opt":
                        r[meth]["dram_fraction"] = raw.get("dram_fraction")
                except Exception as e:
                    self.doc["errors"].append(f"distributions/{label}/{meth}: {e}")
            if caches:
                log(f"distributions: recflash_vector+row_cache10% on {label}")
                try:
                    raw = self.run_method("recflash_vector", m, [tr], cache_kwargs=self.cache_kwargs(m, "row"),
                                          warmup=prof, label="recflash_vector+row_cache",
                                          min_batches=cfg["dist_min_batches"])
                    r["recflash_vector+row_cache"] = self.point_record(raw, raw["points"][0], m, B, m.shape.lookups)
                except Exception as e:
                    self.doc["errors"].append(f"distributions/{label}/row_cache: {e}")
            res["results"][label] = r
        self.doc["experiments"]["distributions"] = res

    def devtuple(self):
        return (self.dev["major"], self.dev["minor"]) if self.dev and self.dev["in_diskstats"] else None

    def fio_extra(self, tag: str, qd1: bool = False) -> dict:
        """fio random 512 B reads over the RM1 tables' flat file (fully written, on the same
        disk; the baselines read it): QD128 (the engine's ring depth) and QD256 (the virtio
        queue's size); QD1 on request (io_unbuf's situation). Not over the store's page file:
        slots the store freed are punched out (holes), and fio's reads that land in a hole never
        reach the device — on the RM1 store that inflated fio's figure by about a third. The
        first call also records fio over the page file, with its holes, to show the effect."""
        m = self.models["RM1"]
        target = m.flat
        size = os.path.getsize(target) // 4096 * 4096
        rt = self.cfg["fio_runtime"]
        dev = self.devtuple()
        r = {"when": tag, "file": target, "loadavg": loadavg(), "at": time.time() - self.doc["started_at"],
             "rand512_qd128": fio_randread(target, size, 512, 128, rt, dev),
             "rand512_qd256": fio_randread(target, size, 512, 256, rt, dev)}
        if qd1:
            r["rand512_qd1"] = fio_randread(target, size, 512, 1, rt, dev)
        if "fio_pages_file" not in self.doc["experiments"]:
            pages = os.path.join(m.store, "pages.dat")
            psize = os.path.getsize(pages) // 4096 * 4096
            self.doc["experiments"]["fio_pages_file"] = {
                "file": pages, "bytes": psize, "holes_bytes": file_holes(pages, psize),
                "rand512_qd128": fio_randread(pages, psize, 512, 128, rt, dev),
                "detail": "fio over the store's own page file: iops_fio counts reads that hit holes (freed slots, "
                          "punched) and never reached the device; iops_device is what the device served"}
        both = (r["rand512_qd128"], r["rand512_qd256"])
        r["limit_iops"] = max([x.get("iops") or 0 for x in both])
        r["clean"] = all(x.get("clean", True) for x in both)
        return r

    def exp_device(self):
        from device import measure_device

        log("device: fio (benchmarks/device.py)")
        self.doc["host"]["loadavg"]["device"] = loadavg()
        try:
            self.doc["device"] = measure_device(os.path.join(self.dir, "fio"), quick=self.quick)
        except Exception as e:
            self.doc["device"] = {"error": str(e)}
            self.doc["errors"].append(f"device: {e}")

    def exp_throughput(self):
        """Rounds of: fio (512 B, QD128 and QD256), the engine (caches off, large batches), the raw
        io_uring reference at QD128 and QD256, fio again. The device is shared and its rate drifts
        by tens of percent within minutes, so each engine run is compared with the limit measured
        right before and after it (the larger of the two), and a round counts only when it is
        clean: other processes' reads during the engine run (diskstats minus our own) below 2 % of
        our requests and 10 % of our bytes. Rounds continue until `throughput_rounds` are clean
        (at most `throughput_max_rounds`); before each round we wait (bounded) for a quiet second."""
        cfg = self.cfg
        m = self.models["RM1"]
        B = cfg["throughput_batch"]
        per_batch = B * m.shape.lookups * m.shape.num_tables
        secs = cfg["throughput_seconds"]
        nb = max(2, int(math.ceil(secs * 200_000 / per_batch)) + 1)
        dev = self.devtuple()
        self.doc["host"]["loadavg"]["throughput"] = loadavg()
        fio, rounds = [], []
        waits = []
        if dev:
            waits.append(wait_quiet(dev, cfg["quiet_wait_s"]))
        log("throughput: fio 512 B")
        fio.append(self.fio_extra("round 0 before", qd1=not self.quick))
        k = 0
        while k < cfg["throughput_max_rounds"] and sum(r["clean"] for r in rounds) < cfg["throughput_rounds"]:
            tr = self.trace(m, B, nb=nb, seed_off=31 + k)
            if dev and k:
                waits.append(wait_quiet(dev, cfg["quiet_wait_s"]))
            log(f"throughput round {k}: recflash_vector, caches off, RM1 batch {B}, {secs}s")
            raw = self.run_method("recflash_vector", m, [tr], time_budget=secs, min_batches=2)
            rec = self.point_record(raw, raw["points"][0], m, B, m.shape.lookups)
            refs = {}
            for meth in ("uring", "uring_qd256"):
                try:
                    rr = self.run_method(meth, m, [tr], time_budget=secs / 2, min_batches=1)
                    refs[meth] = self.point_record(rr, rr["points"][0], m, B, m.shape.lookups)
                except Exception as e:
                    self.doc["errors"].append(f"throughput/{meth}: {e}")
            log(f"throughput round {k}: fio 512 B")
            fio.append(self.fio_extra(f"round {k} after"))
            adj = [f for f in fio[-2:] if f["clean"]] or fio[-2:]
            lim = max(f["limit_iops"] for f in adj)
            rounds.append({"recflash_vector": rec, **refs, "limit_iops_adjacent": lim,
                           "limit_adjacent_clean": all(f["clean"] for f in fio[-2:]),
                           "fraction_adjacent": rec["engine_reads_per_s"] / lim if lim else None,
                           "clean": bool(rec.get("clean", True))})
            log(f"throughput round {k}: {rec['engine_reads_per_s']:,.0f} reads/s, limit {lim:,.0f}, "
                f"{'clean' if rounds[-1]['clean'] else 'NOT clean: ' + str(rec.get('foreign_read_bytes')) + ' B foreign'}")
            k += 1
        if cfg.get("throughput_qd1_after", True):
            fio[-1]["rand512_qd1"] = fio_randread(fio[-1]["file"], os.path.getsize(fio[-1]["file"]) // 4096 * 4096,
                                                  512, 1, cfg["fio_runtime"], dev)
        self.doc["experiments"]["throughput"] = {"batch": B, "rounds": rounds, "fio": fio, "quiet_waits": waits,
                                                 "recflash_vector": rounds[-1]["recflash_vector"]}

    def exp_caches(self):
        cfg = self.cfg
        m = self.models["RM1"]
        if not self.caches_available():
            self.doc["experiments"]["caches"] = {"available": False}
            self.doc["notes"].append("SlsEngine has no cache options yet: cached configurations not measured")
            return
        B = cfg["cache_batch"]
        warm = self.trace(m, cfg["cache_warmup_batch"], dist="zipf", alpha=1.05, nb=cfg["cache_warmup_batches"],
                          seed_off=555)
        per_batch = B * m.shape.lookups * m.shape.num_tables
        nb = max(3, int(math.ceil(cfg["cache_measure_seconds"] * 400_000 / per_batch)))
        tr = self.trace(m, B, dist="zipf", alpha=1.05, nb=nb, seed_off=556)
        prof = self.trace(m, B, dist="zipf", alpha=1.05, nb=cfg["profile_batches"], seed_off=777)
        res = {"available": True, "model": "RM1", "dist": "zipf(1.05)", "batch": B,
               "warmup": {"batch": cfg["cache_warmup_batch"], "batches": cfg["cache_warmup_batches"],
                          "detail": "the row and device caches (and 'all') run the warm-up trace first, towards "
                                    "steady state; 'hot' is filled by profile() on a profiling trace; 'off' and "
                                    "'pooled' (bags of 80 Zipf ids do not repeat) run without"},
               "configs": {}, "runs": []}
        self.doc["host"]["loadavg"]["caches"] = loadavg()
        order = list(cfg["cache_configs"])
        for _ in range(cfg["cache_repeats"] - 1):  # off and row again, interleaved, against drift
            order += ["off", "row"]
        dev = self.devtuple()
        for which in order:
            kw = {} if which == "off" else self.cache_kwargs(m, which)
            if dev and which in ("off", "row"):
                res.setdefault("quiet_waits", []).append(wait_quiet(dev, cfg["quiet_wait_s"] / 4))
            log(f"caches: {which} {kw}")
            try:
                raw = self.run_method("recflash_vector", m, [tr], cache_kwargs=kw,
                                      warmup=warm if which in ("row", "device", "all") else None,
                                      profile=prof if which == "hot" else None, time_budget=cfg["cache_measure_seconds"],
                                      min_batches=2, label=f"recflash_vector+{which}")
                rec = self.point_record(raw, raw["points"][0], m, B, m.shape.lookups)
                rec["cache_kwargs"] = kw
                rec["warmup"] = raw.get("warmup")
                rec["config"] = which
                res["runs"].append(rec)
            except Exception as e:
                self.doc["errors"].append(f"caches/{which}: {e}")
        for which in cfg["cache_configs"]:
            runs = [r for r in res["runs"] if r["config"] == which]
            if runs:
                best = dict(runs[-1])
                best["lookups_per_s_runs"] = [r["lookups_per_s"] for r in runs]
                best["runs_clean"] = [r.get("clean") for r in runs]
                best["lookups_per_s"] = float(np.mean(best["lookups_per_s_runs"]))
                res["configs"][which] = best
        self.doc["experiments"]["caches"] = res

    # -- evaluation --------------------------------------------------------------------

    def qd_scaling(self, unbuf_rows_per_s, achieved) -> dict:
        """The device's QD1 vs deep-queue random 512 B IOPS, all fio runs of this run. Every row
        must be read (uniform ids over 4 M rows: blocks are almost never shared), so the latency
        ratio of a deep-queue method to a QD1 method cannot exceed IOPS(QD128/256) / IOPS(QD1)."""
        fios = list((self.doc["experiments"].get("throughput") or {}).get("fio", []))
        after = (self.doc["experiments"].get("batch_sweep") or {}).get("fio_after")
        if after:
            fios.append(after)
        rows = []
        for f in fios:
            q1 = (f.get("rand512_qd1") or {}).get("iops")
            deep = max([(f.get(q) or {}).get("iops") or 0 for q in ("rand512_qd128", "rand512_qd256")])
            if q1 and deep:
                rows.append({"when": f["when"], "qd1_iops": q1, "qd128_256_iops": deep, "ratio": deep / q1})
        if not rows:
            return {"device_qd_scaling": None}
        best = max(r["ratio"] for r in rows)
        near = next((r for r in rows if r["when"] == "after batch sweep"), rows[0])
        out = {
            "device_qd_scaling": rows,
            "device_qd_ratio_max": best,
            "device_qd_ratio_after_sweep": near["ratio"],
            "io_unbuf_rows_per_s_vs_fio_qd1": (unbuf_rows_per_s / near["qd1_iops"]) if unbuf_rows_per_s else None,
            "io_unbuf_is": "one pread per unique row at QD1, O_DIRECT, 512 B aligned (ids sorted and de-duplicated "
                           "per table like every method): the thesis' io_unbuf (lseek/read, Direct I/O, seed 004 "
                           "Table 6) — not a buffered read",
            "fraction_of_device_bound": (achieved / best) if achieved else None,
        }
        measured = ", ".join(f"{r['when']}: {r['ratio']:.2f}x" for r in rows)
        reachable = best >= TARGET_VS_IO_UNBUF
        out["bound_detail"] = (
            f"{TARGET_VS_IO_UNBUF:g}x needs IOPS(QD128/256) >= {TARGET_VS_IO_UNBUF:g} x IOPS(QD1) on the device; fio in "
            f"this run measured {measured} — "
            + ("the target is reachable in principle" if reachable else
               "below the target, so it is out of reach for any method that reads every row"))
        return out

    def evaluate(self):
        ex = self.doc["experiments"]
        targets = {}
        dev = self.doc.get("device") or {}
        thr = ex.get("throughput") or {}
        rounds = thr.get("rounds") or []
        cands = {}
        if dev.get("rand4k_iops"):
            cands["device.py rand4k QD64"] = dev["rand4k_iops"]
        for f in thr.get("fio", []):
            for q in ("rand512_qd128", "rand512_qd256"):
                r = f.get(q) or {}
                if r.get("iops"):
                    cands[f"fio {q} ({f['when']})"] = r["iops"]
        rv = thr.get("recflash_vector")
        if rounds and cands:
            use = [r for r in rounds if r["clean"]] or rounds
            fr = [r["fraction_adjacent"] for r in use if r.get("fraction_adjacent")]
            iops = [r["recflash_vector"]["engine_reads_per_s"] for r in use]
            cores = max(r["recflash_vector"]["cpu_util"] for r in rounds)
            frac = float(np.median(fr)) if fr else None
            strict = float(np.median(iops)) / max(cands.values())
            ref = {}
            for meth in ("uring", "uring_qd256"):
                v = [r[meth]["syscall_reads_per_s"] / r["limit_iops_adjacent"] for r in use
                     if r.get(meth) and r.get("limit_iops_adjacent")]
                ref[meth] = float(np.median(v)) if v else None
            targets["iops_fraction_caches_off"] = {
                "value": frac, "threshold": TARGET_IOPS_FRACTION, "passed": bool(frac and frac >= TARGET_IOPS_FRACTION),
                "detail": "median over clean rounds of engine device reads/s / the device limit measured right "
                          "before and after that run (the larger of the two; each the larger of fio 512 B QD128 "
                          "and QD256)",
                "rounds_used": "clean rounds" if any(r["clean"] for r in rounds) else "all rounds (none was clean)",
                "rounds_clean": [r["clean"] for r in rounds],
                "per_round_all": [r["fraction_adjacent"] for r in rounds],
                "per_round": fr, "engine_reads_per_s": iops,
                "unique_rows_per_s": [r["recflash_vector"]["unique_rows_per_s"] for r in use],
                "limit_adjacent": [r["limit_iops_adjacent"] for r in use],
                "strict_value": strict, "strict_passed": strict >= TARGET_IOPS_FRACTION,
                "strict_detail": "median engine reads/s / the largest device figure of the whole run",
                "iops_limit": max(cands.values()), "limit_candidates": cands, "batch": thr["batch"],
                "raw_io_uring_reference_fraction": ref}
            targets["cores_used"] = {"value": cores, "threshold": TARGET_MAX_CORES, "passed": cores <= TARGET_MAX_CORES,
                                     "detail": "process CPU seconds / wall seconds, worst throughput round"}
        else:
            targets["iops_fraction_caches_off"] = {"value": None, "passed": False, "detail": "not measured"}
            targets["cores_used"] = {"value": None, "passed": False, "detail": "not measured"}
        # bytes per row: the bytes the engine requested from the device (O_DIRECT: nothing between
        # it and the device) per unique row, worst point; the process's own storage reads
        # (/proc/self/io, which also counts page faults on program files another process's
        # drop_caches evicted) and diskstats (the whole device) are reported next to it.
        bs = ex.get("batch_sweep", {}).get("results", {}).get("recflash_vector", [])
        recs = [(f"batch_sweep b{r['batch']}", r) for r in bs] + [
            (f"throughput round {k}", r["recflash_vector"]) for k, r in enumerate(rounds)]

        def worst_of(key):
            vals = [(r.get(key), t) for t, r in recs if r.get(key) is not None]
            return max(vals) if vals else (None, None)

        worst, where = worst_of("engine_bytes_per_unique_row")
        proc_worst, proc_where = worst_of("bytes_per_unique_row")
        clean_disk = [((r["disk"]["read_bytes"] / r["unique_rows"]), t) for t, r in recs
                      if r.get("clean") and r.get("disk") and r["unique_rows"]]
        row_bytes = self.models["RM1"].shape.row_bytes
        targets["device_bytes_per_row"] = {
            "value": worst, "threshold": TARGET_BYTES_PER_ROW, "row_bytes": row_bytes, "where": where,
            "passed": worst is not None and worst <= TARGET_BYTES_PER_ROW,
            "detail": "bytes the engine read from the device (O_DIRECT) per unique row, worst point of the "
                      "vector-granular batch sweep and throughput rounds; per looked-up row is lower",
            "per_lookup_at_worst": next((r["engine"]["device_bytes"] / r["lookups"] for t, r in recs if t == where), None),
            "process_read_bytes_per_unique_row_worst": proc_worst, "process_worst_where": proc_where,
            "diskstats_bytes_per_unique_row_worst_clean": max(clean_disk)[0] if clean_disk else None}
        # latency at batch 64
        res = ex.get("batch_sweep", {}).get("results", {})

        def at(meth, b, key="mean", field="latency_ms"):
            for r in res.get(meth, []):
                if r["batch"] == b:
                    return r[field][key] if key else r.get(field)
            return None

        def ratio(x, y):
            return x / y if x and y else None

        bref = 64 if 64 in self.cfg["batch_sizes"] else max(self.cfg["batch_sizes"])
        v, u, mm = at("recflash_vector", bref), at("io_unbuf", bref), at("mmap", bref)
        ur = at("io_unbuf", bref, None, "unique_rows_per_s")
        lim = max(cands.values()) if cands else None
        targets["latency_vs_io_unbuf"] = {
            "value": ratio(u, v), "threshold": TARGET_VS_IO_UNBUF, "passed": bool(u and v and u / v >= TARGET_VS_IO_UNBUF),
            "batch": bref, "recflash_vector_ms": v, "io_unbuf_ms": u,
            "points_clean": {k: at(k, bref, None, "clean") for k in ("recflash_vector", "io_unbuf")},
            "p50_ratio": ratio(at("io_unbuf", bref, "p50"), at("recflash_vector", bref, "p50")),
            "device_ceiling": ratio(lim, ur),
            "device_ceiling_detail": "the best ratio any method could reach: the device's largest random-read "
                                     "IOPS figure of the run / io_unbuf's unique rows per second (one row per read)",
            **self.qd_scaling(ur, ratio(u, v))}
        lr = (ex.get("latency_rounds") or {}).get("rounds") or []
        if lr:
            use = [r for r in lr if r["clean"] and r["ratio"]] or [r for r in lr if r["ratio"]]
            val = float(np.median([r["ratio"] for r in use])) if use else None
            qd = [r["device_qd_ratio"] for r in use if r["device_qd_ratio"]]
            t = targets["latency_vs_io_unbuf"]
            t.update({
                "value": val, "passed": bool(val and val >= TARGET_VS_IO_UNBUF),
                "detail": "median over the latency rounds (io_unbuf and recflash_vector back to back on one "
                          "RM1 batch-64 trace, order alternating) of io_unbuf mean batch latency / "
                          "recflash_vector's; sweep_value is the batch sweep's figure (methods minutes apart)",
                "per_round": [r["ratio"] for r in lr], "rounds_clean": [r["clean"] for r in lr],
                "per_round_ms": [{"io_unbuf": r["io_unbuf"]["latency_ms"]["mean"],
                                  "recflash_vector": r["recflash_vector"]["latency_ms"]["mean"]} for r in lr],
                "device_qd_ratio_per_round": [r["device_qd_ratio"] for r in lr],
                "device_qd_ratio_median": float(np.median(qd)) if qd else None,
                "fraction_of_device_qd_ratio": (val / float(np.median(qd))) if val and qd else None,
                "sweep_value": ratio(u, v)})
        targets["latency_vs_mmap"] = {
            "value": ratio(mm, v), "threshold": TARGET_VS_MMAP, "passed": bool(mm and v and mm / v >= TARGET_VS_MMAP),
            "batch": bref, "recflash_vector_ms": v, "mmap_ms": mm,
            "points_clean": {k: at(k, bref, None, "clean") for k in ("recflash_vector", "mmap")},
            "p50_ratio": ratio(at("mmap", bref, "p50"), at("recflash_vector", bref, "p50")),
            "read_ahead_kb": (self.dev or {}).get("read_ahead_kb"),
            "vs_mmap_random": ratio(at("mmap_random", bref), v),
            "vs_mmap_random_detail": "extra, not the target: mmap with MADV_RANDOM (no read-around)"}
        c = ex.get("caches") or {}
        if c.get("available"):
            off = c["configs"].get("off")
            row = c["configs"].get("row")
            if off and row:
                sp = row["lookups_per_s"] / off["lookups_per_s"]
                targets["row_cache_speedup_zipf"] = {
                    "value": sp, "threshold": TARGET_ROW_CACHE_SPEEDUP, "passed": sp >= TARGET_ROW_CACHE_SPEEDUP,
                    "off_lookups_per_s": off["lookups_per_s"], "row_cache_lookups_per_s": row["lookups_per_s"],
                    "row_cache_hit_rate_during_measurement": row["cache_during_point"]["row_cache"]["hit_rate"],
                    "per_run_off": off.get("lookups_per_s_runs"), "per_run_row": row.get("lookups_per_s_runs"),
                    "runs_clean_off": off.get("runs_clean"), "runs_clean_row": row.get("runs_clean")}
            else:
                targets["row_cache_speedup_zipf"] = {"value": None, "passed": False, "detail": "a configuration failed"}
        else:
            targets["row_cache_speedup_zipf"] = {"value": None, "passed": None, "detail": "caches not available"}
        self.doc["targets"] = targets
        # headline table
        head = []
        for meth in ALL_METHODS:
            for r in res.get(meth, []):
                if r["batch"] in (1, 16, 64, 256):
                    head.append({"method": meth, "batch": r["batch"], "latency_ms": r["latency_ms"]["mean"],
                                 "latency_p50_ms": r["latency_ms"]["p50"], "batches": r["batches"],
                                 "clean": r.get("clean"), "foreign_read_bytes": r.get("foreign_read_bytes"),
                                 "lookups_per_s": r["lookups_per_s"], "bytes_per_lookup": r["bytes_per_lookup"],
                                 "rss_mb": r["rss_mb"]})
        self.doc["headline"] = head

    def run(self):
        t0 = time.perf_counter()
        self.setup()
        steps = [self.exp_device, self.exp_batch_sweep, self.exp_throughput, self.exp_latency_rounds,
                 self.exp_lookup_sweep,
                 self.exp_distributions, self.exp_caches, self.exp_models]
        for step in steps:
            try:
                step()
            except Exception as e:
                self.doc["errors"].append(f"{step.__name__}: {e!r}\n{traceback.format_exc()[-2000:]}")
                log(f"ERROR in {step.__name__}: {e!r}")
        self.evaluate()
        self.doc["host"]["loadavg_end"] = loadavg()
        self.doc["wall_seconds"] = time.perf_counter() - t0
        self.doc["notes"] += [
            "page cache dropped (echo 3 > /proc/sys/vm/drop_caches) before every batch of io_buf, mmap and "
            "mmap_random, outside the timed region: they are measured cold; the other methods read with O_DIRECT",
            "disk.* figures are /proc/diskstats deltas of the whole device and include other processes' I/O on this "
            "shared machine; proc_read_bytes / bytes_per_* are this process's own storage reads (/proc/self/io)",
            "ram/ratio/opt preload time is reported under method_info.*.preload, not in the batch latency",
            f"rows per table relative to the published shapes: {self.cfg['scales']} (lookups, dims, table counts "
            "unchanged)",
        ]


# ---------------------------------------------------------------------------------------
# Report and plot


def print_report(doc: dict) -> None:
    print(f"sls_io: {'quick' if doc['quick'] else 'full'} run, {doc['wall_seconds']:.0f}s, "
          f"load average {doc['host']['loadavg_start']} -> {doc['host']['loadavg_end']}")
    dev = doc.get("device") or {}
    print(f"device {doc.get('device_under_test', {}).get('name')}: rand4k QD64 {dev.get('rand4k_iops') or 0:,.0f} IOPS, "
          f"seq {dev.get('seq_read_MBps') or 0:,.0f} MB/s")
    for f in (doc["experiments"].get("throughput") or {}).get("fio", []):
        a, c = f.get("rand512_qd128", {}), f.get("rand512_qd256", {})
        line = f"  fio 512 B ({f['when']}): QD128 {a.get('iops') or 0:,.0f} IOPS, QD256 {c.get('iops') or 0:,.0f} IOPS"
        if f.get("rand512_qd1"):
            q1 = f["rand512_qd1"]
            line += f", QD1 {q1.get('iops') or 0:,.0f} IOPS ({q1.get('clat_mean_us') or 0:.0f} us)"
        print(line)
    pf = doc["experiments"].get("fio_pages_file")
    if pf:
        q = pf["rand512_qd128"]
        print(f"  fio 512 B QD128 over the store's page file ({pf['holes_bytes'] / pf['bytes']:.0%} holes): fio counts "
              f"{q.get('iops_fio') or 0:,.0f} IOPS, the device served {q.get('iops_device') or 0:,.0f}/s")
    for k, r in enumerate((doc["experiments"].get("throughput") or {}).get("rounds", [])):
        e = r["recflash_vector"]
        print(f"  throughput round {k}: engine {e['engine_reads_per_s']:,.0f} reads/s "
              f"({e['unique_rows_per_s']:,.0f} rows/s, {e['cpu_util']:.2f} cores) vs adjacent limit "
              f"{r['limit_iops_adjacent']:,.0f} = {r['fraction_adjacent']:.3f}; raw io_uring QD128 "
              f"{(r.get('uring') or {}).get('syscall_reads_per_s') or 0:,.0f}, QD256 "
              f"{(r.get('uring_qd256') or {}).get('syscall_reads_per_s') or 0:,.0f} reads/s")
    print(f"\n{'method':<16} {'batch':>5} {'mean ms':>9} {'p50 ms':>9} {'lookups/s':>11} {'dev B/lookup':>12} {'RSS MB':>8}")
    for h in doc.get("headline", []):
        print(f"{h['method']:<16} {h['batch']:>5} {h['latency_ms']:>9.2f} {h['latency_p50_ms']:>9.2f} "
              f"{h['lookups_per_s']:>11,.0f} {(h['bytes_per_lookup'] or 0):>12.0f} {h['rss_mb']:>8.0f}")
    print("\ntargets:")
    for k, t in doc.get("targets", {}).items():
        v = t.get("value")
        vs = f"{v:.3f}" if isinstance(v, (int, float)) else str(v)
        status = "n/a" if t.get("passed") is None else ("PASS" if t["passed"] else "FAIL")
        extra = ""
        if k == "iops_fraction_caches_off" and t.get("strict_value") is not None:
            extra = f"  [strict, vs the run's best device figure: {t['strict_value']:.3f}]"
        if k == "latency_vs_io_unbuf" and t.get("device_ceiling"):
            extra = f"  [device ceiling {t['device_ceiling']:.2f}"
            if t.get("device_qd_ratio_max"):
                extra += f", fio QD128-256/QD1 up to {t['device_qd_ratio_max']:.2f}"
            if t.get("device_qd_ratio_median"):
                extra += (f"; latency rounds: median of {', '.join(f'{x:.2f}' for x in t['per_round'] if x)}, "
                          f"device QD ratio median {t['device_qd_ratio_median']:.2f}, batch sweep {t['sweep_value']:.2f}")
            extra += "]"
        if k == "row_cache_speedup_zipf" and t.get("row_cache_hit_rate_during_measurement") is not None:
            extra = f"  [row cache hit rate {t['row_cache_hit_rate_during_measurement']:.2f}]"
        print(f"  {k:<28} {vs:>10}  (threshold {t.get('threshold')})  {status}{extra}")
    if doc["errors"]:
        print("\nerrors:")
        for e in doc["errors"]:
            print("  " + e.splitlines()[0])


def plot(doc: dict, path: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    ex = doc["experiments"]
    fig, axes = plt.subplots(2, 3, figsize=(19, 10.5))
    colors = {m: plt.cm.tab20((2 * i) % 20 + (1 if 2 * i >= 20 else 0)) for i, m in enumerate(METHODS)}
    colors["recflash_vector"] = "black"
    colors["recflash_page"] = "dimgray"
    styles = {m: ("-" if m.startswith("recflash") else "--") for m in METHODS}
    bs = ex.get("batch_sweep", {}).get("results", {})
    ax = axes[0][0]
    for meth, recs in bs.items():
        ax.plot([r["batch"] for r in recs], [r["latency_ms"]["p50"] for r in recs], styles[meth], marker="o",
                ms=3, color=colors[meth], label=meth, lw=2.2 if meth.startswith("recflash") else 1.2)
    ax.set_xscale("log", base=2)
    ax.set_yscale("log")
    ax.set_xlabel("batch size")
    ax.set_ylabel("latency per batch, median (ms)")
    ax.set_title("RM1 shape, uniform ids: latency vs batch size")
    ax.legend(fontsize=7, ncol=2)
    ax.grid(alpha=0.3, which="both")
    ax = axes[0][1]
    for meth, recs in bs.items():
        ax.plot([r["batch"] for r in recs], [r["lookups_per_s"] for r in recs], styles[meth], marker="o", ms=3,
                color=colors[meth], label=meth)
    thr = ex.get("throughput") or {}
    lim = (doc.get("targets", {}).get("iops_fraction_caches_off") or {}).get("iops_limit")
    if lim:
        ax.axhline(lim, color="k", ls=":", lw=1)
        ax.text(1, lim * 1.05, f"device random-read IOPS limit {lim:,.0f}", fontsize=7)
    ax.set_xscale("log", base=2)
    ax.set_yscale("log")
    ax.set_xlabel("batch size")
    ax.set_ylabel("looked-up rows / s")
    ax.set_title("RM1: throughput vs batch size")
    ax.grid(alpha=0.3, which="both")
    ax = axes[0][2]
    ls = ex.get("lookup_sweep", {})
    for meth, recs in ls.get("results", {}).items():
        ax.plot([r["lookups_per_bag"] for r in recs], [r["latency_ms"]["p50"] for r in recs], styles[meth], marker="o",
                ms=3, color=colors[meth], label=meth)
    ax.set_xscale("log", base=2)
    ax.set_yscale("log")
    ax.set_xlabel("lookups per bag")
    ax.set_ylabel("latency per batch, median (ms)")
    ax.set_title(f"RM1 shape, batch {doc['config']['lookup_sweep_batch']}: latency vs lookups")
    ax.legend(fontsize=7)
    ax.grid(alpha=0.3, which="both")
    # bytes per lookup and memory at batch 64 (or the largest quick batch)
    bref = 64 if 64 in doc["config"]["batch_sizes"] else max(doc["config"]["batch_sizes"])
    names, bpl, dbpl, rss = [], [], [], []
    for meth, recs in bs.items():
        r = next((x for x in recs if x["batch"] == bref), None)
        if r:
            names.append(meth)
            bpl.append(r["bytes_per_lookup"] or 0)
            dbpl.append(r["disk_bytes_per_lookup"] or 0)
            rss.append(max(r["hwm_mb"], r["rss_mb"]))
    ax = axes[1][0]
    x = np.arange(len(names))
    ax.bar(x - 0.2, bpl, 0.4, label="process storage reads / lookup", color="tab:blue")
    ax.bar(x + 0.2, dbpl, 0.4, label="device (diskstats, incl. others) / lookup", color="tab:gray")
    ax.axhline(512, color="r", ls=":", lw=1)
    ax.set_yscale("log")
    ax.set_xticks(x)
    ax.set_xticklabels(names, rotation=45, ha="right", fontsize=7)
    ax.set_ylabel("bytes read per looked-up row")
    ax.set_title(f"RM1 batch {bref}: read bytes per lookup (row = {doc['data']['RM1']['shape']['dim'] * 4} B)")
    ax.legend(fontsize=7)
    ax = axes[1][1]
    ax.bar(x, rss, color=[colors[n] for n in names])
    ax.set_yscale("log")
    ax.set_xticks(x)
    ax.set_xticklabels(names, rotation=45, ha="right", fontsize=7)
    ax.set_ylabel("peak RSS (MiB)")
    ax.set_title("memory used (VmHWM of the process)")
    ax = axes[1][2]
    ds = ex.get("distributions", {}).get("results", {})
    c = ex.get("caches") or {}
    if ds:
        labels = list(ds)
        meths = sorted({m for r in ds.values() for m in r}, key=lambda m: (m.startswith("recflash"), m))
        w = 0.8 / max(1, len(meths))
        for i, meth in enumerate(meths):
            vals = [ds[l].get(meth, {}).get("lookups_per_s") or 0 for l in labels]
            ax.bar(np.arange(len(labels)) + i * w - 0.4 + w / 2, vals, w, label=meth)
        ax.set_xticks(np.arange(len(labels)))
        ax.set_xticklabels(labels, rotation=30, ha="right", fontsize=7)
        ax.set_yscale("log")
        ax.set_ylabel("looked-up rows / s")
        ax.set_title(f"RM1 batch {ex['distributions']['batch']}: id distributions")
        ax.legend(fontsize=7)
        if c.get("available"):
            txt = "caches, zipf(1.05), warm:\n" + "\n".join(
                f"{k}: {v['lookups_per_s']:,.0f} rows/s" for k, v in c["configs"].items())
            ax.text(0.02, 0.02, txt, transform=ax.transAxes, fontsize=7, va="bottom",
                    bbox=dict(facecolor="white", alpha=0.8))
    fig.suptitle(f"recflash SLS I/O methods study ({'quick' if doc['quick'] else 'full'}; load avg "
                 f"{doc['host']['loadavg_start'][0]}-{doc['host']['loadavg_end'][0]}; io_buf/mmap cold: page cache "
                 "dropped before each batch)", fontsize=11)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--quick", action="store_true", help="small tables and few points (a test-sized run)")
    ap.add_argument("--json", help="write the results here")
    ap.add_argument("--plot", help="write the figure here (PNG)")
    ap.add_argument("--dir", default="/work/sls-bench/run", help="data directory on the disk under test")
    ap.add_argument("--scale", type=float, default=None, help="rows per table relative to the published shapes "
                    "(default 0.25, quick 1/64)")
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--keep", action="store_true", help="keep the data directory")
    ap.add_argument("--reuse", action="store_true", help="reuse tables already in --dir (same shapes and seed)")
    ap.add_argument("--worker", help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.worker:
        return engine_worker(args.worker)
    if not args.json:
        ap.error("--json is required")
    b = Bench(args)
    try:
        b.run()
    finally:
        if not (args.keep or args.reuse):
            shutil.rmtree(b.dir, ignore_errors=True)
    doc = b.doc
    os.makedirs(os.path.dirname(os.path.abspath(args.json)), exist_ok=True)
    with open(args.json, "w") as f:
        json.dump(doc, f, indent=1, default=float)
    if args.plot:
        try:
            plot(doc, args.plot)
        except Exception as e:
            doc["errors"].append(f"plot: {e!r}")
            with open(args.json, "w") as f:
                json.dump(doc, f, indent=1, default=float)
    print_report(doc)
    return 0


if __name__ == "__main__":
    sys.exit(main())
