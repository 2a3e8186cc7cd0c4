"""The ``recflash`` command (console script ``recflash = recflash.cli:app``).

Commands here: ``version``, ``info STORE``. Later command groups (``import``, ``stats``,
``ndp serve``) live beside the code they drive (e.g. ``recflash.ingest.cli``) and are
registered at the bottom of this module with ``app.command()`` / ``app.add_typer()``; they
share :mod:`recflash._cli_util` (``store_errors``, ``open_store``, ``fail``, ``jsonable``).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated, Any

import typer
from rich import box
from rich.table import Table

import recflash
from recflash._cli_util import console, human_bytes, jsonable, open_store, ratio, store_errors

app = typer.Typer(
    name="recflash",
    help="recflash: a feature-arranged SSD store for recommendation data, and near-data "
    "embedding lookups.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)


@app.command()
def version() -> None:
    """Print the recflash version."""
    print(f"recflash {recflash.__version__}")


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


def _features_table(types: dict[str, str], stats: dict[str, Any]) -> Table:
    per_feature = stats.get("features") or {}
    fragmentation = stats.get("fragmentation") or {}
    table = _table(
        "features",
        caption="frag. = fragmentation degree: pages holding the feature ÷ its ideal packed pages",
    )
    table.add_column("feature", no_wrap=True)
    table.add_column("type", no_wrap=True)
    table.add_column("items", justify="right", no_wrap=True)
    table.add_column("pages", justify="right", no_wrap=True)
    table.add_column("valid\nbytes", justify="right", no_wrap=True)
    table.add_column("frag.", justify="right", no_wrap=True)
    for name in sorted(set(types) | set(per_feature)):
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
    for key, label, fmt in _INFO_FIGURES:
        value = stats.get(key)
        text = "—" if value is None else fmt(value)
        if key == "write_amplification" and not stats.get("user_bytes_written"):
            text = "— (nothing written since open)"
        table.add_row(label, text)
    return table


@app.command()
def info(
    store: Annotated[Path, typer.Argument(help="Path of the store directory.", show_default=False)],
    as_json: Annotated[bool, typer.Option("--json", help="Print the stats() dict as JSON.")] = False,
) -> None:
    """Show a store's features and its key figures (pages, amplification, metadata size)."""
    with store_errors():
        with open_store(store, read_only=True) as s:
            types = dict(s.features())
            stats = dict(s.stats())
    if as_json:
        print(json.dumps(jsonable(stats), indent=2, sort_keys=True))
        return
    page = f", {int(stats['page_size']) // 1024} KiB pages" if stats.get("page_size") else ""
    console.print(f"[bold]{store}[/bold]: {len(types)} feature(s){page}", highlight=False)
    console.print()
    console.print(_features_table(types, stats))
    console.print()
    console.print(_stats_table(stats))


# Command groups added later register here, e.g.:
#   from recflash.ingest.cli import import_command; app.command("import")(import_command)
#   from recflash.ndp.cli import ndp_app; app.add_typer(ndp_app, name="ndp")

if __name__ == "__main__":  # pragma: no cover
    app()
