"""TorchRec's quantized inference path with SSD tables; float16 / int8 rows in the store."""

from __future__ import annotations

import numpy as np
import pytest
import torch

pytest.importorskip("torchrec")

import trec_util as tu  # noqa: E402
from recflash.ndp import EmbeddingStore, SlsEngine, SlsRequest  # noqa: E402
from recflash.ndp.row_format import quantize_int8  # noqa: E402
from recflash.reader import Store  # noqa: E402
from recflash.reader.errors import InvalidArgumentError, NotAStoreError, SchemaError  # noqa: E402
from recflash.torchrec_ext import (close_backends, export_quantized_tables, export_tables,  # noqa: E402
                                   shard_quant_model_with_ssd)

SSD = ["user", "item"]


class _Model(torch.nn.Module):
    def __init__(self, ebc):
        super().__init__()
        self.ebc = ebc

    def forward(self, kjt):
        return self.ebc(kjt)


@pytest.fixture(autouse=True)
def _close():
    yield
    close_backends()


def _quantized(seed=0):
    from torchrec.inference.modules import quantize_inference_model

    return quantize_inference_model(_Model(tu.reference_ebc(seed=seed)))


def _outputs(m, kjt):
    out = m(kjt)
    return {k: out[k].detach().numpy() for k in out.keys()}


def test_quantized_path_float_rows_on_ssd(tmp_path):
    """DRAM tables equal TorchRec's QuantEmbeddingBagCollection, SSD tables the float reference."""
    ref = tu.reference_ebc()
    export_tables(ref, tmp_path / "emb", tables=SSD, progress=False)
    quant = _quantized()
    sharded, plan = shard_quant_model_with_ssd(_quantized(), SSD, str(tmp_path / "emb"))
    for seed in range(2):
        kjt = tu.make_kjt(32, seed)
        got, q, f = _outputs(sharded, kjt), _outputs(quant, kjt), _outputs(ref, kjt)
        for k in ("user_id", "item_id", "item_hist"):
            np.testing.assert_allclose(got[k], f[k], atol=1e-5, rtol=0, err_msg=k)
        for k in ("category", "geo_id"):
            np.testing.assert_array_equal(got[k], q[k], err_msg=k)
    # the SSD tables' TBE weights are gone from DRAM
    tbes = [m for m in sharded.modules() if type(m).__name__ == "IntNBitTableBatchedEmbeddingBagsCodegen"]
    assert sorted(s[0] for t in tbes for s in t.embedding_specs) == ["cat", "geo"]


def test_quantized_path_int8_rows_on_ssd_equal_torchrec(tmp_path):
    quant = _quantized()
    info = export_quantized_tables(quant, tmp_path / "emb", tables=SSD, progress=False)
    assert info["user"]["dtype"] == "int8" and info["user"]["row_bytes"] == 16 + 4
    sharded, _ = shard_quant_model_with_ssd(_quantized(), SSD, str(tmp_path / "emb"), row_cache_bytes=1 << 20)
    for seed in range(3):  # the later rounds come from the row cache
        kjt = tu.make_kjt(32, seed % 2)
        got, q = _outputs(sharded, kjt), _outputs(quant, kjt)
        for k in q:
            np.testing.assert_allclose(got[k], q[k], atol=1e-5, rtol=0, err_msg=k)


@pytest.mark.parametrize("dtype", ["float16", "int8"])
def test_store_rows_equal_fbgemm_dequantisation(tmp_path, dtype):
    import fbgemm_gpu  # noqa: F401  (registers the fbgemm ops)

    rng = np.random.default_rng(3)
    w = (rng.standard_normal((500, 24)) * rng.uniform(0.01, 5, (500, 1))).astype(np.float32)
    w[7] = 0.25  # a constant row (range 0)
    if dtype == "int8":
        fb = torch.ops.fbgemm.FloatOrHalfToFusedNBitRowwiseQuantizedSBHalf(torch.from_numpy(w), 8)
        expected = torch.ops.fbgemm.FusedNBitRowwiseQuantizedSBHalfToFloat(fb, 8).numpy()
        tbe_rows = torch.cat([fb[:, -4:], fb[:, :-4]], dim=1).numpy()
        np.testing.assert_array_equal(quantize_int8(w), tbe_rows)  # the same bytes as FBGEMM
    else:
        expected = w.astype(np.float16).astype(np.float32)
    with Store.open(str(tmp_path / "s")) as s:
        e = EmbeddingStore(s)
        info = e.create_table("t", 500, 24, dtype=dtype)
        assert info.row_bytes == (24 + 4 if dtype == "int8" else 48)
        e.load_table("t", w, progress=False)
        np.testing.assert_array_equal(e.read_rows("t", np.arange(500)), expected)
        eng = SlsEngine(e)
        idx = rng.integers(0, 500, 400)
        off = np.arange(0, 400, 8)
        wts = rng.random(400).astype(np.float32)
        for kw in ({"mode": "sum"}, {"mode": "mean"}, {"mode": "sum", "per_sample_weights": wts}):
            got = eng.sls([SlsRequest("t", idx, off, **kw)])[0]
            exp = torch.nn.functional.embedding_bag(torch.from_numpy(idx), torch.from_numpy(expected),
                                                    torch.from_numpy(off), mode=kw["mode"],
                                                    per_sample_weights=None if "per_sample_weights" not in kw
                                                    else torch.from_numpy(wts)).numpy()
            np.testing.assert_allclose(got, exp, atol=1e-5, rtol=1e-6)
        # updates through the row format, and encoded rows taken unchanged
        e.update_rows("t", [1, 2], w[[10, 11]])
        np.testing.assert_array_equal(e.read_rows("t", [1, 2]), expected[[10, 11]])
        raw = e.read_rows("t", [3], raw=True)
        assert raw.dtype == np.uint8 and raw.shape == (1, info.row_bytes)
        e.update_rows("t", [4], raw)
        np.testing.assert_array_equal(e.read_rows("t", [4]), expected[[3]])


def test_quantized_bad_inputs(tmp_path):
    with pytest.raises(InvalidArgumentError, match="unknown table.*nope"):
        shard_quant_model_with_ssd(_quantized(), ["nope"], str(tmp_path))
    with pytest.raises(NotAStoreError, match="does not exist"):
        shard_quant_model_with_ssd(_quantized(), SSD, str(tmp_path / "missing"))
    with Store.open(str(tmp_path / "s")) as s:
        e = EmbeddingStore(s)
        with pytest.raises(InvalidArgumentError, match="row dtype must be one of"):
            e.create_table("x", 10, 4, dtype="bfloat16")
        e.create_table("y", 10, 4, dtype="int8")
        with pytest.raises(SchemaError, match="exists with 10 rows x dim 4 of int8"):
            e.create_table("y", 10, 4, dtype="float16")
        with pytest.raises(InvalidArgumentError, match="encoded int8 rows of dim 4 are 8 bytes"):
            e.update_rows("y", [0], np.zeros((1, 5), np.uint8))


# -- tiering a quantized model ------------------------------------------------------------------
def test_plan_quant_offload_costs_the_quantized_rows_and_shards(tmp_path):
    """DRAM tables cost their int8 rows (dim + 4 bytes), not float32 ones: at a budget of
    120,000 bytes cat (1,600), geo (16,000) and item (36,000) fit and user (100,000) goes to SSD.
    Costed as float32 rows (3,200 / 48,000 / 96,000 / 320,000) only cat and geo would fit. The
    report's SSD tables then shard the model with the int8 rows on SSD, equal to TorchRec."""
    from recflash.torchrec_ext import plan_quant_offload, stored_row_bytes

    quant = _quantized()
    rep = plan_quant_offload(quant, dram_budget_bytes=120_000, batch_size=32, count_engine_dram=False,
                             print_table=False)
    by = {t.name: t for t in rep.tables}
    rows = {n: r for n, r, _, _ in tu.TABLES}
    dims = {n: d for n, _, d, _ in tu.TABLES}
    for n in by:
        assert by[n].dram_bytes == rows[n] * (dims[n] + 4) == rows[n] * stored_row_bytes(dims[n], "int8"), n
        assert by[n].dtype == "int8", n
    assert rep.ssd_tables == ["user"] and sorted(rep.dram_tables) == ["cat", "geo", "item"]
    assert rep.dram_bytes == 1_600 + 16_000 + 36_000
    assert [stored_row_bytes(16, d) for d in ("float32", "float16", "int8")] == [64, 32, 20]
    export_quantized_tables(quant, tmp_path / "emb", tables=rep.ssd_tables, progress=False)
    sharded, _ = shard_quant_model_with_ssd(_quantized(), rep.ssd_tables, str(tmp_path / "emb"))
    kjt = tu.make_kjt(32, 1)
    got, q = _outputs(sharded, kjt), _outputs(quant, kjt)
    for k in q:
        np.testing.assert_allclose(got[k], q[k], atol=1e-5, rtol=0, err_msg=k)


def test_plan_quant_offload_costs_ssd_tables_in_the_stores_rows(tmp_path):
    """An SSD table is costed in the rows the store holds for it: float32 ones exported from the
    float model read 64 bytes a row of user (one 512 B block, as int8's 20 bytes), fill fewer
    rows per page (more block checksums in DRAM), and hold more bytes per gathered row."""
    from recflash.torchrec_ext import plan_quant_offload

    quant = _quantized()
    export_tables(tu.reference_ebc(), tmp_path / "f32", tables=["user"], progress=False)
    export_quantized_tables(quant, tmp_path / "i8", tables=["user"], progress=False)
    reps = {d: plan_quant_offload(quant, ssd_tables=["user"], store_path=str(tmp_path / d), batch_size=32,
                                  print_table=False) for d in ("f32", "i8")}
    user = {d: next(t for t in r.tables if t.name == "user") for d, r in reps.items()}
    assert user["f32"].dtype == "float32" and user["i8"].dtype == "int8"
    assert user["f32"].row_bytes == 64 and user["i8"].row_bytes == 20
    assert user["f32"].dram_bytes == user["i8"].dram_bytes == 5000 * 20  # in DRAM it would be the model's rows
    assert reps["f32"].engine_dram_bytes > reps["i8"].engine_dram_bytes
    assert all(t.dtype == "int8" for r in reps.values() for t in r.tables if t.name != "user")


def test_plan_quant_offload_bad_inputs(tmp_path):
    from recflash.torchrec_ext import plan_offload, plan_quant_offload
    from recflash.reader.errors import UnknownFeatureError

    with pytest.raises(InvalidArgumentError, match="the model is quantized.*plan_quant_offload"):
        plan_offload(_quantized(), 1, dram_budget_bytes=1 << 20, print_table=False)
    with pytest.raises(InvalidArgumentError, match="no QuantEmbeddingBagCollection.*plan_offload"):
        plan_quant_offload(_Model(tu.reference_ebc()), dram_budget_bytes=1 << 20, print_table=False)
    with pytest.raises(InvalidArgumentError, match="exactly one of"):
        plan_quant_offload(_quantized(), print_table=False)
    with pytest.raises(UnknownFeatureError, match="plan_quant_offload: ssd_tables name unknown table.*nope"):
        plan_quant_offload(_quantized(), ssd_tables=["nope"], print_table=False)
    with Store.open(str(tmp_path / "s")) as s:
        EmbeddingStore(s).create_table("user", 4999, 16, dtype="int8")
    with pytest.raises(SchemaError, match="plan_quant_offload: table 'user' is 5000 x 16 in the model but 4999 x 16"):
        plan_quant_offload(_quantized(), ssd_tables=["user"], store_path=str(tmp_path / "s"), print_table=False)
