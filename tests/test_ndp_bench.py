"""benchmarks/ndp_device.py --quick runs end to end and writes the JSON fields the issue names."""

from __future__ import annotations

import json
import os
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def test_ndp_device_benchmark_quick(tmp_path):
    out, png = tmp_path / "ndp.json", tmp_path / "ndp.png"
    proc = subprocess.run([sys.executable, os.path.join(ROOT, "benchmarks", "ndp_device.py"), "--quick", "--json",
                           str(out), "--plot", str(png), "--dir", str(tmp_path / "data")],
                          cwd=str(tmp_path), capture_output=True, text=True, timeout=400)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    doc = json.loads(out.read_text())
    assert doc["errors"] == [], doc["errors"]
    assert png.stat().st_size > 10_000
    assert not (tmp_path / "data").exists(), "the working directory is removed"
    assert doc["device"]["rand4k_iops"] > 0 and len(doc["host"]["loadavg_start"]) == 3
    # every model x method x mode, with the contract's fields
    seen = set()
    for r in doc["runs"]:
        for k in ("model", "method", "mode", "batch", "samples_per_s", "p50_ms", "p99_ms",
                  "bytes_to_device_per_sample", "bytes_to_host_per_sample"):
            assert k in r, (k, r)
        assert r["samples_per_s"] > 0 and 0 < r["p50_ms"] <= r["p99_ms"]
        assert r["cpu_client_cores"] >= 0 and r["device_reads_per_s"] > 0
        seen.add((r["model"], r["method"], r["mode"]))
        if r["method"] == "device_forward":
            assert r["bytes_to_host_per_sample"] < 100, "only scores come back"
    assert seen == {(m, meth, mode) for m in ("RM1", "RM2", "RM3") for meth in ("inprocess", "device_sls", "device_forward")
                    for mode in ("sync", "pipelined")}
    assert {r["dist"] for r in doc["runs"]} == {"uniform", "zipf"}
    # measured traffic: each offload level moves less than the one below it, for RM1
    for m in ("RM1", "RM2", "RM3"):
        t = doc["traffic"][m]
        assert set(t) >= {"page_granular", "row_granular", "sls_offload", "whole_model"}
    t = doc["traffic"]["RM1"]
    assert t["page_granular"] > t["row_granular"] > t["sls_offload"] > t["whole_model"] > 0
    c = doc["concurrency"]
    assert c["clients"] == 8 and c["requests"] > 0 and c["errors"] == 0 and c["mismatches"] == 0
    assert set(doc["targets"]) == {"pipelined_forward_vs_inprocess_b64", "sls_boundary_p50_added_ms_b64",
                                   "whole_model_traffic_reduction_rm1", "concurrency_errors_mismatches"}
    assert doc["boundary"]["noop_rpc_p50_ms"] > 0
