"""``recflash import ...`` and ``recflash stats`` (registered in :mod:`recflash.cli`).

Exit codes (the one policy of :mod:`recflash.reader._cli`): 0 success (also "already
imported"), 2 bad input (missing file, wrong schema, a bad line with ``--on-bad-lines error``,
a store that refuses the data, wrong options), 1 internal failure, 130 interrupted (Ctrl-C;
run the same command again to resume).
"""

from __future__ import annotations

import enum
import json
import math
import sys
import traceback
from pathlib import Path
from typing import Annotated, Any, Callable, Optional

import typer
from rich.progress import (BarColumn, Progress, ProgressColumn, TaskProgressColumn, TextColumn,
                           TimeElapsedColumn, TimeRemainingColumn)
from rich.markup import escape
from rich.text import Text

from recflash.reader._cli import (EXIT_BAD_INPUT, EXIT_INTERNAL, EXIT_INTERRUPTED, EXIT_OK,  # noqa: F401
                                   _features_table, _stats_table, _table, check_output_file, check_store_dir,
                                   console, err_console, error_text, fail, human_bytes, jsonable, open_store, ratio,
                                   store_errors)

import_app = typer.Typer(
    name="import",
    help="Import a dataset into a store: Criteo TSV, Parquet, CSV, Arrow IPC, or synthetic data. "
    "Every column becomes a feature; keys are row numbers (or a --key column). Resumable: run the "
    "same command again after an interruption.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)


class OnBadLines(str, enum.Enum):
    error = "error"
    skip = "skip"


class Preset(str, enum.Enum):
    criteo_kaggle = "criteo-kaggle"
    zipf = "zipf"


# -- options shared by the import commands -------------------------------------------------------
StoreOpt = Annotated[Path, typer.Option("--store", "-s", help="Store directory (created if missing).",
                                        show_default=False)]
PathsArg = Annotated[list[Path], typer.Argument(help="Input file(s), imported in order.", show_default=False)]
FeaturesOpt = Annotated[Optional[str], typer.Option(
    "--features", help="Comma-separated columns to import (default: all).", show_default=False)]
UpsertOpt = Annotated[bool, typer.Option(
    "--upsert", help="Update existing features: values of existing keys are replaced (nulls leave them).")]
AppendOpt = Annotated[bool, typer.Option(
    "--append", help="Row-number keys continue after the keys earlier imports wrote into this store.")]
KeyOffsetOpt = Annotated[Optional[int], typer.Option(
    "--key-offset", help="First row-number key (default 0, or with --append the end of earlier imports).",
    show_default=False)]
OnBadOpt = Annotated[OnBadLines, typer.Option(
    "--on-bad-lines", help="A bad line/row: stop with an error naming file, line, column and reason, "
    "or skip it (counted and sampled at the end).")]
WriteBufferOpt = Annotated[float, typer.Option(
    "--write-buffer-mb", help="Store write buffer in MiB; a flush (pinner, merger) runs when it fills.")]
PageSizeOpt = Annotated[int, typer.Option("--page-size", help="Page size of a new store, bytes.")]
BlockOpt = Annotated[float, typer.Option(
    "--block-mb", help="Input read per chunk, MiB of text: each chunk is one durable step.")]
RestartOpt = Annotated[bool, typer.Option(
    "--restart", help="Forget the progress of an earlier run of this import and start from the first row.")]
QuietOpt = Annotated[bool, typer.Option("--quiet", "-q", help="No progress bar.")]
SummaryOpt = Annotated[Optional[Path], typer.Option(
    "--summary-json", help="Also write the import's figures (rows, bytes, seconds, rates) to this file.",
    show_default=False)]
KeyOpt = Annotated[Optional[str], typer.Option(
    "--key", help="Integer column holding the keys (not stored as a feature). Default: row numbers.",
    show_default=False)]


def _split(features: Optional[str]) -> Optional[list[str]]:
    if features is None:
        return None
    out = [f.strip() for f in features.split(",") if f.strip()]
    return out or None


class _RateColumn(ProgressColumn):
    def render(self, task) -> Text:
        el = task.elapsed or 0.0
        if el <= 0:
            return Text("")
        rows = task.fields.get("rows", 0)
        ib = task.fields.get("input_bytes", 0)
        s = f"{rows / el:,.0f} rows/s"
        if ib:
            s += f"  {ib / el / 1e6:,.1f} MB/s"
        return Text(s, style="cyan")


class _RowsColumn(ProgressColumn):
    def render(self, task) -> Text:
        s = f"{task.fields.get('rows', 0):,} rows"
        if task.fields.get("skipped"):
            s += f", {task.fields['skipped']:,} skipped"
        return Text(s)


def _progress(enabled: bool, total: Optional[int]):
    if not enabled:
        return None, None
    p = Progress(TextColumn("[bold]import"), BarColumn(), TaskProgressColumn(), _RowsColumn(), _RateColumn(),
                 TimeElapsedColumn(), TextColumn("ETA"), TimeRemainingColumn(), console=err_console,
                 transient=False, refresh_per_second=4)
    task = p.add_task("import", total=total, rows=0, input_bytes=0, skipped=0)
    return p, task


def _run(make_source: Callable[[], Any], store: Path, *, upsert: bool, append: bool, key_offset: Optional[int],
         write_buffer_mb: float, page_size: int, restart: bool, quiet: bool,
         summary_json: Optional[Path]) -> None:
    from recflash.ingest.errors import BadInputError
    from recflash.ingest.importer import ImportOptions, Interrupted, describe_bad_lines, run_import

    try:
        from recflash.reader.errors import RecflashError
    except ImportError as e:  # pragma: no cover
        fail(f"the recflash engine is not importable ({e}); run `make build`", EXIT_INTERNAL)
    bad_input_errors = _bad_input_store_errors()
    if not write_buffer_mb > 0 or not math.isfinite(write_buffer_mb):
        fail("--write-buffer-mb must be a number > 0", EXIT_BAD_INPUT)
    # Paths first: a wrong --summary-json must not turn up only after the import ran.
    if summary_json is not None:
        check_output_file(summary_json, "--summary-json")
    check_store_dir(store)
    opts = ImportOptions(upsert=upsert, append=append, key_offset=key_offset, write_buffer_mb=write_buffer_mb,
                         page_size=page_size, restart=restart)
    progress = task = None
    try:
        source = make_source()
        source.prepare()  # bad input is reported before anything else happens
        total_disk = source.total_disk_bytes()
        total = total_disk if total_disk else source.total_rows()
        progress, task = _progress(not quiet and err_console.is_terminal, total)

        def on_progress(p: dict) -> None:
            if progress is None:
                return
            done = p["disk_done"] if total_disk else p["rows_total"]
            progress.update(task, completed=done, rows=p["rows"], input_bytes=p["input_bytes"],
                            skipped=p["skipped"])

        if progress is not None:
            progress.start()
        try:
            result = run_import(source, str(store), opts, on_progress)
        finally:
            if progress is not None:
                progress.stop()
    except BadInputError as e:
        fail(str(e), EXIT_BAD_INPUT)
    except Interrupted as e:
        r = e.result
        err_console.print(f"[yellow]interrupted[/yellow]: {r.rows_total:,} rows of this import are in the store "
                          f"(durable); run the same command again to resume.", highlight=False)
        _write_summary(summary_json, r, fatal=False)
        raise typer.Exit(EXIT_INTERRUPTED)
    except KeyboardInterrupt:
        err_console.print("[yellow]interrupted[/yellow] before any row was written.")
        raise typer.Exit(EXIT_INTERRUPTED)
    except bad_input_errors as e:
        fail(error_text(e), EXIT_BAD_INPUT)
    except RecflashError as e:
        fail(error_text(e), EXIT_INTERNAL)
    except typer.Exit:
        raise
    except Exception as e:  # an internal failure: say so, with the traceback for a bug report
        traceback.print_exc(file=sys.stderr)
        fail(f"internal error: {type(e).__name__}: {e}", EXIT_INTERNAL)

    for w in result.warnings:
        err_console.print(f"[yellow]warning:[/yellow] {w}", highlight=False, soft_wrap=True)
    if result.status == "already-done":
        console.print(f"nothing to do: this import already completed ({result.rows_total:,} rows, keys "
                      f"{result.key_start:,}..{max(result.key_start, result.key_end - 1):,}) and its input is "
                      f"unchanged; {result.rerun_options} imports it again over the same keys", highlight=False,
                      soft_wrap=True)
        _write_summary(summary_json, result)
        return
    if result.resumed:
        console.print(f"resumed an interrupted import (job {result.job})", highlight=False, soft_wrap=True)
    keys = ""
    if result.key_end > result.key_start:
        keys = f"; keys {result.key_start:,}..{result.key_end - 1:,}"
    rate = f"{result.rows_per_s:,.0f} rows/s"
    if result.input_bytes:
        rate += f", {result.mb_per_s:,.1f} MB/s of text"
    console.print(f"imported {result.rows:,} rows ({result.items:,} items, {len(result.features)} feature{'' if len(result.features) == 1 else 's'}) into "
                  f"{store} in {result.seconds:.1f} s: {rate}{keys}", highlight=False, soft_wrap=True)
    if result.bad_lines_skipped:
        console.print(f"skipped {result.bad_lines_skipped:,} bad line(s):", highlight=False, soft_wrap=True)
        for line in describe_bad_lines(result.bad_line_sample, result.bad_lines_skipped):
            console.print(f"  {line}", highlight=False, markup=False, soft_wrap=True)
    _write_summary(summary_json, result)


def _bad_input_store_errors() -> tuple[type[BaseException], ...]:
    from recflash.reader import errors as e

    return (e.SchemaError, e.FeatureExistsError, e.NotAStoreError, e.StoreLockedError, e.InvalidArgumentError,
            e.UnknownFeatureError, e.ValueTooLargeError)


def _write_summary(path: Optional[Path], result, fatal: bool = True) -> None:
    """Writes the summary; a failure is one error line (exit 2 when ``fatal``: the import's own
    outcome was printed already)."""
    if path is None:
        return
    try:
        path.write_text(json.dumps(jsonable(result.as_dict()), indent=2, sort_keys=True) + "\n")
    except OSError as e:
        message = f"--summary-json {path}: cannot write it ({e.strerror or e}); the import itself is unaffected"
        if fatal:
            fail(message, EXIT_BAD_INPUT)
        err_console.print(f"[bold red]error:[/bold red] [red]{escape(message)}[/red]", highlight=False)


def _block_bytes(block_mb: float) -> int:
    if not block_mb > 0 or not math.isfinite(block_mb):
        fail("--block-mb must be a number > 0", EXIT_BAD_INPUT)
    return max(4096, int(block_mb * (1 << 20)))


# -- the commands ---------------------------------------------------------------------------------


@import_app.command("criteo")
def import_criteo(
    paths: PathsArg,
    store: StoreOpt,
    no_label: Annotated[bool, typer.Option("--no-label", help="39 fields per line (the Kaggle test set).")] = False,
    features: FeaturesOpt = None,
    upsert: UpsertOpt = False,
    append: AppendOpt = False,
    key_offset: KeyOffsetOpt = None,
    on_bad_lines: OnBadOpt = OnBadLines.error,
    write_buffer_mb: WriteBufferOpt = 64.0,
    block_mb: BlockOpt = 16.0,
    page_size: PageSizeOpt = 16384,
    restart: RestartOpt = False,
    quiet: QuietOpt = False,
    summary_json: SummaryOpt = None,
) -> None:
    """Criteo click logs (Kaggle train/test, 1TB day files; plain or .gz/.zst/.bz2/.lz4): label, I1..I13, C1..C26.

    label becomes a float32 feature, I1..I13 int64, C1..C26 int64 (the parsed hex hash).
    \f
    An empty field is an absent key of its feature (the Preprocessor fills it)."""
    from recflash.ingest.sources import CriteoSource

    bb = _block_bytes(block_mb)
    _run(lambda: CriteoSource([str(p) for p in paths], _split(features), on_bad_lines.value, no_label, bb), store,
         upsert=upsert, append=append, key_offset=key_offset, write_buffer_mb=write_buffer_mb, page_size=page_size,
         restart=restart, quiet=quiet, summary_json=summary_json)


@import_app.command("csv")
def import_csv(
    paths: PathsArg,
    store: StoreOpt,
    key: KeyOpt = None,
    features: FeaturesOpt = None,
    delimiter: Annotated[str, typer.Option("--delimiter", help="Field delimiter (one character).")] = ",",
    types: Annotated[Optional[str], typer.Option(
        "--types", help="Column types overriding inference, e.g. 'a=int64,b=float32,c=binary'.",
        show_default=False)] = None,
    upsert: UpsertOpt = False,
    append: AppendOpt = False,
    key_offset: KeyOffsetOpt = None,
    on_bad_lines: OnBadOpt = OnBadLines.error,
    write_buffer_mb: WriteBufferOpt = 64.0,
    block_mb: BlockOpt = 16.0,
    page_size: PageSizeOpt = 16384,
    restart: RestartOpt = False,
    quiet: QuietOpt = False,
    summary_json: SummaryOpt = None,
) -> None:
    """CSV files with a header line (plain or compressed); types inferred from the first MiB.

    Integers become int64, decimals float32, text binary, unless --types says otherwise."""
    from recflash.ingest.errors import BadInputError
    from recflash.ingest.sources import CsvSource

    parsed: dict[str, str] = {}
    for item in _split(types) or []:
        if "=" not in item:
            fail(f"--types: expected name=type, got {item!r}", EXIT_BAD_INPUT)
        n, t = item.split("=", 1)
        parsed[n.strip()] = t.strip()
    bb = _block_bytes(block_mb)
    delim = "\t" if delimiter in ("\\t", "tab") else delimiter

    def make():
        if len(delim) != 1:
            raise BadInputError(f"--delimiter must be one character, got {delimiter!r}")
        return CsvSource([str(p) for p in paths], _split(features), key, on_bad_lines.value, delim, parsed, bb)

    _run(make, store, upsert=upsert, append=append, key_offset=key_offset, write_buffer_mb=write_buffer_mb,
         page_size=page_size, restart=restart, quiet=quiet, summary_json=summary_json)


@import_app.command("parquet")
def import_parquet(
    paths: PathsArg,
    store: StoreOpt,
    key: KeyOpt = None,
    features: FeaturesOpt = None,
    upsert: UpsertOpt = False,
    append: AppendOpt = False,
    key_offset: KeyOffsetOpt = None,
    on_bad_lines: OnBadOpt = OnBadLines.error,
    write_buffer_mb: WriteBufferOpt = 64.0,
    page_size: PageSizeOpt = 16384,
    restart: RestartOpt = False,
    quiet: QuietOpt = False,
    summary_json: SummaryOpt = None,
) -> None:
    """Parquet files, read by record batch. List columns become list features."""
    from recflash.ingest.sources import ParquetSource

    _run(lambda: ParquetSource([str(p) for p in paths], _split(features), key, on_bad_lines.value), store,
         upsert=upsert, append=append, key_offset=key_offset, write_buffer_mb=write_buffer_mb, page_size=page_size,
         restart=restart, quiet=quiet, summary_json=summary_json)


@import_app.command("arrow")
def import_arrow(
    paths: PathsArg,
    store: StoreOpt,
    key: KeyOpt = None,
    features: FeaturesOpt = None,
    upsert: UpsertOpt = False,
    append: AppendOpt = False,
    key_offset: KeyOffsetOpt = None,
    on_bad_lines: OnBadOpt = OnBadLines.error,
    write_buffer_mb: WriteBufferOpt = 64.0,
    page_size: PageSizeOpt = 16384,
    restart: RestartOpt = False,
    quiet: QuietOpt = False,
    summary_json: SummaryOpt = None,
) -> None:
    """Arrow IPC files (file format / Feather v2, or stream format), read by record batch."""
    from recflash.ingest.sources import ArrowSource

    _run(lambda: ArrowSource([str(p) for p in paths], _split(features), key, on_bad_lines.value), store,
         upsert=upsert, append=append, key_offset=key_offset, write_buffer_mb=write_buffer_mb, page_size=page_size,
         restart=restart, quiet=quiet, summary_json=summary_json)


@import_app.command("synthetic")
def import_synthetic(
    store: StoreOpt,
    preset: Annotated[Preset, typer.Option("--preset", help="criteo-kaggle: the Criteo layout with Kaggle's "
                                           "missing rates and cardinalities; zipf: dense, single-id and multi-hot "
                                           "features with Zipf ids.")] = Preset.criteo_kaggle,
    rows: Annotated[int, typer.Option("--rows", "-n", help="Number of rows.")] = 100_000,
    seed: Annotated[int, typer.Option("--seed", help="Random seed.")] = 0,
    alpha: Annotated[float, typer.Option("--alpha", help="Zipf exponent of the categorical ids.")] = 1.05,
    vocab: Annotated[int, typer.Option("--vocab", help="Id vocabulary of the zipf preset.")] = 1_000_000,
    features: FeaturesOpt = None,
    upsert: UpsertOpt = False,
    append: AppendOpt = False,
    key_offset: KeyOffsetOpt = None,
    write_buffer_mb: WriteBufferOpt = 64.0,
    page_size: PageSizeOpt = 16384,
    restart: RestartOpt = False,
    quiet: QuietOpt = False,
    summary_json: SummaryOpt = None,
) -> None:
    """Generated data with Criteo-like schema and value distributions, or Zipf ids."""
    from recflash.ingest.sources import SyntheticSource

    _run(lambda: SyntheticSource(preset.value, rows, seed, alpha, vocab, features=_split(features)), store,
         upsert=upsert, append=append, key_offset=key_offset, write_buffer_mb=write_buffer_mb, page_size=page_size,
         restart=restart, quiet=quiet, summary_json=summary_json)


# -- recflash stats ----------------------------------------------------------------------------------


def _amplification_table(stats: dict[str, Any], reads: Optional[dict[str, dict]]) -> Any:
    t = _table("amplification", show_header=False)
    t.add_column("figure", no_wrap=True)
    t.add_column("value", justify="right", no_wrap=True)
    t.add_column("meaning", style="dim")
    t.add_row("space", ratio(stats.get("space_amplification")), "file bytes in use ÷ live item bytes")
    wa = ratio(stats.get("write_amplification")) if stats.get("user_bytes_written") else "— (nothing written since open)"
    t.add_row("write", wa, "device bytes written ÷ user bytes written")
    if reads:
        br = sum(r["bytes_read"] for r in reads.values())
        ub = sum(r["useful_bytes"] for r in reads.values())
        t.add_row("read (scan of every feature)", ratio(br / ub if ub else None), "bytes read ÷ useful bytes")
    else:
        t.add_row("read", ratio(stats.get("read_amplification")) if stats.get("useful_bytes_read") else
                  "— (use --scan to measure)", "bytes read ÷ useful bytes")
    return t


def _imports_table(jobs: list[dict]) -> Any:
    t = _table("imports", caption="a job that is not done resumes when its command runs again")
    for col in ("job", "command", "status", "rows", "keys", "skipped"):
        t.add_column(col, justify="right" if col in ("rows", "skipped") else "left", no_wrap=True)
    for j in jobs:
        ident = j.get("identity") or {}
        ks, ke = int(j.get("key_start", 0)), int(j.get("next_key", 0))
        t.add_row(str(j.get("job", "?")), str(ident.get("command", "?")), str(j.get("status", "?")),
                  f"{int(j.get('rows', 0)):,}", f"{ks:,}..{ke - 1:,}" if ke > ks else "—",
                  f"{int(j.get('bad_lines_skipped', 0)):,}")
    return t


def _jobs_now(store: Path) -> list[dict]:
    """The store's import journals, ``status`` as it is now (:func:`journal.job_status`: a job
    whose run failed, was interrupted or killed is not shown as running); the journal's own
    value ("running" for every job not done) is kept as ``journal_status``."""
    from recflash.ingest.journal import all_jobs, job_status

    out = []
    for j in all_jobs(str(store)):
        out.append(dict(j, status=job_status(j), journal_status=j.get("status")))
    return out


def stats_command(
    store_arg: Annotated[Optional[Path], typer.Argument(metavar="STORE", help="Store directory.",
                                                        show_default=False)] = None,
    store_opt: Annotated[Optional[Path], typer.Option("--store", "-s", help="Store directory (the same as STORE).",
                                                      show_default=False)] = None,
    as_json: Annotated[bool, typer.Option("--json", help="Print everything as JSON.")] = False,
    plot: Annotated[Optional[Path], typer.Option("--plot", help="Write a PNG: items, pages and fragmentation "
                                                 "per feature.", show_default=False)] = None,
    scan: Annotated[bool, typer.Option("--scan", help="Scan every feature once to measure its read "
                                       "amplification (reads the whole store).")] = False,
    exact: Annotated[bool, typer.Option("--exact", help="Count items exactly when no CHECKPOINT of the "
                                        "current state holds the counts (reads every live page).")] = False,
) -> None:
    """Per-feature items, pages and fragmentation degree, the store's amplifications and its import jobs.

    The store is a positional argument as in ``recflash info STORE``; ``--store`` is an alias."""
    if store_arg is not None and store_opt is not None and store_arg != store_opt:
        fail(f"two stores given: {store_arg} and --store {store_opt}", EXIT_BAD_INPUT)
    store = store_arg if store_arg is not None else store_opt
    if store is None:
        fail("missing the store directory: recflash stats STORE", EXIT_BAD_INPUT)
    if plot is not None:  # before the store is read (a --scan reads all of it)
        _check_plot(plot)

    reads: dict[str, dict] = {}
    with store_errors():
        with open_store(store, read_only=True) as s:
            types = dict(s.features())
            s.build_key_index(read_pages=exact)  # counts from CHECKPOINT, or (--exact) the pages
            if scan:
                for name in types:
                    s.scan(name)
                    reads[name] = dict(s.last_read_stats())
            stats = dict(s.stats())
    jobs = _jobs_now(store)
    if plot is not None:
        _plot(plot, store, types, stats)
    if as_json:
        out = {"store": str(store), "features": {}, "store_stats": stats, "imports": jobs}
        per = stats.get("features") or {}
        for name, t in types.items():
            f = dict(per.get(name) or {})
            f["type"] = t
            if name in reads:
                f["scan"] = reads[name]
            out["features"][name] = f
        print(json.dumps(jsonable(out), indent=2, sort_keys=True))
        return
    page = f", {int(stats['page_size']) // 1024} KiB pages" if stats.get("page_size") else ""
    le = "" if stats.get("items_exact", True) else "≤ "
    console.print(f"[bold]{store}[/bold]: {len(types)} feature(s){page}, "
                  f"{le}{int(stats.get('live_items') or 0):,} items, {human_bytes(stats.get('file_bytes'))} on disk",
                  highlight=False)
    console.print()
    console.print(_features_table(types, stats))
    console.print()
    console.print(_amplification_table(stats, reads))
    console.print()
    console.print(_stats_table(stats))
    if jobs:
        console.print()
        console.print(_imports_table(jobs))
    if plot is not None:
        console.print(f"\nplot written to {plot}", highlight=False)


def _check_plot(path: Path) -> None:
    """--plot's path can be written, matplotlib is there and knows the file type."""
    check_output_file(path, "--plot")
    try:
        from matplotlib.backends.backend_agg import FigureCanvasAgg
    except ImportError:
        fail("--plot needs matplotlib (pip install matplotlib)", EXIT_BAD_INPUT)
    suffix = path.suffix[1:].lower()
    kinds = FigureCanvasAgg.get_supported_filetypes()
    if suffix and suffix not in kinds:
        fail(f"--plot {path}: cannot write .{suffix} files (use one of: {', '.join('.' + k for k in sorted(kinds))})",
             EXIT_BAD_INPUT)


def _plot(path: Path, store: Path, types: dict[str, str], stats: dict[str, Any]) -> None:
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        fail("--plot needs matplotlib (pip install matplotlib)", EXIT_BAD_INPUT)
    per = stats.get("features") or {}
    names = list(types)
    items = [int((per.get(n) or {}).get("items", 0)) for n in names]
    pages = [int((per.get(n) or {}).get("pages", 0)) for n in names]
    frag = [float((per.get(n) or {}).get("fragmentation") or 0.0) for n in names]
    x = range(len(names))
    fig, axes = plt.subplots(2, 1, figsize=(max(8, 0.3 * len(names) + 2), 7), sharex=True)
    ax = axes[0]
    ax.bar([i - 0.2 for i in x], items, width=0.4, label="items")
    ax2 = ax.twinx()
    ax2.bar([i + 0.2 for i in x], pages, width=0.4, color="tab:orange", label="pages")
    ax.set_ylabel("items")
    ax2.set_ylabel("pages")
    ax.set_title(f"{store.name}: space amp {ratio(stats.get('space_amplification'))}, "
                 f"{int(stats.get('live_items') or 0):,} items in {int(stats.get('pages_in_use') or 0):,} pages")
    ax.legend(loc="upper left")
    ax2.legend(loc="upper right")
    ax = axes[1]
    ax.bar(list(x), frag, color="tab:green")
    ax.axhline(1.0, color="grey", lw=0.8)
    ax.set_ylabel("fragmentation degree")
    ax.set_xticks(list(x))
    ax.set_xticklabels(names, rotation=90, fontsize=7)
    fig.tight_layout()
    try:
        fig.savefig(path, dpi=110)
    except (OSError, ValueError) as e:
        fail(f"--plot {path}: cannot write it ({getattr(e, 'strerror', None) or e})", EXIT_BAD_INPUT)
    finally:
        plt.close(fig)
