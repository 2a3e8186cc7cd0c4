"""Vectorised hexadecimal id parsing: an Arrow string column of hex digits -> int64 ids.

Criteo's categorical fields are 32-bit hashes written as 8 hex digits. The fast path reads the
column's data buffer as little-endian uint64 words (one word = one value, no per-row Python)
and does SWAR arithmetic on all eight characters at once:

- validate: for every byte c, ``'0' <= c <= '9'`` or ``'a' <= (c | 0x20) <= 'f'``, tested
  with carry-free byte-wise additions (``c + 0x50`` sets bit 7 iff ``c >= 0x30`` ...);
- convert: nibble = ``(c & 0x0F) + 9 * ((c >> 6) & 1)``, then three shift/mask/or steps pack
  the eight nibbles into 32 bits.

It runs over slices of 16 Ki words with preallocated scratch arrays (in place, cache
resident); on this machine ~70 M values/s on one core, against ~30 M values/s for the
naive allocate-per-step numpy version and ~35 M/s for a 256-entry lookup table.

Values of other lengths (1..16 digits) take the general path: right-aligned into 16-byte
rows padded with '0', converted as two words. More than 16 digits, or a non-hex character,
makes the value invalid; callers get the positions of invalid values to report.
"""

from __future__ import annotations

import numpy as np
import pyarrow as pa

_U = np.uint64
_K01 = _U(0x0101010101010101)
_K0F = _U(0x0F0F0F0F0F0F0F0F)
_K80 = _U(0x8080808080808080)
_K50 = _U(0x5050505050505050)
_K46 = _U(0x4646464646464646)
_K20 = _U(0x2020202020202020)
_K1F = _U(0x1F1F1F1F1F1F1F1F)
_K19 = _U(0x1919191919191919)
_M1 = _U(0x000F000F000F000F)
_M2 = _U(0x000000FF000000FF)
_M3 = _U(0xFFFF)
_S4, _S6, _S8, _S16, _S32, _N9 = _U(4), _U(6), _U(8), _U(16), _U(32), _U(9)

try:
    from recflash._native import parse_hex_ids as _native_parse
except ImportError:  # pragma: no cover - the pure-numpy path below
    _native_parse = None
_EMPTY = np.zeros(0, np.uint8)

_STEP = 1 << 14  # words per slice: 128 KiB per array, stays in L2


def _words_valid(c: np.ndarray, t: np.ndarray, u: np.ndarray, v: np.ndarray) -> None:
    """Per word into t: 0x80 in every byte iff that byte is a hex digit."""
    np.bitwise_or(c, _K20, out=u)  # lower-cased
    np.add(u, _K1F, out=t)  # bit 7: >= 'a'
    np.add(u, _K19, out=u)  # bit 7: >= 'g'
    np.invert(u, out=u)
    np.bitwise_and(t, u, out=t)  # letter a-f / A-F
    np.add(c, _K50, out=u)  # bit 7: >= '0'
    np.add(c, _K46, out=v)  # bit 7: >= ':'
    np.invert(v, out=v)
    np.bitwise_and(u, v, out=u)  # digit
    np.bitwise_or(t, u, out=t)
    np.bitwise_and(t, _K80, out=t)
    # A byte >= 0x80 may carry into its neighbour; flag the word (0x08 breaks equality).
    np.bitwise_and(c, _K80, out=u)
    np.right_shift(u, _S4, out=u)
    np.bitwise_or(t, u, out=t)


def _convert_words(c: np.ndarray, out: np.ndarray, t: np.ndarray) -> None:
    """Eight ASCII hex digits per little-endian word (first digit in the low byte) -> value."""
    np.right_shift(c, _S6, out=t)
    np.bitwise_and(t, _K01, out=t)
    np.multiply(t, _N9, out=t)
    np.bitwise_and(c, _K0F, out=out)
    np.add(out, t, out=out)  # one nibble per byte
    np.bitwise_and(out, _M1, out=t)
    np.left_shift(t, _S4, out=t)
    np.right_shift(out, _S8, out=out)
    np.bitwise_and(out, _M1, out=out)
    np.bitwise_or(out, t, out=out)  # 16-bit lanes: two digits each
    np.bitwise_and(out, _M2, out=t)
    np.left_shift(t, _S8, out=t)
    np.right_shift(out, _S16, out=out)
    np.bitwise_and(out, _M2, out=out)
    np.bitwise_or(out, t, out=out)  # 32-bit lanes: four digits each
    np.bitwise_and(out, _M3, out=t)
    np.left_shift(t, _S16, out=t)
    np.right_shift(out, _S32, out=out)
    np.bitwise_or(out, t, out=out)  # eight digits


def parse_hex8_words(words: np.ndarray) -> tuple[np.ndarray, np.ndarray | None]:
    """words: uint64 array, each the 8 ASCII bytes of one value. Returns (values as uint64,
    indices of invalid values or None when all are valid)."""
    n = len(words)
    out = np.empty(n, dtype=np.uint64)
    if n == 0:
        return out, None
    step = min(_STEP, n)
    t = np.empty(step, dtype=np.uint64)
    u = np.empty(step, dtype=np.uint64)
    v = np.empty(step, dtype=np.uint64)
    bad_slices = []
    for s in range(0, n, step):
        e = min(n, s + step)
        c = words[s:e]
        tt, uu, vv = t[: e - s], u[: e - s], v[: e - s]
        _words_valid(c, tt, uu, vv)
        if np.bitwise_and.reduce(tt) != _K80 or np.bitwise_or.reduce(tt) != _K80:
            bad_slices.append(s + np.flatnonzero(tt != _K80))
        _convert_words(c, out[s:e], tt)
    bad = np.concatenate(bad_slices) if bad_slices else None
    return out, bad


def _string_buffers(arr: pa.Array) -> tuple[np.ndarray, np.ndarray]:
    """(offsets as int64 relative to the data start, data bytes) of a string/binary array."""
    bufs = arr.buffers()
    n = len(arr)
    if pa.types.is_large_string(arr.type) or pa.types.is_large_binary(arr.type):
        offs = np.frombuffer(bufs[1], dtype=np.int64, count=n + 1, offset=arr.offset * 8)
    else:
        offs = np.frombuffer(bufs[1], dtype=np.int32, count=n + 1, offset=arr.offset * 4).astype(np.int64)
    data = np.frombuffer(bufs[2], dtype=np.uint8) if bufs[2] is not None and len(bufs[2]) else np.zeros(0, np.uint8)
    return offs, data


def valid_mask(arr: pa.Array) -> np.ndarray | None:
    """Boolean numpy mask of non-null entries, or None when there are no nulls."""
    if arr.null_count == 0:
        return None
    bitmap = arr.buffers()[0]
    bits = np.unpackbits(np.frombuffer(bitmap, dtype=np.uint8), bitorder="little",
                         count=arr.offset + len(arr))
    return bits[arr.offset:].view(bool)


def parse_hex_column(arr: pa.Array) -> tuple[np.ndarray, np.ndarray | None, np.ndarray | None]:
    """Parses a string/binary Arrow array of hex ids.

    Returns ``(values, valid, bad)``: ``values`` int64 for the non-null entries in order (one
    per set entry of ``valid``; 16-digit values above 2**63 wrap to negative int64), ``valid``
    the non-null mask (None: no nulls), ``bad`` the positions *in the array* of entries that are
    not hex ids (empty strings count as null), or None.
    """
    if isinstance(arr, pa.ChunkedArray):
        arr = arr.combine_chunks()
    n = len(arr)
    if _native_parse is not None and (pa.types.is_string(arr.type) or pa.types.is_binary(arr.type)):
        # The engine's C++ parser (ingest/csrc/hex_ids.h): same results, a fraction of the CPU,
        # and it runs without the GIL.
        bufs = arr.buffers()
        offs = np.frombuffer(bufs[1], dtype=np.int32, count=n + 1, offset=arr.offset * 4)
        data = np.frombuffer(bufs[2], dtype=np.uint8) if bufs[2] is not None and len(bufs[2]) else _EMPTY
        bits = np.frombuffer(bufs[0], dtype=np.uint8) if bufs[0] is not None and arr.null_count else None
        values, keep, bad = _native_parse(offs, data, bits, arr.offset)
        return values, keep, bad
    valid = valid_mask(arr)
    offs, data = _string_buffers(arr)
    lens = np.diff(offs)
    if valid is not None:
        present = np.flatnonzero(valid)
        lens_p = lens[present]
        starts = offs[:-1][present]
    else:
        present = None
        lens_p = lens
        starts = offs[:-1]
    m = len(lens_p)
    if m == 0:
        return np.zeros(0, np.int64), valid, None
    # empty strings that are not null (e.g. quoted "") count as missing
    if (lens_p == 0).any():
        empty = lens_p == 0
        keep_mask = np.ones(n, dtype=bool) if valid is None else valid.copy()
        keep_idx = np.flatnonzero(keep_mask)
        keep_mask[keep_idx[empty]] = False
        return _parse_general(arr, keep_mask)
    first, last = int(offs[0]), int(offs[-1])
    if (lens_p == 8).all() and last - first == 8 * m:
        # the common case: the present values' bytes are contiguous, 8 per value
        words = data[first:last].view("<u8") if first % 8 == 0 else np.frombuffer(
            data[first:last].tobytes(), dtype="<u8")
        vals, bad_p = parse_hex8_words(words)
        bad = None if bad_p is None else (bad_p if present is None else present[bad_p])
        return vals.view(np.int64), valid, bad
    return _parse_general(arr, valid if valid is not None else np.ones(n, dtype=bool))


def _parse_general(arr: pa.Array, keep: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray | None]:
    """Any lengths: values right-aligned into 16-byte rows padded with '0'."""
    offs, data = _string_buffers(arr)
    present = np.flatnonzero(keep)
    starts = offs[:-1][present]
    lens = offs[1:][present] - starts
    m = len(present)
    too_long = lens > 16
    lens_c = np.minimum(lens, 16)
    rows = np.full((m, 16), ord("0"), dtype=np.uint8)
    total = int(lens_c.sum())
    if total:
        row = np.repeat(np.arange(m, dtype=np.int64), lens_c)
        first_byte = np.repeat(np.cumsum(lens_c) - lens_c, lens_c)
        within = np.arange(total, dtype=np.int64) - first_byte
        col = within + np.repeat(16 - lens_c, lens_c)
        src = np.repeat(starts, lens_c) + within
        rows[row, col] = data[src]
    words = rows.reshape(-1).view("<u8")  # word 2i: high 8 digits, word 2i+1: low 8 digits
    vals, bad_w = parse_hex8_words(words)
    vals = vals.reshape(m, 2)
    out = (vals[:, 0] << _S32) | vals[:, 1]
    bad_rows = np.zeros(m, dtype=bool)
    if bad_w is not None:
        bad_rows[bad_w // 2] = True
    bad_rows |= too_long
    bad = present[np.flatnonzero(bad_rows)] if bad_rows.any() else None
    return out.view(np.int64), keep, bad
