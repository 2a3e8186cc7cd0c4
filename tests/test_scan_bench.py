"""benchmarks/scan.py --quick runs end to end and writes the JSON the closing notes quote."""

from __future__ import annotations

import json
import os
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def test_scan_benchmark_quick(tmp_path):
    out = tmp_path / "scan.json"
    png = tmp_path / "scan.png"
    proc = subprocess.run(
        [sys.executable, os.path.join(ROOT, "benchmarks", "scan.py"), "--quick", "--json", str(out),
         "--plot", str(png), "--dir", str(tmp_path / "work")],
        cwd=str(tmp_path), capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    doc = json.loads(out.read_text())
    assert doc["device"]["seq_read_MBps"] > 0
    res = doc["results"]
    m = res["merged_features"]
    for key in ("useful_MBps", "read_amplification", "read_amplification_encoded", "ratio_to_device_seq",
                "pages_read", "bytes_read", "useful_bytes"):
        assert m[key] is not None, key
    assert m["pages_read"] > 0 and m["useful_bytes"] > 0
    # a compacted feature reads (almost) nothing but its own bytes
    assert m["read_amplification_encoded"] < 1.15
    assert res["errors"] == []
    # the second read of pass 1 reads the same features and bytes (information for the device's first-read gap)
    again, first = res["all_features_second_read"], res["all_features"]
    assert (again["features"], again["useful_bytes"], again["bytes_read"]) == \
        (first["features"], first["useful_bytes"], first["bytes_read"])
    assert again["useful_MBps"] > 0
    fx = res["first_read_extra"]
    assert fx is not None and set(fx) >= {"total_engine_s", "per_feature_ms", "per_page_us"}
    assert abs(fx["total_engine_s"] - (first["engine_seconds"] - again["engine_seconds"])) < 1e-6
    t = doc["targets"]
    assert "merged_scan_ratio_to_device_seq" in t and "merged_read_amplification" in t
    assert t["contents_correct"]["passed"]
    assert png.stat().st_size > 0
