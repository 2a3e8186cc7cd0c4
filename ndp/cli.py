"""``recflash ndp``: the device server and its status.

    recflash ndp serve --store DIR [--listen unix:PATH | HOST:PORT] [--token-file F] [--threads N]
    recflash ndp status ADDRESS [--token-file F | --token T] [--tls-ca CA.pem] [--json]
"""

from __future__ import annotations

import json
import math
import os
import signal
import sys
import threading
from pathlib import Path
from typing import Annotated, Optional

import typer

from recflash.reader._cli import _table as _titled_table, console, fail, jsonable, store_errors

ndp_app = typer.Typer(name="ndp", help="Near-data processing: serve a store's tables and models to hosts.",
                      no_args_is_help=True, add_completion=False, pretty_exceptions_enable=False)

MB = 1 << 20


def _table(title: str, columns, rows):
    t = _titled_table(title)
    for i, c in enumerate(columns):
        t.add_column(c, justify="left" if i == 0 else "right", no_wrap=True)
    for r in rows:
        t.add_row(*r)
    return t


@ndp_app.command("serve")
def serve(
    store: Annotated[Path, typer.Option("--store", help="Store directory holding the embedding tables.")],
    listen: Annotated[Optional[str], typer.Option(
        "--listen", help="unix:PATH or HOST:PORT (port 0: any free port). Default: a Unix socket in a private "
        "per-user directory. TCP needs --token-file.")] = None,
    token_file: Annotated[Optional[Path], typer.Option(
        "--token-file", help="File of 'read TOKEN' / 'write TOKEN' lines (mode 600).")] = None,
    threads: Annotated[int, typer.Option("--threads", help="Request worker threads.")] = 8,
    tls_cert: Annotated[Optional[Path], typer.Option("--tls-cert", help="PEM certificate (with --tls-key).")] = None,
    tls_key: Annotated[Optional[Path], typer.Option("--tls-key", help="PEM private key.")] = None,
    max_message_mb: Annotated[float, typer.Option("--max-message-mb", help="Largest request or response.")] = 64,
    page_granular: Annotated[bool, typer.Option("--page-granular", help="Read whole pages instead of 512 B blocks.")] = False,
    dense_page_rows: Annotated[Optional[int], typer.Option(
        "--dense-page-rows", help="With block reads: a page from which one call needs at least this many rows is read "
        "whole, in runs with its touched neighbours (0: blocks only). Default: the engine's, 2.")] = None,
    row_cache_mb: Annotated[float, typer.Option("--row-cache-mb", help="LRU row cache.")] = 0,
    hot_rows_mb: Annotated[float, typer.Option(
        "--hot-rows-mb", help="Static hot-row partition: filled once with the most frequent rows among the first "
        "--hot-rows-profile-ids looked-up ids (that lookup also reads them), then kept (updates stay coherent).")] = 0,
    hot_rows_profile_ids: Annotated[int, typer.Option(
        "--hot-rows-profile-ids", help="Looked-up ids counted before the hot-row partition is filled.")] = 100_000,
    pooled_cache_mb: Annotated[float, typer.Option("--pooled-cache-mb", help="Pooled-embedding cache.")] = 0,
    pooled_min_bag: Annotated[int, typer.Option("--pooled-min-bag", help="Smallest bag the pooled cache keeps.")] = 8,
    device_cache_mb: Annotated[float, typer.Option("--device-cache-mb", help="Store-side row cache.")] = 0,
    grace: Annotated[float, typer.Option("--grace", help="Seconds in-flight requests get on SIGTERM/SIGINT.")] = 10,
) -> None:
    """Serve a store: one process owns it (the only writer) and runs SLS, MLPs and whole models."""
    import logging

    sizes = {"--max-message-mb": max_message_mb, "--row-cache-mb": row_cache_mb, "--hot-rows-mb": hot_rows_mb,
             "--pooled-cache-mb": pooled_cache_mb, "--device-cache-mb": device_cache_mb, "--grace": grace}
    for flag, v in sizes.items():
        if not math.isfinite(v) or v < 0:
            fail(f"{flag} must be >= 0, got {v:g}")
        if v * MB >= 2 ** 62:
            fail(f"{flag} {v:g} is too large")
    if max_message_mb * MB < 1024:
        fail(f"--max-message-mb must be at least 1 KiB (0.001), got {max_message_mb:g}")
    if threads < 1 or threads > 4096:
        fail(f"--threads must be between 1 and 4096, got {threads}")
    if pooled_min_bag < 0 or pooled_min_bag >= 2 ** 32:
        fail(f"--pooled-min-bag must be >= 0, got {pooled_min_bag}")
    if dense_page_rows is not None and not 0 <= dense_page_rows < 2 ** 32:
        fail(f"--dense-page-rows must be >= 0, got {dense_page_rows}")
    if hot_rows_profile_ids < 0:
        fail(f"--hot-rows-profile-ids must be >= 0, got {hot_rows_profile_ids}")
    if hot_rows_profile_ids == 0 and hot_rows_mb > 0:
        fail("--hot-rows-profile-ids 0 would leave the --hot-rows-mb partition empty: the server fills it from "
             "the ids it serves")
    logging.basicConfig(level=logging.WARNING, format="%(asctime)s %(name)s %(levelname)s %(message)s")
    with store_errors():
        from recflash.ndp.server import NdpServer

        srv = NdpServer(str(store), listen, token_file=str(token_file) if token_file else None, threads=threads,
                        max_message_bytes=int(max_message_mb * MB), tls_cert=str(tls_cert) if tls_cert else None,
                        tls_key=str(tls_key) if tls_key else None, vector_grained=not page_granular,
                        row_cache_bytes=int(row_cache_mb * MB), hot_rows_bytes=int(hot_rows_mb * MB),
                        pooled_cache_bytes=int(pooled_cache_mb * MB), pooled_min_bag=pooled_min_bag,
                        device_cache_bytes=int(device_cache_mb * MB), hot_rows_profile_ids=hot_rows_profile_ids,
                        dense_page_rows=dense_page_rows)
    stop = threading.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: stop.set())
    srv.start()
    tables = srv.device.tables.tables()
    print(f"recflash ndp: serving {store} ({len(tables)} table(s)) on {srv.address}", flush=True)
    while not stop.wait(1.0):
        pass
    print("recflash ndp: stopping (in-flight requests finish)", file=sys.stderr, flush=True)
    srv.stop(grace)
    print("recflash ndp: store closed", file=sys.stderr, flush=True)


@ndp_app.command("status")
def status(
    address: Annotated[str, typer.Argument(help="unix:PATH or HOST:PORT of a running server.", show_default=False)],
    token_file: Annotated[Optional[Path], typer.Option("--token-file", help="Read the first token from this file.")] = None,
    token: Annotated[Optional[str], typer.Option("--token", envvar="RECFLASH_NDP_TOKEN", help="Bearer token.")] = None,
    timeout: Annotated[float, typer.Option("--timeout", help="Deadline, seconds.")] = 10,
    tls_ca: Annotated[Optional[Path], typer.Option(
        "--tls-ca", help="PEM file of the CA that signed the server's certificate (a server run with --tls-cert).")] = None,
    tls_server_name: Annotated[Optional[str], typer.Option(
        "--tls-server-name", help="Name to check the server's certificate against, when it differs from the address's host.")] = None,
    as_json: Annotated[bool, typer.Option("--json", help="Print the Stats answer as JSON.")] = False,
) -> None:
    """Print a server's tables, models and per-command counters."""
    from recflash.ndp.client import DeviceClient

    if not math.isfinite(timeout) or timeout <= 0:
        fail(f"--timeout must be > 0 seconds, got {timeout:g}")
    if tls_server_name and not tls_ca:
        fail("--tls-server-name needs --tls-ca")

    if token_file and not token:
        try:
            lines = [ln.split() for ln in token_file.read_text().splitlines() if ln.strip() and not ln.startswith("#")]
        except OSError as e:
            fail(f"token file '{token_file}': {e.strerror}")
        token = lines[0][-1] if lines else None
    with store_errors():
        with DeviceClient(address, token, timeout=timeout, tls_ca=str(tls_ca) if tls_ca else None,
                          tls_server_name=tls_server_name) as c:
            st = c.stats()
    if as_json:
        print(json.dumps(jsonable(st), indent=2, sort_keys=True))
        return
    console.print(f"[bold]{address}[/bold]: {st['protocol']} (recflash {st['version']}), store {st['store']}, "
                  f"up {st['uptime_s']:.0f} s", highlight=False)
    console.print(_table("tables", ["table", "rows", "dim", "dtype"],
                         [[k, f"{v['num_rows']:,}", str(v['dim']), v['dtype']] for k, v in st["tables"].items()]))
    if st["models"]:
        console.print(_table("models", ["model", "features", "parameters"],
                             [[k, str(sum(len(t["feature_names"]) for t in v["config"]["tables"])), f"{v['parameters']:,}"]
                              for k, v in st["models"].items()]))
    console.print(_table("traffic (serialized message bytes)", ["command", "calls", "errors", "bytes to device", "bytes to host", "seconds"],
                         [[k, f"{v['calls']:,}", f"{v['errors']:,}", f"{v['bytes_to_device']:,}",
                           f"{v['bytes_to_host']:,}", f"{v['seconds']:.3f}"] for k, v in st["traffic"].items()]))
