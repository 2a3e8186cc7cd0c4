"""benchmarks/sls_io.py --quick runs end to end and writes the JSON fields the closing note quotes."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

METHODS = ["io_buf", "io_unbuf", "mmap", "mmap_random", "ram", "ratio_1:9", "ratio_5:5", "ratio_9:1", "opt", "uring",
           "recflash_page", "recflash_vector"]


def test_sls_io_benchmark_quick(tmp_path):
    out = tmp_path / "sls.json"
    png = tmp_path / "sls.png"
    t0 = time.perf_counter()
    proc = subprocess.run(
        [sys.executable, os.path.join(ROOT, "benchmarks", "sls_io.py"), "--quick", "--json", str(out),
         "--plot", str(png), "--dir", str(tmp_path / "data")],
        cwd=str(tmp_path), capture_output=True, text=True, timeout=180)
    took = time.perf_counter() - t0
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert took < 90, f"--quick took {took:.0f}s"
    doc = json.loads(out.read_text())
    assert doc["errors"] == [], doc["errors"]
    assert not (tmp_path / "data").exists(), "the data directory is removed after the run"

    # same-run device limits and the host's load
    dev = doc["device"]
    assert dev["rand4k_iops"] > 0 and dev["seq_read_MBps"] > 0
    fio = doc["experiments"]["throughput"]["fio"]
    assert len(fio) >= 2 and all(f["rand512_qd128"]["iops"] > 0 and f["rand512_qd256"]["iops"] > 0 for f in fio)
    assert len(doc["host"]["loadavg_start"]) == 3 and doc["host"]["loadavg"]
    assert doc["device_under_test"]["major"] >= 0

    # every method, every batch size, with latency, throughput, device bytes and memory
    sweep = doc["experiments"]["batch_sweep"]["results"]
    assert set(sweep) == set(METHODS)
    for meth, recs in sweep.items():
        assert [r["batch"] for r in recs] == doc["config"]["batch_sizes"], meth
        for r in recs:
            assert r["batches"] >= 1 and r["lookups"] > 0 and 0 < r["unique_rows"] <= r["lookups"], meth
            assert r["latency_ms"]["mean"] > 0 and r["lookups_per_s"] > 0, meth
            assert r["bytes_per_lookup"] is not None and r["rss_mb"] > 0 and r["cpu_util"] is not None, meth
            assert r["disk"] is not None and "read_ios" in r["disk"] and "read_bytes" in r["disk"], meth
    # cold buffered methods; the rest bypass the page cache
    assert all(r["page_cache_dropped"] for m in ("io_buf", "mmap", "mmap_random") for r in sweep[m])
    # what comes from DRAM and what from the file
    assert all(r["file_rows"] == 0 for r in sweep["ram"])
    assert all(r["dram_rows"] == 0 for r in sweep["io_unbuf"])
    assert all(r["dram_rows"] > 0 and r["file_rows"] > 0 for r in sweep["ratio_5:5"])
    info = doc["experiments"]["batch_sweep"]["method_info"]
    assert info["ram"]["preload"]["bytes"] >= doc["data"]["RM1"]["flat_bytes"]
    assert abs(info["ratio_1:9"]["dram_fraction"] - 0.1) < 0.02 and info["opt"]["dram_fraction"] <= 0.1 + 1e-9
    # the engine: vector-grained rows cost at most one 512-byte block each
    for r in sweep["recflash_vector"]:
        assert r["engine"]["vector_rows"] == r["unique_rows"] and r["engine"]["page_rows"] == 0
        assert r["engine"]["device_bytes"] <= 512 * r["unique_rows"]
    assert all(r["engine"]["page_rows"] == r["unique_rows"] for r in sweep["recflash_page"])

    # every method computed the same pooled vectors as numpy
    val = doc["validation"]["batch_sweep"]
    assert set(val) == set(METHODS), val
    # every method, recflash_page included (its rows are found per page as pages complete, in
    # any order: tests/test_ndp_sls.py::test_page_granular_rows_correct_for_many_pages)
    assert all(v["passed"] for v in val.values()), {k: v for k, v in val.items() if not v["passed"]}

    ls = doc["experiments"]["lookup_sweep"]["results"]
    assert ls and all([r["lookups_per_bag"] for r in recs] == doc["config"]["lookup_sweep"] for recs in ls.values())
    ds = doc["experiments"]["distributions"]
    assert ds["results"] and all("recflash_vector" in r for r in ds["results"].values())
    rounds = doc["experiments"]["throughput"]["rounds"]
    assert rounds and all(r["recflash_vector"]["engine_reads_per_s"] > 0 and r["limit_iops_adjacent"] > 0 for r in rounds)
    assert all(r["uring"]["syscall_reads_per_s"] > 0 for r in rounds)

    # targets are evaluated and reported with their fixed thresholds
    t = doc["targets"]
    assert t["iops_fraction_caches_off"]["threshold"] == 0.85 and t["iops_fraction_caches_off"]["value"] > 0
    assert t["cores_used"]["threshold"] == 1.0
    assert t["device_bytes_per_row"]["threshold"] == 512 and t["device_bytes_per_row"]["value"] > 0
    assert t["latency_vs_io_unbuf"]["threshold"] == 5.0 and t["latency_vs_io_unbuf"]["value"] > 0
    assert t["latency_vs_mmap"]["threshold"] == 3.0 and t["latency_vs_mmap"]["value"] > 0
    assert t["row_cache_speedup_zipf"]["threshold"] == 2.0 or t["row_cache_speedup_zipf"]["passed"] is None
    caches = doc["experiments"]["caches"]
    if caches.get("available"):
        assert {"off", "row"} <= set(caches["configs"])
        assert caches["configs"]["row"]["cache_during_point"]["row_cache"]["hits"] > 0
    assert doc["headline"] and {"method", "batch", "latency_ms", "lookups_per_s", "bytes_per_lookup"} <= set(doc["headline"][0])
    assert png.stat().st_size > 0
