"""The crash/power-loss stress script's quick mode (benchmarks/crash_stress.py --quick): SIGKILLs
at every kill point of the engine and at random moments, simulated power losses, and the
injected-fault matrix — 0 synced items lost, 0 resurrected, every store opens."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


@pytest.mark.timeout(300)
def test_crash_stress_quick(tmp_path):
    from recflash.reader import testing

    out = tmp_path / "stress.json"
    r = subprocess.run([sys.executable, "-P", os.path.join(ROOT, "benchmarks", "crash_stress.py"), "--quick",
                        "--json", str(out), "--workdir", str(tmp_path)], capture_output=True, text=True, timeout=280)
    assert out.exists(), r.stderr[-3000:]
    d = json.loads(out.read_text())
    assert d["child_errors"] == [], d["child_errors"][:2]
    assert d["failures"] == [], d["failures"][:3]
    assert d["kill_trials"] >= 20 and d["power_loss_trials"] >= 9
    assert d["synced_items_checked"] > 0
    assert (d["lost"], d["resurrected"], d["open_failures"], d["duplicates"], d["stats_mismatches"]) == (0, 0, 0, 0, 0)
    # every kill point of the engine was hit by a SIGKILL
    hit = {p.split(":", 1)[1] for p in d["kills_by_phase"] if p.startswith("point:")}
    assert set(testing.KILL_POINTS) <= hit, set(testing.KILL_POINTS) - hit
    for row in d["fault_injections"]:
        assert row["reached"] == row["trials"], row
        assert row["clear_error"] == row["trials"] and row["lost"] == 0 and row["open_failures"] == 0, row
    assert r.returncode == 0, r.stdout[-2000:]
