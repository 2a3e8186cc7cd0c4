"""The ``recflash`` command (console script ``recflash = recflash.cli:app``).

Commands here: ``version``, ``info STORE``. Command groups that live beside the code they
drive are registered at the bottom of this module: ``import`` and ``stats``
(:mod:`recflash.ingest.cli`); ``ndp serve`` / ``ndp status`` (:mod:`recflash.ndp.cli`). They share
:mod:`recflash.reader._cli` (``store_errors``, ``open_store``, ``fail``, ``jsonable``, tables).
"""

from __future__ import annotations

import os

# The command does no linear algebra; OpenBLAS's idle worker threads would still spin for CPU
# time that the import's parse and store threads need (set before numpy is first imported).
os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")

import json  # noqa: E402
from pathlib import Path
from typing import Annotated, Any

import typer
import recflash
from recflash.reader._cli import (  # noqa: F401  (the table helpers are re-exported for callers)
    _INFO_FIGURES,
    _features_table,
    _stats_table,
    _table,
    console,
    jsonable,
    open_store,
    store_errors,
)

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


@app.command()
def info(
    store: Annotated[Path, typer.Argument(help="Path of the store directory.", show_default=False)],
    as_json: Annotated[bool, typer.Option("--json", help="Print the stats() dict as JSON.")] = False,
    exact: Annotated[bool, typer.Option("--exact", help="Count items exactly when no CHECKPOINT of the "
                                        "current state holds the counts (reads every live page).")] = False,
) -> None:
    """Show a store's features and its key figures (pages, amplification, metadata size).

    Item counts come from the CHECKPOINT a clean close writes; without one of the current
    state they are upper bounds (marked ≤) unless --exact."""
    with store_errors():
        with open_store(store, read_only=True) as s:
            types = dict(s.features())
            s.build_key_index(read_pages=exact)
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


# Command groups that live beside the code they drive.
from recflash.ingest.cli import import_app, stats_command  # noqa: E402

app.add_typer(import_app, name="import")
app.command("stats")(stats_command)

from recflash.ndp.cli import ndp_app  # noqa: E402

app.add_typer(ndp_app, name="ndp")

if __name__ == "__main__":  # pragma: no cover
    app()
