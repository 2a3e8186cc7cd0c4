"""Compaction benchmark: READER vs the paper's LSM strategy vs real RocksDB vs OPT (issue 3).

    python benchmarks/compaction.py [--quick] [--dataset XS|S|M|L|XL|XXL] [--items N]
        [--features F] [--item-bytes B] [--updates U | --update-factor X]
        [--update-dist uniform|zipf] [--write-buffer-frac 0.025] [--page-size B]
        [--mode io|accounting] [--json OUT] [--plot OUT.png]
        [--keys sparse|dense] [--strategies LIST] [--sweep LIST] [--reads R] [--read-rounds K]
        [--sensitivity] [--workdir DIR] [--replot JSON]

Every strategy runs the same workload (benchmarks/baselines/workload.py): F features of
lognormal sizes, N items of `item_bytes` (8-byte key + value), each feature loaded in one
batch; then U updates of existing items (uniform or Zipf) in batches, through a write buffer
of write_buffer_frac x the dataset bytes for every strategy; then feature reads — every
feature once, then Zipf-weighted repeated reads — all real O_DIRECT reads of this disk, the
OS page cache dropped before each strategy's reads.

io mode runs in two phases. Build: each strategy in turn loads the data and applies the updates
(timed: update_time_s) and stays on disk. Reads: the read sequence is cut into --read-rounds
slices; each round gives every strategy the same slice, in rotated order, so bursts of other
users' I/O on this shared disk spread over all strategies instead of skewing one of them.

Strategies (rows of the JSON, `config` = "default" for each strategy's default):
  reader             recflash.reader.Store, the installed engine's default StoreOptions (+ page
                     size, write buffer); defaults are read from the engine, never hard-coded
  reader (sweep)     --sweep: merge_threshold values, the read-optimised end with
                     merge_low_benefit_frac varied, and `compact()` after the updates; `config`
                     names the setting
  reader-nopin       pinner_enabled=False        reader-nomerge   merger_enabled=False
  lsm                the paper's LSM strategy (benchmarks/baselines/lsm.py)
  rocksdb            real RocksDB 7.8, leveled; rocksdb-universal: universal compaction
                     (benchmarks/csrc/rocksdb_bench.cc, compiled on first use into build/)
  opt                read-optimal, in-place RMW: config "default" = one page written per
                     updated item (counted); "batched-rmw" = one write per dirty page per buffer
                     flush (executed) (benchmarks/baselines/opt.py)
lsm and opt read through benchmarks/csrc/page_reader.cc (io_uring, O_DIRECT, QD 32, requests
of <= 256 KiB and on one ring as much in flight as the engine's scans on one lane keep:
StoreOptions.single_lane_inflight_bytes of read_inflight_bytes).

Metrics per row: read_time_s (sum over the feature reads of the wall time to deliver the
feature's valid items, keys ascending), read_throughput_MBps (useful bytes / read time,
MB = 1e6), read_amplification (device bytes read / useful bytes; useful = 8 + value bytes per
item), read_vs_opt (bytes read / opt's bytes read for the same reads), update_amplification
(device bytes written during the update phase — flushes, merges, compactions, reclamation;
WALs excluded — / (updates x item_bytes)), extra_writes_per_update (update_amplification - 1:
item-sized writes beyond the item itself, the paper's Fig. 6c metric; item size in
item_bytes), space_amplification (bytes on the device / live item bytes),
metadata_bytes_per_item (DRAM metadata / items), update_time_s (wall time of the update
phase including the final flush and any merging/compaction it triggers). Diagnostics per row:
read_cpu_s, read_io_time_s (lsm/opt), read_engine_time_s (reader), read_breakdown (by feature
size), pages_read_vs_ideal, verify_errors (every read is checked against the expected
contents), the engines' own counters. READER rows also carry read_device_floor_s: after each
round, the pages the round's scans read (Store.key_ranges) are read again by page_reader
--io-only — the same requests and in-flight budget, no CPU work — so each run shows what its
layout's device reads alone cost on this disk, apart from what the engine adds; and
read_time_native_s: the round's scans again through the engine's C++ API in one C++ loop
(benchmarks/csrc/engine_reader.cc, checked against the timed reads), driven as page_reader
drives opt's and lsm's reads — the engine's share of read time, apart from the Python API's.

--mode accounting counts pages and bytes without I/O: lsm and opt are numpy simulations of the
same policies; READER uses the engine's own accounting mode (StoreOptions.accounting) when the
installed engine has it. --dataset accepts a comma list in accounting mode (each size in its
own process, with its time and peak memory). --sensitivity (accounting) varies the update
volume (0.25, 2, 10 x N) and the write buffer (1, 1/2, 1/4, 1/8 x, the paper's Fig. 7).

Targets (printed pass/fail, never loosened), READER default, uniform updates, io mode:
  read time <= 0.62 x lsm; read amplification and read time <= rocksdb (leveled);
  update amplification <= rocksdb / 5; every READER sweep point dominates a RocksDB point
  (<= in read time and update amplification); READER's read-optimised end >= 0.95 x opt
  read throughput. Issue 14: 2a READER default read time <= 1.25 x (its read amplification /
  the compact() run's) x the compact() run's read time; 2b opt throughput >= the compact()
  run's; 2c READER default read time <= 1.25 x (read amplification / opt's) x opt's read time.
  A failed target carries the evidence (bytes, CPU, engine counters, device floors).
"""
from __future__ import annotations

import argparse
import ctypes
import dataclasses
import datetime
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
import traceback

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
if HERE not in sys.path:
    sys.path.insert(0, HERE)

from baselines.common import (NATIVE_RESULT, PLAN_EXTENT, build_harness, drop_caches, items_checksum_fn,  # noqa: E402
                              log, maxrss_mb, plan_header, plan_op, run_page_reader, table_checksum_fn)
from baselines.lsm import LsmStrategy  # noqa: E402
from baselines.opt import OptStrategy  # noqa: E402
from baselines.workload import Workload, WorkloadConfig  # noqa: E402

DATASETS = {"XS": 80_000_000, "S": 160_000_000, "M": 310_000_000, "L": 510_000_000,
            "XL": 800_000_000, "XXL": 1_600_000_000}
DEFAULT_IO_ITEMS = 4_000_000
ITEMS_PER_FEATURE = 40_000  # default F = N / 40 000 (clamped to [16, 2000])
PAPER_READS = 60_000  # the paper's feature reads at XS (80 M items)
#: READER sweep: merge_threshold values (other options at the engine's defaults), the
#: read-optimised end with merge_low_benefit_frac varied (1.0: any page may be gathered), and
#: compact() after the updates (the engine's full merge, e.g. before a training epoch), and
#: the merger gathering the emptiest pages first whatever their place in the feature's runs
#: (merge_run_weight 0; the default 1 gathers pages outside the runs first: fewer device reads
#: per scan for some more rewriting).
DEFAULT_SWEEP = "1.1,1.25,2,3,mt=1.1;lbf=1.0,rw=0,compact"
QUICK = dict(items=200_000, update_factor=1.0, sweep="1.1,3,mt=1.1;lbf=1.0,compact")
ALL_STRATEGIES = ["opt", "lsm", "rocksdb", "rocksdb-universal", "reader", "reader-sweep",
                  "reader-nopin", "reader-nomerge"]

TARGET_READ_VS_LSM = 0.62
TARGET_UPDATE_VS_ROCKSDB = 1 / 5
TARGET_THROUGHPUT_VS_OPT = 0.95


# ----------------------------------------------------------------------------- rows

def make_row(wl: Workload, strategy: str, config: str, mode: str, dataset: str, *, read_time, bytes_read,
             useful_bytes, pages_read, update_bytes, update_time, space_bytes, metadata_bytes, **extra) -> dict:
    user = wl.U * wl.item_bytes
    ua = update_bytes / user if user else None
    row = {
        "strategy": strategy, "config": config, "dataset": dataset, "mode": mode,
        "items": wl.N, "item_bytes": wl.item_bytes, "updates": wl.U, "update_dist": wl.cfg.update_dist,
        "read_time_s": read_time,
        "read_throughput_MBps": (useful_bytes / read_time / 1e6) if read_time else None,
        "read_amplification": bytes_read / useful_bytes if useful_bytes else None,
        "read_vs_opt": None,
        "update_amplification": ua,
        "extra_writes_per_update": (ua - 1.0) if ua is not None else None,
        "space_amplification": space_bytes / (wl.N * wl.item_bytes),
        "metadata_bytes_per_item": metadata_bytes / wl.N,
        "update_time_s": update_time,
        "bytes_read": int(bytes_read), "useful_bytes": int(useful_bytes), "pages_read": int(pages_read),
        "update_bytes_written": int(update_bytes), "user_bytes_updated": int(user),
        "reads": int(len(wl.reads)), "features": wl.F, "page_size": wl.cfg.page_size,
        "write_buffer_bytes": wl.buffer_bytes, "keys": wl.cfg.keys,
    }
    row.update(extra)
    return row


def verify(expected_items, expected_sum, items, sums) -> int:
    bad = (np.asarray(items, np.int64) != expected_items) | (np.asarray(sums, np.uint64) != expected_sum)
    return int(bad.sum())


# ----------------------------------------------------------------------------- runners
#
# Every strategy is a Runner: build() loads the data and applies the updates (kept on disk);
# read(idx) performs the feature reads wl.reads[idx]; rows() gives its JSON rows. In io mode
# all strategies are built first, then the reads run in rounds — each round gives every
# strategy the same slice of the read sequence, in rotated order — so bursts of other users'
# I/O on this shared disk spread over all strategies instead of skewing one.

class ReadLog:
    """Per-read results, filled slice by slice."""

    def __init__(self, n: int):
        self.seconds = np.full(n, np.nan)
        self.io_seconds = np.full(n, np.nan)
        self.engine_seconds = np.full(n, np.nan)
        self.bytes = np.zeros(n, np.int64)
        self.pages = np.zeros(n, np.int64)
        self.requests = np.full(n, -1, np.int64)  # device reads (runs of adjacent pages); -1: not reported
        self.io_wait = np.full(n, np.nan)  # engine: time the scan's thread was blocked on the device
        self.device_floor = np.full(n, np.nan)  # the same page reads replayed with no CPU work (reader)
        self.native = np.full(n, np.nan)  # the same scans through the engine's C++ API, no Python (reader)
        self.items = np.zeros(n, np.int64)
        self.sums = np.zeros(n, np.uint64)
        self.cpu_s = 0.0
        self.rounds = 0

    def totals(self, wl: Workload) -> dict:
        out = {
            "read_time": float(np.nansum(self.seconds)),
            "bytes_read": int(self.bytes.sum()), "pages_read": int(self.pages.sum()),
            "useful_bytes": int(self.items.sum()) * wl.item_bytes,
            "read_time_first_pass_s": float(np.nansum(self.seconds[:wl.F])),
            "read_cpu_s": self.cpu_s, "read_rounds": self.rounds,
            "read_breakdown": read_breakdown(wl, self.seconds, self.bytes, self.items),
            "verify_errors": verify(wl.sizes[wl.reads], wl.expected[wl.reads], self.items, self.sums),
        }
        if (self.requests >= 0).all():
            # On a device whose requests have a fixed cost, how many reads the bytes took
            # decides read time as much as the bytes do.
            out["read_requests"] = int(self.requests.sum())
            out["bytes_per_read_request"] = float(self.bytes.sum() / max(1, self.requests.sum()))
        if not np.isnan(self.io_wait).all():
            # Of the engine's time, what the scan's own thread spent blocked on the device: the
            # rest is the engine's work (plans, checksums, placing records) and what waits on it.
            out["read_io_wait_s"] = float(np.nansum(self.io_wait))
        if not np.isnan(self.io_seconds).all():
            out["read_io_time_s"] = float(np.nansum(self.io_seconds))
        if not np.isnan(self.device_floor).all():
            # What the device alone took for the same page reads (replayed without CPU work): the
            # share of read time the layout decides; the rest is the engine's.
            out["read_device_floor_s"] = float(np.nansum(self.device_floor))
        if not np.isnan(self.engine_seconds).all():
            out["read_engine_time_s"] = float(np.nansum(self.engine_seconds))
        if not np.isnan(self.native).all():
            # The same scans driven from C++ as page_reader drives opt's (engine_reader.cc): the
            # engine's share of read time; the rest is the Python API and the pauses between reads.
            out["read_time_native_s"] = float(np.nansum(self.native))
        return out


class Runner:
    strategy = ""
    config = "default"

    def __init__(self, wl: Workload, mode: str, dataset: str, workdir: str, drop: bool):
        self.wl, self.mode, self.dataset, self.workdir, self.drop = wl, mode, dataset, workdir, drop
        self.io = mode == "io"
        self.log = ReadLog(len(wl.reads))
        self.t_build = 0.0
        self.t_read = 0.0

    @property
    def label(self) -> str:
        return self.strategy if self.config == "default" else f"{self.strategy}[{self.config}]"

    def build(self) -> None:
        raise NotImplementedError

    def read(self, idx: np.ndarray) -> None:
        raise NotImplementedError

    def rows(self) -> list[dict]:
        raise NotImplementedError

    def cleanup(self) -> None:
        pass

    def _finish(self, row: dict) -> dict:
        row["wall_s"] = self.t_build + self.t_read
        row["build_wall_s"] = self.t_build
        row["read_phase_wall_s"] = self.t_read
        row["peak_rss_mb"] = row.get("peak_rss_mb") or maxrss_mb()
        return row


class PageFileRunner(Runner):
    """lsm and opt: Python/numpy write paths, reads through the C++ O_DIRECT reader."""

    def __init__(self, kind: str, *a):
        super().__init__(*a)
        self.strategy = kind
        sub = os.path.join(self.workdir, kind) if self.io else None
        self.s = LsmStrategy(self.wl, self.mode, sub) if kind == "lsm" else OptStrategy(self.wl, self.mode, sub)

    def build(self) -> None:
        t = time.perf_counter()
        self.load_time = self.s.load()
        self.update_time = self.s.update()
        self.st = self.s.stats()
        if self.strategy == "lsm":
            log(f"lsm: load {self.load_time:.1f}s, {self.wl.U} updates {self.update_time:.1f}s, "
                f"{self.st['update']['merges']} merges, {self.st['live_files']} live files")
        else:
            log(f"opt: {self.wl.U} updates (batched RMW {'executed' if self.io else 'counted'}) in "
                f"{self.update_time:.1f}s")
        if self.io:
            self.plan = os.path.join(self.workdir, f"{self.strategy}-plan.bin")
            self.files_txt = os.path.join(self.workdir, f"{self.strategy}-files.txt")
        self.t_build += time.perf_counter() - t

    def read(self, idx: np.ndarray) -> None:
        t = time.perf_counter()
        build_harness("page_reader", ["-luring"])  # (built before the caches are dropped)
        out = os.path.join(self.workdir, f"{self.strategy}-out.bin")
        self.s.write_plan(self.wl.reads[idx], self.files_txt, self.plan)
        if self.drop:
            self.dropped = drop_caches()
        # What the engine's scans on one lane (one ring, as page_reader) keep in flight, so both
        # sides read with the same I/O policy.
        from recflash.reader import StoreOptions

        budget = StoreOptions().single_lane_budget()
        res, info = run_page_reader(self.files_txt, self.plan, out, "--inflight-bytes", str(budget))
        L = self.log
        L.seconds[idx], L.io_seconds[idx] = res["seconds"], res["io_seconds"]
        L.bytes[idx], L.pages[idx], L.items[idx], L.sums[idx] = res["bytes"], res["pages"], res["items"], res["checksum"]
        L.cpu_s += info.get("user_s", 0) + info.get("sys_s", 0)
        L.rounds += 1
        self.reader_rss = max(getattr(self, "reader_rss", 0), info["maxrss_kb"] / 1024)
        self.t_read += time.perf_counter() - t

    def _reads(self) -> dict:
        wl = self.wl
        if self.io:
            r = self.log.totals(wl)
            r["page_reader_maxrss_mb"] = getattr(self, "reader_rss", None)
            r["page_cache_dropped"] = getattr(self, "dropped", False)
            return r
        ppf = self.s.pages_per_feature()
        pages = int(ppf[wl.reads].sum())
        return {"read_time": None, "bytes_read": pages * wl.cfg.page_size, "pages_read": pages,
                "useful_bytes": int(wl.sizes[wl.reads].sum()) * wl.item_bytes}

    def rows(self) -> list[dict]:
        wl, s, st = self.wl, self.s, self.st
        r = self._reads()
        common = dict(read_time=r.pop("read_time"), bytes_read=r.pop("bytes_read"),
                      useful_bytes=r.pop("useful_bytes"), pages_read=r.pop("pages_read"),
                      space_bytes=s.space_bytes(), metadata_bytes=s.metadata_bytes(), load_time_s=self.load_time, **r)
        if self.strategy == "lsm":
            ideal = OptStrategy(wl, "accounting", None).pages_per_feature()
            return [self._finish(make_row(
                wl, "lsm", "default", self.mode, self.dataset, update_bytes=st["update"]["bytes_written"],
                update_time=self.update_time if self.io else None, update_phase_wall_s=self.update_time,
                pages_read_vs_ideal=float(s.pages_per_feature()[wl.reads].sum() / ideal[wl.reads].sum()),
                lsm_stats=st, notes="paper's LSM strategy; pages hold page_size // item_bytes items, no header; "
                "metadata assumes an exact key -> file map (12 B/item sparse, 4 B/item dense); read time = "
                "I/O + version resolution (loser-tree merge, newest file wins), read_io_time_s = I/O alone",
                **common))]
        return [
            self._finish(make_row(
                wl, "opt", "default", self.mode, self.dataset, update_bytes=st["per_item_bytes_written"],
                update_time=None, opt_stats=st, writes="counted: one page written per updated item (the paper's "
                f"way); update amplification = page_size / item_bytes = {wl.cfg.page_size}/{wl.item_bytes}",
                **common)),
            self._finish(make_row(
                wl, "opt", "batched-rmw", self.mode, self.dataset, update_bytes=st["batched_bytes_written"],
                update_time=self.update_time if self.io else None, opt_stats=st,
                writes=("executed: each buffer flush reads, patches and writes every dirty page once (O_DIRECT)")
                if self.io else "counted: one page write per dirty page per flush", **common)),
        ]

    def cleanup(self) -> None:
        self.s.cleanup()
        for p in (getattr(self, "plan", None), getattr(self, "files_txt", None)):
            if p and os.path.exists(p):
                os.unlink(p)


# ----------------------------------------------------------------------------- rocksdb

def rocksdb_cache_bytes(wl: Workload, requested) -> int:
    """The block cache stays small so reads hit the disk: 8 MiB, but at most 1/256 of the
    dataset (at this benchmark's scaled-down sizes 8 MiB would hold the hot, Zipf-repeated
    features and measure the cache instead of the layout; no other strategy caches)."""
    if requested is not None:
        return int(requested)
    return int(max(64 << 10, min(8 << 20, wl.N * wl.item_bytes // 256)))


class RocksRunner(Runner):
    def __init__(self, style: str, wl_dir: str, cache_bytes, *a):
        super().__init__(*a)
        from baselines.rocksdb import RocksDbStrategy

        self.style = style
        self.cache = rocksdb_cache_bytes(self.wl, cache_bytes)
        self.s = RocksDbStrategy(self.wl, style, self.workdir, wl_dir, cache_bytes=self.cache)
        self.strategy = self.s.name
        self.hits = self.misses = 0
        self.block_read_bytes = 0
        self.read_rss = 0

    def build(self) -> None:
        t = time.perf_counter()
        self.info = self.s.write()
        up = self.info["update"]
        log(f"{self.strategy}: load {self.info['load']['seconds']:.1f}s, {self.wl.U} updates {up['seconds']:.1f}s, "
            f"files/level {self.info['after_update']['files_per_level']}")
        self.t_build += time.perf_counter() - t

    def read(self, idx: np.ndarray) -> None:
        t = time.perf_counter()
        if self.drop:
            self.dropped = drop_caches()
        res = self.s.read(self.wl.reads[idx], os.path.join(self.workdir, "rocks-out.bin"),
                          os.path.join(self.workdir, "rocks-plan.bin"))
        ri = self.s.read_info
        L = self.log
        L.seconds[idx], L.bytes[idx], L.items[idx], L.sums[idx] = res["seconds"], res["bytes"], res["items"], res["checksum"]
        L.pages[idx] = res["bytes"] // self.wl.cfg.page_size
        L.cpu_s += ri.get("read_cpu_s", 0.0)
        L.rounds += 1
        self.hits += ri.get("block_cache_data_hit", 0)
        self.misses += ri.get("block_cache_data_miss", 0)
        self.block_read_bytes += int(res["block_read_bytes"].sum())
        self.read_rss = max(self.read_rss, ri["maxrss_kb"] / 1024)
        self.t_read += time.perf_counter() - t

    def rows(self) -> list[dict]:
        wl, info, rinfo = self.wl, self.info, self.s.read_info
        up = info["update"]
        r = self.log.totals(wl)
        row = make_row(
            wl, self.strategy, "default", "io", self.dataset, read_time=r.pop("read_time"),
            bytes_read=r.pop("bytes_read"), useful_bytes=r.pop("useful_bytes"), pages_read=r.pop("pages_read"),
            update_bytes=up["flush_write_bytes"] + up["compact_write_bytes"], update_time=up["seconds"],
            space_bytes=info["after_update"]["total_sst_bytes"], metadata_bytes=rinfo["db"]["table_readers_mem"],
            load_time_s=info["load"]["seconds"], page_cache_dropped=getattr(self, "dropped", False), **r,
            rocksdb={"write": info, "read_last_round": rinfo, "block_read_bytes": self.block_read_bytes,
                     "block_cache_data_hit": self.hits, "block_cache_data_miss": self.misses,
                     "compaction_stats_tail": getattr(self.s, "compaction_stats", "")[-3000:],
                     "options": {"compaction_style": self.style, "block_size": wl.cfg.page_size,
                                 "write_buffer_size": wl.buffer_bytes, "block_cache_bytes": self.cache,
                                 "compression": "none", "prefix_extractor": "fixed:4",
                                 "use_direct_reads": True, "use_direct_io_for_flush_and_compaction": True,
                                 "max_background_jobs": 2, "wal": "on, not synced (excluded from amplification)",
                                 "other": "RocksDB 7.8.3 defaults"}},
            notes="read bytes = /proc/self/io read_bytes deltas around each read (device reads incl. O_DIRECT); "
                  "update bytes = statistics flush + compaction write bytes; metadata = "
                  "rocksdb.estimate-table-readers-mem (index blocks held by the table readers); the reads run in "
                  "one harness process per read round (block cache cold at each round)")
        row["peak_rss_mb"] = max(info["maxrss_kb"] / 1024, self.read_rss)
        return [self._finish(row)]

    def cleanup(self) -> None:
        self.s.cleanup()


# ----------------------------------------------------------------------------- reader

SWEEP_ALIASES = {"mt": "merge_threshold", "lbf": "merge_low_benefit_frac", "tf": "merge_target_frac",
                 "slack": "merge_min_slack_pages", "rw": "merge_run_weight", "pin": "pinner_enabled",
                 "merge": "merger_enabled"}
COMPACT = "compact() before reads"


def reader_defaults() -> dict:
    """The installed engine's StoreOptions defaults (the engine evolves; never hard-coded)."""
    import dataclasses

    from recflash.reader import StoreOptions

    return {f.name: f.default for f in dataclasses.fields(StoreOptions)}


def engine_info() -> dict:
    """Which engine ran: the repository commit, whether reader/ had local changes, and the
    installed package (the venv may lag or lead the checkout)."""
    info = {}
    try:
        from recflash.reader import store as _store

        info["installed_store_py"] = _store.__file__
        info["installed_mtime"] = datetime.datetime.fromtimestamp(
            os.path.getmtime(_store.__file__)).isoformat(timespec="seconds")
    except Exception as e:  # pragma: no cover
        info["installed_error"] = str(e)
    repo = os.path.dirname(HERE)
    try:
        info["git_head"] = subprocess.run(["git", "-C", repo, "rev-parse", "HEAD"], capture_output=True,
                                          text=True).stdout.strip()
        info["git_head_subject"] = subprocess.run(["git", "-C", repo, "log", "-1", "--format=%s"],
                                                  capture_output=True, text=True).stdout.strip()
        info["reader_dirty"] = bool(subprocess.run(["git", "-C", repo, "status", "--porcelain", "reader"],
                                                   capture_output=True, text=True).stdout.strip())
    except Exception as e:  # pragma: no cover
        info["git_error"] = str(e)
    return info


def reader_configs(sweep: str, defaults: dict) -> list[tuple[str, str, dict]]:
    """--sweep tokens: a number (merge_threshold), `compact` (default options + compact()
    after the updates), or `key=value;key=value` StoreOptions overrides (aliases mt, lbf, tf,
    slack). Tokens equal to the defaults are skipped (the default row covers them)."""
    out = []
    for tok in [t.strip() for t in sweep.split(",") if t.strip()]:
        if tok == "compact":
            out.append(("reader", COMPACT, {"_compact": True}))
            continue
        over = {}
        if "=" not in tok:
            over["merge_threshold"] = float(tok)
        else:
            for kv in tok.split(";"):
                k, v = kv.split("=", 1)
                k = SWEEP_ALIASES.get(k.strip(), k.strip())
                if k not in defaults:
                    raise SystemExit(f"--sweep: unknown StoreOptions field {k!r}")
                d = defaults[k]
                over[k] = (v.strip().lower() in ("1", "true", "yes")) if isinstance(d, bool) else type(d)(float(v))
        over = {k: v for k, v in over.items() if defaults.get(k) != v}
        if not over:
            continue
        name = ",".join(f"{k}={v:g}" if isinstance(v, float) else f"{k}={v}" for k, v in over.items())
        out.append(("reader", name, over))
    return out


def _typed(wl: Workload, vals: np.ndarray):
    vals = np.ascontiguousarray(vals)
    if wl.value_bytes == 8:
        return vals.view(np.int64).reshape(-1)
    return vals.view(np.float32).reshape(len(vals), wl.value_bytes // 4)


def _arrow_data(col, itemsize: int, keep: list) -> tuple[int, int]:
    """(address of the first value, length) of a column of fixed-width values without nulls.
    A column of several chunks is combined into a new array, appended to `keep`: the address
    is valid while the caller holds it."""
    arr = col.chunk(0) if col.num_chunks == 1 else col.combine_chunks()
    keep.append(arr)
    buf = arr.buffers()[1]  # (None for an empty array of no chunks)
    return (buf.address + arr.offset * itemsize if buf is not None else 0), len(arr)


_TC_ITEMS, _TC_SUM = ctypes.c_uint64(), ctypes.c_uint64()  # table_checksum_fn's outputs


def _table_checksum(wl: Workload, tab) -> tuple[int, int]:
    """Items and checksum of a READER scan's table, the check page_reader makes of OPT's and
    LSM's reads after its timer (the sum of item_checksums() in benchmarks/baselines/common.py).

    It runs between two timed reads, with the device idle, so it must cost what page_reader's
    C++ check costs: this virtual disk serves a read markedly slower after an idle gap. A busy
    wait between the reads of the compact() store (875 reads, medians of 4 rounds) gave 598 /
    590 us per read at 0 / 50 us, 699 / 682 / 679 us at 100 / 150 / 300 us and 728 us at 1 ms.
    The check took 0.28-2.3 ms through pyarrow's to_numpy() (its conversions set off Python
    garbage collections) and ~140 us through numpy views and two reductions; it is now one call of
    benchmarks/csrc/item_checksum.cc on the Arrow buffers (~12 us for 40 k items; the loop's
    whole pause between two reads, last_read_stats() and the table's release included, 85 us
    on the compact() store against 151 us with the numpy check, and its reads 5 % faster). Since
    Store.scan makes its table in C++, this check's pyarrow calls were the first after the scan,
    cold: ~40 us. It is now one call of benchmarks/csrc/table_checksum.cc on the table (the same
    sum, the buffers found through Arrow's C++ API); the Python path below stays for tables that
    call does not take."""
    rc = table_checksum_fn()(tab, wl.value_bytes, _TC_ITEMS, _TC_SUM)
    if rc == 0:
        return _TC_ITEMS.value, _TC_SUM.value
    if rc == -2:
        raise RuntimeError(f"scan table with {tab.column(0).length()} keys and {tab.column(1).length()} values")
    fn = items_checksum_fn()
    keep: list = []
    kaddr, n = _arrow_data(tab.column("key"), 8, keep)
    col = tab.column("value")
    if wl.value_bytes == 8:
        vaddr, nv = _arrow_data(col, 8, keep)
    else:
        import pyarrow as pa

        flat = pa.chunked_array([c.flatten() for c in col.chunks], type=col.type.value_type)
        vaddr, nv = _arrow_data(flat, 4, keep)
        nv //= wl.value_bytes // 4
    if nv != n:
        raise RuntimeError(f"scan table with {n} keys and {nv} values")
    return n, int(fn(kaddr, vaddr, n, wl.value_bytes))


def _reader_updates(wl: Workload, st, names, io: bool) -> None:
    for g, v in wl.iter_updates(values=io):
        fid = wl.feature_of(g)
        order = np.argsort(fid, kind="stable")
        g, fid = g[order], fid[order]
        if v is not None:
            v = v[order]
        keys = wl.keys[g] if wl.keys is not None else wl.hash_keys(g)
        cuts = np.flatnonzero(np.diff(fid)) + 1
        starts = np.concatenate([[0], cuts])
        ends = np.concatenate([cuts, [len(g)]])
        for a, b in zip(starts, ends):
            vals = _typed(wl, v[a:b]) if v is not None else wl.zero_values(b - a)
            st.put(names[fid[a]], keys[a:b], vals)


def _reader_stats(s0: dict, s1: dict, s2: dict, overrides: dict, update_bytes: int) -> dict:
    def d(part, key):
        return int((s1.get(part) or {}).get(key, 0) - (s0.get(part) or {}).get(key, 0))

    frag = s2.get("features") or s1.get("features") or {}
    fr = np.array([v.get("fragmentation", 0.0) for v in frag.values()]) if frag else np.zeros(0)
    fitems = np.array([v.get("items", 0) for v in frag.values()]) if frag else np.zeros(0)
    thr = overrides.get("merge_threshold", reader_defaults()["merge_threshold"])
    return {
        "merger": s1.get("merger"), "pinner": s1.get("pinner"), "reclaimer": s1.get("reclaimer"),
        "pages_in_use": s2.get("pages_in_use"), "write_amplification_engine": s1.get("write_amplification"),
        "space_amplification_pages": s2.get("space_amplification_pages"),
        "disk_bytes_per_item": s2.get("disk_bytes_per_item"),
        "fragmentation_mean_items_weighted": float((fr * fitems).sum() / max(1, fitems.sum())) if len(fr) else None,
        "fragmentation_max": float(fr.max()) if len(fr) else None,
        "features_over_threshold": int((fr > thr).sum()) if len(fr) else None,
        "update_phase": {"merger_bytes_written": d("merger", "bytes_written"),
                         "merger_victims": d("merger", "victims"),
                         "merger_pages_gathered": d("merger", "pages_gathered"),
                         "merger_items_moved": d("merger", "items_moved"),
                         "reclaimer_bytes_written": d("reclaimer", "bytes_written"),
                         "reclaimer_pages_cleaned": d("reclaimer", "pages_cleaned"),
                         "flush_bytes_written": int(update_bytes - d("merger", "bytes_written")
                                                    - d("reclaimer", "bytes_written"))},
    }


class ReaderRunner(Runner):
    """recflash.reader.Store: load and updates in build(); each read round reopens the store
    (the open is not timed) and scans its slice of the reads."""

    def __init__(self, strategy: str, config: str, overrides: dict, slot: int, *a):
        super().__init__(*a)
        self.strategy, self.config = strategy, config
        over = dict(overrides)
        self.compact = over.pop("_compact", False)
        self.overrides = over
        self.path = os.path.join(self.workdir, f"reader-{slot:02d}")
        self.names = [f"f{f}" for f in range(self.wl.F)]

    def _options(self):
        from recflash.reader import StoreOptions

        return StoreOptions(page_size=self.wl.cfg.page_size, write_buffer_bytes=self.wl.buffer_bytes, **self.overrides)

    def build(self) -> None:
        from recflash.reader import Store

        wl = self.wl
        t = time.perf_counter()
        shutil.rmtree(self.path, ignore_errors=True)
        self.opts = self._options()
        st = Store.open(self.path, self.opts)
        t0 = time.perf_counter()
        for f in range(wl.F):
            a, b = int(wl.off[f]), int(wl.off[f + 1])
            st.create_feature(self.names[f], wl.value_type)
            st.put(self.names[f], wl.keys[a:b], _typed(wl, wl.init_vals[a:b]))
        st.flush()
        self.load_time = time.perf_counter() - t0
        self.s0 = st.stats()
        t0 = time.perf_counter()
        _reader_updates(wl, st, self.names, io=True)
        st.flush()
        self.compact_info = None
        if self.compact:
            sc = st.stats()
            tc = time.perf_counter()
            st.compact()
            self.compact_info = {"seconds": time.perf_counter() - tc,
                                 "bytes_written": st.stats()["bytes_written"] - sc["bytes_written"]}
        self.update_time = time.perf_counter() - t0
        self.s1 = st.stats()
        self.update_bytes = self.s1["bytes_written"] - self.s0["bytes_written"]
        st.close()
        st = Store.open(self.path, self.opts)  # after close + reopen nothing is buffered: exact figures
        self.s2 = st.stats()
        st.close()
        self.enc = 0.0
        self.engine_useful = 0
        log(f"{self.label}: load {self.load_time:.1f}s, {wl.U} updates {self.update_time:.1f}s, "
            f"write amp {self.update_bytes / max(1, wl.U * wl.item_bytes):.2f}")
        self.t_build += time.perf_counter() - t

    def read(self, idx: np.ndarray) -> None:
        import pyarrow as pa

        from recflash.reader import Store

        # pyarrow initialises itself lazily on the first pa.array() (~0.35 s here): a
        # process-level one-time cost, not the store's, paid before any timed read.
        pa.array(np.zeros(1, np.uint64), type=pa.uint64())
        items_checksum_fn()  # built (and loaded) before the reads, as page_reader is
        table_checksum_fn()
        t = time.perf_counter()
        if self.drop:
            self.dropped = drop_caches()
        st = Store.open(self.path, self.opts)
        L = self.log
        cpu0 = time.process_time()
        for i in idx:
            name = self.names[self.wl.reads[i]]
            t1 = time.perf_counter()
            tab = st.scan(name)
            L.seconds[i] = time.perf_counter() - t1
            rs = st.last_read_stats()
            L.engine_seconds[i] = rs["seconds"]
            L.bytes[i] = rs["bytes_read"]
            L.pages[i] = rs["pages_read"]
            L.requests[i] = rs["read_requests"]
            L.io_wait[i] = rs["io_wait_seconds"]
            self.engine_useful += rs["useful_bytes"]
            self.enc += rs.get("encoded_bytes", 0.0)
            c1 = time.process_time()
            L.items[i], L.sums[i] = _table_checksum(self.wl, tab)  # checked, not timed (wall or CPU)
            del tab
            cpu0 += time.process_time() - c1
        L.cpu_s += time.process_time() - cpu0
        L.rounds += 1
        self.t_read += time.perf_counter() - t
        try:
            self._replay_device(st, idx)
        except Exception as e:  # a diagnostic: the row keeps its reads, and says why it has no floor
            self.replay_error = f"{type(e).__name__}: {e}"
            log(f"{self.label}: device replay failed: {self.replay_error}")
        st.close()
        try:
            self._replay_native(idx)
        except Exception as e:  # a diagnostic too: the row keeps its reads
            self.native_error = f"{type(e).__name__}: {e}"
            log(f"{self.label}: native replay failed: {self.native_error}")

    def _replay_device(self, st, idx: np.ndarray) -> None:
        """The pages each read of the round took (Store.key_ranges: the pages a full scan reads),
        read again by page_reader --io-only: the same runs of adjacent pages, requests of at most
        max_io_bytes, read_inflight_bytes in flight, on one ring and no CPU work. (The engine
        splits a large fragmented feature's pages over scan_threads rings; the budget changed
        the replay's time little here.) Not part of read time."""
        ps = self.opts.page_size
        ipp = ps // 16  # the plan addresses pages as 16-byte items
        ops: dict[int, bytes] = {}
        parts = [plan_header(ps, 16, len(idx))]
        for i in idx:
            f = int(self.wl.reads[i])
            if f not in ops:
                p = np.sort(st.key_ranges(self.names[f])["page"]).astype(np.int64)
                brk = np.flatnonzero(np.diff(p) != 1) + 1
                starts, ends = (np.r_[0, brk], np.r_[brk, len(p)]) if len(p) else (p, p)
                ext = np.zeros(len(starts), PLAN_EXTENT)
                ext["first"] = p[starts].astype(np.uint64) * ipp
                ext["n"] = (ends - starts).astype(np.uint64) * ipp
                ops[f] = plan_op(f, ext)
            parts.append(ops[f])
        plan = os.path.join(self.workdir, f"replay-{os.path.basename(self.path)}.bin")
        files = plan + ".files"
        with open(plan, "wb") as fh:
            fh.write(b"".join(parts))
        with open(files, "w") as fh:
            fh.write(os.path.join(self.path, "pages.dat") + "\n")
        try:
            res, _ = run_page_reader(files, plan, plan + ".out", "--io-only", "1", "--max-io", str(self.opts.max_io_bytes),
                                     "--inflight-bytes", str(self.opts.read_inflight_bytes))
        finally:
            for x in (plan, files):
                os.unlink(x)
        if not np.array_equal(res["pages"], self.log.pages[idx]):
            raise RuntimeError(f"{self.label}: the replayed page sets differ from the pages the scans read")
        self.log.device_floor[idx] = res["io_seconds"]

    #: The StoreOptions fields engine_reader takes (those a scan depends on).
    NATIVE_OPTIONS = ("page_size", "write_buffer_bytes", "direct_io", "queue_depth", "max_io_bytes",
                      "read_inflight_bytes", "single_lane_inflight_bytes", "read_poll_us", "lane_read_poll_us",
                      "scan_threads", "verify_block_reads")

    def _replay_native(self, idx: np.ndarray) -> None:
        """The round's scans again, through the engine's C++ API in one C++ loop
        (benchmarks/csrc/engine_reader.cc: no binding, no Arrow table, and between two reads only
        a check of a few microseconds, as page_reader's): what the engine itself takes for them.
        The store is reopened after the page cache is dropped, as for the timed reads, and every
        result is checked against the timed reads' items and checksums. Not part of read time."""
        exe = build_harness("engine_reader")
        plan = os.path.join(self.workdir, f"native-{os.path.basename(self.path)}.txt")
        out = plan + ".out"
        with open(plan, "w") as fh:
            fh.write("".join(self.names[self.wl.reads[i]] + "\n" for i in idx))
        opts = dataclasses.asdict(self.opts)
        args = [exe, self.path, plan, out]
        for k in self.NATIVE_OPTIONS:
            args += ["--option", f"{k}={int(opts[k])}"]
        try:
            if self.drop:
                drop_caches()
            proc = subprocess.run(args, capture_output=True, text=True)
            if proc.returncode != 0:
                raise RuntimeError(f"engine_reader failed: {proc.stderr[-2000:]}")
            res = np.fromfile(out, dtype=NATIVE_RESULT)
        finally:
            for x in (plan, out):
                if os.path.exists(x):
                    os.unlink(x)
        if len(res) != len(idx):
            raise RuntimeError(f"engine_reader returned {len(res)} results for {len(idx)} reads")
        bad = np.flatnonzero((res["items"] != self.log.items[idx]) | (res["checksum"] != self.log.sums[idx]))
        if len(bad):
            i, got = idx[bad[0]], res[bad[0]]
            raise RuntimeError(f"{len(bad)} native scans differ from the timed ones (first: read {i}, feature "
                               f"{self.names[self.wl.reads[i]]}: {got['items']} items, checksum {got['checksum']:#x} "
                               f"vs {self.log.items[i]} items, checksum {int(self.log.sums[i]):#x})")
        self.log.native[idx] = res["seconds"]

    def rows(self) -> list[dict]:
        wl = self.wl
        r = self.log.totals(wl)
        ideal = OptStrategy(wl, "accounting", None).pages_per_feature()
        br = r["bytes_read"]
        row = make_row(
            wl, self.strategy, self.config, "io", self.dataset, read_time=r.pop("read_time"),
            bytes_read=r.pop("bytes_read"), useful_bytes=r.pop("useful_bytes"), pages_read=r.pop("pages_read"),
            update_bytes=self.update_bytes, update_time=self.update_time,
            space_bytes=self.s2["space_amplification"] * wl.N * wl.item_bytes,
            metadata_bytes=self.s2["metadata_dram_bytes_per_item"] * wl.N, load_time_s=self.load_time,
            read_amplification_encoded=(br / self.enc) if self.enc else None,
            engine_useful_bytes=int(self.engine_useful),
            pages_read_vs_ideal=float(self.log.pages.sum() / ideal[wl.reads].sum()),
            page_cache_dropped=getattr(self, "dropped", False), compact=self.compact_info,
            options=dataclasses.asdict(self.opts),
            reader_stats=_reader_stats(self.s0, self.s1, self.s2, self.overrides, self.update_bytes),
            **({"device_replay_error": self.replay_error} if getattr(self, "replay_error", None) else {}),
            **({"native_replay_error": self.native_error} if getattr(self, "native_error", None) else {}),
            notes="read time = wall time of Store.scan() (Arrow table included; engine time in read_engine_time_s; "
                  "the same scans from C++ with no Python in read_time_native_s); "
                  "bytes from last_read_stats(); update bytes = stats() bytes_written delta over the update phase "
                  "(page writes: flushes, merger, reclamation" + (", and the compact() after the updates"
                                                                   if self.compact else "") +
                  "; WAL excluded); space and metadata after close + reopen (exact, nothing buffered)", **r)
        return [self._finish(row)]

    def cleanup(self) -> None:
        shutil.rmtree(self.path, ignore_errors=True)


def reader_has_accounting() -> bool:
    return "accounting" in reader_defaults()


class ReaderAccountingRunner(Runner):
    """The engine's own accounting mode (StoreOptions.accounting): the same flush, pinner,
    merger and reclamation decide the layout; no page is written; read costs come from
    Store.account_scan(). Keys are a bijective hash of the item id (nothing stored)."""

    def __init__(self, strategy: str, config: str, overrides: dict, slot: int, *a):
        super().__init__(*a)
        self.strategy, self.config = strategy, config
        self.overrides = dict(overrides)
        self.path = os.path.join(self.workdir, f"reader-acct-{slot:02d}")

    def build(self) -> None:
        from recflash.reader import Store, StoreOptions

        wl = self.wl
        t = time.perf_counter()
        shutil.rmtree(self.path, ignore_errors=True)
        self.opts = StoreOptions(page_size=wl.cfg.page_size, write_buffer_bytes=wl.buffer_bytes, accounting=True,
                                 **self.overrides)
        names = [f"f{f}" for f in range(wl.F)]
        st = Store.open(self.path, self.opts)
        t0 = time.perf_counter()
        for f in range(wl.F):
            st.create_feature(names[f], wl.value_type)
            a, b = int(wl.off[f]), int(wl.off[f + 1])
            for c in range(a, b, 1 << 22):
                e = min(b, c + (1 << 22))
                st.put(names[f], wl.hash_keys(np.arange(c, e, dtype=np.int64)), wl.zero_values(e - c))
        st.flush()
        self.load_time = time.perf_counter() - t0
        s0 = st.stats()
        t0 = time.perf_counter()
        _reader_updates(wl, st, names, io=False)
        st.flush()
        self.update_time = time.perf_counter() - t0
        s1 = st.stats()
        self.update_bytes = s1["bytes_written"] - s0["bytes_written"]
        costs = [st.account_scan(nm) for nm in names]
        self.pages = np.array([c["pages_read"] for c in costs], np.int64)
        self.byts = np.array([c["bytes_read"] for c in costs], np.int64)
        self.useful = np.array([c["useful_bytes"] for c in costs], np.int64)
        self.requests = np.array([c.get("read_requests", 0) for c in costs], np.int64)
        self.s0, self.s1 = s0, s1
        st.close()
        shutil.rmtree(self.path, ignore_errors=True)
        log(f"{self.label} (accounting): load {self.load_time:.1f}s, updates {self.update_time:.1f}s")
        self.t_build += time.perf_counter() - t

    def rows(self) -> list[dict]:
        wl, s1 = self.wl, self.s1
        ideal = OptStrategy(wl, "accounting", None).pages_per_feature()
        row = make_row(
            wl, self.strategy, self.config, "accounting", self.dataset, read_time=None,
            bytes_read=int(self.byts[wl.reads].sum()), useful_bytes=int(self.useful[wl.reads].sum()),
            pages_read=int(self.pages[wl.reads].sum()), update_bytes=self.update_bytes, update_time=None,
            space_bytes=s1["space_amplification"] * wl.N * wl.item_bytes,
            metadata_bytes=s1["metadata_dram_bytes_per_item"] * wl.N, load_time_s=self.load_time,
            update_phase_wall_s=self.update_time,
            pages_read_vs_ideal=float(self.pages[wl.reads].sum() / ideal[wl.reads].sum()),
            read_requests=int(self.requests[wl.reads].sum()),  # device reads as a scan coalesces its pages
            options=dataclasses.asdict(self.opts),
            reader_stats=_reader_stats(self.s0, s1, s1, self.overrides, self.update_bytes),
            notes="engine accounting mode (StoreOptions.accounting=True): identical layout decisions, no page I/O; "
                  "read costs from Store.account_scan(); space/metadata from stats() after the final flush "
                  "(pinned items, at most 5 % of the buffer, not yet on pages)")
        return [self._finish(row)]

    def cleanup(self) -> None:
        shutil.rmtree(self.path, ignore_errors=True)


def read_breakdown(wl: Workload, times, bytes_read, items) -> list[dict]:
    """Reads grouped by the feature's ideal page count: where the read time goes."""
    ideal = OptStrategy(wl, "accounting", None).pages_per_feature()[wl.reads]
    out = []
    for lo, hi in [(1, 2), (3, 8), (9, 32), (33, 128), (129, 1 << 62)]:
        m = (ideal >= lo) & (ideal <= hi)
        if not m.any():
            continue
        t = float(np.asarray(times)[m].sum()) if times is not None else None
        u = int(np.asarray(items)[m].sum()) * wl.item_bytes
        b = int(np.asarray(bytes_read)[m].sum())
        out.append({"ideal_pages": f"{lo}-{hi}" if hi < 1 << 62 else f">={lo}", "reads": int(m.sum()),
                    "time_s": t, "bytes_read": b, "useful_bytes": u, "read_amplification": b / u if u else None,
                    "useful_MBps": (u / t / 1e6) if t else None})
    return out


# ----------------------------------------------------------------------------- targets

def _find(runs, strategy, config="default"):
    for r in runs:
        if r["strategy"] == strategy and r["config"] == config:
            return r
    return None


def evaluate_targets(runs: list[dict]) -> list[dict]:
    out = []
    io_uniform = [r for r in runs if r["mode"] == "io" and r["update_dist"] == "uniform"]
    if not io_uniform:
        return [{"target": "all", "pass": None, "detail": "targets apply to io mode with uniform updates"}]
    rd = _find(io_uniform, "reader")
    lsm = _find(io_uniform, "lsm")
    rocks = _find(io_uniform, "rocksdb")
    uni = _find(io_uniform, "rocksdb-universal")
    opt = _find(io_uniform, "opt")

    def facts(r):
        if not r:
            return None
        keys = ("read_time_s", "read_cpu_s", "read_io_time_s", "read_engine_time_s", "read_time_native_s",
                "read_device_floor_s",
                "read_io_wait_s", "read_requests", "bytes_read", "useful_bytes",
                "read_amplification", "read_vs_opt", "pages_read_vs_ideal", "read_throughput_MBps",
                "update_amplification", "space_amplification")
        f = {k: r.get(k) for k in keys if r.get(k) is not None}
        rs = r.get("reader_stats")
        if rs:
            f["fragmentation_mean_items_weighted"] = rs.get("fragmentation_mean_items_weighted")
            f["update_phase"] = rs.get("update_phase")
        return f

    evidence = {"reader": facts(rd), "lsm": facts(lsm), "rocksdb": facts(rocks), "opt": facts(opt),
                "reader_compacted": facts(_find(io_uniform, "reader", COMPACT))}

    def add(name, value, limit, ok, detail):
        out.append({"target": name, "value": value, "limit": limit, "pass": ok, "detail": detail,
                    **({"evidence": evidence} if ok is False else {})})

    if rd and lsm:
        v = rd["read_time_s"] / lsm["read_time_s"]
        add("reader read time <= 0.62 x lsm", v, TARGET_READ_VS_LSM, v <= TARGET_READ_VS_LSM,
            f"reader {rd['read_time_s']:.3f}s vs lsm {lsm['read_time_s']:.3f}s "
            f"(read amp {rd['read_amplification']:.3f} vs {lsm['read_amplification']:.3f})")
    if rd and rocks:
        v = rd["read_amplification"] / rocks["read_amplification"]
        add("reader read amplification <= rocksdb", v, 1.0, v <= 1.0,
            f"reader {rd['read_amplification']:.3f} vs rocksdb {rocks['read_amplification']:.3f}")
        v = rd["read_time_s"] / rocks["read_time_s"]
        add("reader read time <= rocksdb", v, 1.0, v <= 1.0,
            f"reader {rd['read_time_s']:.3f}s vs rocksdb {rocks['read_time_s']:.3f}s")
        v = rd["update_amplification"] / rocks["update_amplification"]
        add("reader update amplification <= rocksdb / 5", v, TARGET_UPDATE_VS_ROCKSDB, v <= TARGET_UPDATE_VS_ROCKSDB,
            f"reader {rd['update_amplification']:.3f} vs rocksdb {rocks['update_amplification']:.3f}")
    sweep = [r for r in io_uniform if r["strategy"] == "reader"]
    rpoints = [r for r in (rocks, uni) if r]
    if sweep and rpoints:
        bad = []
        for r in sweep:
            dom = [p["strategy"] for p in rpoints if r["read_time_s"] <= p["read_time_s"]
                   and r["update_amplification"] <= p["update_amplification"]]
            r["dominates"] = dom
            if not dom:
                bad.append(r["config"])
        add("every reader sweep point dominates a rocksdb point", len(sweep) - len(bad), len(sweep), not bad,
            "not dominating: " + (", ".join(bad) if bad else "none"))
    if sweep and opt:
        best = max(sweep, key=lambda r: r["read_throughput_MBps"])
        v = best["read_throughput_MBps"] / opt["read_throughput_MBps"]
        nat = best.get("read_time_native_s")
        add("reader read-optimised end >= 0.95 x opt throughput", v, TARGET_THROUGHPUT_VS_OPT,
            v >= TARGET_THROUGHPUT_VS_OPT,
            f"{best['config']}: {best['read_throughput_MBps']:.1f} MB/s vs opt {opt['read_throughput_MBps']:.1f} "
            f"MB/s, at update amplification {best['update_amplification']:.2f} "
            f"(opt per-item {opt['update_amplification']:.0f}, batched "
            f"{(_find(io_uniform, 'opt', 'batched-rmw') or {}).get('update_amplification', float('nan')):.1f})"
            + (f"; the same scans through the engine's C++ API (as opt's harness reads): "
               f"{opt['read_time_s'] / nat * best['useful_bytes'] / opt['useful_bytes']:.3f} x opt's throughput"
               if nat else ""))
    # Issue 14: fragmented reads should cost what their bytes cost. The device floors (the same
    # page reads with no CPU work) say how much of a miss the layout alone decides on this disk.
    comp = _find(io_uniform, "reader", COMPACT)

    def floor(r):
        f = r.get("read_device_floor_s")
        return f"{f:.3f}s" if f is not None else "n/a"

    def vs_amp_ratio(name, ref, ref_label):
        """READER's default read time against 1.25 x (its read amplification / ref's) x ref's."""
        ratio = rd["read_amplification"] / ref["read_amplification"]
        lim = 1.25 * ratio * ref["read_time_s"]
        v = rd["read_time_s"] / lim
        fl, rfl = rd.get("read_device_floor_s"), ref.get("read_device_floor_s")
        detail = (f"reader {rd['read_time_s']:.3f}s vs limit {lim:.3f}s (1.25 x {ratio:.3f} x {ref_label} "
                  f"{ref['read_time_s']:.3f}s); reader's device floor {floor(rd)}"
                  + (f" ({fl / lim:.2f} x the limit)" if fl is not None else ""))
        if rfl is not None:
            detail += f", {ref_label}'s {floor(ref)}"
            if fl is not None:
                detail += f"; the floors' ratio {fl / rfl:.2f} against 1.25 x {ratio:.3f} = {1.25 * ratio:.2f}"
        nat = rd.get("read_time_native_s")
        if nat:
            # The engine alone, driven from C++ (opt's reads never cross into Python): how much of
            # a miss is the engine's and how much the Python API's.
            detail += f"; the same scans through the engine's C++ API: {nat:.3f}s ({nat / lim:.3f} x the limit)"
            rnat = ref.get("read_time_native_s")
            if rnat:
                detail += (f", against the same limit from {ref_label}'s C++ scans "
                           f"{nat / (1.25 * ratio * rnat):.3f}")
        add(name, v, 1.0, v <= 1.0, detail)

    if rd and comp:
        vs_amp_ratio("issue 14 2a: reader default read time <= 1.25 x read-amp ratio x the compact() run's", comp,
                     "compact()")
    if opt and comp:
        v = opt["read_throughput_MBps"] / comp["read_throughput_MBps"]
        add("issue 14 2b: opt read throughput >= the compact() run's", v, 1.0, v >= 1.0,
            f"opt {opt['read_throughput_MBps']:.1f} MB/s vs compact() {comp['read_throughput_MBps']:.1f} MB/s")
    if rd and opt:
        vs_amp_ratio("issue 14 2c: reader default read time <= 1.25 x read-amp ratio x opt's", opt, "opt")
    return out


def add_relative(runs: list[dict]) -> None:
    for r in runs:
        o = next((x for x in runs if x["strategy"] == "opt" and x["dataset"] == r["dataset"]
                  and x["update_dist"] == r["update_dist"] and x["mode"] == r["mode"]), None)
        if o and o["bytes_read"]:
            r["read_vs_opt"] = r["bytes_read"] / o["bytes_read"]
            if r.get("read_time_s") and o.get("read_time_s"):
                r["read_time_vs_opt"] = r["read_time_s"] / o["read_time_s"]
                r["read_throughput_vs_opt"] = r["read_throughput_MBps"] / o["read_throughput_MBps"]


# ----------------------------------------------------------------------------- plots

def plot_fig6(doc: dict, path: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    runs = doc["runs"]

    def key(r):
        return "opt*" if r["config"] == "batched-rmw" else r["strategy"]

    # Each strategy's default row, the ablations, and opt's batched variant (not the sweep).
    main = [r for r in runs if r["strategy"] != "reader" or r["config"] == "default"]
    datasets = list(dict.fromkeys(r["dataset"] for r in main))
    dists = list(dict.fromkeys(r["update_dist"] for r in main))
    groups = [(d, u) for d in datasets for u in dists if any(r["dataset"] == d and r["update_dist"] == u for r in main)]
    order = ["reader", "reader-nopin", "reader-nomerge", "lsm", "rocksdb", "rocksdb-universal", "opt", "opt*"]
    keys = [k for k in order if any(key(r) == k for r in main)]
    has_time = any(r["read_time_s"] for r in main)
    panels = [("read_time_s", "overall read time (s)") if has_time else ("read_amplification", "read amplification"),
              ("read_throughput_MBps", "read throughput (useful MB/s)") if has_time
              else ("read_vs_opt", "bytes read / OPT's"),
              ("update_amplification", "update amplification (log)")]
    fig, axes = plt.subplots(1, 3, figsize=(16, 5))
    colors = {"reader": "#1f77b4", "reader-nopin": "#6baed6", "reader-nomerge": "#c6dbef", "lsm": "#ff7f0e",
              "rocksdb": "#d62728", "rocksdb-universal": "#ff9896", "opt": "#2ca02c", "opt*": "#98df8a"}
    width = 0.8 / max(1, len(keys))
    for ax, (field, title) in zip(axes, panels):
        for j, k in enumerate(keys):
            xs, ys = [], []
            for gi, (d, u) in enumerate(groups):
                r = next((r for r in main if r["dataset"] == d and r["update_dist"] == u and key(r) == k), None)
                if r is not None and r.get(field) is not None:
                    xs.append(gi + (j - (len(keys) - 1) / 2) * width)
                    ys.append(r[field])
            lab = "opt (batched RMW)" if k == "opt*" else k
            ax.bar(xs, ys, width=width, label=lab, color=colors.get(k))
        ax.set_xticks(range(len(groups)))
        ax.set_xticklabels([f"{d}\n{u}" for d, u in groups])
        ax.set_title(title)
        if field == "update_amplification":
            ax.set_yscale("log")
        ax.grid(axis="y", alpha=0.3)
    axes[0].legend(fontsize=8)
    cfg = doc.get("config", {})
    fig.suptitle(f"Compaction benchmark ({cfg.get('mode', '')}): {cfg.get('items', '')} items of "
                 f"{cfg.get('item_bytes', '')} B, {cfg.get('features', '')} features, "
                 f"{cfg.get('updates', '')} updates, page {cfg.get('page_size', '')} B, "
                 f"buffer {cfg.get('write_buffer_frac', '')} of the data (item size {cfg.get('item_bytes', '')} B)",
                 fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def plot_frontier(doc: dict, path: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    runs = [r for r in doc["runs"] if r["update_amplification"] is not None]
    dists = list(dict.fromkeys(r["update_dist"] for r in runs))
    datasets = list(dict.fromkeys(r["dataset"] for r in runs))
    has_time = any(r["read_time_s"] for r in runs)
    fields = ([("read_time_s", "overall read time (s)")] if has_time else []) + \
             [("read_amplification", "read amplification (bytes read / useful)")]
    fig, axes = plt.subplots(len(dists) * len(datasets), len(fields),
                             figsize=(7 * len(fields), 5 * len(dists) * len(datasets)), squeeze=False)
    markers = {"lsm": ("s", "#ff7f0e"), "rocksdb": ("^", "#d62728"), "rocksdb-universal": ("v", "#ff9896"),
               "opt": ("*", "#2ca02c"), "reader-nopin": ("x", "#6baed6"), "reader-nomerge": ("+", "#08519c")}
    for ri, (ds, dist) in enumerate([(d, u) for d in datasets for u in dists]):
        sub = [r for r in runs if r["update_dist"] == dist and r["dataset"] == ds]
        for ci, (field, title) in enumerate(fields):
            ax = axes[ri][ci]
            sweep = sorted([r for r in sub if r["strategy"] == "reader" and r.get(field) is not None
                            and r["config"] != COMPACT], key=lambda r: r["update_amplification"])
            comp = [r for r in sub if r["strategy"] == "reader" and r["config"] == COMPACT and r.get(field) is not None]
            if comp:
                ax.scatter([r["update_amplification"] for r in comp], [r[field] for r in comp], marker="D", s=70,
                           color="#1f77b4", label="READER default + compact() before reads")
            if sweep:
                ax.plot([r["update_amplification"] for r in sweep], [r[field] for r in sweep], "o-",
                        color="#1f77b4", label="READER (merge_threshold sweep)")
                for r in sweep:
                    lab = "default" if r["config"] == "default" else r["config"].replace("merge_threshold=", "mt=") \
                        .replace(",merge_low_benefit_frac=", ",lbf=").replace("merge_run_weight=", "rw=")
                    ax.annotate(lab, (r["update_amplification"], r[field]), fontsize=7, xytext=(4, 4),
                                textcoords="offset points")
            for r in sub:
                if r["strategy"] == "reader" or r.get(field) is None:
                    continue
                m, c = markers.get(r["strategy"], ("o", "gray"))
                lab = r["strategy"] if r["config"] == "default" else f"{r['strategy']} ({r['config']})"
                ax.scatter([r["update_amplification"]], [r[field]], marker=m, s=90, color=c, label=lab,
                           facecolors="none" if r["config"] == "batched-rmw" else c)
            ax.set_xscale("log")
            ax.set_xlabel(f"update amplification (device bytes written / bytes updated; item {sub[0]['item_bytes']} B)"
                          if sub else "update amplification")
            ax.set_ylabel(title)
            ax.set_title(f"{ds}, {dist} updates: {title} vs update amplification", fontsize=9)
            ax.grid(alpha=0.3, which="both")
            ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


# ----------------------------------------------------------------------------- main

def parse_args(argv):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true", help="small run, < 2 minutes")
    ap.add_argument("--dataset", default=None, help="XS|S|M|L|XL|XXL (comma list in accounting mode)")
    ap.add_argument("--items", type=int, default=None, help=f"items N (io default {DEFAULT_IO_ITEMS})")
    ap.add_argument("--features", type=int, default=None, help="features F (default N / 40000, in [16, 2000])")
    ap.add_argument("--item-bytes", type=int, default=16, help="bytes per item: 8-byte key + value")
    g = ap.add_mutually_exclusive_group()
    g.add_argument("--updates", type=int, default=None, help="updates U")
    g.add_argument("--update-factor", type=float, default=None, help="U = X * N (default 2)")
    ap.add_argument("--update-dist", default="uniform", help="uniform|zipf (comma list runs both)")
    ap.add_argument("--write-buffer-frac", type=float, default=0.025)
    ap.add_argument("--page-size", type=int, default=16384)
    ap.add_argument("--mode", choices=["io", "accounting"], default="io")
    ap.add_argument("--json", default=None, help="output JSON (default benchmarks/results/compaction.json)")
    ap.add_argument("--plot", default=None, help="Fig. 6-like PNG (the frontier goes next to it)")
    ap.add_argument("--plot-frontier", default=None, help="frontier PNG (default: --plot with fig6 -> frontier)")
    ap.add_argument("--keys", choices=["sparse", "dense"], default="sparse")
    ap.add_argument("--strategies", default=",".join(ALL_STRATEGIES),
                    help="comma list of " + ",".join(ALL_STRATEGIES))
    ap.add_argument("--sweep", default=None,
                    help="READER sweep: comma list of merge_threshold[:merge_low_benefit_frac] "
                         f"(default {DEFAULT_SWEEP}; quick {QUICK['sweep']})")
    ap.add_argument("--reads", type=int, default=None,
                    help="feature reads in total (default: 60000 x N / 80 M, at least 2 F, at most 60000)")
    ap.add_argument("--feature-sigma", type=float, default=1.0, help="lognormal sigma of feature sizes")
    ap.add_argument("--batch", type=int, default=0, help="updates per batch (default buffer/4, <= 65536)")
    ap.add_argument("--sensitivity", action="store_true",
                    help="accounting mode: also vary the update volume (0.25, 2, 10 x N) and the write buffer "
                         "(1, 1/2, 1/4, 1/8 x) for opt, lsm and READER (rows in sensitivity_runs, plot *_sensitivity.png)")
    ap.add_argument("--read-rounds", type=int, default=None,
                    help="the reads run in this many rounds over all strategies (default 4, quick 2)")
    ap.add_argument("--rocksdb-cache-bytes", type=int, default=None,
                    help="RocksDB block cache (default min(8 MiB, dataset / 256))")
    ap.add_argument("--seed", type=int, default=42)
    ap.add_argument("--workdir", default=None, help="directory on the disk under test "
                    "(default $RECFLASH_BENCH_TMP or /work/bench-tmp, else the system temp dir)")
    ap.add_argument("--keep", action="store_true", help="keep the work directory (io mode: with every strategy's store)")
    ap.add_argument("--no-device", action="store_true", help="skip the fio device measurement")
    ap.add_argument("--no-drop-caches", action="store_true")
    ap.add_argument("--no-plot", action="store_true")
    ap.add_argument("--replot", default=None, metavar="JSON",
                    help="only redraw the plots of an existing result file (--plot / --plot-frontier or next to it)")
    return ap.parse_args(argv)


def default_workdir() -> str:
    base = os.environ.get("RECFLASH_BENCH_TMP") or ("/work/bench-tmp" if os.path.isdir("/work/bench-tmp")
                                                    else tempfile.gettempdir())
    return tempfile.mkdtemp(prefix="compaction-", dir=base)


def resolve(args) -> tuple[int, str]:
    if args.dataset and args.items:
        raise SystemExit("give --dataset or --items, not both")
    if args.dataset:
        return DATASETS[args.dataset], args.dataset
    if args.items:
        return args.items, f"N={args.items}"
    if args.quick:
        return QUICK["items"], "quick"
    if args.mode == "accounting":
        return DATASETS["XS"], "XS"
    return DEFAULT_IO_ITEMS, f"N={DEFAULT_IO_ITEMS}"


def print_table(runs: list[dict]) -> None:
    hdr = f"{'strategy':<18} {'config':<40} {'dist':<7} {'read s':>8} {'MB/s':>8} {'read amp':>9} " \
          f"{'vs opt':>7} {'upd amp':>8} {'space':>6} {'meta B':>7} {'upd s':>7}"
    print(hdr)
    print("-" * len(hdr))

    def f(v, fmt):
        return format(v, fmt) if isinstance(v, (int, float)) and v is not None else "-"

    for r in runs:
        print(f"{r['strategy']:<18} {r['config'][:40]:<40} {r['update_dist']:<7} {f(r['read_time_s'], '8.3f')} "
              f"{f(r['read_throughput_MBps'], '8.1f')} {f(r['read_amplification'], '9.3f')} "
              f"{f(r['read_vs_opt'], '7.3f')} {f(r['update_amplification'], '8.2f')} "
              f"{f(r['space_amplification'], '6.2f')} {f(r['metadata_bytes_per_item'], '7.2f')} "
              f"{f(r['update_time_s'], '7.1f')}")


def run_accounting_multi(args, argv) -> int:
    """Each dataset in its own process (its own time and peak memory), results merged."""
    sets = [s.strip() for s in args.dataset.split(",") if s.strip()]
    out_json = args.json or os.path.join(HERE, "results", "compaction_accounting.json")
    doc = {"benchmark": "compaction", "mode": "accounting", "device": {"skipped": "accounting mode: no I/O"},
           "runs": [], "accounting_sizes": [], "created": datetime.datetime.now().isoformat(timespec="seconds"),
           "command": [sys.executable, os.path.abspath(__file__)] + argv,
           "loadavg_start": os.getloadavg()}
    base = [a for a in argv]
    i = 0
    clean = []
    while i < len(base):  # drop --dataset/--json/--plot* from the child command lines
        if base[i] in ("--dataset", "--json", "--plot", "--plot-frontier"):
            i += 2
            continue
        if base[i].startswith(("--dataset=", "--json=", "--plot=", "--plot-frontier=")):
            i += 1
            continue
        clean.append(base[i])
        i += 1
    for ds in sets:
        tmp = tempfile.mktemp(suffix=f"-{ds}.json")
        cmd = [sys.executable, os.path.abspath(__file__)] + clean + ["--dataset", ds, "--json", tmp, "--no-plot"]
        log(f"accounting {ds}: {' '.join(cmd[2:])}")
        t = time.perf_counter()
        proc = subprocess.run(cmd)
        wall = time.perf_counter() - t
        entry = {"dataset": ds, "items": DATASETS[ds], "wall_s": wall, "exit_code": proc.returncode}
        if proc.returncode == 0 and os.path.exists(tmp):
            with open(tmp) as f:
                child = json.load(f)
            os.unlink(tmp)
            doc["runs"] += child["runs"]
            entry["peak_rss_mb"] = child.get("peak_rss_mb")
            doc.setdefault("config", child.get("config"))
            doc.setdefault("notes", child.get("notes"))
        doc["accounting_sizes"].append(entry)
        doc["loadavg_end"] = os.getloadavg()
        with open(out_json, "w") as f:
            json.dump(doc, f, indent=1)
        log(f"accounting {ds}: {wall:.0f}s, peak {entry.get('peak_rss_mb')} MB, exit {proc.returncode}")
    doc["config"] = dict(doc.get("config") or {}, items="per dataset", mode="accounting")
    if not args.no_plot:
        fig6 = args.plot or out_json.replace(".json", "_fig6.png")
        plot_fig6(doc, fig6)
        plot_frontier(doc, args.plot_frontier or fig6.replace("fig6", "frontier"))
    with open(out_json, "w") as f:
        json.dump(doc, f, indent=1)
    print_table(doc["runs"])
    for e in doc["accounting_sizes"]:
        print(f"{e['dataset']:>4}: {e['items']:>13,} items  {e['wall_s']:7.0f} s  peak {e.get('peak_rss_mb')} MB")
    return 0


def run_workload(doc: dict, args, cfg: WorkloadConfig, dataset: str, strategies: list[str], sweep: str,
                 dists: list[str], workdir: str, drop: bool, save, set_config: bool = True,
                 tag: dict | None = None) -> None:
    """Builds the workload, every strategy (build phase), runs the read rounds (io mode) and
    appends the rows (with `tag` merged in) to doc["runs"]."""
    io = args.mode == "io"
    dist = cfg.update_dist
    t = time.perf_counter()
    wl = Workload(cfg, materialize=io)
    log(f"workload ({dist}): N={wl.N} F={wl.F} U={wl.U} reads={len(wl.reads)} "
        f"buffer={wl.buffer_bytes} B, generated in {time.perf_counter() - t:.1f}s")
    if set_config:
        doc["config"] = dict(wl.describe(), mode=args.mode, dataset=dataset, strategies=strategies,
                             sweep=sweep, update_dists=dists, quick=args.quick,
                             reader_default_options=reader_defaults(), engine=engine_info())
    wl_dir = None
    common = (wl, args.mode, dataset, workdir, drop)
    runners: list[Runner] = []
    slot = 0
    for strat in strategies:  # who runs
        if strat in ("opt", "lsm"):
            runners.append(PageFileRunner(strat, *common))
        elif strat in ("rocksdb", "rocksdb-universal"):
            if not io:
                continue
            if wl_dir is None:
                from baselines.rocksdb import write_workload_files

                wl_dir = os.path.join(workdir, "rocksdb-workload")
                write_workload_files(wl, wl_dir)
            runners.append(RocksRunner("leveled" if strat == "rocksdb" else "universal", wl_dir,
                                       args.rocksdb_cache_bytes, *common))
        elif strat.startswith("reader"):
            if not io and not reader_has_accounting():
                continue
            if strat == "reader":
                cfgs = [("reader", "default", {})]
            elif strat == "reader-sweep":
                cfgs = reader_configs(sweep, reader_defaults())
            elif strat == "reader-nopin":
                cfgs = [("reader-nopin", "pinner_enabled=False", dict(pinner_enabled=False))]
            else:
                cfgs = [("reader-nomerge", "merger_enabled=False", dict(merger_enabled=False))]
            for name, cname, over in cfgs:
                if not io and over.get("_compact"):
                    continue  # compact() needs page I/O
                cls = ReaderRunner if io else ReaderAccountingRunner
                runners.append(cls(name, cname, over, slot, *common))
                slot += 1
    built: list[Runner] = []

    def emit(r: Runner) -> None:
        try:
            for row in r.rows():
                row.update(tag or {})
                doc["runs"].append(row)
                rt = row["read_time_s"]
                log(f"  {row['strategy']}[{row['config']}]: read {'-' if rt is None else f'{rt:.3f}s'} "
                    f"amp {row['read_amplification']:.3f} upd amp {row['update_amplification']:.2f} "
                    f"space {row['space_amplification']:.2f} verify_errors {row.get('verify_errors', 'n/a')}")
        except Exception as e:
            traceback.print_exc()
            doc.setdefault("errors", []).append({"strategy": r.label, "update_dist": dist,
                                                 "phase": "rows", "error": f"{type(e).__name__}: {e}"})

    try:
        for i, r in enumerate(runners):  # build phase: load + updates, one strategy at a time
            try:
                r.build()
                if io:
                    built.append(r)
                else:  # accounting: report now and free the strategy's state (paper-size DRAM)
                    emit(r)
                    r.cleanup()
                    runners[i] = Runner(wl, args.mode, dataset, workdir, drop)
            except Exception as e:
                traceback.print_exc()
                doc.setdefault("errors", []).append({"strategy": r.label, "update_dist": dist,
                                                     "phase": "build", "error": f"{type(e).__name__}: {e}"})
                r.cleanup()
            doc["progress"] = f"{dist}: built {i + 1}/{len(runners)}"
            save()
        if io:  # read phase: rounds over all strategies, rotated
            chunks = [c for c in np.array_split(np.arange(len(wl.reads)), max(1, args.read_rounds)) if len(c)]
            doc["config"]["read_rounds"] = len(chunks)
            failed: set = set()
            for k, chunk in enumerate(chunks):
                order = built[k % len(built):] + built[:k % len(built)] if built else []
                t = time.perf_counter()
                for r in order:
                    if r.label in failed:
                        continue
                    try:
                        r.read(chunk)
                    except Exception as e:
                        traceback.print_exc()
                        failed.add(r.label)
                        doc.setdefault("errors", []).append({"strategy": r.label, "update_dist": dist,
                                                             "phase": f"read round {k}",
                                                             "error": f"{type(e).__name__}: {e}"})
                log(f"read round {k + 1}/{len(chunks)} ({len(chunk)} reads per strategy) in "
                    f"{time.perf_counter() - t:.0f}s")
                doc["progress"] = f"{dist}: read round {k + 1}/{len(chunks)}"
                save()
            built = [r for r in built if r.label not in failed]
        for r in built:
            emit(r)
    finally:
        if not (io and args.keep):  # --keep: the stores stay under the work directory, for inspection
            for r in runners:
                r.cleanup()
    doc.pop("progress", None)
    add_relative(doc["runs"])
    save()
    if wl_dir:
        shutil.rmtree(wl_dir, ignore_errors=True)
    del wl


SENS_UPDATE_FACTORS = [0.25, 2.0, 10.0]
SENS_BUFFER_SCALES = [1.0, 0.5, 0.25, 0.125]  # x --write-buffer-frac (the paper's Fig. 7 axis)
SENS_STRATEGIES = ["opt", "lsm", "reader"]


def run_sensitivity(doc, args, N, F, U, reads, dataset, workdir, save) -> None:
    """Update volume (0.25, 2, 10 x N) and write-buffer size (1, 1/2, 1/4, 1/8 x the default
    fraction, the paper's Fig. 7), accounting mode: opt, lsm and READER's default. Rows go to
    doc["sensitivity_runs"], tagged with the varied parameter."""
    points = [(uf, 1.0) for uf in SENS_UPDATE_FACTORS] + [(2.0, b) for b in SENS_BUFFER_SCALES if b != 1.0]
    doc.setdefault("sensitivity_runs", [])
    doc["sensitivity_config"] = {"update_factors": SENS_UPDATE_FACTORS, "buffer_scales": SENS_BUFFER_SCALES,
                                 "base_write_buffer_frac": args.write_buffer_frac, "strategies": SENS_STRATEGIES,
                                 "mode": "accounting", "items": N, "features": F}
    for uf, bscale in points:
        cfg = WorkloadConfig(items=N, features=F, item_bytes=args.item_bytes, updates=int(round(uf * N)),
                             update_dist=args.update_dist.split(",")[0], keys=args.keys,
                             write_buffer_frac=args.write_buffer_frac * bscale, page_size=args.page_size,
                             reads=reads, feature_sigma=args.feature_sigma, batch=args.batch, seed=args.seed)
        sub = {"runs": [], "config": {}}
        t = time.perf_counter()
        run_workload(sub, args, cfg, dataset, SENS_STRATEGIES, "", [cfg.update_dist], workdir, False, save,
                     set_config=False, tag={"update_factor": uf, "buffer_scale": bscale,
                                            "write_buffer_frac": args.write_buffer_frac * bscale})
        add_relative(sub["runs"])
        doc["sensitivity_runs"] += sub["runs"]
        doc.setdefault("errors", []).extend(sub.get("errors", []))
        if not doc["errors"]:
            doc.pop("errors")
        log(f"sensitivity U={uf:g}N buffer x{bscale:g}: {time.perf_counter() - t:.0f}s")
        save()


def plot_sensitivity(doc: dict, path: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    runs = doc.get("sensitivity_runs") or []
    if not runs:
        return
    fig, axes = plt.subplots(2, 2, figsize=(12, 9))
    series = [("lsm", "default", "s-", "#ff7f0e"), ("reader", "default", "o-", "#1f77b4"),
              ("opt", "batched-rmw", "*--", "#2ca02c")]
    for col, (xkey, sel, xlabel) in enumerate([
            ("update_factor", lambda r: r["buffer_scale"] == 1.0, "updates / N"),
            ("buffer_scale", lambda r: r["update_factor"] == 2.0,
             f"write buffer (x {doc.get('sensitivity_config', {}).get('base_write_buffer_frac', 0.025)} of the data)")]):
        for row, (field, ylabel) in enumerate([("read_vs_opt", "bytes read / OPT's (feature reads)"),
                                               ("update_amplification", "update amplification")]):
            ax = axes[row][col]
            for strat, cfg, style, color in series:
                pts = sorted((r[xkey], r[field]) for r in runs if r["strategy"] == strat and r["config"] == cfg
                             and sel(r) and r.get(field) is not None)
                if pts:
                    ax.plot([p[0] for p in pts], [p[1] for p in pts], style, color=color,
                            label=strat if cfg == "default" else f"{strat} ({cfg})")
            ax.set_xscale("log", base=2 if xkey == "buffer_scale" else 10)
            if field == "update_amplification":
                ax.set_yscale("log")
            ax.set_xlabel(xlabel)
            ax.set_ylabel(ylabel)
            ax.grid(alpha=0.3, which="both")
            ax.legend(fontsize=8)
    sc = doc.get("sensitivity_config", {})
    fig.suptitle(f"Sensitivity (accounting mode, {sc.get('items')} items, {sc.get('features')} features): "
                 "update volume and write-buffer size", fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def main(argv=None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    args = parse_args(argv)
    if args.replot:
        with open(args.replot) as f:
            doc = json.load(f)
        fig6 = args.plot or os.path.splitext(args.replot)[0] + "_fig6.png"
        plot_fig6(doc, fig6)
        plot_frontier(doc, args.plot_frontier or fig6.replace("fig6", "frontier"))
        if doc.get("sensitivity_runs"):
            plot_sensitivity(doc, os.path.splitext(args.replot)[0] + "_sensitivity.png")
        return 0
    if args.mode == "accounting" and args.dataset and "," in args.dataset:
        return run_accounting_multi(args, argv)
    if args.dataset and args.dataset not in DATASETS:
        raise SystemExit(f"--dataset must be one of {', '.join(DATASETS)}")
    t_start = time.perf_counter()
    loadavg_start = os.getloadavg()
    N, dataset = resolve(args)
    F = args.features or int(min(2000, max(16, round(N / ITEMS_PER_FEATURE))))
    if args.updates is not None:
        U = args.updates
    else:
        U = int(round((args.update_factor if args.update_factor is not None
                       else (QUICK["update_factor"] if args.quick else 2.0)) * N))
    if args.read_rounds is None:
        args.read_rounds = 2 if args.quick else 4
    reads = args.reads or int(min(PAPER_READS, max(2 * F, round(PAPER_READS * N / DATASETS["XS"]))))
    sweep = args.sweep if args.sweep is not None else (QUICK["sweep"] if args.quick else DEFAULT_SWEEP)
    strategies = [s.strip() for s in args.strategies.split(",") if s.strip()]
    unknown = set(strategies) - set(ALL_STRATEGIES)
    if unknown:
        raise SystemExit(f"unknown strategies {sorted(unknown)}; choose from {ALL_STRATEGIES}")
    dists = [d.strip() for d in args.update_dist.split(",") if d.strip()]
    if set(dists) - {"uniform", "zipf"}:
        raise SystemExit("--update-dist must be uniform, zipf or uniform,zipf")
    if args.sensitivity and args.mode != "accounting":
        raise SystemExit("--sensitivity runs in --mode accounting")
    out_json = args.json or os.path.join(HERE, "results", "compaction.json" if args.mode == "io"
                                         else "compaction_accounting.json")
    os.makedirs(os.path.dirname(os.path.abspath(out_json)), exist_ok=True)
    fig6 = args.plot or (os.path.splitext(out_json)[0] + "_fig6.png")
    frontier = args.plot_frontier or (fig6.replace("fig6", "frontier") if "fig6" in os.path.basename(fig6)
                                      else os.path.splitext(fig6)[0] + "_frontier.png")
    workdir = args.workdir or default_workdir()
    os.makedirs(workdir, exist_ok=True)
    drop = not args.no_drop_caches
    io = args.mode == "io"

    doc = {
        "benchmark": "compaction", "created": datetime.datetime.now().isoformat(timespec="seconds"),
        "command": [sys.executable, os.path.abspath(__file__)] + argv,
        "device": {}, "runs": [], "targets": [],
        "environment": {"loadavg_start": loadavg_start, "cpus": os.cpu_count(),
                        "note": "shared machine: other engineers' jobs run concurrently (see loadavg)",
                        "workdir": workdir},
    }
    notes = {
        "read_time": "sum over feature reads of the wall time to deliver the feature's valid items, keys "
                     "ascending (reader: Store.scan incl. Arrow; lsm/opt: C++ io_uring O_DIRECT reader, QD 32, "
                     "<= 256 KiB requests like the engine, + version resolution; rocksdb: iterator "
                     "Seek(prefix) + copy)",
        "update_amplification": "device bytes written in the update phase (flush + merge/compaction + "
                                "reclamation; WAL excluded) / (updates x item_bytes)",
        "extra_writes_per_update": "update_amplification - 1 (item-sized writes beyond the item itself; "
                                   "the paper's Fig. 6c metric); item size = item_bytes",
        "opt": f"config default = one page per updated item, counted (= page/item = "
               f"{args.page_size}/{args.item_bytes}); batched-rmw = one write per dirty page per flush, executed "
               "in io mode; both rows share the same real reads",
        "reads": f"{reads} feature reads: every feature once, then {reads - F} Zipf(s=1)-weighted repeats; "
                 f"the paper's ~60 K reads scaled by N / 80 M (at least 2 F)",
        "page_cache": "dropped (echo 3 > /proc/sys/vm/drop_caches) before every read phase",
    }
    if not io:
        notes["reader"] = ("reader accounting: the engine's StoreOptions.accounting mode (same layout decisions, "
                           "no page I/O, Store.account_scan() read costs); keys = a bijective hash of the item id; "
                           "the compact() sweep point needs page I/O and is io-only") if reader_has_accounting() \
            else "reader accounting: not implemented (needs engine support); reader rows only in io mode"
        notes["rocksdb"] = "rocksdb rows only in io mode (a real engine)"
    doc["notes"] = notes

    def save():
        doc["environment"]["loadavg_end"] = os.getloadavg()
        doc["wall_s"] = time.perf_counter() - t_start
        doc["peak_rss_mb"] = maxrss_mb()
        with open(out_json, "w") as f:
            json.dump(doc, f, indent=1, default=float)

    try:
        if io and not args.no_device:
            from device import measure_device

            log("measuring the device (fio)")
            try:
                doc["device"] = measure_device(os.path.join(workdir, "device"), quick=args.quick)
            except Exception as e:  # the benchmark still runs; the JSON says why
                doc["device"] = {"error": str(e)}
        elif not io:
            doc["device"] = {"skipped": "accounting mode: no I/O"}
        for dist in dists:
            cfg = WorkloadConfig(items=N, features=F, item_bytes=args.item_bytes, updates=U, update_dist=dist,
                                 keys=args.keys, write_buffer_frac=args.write_buffer_frac, page_size=args.page_size,
                                 reads=reads, feature_sigma=args.feature_sigma, batch=args.batch, seed=args.seed)
            run_workload(doc, args, cfg, dataset, strategies, sweep, dists, workdir, drop, save)
        if args.sensitivity:
            run_sensitivity(doc, args, N, F, U, reads, dataset, workdir, save)
        if io and not args.no_device and "error" not in doc["device"]:
            from device import measure_device

            log("measuring the device again (fio)")
            try:
                doc["device"]["end"] = measure_device(os.path.join(workdir, "device"), quick=args.quick)
            except Exception as e:
                doc["device"]["end"] = {"error": str(e)}
        add_relative(doc["runs"])
        doc["targets"] = evaluate_targets(doc["runs"]) if io else [
            {"target": "all", "pass": None, "detail": "targets are evaluated on io-mode runs"}]
        save()
        if not args.no_plot and doc["runs"]:
            plot_fig6(doc, fig6)
            plot_frontier(doc, frontier)
            doc["plots"] = {"fig6": fig6, "frontier": frontier}
            if doc.get("sensitivity_runs"):
                base = os.path.splitext(out_json)[0]
                sens = base + ".png" if base.endswith("sensitivity") else base + "_sensitivity.png"
                plot_sensitivity(doc, sens)
                doc["plots"]["sensitivity"] = sens
        save()
    finally:
        if not args.keep:
            shutil.rmtree(workdir, ignore_errors=True)

    print_table(doc["runs"])
    for tg in doc["targets"]:
        state = "n/a" if tg["pass"] is None else ("PASS" if tg["pass"] else "FAIL")
        val = f"{tg['value']:.3f}" if isinstance(tg.get("value"), float) else tg.get("value")
        print(f"[{state}] {tg['target']}: {val} (limit {tg.get('limit')}) — {tg['detail']}")
    if doc.get("errors"):
        print(f"errors: {doc['errors']}", file=sys.stderr)
    print(f"wrote {out_json} in {doc['wall_s']:.0f}s (loadavg {doc['environment']['loadavg_start']} -> "
          f"{doc['environment']['loadavg_end']})")
    return 1 if doc.get("errors") else 0


if __name__ == "__main__":
    sys.exit(main())
