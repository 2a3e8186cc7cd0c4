"""examples/dlrm_inference_ssd.py --quick: train, plan, export, shard, serve, update; scores equal DRAM."""

import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("torchrec")
REPO = Path(__file__).resolve().parents[1]


@pytest.mark.slow
def test_dlrm_inference_example_quick(tmp_path):
    r = subprocess.run([sys.executable, str(REPO / "examples" / "dlrm_inference_ssd.py"), "--quick", "--batches", "8",
                        "--store", str(tmp_path / "emb"), "--log", str(tmp_path / "torchrec.log")],
                       capture_output=True, text=True, timeout=600, cwd=tmp_path)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    out = r.stdout
    assert "equal within 1e-5" in out and "recflash tiering" in out and "samples/s" in out
    assert "none is materialised" in out
    # TorchRec's planner and torch's notices went to the log file, not the terminal
    assert "is_fx_tracing" not in r.stderr and "HeuristicalStorageReservation" not in r.stderr


@pytest.mark.slow
def test_dlrm_inference_example_quantized(tmp_path):
    """--quantized: plan_quant_offload (int8 costing), export_quantized_tables,
    shard_quant_model_with_ssd; the served scores equal the quantized model all in DRAM."""
    r = subprocess.run([sys.executable, str(REPO / "examples" / "dlrm_inference_ssd.py"), "--quick", "--quantized",
                        "--batches", "8", "--store", str(tmp_path / "emb"), "--log", str(tmp_path / "torchrec.log")],
                       capture_output=True, text=True, timeout=600, cwd=tmp_path)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    out = r.stdout
    assert "quantized to int8" in out and "x 32 int8" in out and "exported the int8 rows of" in out, out[-3000:]
    assert "scores vs the quantized model all in DRAM: max |diff| = 0.00e+00" in out, out[-3000:]
