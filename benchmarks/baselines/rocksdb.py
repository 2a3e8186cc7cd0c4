"""Real RocksDB (`rocksdb` = leveled compaction, `rocksdb-universal`) through the C++ harness
benchmarks/csrc/rocksdb_bench.cc, compiled on first use into build/compaction-bench/.
Data crosses into the harness as binary files (no per-item Python)."""
from __future__ import annotations

import json
import os
import shutil
import subprocess

import numpy as np

from .common import build_harness, log
from .workload import Workload

CACHE_BYTES = 8 << 20


def harness() -> str:
    return build_harness("rocksdb_bench", ["-lrocksdb", "-lpthread"])


def write_workload_files(wl: Workload, d: str) -> None:
    """offsets.bin, keys.bin, init_vals.bin, upd_gids.bin, upd_vals.bin (see the harness)."""
    os.makedirs(d, exist_ok=True)
    wl.off.astype("<u8").tofile(os.path.join(d, "offsets.bin"))
    wl.keys.astype("<u8").tofile(os.path.join(d, "keys.bin"))
    np.ascontiguousarray(wl.init_vals).tofile(os.path.join(d, "init_vals.bin"))
    wl.upd_gids.astype("<u8").tofile(os.path.join(d, "upd_gids.bin"))
    np.ascontiguousarray(wl.upd_vals).tofile(os.path.join(d, "upd_vals.bin"))


class RocksDbStrategy:
    def __init__(self, wl: Workload, style: str, workdir: str, wl_dir: str, cache_bytes: int = CACHE_BYTES):
        self.wl = wl
        self.cache_bytes = cache_bytes
        self.style = style
        self.name = "rocksdb" if style == "leveled" else "rocksdb-universal"
        self.db = os.path.join(workdir, f"rocksdb-{style}")
        self.wl_dir = wl_dir
        self.bin = harness()
        self.write_info: dict = {}
        self.read_info: dict = {}

    def _common(self) -> list[str]:
        wl = self.wl
        return ["--db", self.db, "--style", self.style, "--page-size", str(wl.cfg.page_size),
                "--write-buffer", str(wl.buffer_bytes), "--cache", str(self.cache_bytes),
                "--value-bytes", str(wl.value_bytes), "--batch", str(wl.batch)]

    def write(self) -> dict:
        shutil.rmtree(self.db, ignore_errors=True)
        cmd = [self.bin, "write", "--workload", self.wl_dir] + self._common()
        proc = subprocess.run(cmd, capture_output=True, text=True)
        if proc.returncode != 0:
            raise RuntimeError(f"rocksdb_bench write failed: {proc.stderr[-3000:]}")
        self.write_info = json.loads(proc.stdout.strip().splitlines()[-1])
        self.compaction_stats = proc.stderr[-6000:]
        return self.write_info

    def read(self, reads: np.ndarray, out_bin: str, plan_bin: str) -> np.ndarray:
        with open(plan_bin, "wb") as f:
            f.write(np.uint64(len(reads)).tobytes())
            reads.astype("<u4").tofile(f)
        cmd = [self.bin, "read", "--plan", plan_bin, "--out", out_bin] + self._common()
        proc = subprocess.run(cmd, capture_output=True, text=True)
        if proc.returncode != 0:
            raise RuntimeError(f"rocksdb_bench read failed: {proc.stderr[-3000:]}")
        self.read_info = json.loads(proc.stdout.strip().splitlines()[-1])
        dt = np.dtype([("seconds", "<f8"), ("bytes", "<u8"), ("items", "<u8"), ("checksum", "<u8"),
                       ("block_read_bytes", "<u8")])
        return np.fromfile(out_bin, dtype=dt)

    def cleanup(self) -> None:
        shutil.rmtree(self.db, ignore_errors=True)
