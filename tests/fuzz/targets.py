"""Fuzz targets of recflash's parsers and decoders (atheris, coverage-guided).

Each target is a function of one input (bytes). It must return normally — the input was
accepted, or it was refused with the clear error that kind of input gets (CorruptionError for
a damaged store file, BadInputError for bad import input, ...). Anything else — another
exception, a crash, a sanitizer report, a hang — is a finding; atheris stops and writes the
input out. Every finding becomes a regression input in corpus/<target>/ (run by
tests/test_fuzz.py).

Targets:
  page_raw         a page's bytes as stored (checksum as found): PageView::Parse
  page_fixed       the same with a valid checksum and id stamped, so the checks behind the
                   checksum (version, directory and segment bounds) are reached
  wal_file         a WAL file's bytes: record framing, length and checksum (ReadWalFile)
  store_wal        a store whose WAL holds fuzzed records with valid checksums: replay through
                   Store.open (record decoding), then a scan of every feature
  store_checkpoint a store whose CHECKPOINT is replaced by fuzzed bytes with a valid trailing
                   checksum: a read-only scan, then a writer's open, must rebuild or use it, and
                   every value read must be right
  block_sums       the block-checksum file (BLOCKSUMS), as found and with a valid checksum
  meta_values      RocksDB metadata values (feature, page and state records) overwritten
                   with fuzzed bytes: Store.open and a scan
  criteo           the native Criteo TSV block parser (has_label both ways), fast path = reference
  hex_ids          hex id strings through ingest.hexids.parse_hex_column (native fast path)
  csv_import       a CSV file through the importer's CsvSource (pyarrow's errors must become
                   BadInputError)
  parquet_import   a Parquet file's bytes through ParquetSource
"""

from __future__ import annotations

import os
import shutil
import struct
import tempfile
from typing import Callable

import numpy as np

_WORK = None


def _work() -> str:
    global _WORK
    if _WORK is None:
        base = "/dev/shm" if os.path.isdir("/dev/shm") and os.access("/dev/shm", os.W_OK) else None
        _WORK = tempfile.mkdtemp(prefix="recflash-fuzz-", dir=base)
    return _WORK


def _testing():
    from recflash.reader import testing

    return testing


# -- pages ---------------------------------------------------------------------------------------

def _page_check(data: bytes, fix: bool) -> None:
    t = _testing()
    try:
        t._t.decode_page(data, 4096, 3, fix)
    except RuntimeError as e:
        if not str(e).startswith("Corruption: page 3 of 'fuzz'"):
            raise


def page_raw(data: bytes) -> None:
    _page_check(data, False)


def page_fixed(data: bytes) -> None:
    _page_check(data, True)


# -- WAL -------------------------------------------------------------------------------------------

def _frame(records: list[tuple[int, bytes]]) -> bytes:
    t = _testing()
    out = bytearray()
    for typ, payload in records:
        crc = t.crc32c(bytes([typ]) + payload)
        out += struct.pack("<IIB", crc, len(payload), typ) + payload
    return bytes(out)


def _split_records(data: bytes) -> list[tuple[int, bytes]]:
    """Fuzzed bytes -> records: [type byte, u16 length, payload]..."""
    recs, i = [], 0
    while i + 3 <= len(data):
        typ = data[i]
        n = int.from_bytes(data[i + 1:i + 3], "little")
        recs.append((typ % 3, data[i + 3:i + 3 + n]))
        i += 3 + n
    return recs


def wal_file(data: bytes) -> None:
    t = _testing()
    path = os.path.join(_work(), "fuzz.log")
    with open(path, "wb") as f:
        f.write(data)
    t._t.read_wal(path)  # never raises: damage ends replay (a torn tail)
    # framed with valid checksums, records come back exactly
    recs = _split_records(data)
    with open(path, "wb") as f:
        f.write(_frame(recs))
    got = t._t.read_wal(path)
    assert [(a, bytes(b)) for a, b in got] == recs, "WAL records did not round-trip"


# -- whole stores ----------------------------------------------------------------------------------

FEATURES = {"i": "int64", "b": "binary", "e": "fixed_size_list<float32, 4>"}
_TEMPLATES: dict[str, str] = {}
_EXPECTED: dict[str, dict] = {}


def _opts():
    from recflash.reader import StoreOptions

    return StoreOptions(page_size=4096, write_buffer_bytes=64 << 10)


def _template(kind: str) -> str:
    """A small closed store: 'clean' (closed, CHECKPOINT present) or 'wal' (items only in the WAL)."""
    if kind in _TEMPLATES:
        return _TEMPLATES[kind]
    from recflash.reader import Store

    path = os.path.join(_work(), f"template-{kind}")
    s = Store.open(path, _opts())
    for f, ty in FEATURES.items():
        s.create_feature(f, ty)
    k = np.arange(0, 600, 3, dtype=np.uint64)
    s.put("i", k, (k * 7).astype(np.int64))
    s.put("b", k, [b"v%d" % x for x in k.tolist()])
    s.put("e", k, np.repeat(k.astype(np.float32)[:, None], 4, axis=1))
    s.flush()
    s.delete("i", k[::5])
    s.put("i", k[1::7], (k[1::7] * 11).astype(np.int64))
    s.close()
    if kind == "wal":
        os.unlink(os.path.join(path, "CHECKPOINT"))
    _TEMPLATES[kind] = path
    with Store.open(path, _opts(), ) as s2:
        _EXPECTED[kind] = {f: s2.scan(f).to_pydict() for f in FEATURES}
    if kind == "clean":  # the reopen consumed the checkpoint: write it again
        pass
    return path


def _fresh_copy(kind: str) -> str:
    src = _template(kind)
    if kind == "clean" and not os.path.exists(os.path.join(src, "CHECKPOINT")):
        from recflash.reader import Store

        Store.open(src, _opts()).close()  # writes a checkpoint again
    dst = os.path.join(_work(), "case")
    shutil.rmtree(dst, ignore_errors=True)
    shutil.copytree(src, dst)
    return dst


def _open_scan(path: str, expect: dict | None, read_only: bool = False) -> None:
    from recflash.reader import CorruptionError, Store, StoreOptions

    opts = StoreOptions(read_only=True) if read_only else _opts()
    try:
        with Store.open(path, opts) as s:
            got = {f: s.scan(f).to_pydict() for f in FEATURES}
    except CorruptionError:
        return
    if expect is not None:
        for f in FEATURES:
            assert got[f] == expect[f], f"feature {f}: values differ from the store's (silently wrong)"


def store_wal(data: bytes) -> None:
    path = _fresh_copy("clean")
    wal_dir = os.path.join(path, "wal")
    nums = sorted(int(n[:-4]) for n in os.listdir(wal_dir) if n.endswith(".log")) or [1]
    recs = [(1, p) for _, p in _split_records(data)]
    with open(os.path.join(wal_dir, f"{nums[-1] + 1:06d}.log"), "wb") as f:
        f.write(_frame(recs))
    _open_scan(path, None)


def store_checkpoint(data: bytes) -> None:
    t = _testing()
    path = _fresh_copy("clean")
    ck = os.path.join(path, "CHECKPOINT")
    orig = open(ck, "rb").read()
    # splice the fuzz bytes (after a u16 offset) into the real checkpoint body, fix the crc
    body = orig[:-4]
    if len(data) >= 2:
        at = int.from_bytes(data[:2], "little") % (len(body) + 1)
        body = body[:at] + data[2:] + body[at + len(data) - 2:]
    with open(ck, "wb") as f:
        f.write(body + struct.pack("<I", t.crc32c(body)))
    _template("clean")
    # A read-only handle first: its scan of the overlapping feature "i" swaps in the
    # checkpoint's key indexes when the header names its snapshot, and leaves the file alone.
    _open_scan(path, _EXPECTED["clean"], read_only=True)
    _open_scan(path, _EXPECTED["clean"])


def block_sums(data: bytes) -> None:
    t = _testing()
    path = os.path.join(_work(), "BLOCKSUMS")
    with open(path, "wb") as f:
        f.write(data)
    t._t.load_block_sums(path, 4096, 512)
    with open(path, "wb") as f:
        f.write(data + struct.pack("<I", t.crc32c(data)))
    t._t.load_block_sums(path, 4096, 512)


def meta_values(data: bytes) -> None:
    from recflash.reader import RecflashError

    t = _testing()
    path = _fresh_copy("clean")
    if len(data) < 2:
        return
    which = data[0] % 3
    try:
        t._t.meta_put(os.path.join(path, "meta"), which, data[1], data[2:])
    except RuntimeError:
        return  # no such record in the template
    from recflash.reader import Store

    try:
        with Store.open(path, _opts()) as s:
            for f in FEATURES:
                s.scan(f)
    except RecflashError:
        pass  # refused with a store error (names what and where)


# -- import parsers --------------------------------------------------------------------------------

def criteo(data: bytes) -> None:
    from recflash import _native

    # The fast path (64-byte windows, SWAR fields) must refuse exactly what the byte-at-a-time
    # reference refuses and give the same columns for the rest.
    for has_label in (True, False):
        fast = _native.parse_criteo_block(data, has_label)
        ref = _native.parse_criteo_block(data, has_label, scalar=True)
        assert (fast is None) == (ref is None), "fast and reference parsers disagree on refusing the block"
        if fast is not None:
            assert fast[0] == ref[0]
            for (v1, p1), (v2, p2) in zip(fast[1], ref[1]):
                assert v1.dtype == v2.dtype and np.array_equal(v1, v2)
                assert (p1 is None) == (p2 is None) and (p1 is None or np.array_equal(p1, p2))


def hex_ids(data: bytes) -> None:
    import pyarrow as pa

    from recflash.ingest.hexids import parse_hex_column

    parts = data.split(b"\n")
    arr = pa.array([None if p == b"~" else p.decode("latin-1") for p in parts], pa.string())
    vals, valid, bad = parse_hex_column(arr)
    assert len(vals) == (len(parts) if valid is None else int(np.count_nonzero(valid)))
    if len(arr) > 1:
        parse_hex_column(arr.slice(1))


def _source_check(make) -> None:
    from recflash.ingest.errors import BadInputError

    try:
        src = make()
        src.prepare()
        for chunk in src.chunks(None):
            assert chunk.n_rows >= 0
    except BadInputError:
        pass


def csv_import(data: bytes) -> None:
    from recflash.ingest.sources import CsvSource

    path = os.path.join(_work(), "in.csv")
    with open(path, "wb") as f:
        f.write(data)
    _source_check(lambda: CsvSource([path], on_bad_lines="skip" if data[:1] == b"s" else "error"))


def parquet_import(data: bytes) -> None:
    from recflash.ingest.sources import ParquetSource

    path = os.path.join(_work(), "in.parquet")
    with open(path, "wb") as f:
        f.write(data)
    _source_check(lambda: ParquetSource([path]))


TARGETS: dict[str, Callable[[bytes], None]] = {
    "page_raw": page_raw,
    "page_fixed": page_fixed,
    "wal_file": wal_file,
    "store_wal": store_wal,
    "store_checkpoint": store_checkpoint,
    "block_sums": block_sums,
    "meta_values": meta_values,
    "criteo": criteo,
    "hex_ids": hex_ids,
    "csv_import": csv_import,
    "parquet_import": parquet_import,
}
