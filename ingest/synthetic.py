"""Synthetic recommendation data: Criteo-like samples and Zipf-distributed ids.

Data is generated in fixed chunks of ``chunk_rows`` rows; chunk ``i`` draws from
``numpy.random.default_rng([seed, i])``, so any row range is reproducible on its own (a
resumed import regenerates exactly the rows it skips to, and a TSV written by
:func:`write_criteo_tsv` holds the same values as ``import synthetic --preset criteo-kaggle``
with the same seed and chunk size).

Presets:

- ``criteo-kaggle``: the Criteo layout (:mod:`recflash.ingest.criteo`) with Kaggle's
  per-column empty-field rates and categorical cardinalities; a categorical's rank is drawn
  from a bounded Zipf law (exponent ``alpha``) and hashed to a 32-bit id, as Criteo's are.
- ``zipf``: ``label``; 4 dense float32 features ``d1..d4``; 8 single-id int64 features
  ``s1..s8`` with Zipf ids over ``vocab`` (halved per feature); 2 multi-hot ``list<int64>``
  features ``m1, m2`` (1..20 Zipf ids each). Ids are ranks: 0 is the most popular.
"""

from __future__ import annotations

import os
from collections.abc import Iterator

import numpy as np
import pyarrow as pa

from recflash.ingest import criteo

PRESETS = ("criteo-kaggle", "zipf")
DEFAULT_CHUNK_ROWS = 65536
MAX_VOCAB = 1 << 62  # ranks are drawn as floats and stored as int64


def zipf_ranks(rng: np.random.Generator, n: int, cardinality: int, alpha: float) -> np.ndarray:
    """n ranks in [0, cardinality) with P(rank r) ~ (r + 1) ** -alpha (continuous inverse CDF)."""
    u = rng.random(n)
    top = float(cardinality) + 1.0
    if abs(alpha - 1.0) < 1e-9:
        x = np.exp(u * np.log(top))
    else:
        e = 1.0 - alpha
        x = (1.0 + u * (top ** e - 1.0)) ** (1.0 / e)
    r = np.floor(x).astype(np.int64) - 1
    np.clip(r, 0, cardinality - 1, out=r)
    return r


def mix64(x: np.ndarray) -> np.ndarray:
    """splitmix64 finaliser, vectorised (uint64 arithmetic wraps)."""
    z = x.astype(np.uint64, copy=True)
    with np.errstate(over="ignore"):
        z += np.uint64(0x9E3779B97F4A7C15)
        z = (z ^ (z >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
        z = (z ^ (z >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
        z ^= z >> np.uint64(31)
    return z


def _mask_array(values: np.ndarray, missing: np.ndarray | None, type_: pa.DataType) -> pa.Array:
    if missing is None or not missing.any():
        return pa.array(values, type=type_)
    return pa.array(values, type=type_, mask=missing)


def schema(preset: str) -> dict[str, str]:
    """Feature name -> store type string of a preset."""
    if preset == "criteo-kaggle":
        return dict(criteo.STORE_TYPES)
    if preset == "zipf":
        out = {"label": "float32"}
        out.update({f"d{i}": "float32" for i in range(1, 5)})
        out.update({f"s{i}": "int64" for i in range(1, 9)})
        out.update({f"m{i}": "list<int64>" for i in range(1, 3)})
        return out
    raise ValueError(f"unknown preset {preset!r}; choose one of {', '.join(PRESETS)}")


def criteo_chunk(rng: np.random.Generator, n: int, alpha: float = 1.05) -> pa.Table:
    """n Criteo-like rows: label float32, I1..I13 int64, C1..C26 int64 (nullable)."""
    cols: dict[str, pa.Array] = {}
    cols[criteo.LABEL] = pa.array((rng.random(n) < criteo.KAGGLE_POSITIVE_RATE).astype(np.float32))
    for j, name in enumerate(criteo.INT_NAMES):
        mu, sigma = criteo.KAGGLE_INT_LOGNORMAL[j]
        v = np.floor(rng.lognormal(mu, sigma, n)).astype(np.int64)
        if j == 1:  # I2 has a few negative values (-1, -2, -3) in the real data
            neg = rng.random(n) < 0.02
            v[neg] = -rng.integers(1, 4, int(neg.sum()))
        p = criteo.KAGGLE_INT_MISSING[j]
        cols[name] = _mask_array(v, rng.random(n) < p if p else None, pa.int64())
    for j, name in enumerate(criteo.CAT_NAMES):
        card = criteo.KAGGLE_CARDINALITIES[j]
        r = zipf_ranks(rng, n, card, alpha)
        ids = (mix64(r.astype(np.uint64) + np.uint64((j + 1) << 40)) & np.uint64(0xFFFFFFFF)).astype(np.int64)
        p = criteo.KAGGLE_CAT_MISSING[j]
        cols[name] = _mask_array(ids, rng.random(n) < p if p else None, pa.int64())
    return pa.table(cols)


def zipf_chunk(rng: np.random.Generator, n: int, alpha: float = 1.05, vocab: int = 1_000_000) -> pa.Table:
    cols: dict[str, pa.Array] = {"label": pa.array((rng.random(n) < 0.1).astype(np.float32))}
    for i in range(1, 5):
        cols[f"d{i}"] = pa.array(rng.lognormal(0.0, 1.0 + i / 4, n).astype(np.float32))
    for i in range(1, 9):
        card = min(vocab, max(2, vocab >> (i - 1)))  # halved, but at most vocab ids
        cols[f"s{i}"] = pa.array(zipf_ranks(rng, n, card, alpha))
    for i in range(1, 3):
        lengths = np.minimum(rng.geometric(0.15, n), 20).astype(np.int32)
        offsets = np.zeros(n + 1, dtype=np.int32)
        np.cumsum(lengths, out=offsets[1:])
        ids = zipf_ranks(rng, int(offsets[-1]), vocab, alpha)
        cols[f"m{i}"] = pa.ListArray.from_arrays(pa.array(offsets), pa.array(ids))
    return pa.table(cols)


def chunks(preset: str, rows: int, seed: int = 0, start_row: int = 0, chunk_rows: int = DEFAULT_CHUNK_ROWS,
           alpha: float = 1.05, vocab: int = 1_000_000) -> Iterator[tuple[int, pa.Table]]:
    """Yields (first row, table) for rows [start_row, rows), chunk-aligned generation."""
    if preset not in PRESETS:
        raise ValueError(f"unknown preset {preset!r}; choose one of {', '.join(PRESETS)}")
    first_chunk = start_row // chunk_rows
    for c in range(first_chunk, (rows + chunk_rows - 1) // chunk_rows):
        lo = c * chunk_rows
        n = min(chunk_rows, rows - lo)
        rng = np.random.default_rng([seed, c])
        t = criteo_chunk(rng, n, alpha) if preset == "criteo-kaggle" else zipf_chunk(rng, n, alpha, vocab)
        skip = max(0, start_row - lo)
        yield lo + skip, (t.slice(skip) if skip else t)


_HEX = np.frombuffer(b"0123456789abcdef", dtype=np.uint8)


def hex8(values: np.ndarray, missing: np.ndarray | None) -> pa.Array:
    """int64 ids (< 2**32) -> Arrow string array of 8 lowercase hex digits, null where missing."""
    n = len(values)
    v = values.astype(np.uint64)
    keep = np.ones(n, dtype=bool) if missing is None else ~missing
    vk = v[keep]
    digits = np.empty((len(vk), 8), dtype=np.uint8)
    for j in range(8):
        digits[:, j] = _HEX[(vk >> np.uint64(4 * (7 - j))) & np.uint64(15)]
    offsets = np.zeros(n + 1, dtype=np.int32)
    np.cumsum(np.where(keep, 8, 0), out=offsets[1:])
    validity = None if missing is None else pa.py_buffer(np.packbits(keep, bitorder="little"))
    return pa.Array.from_buffers(pa.string(), n, [validity, pa.py_buffer(offsets), pa.py_buffer(digits.reshape(-1))],
                                 null_count=-1 if missing is not None else 0)


def criteo_text_table(t: pa.Table) -> pa.Table:
    """A Criteo-like table as the TSV holds it: label as 0/1, categoricals as hex strings."""
    cols = {criteo.LABEL: t.column(criteo.LABEL).cast(pa.int64())}
    for name in criteo.INT_NAMES:
        cols[name] = t.column(name)
    for name in criteo.CAT_NAMES:
        a = t.column(name).combine_chunks()
        missing = None
        if a.null_count:
            missing = ~np.unpackbits(np.frombuffer(a.buffers()[0], np.uint8), bitorder="little",
                                     count=a.offset + len(a))[a.offset:].view(bool)
        cols[name] = hex8(np.frombuffer(a.buffers()[1], np.int64, len(a), a.offset * 8), missing)
    return pa.table(cols)


def write_criteo_tsv(path: str | os.PathLike, rows: int, seed: int = 0, chunk_rows: int = DEFAULT_CHUNK_ROWS,
                     alpha: float = 1.05) -> int:
    """Writes ``rows`` Criteo-like lines (Kaggle layout, tab-separated, no header) to ``path``
    (gzip-compressed when it ends in .gz). Returns the number of bytes written (uncompressed)."""
    import pyarrow.csv as pcsv

    path = os.fspath(path)
    options = pcsv.WriteOptions(include_header=False, delimiter="\t", quoting_style="none")
    sink = pa.CompressedOutputStream(path, "gzip") if path.endswith(".gz") else pa.OSFile(path, "wb")
    written = 0
    with sink:
        for _, t in chunks("criteo-kaggle", rows, seed=seed, chunk_rows=chunk_rows, alpha=alpha):
            text = criteo_text_table(t)
            buf = pa.BufferOutputStream()
            pcsv.write_csv(text, buf, options)
            data = buf.getvalue()
            sink.write(data)
            written += data.size
    return written
