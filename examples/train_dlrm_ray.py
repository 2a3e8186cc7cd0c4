#!/usr/bin/env python3
"""Train TorchRec's DLRM with Ray Train on data read from a recflash store through Ray Data.

1. Makes a synthetic Criteo-like store with the import code (``recflash import synthetic
   --preset criteo-kaggle``: label, I1..I13, C1..C26). The preset's labels are independent
   of the features, so the example plants a signal: it rewrites ``label`` (an upsert of one
   feature) from a logistic model of a few dense and categorical features, which gives the
   model something to learn and the AUC a meaning.
2. ``recflash.ingest.ray.read_store`` gives a Dataset of the 40 features (read tasks split by
   key range; the last 10 % of keys are held out for evaluation); ``TorchRecCollate`` turns
   each batch into a TorchRec ``Batch``.
3. Ray Train ``TorchTrainer``, 2 CPU workers on gloo: ``DLRMTrain(DLRM(...))`` with its
   embedding tables sharded by TorchRec's planner under ``DistributedModelParallel``
   (fused CPU embedding kernels, row-wise Adagrad in backward), dense part data-parallel.
   Each worker reads its shard with ``ray.train.get_dataset_shard``; every worker runs the
   same number of steps (the sharded embeddings exchange data every step).
4. Prints the loss over training (it falls) and the held-out AUC.

    .venv/bin/python examples/train_dlrm_ray.py                 # 300 steps, 400k rows
    .venv/bin/python examples/train_dlrm_ray.py --quick         # short run (make demo)
    .venv/bin/python examples/train_dlrm_ray.py --steps 50 --store /tmp/st --json out.json
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import tempfile
import time
from typing import Any

import numpy as np

DENSE = [f"I{i}" for i in range(1, 14)]
SPARSE = [f"C{i}" for i in range(1, 27)]


# -- data ------------------------------------------------------------------------------------
def make_store(path: str, rows: int, seed: int = 0) -> None:
    """A Criteo-like store from the import code, then a planted label (see module docstring)."""
    from recflash.ingest import ImportOptions, SyntheticSource, run_import
    from recflash.reader import Store

    run_import(SyntheticSource("criteo-kaggle", rows, seed=seed), path, ImportOptions())
    with Store.open(path) as store:
        t = store.scan_many(["I1", "I2", "I5", "C1", "C2", "C9"])
        keys = t.column("key").to_numpy()

        def dense(name):
            a = t.column(name).to_numpy(zero_copy_only=False)
            a = np.nan_to_num(np.asarray(a, dtype=np.float64), nan=0.0)
            return np.log1p(np.maximum(a, 0.0))

        def cat(name, salt):
            a = np.nan_to_num(np.asarray(t.column(name).to_numpy(zero_copy_only=False), dtype=np.float64), nan=0.0)
            h = (a.astype(np.int64) * np.int64(2654435761) + salt) % 1000
            return (h / 1000.0 - 0.5) * 2.0  # a fixed pseudo-random effect per id in [-1, 1)

        z = (0.8 * (dense("I1") - 1.0) - 0.5 * (dense("I2") - 1.5) + 0.4 * (dense("I5") - 5.0)
             + 1.5 * cat("C1", 7) + 1.2 * cat("C2", 11) + 1.0 * cat("C9", 13) - 2.0)
        p = 1.0 / (1.0 + np.exp(-z))
        rng = np.random.default_rng(seed + 1)
        labels = (rng.random(len(p)) < p).astype(np.float32)
        store.put("label", keys, labels)  # upsert of one feature
    return None


# -- training (runs in each Ray Train worker) ------------------------------------------------
def train_loop_per_worker(config: dict) -> None:
    import torch
    import torch.distributed as dist
    import ray.train
    from torchmetrics.classification import BinaryAUROC
    from torchrec import EmbeddingBagCollection
    from torchrec.distributed.model_parallel import DistributedModelParallel
    from torchrec.distributed.planner import EmbeddingShardingPlanner, Topology
    from torchrec.distributed.sharding_plan import get_default_sharders
    from torchrec.models.dlrm import DLRM, DLRMTrain
    from torchrec.modules.embedding_configs import EmbeddingBagConfig
    from torchrec.optim.apply_optimizer_in_backward import apply_optimizer_in_backward
    from torchrec.optim.keyed import CombinedOptimizer, KeyedOptimizerWrapper
    from torchrec.optim.optimizers import in_backward_optimizer_filter
    from torchrec.optim.rowwise_adagrad import RowWiseAdagrad

    from recflash.ingest import Preprocessor
    from recflash.ingest.ray import TorchRecCollate

    torch.set_num_threads(1)  # two workers share a 2-core machine
    torch.manual_seed(config["seed"])
    ctx = ray.train.get_context()
    rank, world = ctx.get_world_rank(), ctx.get_world_size()
    device = torch.device("cpu")
    B, rows, dim = config["batch_size"], config["table_rows"], config["embedding_dim"]

    tables = [EmbeddingBagConfig(name=f"t_{f}", embedding_dim=dim, num_embeddings=rows, feature_names=[f])
              for f in SPARSE]
    ebc = EmbeddingBagCollection(tables=tables, device=torch.device("meta"))
    model = DLRMTrain(DLRM(embedding_bag_collection=ebc, dense_in_features=len(DENSE),
                           dense_arch_layer_sizes=[64, dim], over_arch_layer_sizes=[64, 32, 1], dense_device=device))
    # Embedding tables train with row-wise Adagrad fused into their backward (TorchRec's CPU kernels).
    apply_optimizer_in_backward(RowWiseAdagrad, model.model.sparse_arch.parameters(), {"lr": config["lr"]})
    planner = EmbeddingShardingPlanner(topology=Topology(world_size=world, compute_device="cpu", local_world_size=world),
                                       batch_size=B)
    plan = planner.collective_plan(model, get_default_sharders(), dist.GroupMember.WORLD)
    dmp = DistributedModelParallel(module=model, device=device, plan=plan)
    dense_opt = KeyedOptimizerWrapper(dict(in_backward_optimizer_filter(dmp.named_parameters())),
                                      lambda params: torch.optim.Adagrad(params, lr=config["lr"]))
    opt = CombinedOptimizer([dmp.fused_optimizer, dense_opt])
    if rank == 0:
        kinds = {}
        for mod_plan in plan.plan.values():
            for name, ps in mod_plan.items():
                kinds[ps.sharding_type] = kinds.get(ps.sharding_type, 0) + 1
        print(f"[rank 0] sharding plan: {len(tables)} tables of {rows} x {dim} -> {kinds}", flush=True)

    pre = Preprocessor(dense=DENSE, sparse=SPARSE, label="label", table_sizes=rows)
    collate = TorchRecCollate(pre)
    train_shard = ray.train.get_dataset_shard("train")
    steps, losses, curve, t0 = config["steps"], [], [], time.perf_counter()
    dmp.train()
    while len(losses) < steps:  # epochs until `steps` (the same count on every worker)
        for batch in train_shard.iter_torch_batches(batch_size=B, collate_fn=collate, drop_last=True):
            loss, _ = dmp(batch)
            opt.zero_grad()
            loss.backward()
            opt.step()
            losses.append(float(loss.detach()))
            if rank == 0 and (len(losses) % config["log_every"] == 0 or len(losses) == 1):
                recent = float(np.mean(losses[-config["log_every"]:]))
                curve.append((len(losses), recent, len(losses) * B * world / (time.perf_counter() - t0)))
                print(f"[rank 0] step {len(losses):4d}  loss {recent:.4f}  ({curve[-1][2]:,.0f} samples/s)", flush=True)
            if len(losses) >= steps:
                break
    train_seconds = time.perf_counter() - t0

    # Held-out AUC: every worker evaluates the same number of batches (the sharded lookups are
    # collective), predictions gathered to compute one AUC.
    dmp.eval()
    logits_all, labels_all = [], []
    with torch.no_grad():
        it = ray.train.get_dataset_shard("valid").iter_torch_batches(batch_size=B, collate_fn=collate, drop_last=True)
        for i, batch in enumerate(it):
            if i >= config["eval_batches"]:
                break
            _, (_, logits, labels) = dmp(batch)
            logits_all.append(logits)
            labels_all.append(labels)
    logits = torch.cat(logits_all) if logits_all else torch.zeros(0)
    labels = torch.cat(labels_all) if labels_all else torch.zeros(0)
    gathered = [None] * world
    dist.all_gather_object(gathered, (logits.numpy(), labels.numpy()))
    lg = torch.from_numpy(np.concatenate([g[0] for g in gathered]))
    lb = torch.from_numpy(np.concatenate([g[1] for g in gathered]))
    auc = float(BinaryAUROC()(torch.sigmoid(lg), lb.int())) if len(lb) else float("nan")
    k = max(1, min(20, len(losses) // 4))
    metrics = {"steps": len(losses), "loss_first": float(np.mean(losses[:k])), "loss_last": float(np.mean(losses[-k:])),
               "auc": auc, "eval_samples": int(len(lb)), "positive_rate": float(lb.float().mean()) if len(lb) else 0.0,
               "train_seconds": train_seconds, "samples_per_second": len(losses) * B * world / train_seconds,
               "loss_curve": curve}
    if rank == 0:  # the metrics travel with a (tiny) checkpoint, which Ray Train keeps
        with tempfile.TemporaryDirectory() as d:
            with open(os.path.join(d, "metrics.json"), "w") as f:
                json.dump(metrics, f)
            ray.train.report(metrics, checkpoint=ray.train.Checkpoint.from_directory(d))
    else:
        ray.train.report(metrics)


# -- driver ----------------------------------------------------------------------------------
def run(store: str, steps: int, batch_size: int, workers: int = 2, worker_cpus: float = 1.0,
        table_rows: int = 20_000, embedding_dim: int = 16, lr: float = 0.05, eval_batches: int = 20,
        log_every: int = 50, seed: int = 0, storage_path: str | None = None) -> dict:
    """Trains on an existing store; returns the metrics dict (Ray must be initialised)."""
    import ray.data
    import ray.train
    from ray.train import RunConfig, ScalingConfig
    from ray.train.torch import TorchConfig, TorchTrainer

    from recflash.ingest.ray import read_store
    from recflash.reader import Store

    ray.data.DataContext.get_current().enable_progress_bars = False
    with Store.open(store, read_only=True) as s:
        kr = s.key_ranges("label")
        n = int(kr["items"].sum())
        last = int(kr["max_key"].max()) + 1 if len(kr["max_key"]) else 0
    cut = int(last * 0.9)  # keys are row numbers: the last 10 % are held out
    feats = ["label"] + DENSE + SPARSE
    rows_per_task = max(4096, n // 8)
    train = read_store(store, features=feats, key_range=(0, cut), rows_per_task=rows_per_task)
    valid = read_store(store, features=feats, key_range=(cut, None), rows_per_task=rows_per_task)
    trainer = TorchTrainer(
        train_loop_per_worker,
        train_loop_config={"steps": steps, "batch_size": batch_size, "table_rows": table_rows,
                           "embedding_dim": embedding_dim, "lr": lr, "eval_batches": eval_batches,
                           "log_every": log_every, "seed": seed},
        torch_config=TorchConfig(backend="gloo"),
        scaling_config=ScalingConfig(num_workers=workers, use_gpu=False, resources_per_worker={"CPU": worker_cpus}),
        datasets={"train": train, "valid": valid},
        run_config=RunConfig(name="recflash_dlrm", storage_path=storage_path or tempfile.mkdtemp(prefix="recflash-train-")),
    )
    result = trainer.fit()
    if result.metrics:
        return dict(result.metrics)
    with result.checkpoint.as_directory() as d, open(os.path.join(d, "metrics.json")) as f:
        return json.load(f)


def route_logs(path: str) -> None:
    """The driver's Python log lines (Ray's included) to a file; the terminal keeps the example's."""
    import logging
    import warnings

    fh = logging.FileHandler(path, mode="w")
    fh.setFormatter(logging.Formatter("%(asctime)s %(name)s %(levelname)s %(message)s"))
    root = logging.getLogger()
    for h in list(root.handlers):
        root.removeHandler(h)
    root.addHandler(fh)
    root.setLevel(logging.INFO)
    for name in ("ray", "torch", "torchrec"):
        lg = logging.getLogger(name)
        for h in list(lg.handlers):
            lg.removeHandler(h)
        lg.propagate = True
    logging.captureWarnings(True)
    warnings.simplefilter("default")


def ray_session_logs() -> str:
    try:
        from ray._private.worker import _global_node

        return os.path.join(_global_node.get_session_dir_path(), "logs")
    except Exception:  # noqa: BLE001 - only for the closing message
        return "/tmp/ray/session_latest/logs"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--store", help="store directory (made with --rows synthetic rows if it does not exist; "
                                    "default: a temporary one)")
    ap.add_argument("--rows", type=int, default=400_000)
    ap.add_argument("--steps", type=int, default=300)
    ap.add_argument("--batch-size", type=int, default=512)
    ap.add_argument("--table-rows", type=int, default=20_000, help="rows per embedding table (ids modulo this)")
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--worker-cpus", type=float, default=1.0)
    ap.add_argument("--lr", type=float, default=0.05)
    ap.add_argument("--quick", action="store_true", help="short run: 60k rows, 40 steps (make demo)")
    ap.add_argument("--json", help="write the metrics here")
    ap.add_argument("--log", default=os.path.join(tempfile.gettempdir(), "recflash-train-dlrm.log"),
                    help="where the driver's Ray/TorchRec log lines go (workers' logs stay in Ray's session directory)")
    ap.add_argument("--keep", action="store_true", help="keep the temporary store")
    args = ap.parse_args(argv)
    if args.quick:
        args.rows = min(args.rows, 60_000)
        args.steps = min(args.steps, 40)
    import ray

    tmp = None
    store = os.path.abspath(args.store) if args.store else None
    if args.json:
        args.json = os.path.abspath(args.json)
    if store is None:
        tmp = tempfile.mkdtemp(prefix="recflash-dlrm-")
        store = os.path.join(tmp, "store")
    log_path = args.log
    try:
        if not os.path.exists(store):
            t0 = time.perf_counter()
            make_store(store, args.rows)
            print(f"store: {args.rows:,} synthetic Criteo-like rows (40 features) in {store} "
                  f"({time.perf_counter() - t0:.1f} s, labels planted from I1, I2, I5, C1, C2, C9)", flush=True)
        if not ray.is_initialized():
            from recflash.ingest.ray import init_ray

            # 4 logical CPUs on 2 cores: 2 train workers plus read tasks. Ray's, Ray Train's and
            # TorchRec's log lines (workers' output included) go to log files, not the terminal.
            route_logs(log_path)
            init_ray(num_cpus=max(4, args.workers * 2), include_dashboard=False, log_to_driver=False,
                     configure_logging=False)
        m = run(store, steps=args.steps, batch_size=args.batch_size, workers=args.workers, worker_cpus=args.worker_cpus,
                table_rows=args.table_rows, lr=args.lr, log_every=max(1, min(50, args.steps // 5)),
                storage_path=os.path.join(tmp or tempfile.mkdtemp(prefix="recflash-train-"), "ray_results"))
        print(f"DLRM on {args.workers} Ray Train workers (gloo, DistributedModelParallel): {m['steps']} steps of "
              f"{args.batch_size} per worker, {m['samples_per_second']:,.0f} samples/s")
        print(f"  loss {m['loss_first']:.4f} (first steps) -> {m['loss_last']:.4f} (last steps)"
              f"{'  [falls]' if m['loss_last'] < m['loss_first'] else '  [DOES NOT FALL]'}")
        for step, loss, sps in m.get("loss_curve", []):
            print(f"  step {step:4d}  loss {loss:.4f}  ({sps:,.0f} samples/s)")
        print(f"  held-out AUC {m['auc']:.4f} on {m['eval_samples']:,} samples (positive rate {m['positive_rate']:.3f})")
        print(f"  Ray's and TorchRec's logs: {log_path}, {ray_session_logs()}")
        if args.json:
            with open(args.json, "w") as f:
                json.dump(m, f, indent=2)
        return 0 if m["loss_last"] < m["loss_first"] or m["steps"] < 30 else 1
    finally:
        if ray.is_initialized():
            ray.shutdown()
        if tmp and not args.keep:
            shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
