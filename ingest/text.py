"""Delimited text (Criteo TSV, CSV): block reading, parsing with pyarrow, bad-line location.

Reading: the file (plain, or gzip / bz2 / zstd / lz4 through pyarrow's compressed input
stream, chosen by extension) is read in blocks of ``block_bytes``, each cut after its last
newline, so every block holds whole lines and its byte offset and first line number in the
(uncompressed) file are known exactly. That is what makes an import resumable at a block
boundary (seek, or decompress-and-skip for compressed files) and error messages exact. Like
pyarrow's own readers with ``newlines_in_values=False`` (their default), a quoted value may
not contain a newline.

Parsing: ``pyarrow.csv.read_csv`` on the block with explicit column types, multi-threaded.
When pyarrow rejects a block (wrong number of fields, a value that does not convert), the
block is bisected into line ranges that parse and single lines that do not (a few dozen small
parses for a block with one bad line); each bad line gets its file, line number, column and
pyarrow's reason. ``--on-bad-lines error`` raises on the first, ``skip`` drops them and
parses the rest.
"""

from __future__ import annotations

import dataclasses
import os
import re
from collections.abc import Iterator
from typing import Optional

import numpy as np
import pyarrow as pa
import pyarrow.csv as pcsv

from recflash.ingest.errors import BadInputError, BadLine

try:  # memchr over the block, without the GIL (bytearray.count took ~12 % of the reader's CPU)
    from recflash._native import count_lines as _count_lines
except ImportError:  # pragma: no cover
    _count_lines = None

MAX_LINE_BYTES = 64 << 20

_CODECS = {".gz": "gzip", ".gzip": "gzip", ".bz2": "bz2", ".zst": "zstd", ".zstd": "zstd", ".lz4": "lz4"}


def codec_for(path: str) -> Optional[str]:
    ext = os.path.splitext(path)[1].lower()
    codec = _CODECS.get(ext)
    if codec and not pa.Codec.is_available(codec):
        raise BadInputError(f"{path}: this pyarrow build cannot read {codec}-compressed files")
    return codec


class TextFile:
    """One text file, read sequentially in blocks of whole lines."""

    def __init__(self, path: str, block_bytes: int):
        self.path = path
        self.codec = codec_for(path)
        self.block_bytes = int(block_bytes)
        self.raw: Optional[pa.NativeFile] = None
        self.stream: Optional[pa.NativeFile] = None

    def open(self) -> None:
        try:
            self.raw = pa.OSFile(self.path, "rb")
        except (OSError, pa.ArrowIOError) as e:
            raise BadInputError(f"cannot open {self.path}: {e}") from None
        self.stream = pa.CompressedInputStream(self.raw, self.codec) if self.codec else self.raw

    def close(self) -> None:
        for f in (self.stream, self.raw):
            try:
                if f is not None:
                    f.close()
            except Exception:  # pragma: no cover - closing twice
                pass
        self.stream = self.raw = None

    def raw_position(self) -> int:
        """Bytes of the file on disk consumed so far (the compressed position for .gz)."""
        try:
            return self.raw.tell() if self.raw is not None else 0
        except Exception:  # pragma: no cover
            return 0

    def _read(self, n: int) -> bytes:
        try:
            return self.stream.read(n)
        except (OSError, pa.ArrowIOError, pa.ArrowInvalid) as e:  # e.g. a corrupt gzip stream
            raise BadInputError(f"cannot read {self.path}: {e}") from None

    def head(self, max_bytes: int = 1 << 20) -> bytes:
        """The first bytes (decompressed), up to and including the first newline if any."""
        self.open()
        try:
            data = b""
            while len(data) < max_bytes:
                chunk = self._read(min(65536, max_bytes - len(data)))
                if not chunk:
                    break
                data += chunk
                nl = data.find(b"\n")
                if nl >= 0:
                    return data[: nl + 1]
            return data
        finally:
            self.close()

    def seek(self, offset: int) -> None:
        if offset <= 0:
            return
        if self.codec is None:
            self.raw.seek(offset)
            return
        left = offset
        while left > 0:  # a compressed stream: decompress and drop
            got = self._read(min(left, 16 << 20))
            if not got:
                raise BadInputError(f"{self.path} is shorter than the {offset} bytes an earlier import read; "
                                    "it changed since (use --restart)")
            left -= len(got)

    def _fill(self, view: memoryview) -> int:
        """Reads until ``view`` is full or the input ends; returns the bytes read."""
        got = 0
        while got < len(view):
            try:
                n = self.stream.readinto(view[got:])
            except (OSError, pa.ArrowIOError, pa.ArrowInvalid) as e:
                raise BadInputError(f"cannot read {self.path}: {e}") from None
            if not n:
                break
            got += n
        return got

    def blocks(self, offset: int, line: int) -> Iterator["Block"]:
        """Blocks of whole lines starting at uncompressed byte ``offset`` (line number ``line``).

        One buffer is reused: a block's data is a view that is valid until the next block is
        requested (the parser copies what it keeps). The incomplete last line is moved to the
        front and the rest of the buffer filled from the file."""
        self.open()
        try:
            self.seek(offset)
            buf = bytearray(self.block_bytes)
            have = 0  # bytes of an incomplete line carried at buf[:have]
            while True:
                if have == len(buf):  # one line longer than the buffer: grow it
                    if len(buf) >= MAX_LINE_BYTES:
                        raise BadInputError(f"{self.path}:{line}: a line longer than {MAX_LINE_BYTES >> 20} MiB")
                    bigger = bytearray(2 * len(buf))
                    bigger[:have] = buf[:have]
                    buf = bigger
                n = self._fill(memoryview(buf)[have:])
                end = have + n
                if n == 0:
                    if have:
                        tail = bytes(buf[:have])
                        yield Block(tail, offset, line, tail.count(b"\n") + (0 if tail.endswith(b"\n") else 1),
                                    self.raw_position(), final=True)
                    return
                cut = buf.rfind(b"\n", 0, end) + 1
                if cut == 0:
                    have = end
                    continue
                view = memoryview(buf)[:cut]
                n_lines = _count_lines(view) if _count_lines else buf.count(b"\n", 0, cut)
                yield Block(memoryview(buf)[:cut], offset, line, n_lines, self.raw_position())
                offset += cut
                line += n_lines
                buf[: end - cut] = buf[cut:end]  # same length: the buffer is not resized
                have = end - cut
        finally:
            self.close()


@dataclasses.dataclass
class Block:
    data: "bytes | memoryview"
    offset: int  # uncompressed byte offset of data[0]
    first_line: int  # 1-based line number of the first line
    n_lines: int
    raw_position: int  # on-disk bytes consumed after reading this block
    final: bool = False

    @property
    def end_offset(self) -> int:
        return self.offset + len(self.data)


@dataclasses.dataclass
class TextFormat:
    """How to parse one kind of text file."""

    names: list[str]  # every column of the file, in order
    types: dict[str, pa.DataType]  # explicit types of the included columns
    include: list[str]  # columns to keep
    delimiter: str = "\t"
    quoting: bool = False
    null_values: tuple[str, ...] = ("",)
    parse_block_bytes: int = 4 << 20

    def parse_options(self) -> pcsv.ParseOptions:
        if self.quoting:
            return pcsv.ParseOptions(delimiter=self.delimiter, newlines_in_values=False)
        return pcsv.ParseOptions(delimiter=self.delimiter, quote_char=False, double_quote=False, escape_char=False)

    def convert_options(self) -> pcsv.ConvertOptions:
        return pcsv.ConvertOptions(column_types=self.types, include_columns=self.include,
                                   null_values=list(self.null_values), strings_can_be_null=True,
                                   quoted_strings_can_be_null=True)

    def read_options(self, threads: bool) -> pcsv.ReadOptions:
        return pcsv.ReadOptions(column_names=self.names, block_size=self.parse_block_bytes, use_threads=threads)


_CONVERSION = re.compile(r"In CSV column #(\d+): Row #\d+: (.*)", re.S)
_PARSE = re.compile(r"CSV parse error: (?:Row #\d+: )?(Expected \d+ columns, got \d+)", re.S)


def _reason(e: Exception, fmt: TextFormat) -> tuple[Optional[str], str]:
    """(column name or None, reason) from a pyarrow CSV error."""
    msg = str(e)
    m = _CONVERSION.search(msg)
    if m:
        idx = int(m.group(1))
        col = fmt.names[idx] if idx < len(fmt.names) else f"#{idx}"
        return col, m.group(2).strip().replace("CSV conversion error", "cannot convert")
    m = _PARSE.search(msg)
    if m:
        got = re.findall(r"\d+", m.group(1))
        return None, f"expected {got[0]} fields, got {got[1]}"
    return None, msg.split("\n")[0]


class ParsedBlock:
    """A parsed block: the table, and the line number of each of its rows."""

    def __init__(self, table: pa.Table, block: Block, kept_lines: Optional[np.ndarray], path: str):
        self.table = table
        self.block = block
        self.path = path
        self._lines = kept_lines  # absolute line number per row, or None: not computed yet
        self.skipped: list[BadLine] = []

    def line_numbers(self) -> np.ndarray:
        if self._lines is None:
            n = self.table.num_rows
            if n == self.block.n_lines:  # no empty lines
                self._lines = np.arange(self.block.first_line, self.block.first_line + n, dtype=np.int64)
            else:
                self._lines = self.block.first_line + _nonempty_lines(self.block.data)
        return self._lines

    def line_of(self, row: int) -> int:
        return int(self.line_numbers()[row])

    def drop_rows(self, rows: np.ndarray) -> None:
        keep = np.ones(self.table.num_rows, dtype=bool)
        keep[rows] = False
        lines = self.line_numbers()
        self.table = self.table.filter(pa.array(keep))
        self._lines = lines[keep]


def _line_starts(data: bytes) -> np.ndarray:
    """Start offsets of the lines of data, plus len(data) at the end."""
    arr = np.frombuffer(data, dtype=np.uint8)
    ends = np.flatnonzero(arr == 10)
    starts = np.concatenate(([0], ends + 1))
    if starts[-1] != len(data):
        starts = np.concatenate((starts, [len(data)]))
    return starts.astype(np.int64)


def _nonempty_lines(data: bytes) -> np.ndarray:
    """0-based indices of the lines pyarrow turns into rows (it skips empty lines)."""
    starts = _line_starts(data)
    lens = np.diff(starts)
    arr = np.frombuffer(data, dtype=np.uint8)
    # a line is its bytes up to and including '\n': empty means "\n" or "\r\n" (or nothing at EOF)
    content = lens.copy()
    has_nl = np.zeros(len(lens), dtype=bool)
    if len(lens):
        has_nl = arr[starts[1:] - 1] == 10
    content -= has_nl
    cr = np.zeros(len(lens), dtype=bool)
    nz = content > 0
    if nz.any():
        last = starts[:-1] + content - 1
        cr[nz] = arr[last[nz]] == 13
    content -= cr & (content == 1)
    return np.flatnonzero(content > 0)


class TextParser:
    def __init__(self, fmt: TextFormat, path: str, on_bad_lines: str):
        self.fmt = fmt
        self.path = path
        self.on_bad_lines = on_bad_lines
        self._parse_options = fmt.parse_options()
        self._convert_options = fmt.convert_options()

    def _parse(self, data, threads: bool) -> pa.Table:
        return pcsv.read_csv(pa.BufferReader(data), read_options=self.fmt.read_options(threads),
                             parse_options=self._parse_options, convert_options=self._convert_options)

    def parse(self, block: Block) -> ParsedBlock:
        try:
            table = self._parse(block.data, threads=True)
            return ParsedBlock(table, block, None, self.path)
        except pa.ArrowInvalid as e:
            first_error = e
        return self._parse_slow(block, first_error)

    # -- the slow path: only for blocks pyarrow rejects -------------------------------------
    def _try(self, data: bytes, starts: np.ndarray, lo: int, hi: int) -> Optional[Exception]:
        try:
            self._parse(data[starts[lo]:starts[hi]], threads=False)
            return None
        except pa.ArrowInvalid as e:
            return e

    def _bad_lines(self, data: bytes, starts: np.ndarray, stop_at_first: bool) -> list[tuple[int, Exception]]:
        n = len(starts) - 1
        bad: list[tuple[int, Exception]] = []
        pending = []
        seg = max(1, n // 64)
        for lo in range(0, n, seg):
            pending.append((lo, min(n, lo + seg), None))
        while pending:
            lo, hi, err = pending.pop(0)
            if err is None:
                err = self._try(data, starts, lo, hi)
                if err is None:
                    continue
            if hi - lo == 1:
                bad.append((lo, err))
                if stop_at_first:
                    return bad
                continue
            mid = (lo + hi) // 2
            e1 = self._try(data, starts, lo, mid)
            e2 = self._try(data, starts, mid, hi)
            if e1 is None and e2 is None:  # fails only as a whole: blame its first line
                bad.append((lo, err))
                if stop_at_first:
                    return bad
                continue
            # depth first, in line order, so the first bad line is found first
            nxt = []
            if e1 is not None:
                nxt.append((lo, mid, e1))
            if e2 is not None:
                nxt.append((mid, hi, e2))
            pending[:0] = nxt
        return sorted(bad, key=lambda b: b[0])

    def _parse_slow(self, block: Block, first_error: Exception) -> ParsedBlock:
        data = block.data
        starts = _line_starts(data)
        bad = self._bad_lines(data, starts, stop_at_first=self.on_bad_lines == "error")
        if not bad:
            col, reason = _reason(first_error, self.fmt)
            raise BadInputError(f"{self.path}: lines {block.first_line}..{block.first_line + block.n_lines - 1}: "
                                f"{reason}" + (f" (column {col})" if col else ""))
        records = []
        for idx, err in bad:
            col, reason = _reason(err, self.fmt)
            records.append(BadLine(self.path, block.first_line + idx, col, reason))
        if self.on_bad_lines == "error":
            raise BadInputError.from_line(records[0], "use --on-bad-lines skip to skip such lines")
        bad_idx = np.array([b[0] for b in bad], dtype=np.int64)
        keep_lines = np.ones(len(starts) - 1, dtype=bool)
        keep_lines[bad_idx] = False
        pieces = []
        run_start = None
        for i in range(len(keep_lines) + 1):
            k = keep_lines[i] if i < len(keep_lines) else False
            if k and run_start is None:
                run_start = i
            elif not k and run_start is not None:
                pieces.append(data[starts[run_start]:starts[i]])
                run_start = None
        filtered = b"".join(pieces)
        if filtered and not filtered.endswith(b"\n"):
            filtered += b"\n"
        try:
            table = self._parse(filtered, threads=True) if filtered else None
        except pa.ArrowInvalid as e:  # pragma: no cover - bisection found every bad line
            raise RuntimeError(f"{self.path}: block at line {block.first_line} still fails after removing "
                               f"{len(bad)} bad line(s): {e}") from None
        if table is None:
            table = _empty_table(self.fmt)
        # rows of the filtered text: the kept, non-empty lines
        nonempty = np.zeros(len(keep_lines), dtype=bool)
        nonempty[_nonempty_lines(data)] = True
        kept_rows = np.flatnonzero(keep_lines & nonempty)
        pb = ParsedBlock(table, block, block.first_line + kept_rows, self.path)
        if len(pb._lines) != table.num_rows:  # pragma: no cover - defensive
            pb._lines = None
        pb.skipped = records
        return pb


def _empty_table(fmt: TextFormat) -> pa.Table:
    return pa.table({name: pa.array([], type=fmt.types.get(name, pa.string())) for name in fmt.include})


def read_header(tf: TextFile, delimiter: str, quoting: bool) -> tuple[list[str], int]:
    """Column names from the first line of a CSV file, and that line's length in bytes."""
    head = tf.head()
    if not head.strip():
        raise BadInputError(f"{tf.path}: the file is empty (no header line)")
    po = pcsv.ParseOptions(delimiter=delimiter) if quoting else pcsv.ParseOptions(delimiter=delimiter, quote_char=False)
    try:
        t = pcsv.read_csv(pa.BufferReader(head), read_options=pcsv.ReadOptions(autogenerate_column_names=False),
                          parse_options=po)
        names = t.column_names  # decodes the names: a header that is not UTF-8 fails here
    except (pa.ArrowInvalid, UnicodeDecodeError) as e:
        raise BadInputError(f"{tf.path}:1: cannot parse the header line: {e}") from None
    if len(set(names)) != len(names):
        dup = sorted({n for n in names if names.count(n) > 1})
        raise BadInputError(f"{tf.path}:1: duplicate column names in the header: {', '.join(dup)}")
    return names, len(head)


def count_fields(line: bytes, delimiter: str, quoting: bool) -> int:
    """Number of fields of one line (via pyarrow, so quoting is honoured)."""
    po = pcsv.ParseOptions(delimiter=delimiter) if quoting else pcsv.ParseOptions(delimiter=delimiter, quote_char=False)
    t = pcsv.read_csv(pa.BufferReader(line if line.endswith(b"\n") else line + b"\n"),
                      read_options=pcsv.ReadOptions(autogenerate_column_names=True),
                      parse_options=po,
                      convert_options=pcsv.ConvertOptions(column_types={}, strings_can_be_null=False))
    return t.num_columns
