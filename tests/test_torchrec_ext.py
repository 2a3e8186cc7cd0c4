"""TorchRec inference with SSD-offloaded tables: sharder, planner, export, checkpoints, updates."""

from __future__ import annotations

import os

import numpy as np
import pytest
import torch

pytest.importorskip("torchrec")

from torchrec import EmbeddingBagCollection, KeyedJaggedTensor  # noqa: E402
from torchrec.distributed.embedding_types import EmbeddingComputeKernel  # noqa: E402

import trec_util as tu  # noqa: E402
from recflash.reader.errors import (InvalidArgumentError, NotAStoreError, RecflashError,  # noqa: E402
                                    SchemaError, UnknownFeatureError)
from recflash.torchrec_ext import (SsdEmbeddingBagCollectionSharder, close_backends, export_tables,  # noqa: E402
                                   find_ssd_modules, plan_offload, update_rows)
from recflash.torchrec_ext.planner import SsdStorageEstimator  # noqa: E402

SSD = ["user", "item"]
TOL = 1e-5


@pytest.fixture(scope="module", autouse=True)
def _process_group():
    tu.init_single_rank()
    yield
    close_backends()


@pytest.fixture(autouse=True)
def _close_backends():
    yield
    close_backends()


def _exported(tmp_path, pooling="sum", weighted=False, tables=SSD, **kw):
    ref = tu.reference_ebc(pooling, weighted)
    path = str(tmp_path / "emb")
    export_tables(ref, path, tables=tables, progress=False, **kw)
    return ref, path


def _sharded(path, pooling="sum", weighted=False, ssd=SSD, load_from=None, **sls_options):
    model = EmbeddingBagCollection(tables=tu.table_configs(pooling), is_weighted=weighted, device=torch.device("meta"))
    plan = plan_offload(model, world_size=1, ssd_tables=ssd, print_table=False)
    dmp = tu.shard(model, plan, path, **sls_options)
    if load_from is not None:
        dmp.load_state_dict({k: v for k, v in load_from.state_dict().items() if not any(f".{t}." in k for t in ssd)},
                            strict=False)
    return dmp, plan


@pytest.mark.parametrize("pooling,weighted", [("sum", False), ("mean", False), ("sum", True)])
def test_sharded_equals_unsharded_world_size_1(tmp_path, pooling, weighted):
    ref, path = _exported(tmp_path, pooling, weighted)
    dmp, plan = _sharded(path, pooling, weighted, load_from=ref)
    kernels = {t: ps.compute_kernel for t, ps in plan.plan[""].items()}
    assert kernels == {"user": "customized_kernel", "item": "customized_kernel", "cat": "fused", "geo": "fused"}
    for seed in range(3):
        kjt = tu.make_kjt(64, seed, weighted)
        got, exp = tu.forward_dict(dmp, kjt), tu.forward_dict(ref, kjt)
        assert got.keys() == exp.keys()
        for k in exp:
            np.testing.assert_allclose(got[k], exp[k], atol=TOL, rtol=0, err_msg=k)
    # the SSD tables went through recflash, not DRAM
    (mod,) = find_ssd_modules(dmp)
    assert mod.local_ssd_tables() == ["item", "user"]
    assert mod.ssd_backend.last_stats["lookups"] > 0
    names = [n for n, _ in dmp.named_parameters()]
    assert not any(".user." in n or ".item." in n for n in names), names


def test_sharded_equals_unsharded_world_size_2(tmp_path):
    from torchrec.distributed.test_utils.multi_process import run_multi_process_func

    _, path = _exported(tmp_path)
    tu.env_for_spawn()
    try:
        results = run_multi_process_func(tu.sharded_rank_run, world_size=2, store_path=path, ssd_tables=SSD,
                                         pooling="sum", weighted=False, batch=32, seeds=[0, 1])
        results += run_multi_process_func(tu.sharded_rank_run, world_size=2, store_path=path, ssd_tables=SSD,
                                          pooling="mean", weighted=False, batch=16, seeds=[2])
    finally:
        torch.use_deterministic_algorithms(False)
    for r in results:
        for k, d in r["diffs"].items():
            assert d <= TOL, (k, d)
    # table-wise: each SSD table lives on one rank; with two tables both ranks serve one
    owners = sorted(r for rs in results[0]["ranks"].values() for r in rs)
    assert owners == [0, 1]


def test_plan_offload_with_ssd_tables_charges_ssd_not_ddr():
    model = EmbeddingBagCollection(tables=tu.table_configs(), device=torch.device("meta"))
    plan = plan_offload(model, world_size=1, ssd_tables=["user"], print_table=False)
    ps = plan.plan[""]
    assert ps["user"].compute_kernel == EmbeddingComputeKernel.CUSTOMIZED_KERNEL.value
    assert ps["user"].sharding_type == "table_wise"
    assert {ps[t].compute_kernel for t in ("item", "cat", "geo")} == {"fused"}
    assert plan.tiering.ssd_tables == ["user"]

    # The storage estimator puts SSD rows on Storage.ssd and only the caches on DDR.
    from torchrec.distributed.planner.types import Shard, ShardingOption

    so = ShardingOption(name="user", tensor=torch.empty(5000, 16, device="meta"), module=("", model),
                        input_lengths=[1.0], batch_size=64, sharding_type="table_wise", partition_by="device",
                        compute_kernel="customized_kernel", shards=[Shard(size=[5000, 16], offset=[0, 0])])
    SsdStorageEstimator(None, None, {"user": 512}, cache_bytes=4096).estimate([so], {})
    assert so.shards[0].storage.ssd == 5000 * 512 and so.shards[0].storage.ddr == 4096
    assert so.shards[0].storage.hbm == 0


def test_plan_offload_under_a_budget_sends_low_density_tables_to_ssd():
    model = EmbeddingBagCollection(tables=tu.table_configs(), device=torch.device("meta"))
    # densities (bandwidth per DRAM byte): pooling / (rows x dim x 4) x 512 x qps
    pf = {"user": 1.0, "item": 20.0, "cat": 5.0, "geo": 0.1}
    budget = 4 * (3000 * 8 + 200 * 4) + 100  # item and cat fit; user and geo do not
    plan = plan_offload(model, world_size=1, dram_budget_bytes=budget, qps=2000, pooling_factors=pf,
                        device_iops=80_000, print_table=False, count_engine_dram=False)  # tables alone
    rep = plan.tiering
    assert sorted(rep.ssd_tables) == ["geo", "user"]
    assert sorted(rep.dram_tables) == ["cat", "item"]
    assert rep.dram_bytes <= budget
    dens = {t.name: t.density for t in rep.tables}
    assert max(dens[t] for t in rep.ssd_tables) <= min(dens[t] for t in rep.dram_tables)
    assert rep.ssd_reads_per_s == pytest.approx(2000 * (1.0 + 0.1))
    assert rep.device_fraction == pytest.approx(2000 * 1.1 / 80_000)
    ps = plan.plan[""]
    assert {t for t, p in ps.items() if p.compute_kernel == "customized_kernel"} == {"geo", "user"}
    d = rep.to_dict()
    assert d["ssd_bytes_per_s"] == pytest.approx(2000 * 512 * 1.1)
    # the engine's requests at the plan's batch: de-duplication and dense pages only lower them
    assert d["batch_size"] == 512
    assert 0 < d["ssd_device_reads_per_sample"] == pytest.approx(rep.ssd_device_reads_per_sample(512))
    assert d["ssd_device_reads_per_sample"] <= rep.ssd_reads_per_sample
    from rich.console import Console

    console = Console(record=True, width=160)
    rep.render(console)
    assert "At batch 512 the engine issues about" in console.export_text()


def test_tier_tables_equals_the_rule_applied_table_by_table():
    """tier_tables keeps the engine's share of the tables left on SSD as running sums; its tiers
    equal the rule stated directly (each candidate, densest first, goes to DRAM if its rows plus
    engine_dram_bytes of every other table still on SSD fit), for many tables with fractional
    pooling factors, budgets around every crossing and no engine share."""
    from recflash.torchrec_ext import engine_dram_bytes
    from recflash.torchrec_ext.planner import TableDemand, tier_tables

    rng = np.random.default_rng(5)

    def demands(n):
        out = []
        for i in range(n):
            rows, dim = int(rng.integers(1_000, 3_000_000)), int(rng.choice([4, 8, 16, 32, 64, 128]))
            pf = float(rng.choice([0.1, 0.3, 1.0, 2.5, 20.0, 80.0]))
            out.append(TableDemand(name=f"t{i:03d}", rows=rows, dim=dim, pooling_factor=pf, dram_bytes=4 * rows * dim,
                                   ssd_row_bytes=512, bandwidth=1000 * pf * 512))
        return out

    def reference(ds, budget, batch):
        ssd, used, tiers = list(ds), 0, {}
        for t in sorted(ds, key=lambda t: (-t.density, t.name)):
            rest = [x for x in ssd if x is not t]
            engine = engine_dram_bytes(rest, batch) if batch else 0
            if used + t.dram_bytes + engine <= budget:
                tiers[t.name], used, ssd = "dram", used + t.dram_bytes, rest
            else:
                tiers[t.name] = "ssd"
        return tiers

    for n in (2, 7, 60, 300):
        ds = demands(n)
        total = sum(t.dram_bytes for t in ds)
        for batch in (None, 64, 4096):
            budgets = {int(total * f) for f in (0.001, 0.05, 0.2, 0.5, 0.9, 0.999)}
            # around a crossing: the exact budget that lets the densest table in, and one byte less
            dense = sorted(ds, key=lambda t: (-t.density, t.name))[0]
            edge = dense.dram_bytes + (engine_dram_bytes([t for t in ds if t is not dense], batch) if batch else 0)
            budgets |= {edge, edge - 1}
            for b in sorted(budgets):
                want = reference(ds, b, batch)
                got = {t.name: t.tier for t in tier_tables(ds, b, batch)}
                if total <= b:
                    want = {t.name: "dram" for t in ds}
                assert got == want, (n, batch, b)


def test_plan_offload_budget_pays_for_the_engine_dram_of_ssd_tables():
    from torchrec import EmbeddingBagConfig

    from recflash.torchrec_ext import engine_dram_bytes, ssd_resident_bytes
    from recflash.torchrec_ext.planner import READ_BUFFER_BYTES

    shapes = {"user": (2_000_000, 16), "item": (1_000_000, 8), "cat": (200_000, 4), "geo": (500_000, 12)}
    cfgs = [EmbeddingBagConfig(name=n, num_embeddings=r, embedding_dim=d, feature_names=[n]) for n, (r, d) in shapes.items()]
    model = EmbeddingBagCollection(tables=cfgs, device=torch.device("meta"))  # never allocated
    pf = {"user": 1.0, "item": 20.0, "cat": 5.0, "geo": 0.1}  # density order: cat, item, user, geo
    # block checksums: 4 B per 512 B block of each page + 64 B per page; 255 rows of dim 16 per page
    assert ssd_resident_bytes(5000, 16) == -(-5000 // 255) * (4 * 32 + 64)
    tables = {n: 4 * r * d for n, (r, d) in shapes.items()}

    def plan(budget, batch=64):
        return plan_offload(model, world_size=1, dram_budget_bytes=budget, qps=2000, pooling_factors=pf,
                            batch_size=batch, print_table=False).tiering

    rep0 = plan(sum(tables.values()))  # everything fits exactly: no SSD table, so no engine DRAM
    assert rep0.ssd_tables == [] and rep0.engine_dram_bytes == 0 and rep0.over_budget_bytes == 0
    ssd = [t for t in rep0.tables if t.name in ("user", "geo")]
    engine = engine_dram_bytes(ssd, 64)
    batch_rows = sum(2 * 4 * t.dim * 64 * t.pooling_factor for t in ssd)
    sums = ssd_resident_bytes(*shapes["user"]) + ssd_resident_bytes(*shapes["geo"])
    assert engine == int(READ_BUFFER_BYTES + sums + batch_rows)
    exact = tables["item"] + tables["cat"] + engine
    rep = plan(exact)  # item and cat fit only with the engine's share for user and geo counted
    assert sorted(rep.dram_tables) == ["cat", "item"] and rep.engine_dram_bytes == engine
    assert rep.dram_bytes + rep.engine_dram_bytes == exact and rep.over_budget_bytes == 0
    without = plan_offload(model, world_size=1, dram_budget_bytes=exact - 1, qps=2000, pooling_factors=pf,
                           batch_size=64, print_table=False, count_engine_dram=False).tiering
    assert sorted(without.dram_tables) == ["cat", "item"]  # tables alone: they fit
    rep = plan(exact - 1)  # one byte less: item moves to SSD (geo, smaller, may take its place)
    assert "item" not in rep.dram_tables and "cat" in rep.dram_tables
    assert rep.dram_bytes + rep.engine_dram_bytes <= exact - 1 and rep.over_budget_bytes == 0
    tiny = plan(4096)  # not even the engine fits: every table on SSD, the excess reported
    assert sorted(tiny.ssd_tables) == sorted(shapes) and tiny.over_budget_bytes == tiny.engine_dram_bytes - 4096
    d = tiny.to_dict()
    assert d["engine_dram_bytes"] == tiny.engine_dram_bytes and d["engine_dram_counted"] is True
    assert d["over_budget_bytes"] > 0
    from rich.console import Console

    console = Console(record=True, width=200)
    tiny.render(console)
    text = console.export_text()
    assert "The engine keeps about" in text and "The budget is passed by" in text
    # one call's rows are bounded by the kernel's max_gather_bytes
    assert engine_dram_bytes(ssd, 10 ** 7) == READ_BUFFER_BYTES + sums + (16 << 20)


def test_checkpoint_load_and_export_round_trip(tmp_path):
    trained = tu.reference_ebc(seed=7)
    path = str(tmp_path / "emb")
    # the store holds other weights (an older model); loading the checkpoint routes the new rows there
    export_tables(tu.reference_ebc(seed=1), path, tables=SSD, progress=False)
    model = EmbeddingBagCollection(tables=tu.table_configs(), device=torch.device("meta"))
    plan = plan_offload(model, world_size=1, ssd_tables=SSD, print_table=False)
    dmp = tu.shard(model, plan, path, row_cache_bytes=1 << 20)
    kjt = tu.make_kjt(32, 3)
    tu.forward_dict(dmp, kjt)  # warm the row cache with the old rows
    res = dmp.load_state_dict(trained.state_dict(), strict=True)
    assert not res.missing_keys and not res.unexpected_keys
    got, exp = tu.forward_dict(dmp, kjt), tu.forward_dict(trained, kjt)
    for k in exp:
        np.testing.assert_allclose(got[k], exp[k], atol=TOL, rtol=0, err_msg=k)
    (mod,) = find_ssd_modules(dmp)
    exported = mod.ssd_state_dict()
    for t in SSD:
        np.testing.assert_array_equal(exported[f"embedding_bags.{t}.weight"].numpy(),
                                      trained.embedding_bags[t].weight.detach().numpy())
    # state_dict() carries the SSD tables only when asked (they may not fit in DRAM)
    assert not any(".user." in k for k in dmp.state_dict())
    mod.include_ssd_in_state_dict = True
    sd = dmp.state_dict()
    np.testing.assert_array_equal(sd["embedding_bags.user.weight"].numpy(),
                                  trained.embedding_bags["user"].weight.detach().numpy())
    # ... and that state dict loads into a plain DRAM model with the same outputs
    plain = EmbeddingBagCollection(tables=tu.table_configs(), device=torch.device("cpu"))
    plain.load_state_dict({k: (v.local_shards()[0].tensor if hasattr(v, "local_shards") else v) for k, v in sd.items()})
    again = tu.forward_dict(plain, kjt)
    for k in exp:
        np.testing.assert_allclose(again[k], exp[k], atol=TOL, rtol=0, err_msg=k)


def test_update_rows_visible_to_next_forward_with_caches(tmp_path):
    ref, path = _exported(tmp_path)
    dmp, _ = _sharded(path, load_from=ref, row_cache_bytes=1 << 20, pooled_cache_bytes=1 << 20, pooled_min_bag=1)
    kjt = tu.make_kjt(16, 5)
    tu.forward_dict(dmp, kjt)
    tu.forward_dict(dmp, kjt)  # rows and bags now cached
    ids = torch.unique(kjt["user_id"].values())[:10]
    new = torch.randn(len(ids), 16)
    update_rows(dmp, "user", ids, new)
    with torch.no_grad():
        ref.embedding_bags["user"].weight[ids] = new
    got, exp = tu.forward_dict(dmp, kjt), tu.forward_dict(ref, kjt)
    for k in exp:
        np.testing.assert_allclose(got[k], exp[k], atol=TOL, rtol=0, err_msg=k)
    with pytest.raises(InvalidArgumentError, match="no SSD table 'cat'"):
        update_rows(dmp, "cat", ids, new)


def test_ssd_table_larger_than_ram_is_never_materialised(tmp_path):
    """A 1e9 x 64 SSD table (256 GB as float32) plans, shards and serves; only written rows exist."""
    from recflash.ndp import EmbeddingStore
    from recflash.reader import Store

    huge = [("huge", 1_000_000_000, 64, ["huge_id"]), ("small", 100, 4, ["small_id"])]
    path = str(tmp_path / "emb")
    ids = torch.tensor([3, 999_999_999, 123_456_789, 7])
    rows = torch.randn(len(ids), 64)
    with Store.open(path) as s:
        e = EmbeddingStore(s)
        e.create_table("huge", 1_000_000_000, 64)
        e.update_rows("huge", ids, rows)
    model = EmbeddingBagCollection(tables=tu.table_configs(tables=huge), device=torch.device("meta"))
    plan = plan_offload(model, world_size=1, ssd_tables=["huge"], print_table=False)
    dmp = tu.shard(model, plan, path)
    assert sum(p.numel() for p in dmp.parameters()) == 100 * 4
    kjt = KeyedJaggedTensor.from_lengths_sync(keys=["huge_id", "small_id"], values=torch.tensor([3, 999_999_999, 7, 1]),
                                              lengths=torch.tensor([2, 1, 1, 0]))
    out = tu.forward_dict(dmp, kjt)["huge_id"]
    np.testing.assert_allclose(out[0], (rows[0] + rows[1]).numpy(), atol=TOL)
    np.testing.assert_allclose(out[1], rows[3].numpy(), atol=TOL)


# -- bad input ------------------------------------------------------------------------------------

def test_table_planned_on_ssd_but_missing_from_the_store(tmp_path):
    _, path = _exported(tmp_path, tables=["user"])
    model = EmbeddingBagCollection(tables=tu.table_configs(), device=torch.device("meta"))
    with pytest.raises(UnknownFeatureError, match="table 'item' is planned on SSD but the store"):
        plan_offload(model, world_size=1, ssd_tables=SSD, store_path=path, print_table=False)
    plan = plan_offload(model, world_size=1, ssd_tables=SSD, print_table=False)
    with pytest.raises(UnknownFeatureError, match="table 'item' is planned on SSD"):
        tu.shard(model, plan, path)


def test_dim_or_rows_differ_between_model_and_store(tmp_path):
    from recflash.ndp import EmbeddingStore
    from recflash.reader import Store

    path = str(tmp_path / "emb")
    with Store.open(path) as s:
        e = EmbeddingStore(s)
        e.create_table("user", 5000, 32)
        e.create_table("item", 2999, 8)
    model = EmbeddingBagCollection(tables=tu.table_configs(), device=torch.device("meta"))
    with pytest.raises(SchemaError, match="table 'user' has dim 16 in the model but 32 in the store"):
        tu.shard(model, plan_offload(model, world_size=1, ssd_tables=["user"], print_table=False), path)
    close_backends()
    with pytest.raises(SchemaError, match="table 'item' has 3000 rows in the model but 2999 in the store"):
        tu.shard(model, plan_offload(model, world_size=1, ssd_tables=["item"], print_table=False), path)
    close_backends()
    with pytest.raises(SchemaError, match="table 'user' is 5000 x 16 in the model but 5000 x 32"):
        plan_offload(model, world_size=1, ssd_tables=["user"], store_path=path, print_table=False)


def test_index_out_of_range_names_the_table(tmp_path):
    ref, path = _exported(tmp_path)
    dmp, _ = _sharded(path, load_from=ref)
    lengths = torch.tensor([1, 0, 0, 0, 0, 0, 0, 0, 0, 0])
    kjt = KeyedJaggedTensor.from_lengths_sync(keys=tu.FEATURES, values=torch.tensor([5000]), lengths=lengths)
    with pytest.raises(InvalidArgumentError, match="row id 5000 out of range for table 'user' with 5000 rows"):
        tu.forward_dict(dmp, kjt)


def test_store_path_that_does_not_exist(tmp_path):
    model = EmbeddingBagCollection(tables=tu.table_configs(), device=torch.device("meta"))
    plan = plan_offload(model, world_size=1, ssd_tables=SSD, print_table=False)
    with pytest.raises(NotAStoreError, match="embedding store '.*nowhere' does not exist"):
        tu.shard(model, plan, str(tmp_path / "nowhere"))
    with pytest.raises(NotAStoreError, match="does not exist"):
        plan_offload(model, world_size=1, ssd_tables=SSD, store_path=str(tmp_path / "nowhere"), print_table=False)


def test_unknown_tables_and_options_are_refused(tmp_path):
    model = EmbeddingBagCollection(tables=tu.table_configs(), device=torch.device("meta"))
    with pytest.raises(UnknownFeatureError, match="unknown table.*'?nope"):
        plan_offload(model, world_size=1, ssd_tables=["nope"], print_table=False)
    with pytest.raises(InvalidArgumentError, match="exactly one of"):
        plan_offload(model, world_size=1, print_table=False)
    with pytest.raises(InvalidArgumentError, match="unknown SSD table option.*'row_cache'"):
        SsdEmbeddingBagCollectionSharder(str(tmp_path), row_cache=1)


def test_variable_batch_per_feature_is_refused(tmp_path):
    ref, path = _exported(tmp_path)
    dmp, _ = _sharded(path, load_from=ref)
    kjt = KeyedJaggedTensor(keys=tu.FEATURES, values=torch.tensor([1, 2, 3, 4, 5, 6]),
                            lengths=torch.tensor([1, 1, 1, 1, 1, 1]),
                            stride_per_key_per_rank=[[2], [1], [1], [1], [1]])
    assert kjt.variable_stride_per_key()
    with pytest.raises(InvalidArgumentError, match="variable batch per feature"):
        tu.forward_dict(dmp, kjt)


def test_read_only_shared_store_refuses_updates_clearly(tmp_path):
    from recflash.torchrec_ext.backend import open_backend

    _, path = _exported(tmp_path)
    b = open_backend(path, rank=0, world_size=2)  # a plain path shared by two ranks: read-only
    with pytest.raises(RecflashError, match="open read-only"):
        b.update_rows("user", [1], np.zeros((1, 16), np.float32))


def test_sharder_with_a_device_server_address(tmp_path):
    """The same plan against the NDP device server: equal outputs, updates through the server."""
    import shutil
    import subprocess
    import sys
    import time

    try:
        from recflash.ndp import DeviceClient  # noqa: F401
    except (ImportError, AttributeError):
        pytest.skip("this build has no NDP device server")
    ref, path = _exported(tmp_path)
    d = tmp_path / "ndp"
    d.mkdir(mode=0o700)
    sock = d / "server.sock"
    exe = shutil.which("recflash", path=os.path.dirname(sys.executable)) or shutil.which("recflash")
    p = subprocess.Popen([exe, "ndp", "serve", "--store", path, "--listen", f"unix:{sock}"],
                         stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    try:
        for _ in range(300):
            if sock.exists() or p.poll() is not None:
                break
            time.sleep(0.1)
        assert sock.exists(), p.stderr.read() if p.poll() is not None else "no socket"
        dmp, _ = _sharded(f"unix:{sock}", load_from=ref, row_cache_bytes=1 << 20)
        kjt = tu.make_kjt(32, 9)
        got, exp = tu.forward_dict(dmp, kjt), tu.forward_dict(ref, kjt)
        for k in exp:
            np.testing.assert_allclose(got[k], exp[k], atol=TOL, rtol=0, err_msg=k)
        ids = torch.unique(kjt["item_id"].values())[:5]
        new = torch.randn(len(ids), 8)
        update_rows(dmp, "item", ids, new)
        with torch.no_grad():
            ref.embedding_bags["item"].weight[ids] = new
        got, exp = tu.forward_dict(dmp, kjt), tu.forward_dict(ref, kjt)
        for k in exp:
            np.testing.assert_allclose(got[k], exp[k], atol=TOL, rtol=0, err_msg=k)
    finally:
        close_backends()
        p.terminate()
        p.wait(timeout=60)


def test_large_batches_are_split_by_feature_then_in_bag_windows(tmp_path):
    """A batch whose rows pass max_gather_bytes goes to the engine in several calls: features
    split between calls with the whole batch each (a table keeps its batch's density), and only
    a feature that alone passes the bound in windows of its bags; the output is the same."""
    from torchrec.distributed.model_parallel import DistributedModelParallel

    ref, path = _exported(tmp_path)
    kjt = tu.make_kjt(100, 4)
    exp = tu.forward_dict(ref, kjt)

    def run(bound):
        model = EmbeddingBagCollection(tables=tu.table_configs(), device=torch.device("meta"))
        plan = plan_offload(model, world_size=1, ssd_tables=SSD, print_table=False)
        dmp = DistributedModelParallel(model, device=torch.device("cpu"), plan=plan,
                                       sharders=[SsdEmbeddingBagCollectionSharder(path, max_gather_bytes=bound)])
        dmp.load_state_dict({k: v for k, v in ref.state_dict().items() if ".user." not in k and ".item." not in k},
                            strict=False)
        (mod,) = find_ssd_modules(dmp)
        calls = []
        backend = mod.ssd_backend
        real = backend.sls
        backend.sls = lambda reqs: calls.append([len(r.offsets) - 1 for r in reqs]) or real(reqs)
        try:
            got = tu.forward_dict(dmp, kjt)
        finally:
            del backend.sls
        for k in exp:
            np.testing.assert_allclose(got[k], exp[k], atol=TOL, rtol=0, err_msg=k)
        return calls

    calls = run(16 << 20)
    assert calls == [[100, 100, 100]]  # all three SSD features in one call
    calls = run(4096)  # each feature alone needs more: windows of bags, one feature per call
    assert len(calls) > 3 and all(len(c) == 1 and c[0] < 100 for c in calls)
    bags = [c[0] for c in calls]
    assert sum(bags) == 3 * 100
    # a bound every feature fits alone but not all together: several calls, whole batches each
    needs = [8 * d * int(kjt[f].lengths().sum()) for n, _, d, fs in tu.TABLES if n in SSD for f in fs]
    calls = run(max(needs))
    assert len(calls) > 1 and all(c == [100] * len(c) for c in calls) and sum(map(len, calls)) == len(needs) == 3
