#!/usr/bin/env python3
"""recflash demo: a feature-arranged SSD store, end to end, on an embedded store.

Creates four features of different types, loads ~200k keys, applies rounds of random updates
(each followed by a flush, where the pinner and the merger run), reads a whole feature, a key
range of two features and a few point lookups, prints what each read cost and the store's
amplification figures, then closes, reopens and checks that every item is still there.

Then the ingest path: writes a small synthetic Criteo-like TSV (Kaggle layout), imports it
with `recflash import criteo`, prints `recflash stats` of the new store, and turns its first
rows into a TorchRec Batch with recflash.ingest.Preprocessor.

    make demo                                   # from the repo root
    .venv/bin/python examples/demo.py --keys 50000 --path /tmp/mystore --keep
    .venv/bin/python examples/demo.py --criteo-rows 0     # skip the ingest part
"""

from __future__ import annotations

import argparse
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
from rich.console import Console
from rich import box
from rich.table import Table

from recflash.reader import Store, StoreOptions

DIM = 16
FEATURES = {
    "avg_rating": "float32",
    "clicks": "int64",
    "genres": "list<int64>",
    "user_emb": f"fixed_size_list<float32, {DIM}>",
}
# fraction of all keys rewritten per update round, per feature: ratings change most, genres
# only trickle in (a few items per flush: what the pinner holds back instead of writing scraps)
UPDATE_SHARE = {"avg_rating": 0.10, "clicks": 0.05, "genres": 0.0002, "user_emb": 0.02}

console = Console()


# ---------------------------------------------------------------------------------------------
# data


def make_values(feature: str, n: int, rng: np.random.Generator) -> Any:
    if feature == "avg_rating":
        return rng.uniform(1.0, 5.0, n).astype(np.float32)
    if feature == "clicks":
        return rng.integers(0, 100_000, n, dtype=np.int64)
    if feature == "genres":  # multi-hot ids, 1..5 per key
        lengths = rng.integers(1, 6, n)
        offsets = np.zeros(n + 1, dtype=np.int32)
        np.cumsum(lengths, out=offsets[1:])
        ids = rng.integers(0, 40, int(offsets[-1]), dtype=np.int64)
        return pa.ListArray.from_arrays(pa.array(offsets), pa.array(ids))
    if feature == "user_emb":
        return rng.standard_normal((n, DIM), dtype=np.float32)
    raise ValueError(feature)


class Truth:
    """What the store must return: the latest value of every key (None = deleted / absent)."""

    def __init__(self, n: int) -> None:
        self.avg_rating = np.zeros(n, dtype=np.float32)
        self.clicks = np.zeros(n, dtype=np.int64)
        self.clicks_alive = np.ones(n, dtype=bool)
        self.user_emb = np.zeros((n, DIM), dtype=np.float32)
        self.genre_len = np.zeros(n, dtype=np.int64)

    def apply(self, feature: str, keys: np.ndarray, values: Any) -> None:
        idx = keys.astype(np.int64)
        if feature == "genres":
            self.genre_len[idx] = pc.list_value_length(values).to_numpy()
        else:
            getattr(self, feature)[idx] = values


# ---------------------------------------------------------------------------------------------
# printing helpers


def fmt_bytes(n: Any) -> str:
    if n is None:
        return "—"
    n = float(n)
    for unit in ("B", "KiB", "MiB", "GiB"):
        if abs(n) < 1024 or unit == "GiB":
            return f"{n:,.0f} {unit}" if unit == "B" else f"{n:,.1f} {unit}"
        n /= 1024
    return str(n)


def fmt_num(x: Any, digits: int = 2) -> str:
    if x is None:
        return "—"
    if isinstance(x, (int, np.integer)):
        return f"{int(x):,}"
    return f"{float(x):,.{digits}f}"


def new_table(title: str | None = None, **kw: Any) -> Table:
    return Table(title=title, title_justify="left", box=box.SIMPLE_HEAD, show_edge=False, pad_edge=False, **kw)


def show(table: Table) -> None:
    console.print(table)
    console.print()


def read_cost_table(title: str, rows: list[tuple[str, dict[str, Any], int]]) -> Table:
    t = new_table(title)
    for col in ("read", "rows", "pages", "bytes\nread", "useful\nbytes", "read\namp", "time"):
        t.add_column(col, justify="left" if col == "read" else "right", no_wrap=col != "read")
    for name, rs, nrows in rows:
        t.add_row(
            name,
            f"{nrows:,}",
            fmt_num(rs.get("pages_read")),
            fmt_bytes(rs.get("bytes_read")),
            fmt_bytes(rs.get("useful_bytes")),
            fmt_num(rs.get("read_amplification"), 2 if float(rs.get("read_amplification") or 0) < 100 else 0),
            f"{1000 * float(rs.get('seconds', 0.0)):.1f} ms",
        )
    return t


def counters(d: Any) -> str:
    if not d:
        return "—"
    if not isinstance(d, dict):
        return str(d)
    return ", ".join(f"{k}={fmt_num(v) if isinstance(v, (int, float, np.number)) else v}" for k, v in d.items())


# ---------------------------------------------------------------------------------------------
# the demo


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--keys", type=int, default=200_000, help="number of keys (default 200000)")
    ap.add_argument("--rounds", type=int, default=6, help="update rounds (default 6)")
    ap.add_argument("--buffer-mib", type=float, default=1.0, help="write buffer size in MiB (default 1)")
    ap.add_argument("--path", type=Path, help="store directory to create (default: a fresh temp dir)")
    ap.add_argument("--keep", action="store_true", help="keep the temp store afterwards")
    ap.add_argument("--seed", type=int, default=7)
    ap.add_argument("--criteo-rows", type=int, default=100_000,
                    help="rows of the synthetic Criteo TSV for the ingest part (default 100000; 0 skips it)")
    args = ap.parse_args()

    if args.path is not None and args.path.exists() and any(args.path.iterdir()):
        console.print(f"[red]error:[/red] {args.path} exists and is not empty; the demo creates a new store")
        return 2
    tmp = None
    if args.path is None:
        tmp = Path(tempfile.mkdtemp(prefix="recflash-demo-"))
        path = tmp / "store"
    else:
        path = args.path
    ingest_dir = Path(tempfile.mkdtemp(prefix="recflash-demo-ingest-")) if args.criteo_rows > 0 else None
    try:
        run(path, args)
        if ingest_dir is not None:
            run_ingest(ingest_dir, args)
    finally:
        if tmp is not None and not args.keep:
            shutil.rmtree(tmp, ignore_errors=True)
        elif tmp is not None:
            console.print(f"store kept at [bold]{path}[/bold] (try: .venv/bin/recflash info {path})")
        if ingest_dir is not None and not args.keep:
            shutil.rmtree(ingest_dir, ignore_errors=True)
        elif ingest_dir is not None:
            console.print(f"Criteo store kept at [bold]{ingest_dir / 'criteo'}[/bold] "
                          f"(try: .venv/bin/recflash stats --store {ingest_dir / 'criteo'})")
    return 0


def run(path: Path, args: argparse.Namespace) -> None:
    rng = np.random.default_rng(args.seed)
    n = args.keys
    all_keys = np.arange(n, dtype=np.uint64)
    truth = Truth(n)
    t_start = time.perf_counter()

    buffer_bytes = int(args.buffer_mib * (1 << 20))
    options = StoreOptions(page_size=16384, write_buffer_bytes=buffer_bytes)
    console.rule("[bold]recflash demo")
    console.print(
        f"store [bold]{path}[/bold]: 16 KiB pages, {fmt_bytes(buffer_bytes)} write buffer, "
        f"{n:,} keys × {len(FEATURES)} features"
    )
    store = Store.open(str(path), options)

    # -- schema ---------------------------------------------------------------------------------
    for name, type_ in FEATURES.items():
        store.create_feature(name, type_)
    console.print("features: " + ", ".join(f"[cyan]{k}[/cyan] {v}" for k, v in store.features().items()))

    # -- bulk load: batches that interleave all features, as a training-data import does ----------
    console.rule("load")
    batch = 25_000
    t0 = time.perf_counter()
    for lo in range(0, n, batch):
        keys = all_keys[lo : lo + batch]
        for name in FEATURES:
            values = make_values(name, len(keys), rng)
            store.put(name, keys, values)
            truth.apply(name, keys, values)
    store.flush()
    dt = time.perf_counter() - t0
    s = store.stats()
    console.print(
        f"loaded {n * len(FEATURES):,} items in {dt:.2f} s ({n * len(FEATURES) / dt:,.0f} items/s): "
        f"{fmt_num(s.get('pages_in_use'))} pages, {fmt_bytes(s.get('live_item_bytes'))} live, "
        f"{fmt_num(s.get('flushes'))} flushes"
    )

    # -- updates: uniform random rewrites, a flush after each round -------------------------------
    console.rule("updates")
    rounds = new_table(title="after each round of updates + flush; last four columns: fragmentation "
                         "degree per feature")
    for col in ("#", "updated", "pages", "space\namp", "write\namp", *FEATURES):
        rounds.add_column(col, justify="right", no_wrap=True)
    t0 = time.perf_counter()
    updated_total = 0
    for r in range(1, args.rounds + 1):
        updated = 0
        for name, share in UPDATE_SHARE.items():
            keys = np.sort(rng.choice(n, max(1, int(n * share)), replace=False)).astype(np.uint64)
            values = make_values(name, len(keys), rng)
            store.put(name, keys, values)
            truth.apply(name, keys, values)
            updated += len(keys)
        store.flush()
        updated_total += updated
        s = store.stats()
        frag = s.get("fragmentation") or {}
        rounds.add_row(
            str(r), f"{updated:,}", fmt_num(s.get("pages_in_use")),
            fmt_num(s.get("space_amplification")), fmt_num(s.get("write_amplification")),
            *(fmt_num(frag.get(f)) for f in FEATURES),
        )
    # deletes are updates too: drop 1% of the clicks
    gone = np.sort(rng.choice(n, n // 100, replace=False)).astype(np.uint64)
    store.delete("clicks", gone)
    truth.clicks_alive[gone.astype(np.int64)] = False
    store.flush()
    show(rounds)
    console.print(
        f"{updated_total:,} updates + {len(gone):,} deletes in {time.perf_counter() - t0:.2f} s"
    )

    # -- reads ----------------------------------------------------------------------------------
    console.rule("reads")
    reads = []
    rating = store.scan("avg_rating")
    reads.append(("scan avg_rating", store.last_read_stats(), rating.num_rows))
    if rating.num_rows != n or not np.array_equal(rating.column("value").to_numpy(), truth.avg_rating):
        raise SystemExit("scan('avg_rating') returned different data than was written")

    lo, hi = n // 4, n // 4 + n // 20
    both = store.scan_many(["clicks", "genres"], key_range=(lo, hi))
    reads.append(("scan_many ×2", store.last_read_stats(), both.num_rows))

    probe = np.concatenate([rng.choice(n, 4, replace=False), [n + 12345]]).astype(np.uint64)
    emb = store.get("user_emb", probe)
    reads.append(("get user_emb ×5", store.last_read_stats(), len(emb)))
    show(read_cost_table("what each read cost (read amp = bytes read ÷ useful bytes)", reads))

    sample = new_table(title=f"scan_many(['clicks', 'genres'], key_range=({lo}, {hi})): first rows")
    for col in both.column_names:
        sample.add_column(col, justify="right")
    for row in both.slice(0, 5).to_pylist():
        sample.add_row(*(str(row[c]) for c in both.column_names))
    show(sample)

    got = new_table(title="get('user_emb', keys): the last key does not exist")
    got.add_column("key", justify="right")
    got.add_column("user_emb[:4]")
    for k, v in zip(probe.tolist(), emb.to_pylist()):
        got.add_row(f"{k:,}", "null" if v is None else "[" + ", ".join(f"{x:+.3f}" for x in v[:4]) + ", …]")
    show(got)

    # -- store figures --------------------------------------------------------------------------
    console.rule("store")
    s = store.stats()
    figures = new_table(show_header=False)
    figures.add_column("figure", no_wrap=True)
    figures.add_column("value", justify="right", no_wrap=True)
    figures.add_column("meaning", style="dim")
    figures.add_row("live items", fmt_num(s.get("live_items")), "valid (feature, key) items")
    figures.add_row("pages in use", fmt_num(s.get("pages_in_use")), "16 KiB pages with live items")
    figures.add_row("space amplification", fmt_num(s.get("space_amplification")), "file bytes in use ÷ live bytes")
    figures.add_row("write amplification", fmt_num(s.get("write_amplification")), "device bytes ÷ user bytes written")
    figures.add_row("read amplification", fmt_num(s.get("read_amplification")), "bytes read ÷ useful, all reads")
    figures.add_row("metadata DRAM / item", fmt_num(s.get("metadata_dram_bytes_per_item")) + " B",
                    "feature + logical page tables")
    figures.add_row("disk bytes / item", fmt_num(s.get("disk_bytes_per_item")) + " B", "file bytes ÷ live items")
    figures.add_row("flushes", fmt_num(s.get("flushes")), "")
    show(figures)

    mechanisms = new_table(title="pinner, merger, reclaimer counters", show_header=False)
    mechanisms.add_column("part", no_wrap=True)
    mechanisms.add_column("counters")
    for part in ("pinner", "merger", "reclaimer"):
        mechanisms.add_row(part, counters(s.get(part)))
    show(mechanisms)

    per_feature = new_table(title="per feature (frag. = pages holding it ÷ ideal packed pages)")
    for col in ("feature", "type", "items", "pages", "valid\nbytes", "frag."):
        per_feature.add_column(col, justify="left" if col in ("feature", "type") else "right", no_wrap=True)
    feats = s.get("features") or {}
    for name, type_ in FEATURES.items():
        f = feats.get(name) or {}
        per_feature.add_row(name, type_, fmt_num(f.get("items")), fmt_num(f.get("pages")),
                            fmt_bytes(f.get("valid_bytes")),
                            fmt_num(f.get("fragmentation", (s.get("fragmentation") or {}).get(name))))
    show(per_feature)

    # -- durability: close, reopen, check everything ------------------------------------------------
    console.rule("close and reopen")
    store.close()
    with Store.open(str(path), options) as store:
        rating = store.scan("avg_rating")
        ok_rating = rating.num_rows == n and np.array_equal(rating.column("value").to_numpy(), truth.avg_rating)
        clicks = store.scan("clicks")
        alive = np.flatnonzero(truth.clicks_alive)
        ok_clicks = (np.array_equal(clicks.column("key").to_numpy().astype(np.int64), alive)
                     and np.array_equal(clicks.column("value").to_numpy(), truth.clicks[alive]))
        genres = store.scan("genres")
        ok_genres = genres.num_rows == n and np.array_equal(
            pc.list_value_length(genres.column("value")).to_numpy(), truth.genre_len)
        emb = store.scan("user_emb")
        emb_values = emb.column("value").combine_chunks().flatten().to_numpy().reshape(-1, DIM)
        ok_emb = emb.num_rows == n and np.array_equal(emb_values, truth.user_emb)
    for name, ok, rows in (("avg_rating", ok_rating, rating.num_rows), ("clicks", ok_clicks, clicks.num_rows),
                           ("genres", ok_genres, genres.num_rows), ("user_emb", ok_emb, emb.num_rows)):
        mark = "[green]✓[/green]" if ok else "[red]✗ MISMATCH[/red]"
        console.print(f"{mark} {name}: {rows:,} items read back after reopen")
    if not (ok_rating and ok_clicks and ok_genres and ok_emb):
        raise SystemExit("the store returned different data after reopen")
    console.rule(f"done in {time.perf_counter() - t_start:.1f} s")


# ---------------------------------------------------------------------------------------------
# the ingest path: TSV -> store -> TorchRec Batch


def _recflash_cli() -> str:
    exe = Path(sys.executable).with_name("recflash")
    return str(exe) if exe.exists() else "recflash"


def run_ingest(workdir: Path, args: argparse.Namespace) -> None:
    from recflash.ingest import criteo, synthetic

    t_start = time.perf_counter()
    console.rule("[bold]ingest: a Criteo-like dataset")
    tsv = workdir / "day_0.tsv"
    store = workdir / "criteo"
    t0 = time.perf_counter()
    size = synthetic.write_criteo_tsv(tsv, args.criteo_rows, seed=args.seed)
    console.print(f"wrote {tsv} ({args.criteo_rows:,} lines, {fmt_bytes(size)}, Kaggle layout: label, I1..I13, "
                  f"C1..C26 as 8 hex digits; Kaggle's empty-field rates, Zipf ids) in {time.perf_counter() - t0:.1f} s")
    for cmd in ([_recflash_cli(), "import", "criteo", str(tsv), "--store", str(store), "--write-buffer-mb", "64"],
                [_recflash_cli(), "stats", "--store", str(store)]):
        console.print(f"\n[bold]$ recflash {' '.join(cmd[1:])}[/bold]", highlight=False)
        r = subprocess.run(cmd, capture_output=True, text=True, cwd=str(workdir))
        sys.stdout.write(r.stdout)
        if r.returncode != 0:
            sys.stderr.write(r.stderr)
            raise SystemExit(f"`recflash {cmd[1]}` failed with exit code {r.returncode}")

    console.rule("ingest: store rows -> TorchRec Batch")
    console.print("importing torch / torchrec …", style="dim")
    import logging

    logging.getLogger("torch.fx._symbolic_trace").setLevel(logging.ERROR)  # a torchrec import-time notice
    from recflash.ingest import Preprocessor

    pre = Preprocessor.criteo(table_sizes=[100_000] * len(criteo.CAT_NAMES))
    with Store.open(str(store)) as s:
        table = s.scan_many(pre.features, key_range=(0, 4096))
    batch = pre(table)
    kjt = batch.sparse_features
    t = new_table(show_header=False)
    t.add_column("part", no_wrap=True)
    t.add_column("value")
    t.add_row("scan_many(40 features, keys [0, 4096))", f"{table.num_rows:,} rows × {table.num_columns} columns")
    t.add_row("dense_features", f"{tuple(batch.dense_features.shape)} {batch.dense_features.dtype}: "
              "log(1 + max(x, 0)), missing -> 0")
    t.add_row("sparse_features", f"KeyedJaggedTensor keys C1..C26, {kjt.values().numel():,} ids "
              f"(mod 100000), lengths {tuple(kjt.lengths().shape)}")
    t.add_row("labels", f"{tuple(batch.labels.shape)} {batch.labels.dtype}, mean {float(batch.labels.mean()):.3f}")
    t.add_row("row 0 dense", "[" + ", ".join(f"{x:.2f}" for x in batch.dense_features[0].tolist()) + "]")
    t.add_row("row 0 C1..C4", str([kjt[c].values()[0].item() for c in ("C1", "C2", "C3", "C4")]))
    show(t)
    console.rule(f"ingest part done in {time.perf_counter() - t_start:.1f} s")


if __name__ == "__main__":
    sys.exit(main())
