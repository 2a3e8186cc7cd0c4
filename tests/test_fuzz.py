"""Fuzz targets (tests/fuzz/targets.py): every seed and regression input of each target's
corpus passes, and a short coverage-guided atheris run of each target finds nothing.
Long runs: ``python tests/fuzz/run.py --minutes M`` (``make fuzz`` under ASan/UBSan)."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

HERE = os.path.dirname(os.path.abspath(__file__))
FUZZ = os.path.join(HERE, "fuzz")
sys.path.insert(0, FUZZ)

import targets  # noqa: E402


@pytest.mark.parametrize("name", sorted(targets.TARGETS))
def test_corpus_inputs_pass(name):
    d = os.path.join(FUZZ, "corpus", name)
    files = sorted(os.listdir(d)) if os.path.isdir(d) else []
    assert files, f"no seed corpus for {name}"
    for f in files:
        with open(os.path.join(d, f), "rb") as fh:
            targets.TARGETS[name](fh.read())


@pytest.mark.timeout(400)
def test_short_fuzz_run_finds_nothing(tmp_path):
    """A fixed libFuzzer seed, so a CI run repeats what passed here (within its time budget);
    exploring with fresh seeds is the long run's job (make fuzz)."""
    pytest.importorskip("atheris")
    out = tmp_path / "fuzz.json"
    r = subprocess.run([sys.executable, "-P", os.path.join(FUZZ, "run.py"), "--seconds-per-target", "3",
                        "--json", str(out), "--out", str(tmp_path), "--seed", "1"], capture_output=True, text=True, timeout=380)
    d = json.loads(out.read_text())
    assert d["crashes"] == 0 and d["sanitizer_reports"] == 0 and not d["failed_targets"], r.stdout + r.stderr[-3000:]
    assert all(t["executions"] > 0 for t in d["targets"]), d["targets"]
