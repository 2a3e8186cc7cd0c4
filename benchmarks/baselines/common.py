"""Shared helpers of the compaction benchmark: O_DIRECT file I/O from aligned buffers,
checksums, building the C++ harnesses, dropping the OS page cache."""
from __future__ import annotations

import functools
import json
import mmap
import os
import resource
import shutil
import struct
import subprocess
import time

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
BENCH_DIR = os.path.dirname(HERE)
REPO = os.path.dirname(BENCH_DIR)
CSRC = os.path.join(BENCH_DIR, "csrc")
BUILD_DIR = os.path.join(REPO, "build", "compaction-bench")

#: checksum of an item: key * MIX + (first 8 value bytes as little-endian u64), summed mod 2^64
MIX = np.uint64(0x9E3779B97F4A7C15)

O_DIRECT = getattr(os, "O_DIRECT", 0)


def item_checksums(keys: np.ndarray, vals: np.ndarray) -> np.ndarray:
    """Per-item checksum terms (uint64, wrapping): keys uint64[n], vals uint8[n, V>=8]."""
    v0 = np.ascontiguousarray(vals[:, :8]).view(np.uint64).reshape(-1)
    with np.errstate(over="ignore"):
        return keys.astype(np.uint64, copy=False) * MIX + v0


class AlignedBuffer:
    """A growable page-aligned buffer (anonymous mmap) usable for O_DIRECT."""

    def __init__(self, nbytes: int = 1 << 20):
        self._mm = None
        self.size = 0
        self.ensure(nbytes)

    def ensure(self, nbytes: int) -> None:
        nbytes = max(4096, -(-nbytes // 4096) * 4096)
        if nbytes <= self.size:
            return
        if self._mm is not None:
            self._mm.close()
        self.size = max(nbytes, self.size * 2)
        self._mm = mmap.mmap(-1, self.size)

    def array(self, nbytes: int) -> np.ndarray:
        """uint8 view of the first nbytes (valid until the next ensure())."""
        self.ensure(nbytes)
        return np.frombuffer(self._mm, dtype=np.uint8, count=nbytes)

    def view(self, nbytes: int) -> memoryview:
        return memoryview(self._mm)[:nbytes]

    def close(self) -> None:
        if self._mm is not None:
            self._mm.close()
            self._mm = None


def write_direct(path: str, buf: AlignedBuffer, nbytes: int, offset: int = 0, create: bool = True,
                 sync: bool = True) -> None:
    """Writes buf[:nbytes] to path at offset with O_DIRECT (nbytes a multiple of 4096)."""
    flags = os.O_WRONLY | O_DIRECT | (os.O_CREAT if create else 0)
    fd = os.open(path, flags, 0o644)
    try:
        mv = buf.view(nbytes)
        done = 0
        while done < nbytes:
            n = os.pwrite(fd, mv[done:], offset + done)
            if n <= 0:
                raise OSError(f"short O_DIRECT write to {path}")
            done += n
        if sync:
            os.fdatasync(fd)
    finally:
        os.close(fd)


def read_direct(path: str, buf: AlignedBuffer, nbytes: int, offset: int = 0) -> np.ndarray:
    """Reads nbytes at offset with O_DIRECT into buf; returns the uint8 view."""
    arr = buf.array(nbytes)
    fd = os.open(path, os.O_RDONLY | O_DIRECT)
    try:
        mv = buf.view(nbytes)
        done = 0
        while done < nbytes:
            n = os.preadv(fd, [mv[done:]], offset + done)
            if n <= 0:
                raise OSError(f"short O_DIRECT read from {path} at {offset + done}")
            done += n
    finally:
        os.close(fd)
    return arr


def drop_caches() -> bool:
    """sync + drop the OS page cache (root only). Returns whether it worked."""
    try:
        os.sync()
        with open("/proc/sys/vm/drop_caches", "w") as f:
            f.write("3\n")
        return True
    except OSError:
        return False


HARNESS_BUILD_DIR = os.path.join(REPO, "build", "bench-harness")


def build_harness(name: str, libs: list[str] | None = None) -> str:
    """Builds the benchmark harness benchmarks/csrc/<name>.cc through the project's CMake
    (target <name>, option RECFLASH_BENCH_HARNESSES, build dir build/bench-harness; ninja
    rebuilds it only when its source changed) and returns the binary's path. `libs` is
    ignored: the CMake target names its libraries."""
    cmake = shutil.which("cmake") or "cmake"
    t = time.perf_counter()
    steps = []
    # This interpreter's pyarrow (table_checksum links its C++ libraries): configured with it,
    # and configured again when the build dir knows another interpreter.
    py = f"Python_EXECUTABLE:FILEPATH={sys.executable}"
    cache = os.path.join(HARNESS_BUILD_DIR, "CMakeCache.txt")
    configured = os.path.exists(os.path.join(HARNESS_BUILD_DIR, "build.ninja")) and os.path.exists(cache)
    if not configured or py not in open(cache).read().splitlines():
        steps.append([cmake, "-S", REPO, "-B", HARNESS_BUILD_DIR, "-G", "Ninja", "-DCMAKE_BUILD_TYPE=Release",
                      "-DRECFLASH_PYTHON=OFF", "-DRECFLASH_BENCH_HARNESSES=ON", f"-D{py}"])
    steps.append([cmake, "--build", HARNESS_BUILD_DIR, "--target", name])
    for cmd in steps:
        proc = subprocess.run(cmd, capture_output=True, text=True)
        if proc.returncode != 0:
            raise RuntimeError(f"building {name} failed ({' '.join(cmd)}):\n{(proc.stdout + proc.stderr)[-4000:]}")
    out = os.path.join(HARNESS_BUILD_DIR, name)
    log(f"harness {out} ready in {time.perf_counter() - t:.1f}s")
    return out


def _harness_function(target: str, symbol: str, restype, argtypes, *, gil: bool = False):
    """`symbol` of the shared-library harness `target` (lib<target>.so, built on first use by
    build_harness), typed for ctypes; gil: loaded with ctypes.PyDLL (called with the GIL held,
    for functions that take Python objects), else ctypes.CDLL."""
    import ctypes

    build_harness(target)
    lib = (ctypes.PyDLL if gil else ctypes.CDLL)(os.path.join(HARNESS_BUILD_DIR, f"lib{target}.so"))
    fn = getattr(lib, symbol)
    fn.restype, fn.argtypes = restype, argtypes
    return fn


@functools.cache
def items_checksum_fn():
    """rf_items_checksum(keys address, values address, n, value stride) -> checksum from
    benchmarks/csrc/item_checksum.cc: the sum of item_checksums() of items held in native
    buffers, e.g. an Arrow table's, without any per-item Python or numpy work."""
    import ctypes

    return _harness_function("item_checksum", "rf_items_checksum", ctypes.c_uint64,
                             [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_uint64, ctypes.c_uint64])


@functools.cache
def table_checksum_fn():
    """rf_table_checksum(table, value bytes, byref items, byref checksum) -> 0 from
    benchmarks/csrc/table_checksum.cc (called with the GIL held): the checksum of
    items_checksum_fn() over a scan's pyarrow.Table in one call; -1 for a table it does not
    take (chunked, nulls, another value type), -2 when its columns' lengths differ."""
    import ctypes

    u64p = ctypes.POINTER(ctypes.c_uint64)
    return _harness_function("table_checksum", "rf_table_checksum", ctypes.c_int,
                             [ctypes.py_object, ctypes.c_uint64, u64p, u64p], gil=True)


def maxrss_mb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0


# Imported here, after drop_caches and build_harness, because harness re-exports those two.
import sys  # noqa: E402

from harness import make_log  # noqa: E402

log = make_log(None, elapsed=True, stream=sys.stderr)


# -- page_reader (benchmarks/csrc/page_reader.cc): its plan and result formats -----------------

#: One extent of a plan op: items [first, first + n) of file `file` (rank: LSM file seq).
PLAN_EXTENT = np.dtype([("file", "<u4"), ("rank", "<u4"), ("first", "<u8"), ("n", "<u8")])
#: One record of page_reader's OUT.bin per op.
READER_RESULT = np.dtype([("seconds", "<f8"), ("io_seconds", "<f8"), ("bytes", "<u8"), ("pages", "<u8"),
                          ("items", "<u8"), ("checksum", "<u8")])
#: One record of engine_reader's OUT.bin per read (benchmarks/csrc/engine_reader.cc).
NATIVE_RESULT = np.dtype([("seconds", "<f8"), ("engine_seconds", "<f8"), ("io_wait_seconds", "<f8"),
                          ("bytes", "<u8"), ("pages", "<u8"), ("items", "<u8"), ("checksum", "<u8")])


def plan_header(page_size: int, item_bytes: int, n_ops: int) -> bytes:
    return b"RFPR" + struct.pack("<IIIQ", 1, page_size, item_bytes, n_ops)


def plan_op(feature: int, extents: np.ndarray) -> bytes:
    """One op of a plan: the feature and its extents (PLAN_EXTENT records)."""
    return struct.pack("<II", feature, len(extents)) + np.ascontiguousarray(extents, PLAN_EXTENT).tobytes()


def run_page_reader(files_txt: str, plan_bin: str, out_bin: str, *options: str) -> tuple[np.ndarray, dict]:
    """Runs page_reader over a plan: its per-op results (READER_RESULT) and the totals line."""
    try:
        proc = subprocess.run([build_harness("page_reader", ["-luring"]), files_txt, plan_bin, out_bin, *options],
                              capture_output=True, text=True)
        if proc.returncode != 0:
            raise RuntimeError(f"page_reader {' '.join(options)} failed: {proc.stderr[-3000:]}")
        return np.fromfile(out_bin, dtype=READER_RESULT), json.loads(proc.stdout.strip().splitlines()[-1])
    finally:
        if os.path.exists(out_bin):
            os.unlink(out_bin)
