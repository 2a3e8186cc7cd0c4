#!/usr/bin/env python3
"""Serve a DLRM whose large embedding tables live on the SSD (recflash.torchrec_ext).

1. Trains a small TorchRec DLRM on synthetic click data (a planted logistic signal), or loads
   it with --checkpoint.
2. Plans DRAM vs SSD per table with ``plan_offload(dram_budget_bytes=...)``: tables that
   demand the most bandwidth per DRAM byte stay in DRAM (SDM's rule); the decision is printed.
3. Exports the SSD tables' trained weights into an embedding store (``export_tables``).
4. Builds the serving model with its embedding tables on the ``meta`` device (no SSD table is
   ever allocated in DRAM), shards it with ``SsdEmbeddingBagCollectionSharder`` and loads the
   DRAM tables and the dense part from the trained state dict.
5. Serves batches: QPS, latency percentiles, the engine's cache hit rates, and the largest
   difference of the scores from the trained all-DRAM model; then a model update
   (``update_rows``) that the next batch sees.

    .venv/bin/python examples/dlrm_inference_ssd.py            # 2 M-row tables, 200 batches
    .venv/bin/python examples/dlrm_inference_ssd.py --quick    # short run (make demo)
    .venv/bin/python examples/dlrm_inference_ssd.py --quick --quantized

``--quantized`` serves TorchRec's quantized inference model instead (``quantize_inference_model``,
int8 rows): steps 2-4 become ``plan_quant_offload`` (each table costed in its int8 rows),
``export_quantized_tables`` (the model's own int8 rows, byte for byte) and
``shard_quant_model_with_ssd``; the scores are compared with the quantized model all in DRAM.

TorchRec's and torch's log lines go to a log file (``--log``), not the terminal. The temporary
directory (store, log) is removed after the run unless ``--keep``. Bad input (a missing
checkpoint, a ``--store`` written at another ``--scale``) gives one ``error:`` line and exit 2.
"""

from __future__ import annotations

import argparse
import logging
import os
import shutil
import sys
import tempfile
import time
import warnings

import numpy as np

# name, rows (full run), dim, ids per sample (pooling factor)
TABLES = [
    ("user_id", 2_000_000, 32, 1),
    ("item_id", 1_000_000, 32, 1),
    ("item_history", 1_000_000, 32, 20),   # the same items, a user's last 20
    ("ad_id", 500_000, 32, 1),
    ("category", 2_000, 32, 3),
    ("device", 50, 32, 1),
]
DENSE_IN = 8


def route_logs(path: str) -> logging.Handler:
    """torch's, TorchRec's and Python's warnings to a file: the terminal shows the example's lines."""
    root = logging.getLogger()
    for h in list(root.handlers):
        root.removeHandler(h)
    fh = logging.FileHandler(path, mode="w")
    fh.setFormatter(logging.Formatter("%(asctime)s %(name)s %(levelname)s %(message)s"))
    root.addHandler(fh)
    root.setLevel(logging.INFO)
    logging.captureWarnings(True)
    warnings.simplefilter("default")
    os.environ.setdefault("TORCH_CPP_LOG_LEVEL", "ERROR")
    import torch  # noqa: F401  (torch's loggers have handlers of their own: send them to the file too)

    for name in ("torch", "torchrec"):
        lg = logging.getLogger(name)
        for h in list(lg.handlers):
            lg.removeHandler(h)
        lg.addHandler(fh)
        lg.propagate = False
    return fh


def say(console, msg: str) -> None:
    console.print(f"[bold cyan]>[/] {msg}")


def tables(scale: float):
    from torchrec import EmbeddingBagConfig

    return [EmbeddingBagConfig(name=n, num_embeddings=max(16, int(r * scale)), embedding_dim=d,
                               feature_names=[n]) for n, r, d, _ in TABLES]


def build(scale: float, device: str):
    import torch
    from torchrec import EmbeddingBagCollection
    from torchrec.models.dlrm import DLRM

    ebc = EmbeddingBagCollection(tables=tables(scale), device=torch.device(device))
    torch.manual_seed(0)
    return DLRM(embedding_bag_collection=ebc, dense_in_features=DENSE_IN, dense_arch_layer_sizes=[64, 32],
                over_arch_layer_sizes=[64, 32, 1], dense_device=torch.device("cpu"))


def batches(scale: float, batch: int, n: int, seed: int):
    """(dense [B, 8], KJT, labels): Zipf-skewed ids (popular users and items), a planted signal."""
    import torch
    from torchrec import KeyedJaggedTensor

    from recflash.ndp.traces import zipf_ids

    rng = np.random.default_rng(seed)
    out = []
    for _ in range(n):
        keys, lengths, values = [], [], []
        effect = np.zeros(batch)
        for name, rows, _, pf in TABLES:
            rows = max(16, int(rows * scale))
            ln = rng.integers(max(1, pf // 2), pf + pf // 2 + 1, batch) if pf > 1 else np.ones(batch, np.int64)
            ids = zipf_ids(rows, int(ln.sum()), 1.05, rng)
            keys.append(name)
            lengths.append(ln)
            values.append(ids)
            if name in ("item_id", "category"):
                first = np.concatenate([[0], np.cumsum(ln)[:-1]])
                effect += np.sin(ids[first] * 0.7)
        dense = rng.standard_normal((batch, DENSE_IN)).astype(np.float32)
        logit = 1.5 * dense[:, 0] - dense[:, 1] + effect
        labels = (rng.random(batch) < 1 / (1 + np.exp(-logit))).astype(np.float32)
        kjt = KeyedJaggedTensor.from_lengths_sync(keys=keys, values=torch.from_numpy(np.concatenate(values)),
                                                  lengths=torch.from_numpy(np.concatenate(lengths)))
        out.append((torch.from_numpy(dense), kjt, torch.from_numpy(labels)))
    return out


def train(model, data, console) -> None:
    import torch

    opt = torch.optim.Adagrad(model.parameters(), lr=0.05)
    losses = []
    for dense, kjt, labels in data:
        opt.zero_grad()
        loss = torch.nn.functional.binary_cross_entropy_with_logits(model(dense, kjt).squeeze(1), labels)
        loss.backward()
        opt.step()
        losses.append(float(loss))
    k = max(1, len(losses) // 5)
    say(console, f"trained {len(losses)} steps: loss {np.mean(losses[:k]):.3f} -> {np.mean(losses[-k:]):.3f}")


class ExampleError(Exception):
    """Bad input to the example (a missing checkpoint, a store of another scale): one line, exit 2."""


def load_checkpoint(model, path: str, scale: float) -> None:
    import torch

    try:
        state = torch.load(path, map_location="cpu")
    except Exception as e:  # noqa: BLE001 - not a torch file, truncated, unpicklable: say which file
        detail = str(e).strip().splitlines()[0] if str(e).strip() else ""
        raise ExampleError(f"--checkpoint '{path}' is not a readable torch checkpoint ({type(e).__name__}"
                           f"{': ' + detail if detail else ''})") from None
    if not isinstance(state, dict):
        raise ExampleError(f"--checkpoint '{path}' holds a {type(state).__name__}, not a state dict")
    try:
        model.load_state_dict(state)
    except RuntimeError as e:
        first = next((ln.strip() for ln in str(e).splitlines()[1:] if ln.strip()), str(e))
        raise ExampleError(f"--checkpoint '{path}' does not fit this example's DLRM at --scale {scale:g}: {first}") from None


def check_args(args) -> str:
    """What is wrong with the arguments (one line), or ''."""
    finite = lambda v: v == v and abs(v) != float("inf")  # noqa: E731
    if args.scale is not None and not (finite(args.scale) and args.scale > 0):
        return f"--scale must be > 0, got {args.scale:g}"
    if not (finite(args.budget_frac) and args.budget_frac >= 0):
        return f"--budget-frac must be >= 0, got {args.budget_frac:g}"
    if args.batch < 1 or (args.batches is not None and args.batches < 1):
        return "--batch and --batches must be at least 1"
    if args.checkpoint and not os.path.isfile(args.checkpoint):
        return f"--checkpoint '{args.checkpoint}': no such file"
    if args.store and os.path.exists(args.store) and not os.path.isdir(args.store):
        return f"--store '{args.store}' exists and is not a directory"
    if args.log and not os.path.isdir(os.path.dirname(os.path.abspath(args.log))):
        return f"--log '{args.log}': directory '{os.path.dirname(os.path.abspath(args.log))}' does not exist"
    return ""


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--quick", action="store_true", help="small tables, few batches (make demo)")
    ap.add_argument("--scale", type=float, default=None, help="rows per table relative to the full example")
    ap.add_argument("--store", default=None, help="embedding store directory (default: a temporary one)")
    ap.add_argument("--checkpoint", default=None, help="a trained model's state dict (torch.save) instead of training")
    ap.add_argument("--budget-frac", type=float, default=0.25,
                    help="DRAM budget as a fraction of all table bytes (>= 1: every table in DRAM, no SSD table)")
    ap.add_argument("--batch", type=int, default=64)
    ap.add_argument("--batches", type=int, default=None)
    ap.add_argument("--log", default=None, help="where torch's and TorchRec's logs go (default: the temporary directory)")
    ap.add_argument("--quantized", action="store_true",
                    help="serve TorchRec's int8 quantized model (plan_quant_offload, shard_quant_model_with_ssd)")
    ap.add_argument("--keep", action="store_true",
                    help="keep the temporary directory (its store and log); removed after the run otherwise")
    args = ap.parse_args(argv)
    problem = check_args(args)
    if problem:
        print(f"error: {problem}", file=sys.stderr)
        return 2
    tmp = tempfile.mkdtemp(prefix="recflash-inference-")
    log_path = args.log or os.path.join(tmp, "torchrec.log")
    fh = route_logs(log_path)
    try:
        return run(args, tmp, log_path)
    except ExampleError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return 130
    except Exception as e:  # noqa: BLE001 - recflash errors name what was wrong: one line, no traceback
        from recflash.reader.errors import RecflashError, SchemaError

        if not isinstance(e, RecflashError):
            raise
        hint = ""
        if isinstance(e, SchemaError) and args.store:
            hint = (f" (the store '{args.store}' holds tables of another --scale or checkpoint: use the same "
                    f"--scale, or a new --store)")
        print(f"error: {type(e).__name__}: {e}{hint}", file=sys.stderr)
        return 2
    finally:
        from recflash.torchrec_ext import close_backends

        close_backends()
        import torch.distributed as dist

        if dist.is_initialized():
            dist.destroy_process_group()
        logging.getLogger().removeHandler(fh)
        for name in ("torch", "torchrec"):
            logging.getLogger(name).removeHandler(fh)
        fh.close()
        if args.keep:
            print(f"kept {tmp}", file=sys.stderr)
        else:
            shutil.rmtree(tmp, ignore_errors=True)


def timed_serve(model, data, references):
    """Serves `data` (after 3 warm-up batches): each batch's latency, the wall time (with the
    references run beside it) and per reference model the largest score difference."""
    import torch

    lat, worst = [], [0.0] * len(references)
    with torch.no_grad():
        for dense, kjt, _ in data[:3]:  # warm-up
            model(dense, kjt)
        t_all = time.perf_counter()
        for dense, kjt, _ in data:
            t = time.perf_counter()
            scores = model(dense, kjt)
            lat.append(time.perf_counter() - t)
            for i, ref in enumerate(references):
                worst[i] = max(worst[i], float((scores - ref(dense, kjt)).abs().max()))
    return lat, time.perf_counter() - t_all, worst


def serve_quantized(args, trained, scale: float, store: str, n_serve: int, console) -> int:
    """Steps 2-5 for TorchRec's quantized inference model (int8 rows)."""
    import copy

    from torchrec.inference.modules import quantize_inference_model

    from recflash.torchrec_ext import export_quantized_tables, plan_quant_offload, shard_quant_model_with_ssd

    reference = quantize_inference_model(copy.deepcopy(trained))  # the quantized model, all in DRAM
    table_bytes = sum(c.num_embeddings * (c.embedding_dim + 4) for c in tables(scale))  # int8 rows + scale/bias
    budget = int(args.budget_frac * table_bytes)
    say(console, f"quantized to int8: {table_bytes / 2**20:,.1f} MiB of tables, DRAM budget {budget / 2**20:,.1f} MiB")
    report = plan_quant_offload(reference, dram_budget_bytes=budget, qps=20_000, batch_size=args.batch,
                                pooling_factors={n: pf for n, _, _, pf in TABLES}, count_engine_dram=False)
    ssd = report.ssd_tables
    if ssd:
        t0 = time.perf_counter()
        info = export_quantized_tables(reference, store, tables=ssd, progress=not args.quick)
        say(console, f"exported the int8 rows of {', '.join(ssd)} to {store} "
                     f"({sum(v['rows'] for v in info.values()):,} rows) in {time.perf_counter() - t0:.1f} s")
        served, _ = shard_quant_model_with_ssd(quantize_inference_model(copy.deepcopy(trained)), ssd, store,
                                               row_cache_bytes=max(1 << 20, budget - report.dram_bytes))
    else:
        say(console, "every table fits the DRAM budget: no SSD table (all served from DRAM)")
        served = quantize_inference_model(copy.deepcopy(trained))
    data = batches(scale, args.batch, n_serve, seed=2)
    lat, _, (worst, drift) = timed_serve(served, data, [reference, trained])
    lat_ms = 1e3 * np.array(lat)
    say(console, f"served {len(data)} batches of {args.batch}: {len(data) * args.batch / sum(lat):,.0f} samples/s, "
                 f"latency p50 {np.percentile(lat_ms, 50):.2f} ms, p99 {np.percentile(lat_ms, 99):.2f} ms")
    ok = worst <= 1e-5
    say(console, f"scores vs the quantized model all in DRAM: max |diff| = {worst:.2e} "
                 + ("[green](equal within 1e-5)[/]" if ok else "[red](NOT equal)[/]")
                 + f"; vs the float model {drift:.2e} (int8 quantization)")
    return 0 if ok else 1


def run(args, tmp: str, log_path: str) -> int:
    scale = args.scale if args.scale is not None else (0.02 if args.quick else 1.0)
    n_serve = args.batches or (30 if args.quick else 200)

    import torch
    import torch.distributed as dist
    from rich.console import Console
    from torchrec.distributed.model_parallel import DistributedModelParallel

    from recflash.torchrec_ext import (SsdEmbeddingBagCollectionSharder, export_tables, find_ssd_modules,
                                       plan_offload, update_rows)

    console = Console(width=max(118, shutil.get_terminal_size((118, 24)).columns))
    store = args.store or os.path.join(tmp, "emb_store")
    # 1. a trained model (in DRAM)
    trained = build(scale, "cpu")
    if args.checkpoint:
        load_checkpoint(trained, args.checkpoint, scale)
        say(console, f"loaded {args.checkpoint}")
    else:
        say(console, "training a small DLRM on synthetic clicks (all tables in DRAM)")
        train(trained, batches(scale, 256, 60 if args.quick else 300, seed=1), console)
    trained.eval()
    if args.quantized:
        return serve_quantized(args, trained, scale, store, n_serve, console)
    table_bytes = sum(4 * c.num_embeddings * c.embedding_dim for c in tables(scale))
    budget = int(args.budget_frac * table_bytes)

    # 2. the plan: DRAM vs SSD per table under the budget
    if not dist.is_initialized():
        dist.init_process_group("gloo", store=dist.FileStore(os.path.join(tmp, "pg"), 1), rank=0, world_size=1)
    model = build(scale, "meta")  # embedding tables on the meta device: never allocated
    say(console, f"planning: {table_bytes / 2**20:,.1f} MiB of tables, DRAM budget {budget / 2**20:,.1f} MiB")
    # the budget is for tables here: at this example's size the engine's own DRAM for SSD tables
    # (8.5 MiB of read buffers alone) would pass it, so it is printed, not counted
    plan = plan_offload(model, world_size=1, dram_budget_bytes=budget, qps=20_000, batch_size=args.batch,
                        pooling_factors={n: pf for n, _, _, pf in TABLES}, count_engine_dram=False)
    ssd = plan.tiering.ssd_tables

    # 3. the SSD tables' trained weights into the store
    if ssd:
        t0 = time.perf_counter()
        info = export_tables(trained, store, tables=ssd, progress=not args.quick)
        say(console, f"exported {', '.join(ssd)} to {store} "
                     f"({sum(v['rows'] for v in info.values()):,} rows) in {time.perf_counter() - t0:.1f} s")
    else:
        say(console, "every table fits the DRAM budget: no SSD table, nothing to export (all served from DRAM)")

    # 4. shard, then load the DRAM tables and the dense part from the trained state dict
    sharder = SsdEmbeddingBagCollectionSharder(store, row_cache_bytes=max(1 << 20, (budget - plan.tiering.dram_bytes)),
                                               pooled_cache_bytes=1 << 20)
    dmp = DistributedModelParallel(model, device=torch.device("cpu"), plan=plan, sharders=[sharder])
    state = {k: v for k, v in trained.state_dict().items() if not any(f".{t}." in k for t in ssd)}
    dmp.load_state_dict(state, strict=False)
    ssd_params = [n for n, _ in dmp.named_parameters() if any(f".{t}." in n for t in ssd)]
    say(console, f"sharded: SSD tables in DRAM parameters: {len(ssd_params)} (none is materialised)")

    # 5. serve
    data = batches(scale, args.batch, n_serve, seed=2)
    lat, wall, (worst,) = timed_serve(dmp, data, [trained])
    lat_ms = 1e3 * np.array(lat)
    say(console, f"served {len(data)} batches of {args.batch}: {len(data) * args.batch / sum(lat):,.0f} samples/s "
                 f"(wall {wall:.1f} s with the DRAM reference model), latency p50 {np.percentile(lat_ms, 50):.2f} "
                 f"ms, p95 {np.percentile(lat_ms, 95):.2f} ms, p99 {np.percentile(lat_ms, 99):.2f} ms")
    if ssd:
        (mod,) = find_ssd_modules(dmp)
        cs = mod.ssd_backend.cache_stats()
        rc = cs["row_cache"]
        pc = cs["pooled_cache"]
        say(console, f"row cache hit rate {rc['hits'] / max(1, rc['hits'] + rc['misses']):.1%} "
                     f"({rc['bytes'] / 2**20:.1f} MiB), pooled cache {pc['hits'] / max(1, pc['hits'] + pc['misses']):.1%}")
    ok = worst <= 1e-5
    say(console, f"scores vs the all-DRAM model: max |diff| = {worst:.2e} "
                 + ("[green](equal within 1e-5)[/]" if ok else "[red](NOT equal)[/]"))

    # a model update while serving: the next batch sees it
    dense, kjt, _ = data[0]
    ids = torch.unique(kjt["user_id"].values())[:100]
    new_rows = torch.randn(len(ids), 32) * 0.01
    if "user_id" in ssd:
        update_rows(dmp, "user_id", ids, new_rows)
    with torch.no_grad():
        trained.sparse_arch.embedding_bag_collection.embedding_bags["user_id"].weight[ids] = new_rows
        if "user_id" not in ssd:
            dmp.load_state_dict({k: v for k, v in trained.state_dict().items() if ".user_id." in k}, strict=False)
        diff = float((dmp(dense, kjt) - trained(dense, kjt)).abs().max())
    say(console, f"updated {len(ids)} rows of user_id while serving; next batch vs DRAM model: {diff:.2e}")
    if args.log or args.keep:
        say(console, f"torch/TorchRec log: {log_path}")
    return 0 if ok and diff <= 1e-5 else 1


if __name__ == "__main__":
    sys.exit(main())
