#!/usr/bin/env python3
"""DLRM inference with SSD-offloaded embedding tables, against DRAM and mmap, under one DRAM budget.

    python benchmarks/inference.py [--quick] [--models RM1,RM2,RM3] [--scale S]
                                   [--dram-budget-frac F] --json OUT --plot OUT.png

Models: ``torchrec.models.dlrm.DLRM`` with the RM1/RM2/RM3 shapes (RecSSD Table 1 tables and
lookups, RM-SSD Table III MLPs; 13 dense features), rows per table scaled by ``--scale``.
Traces: ``recflash.ndp.traces`` — Zipf(1.05) and uniform ids, fixed pooling factor.

Methods, each in its own child process inside a memory cgroup (v1 ``memory.limit_in_bytes``,
else v2 ``memory.max``) whose limit is the DRAM budget (default 1/8 of all table bytes) plus
the process baseline (the RSS of a child with python, torch, torchrec, a process group and
a DMP whose tables are all on SSD, before any lookup: measured in the same run), page cache
included; caches are dropped before
each child:
  dram            all tables in DRAM, TorchRec's fused CPU kernels (DMP); no limit — the
                  reference for outputs and latency
  mmap            the same EBC with each table's weight a memory-mapped file
                  (``torch.from_file(shared=True)``): the page cache does the caching
  recflash        ``plan_offload(dram_budget_bytes=budget)`` + ``SsdEmbeddingBagCollectionSharder``,
                  engine caches off
  recflash+cache  tiering at half the budget, the rest of the budget to the engine's row cache
                  (sized by its real heap cost per row, not only its accounted bytes)
  recflash-device the same plan through the NDP device server (when ``recflash.ndp.DeviceClient``
                  exists), the server in the same cgroup as the client

Per model, method, trace and batch size (1, 16, 64, 256): samples/s, latency p50/p95/p99,
peak DRAM (the cgroup's peak usage: RSS + page cache; and the part above the interpreter
baseline), device reads and bytes (/proc/diskstats deltas over the timed batches), cache hit
rates, the outputs' largest difference from ``dram`` (first batch of each point), and for
recflash runs the IOPS bound: achieved samples/s / (device 512 B random-read IOPS at QD128,
measured by fio in the same run / device reads per sample).
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import time
import zlib
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

from harness import diskstats_of, drop_caches, fio_randread, loadavg, make_log  # noqa: E402

MLPS = {  # RM-SSD Table III (bottom MLP, top MLP)
    "RM1": ([128, 64, 32], [256, 64, 1]),
    "RM2": ([256, 128, 64], [128, 64, 1]),
    "RM3": ([2560, 1024, 256, 32], [512, 256, 1]),
}
DENSE_IN = 13
METHODS = ["dram", "mmap", "recflash", "recflash+cache", "recflash-device"]
_T0 = time.perf_counter()
log = make_log("inference", elapsed=True)


# -- the model and its weights (deterministic: every process derives the same ones) -------------

def table_names(shape):
    return [f"{shape.name.lower()}_t{i}" for i in range(shape.num_tables)]


def weight_blocks(shape, t: int, rows_from: int = 0, rows_to: int = None):
    """Rows [rows_from, rows_to) of table t, uniform(-0.05, 0.05), as (first row, block) pairs of at
    most 16 K rows. The values are a function of (model, t, 256 K-row chunk): each chunk's stream
    is drawn a slice at a time (the same numbers as one draw), so filling a table costs a few MiB
    beyond the table, not two chunk-sized temporaries that would show in the child's peak RSS."""
    import torch

    rows_to = shape.num_rows if rows_to is None else rows_to
    chunk, sub = 1 << 18, 1 << 14
    for a in range(rows_from - rows_from % chunk, rows_to, chunk):
        g = torch.Generator().manual_seed(zlib.crc32(f"{shape.name}/{t}/{a}".encode()))  # hash() is salted per process
        end = min(a + chunk, shape.num_rows)
        for s in range(a, min(end, rows_to), sub):
            e = min(s + sub, end)
            block = torch.rand(e - s, shape.dim, generator=g)  # drawn even when skipped: keeps the stream
            lo, hi = max(s, rows_from), min(e, rows_to)
            if lo < hi:
                yield lo, block[lo - s:hi - s].mul_(0.1).sub_(0.05)


def fill_table_weight(shape, t: int, dest, rows_from: int = 0) -> None:
    """Writes rows [rows_from, rows_from + len(dest)) of table t into `dest` in place."""
    for lo, b in weight_blocks(shape, t, rows_from, rows_from + dest.shape[0]):
        dest[lo - rows_from:lo - rows_from + b.shape[0]] = b


def table_weight(shape, t: int, rows_from: int = 0, rows_to: int = None):
    """Rows [rows_from, rows_to) of table t as one tensor."""
    import torch

    rows_to = shape.num_rows if rows_to is None else rows_to
    out = torch.empty(rows_to - rows_from, shape.dim)
    fill_table_weight(shape, t, out, rows_from)
    return out


def build_model(shape, device: str):
    import torch
    from torchrec import EmbeddingBagCollection, EmbeddingBagConfig
    from torchrec.models.dlrm import DLRM

    tables = [EmbeddingBagConfig(name=n, embedding_dim=shape.dim, num_embeddings=shape.num_rows, feature_names=[n])
              for n in table_names(shape)]
    ebc = EmbeddingBagCollection(tables=tables, device=torch.device(device))
    torch.manual_seed(1234)  # the dense part: the same in every process
    bottom, top = MLPS[shape.name]
    return DLRM(embedding_bag_collection=ebc, dense_in_features=DENSE_IN, dense_arch_layer_sizes=bottom,
                over_arch_layer_sizes=top, dense_device=torch.device("cpu"))


def make_inputs(shape, batch: int, num_batches: int, trace: str, seed: int):
    """(dense, KJT) per batch from recflash.ndp.traces (one stream of ids per table), each
    batch's KJT built when it is taken. The child's peak RSS is measured against the DRAM
    budget, so the generator holds the group's id streams and one batch's values, not every
    batch's: building the four KJTs of an RM2 group at batch 256 up front (7.5 MiB of ids
    each, on top of the 30 MiB of streams) raised a child's peak RSS by 56 MiB before any
    lookup, 46 % of that model's budget."""
    import numpy as np
    import torch
    from torchrec import KeyedJaggedTensor

    from recflash.ndp.traces import make_batches

    names = table_names(shape)
    batches = make_batches(shape, batch, num_batches, dist=trace, seed=seed, table_names=names)
    g = torch.Generator().manual_seed(seed)
    for b in range(len(batches)):
        reqs, batches[b] = batches[b], None
        values = torch.from_numpy(np.concatenate([r.indices for r in reqs]))
        del reqs
        lengths = torch.full((len(names) * batch,), shape.lookups, dtype=torch.int64)
        kjt = KeyedJaggedTensor.from_lengths_sync(keys=names, values=values, lengths=lengths)
        yield torch.rand(batch, DENSE_IN, generator=g), kjt


def input_stream(shape, batch: int, trace: str, seed: int, group: int = 4):
    """Endless (dense, KJT) batches, made `group` at a time (each group from its own seed)."""
    g = 0
    while True:
        yield from make_inputs(shape, batch, group, trace, seed=seed * 100_003 + g)
        g += 1


# -- system helpers ---------------------------------------------------------------------------

class MemoryCgroup:
    """A memory cgroup for one child (v1 memory controller, else v2)."""

    def __init__(self, name: str, limit: int | None):
        self.path = None
        self.version = None
        self.error = None
        for root, ver in (("/sys/fs/cgroup/memory", 1), ("/sys/fs/cgroup/unified", 2), ("/sys/fs/cgroup", 2)):
            base = Path(root)
            if not base.is_dir() or (ver == 1 and not (base / "memory.limit_in_bytes").exists()
                                     and not (base / "cgroup.procs").exists()):
                continue
            if ver == 2 and not (base / "cgroup.controllers").exists():
                continue
            p = base / name
            try:
                p.mkdir(exist_ok=True)
                if limit is not None:
                    f = "memory.limit_in_bytes" if ver == 1 else "memory.max"
                    (p / f).write_text(str(int(limit)))
                self.path, self.version = p, ver
                return
            except OSError as e:
                self.error = f"{p}: {e}"
                try:
                    p.rmdir()
                except OSError:
                    pass
        if self.error is None:
            self.error = "no memory cgroup hierarchy is mounted"

    def preexec(self):
        path = self.path

        def join():
            if path is not None:
                (path / "cgroup.procs").write_text(str(os.getpid()))
        return join

    def peak(self) -> int | None:
        if self.path is None:
            return None
        for f in ("memory.max_usage_in_bytes", "memory.peak"):
            if (self.path / f).exists():
                return int((self.path / f).read_text().split()[0])
        return None

    def close(self) -> None:
        if self.path is not None:
            for _ in range(50):
                try:
                    self.path.rmdir()
                    return
                except OSError:
                    time.sleep(0.1)


# -- the parent: data, device, children ------------------------------------------------------

def prepare_model(shape, work: Path, progress: bool) -> dict:
    """Flat float32 files (the mmap method) and the embedding store (recflash), same weights."""
    from recflash.ndp import EmbeddingStore
    from recflash.reader import Store

    mdir = work / shape.name
    mdir.mkdir(parents=True, exist_ok=True)
    store = mdir / "store"
    t0 = time.perf_counter()
    with Store.open(str(store)) as s:
        emb = EmbeddingStore(s)
        for t, name in enumerate(table_names(shape)):
            flat = mdir / f"{name}.f32"
            w = table_weight(shape, t)
            w.numpy().tofile(flat)
            emb.create_table(name, shape.num_rows, shape.dim)
            emb.load_table(name, w, progress=progress)
            del w
        s.sync()
    return {"dir": str(mdir), "store": str(store), "seconds": time.perf_counter() - t0,
            "flat_bytes": shape.total_bytes}


def run_child(args, cfg: dict, cgroup_limit: int | None, tag: str) -> dict:
    cg = MemoryCgroup(f"recflash-inference-{os.getpid()}-{tag}", cgroup_limit)
    out_path = Path(cfg["work"]) / f"result-{tag}.json"
    if out_path.exists():
        out_path.unlink()
    cfg = dict(cfg, out=str(out_path))
    dropped = drop_caches()
    env = dict(os.environ)
    env.setdefault("OMP_NUM_THREADS", str(os.cpu_count() or 1))
    t0 = time.perf_counter()
    p = subprocess.run([sys.executable, str(Path(__file__).resolve()), "--child", json.dumps(cfg)],
                       preexec_fn=cg.preexec(), env=env, capture_output=True, text=True)
    wall = time.perf_counter() - t0
    peak = cg.peak()
    cg.close()
    res = json.loads(out_path.read_text()) if out_path.exists() else {}
    if p.returncode != 0 or not res:
        tail = (p.stderr or "").strip().splitlines()[-12:]
        res.setdefault("error", f"child exited with {p.returncode}" + (" (killed: out of its memory limit?)"
                                                                       if p.returncode in (-9, 137) else ""))
        res["stderr_tail"] = tail
    res.update(cgroup={"version": cg.version, "limit_bytes": cgroup_limit, "peak_bytes": peak, "error": cg.error,
                       "caches_dropped": dropped}, wall_seconds=wall)
    return res


# -- a child: one method of one model ---------------------------------------------------------

def child_main(cfg: dict) -> None:
    import numpy as np
    import resource
    import torch

    from recflash.ndp.sls import DENSE_PAGE_ROWS
    from recflash.ndp.traces import model_shape

    torch.set_num_threads(cfg.get("threads", 1))
    out: dict = {"model": cfg.get("model"), "method": cfg["method"], "points": []}
    t_setup = time.perf_counter()
    if cfg["method"] == "baseline" or cfg.get("measure_baseline"):
        out["baseline_rss_bytes"] = measure_baseline(cfg)
        if cfg["method"] == "baseline":
            Path(cfg["out"]).write_text(json.dumps(out))
            return
    shape = model_shape(cfg["model"], cfg["scale"])
    method = cfg["method"]
    mdir = Path(cfg["model_dir"])
    names = table_names(shape)
    backend = None
    server = None
    import torch.distributed as dist

    if method in ("dram", "recflash", "recflash+cache", "recflash-device"):
        import tempfile

        from torchrec.distributed.model_parallel import DistributedModelParallel

        from recflash.torchrec_ext import SsdEmbeddingBagCollectionSharder, find_ssd_modules, plan_offload

        if not dist.is_initialized():
            dist.init_process_group("gloo", store=dist.FileStore(tempfile.mktemp(prefix="rf-pg-"), 1), rank=0,
                                    world_size=1)
        model = build_model(shape, "meta")
        budget = cfg["budget_bytes"]
        sls = {}
        if method == "dram":
            plan = plan_offload(model, world_size=1, ssd_tables=[], print_table=False)
        elif method == "recflash+cache":
            plan = plan_offload(model, world_size=1, dram_budget_bytes=budget // 2, print_table=False,
                                pooling_factors={n: shape.lookups for n in names}, batch_size=max(cfg["batches"]))
            # The engine charges a cached row its bytes + 64; on the heap it costs about 192 B
            # more (hash node, LRU node, the row's vector and the allocator's headers): size the
            # cache so that what it really takes fits what is left of the budget (after the DRAM
            # tables and the engine's own DRAM for the SSD tables).
            left = max(0, budget - plan.tiering.dram_bytes - plan.tiering.engine_dram_bytes)
            row = 4 * shape.dim
            sls = {"row_cache_bytes": int(left * (row + 64) / (row + 192))}
        else:
            # planned for the largest batch served: the engine's DRAM for a call's rows grows with it
            plan = plan_offload(model, world_size=1, dram_budget_bytes=budget, print_table=False,
                                pooling_factors={n: shape.lookups for n in names}, batch_size=max(cfg["batches"]))
        location = cfg["store"]
        if method == "recflash-device":
            server, location = start_device_server(cfg["store"], Path(cfg["work"]), sls, cfg["model"])
            import atexit

            atexit.register(stop_server, server)  # also when this child fails
            sls = {"timeout": 600.0}
        out["plan"] = {"ssd_tables": plan.tiering.ssd_tables, "dram_tables": plan.tiering.dram_tables,
                       "predicted_ssd_reads_per_sample": plan.tiering.ssd_reads_per_sample, "sls_options": sls,
                       "dram_table_bytes": plan.tiering.dram_bytes, "engine_dram_bytes": plan.tiering.engine_dram_bytes}
        dmp = DistributedModelParallel(model, device=torch.device("cpu"), plan=plan,
                                       sharders=[SsdEmbeddingBagCollectionSharder(location, **sls)])
        dram = set(plan.tiering.dram_tables)
        ref_dense = build_model(shape, "meta").state_dict()
        dmp.load_state_dict({k: v for k, v in ref_dense.items() if "embedding_bags" not in k}, strict=False)
        # DRAM tables filled in place, a chunk at a time: no second copy of a table in memory
        sd = dmp.state_dict()
        for t, n in enumerate(names):
            if n in dram:
                w = sd[f"sparse_arch.embedding_bag_collection.embedding_bags.{n}.weight"]
                w = w.local_shards()[0].tensor if hasattr(w, "local_shards") else w
                with torch.no_grad():
                    fill_table_weight(shape, t, w)
        del sd
        run = dmp
        mods = find_ssd_modules(dmp)
        backend = mods[0].ssd_backend if mods and mods[0].local_ssd_tables() else None
    else:  # mmap: what a user does without recflash
        model = build_model(shape, "meta")
        ebc = model.sparse_arch.embedding_bag_collection
        for t, n in enumerate(names):
            w = torch.from_file(str(mdir / f"{n}.f32"), shared=True, size=shape.num_rows * shape.dim,
                                dtype=torch.float32).view(shape.num_rows, shape.dim)
            ebc.embedding_bags[n].weight = torch.nn.Parameter(w, requires_grad=False)
        dense = build_model(shape, "meta").state_dict()
        model.load_state_dict({k: v for k, v in dense.items() if "embedding_bags" not in k}, strict=False)
        run = model.eval()
    out["setup_seconds"] = time.perf_counter() - t_setup
    out["setup_rss_bytes"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024

    refs = {}
    ref_path = mdir / "reference.npz"
    if method != "dram" and ref_path.exists():
        refs = dict(np.load(ref_path))
    new_refs = {}
    for trace in cfg["traces"]:
        for batch in cfg["batches"]:
            nb = cfg["max_batches"]
            # generated a few batches at a time: a whole point's ids would take hundreds of MB
            inputs = input_stream(shape, batch, trace, seed=17)
            key = f"{trace}_{batch}"
            with torch.no_grad():
                lat = []
                stats0 = backend.cache_stats() if backend is not None else None
                for _ in range(cfg["warmup"]):
                    run(*next(inputs))
                d0 = diskstats_of(cfg["store"])
                t_point = time.perf_counter()
                first = None
                hits0 = _hits(backend)
                for _ in range(nb):
                    dense, kjt = next(inputs)
                    t = time.perf_counter()
                    y = run(dense, kjt)
                    lat.append(time.perf_counter() - t)
                    if first is None:
                        first = y.detach().numpy().copy()
                    if time.perf_counter() - t_point > cfg["seconds"] and len(lat) >= cfg["min_batches"]:
                        break
                d1 = diskstats_of(cfg["store"])
                hits1 = _hits(backend)
            secs = sum(lat)
            samples = batch * len(lat)
            point = {"trace": trace, "batch": batch, "batches": len(lat), "samples_per_s": samples / secs,
                     "p50_ms": 1e3 * float(np.percentile(lat, 50)), "p95_ms": 1e3 * float(np.percentile(lat, 95)),
                     "p99_ms": 1e3 * float(np.percentile(lat, 99)),
                     "device_reads": (d1["read_ios"] - d0["read_ios"]) if d0 and d1 else None,
                     "device_bytes": (d1["read_bytes"] - d0["read_bytes"]) if d0 and d1 else None, "samples": samples,
                     "rss_bytes": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024}
            if method != "dram" and method != "mmap" and plan.tiering.ssd_tables:
                # the engine's read rule at this batch (de-duplication, dense pages read whole)
                point["predicted_device_reads_per_sample"] = plan.tiering.ssd_device_reads_per_sample(
                    batch, int(sls.get("dense_page_rows", DENSE_PAGE_ROWS)), bool(sls.get("vector_grained", True)))
            if hits0 is not None:
                h, m = hits1[0] - hits0[0], hits1[1] - hits0[1]
                point["hit_rate"] = h / (h + m) if h + m else 0.0
            if method == "dram":
                new_refs[key] = first
            elif key in refs:
                point["max_abs_diff"] = float(np.abs(first - refs[key]).max())
            out["points"].append(point)
            log_child(f"{cfg['model']} {method} {trace} batch {batch}: {point['samples_per_s']:,.0f} samples/s, "
                      f"p50 {point['p50_ms']:.2f} ms")
    if method == "dram":
        np.savez(ref_path, **new_refs)
    if backend is not None:
        out["cache_stats"] = backend.cache_stats()
    if server is not None:
        stop_server(server)
    Path(cfg["out"]).write_text(json.dumps(out))


def measure_baseline(cfg: dict) -> int:
    """Everything a recflash child holds before its DRAM tables and caches: the interpreter, torch,
    torchrec, a process group, the planner and a DMP with every table on SSD (max RSS)."""
    import resource
    import tempfile

    import torch
    import torch.distributed as dist
    from torchrec.distributed.model_parallel import DistributedModelParallel

    from recflash.ndp.traces import model_shape
    from recflash.torchrec_ext import SsdEmbeddingBagCollectionSharder, close_backends, plan_offload

    shape = model_shape(cfg["model"], cfg["scale"])
    if not dist.is_initialized():
        dist.init_process_group("gloo", store=dist.FileStore(tempfile.mktemp(prefix="rf-pg-"), 1), rank=0,
                                world_size=1)
    model = build_model(shape, "meta")
    plan = plan_offload(model, world_size=1, ssd_tables=table_names(shape), print_table=False)
    DistributedModelParallel(model, device=torch.device("cpu"), plan=plan,
                             sharders=[SsdEmbeddingBagCollectionSharder(cfg["store"])])
    close_backends()
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024


def _hits(backend):
    if backend is None:
        return None
    c = backend.cache_stats()
    h = m = 0
    for name in ("row_cache", "hot_rows", "pooled_cache", "device_cache"):
        if c.get(name, {}).get("budget_bytes"):
            h += c[name]["hits"]
            m += c[name]["misses"]
    return h, m


def log_child(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


def stop_server(p) -> None:
    if p.poll() is None:
        p.terminate()
        try:
            p.wait(timeout=30)
        except subprocess.TimeoutExpired:
            p.kill()


def start_device_server(store: str, work: Path, sls: dict, model: str):
    sock = work / "ndp" / f"{model}.sock"  # one per model: a server is never reused across stores
    sock.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
    exe = shutil.which("recflash", path=os.path.dirname(sys.executable)) or shutil.which("recflash") or "recflash"
    cmd = [exe, "ndp", "serve", "--store", store, "--listen", f"unix:{sock}"]
    for k, v in sls.items():  # the server's cache options are in MB
        cmd += [f"--{k.replace('_bytes', '_mb').replace('_', '-')}", str(v / 2**20)]
    p = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    for _ in range(300):
        if sock.exists():
            break
        time.sleep(0.1)
    return p, f"unix:{sock}"


# -- report -------------------------------------------------------------------------------------

def plot(png: Path, res: dict) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    models = sorted({r["model"] for r in res["runs"]})
    traces = sorted({r["trace"] for r in res["runs"]})
    fig, axes = plt.subplots(len(traces), len(models), figsize=(5 * len(models), 3.8 * len(traces)), squeeze=False)
    for i, tr in enumerate(traces):
        for j, m in enumerate(models):
            ax = axes[i][j]
            for meth in METHODS:
                pts = sorted((r["batch"], r["samples_per_s"]) for r in res["runs"]
                             if r["model"] == m and r["trace"] == tr and r["method"] == meth)
                if pts:
                    ax.plot([p[0] for p in pts], [p[1] for p in pts], marker="o", label=meth)
            ax.set_xscale("log", base=2)
            ax.set_yscale("log")
            ax.set_title(f"{m}, {tr} ids")
            ax.set_xlabel("batch size")
            ax.set_ylabel("samples/s")
            ax.grid(True, alpha=0.3)
            ax.legend(fontsize=7)
    fig.suptitle(f"DLRM inference under a DRAM budget of {res['budget_frac']:g} of the table bytes "
                 f"(device {res['device'].get('iops', 0):,.0f} IOPS at 512 B)")
    fig.tight_layout()
    fig.savefig(png, dpi=110)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--child", help=argparse.SUPPRESS)
    ap.add_argument("--quick", action="store_true", help="RM1 only, tiny tables, batches 1 and 64 (< 2 minutes)")
    ap.add_argument("--models", default="RM1,RM2,RM3")
    ap.add_argument("--scale", type=float, default=None, help="rows per table relative to the published shape")
    ap.add_argument("--dram-budget-frac", type=float, default=0.125)
    ap.add_argument("--batches", default=None, help="batch sizes (default 1,16,64,256)")
    ap.add_argument("--traces", default="zipf,uniform")
    ap.add_argument("--methods", default=",".join(METHODS))
    ap.add_argument("--seconds", type=float, default=None, help="timed seconds per point (at least --min-batches)")
    ap.add_argument("--threads", type=int, default=1,
                    help="torch threads per child (1: OpenMP spinning on a shared 2-core machine costs more than it gives)")
    ap.add_argument("--work", default=None, help="working directory (default /tmp/recflash-inference)")
    ap.add_argument("--keep", action="store_true", help="keep the working directory (tables, store)")
    ap.add_argument("--json", default=str(HERE / "results" / "inference.json"))
    ap.add_argument("--plot", default=None)
    args = ap.parse_args(argv)
    if args.child:
        child_main(json.loads(args.child))
        return 0

    from recflash.ndp.traces import model_shape
    from harness import write_report

    quick = args.quick
    models = ["RM1"] if quick and args.models == "RM1,RM2,RM3" else [m.strip().upper() for m in args.models.split(",")]
    for m in models:
        if m not in MLPS:
            ap.error(f"unknown model {m} (RM1, RM2, RM3)")
    scale = args.scale if args.scale is not None else (0.004 if quick else 0.25)
    batches = [int(b) for b in (args.batches or ("1,64" if quick else "1,16,64,256")).split(",")]
    traces = [t.strip() for t in args.traces.split(",")]
    methods = [m.strip() for m in args.methods.split(",")]
    for m in methods:
        if m not in METHODS:
            ap.error(f"unknown method {m} ({', '.join(METHODS)})")
    if "recflash-device" in methods:
        try:
            from recflash.ndp import DeviceClient  # noqa: F401
        except ImportError:
            log("recflash-device: this build has no NDP device server (recflash.ndp.DeviceClient): skipped")
            methods.remove("recflash-device")
    seconds = args.seconds if args.seconds is not None else (1.0 if quick else 4.0)
    work = Path(args.work or "/tmp/recflash-inference") / f"run-{os.getpid()}"
    work.mkdir(parents=True, exist_ok=True)
    res = {"started": time.time(), "quick": quick, "threads": args.threads, "scale": scale, "budget_frac": args.dram_budget_frac,
           "models": {}, "runs": [], "loadavg": {"start": loadavg()}, "errors": [], "cpus": os.cpu_count()}
    try:
        shapes = {m: model_shape(m, scale) for m in models}
        for m, s in shapes.items():
            log(f"{m}: {s.num_tables} tables x {s.num_rows:,} rows x dim {s.dim} ({s.total_bytes / 2**20:,.0f} MiB), "
                f"{s.lookups} lookups per bag: writing the flat files and the store")
            res["models"][m] = dict(num_tables=s.num_tables, num_rows=s.num_rows, dim=s.dim, lookups=s.lookups,
                                    table_bytes=s.total_bytes, mlp=MLPS[m], **prepare_model(s, work, not quick and sys.stdout.isatty()))
        total_bytes = sum(s.total_bytes for s in shapes.values())
        # the device: 512 B random reads at QD128 over a fully written flat file (no holes)
        first = shapes[models[0]]
        flat = Path(res["models"][models[0]]["dir"]) / f"{table_names(first)[0]}.f32"
        drop_caches()
        st = os.stat(flat)
        res["device"] = fio_randread(str(flat), first.table_bytes // 4096 * 4096, 512, 128, 2.0 if quick else 5.0,
                                     (os.major(st.st_dev), os.minor(st.st_dev)))
        res["device"]["loadavg"] = loadavg()
        log(f"device: {res['device'].get('iops', 0):,.0f} random 512 B reads/s at QD128 (fio)")
        # The process baseline: measured by the first dram child before it allocates its tables
        # (one process start fewer), or by a child of its own when dram is not run.
        baseline = 0
        if "dram" not in methods:
            base = run_child(args, {"method": "baseline", "work": str(work), "model": models[0], "scale": scale,
                                    "store": res["models"][models[0]]["store"]}, None, "baseline")
            baseline = base.get("baseline_rss_bytes") or 0
            res["interpreter_baseline_bytes"] = baseline
        for m, s in shapes.items():
            budget = int(args.dram_budget_frac * s.total_bytes)
            res["models"][m]["budget_bytes"] = budget
            for meth in methods:
                cfg = {"model": m, "scale": scale, "method": meth, "model_dir": res["models"][m]["dir"],
                       "store": res["models"][m]["store"], "work": str(work), "budget_bytes": budget,
                       "traces": traces, "batches": batches, "seconds": seconds, "min_batches": 3,
                       "max_batches": 12 if quick else 200, "warmup": 2 if quick else 4,
                       "threads": args.threads}
                if meth == "dram" and not baseline:
                    cfg["measure_baseline"] = True
                # recflash-device: two processes share the cgroup (client and server), two baselines
                limit = None if meth == "dram" else budget + baseline * (2 if meth == "recflash-device" else 1)
                log(f"{m} {meth}: child in a memory cgroup"
                    + (f" limited to {limit / 2**20:,.0f} MiB (budget {budget / 2**20:,.0f} MiB + process baseline"
                       f"{' x 2' if meth == 'recflash-device' else ''})"
                       if limit else " without a limit (the reference)"))
                r = run_child(args, cfg, limit, f"{m}-{meth}".replace("+", "_"))
                if cfg.get("measure_baseline"):
                    baseline = r.get("baseline_rss_bytes") or 0
                    res["interpreter_baseline_bytes"] = baseline
                    log(f"process baseline (python, torch, torchrec, a process group, a DMP with every table on "
                        f"SSD; max RSS, measured by the dram child before its tables): {baseline / 2**20:,.0f} MiB")
                if r.get("error"):
                    res["errors"].append(f"{m} {meth}: {r['error']}: {' | '.join(r.get('stderr_tail', []))}")
                    log(f"{m} {meth}: {r['error']}")
                peak = r["cgroup"]["peak_bytes"]
                for p in r.get("points", []):
                    run = {"model": m, "method": meth, "batch": p["batch"], "trace": p["trace"],
                           "samples_per_s": p["samples_per_s"], "p50_ms": p["p50_ms"], "p95_ms": p["p95_ms"],
                           "p99_ms": p["p99_ms"], "peak_dram_bytes": peak,
                           "peak_dram_above_baseline_bytes": (peak - baseline) if peak else None,
                           "peak_rss_bytes": p["rss_bytes"], "peak_rss_above_baseline_bytes": p["rss_bytes"] - baseline,
                           "device_reads": p["device_reads"], "device_bytes": p["device_bytes"],
                           "hit_rate": p.get("hit_rate"), "max_abs_diff": p.get("max_abs_diff"),
                           "batches": p["batches"], "samples": p["samples"]}
                    rps = (p["device_reads"] or 0) / p["samples"]
                    run["device_reads_per_sample"] = rps
                    if meth.startswith("recflash") and res["device"].get("iops") and rps > 0:
                        bound = res["device"]["iops"] / rps
                        run["iops_bound_samples_per_s"] = bound
                        run["iops_bound_fraction"] = p["samples_per_s"] / bound
                    else:
                        run["iops_bound_fraction"] = None
                    if "plan" in r:
                        run["predicted_ssd_reads_per_sample"] = r["plan"]["predicted_ssd_reads_per_sample"]
                    if p.get("predicted_device_reads_per_sample") is not None:
                        run["predicted_device_reads_per_sample"] = p["predicted_device_reads_per_sample"]
                    res["runs"].append(run)
                res["models"][m].setdefault("children", {})[meth] = {k: r.get(k) for k in
                                                                     ("plan", "setup_seconds", "cgroup", "wall_seconds",
                                                                      "cache_stats", "setup_rss_bytes")}
        res["targets"] = targets(res)
    finally:
        res["loadavg"]["end"] = loadavg()
        res["seconds"] = time.perf_counter() - _T0
        if not args.keep:
            shutil.rmtree(work, ignore_errors=True)
    write_report(res, args.json, args.plot, plot, log)
    return 0


def targets(res: dict) -> dict:
    out = {}
    runs = res["runs"]

    def get(m, meth, b, tr):
        for r in runs:
            if (r["model"], r["method"], r["batch"], r["trace"]) == (m, meth, b, tr):
                return r
        return None

    diffs = [r["max_abs_diff"] for r in runs if r["method"] != "dram" and r.get("max_abs_diff") is not None]
    if diffs:
        out["outputs_equal_dram_max_abs_diff"] = {"target": 1e-5, "measured": max(diffs), "met": max(diffs) <= 1e-5}
    for m in ("RM1", "RM2"):
        a, b = get(m, "recflash", 64, "uniform"), get(m, "mmap", 64, "uniform")
        if a and b:
            x = a["samples_per_s"] / b["samples_per_s"]
            out[f"{m}_recflash_vs_mmap_batch64_uniform"] = {"target": 10.0, "measured": x, "met": x >= 10.0}
        if a and a.get("iops_bound_fraction") is not None:
            f = a["iops_bound_fraction"]
            out[f"{m}_recflash_iops_bound_fraction_batch64_uniform"] = {"target": 0.8, "measured": f, "met": f >= 0.8}
    for m in res["models"]:
        a, c = get(m, "recflash", 64, "zipf"), get(m, "recflash+cache", 64, "zipf")
        if a and c:
            x = c["samples_per_s"] / a["samples_per_s"]
            out[f"{m}_cache_vs_nocache_batch64_zipf"] = {"target": 2.0, "measured": x, "met": x >= 2.0}
        rec = [r for r in runs if r["model"] == m and r["method"] == "recflash"]
        if rec:
            # RSS above the interpreter baseline (the cgroup's own peak cannot pass its limit: page
            # cache is reclaimed first), as a fraction of the budget
            over = max(r["peak_rss_above_baseline_bytes"] for r in rec) / res["models"][m]["budget_bytes"]
            out[f"{m}_recflash_rss_above_baseline_over_budget"] = {"target": 1.0, "measured": over, "met": over <= 1.0}
        u = get(m, "recflash", 256, "uniform") or get(m, "recflash", 64, "uniform")
        # the planner's device reads at the point's batch (the engine's read rule); runs from
        # before that figure existed compared the row lookups per sample
        pred = (u or {}).get("predicted_device_reads_per_sample") or (u or {}).get("predicted_ssd_reads_per_sample")
        if u and pred and u["device_reads_per_sample"]:
            x = pred / u["device_reads_per_sample"]
            out[f"{m}_planner_predicted_over_measured_reads"] = {"target": 2.0, "measured": x,
                                                                 "met": 0.5 <= x <= 2.0}
    return out


if __name__ == "__main__":
    sys.exit(main())
