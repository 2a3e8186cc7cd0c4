"""benchmarks/inference.py --quick: every method runs in its memory cgroup and matches dram."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("torchrec")
REPO = Path(__file__).resolve().parents[1]


@pytest.mark.slow
def test_inference_benchmark_quick(tmp_path):
    out = tmp_path / "inference.json"
    r = subprocess.run([sys.executable, str(REPO / "benchmarks" / "inference.py"), "--quick", "--json", str(out),
                        "--work", str(tmp_path / "work"), "--methods", "dram,mmap,recflash,recflash+cache"],
                       capture_output=True, text=True, timeout=600, cwd=tmp_path)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    res = json.loads(out.read_text())
    assert not res["errors"], res["errors"]
    assert out.with_suffix(".png").exists()
    methods = {x["method"] for x in res["runs"]}
    assert methods == {"dram", "mmap", "recflash", "recflash+cache"}
    for run in res["runs"]:
        for k in ("model", "method", "batch", "trace", "samples_per_s", "p50_ms", "p95_ms", "p99_ms",
                  "peak_dram_bytes", "device_reads", "device_bytes", "hit_rate", "max_abs_diff",
                  "iops_bound_fraction"):
            assert k in run, k
        assert run["samples_per_s"] > 0
        if run["method"] != "dram":
            assert run["max_abs_diff"] is not None and run["max_abs_diff"] <= 1e-5, run
    assert res["device"].get("iops", 0) > 0 and res["budget_frac"] == 0.125
    if os.geteuid() == 0:  # root makes the cgroups
        limited = [c for c in res["models"]["RM1"]["children"].values() if c["cgroup"]["limit_bytes"]]
        assert limited and all(c["cgroup"]["version"] for c in limited)
    cache = [x for x in res["runs"] if x["method"] == "recflash+cache"]
    assert all(x["hit_rate"] is not None for x in cache)
