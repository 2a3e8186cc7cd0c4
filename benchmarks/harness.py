"""What the benchmark programs share: logging, machine load, the device probes (the block device
under a path, /proc/diskstats counters, fio random reads, holes in a file), the page-cache
drop, and the last step of every run (the result JSON, its plot, each target's verdict).

Imported by the scripts in this directory (each puts it on sys.path) as ``harness``.
"""
from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path
from typing import Callable, Optional



# -- logging and load ----------------------------------------------------------------------------

def make_log(name: Optional[str], *, elapsed: bool = False, stream=None) -> Callable[[str], None]:
    """A log(msg) printing ``[name HH:MM:SS] msg`` (or seconds since this call with `elapsed`),
    flushed, to stdout or `stream`."""
    t0 = time.perf_counter()
    prefix = f"{name} " if name else ""

    def log(msg: str) -> None:
        stamp = f"{time.perf_counter() - t0:7.1f}s" if elapsed else time.strftime("%H:%M:%S")
        print(f"[{prefix}{stamp}] {msg}", file=stream or sys.stdout, flush=True)

    return log


def loadavg() -> list:
    """1, 5 and 15 minute load averages, rounded: recorded with every timing on a shared machine."""
    return [round(x, 2) for x in os.getloadavg()]


# -- device probes -------------------------------------------------------------------------------

def block_device_of(path: str) -> dict:
    """The /proc/diskstats entry of the device holding `path` (by st_dev major:minor)."""
    st = os.stat(path)
    major, minor = os.major(st.st_dev), os.minor(st.st_dev)
    name = None
    with open("/proc/diskstats") as f:
        for line in f:
            p = line.split()
            if int(p[0]) == major and int(p[1]) == minor:
                name = p[2]
                break
    info = {"major": major, "minor": minor, "name": name, "in_diskstats": name is not None}
    if name:
        for key, fn in (("logical_block_size", "queue/logical_block_size"), ("physical_block_size", "queue/physical_block_size"),
                        ("rotational", "queue/rotational"), ("read_ahead_kb", "queue/read_ahead_kb"),
                        ("nr_requests", "queue/nr_requests"), ("scheduler", "queue/scheduler"),
                        ("model", "device/model")):
            for base in (f"/sys/class/block/{name}", f"/sys/class/block/{name}/.."):
                try:
                    with open(os.path.join(base, fn)) as f:
                        v = f.read().strip()
                    info[key] = int(v) if v.isdigit() else v
                    break
                except OSError:
                    continue
    return info



def diskstats(major: int, minor: int):
    with open("/proc/diskstats") as f:
        for line in f:
            p = line.split()
            if int(p[0]) == major and int(p[1]) == minor:
                v = [int(x) for x in p[3:]]
                return {"read_ios": v[0], "read_merges": v[1], "read_bytes": v[2] * 512, "read_ticks_ms": v[3],
                        "write_ios": v[4], "write_bytes": v[6] * 512}
    return None



def diskstats_of(path: str):
    """diskstats() of the device holding `path`."""
    st = os.stat(path)
    return diskstats(os.major(st.st_dev), os.minor(st.st_dev))


def fio_randread(path: str, size: int, bs: int, qd: int, runtime: float, dev=None) -> dict:
    """fio random reads (io_uring, O_DIRECT, read-only) over an existing file; with `dev`
    ((major, minor)), also the other processes' reads on the device meanwhile."""
    fio = shutil.which("fio")
    if not fio:
        return {"error": "fio not installed"}
    cmd = [fio, "--name=r", f"--filename={path}", "--readonly", f"--size={size}", "--ioengine=io_uring",
           "--direct=1", "--rw=randread", f"--bs={bs}", f"--iodepth={qd}", "--time_based",
           f"--runtime={max(1, int(round(runtime)))}s", "--norandommap", "--randrepeat=0", "--thread",
           "--output-format=json"]
    d0 = diskstats(*dev) if dev else None
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=60 + 3 * runtime)
    d1 = diskstats(*dev) if dev else None
    if proc.returncode != 0:
        return {"error": proc.stderr.strip()[-500:]}
    doc = json.loads(proc.stdout[proc.stdout.find("{"):])
    r = doc["jobs"][0]["read"]
    out = {"bs": bs, "qd": qd, "iops": r["iops"], "iops_fio": r["iops"], "MBps": r["bw_bytes"] / 1e6,
           "clat_mean_us": r.get("clat_ns", {}).get("mean", 0.0) / 1e3, "runtime_s": runtime,
           "holes_bytes": file_holes(path, size)}
    if d0 and d1:
        own_ios, own_bytes = r.get("total_ios", 0), r.get("io_bytes", 0)
        dev_ios = d1["read_ios"] - d0["read_ios"]
        out["device_read_ios"] = dev_ios
        out["foreign_read_ios"] = max(0, dev_ios - own_ios)
        out["foreign_read_bytes"] = max(0, d1["read_bytes"] - d0["read_bytes"] - own_bytes)
        out["clean"] = is_clean(own_ios, own_bytes, out["foreign_read_ios"], out["foreign_read_bytes"])
        # Reads that never reached the device (a hole in the file reads as zeros without I/O)
        # would inflate fio's figure: the limit is what the device itself served.
        secs = (r.get("runtime") or runtime * 1000) / 1000
        out["iops_device"] = dev_ios / secs if secs else None
        out["not_from_device_fraction"] = max(0.0, 1 - dev_ios / own_ios) if own_ios else None
        if out["iops_device"] is not None:
            out["iops"] = min(r["iops"], out["iops_device"])
    return out



def file_holes(path: str, size: int = 0) -> int:
    """Bytes of `path` (its first `size` bytes when given) that are holes — unallocated ranges,
    which read as zeros without any device I/O (SEEK_DATA / SEEK_HOLE)."""
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:
        return 0
    try:
        end = size or os.fstat(fd).st_size
        holes, pos = 0, 0
        while pos < end:
            try:
                data = os.lseek(fd, pos, os.SEEK_DATA)
            except OSError:  # no data after pos
                return holes + end - pos
            holes += min(data, end) - pos
            if data >= end:
                break
            pos = os.lseek(fd, data, os.SEEK_HOLE)
        return holes
    finally:
        os.close(fd)



# The device is shared: a measurement is "clean" when other processes read little meanwhile.
CLEAN_MAX_FOREIGN_IOS = 0.02    # of our own read requests
CLEAN_MAX_FOREIGN_BYTES = 0.10  # of our own read bytes


def is_clean(own_ios, own_bytes, foreign_ios, foreign_bytes) -> bool:
    return foreign_ios <= CLEAN_MAX_FOREIGN_IOS * max(own_ios, 1) and foreign_bytes <= CLEAN_MAX_FOREIGN_BYTES * max(own_bytes, 1)



# -- the last step of a run ------------------------------------------------------------------------

def write_report(res: dict, json_path: str, plot_path: Optional[str], plot: Callable[[Path, dict], None],
                 log: Callable[[str], None], number: str = ",.2f") -> None:
    """res["targets"]: {name: {"target", "measured", "met", ...}}; the plot goes to plot_path or
    next to the JSON with a .png suffix."""
    Path(json_path).parent.mkdir(parents=True, exist_ok=True)
    Path(json_path).write_text(json.dumps(res, indent=1, default=float) + "\n")
    log(f"results in {json_path}")
    png = Path(plot_path) if plot_path else Path(json_path).with_suffix(".png")
    try:
        plot(png, res)
        log(f"plot in {png}")
    except ImportError:
        log("matplotlib missing: no plot")
    for name, t in res.get("targets", {}).items():
        log(f"target {name}: {format(t['measured'], number)} vs {format(t['target'], number)} -> "
            f"{'met' if t['met'] else 'MISSED'}")


def remove_workdir(work: Path, parent_too: bool) -> None:
    """Deletes a benchmark's working directory, and its parent when the benchmark created that
    too (the default /tmp/<benchmark>/run-PID layout) and it is now empty."""
    import shutil

    shutil.rmtree(work, ignore_errors=True)
    if parent_too:
        try:
            work.parent.rmdir()
        except OSError:
            pass


# Re-exported so a benchmark imports its shared pieces from one place (after the definitions
# above: baselines.common takes make_log from here).
from baselines.common import build_harness, drop_caches  # noqa: E402,F401  (page-cache drop; C++ harnesses via CMake)
from device import measure_device  # noqa: E402,F401  (the device's limits, fio, in the same run)
