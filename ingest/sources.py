"""Input sources of ``recflash import``: Criteo TSV, CSV, Parquet, Arrow IPC, synthetic.

A source validates its inputs up front (:meth:`Source.prepare`: files readable, schema
right, types storable — before the store is touched) and then yields :class:`Chunk`\\ s:
the present values of every feature for a run of rows, plus the position to resume from
after that chunk. Sources hold at most one block / record batch at a time, so memory does not
grow with the input.
"""

from __future__ import annotations

import dataclasses
import math
import os
from collections.abc import Iterator
from typing import Any, Callable, Optional

import numpy as np
import pyarrow as pa
import pyarrow.csv as pcsv

from recflash.ingest import criteo, synthetic
from recflash.ingest.convert import BadRows, Column, key_column, store_type, to_column
from recflash.ingest.errors import BadInputError, BadLine
from recflash.ingest.journal import file_identity
from recflash.ingest.text import ParsedBlock, TextFile, TextFormat, TextParser, count_fields, read_header

try:
    from recflash._native import parse_criteo_block as _parse_criteo_block
except ImportError:  # pragma: no cover - pyarrow parses every block
    _parse_criteo_block = None

DEFAULT_BLOCK_BYTES = 16 << 20
DEFAULT_BATCH_ROWS = 65536


@dataclasses.dataclass
class Chunk:
    n_rows: int  # rows to write (bad rows already removed)
    columns: dict[str, Column]
    keys: Optional[np.ndarray]  # from --key; None: row numbers assigned by the importer
    position: dict  # where to resume after this chunk
    file_index: int
    input_bytes: int  # uncompressed input bytes consumed by this chunk (text formats; 0 otherwise)
    disk_done: int  # on-disk input bytes consumed so far over all files (progress, ETA)
    rows_read: int  # input rows consumed by this chunk, bad ones included
    skipped: list[BadLine] = dataclasses.field(default_factory=list)
    where: str = ""  # the chunk's place in the input, for messages: "file: lines a..b"


class Source:
    command = ""
    # Set by the importer once the store is open: a value longer than this (bytes) does not fit
    # in a page, and the conversion reports its row as a bad line (None: not checked).
    max_value_bytes: Optional[int] = None

    def __init__(self, paths: list[str], features: Optional[list[str]] = None, key: Optional[str] = None,
                 on_bad_lines: str = "error"):
        self.paths = [os.path.abspath(p) for p in paths]
        self.requested = list(features) if features else None
        self.key = key
        self.on_bad_lines = on_bad_lines
        self.schema: dict[str, str] = {}

    # -- to implement ------------------------------------------------------------------------
    def _prepare(self) -> dict[str, str]:
        raise NotImplementedError

    def chunks(self, position: Optional[dict]) -> Iterator[Chunk]:
        raise NotImplementedError

    # -- common ---------------------------------------------------------------------------------
    def prepare(self) -> dict[str, str]:
        """Validates the inputs (files, schema, types) and returns feature -> store type.
        Raises BadInputError; touches no store. Idempotent."""
        if not getattr(self, "_prepared", False):
            self.schema = self._prepare()
            self._prepared = True
        return self.schema

    def identity(self) -> dict:
        return {"command": self.command, "paths": self.paths, "features": self.requested, "key": self.key}

    def files(self) -> list[dict]:
        return [file_identity(p) for p in self.paths]

    def total_disk_bytes(self) -> Optional[int]:
        return sum(os.path.getsize(p) for p in self.paths) if self.paths else None

    def total_rows(self) -> Optional[int]:
        return None

    def _check_files(self) -> None:
        if not self.paths:
            raise BadInputError("no input files given")
        for p in self.paths:
            if not os.path.exists(p):
                raise BadInputError(f"{p}: no such file")
            if not os.path.isfile(p):
                raise BadInputError(f"{p}: not a regular file")
            if not os.access(p, os.R_OK):
                raise BadInputError(f"{p}: not readable")

    def _select(self, available: dict[str, Any], where: str) -> list[str]:
        """Columns to import: --features (checked) or all, minus the key column."""
        if self.key is not None and self.key not in available:
            raise BadInputError(f"{where}: no key column {self.key!r} (columns: {', '.join(available)})")
        if self.requested is None:
            return [c for c in available if c != self.key]
        missing = [f for f in self.requested if f not in available]
        if missing:
            raise BadInputError(f"{where}: no column(s) {', '.join(missing)} (columns: {', '.join(available)})")
        if self.key in self.requested:
            raise BadInputError(f"--features names the key column {self.key!r}; the key is not stored as a feature")
        return list(self.requested)

    def _file_start_bytes(self) -> list[int]:
        out, acc = [], 0
        for p in self.paths:
            out.append(acc)
            acc += os.path.getsize(p)
        return out


def _convert(table: pa.Table, schema: dict[str, str], hex_columns: set[str], key: Optional[str],
             on_bad_lines: str, locate: Callable[[int, str, str], BadLine],
             drop: Callable[[np.ndarray], pa.Table],
             max_value_bytes: Optional[int] = None) -> tuple[pa.Table, dict[str, Column], Optional[np.ndarray], list[BadLine]]:
    """Converts a table's columns; bad rows raise (error mode) or are dropped and reported."""
    skipped: list[BadLine] = []
    while True:
        try:
            keys = key_column(table.column(key), key) if key is not None else None
            cols = {name: to_column(table.column(name), stype, name, hex_ids=name in hex_columns,
                                    max_value_bytes=max_value_bytes)
                    for name, stype in schema.items()}
            return table, cols, keys, skipped
        except BadRows as br:
            first = locate(int(br.rows[0]), br.column, br.reasons[0] if br.reasons else "bad value")
            if on_bad_lines == "error":
                raise BadInputError.from_line(first, "use --on-bad-lines skip to skip such lines") from None
            for i, r in enumerate(br.rows.tolist()):
                reason = br.reasons[i] if i < len(br.reasons) else br.reasons[-1] if br.reasons else "bad value"
                skipped.append(locate(int(r), br.column, reason))
            table = drop(br.rows)
        except ValueError as e:  # e.g. a key column of the wrong type
            raise BadInputError(str(e)) from None


# ---------------------------------------------------------------------------------------------
# text formats


class _TextSource(Source):
    block_bytes = DEFAULT_BLOCK_BYTES

    def _formats(self) -> list[TextFormat]:
        raise NotImplementedError

    def _hex_columns(self) -> set[str]:
        return set()

    def _header_bytes(self, i: int) -> int:
        return 0

    def _fast_columns(self, block) -> Optional[tuple[int, dict[str, Column]]]:
        """A format-specific parser for ordinary blocks: (rows, columns), or None to parse the
        block with pyarrow (which also reports bad lines)."""
        return None

    def _first_line(self) -> int:
        return 1

    def chunks(self, position: Optional[dict]) -> Iterator[Chunk]:
        start_file = position["file"] if position else 0
        starts = self._file_start_bytes()
        fmts = self._formats()
        for i in range(start_file, len(self.paths)):
            path = self.paths[i]
            if position and i == start_file:
                offset, line = int(position["offset"]), int(position["line"])
            else:
                offset, line = self._header_bytes(i), self._first_line()
            parser = TextParser(fmts[i], path, self.on_bad_lines)
            tf = TextFile(path, self.block_bytes)
            for block in tf.blocks(offset, line):
                fast = self._fast_columns(block)
                where = f"{path}: lines {block.first_line}..{block.first_line + max(0, block.n_lines - 1)}"
                if fast is not None:
                    n_rows, cols = fast
                    yield Chunk(n_rows=n_rows, columns=cols, keys=None,
                                position={"file": i, "offset": block.end_offset,
                                          "line": block.first_line + block.n_lines},
                                file_index=i, input_bytes=len(block.data), disk_done=starts[i] + block.raw_position,
                                rows_read=block.n_lines, where=where)
                    continue
                parsed = parser.parse(block)
                table, cols, keys, skipped = _convert(
                    parsed.table, self.schema, self._hex_columns(), self.key, self.on_bad_lines,
                    lambda r, c, why, p=parsed: BadLine(path, p.line_of(r), c, why),
                    lambda rows, p=parsed: (p.drop_rows(rows), p.table)[1], self.max_value_bytes)
                rows_read = block.n_lines  # lines, empty ones included
                yield Chunk(n_rows=table.num_rows, columns=cols, keys=keys,
                            position={"file": i, "offset": block.end_offset, "line": block.first_line + block.n_lines},
                            file_index=i, input_bytes=len(block.data), disk_done=starts[i] + block.raw_position,
                            rows_read=rows_read, skipped=parsed.skipped + skipped, where=where)
            # a file with nothing after the resume point still moves the position on
            yield Chunk(0, {}, None, {"file": i + 1, "offset": 0, "line": 1}, i, 0,
                        starts[i] + os.path.getsize(path), 0)


class CriteoSource(_TextSource):
    """Criteo TSV (Kaggle train/test, 1TB day files), plain or compressed."""

    command = "criteo"

    def __init__(self, paths: list[str], features: Optional[list[str]] = None, on_bad_lines: str = "error",
                 no_label: bool = False, block_bytes: int = DEFAULT_BLOCK_BYTES):
        super().__init__(paths, features, None, on_bad_lines)
        self.no_label = no_label
        self.block_bytes = int(block_bytes)
        self.names: list[str] = []

    def identity(self) -> dict:
        return dict(super().identity(), no_label=self.no_label)

    def _prepare(self) -> dict[str, str]:
        self._check_files()
        expected = criteo.N_FIELDS - (1 if self.no_label else 0)
        for p in self.paths:
            head = TextFile(p, self.block_bytes).head()
            if not head:
                continue  # an empty file: nothing to import from it
            n = head.rstrip(b"\r\n").count(b"\t") + 1
            names = criteo.layout(n, self.no_label)
            if names is None:
                hint = ""
                if n == criteo.N_FIELDS - 1 and not self.no_label:
                    hint = "; 39 fields is the Kaggle test layout without a label: pass --no-label"
                elif n == criteo.N_FIELDS and self.no_label:
                    hint = "; 40 fields has a label: drop --no-label"
                raise BadInputError(
                    f"{p}:1: {n} tab-separated field(s); the Criteo layout has {expected} "
                    f"({'I1..I13, C1..C26' if self.no_label else 'label, I1..I13, C1..C26'}){hint}. "
                    "Nothing was imported.")
            self.names = names
        if not self.names:
            self.names = criteo.layout(expected, self.no_label) or []
        available = {n: criteo.STORE_TYPES[n] for n in self.names}
        selected = self._select(available, self.paths[0])
        self.schema = {n: available[n] for n in selected}
        return self.schema

    def _formats(self) -> list[TextFormat]:
        types = {n: criteo.PARSE_TYPES[n] for n in self.schema}
        fmt = TextFormat(names=self.names, types=types, include=list(self.schema), delimiter="\t", quoting=False)
        return [fmt] * len(self.paths)

    def _hex_columns(self) -> set[str]:
        return {n for n in self.schema if n in criteo.CAT_NAMES}

    def _fast_columns(self, block) -> Optional[tuple[int, dict[str, Column]]]:
        # The engine's one-pass Criteo parser (ingest/csrc/criteo_tsv.h): the same columns as
        # pyarrow + the hex conversion for well-formed blocks, at a fraction of the CPU time.
        if _parse_criteo_block is None:
            return None
        got = _parse_criteo_block(block.data, not self.no_label)
        if got is None:
            return None
        n_rows, fields = got
        cols = {}
        for name, (values, present) in zip(self.names, fields):
            if name in self.schema:
                cols[name] = Column(present, values)
        return n_rows, cols


# parse types for CSV columns: what pyarrow's inference gives, mapped to a parse type
def _csv_parse_type(t: pa.DataType) -> pa.DataType:
    if pa.types.is_null(t) or pa.types.is_string(t) or pa.types.is_large_string(t):
        return pa.binary()
    return t


_TYPE_NAMES = {"int64": pa.int64(), "float32": pa.float32(), "float64": pa.float64(), "binary": pa.binary(),
               "string": pa.binary(), "bool": pa.bool_()}


class CsvSource(_TextSource):
    """CSV (or any delimiter) with a header line; types inferred from the first MiB or given."""

    command = "csv"

    def __init__(self, paths: list[str], features: Optional[list[str]] = None, key: Optional[str] = None,
                 on_bad_lines: str = "error", delimiter: str = ",", types: Optional[dict[str, str]] = None,
                 block_bytes: int = DEFAULT_BLOCK_BYTES):
        super().__init__(paths, features, key, on_bad_lines)
        if len(delimiter) != 1:
            raise BadInputError(f"--delimiter must be one character, got {delimiter!r}")
        self.delimiter = delimiter
        self.user_types = dict(types or {})
        self.block_bytes = int(block_bytes)
        self.names: list[list[str]] = []
        self.header_bytes: list[int] = []
        self.parse_types: dict[str, pa.DataType] = {}
        self.warnings: list[str] = []

    def identity(self) -> dict:
        return dict(super().identity(), delimiter=self.delimiter, types=self.user_types)

    def _prepare(self) -> dict[str, str]:
        self._check_files()
        for name, t in self.user_types.items():
            if t not in _TYPE_NAMES:
                raise BadInputError(f"--types {name}={t}: unknown type (use one of {', '.join(_TYPE_NAMES)})")
        for p in self.paths:
            names, hb = read_header(TextFile(p, self.block_bytes), self.delimiter, True)
            if self.names and names != self.names[0]:
                raise BadInputError(f"{p}:1: header {names} differs from {self.paths[0]}'s {self.names[0]}")
            self.names.append(names)
            self.header_bytes.append(hb)
        names = self.names[0]
        unknown = [n for n in self.user_types if n not in names]
        if unknown:
            raise BadInputError(f"--types names column(s) not in the header: {', '.join(unknown)}")
        inferred = self._infer(self.paths[0], names, self.header_bytes[0])
        parse_types = {}
        for n in names:
            if n in self.user_types:
                parse_types[n] = _TYPE_NAMES[self.user_types[n]]
            else:
                parse_types[n] = _csv_parse_type(inferred[n])
                if pa.types.is_null(inferred[n]):
                    self.warnings.append(f"column {n} is empty in the first MiB of {self.paths[0]}: imported as "
                                         f"binary (use --types {n}=int64 or float32 to change)")
        available = {}
        for n in names:
            st = store_type(parse_types[n])
            if st is None:
                raise BadInputError(f"{self.paths[0]}: column {n} has type {parse_types[n]}, which cannot be stored")
            available[n] = st
        selected = self._select(available, self.paths[0])
        if self.key is not None and not pa.types.is_integer(parse_types[self.key]):
            raise BadInputError(f"{self.paths[0]}: key column {self.key!r} holds {parse_types[self.key]} values; "
                                f"keys must be integers (use --types {self.key}=int64 if it is)")
        self.parse_types = parse_types
        self.schema = {n: available[n] for n in selected}
        return self.schema

    def _infer(self, path: str, names: list[str], header_bytes: int) -> dict[str, pa.DataType]:
        tf = TextFile(path, 1 << 20)
        sample = b""
        for block in tf.blocks(header_bytes, 2):
            sample = block.data
            break
        if not sample:
            return {n: pa.null() for n in names}
        try:
            t = pcsv.read_csv(pa.BufferReader(sample),
                              read_options=pcsv.ReadOptions(column_names=names),
                              parse_options=pcsv.ParseOptions(delimiter=self.delimiter, newlines_in_values=False),
                              convert_options=pcsv.ConvertOptions(strings_can_be_null=True))
        except pa.ArrowInvalid:
            # a bad line in the sample: infer from the lines that parse
            def skip(_row):
                return "skip"
            try:
                t = pcsv.read_csv(pa.BufferReader(sample),
                                  read_options=pcsv.ReadOptions(column_names=names, use_threads=False),
                                  parse_options=pcsv.ParseOptions(delimiter=self.delimiter, invalid_row_handler=skip),
                                  convert_options=pcsv.ConvertOptions(strings_can_be_null=True))
            except (pa.ArrowException, ValueError) as e:  # e.g. a line that is not UTF-8 text
                raise BadInputError(f"{path}: cannot infer column types from the first MiB: {e}") from None
        return {n: t.schema.field(n).type for n in names}

    def _formats(self) -> list[TextFormat]:
        include = list(self.schema) + ([self.key] if self.key else [])
        types = {n: self.parse_types[n] for n in include}
        return [TextFormat(names=self.names[i], types=types, include=include, delimiter=self.delimiter,
                           quoting=True, null_values=("",)) for i in range(len(self.paths))]

    def _header_bytes(self, i: int) -> int:
        return self.header_bytes[i]

    def _first_line(self) -> int:
        return 2


# ---------------------------------------------------------------------------------------------
# columnar formats


class _ColumnarSource(Source):
    batch_rows = DEFAULT_BATCH_ROWS

    def _open_schema(self, path: str) -> pa.Schema:
        raise NotImplementedError

    def _batches(self, path: str, columns: list[str], skip_rows: int) -> Iterator[pa.RecordBatch]:
        """Record batches of the file from row ``skip_rows`` on."""
        raise NotImplementedError

    def _file_rows(self, path: str) -> Optional[int]:
        return None

    def _prepare(self) -> dict[str, str]:
        self._check_files()
        first: Optional[dict[str, str]] = None
        for p in self.paths:
            try:
                schema = self._open_schema(p)
            except BadInputError:
                raise
            except (pa.ArrowException, OSError, ValueError) as e:  # ValueError: e.g. undecodable names
                raise BadInputError(f"{p}: not a readable {self.command} file: {e}") from None
            available = {}
            unsupported = {}
            for f in schema:
                st = store_type(f.type)
                if st is None:
                    unsupported[f.name] = str(f.type)
                available[f.name] = st
            selected = self._select(available, p)
            bad = {n: unsupported[n] for n in selected if n in unsupported}
            if bad:
                raise BadInputError(f"{p}: column(s) of types that cannot be stored: "
                                    + ", ".join(f"{n} ({t})" for n, t in bad.items())
                                    + " (leave them out with --features)")
            if self.key is not None and not pa.types.is_integer(schema.field(self.key).type):
                raise BadInputError(f"{p}: key column {self.key!r} has type {schema.field(self.key).type}; "
                                    "keys must be integers")
            sel = {n: available[n] for n in selected}
            if first is None:
                first = sel
            elif sel != first:
                raise BadInputError(f"{p}: columns/types {sel} differ from {self.paths[0]}'s {first}")
        self.schema = first or {}
        return self.schema

    def chunks(self, position: Optional[dict]) -> Iterator[Chunk]:
        start_file = position["file"] if position else 0
        starts = self._file_start_bytes()
        columns = list(self.schema) + ([self.key] if self.key else [])
        for i in range(start_file, len(self.paths)):
            path = self.paths[i]
            size = os.path.getsize(path)
            file_rows = self._file_rows(path)
            done = int(position["rows"]) if position and i == start_file else 0
            try:
                for batch in self._batches(path, columns, done):
                    table = pa.Table.from_batches([batch])
                    row0 = done
                    state = {"table": table, "rows": np.arange(table.num_rows)}

                    def drop(rows, st=state):
                        keep = np.ones(st["table"].num_rows, dtype=bool)
                        keep[rows] = False
                        st["table"] = st["table"].filter(pa.array(keep))
                        st["rows"] = st["rows"][keep]
                        return st["table"]

                    table, cols, keys, skipped = _convert(
                        table, self.schema, set(), self.key, self.on_bad_lines,
                        lambda r, c, why, st=state, r0=row0: BadLine(path, None, c, why, row=r0 + int(st["rows"][r])),
                        drop, self.max_value_bytes)
                    done += batch.num_rows
                    frac = (done / file_rows) if file_rows else 0.0
                    yield Chunk(n_rows=table.num_rows, columns=cols, keys=keys,
                                position={"file": i, "rows": done}, file_index=i, input_bytes=0,
                                disk_done=starts[i] + int(size * min(1.0, frac)), rows_read=batch.num_rows,
                                skipped=skipped, where=f"{path}: rows {row0}..{done - 1}")
            except (pa.ArrowException, OSError, ValueError) as e:
                raise BadInputError(f"{path}: cannot read (after row {done}): {e}") from None
            yield Chunk(0, {}, None, {"file": i + 1, "rows": 0}, i, 0, starts[i] + size, 0)

    def total_rows(self) -> Optional[int]:
        try:
            rows = [self._file_rows(p) for p in self.paths]
        except Exception:
            return None
        return None if any(r is None for r in rows) else sum(rows)


class ParquetSource(_ColumnarSource):
    command = "parquet"

    def _open_schema(self, path: str) -> pa.Schema:
        import pyarrow.parquet as pq

        return pq.ParquetFile(path).schema_arrow

    def _file_rows(self, path: str) -> Optional[int]:
        import pyarrow.parquet as pq

        return pq.ParquetFile(path).metadata.num_rows

    def _batches(self, path: str, columns: list[str], skip_rows: int) -> Iterator[pa.RecordBatch]:
        import pyarrow.parquet as pq

        pf = pq.ParquetFile(path)
        md = pf.metadata
        groups, acc, skip_in_first = [], 0, 0
        for g in range(md.num_row_groups):
            n = md.row_group(g).num_rows
            if acc + n <= skip_rows:
                acc += n
                continue
            if not groups:
                skip_in_first = skip_rows - acc
            groups.append(g)
            acc += n
        if not groups:
            return
        to_skip = skip_in_first
        for batch in pf.iter_batches(batch_size=self.batch_rows, row_groups=groups, columns=columns,
                                     use_threads=True):
            if to_skip:
                if batch.num_rows <= to_skip:
                    to_skip -= batch.num_rows
                    continue
                batch = batch.slice(to_skip)
                to_skip = 0
            yield batch


class ArrowSource(_ColumnarSource):
    """Arrow IPC, file (random access, .arrow / .feather v2) or stream format."""

    command = "arrow"

    def _open(self, path: str):
        f = pa.OSFile(path, "rb")
        try:
            return f, pa.ipc.open_file(f)
        except pa.ArrowInvalid:
            f.seek(0)
            return f, pa.ipc.open_stream(f)

    def _open_schema(self, path: str) -> pa.Schema:
        f, r = self._open(path)
        try:
            return r.schema
        finally:
            f.close()

    def _file_rows(self, path: str) -> Optional[int]:
        f, r = self._open(path)
        try:
            if isinstance(r, pa.ipc.RecordBatchFileReader):
                try:
                    return r.count_rows() if hasattr(r, "count_rows") else None
                except Exception:
                    return None
            return None
        finally:
            f.close()

    def _batches(self, path: str, columns: list[str], skip_rows: int) -> Iterator[pa.RecordBatch]:
        f, r = self._open(path)
        try:
            if isinstance(r, pa.ipc.RecordBatchFileReader):
                it = (r.get_batch(i) for i in range(r.num_record_batches))
            else:
                it = iter(r)
            to_skip = skip_rows
            for batch in it:
                if to_skip:
                    if batch.num_rows <= to_skip:
                        to_skip -= batch.num_rows
                        continue
                    batch = batch.slice(to_skip)
                    to_skip = 0
                batch = batch.select(columns)
                # big batches are cut so a chunk stays bounded
                for lo in range(0, batch.num_rows, self.batch_rows):
                    yield batch.slice(lo, self.batch_rows)
        finally:
            f.close()


# ---------------------------------------------------------------------------------------------
# synthetic


class SyntheticSource(Source):
    command = "synthetic"

    def __init__(self, preset: str, rows: int, seed: int = 0, alpha: float = 1.05, vocab: int = 1_000_000,
                 chunk_rows: int = synthetic.DEFAULT_CHUNK_ROWS, features: Optional[list[str]] = None):
        super().__init__([], features, None, "error")
        if preset not in synthetic.PRESETS:
            raise BadInputError(f"unknown preset {preset!r}; choose one of {', '.join(synthetic.PRESETS)}")
        if not 0 <= rows < 1 << 63:
            raise BadInputError("--rows must be >= 0" if rows < 0 else "--rows must be < 2**63 (keys are 64-bit)")
        if seed < 0:
            raise BadInputError("--seed must be >= 0")
        if not (alpha > 0 and math.isfinite(alpha)):
            raise BadInputError("--alpha must be > 0" if math.isfinite(alpha) else "--alpha must be a finite number")
        if not 0 < vocab <= synthetic.MAX_VOCAB:
            raise BadInputError("--vocab must be > 0" if vocab <= 0 else
                                f"--vocab must be <= 2**62 (ids are int64), got {vocab}")
        self.preset, self.rows, self.seed, self.alpha, self.vocab = preset, int(rows), int(seed), float(alpha), int(vocab)
        self.chunk_rows = int(chunk_rows)

    def identity(self) -> dict:
        return {"command": self.command, "preset": self.preset, "rows": self.rows, "seed": self.seed,
                "alpha": self.alpha, "vocab": self.vocab, "chunk_rows": self.chunk_rows, "features": self.requested}

    def files(self) -> list[dict]:
        return []

    def total_disk_bytes(self) -> Optional[int]:
        return None

    def total_rows(self) -> Optional[int]:
        return self.rows

    def _prepare(self) -> dict[str, str]:
        available = synthetic.schema(self.preset)
        self.schema = {n: available[n] for n in self._select(available, f"preset {self.preset}")}
        return self.schema

    def chunks(self, position: Optional[dict]) -> Iterator[Chunk]:
        start = int(position["rows"]) if position else 0
        for first, table in synthetic.chunks(self.preset, self.rows, self.seed, start, self.chunk_rows,
                                             self.alpha, self.vocab):
            cols = {n: to_column(table.column(n), t, n) for n, t in self.schema.items()}
            yield Chunk(n_rows=table.num_rows, columns=cols, keys=None,
                        position={"rows": first + table.num_rows}, file_index=0, input_bytes=0, disk_done=0,
                        rows_read=table.num_rows, where=f"synthetic rows {first}..{first + table.num_rows - 1}")
