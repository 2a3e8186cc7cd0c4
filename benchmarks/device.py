"""Measure this disk's read limits in the same run as a benchmark.

The machine is shared and noisy, so every benchmark measures the device again, in the
directory where its store lives, and reports its own figures as ratios to these.

Usage as a module (benchmarks/ is on sys.path when a script runs as `python benchmarks/x.py`):

    from device import measure_device
    dev = measure_device("/path/on/the/same/disk", quick=False)
    dev["seq_read_MBps"]

Usage as a script:

    python benchmarks/device.py [--quick] [--dir DIR] [--size BYTES] [--runtime S]

Method: fio (ioengine=io_uring, direct=1) on a test file of `file_bytes` (default 1 GiB,
256 MiB with quick), time-based runs of `runtime` seconds each (default 5 s, quick 2 s):
  - sequential read 128 KiB, QD32
  - random read 16 KiB, QD32
  - random read 4 KiB, QD64
If fio is not installed, a single-threaded O_DIRECT sequential read in Python (1 MiB
os.preadv calls into an mmap-aligned buffer) gives a lower bound on the sequential
bandwidth, marked "method": "python-odirect"; the random-read figures are then None.

MB is 10**6 bytes (MiB figures are given as well).
"""
from __future__ import annotations

import argparse
import json
import mmap
import os
import shutil
import subprocess
import sys
import tempfile
import time

GiB = 1 << 30
MiB = 1 << 20

# (job name, rw, block size, iodepth)
WORKLOADS = [
    ("seq128k_qd32", "read", "128k", 32),
    ("rand16k_qd32", "randread", "16k", 32),
    ("rand4k_qd64", "randread", "4k", 64),
]


def _fio_path() -> str | None:
    return shutil.which("fio")


def _fio_version(fio: str) -> str:
    try:
        out = subprocess.run([fio, "--version"], capture_output=True, text=True, timeout=10)
        return out.stdout.strip() or out.stderr.strip()
    except Exception as e:  # pragma: no cover - diagnostic only
        return f"unknown ({e})"


def _run_fio(fio: str, filename: str, file_bytes: int, runtime: float) -> dict:
    """One fio invocation, jobs separated by stonewall; returns fio's parsed JSON."""
    lines = [
        "[global]",
        "ioengine=io_uring",
        "direct=1",
        f"filename={filename}",
        f"size={file_bytes}",
        "thread=1",
        "numjobs=1",
        "group_reporting=0",
        "time_based=1",
        f"runtime={max(1, int(round(runtime)))}s",
        "ramp_time=0",
        "randrepeat=0",
        "norandommap=1",
        "invalidate=1",
    ]
    for name, rw, bs, qd in WORKLOADS:
        lines += [
            f"[{name}]",
            "stonewall",
            f"rw={rw}",
            f"bs={bs}",
            f"iodepth={qd}",
        ]
    jobfile = filename + ".fio"
    with open(jobfile, "w") as f:
        f.write("\n".join(lines) + "\n")
    try:
        # fio lays the file out (writes it) before the first job if it does not exist yet.
        proc = subprocess.run(
            [fio, "--output-format=json", jobfile],
            capture_output=True,
            text=True,
            timeout=120 + 3 * runtime * 4 + file_bytes / (50 * MiB),
        )
    finally:
        try:
            os.unlink(jobfile)
        except FileNotFoundError:
            pass
    if proc.returncode != 0:
        raise RuntimeError(
            f"fio failed (exit {proc.returncode}) on {filename}: {proc.stderr.strip()[-2000:]}"
        )
    out = proc.stdout
    # fio may print notes before the JSON document; start at the first '{'.
    start = out.find("{")
    if start < 0:
        raise RuntimeError(f"fio printed no JSON: {out[-2000:]} {proc.stderr[-2000:]}")
    return json.loads(out[start:])


def _layout_file(path: str, file_bytes: int) -> None:
    """Write the test file with incompressible data (so reads are real, not holes)."""
    chunk = os.urandom(4 * MiB)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    try:
        left = file_bytes
        while left > 0:
            n = min(left, len(chunk))
            os.write(fd, chunk[:n])
            left -= n
        os.fsync(fd)
    finally:
        os.close(fd)


def _python_odirect_seq(path: str, file_bytes: int, runtime: float) -> dict:
    """Sequential O_DIRECT read with 1 MiB preadv calls, single thread (a lower bound)."""
    block = 1 * MiB
    buf = mmap.mmap(-1, block)  # page-aligned anonymous mapping: valid for O_DIRECT
    fd = os.open(path, os.O_RDONLY | getattr(os, "O_DIRECT", 0))
    total = 0
    try:
        t0 = time.perf_counter()
        off = 0
        while True:
            n = os.preadv(fd, [buf], off)
            if n <= 0:
                off = 0
                continue
            total += n
            off += n
            if off >= file_bytes:
                off = 0
            if time.perf_counter() - t0 >= runtime:
                break
        secs = time.perf_counter() - t0
    finally:
        os.close(fd)
        buf.close()
    return {"bytes": total, "seconds": secs}


def measure_device(
    directory: str | None = None,
    quick: bool = False,
    file_bytes: int | None = None,
    runtime: float | None = None,
    force_python: bool = False,
) -> dict:
    """Measure the disk under `directory` (created if missing). Returns a dict:

    seq_read_MBps, seq_read_MiBps, rand16k_iops, rand16k_MBps, rand4k_iops,
    fio_version, file_bytes, runtime_s, method ("fio-io_uring" or "python-odirect"),
    directory, measured_at (unix time), wall_seconds.
    """
    if directory is None:
        directory = os.path.join(os.path.dirname(os.path.abspath(__file__)), ".work")
    os.makedirs(directory, exist_ok=True)
    if file_bytes is None:
        file_bytes = 256 * MiB if quick else 1 * GiB
    if runtime is None:
        runtime = 2.0 if quick else 5.0
    fd, path = tempfile.mkstemp(prefix="fio-probe-", suffix=".dat", dir=directory)
    os.close(fd)
    os.unlink(path)  # let fio lay it out itself
    t_start = time.perf_counter()
    fio = None if force_python else _fio_path()
    res: dict = {
        "directory": os.path.abspath(directory),
        "file_bytes": int(file_bytes),
        "runtime_s": float(runtime),
        "measured_at": time.time(),
    }
    try:
        if fio is not None:
            doc = _run_fio(fio, path, file_bytes, runtime)
            jobs = {j["jobname"]: j for j in doc.get("jobs", [])}
            missing = [w[0] for w in WORKLOADS if w[0] not in jobs]
            if missing:
                raise RuntimeError(f"fio JSON lacks jobs {missing}")
            for name, *_ in WORKLOADS:
                if jobs[name].get("error", 0):
                    raise RuntimeError(f"fio job {name} error {jobs[name]['error']}")
            seq = jobs["seq128k_qd32"]["read"]
            r16 = jobs["rand16k_qd32"]["read"]
            r4 = jobs["rand4k_qd64"]["read"]
            res.update(
                method="fio-io_uring",
                fio_version=doc.get("fio version") or _fio_version(fio),
                seq_read_MBps=seq["bw_bytes"] / 1e6,
                seq_read_MiBps=seq["bw_bytes"] / MiB,
                rand16k_iops=r16["iops"],
                rand16k_MBps=r16["bw_bytes"] / 1e6,
                rand16k_MiBps=r16["bw_bytes"] / MiB,
                rand4k_iops=r4["iops"],
                rand4k_MBps=r4["bw_bytes"] / 1e6,
                rand16k_clat_mean_us=r16.get("clat_ns", {}).get("mean", 0.0) / 1e3,
                rand4k_clat_mean_us=r4.get("clat_ns", {}).get("mean", 0.0) / 1e3,
            )
        else:
            _layout_file(path, file_bytes)
            r = _python_odirect_seq(path, file_bytes, runtime)
            bw = r["bytes"] / r["seconds"] if r["seconds"] > 0 else 0.0
            res.update(
                method="python-odirect",
                fio_version=None,
                seq_read_MBps=bw / 1e6,
                seq_read_MiBps=bw / MiB,
                rand16k_iops=None,
                rand16k_MBps=None,
                rand4k_iops=None,
                note="fio not found: single-threaded 1 MiB O_DIRECT preadv, a lower bound "
                "on sequential bandwidth; no random-read figures",
            )
    finally:
        for p in (path, path + ".fio"):
            try:
                os.unlink(p)
            except FileNotFoundError:
                pass
    res["wall_seconds"] = time.perf_counter() - t_start
    return res


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--quick", action="store_true", help="256 MiB file, 2 s per workload")
    ap.add_argument("--dir", default=None, help="directory on the disk to measure "
                    "(default benchmarks/.work)")
    ap.add_argument("--size", type=int, default=None, help="test file bytes")
    ap.add_argument("--runtime", type=float, default=None, help="seconds per workload")
    ap.add_argument("--python", action="store_true",
                    help="use the Python O_DIRECT probe even if fio is installed")
    args = ap.parse_args(argv)
    res = measure_device(args.dir, quick=args.quick, file_bytes=args.size,
                         runtime=args.runtime, force_python=args.python)
    print(json.dumps(res, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
