"""Helpers shared by the ``recflash`` command groups (the store is the layer every command group
sits on, so they live here): error reporting, opening a store, JSON.

Every command that touches a store runs inside :func:`store_errors`, so a store error becomes
one red line on stderr and exit code 2, never a traceback.
"""

from __future__ import annotations

import math
import os
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any, NoReturn

import typer
from rich import box
from rich.console import Console
from rich.markup import escape
from rich.table import Table

console = Console()
err_console = Console(stderr=True, soft_wrap=True)

# One exit-code policy for every command (the top commands, ``import``, ``stats``, ``ndp``):
EXIT_OK = 0
EXIT_INTERNAL = 1     # the engine could not be imported, or an unexpected error (a bug: report it)
EXIT_BAD_INPUT = 2    # a store error (RecflashError), a path that is not a store, bad input or options
EXIT_INTERRUPTED = 130  # Ctrl-C (an import resumes when the same command runs again)
EXIT_STORE_ERROR = EXIT_BAD_INPUT
EXIT_UNAVAILABLE = EXIT_INTERNAL


def fail(message: str, code: int = EXIT_STORE_ERROR) -> NoReturn:
    """Print ``error: message`` in red on one line and exit with ``code``."""
    one_line = " ".join(str(message).split())
    err_console.print(f"[bold red]error:[/bold red] [red]{escape(one_line)}[/red]", highlight=False)
    raise typer.Exit(code)


def _reader_errors() -> type[BaseException]:
    try:
        from recflash.reader.errors import RecflashError
    except ImportError as e:  # the native module is missing or was built for another Python
        fail(f"the recflash engine is not importable ({e}); run `make build`", EXIT_UNAVAILABLE)
    return RecflashError


def error_text(e: BaseException) -> str:
    """``ClassName: message`` for an error, without the trailing underscore of the engine's
    ``IOError_`` (named so as not to shadow the builtin)."""
    return f"{type(e).__name__.rstrip('_')}: {e}"


@contextmanager
def store_errors() -> Iterator[None]:
    """Turn a RecflashError raised inside the block into a one-line message and exit code 2."""
    recflash_error = _reader_errors()
    try:
        yield
    except recflash_error as e:
        fail(error_text(e))


def check_output_file(path: Path, option: str) -> None:
    """Exit 2 with a message naming ``option`` unless a file can be written at ``path``: it is
    not a directory and its directory exists and is writable. Called before a command does any
    work, so a wrong output path does not cost (or, for an import, follow) the work."""
    if os.path.isdir(path):
        fail(f"{option} {path}: is a directory, not a file", EXIT_BAD_INPUT)
    parent = path.parent
    if not os.path.exists(parent):
        fail(f"{option} {path}: the directory {parent} does not exist", EXIT_BAD_INPUT)
    if not os.path.isdir(parent):
        fail(f"{option} {path}: {parent} is not a directory", EXIT_BAD_INPUT)
    if not os.access(parent, os.W_OK | os.X_OK):
        fail(f"{option} {path}: the directory {parent} is not writable", EXIT_BAD_INPUT)
    if os.path.exists(path) and not os.access(path, os.W_OK):
        fail(f"{option} {path}: the file is not writable", EXIT_BAD_INPUT)


def check_store_dir(path: Path, option: str = "--store") -> None:
    """Exit 2 unless ``path`` is a directory or can be created as one: the nearest existing
    ancestor must be a writable directory (a path under a regular file cannot be a store)."""
    if os.path.exists(path):
        if not os.path.isdir(path):
            fail(f"{option} {path}: exists and is not a directory", EXIT_BAD_INPUT)
        return
    ancestor = path.absolute().parent
    while not os.path.exists(ancestor) and ancestor != ancestor.parent:
        ancestor = ancestor.parent
    if not os.path.isdir(ancestor):
        fail(f"{option} {path}: cannot create the store directory: {ancestor} is not a directory",
             EXIT_BAD_INPUT)
    if not os.access(ancestor, os.W_OK | os.X_OK):
        fail(f"{option} {path}: cannot create the store directory: {ancestor} is not writable",
             EXIT_BAD_INPUT)


def open_store(path: Path, *, read_only: bool = True, create: bool = False) -> Any:
    """Open the store at ``path``.

    With ``create=False`` the path must already be a store (it has the ``RECFLASH`` marker):
    inspecting a wrong path must not create a store there. ``read_only`` is used when the
    engine's StoreOptions offers it; otherwise the store is opened normally.
    """
    _reader_errors()
    try:
        from recflash.reader import Store, StoreOptions
        from recflash.reader.store import FILE_NAMES
    except ImportError as e:
        fail(f"the recflash engine is not importable ({e}); run `make build`", EXIT_UNAVAILABLE)
    if not create:
        if not path.exists():
            fail(f"no store at {path}")
        marker = FILE_NAMES["marker"]
        if not path.is_dir() or not (path / marker).exists():
            fail(f"{path} is not a recflash store (no {marker} marker)")
    options = StoreOptions()
    if read_only and hasattr(options, "read_only"):
        try:
            options.read_only = True
        except (AttributeError, TypeError):  # frozen options object
            options = StoreOptions(read_only=True)
    return Store.open(str(path), options)


def jsonable(value: Any) -> Any:
    """Plain JSON data from a stats dict: numpy scalars unwrapped, NaN/inf as null."""
    if isinstance(value, dict):
        return {str(k): jsonable(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [jsonable(v) for v in value]
    if hasattr(value, "item") and callable(value.item) and getattr(value, "ndim", 1) == 0:
        value = value.item()  # numpy scalar
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if value is None or isinstance(value, (bool, int, float, str)):
        return value
    return str(value)


def human_bytes(n: float | int | None) -> str:
    if n is None:
        return "—"
    n = float(n)
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if abs(n) < 1024 or unit == "TiB":
            return f"{n:,.0f} {unit}" if unit == "B" else f"{n:,.2f} {unit}"
        n /= 1024
    return f"{n:.2f} TiB"  # unreachable


def ratio(x: float | int | None, digits: int = 2) -> str:
    if x is None:
        return "—"
    x = float(x)
    return f"{x:.{digits}f}" if math.isfinite(x) else "—"


# ---------------------------------------------------------------------------------------------
# tables shared by `recflash info` and `recflash stats`

# (stats key, label, formatter)
_INFO_FIGURES: list[tuple[str, str, Any]] = [
    ("pages_in_use", "pages in use", lambda v: f"{int(v):,}"),
    ("file_bytes", "file bytes", human_bytes),
    ("live_items", "live items", lambda v: f"{int(v):,}"),
    ("live_item_bytes", "live item bytes", human_bytes),
    ("space_amplification", "space amplification", ratio),
    ("write_amplification", "write amplification", ratio),
    ("metadata_dram_bytes_per_item", "metadata DRAM bytes / item", ratio),
    ("disk_bytes_per_item", "disk bytes / item", ratio),
]


def _table(title: str, **kw: Any) -> Table:
    return Table(title=title, title_justify="left", caption_justify="left", box=box.SIMPLE_HEAD,
                 show_edge=False, pad_edge=False, **kw)


UPPER_BOUNDS_NOTE = ("≤ / ≥: bounds. This read-only open counts records that later updates replaced but "
                     "no merge has dropped yet (no CHECKPOINT of this state to count from), so items "
                     "and bytes are upper bounds and frag. a lower bound; --exact reads the pages to "
                     "count exactly.")


def counts_exact(stats: dict[str, Any]) -> bool:
    """Whether stats()'s item counts are exact (older engines: assume so)."""
    return bool(stats.get("items_exact", True))


def _features_table(types: dict[str, str], stats: dict[str, Any]) -> Table:
    per_feature = stats.get("features") or {}
    fragmentation = stats.get("fragmentation") or {}
    exact = counts_exact(stats)
    caption = "frag. = fragmentation degree: pages holding the feature ÷ its ideal packed pages"
    table = _table("features", caption=caption if exact else caption + "\n" + UPPER_BOUNDS_NOTE)
    table.add_column("feature", no_wrap=True)
    table.add_column("type", no_wrap=True)
    table.add_column("items" if exact else "items ≤", justify="right", no_wrap=True)
    table.add_column("pages", justify="right", no_wrap=True)
    table.add_column("valid\nbytes", justify="right", no_wrap=True)
    table.add_column("frag." if exact else "frag. ≥", justify="right", no_wrap=True)
    for name in [*types, *sorted(n for n in per_feature if n not in types)]:  # creation order
        f = per_feature.get(name) or {}
        frag = f.get("fragmentation", fragmentation.get(name))
        table.add_row(
            name,
            types.get(name, "?"),
            f"{int(f['items']):,}" if "items" in f else "—",
            f"{int(f['pages']):,}" if "pages" in f else "—",
            human_bytes(f.get("valid_bytes")),
            ratio(frag),
        )
    return table


def _stats_table(stats: dict[str, Any]) -> Table:
    table = _table("store", show_header=False)
    table.add_column("figure", no_wrap=True)
    table.add_column("value", justify="right", no_wrap=True)
    bounded = {"live_items", "live_item_bytes"} if not counts_exact(stats) else set()
    for key, label, fmt in _INFO_FIGURES:
        value = stats.get(key)
        text = "—" if value is None else fmt(value)
        if key in bounded and value is not None:
            text = "≤ " + text
        if key == "write_amplification" and not stats.get("user_bytes_written"):
            text = "— (nothing written since open)"
        table.add_row(label, text)
    if stats.get("buffered_items"):
        # Puts and deletes replayed from the WAL (an unclean shutdown) are in no page yet: the
        # item counts above are of the pages, and a scan applies these on top.
        table.add_row("buffered writes (WAL, not flushed)",
                      f"{int(stats['buffered_items']):,} — not in the item counts above")
    return table
