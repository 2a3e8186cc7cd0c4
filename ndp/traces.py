"""Synthetic SLS traces: id distributions, DLRM model shapes, batches of ``SlsRequest``.

Distributions (each a vectorised numpy generator of row ids in ``[0, num_rows)``):

- ``uniform``   every row equally likely.
- ``zipf``      bounded Zipf(alpha) over popularity ranks 1..N (P(r) ~ r**-alpha, exact
                discrete CDF); rank -> row through a fixed bijection ``r * a + b mod N`` so hot
                rows are scattered over the table (``scatter=False`` keeps rank = row id, i.e.
                one hot region at the start of the table).
- ``klocality`` RecSSD's synthetic locality traces (seed 000 §6: "likelihood distributions for
                input embeddings across stack distances of previously requested embedding
                vectors ... exponential distributions based on a parameter value K; K = 0, 1, 2
                generate traces with 13 %, 54 % and 72 % unique accesses"). Each access is new
                with probability ``k_unique_fraction(K)`` (those three points, log-linear in
                between and beyond; new accesses take rows not used before), otherwise it re-references the row accessed ``d`` accesses
                earlier, ``d`` ~ 1 + geometric with mean ``mean_reuse`` (exponential reuse
                distances; a row's LRU stack distance is at most its reuse distance, so with
                ``mean_reuse`` well below RecSSD's 2 K-entry host cache the LRU hit rate is about
                1 - unique fraction, as in their Figure 10: 84 / 44 / 28 %). Vectorised: each
                access points at its source access and the pointers are resolved by doubling.
- ``binomial``  the thesis' (seed 004 §5.4) bimodal ids: two peaks (binomial ~ normal) at
                25 % and 75 % of the table, each ``width`` of the table wide (std).

Model shapes (DeepRecInfra, RecSSD Table 1): RM1 8 tables x 4 M rows x dim 32, 80 lookups per
bag; RM2 32 x 500 K x 64, 120; RM3 10 x 2 M x 32, 20. ``model_shape(name, scale)`` scales the
rows per table (the number of tables, dim and pooling factor stay) so a run fits the disk and
the time budget; the I/O cost of an SLS depends on the lookups, not on the table size
(thesis §5.3), as long as the tables are much larger than any cache.

``make_batches`` returns ``num_batches`` batches, each a list with one ``SlsRequest`` per table
(``batch_size`` bags of ``lookups`` ids; fixed lengths as DLRM's benchmark uses, or
``lengths="uniform"`` for 1..2L-1 with mean L). ``save_trace`` / ``load_trace`` write and read
the binary trace format the C++ baselines (benchmarks/csrc/sls_baselines.cc) read.
"""

from __future__ import annotations

import dataclasses
import functools
import math
import struct
from collections import OrderedDict
from typing import Dict, List, Optional, Sequence

import numpy as np

from recflash.ndp.sls import SlsRequest

__all__ = [
    "ModelShape", "RM1", "RM2", "RM3", "MODEL_SHAPES", "model_shape", "DISTRIBUTIONS",
    "uniform_ids", "zipf_ids", "k_locality_ids", "binomial_ids", "k_unique_fraction", "table_ids",
    "make_batches", "save_trace", "load_trace", "unique_fraction", "lru_hit_rate", "hot_mass",
    "TRACE_MAGIC",
]


# ---------------------------------------------------------------------------------------
# Model shapes


@dataclasses.dataclass(frozen=True)
class ModelShape:
    name: str
    num_tables: int
    num_rows: int      # rows per table
    dim: int
    lookups: int       # ids per bag (pooling factor)
    scale: float = 1.0  # num_rows relative to the published shape

    @property
    def row_bytes(self) -> int:
        return 4 * self.dim

    @property
    def table_bytes(self) -> int:
        return self.num_rows * self.row_bytes

    @property
    def total_bytes(self) -> int:
        return self.num_tables * self.table_bytes

    def table_names(self, prefix: Optional[str] = None) -> List[str]:
        p = self.name.lower() if prefix is None else prefix
        return [f"{p}_t{i}" for i in range(self.num_tables)]

    def scaled(self, scale: float, min_rows: int = 1024) -> "ModelShape":
        if not scale > 0:
            raise ValueError(f"scale must be positive, got {scale}")
        base = self.num_rows / self.scale
        rows = max(min_rows, int(round(base * scale)))
        return dataclasses.replace(self, num_rows=rows, scale=rows / base)

    def with_lookups(self, lookups: int) -> "ModelShape":
        if lookups <= 0:
            raise ValueError(f"lookups per bag must be positive, got {lookups}")
        return dataclasses.replace(self, lookups=int(lookups))


RM1 = ModelShape("RM1", 8, 4_000_000, 32, 80)
RM2 = ModelShape("RM2", 32, 500_000, 64, 120)
RM3 = ModelShape("RM3", 10, 2_000_000, 32, 20)
MODEL_SHAPES: Dict[str, ModelShape] = {"RM1": RM1, "RM2": RM2, "RM3": RM3}


def model_shape(name: str, scale: float = 1.0, *, lookups: Optional[int] = None,
                tables: Optional[int] = None, min_rows: int = 1024) -> ModelShape:
    """RM1/RM2/RM3 with rows per table scaled by ``scale`` (and optionally other lookups/tables)."""
    try:
        s = MODEL_SHAPES[name.upper()]
    except KeyError:
        raise ValueError(f"unknown model shape {name!r} (known: {', '.join(MODEL_SHAPES)})") from None
    s = s.scaled(scale, min_rows=min_rows)
    if lookups is not None:
        s = s.with_lookups(lookups)
    if tables is not None:
        if tables <= 0:
            raise ValueError(f"tables must be positive, got {tables}")
        s = dataclasses.replace(s, num_tables=int(tables))
    return s


# ---------------------------------------------------------------------------------------
# Id distributions

DISTRIBUTIONS = ("uniform", "zipf", "klocality", "binomial")


def _rng(rng) -> np.random.Generator:
    return rng if isinstance(rng, np.random.Generator) else np.random.default_rng(rng)


def uniform_ids(num_rows: int, n: int, rng=None) -> np.ndarray:
    return _rng(rng).integers(0, num_rows, int(n), dtype=np.int64)


@functools.lru_cache(maxsize=4)
def _zipf_cdf(num_rows: int, alpha: float) -> np.ndarray:
    w = np.arange(1, num_rows + 1, dtype=np.float64) ** (-float(alpha))
    cdf = np.cumsum(w)
    cdf /= cdf[-1]
    cdf[-1] = 1.0
    cdf.setflags(write=False)
    return cdf


def _coprime_multiplier(num_rows: int, salt: int) -> int:
    """A multiplier near the golden fraction of N, coprime with N (so r -> r*a mod N is a bijection)."""
    if num_rows <= 2:
        return 1
    a = int(num_rows * 0.6180339887498949) + 2 * salt + 1
    a %= num_rows
    a = max(a, 1)
    while math.gcd(a, num_rows) != 1:
        a = a % (num_rows - 1) + 1
    return a


def zipf_ids(num_rows: int, n: int, alpha: float = 1.05, rng=None, *, scatter: bool = True,
             salt: int = 0) -> np.ndarray:
    """Bounded Zipf(alpha) ids. ``scatter`` maps popularity rank r (0-based) to row
    ``(r * a + salt) mod N`` with a fixed a coprime with N; ``salt`` varies it per table."""
    if alpha <= 0:
        raise ValueError(f"zipf alpha must be positive, got {alpha}")
    if num_rows >= 1 << 32:
        raise ValueError("zipf_ids supports tables below 2**32 rows")
    cdf = _zipf_cdf(int(num_rows), float(alpha))
    ranks = np.searchsorted(cdf, _rng(rng).random(int(n)), side="right").astype(np.int64)
    np.minimum(ranks, num_rows - 1, out=ranks)
    if not scatter:
        return ranks
    a = _coprime_multiplier(num_rows, salt)
    return ((ranks.astype(np.uint64) * np.uint64(a) + np.uint64(salt)) % np.uint64(num_rows)).astype(np.int64)


# RecSSD (seed 000 §6.1): K = 0, 1, 2 -> 13 %, 54 %, 72 % unique accesses.
RECSSD_UNIQUE_FRACTION = {0: 0.13, 1: 0.54, 2: 0.72}


def k_unique_fraction(k: float) -> float:
    """Fraction of new (first-time) accesses for locality parameter K: RecSSD's three points,
    interpolated (and extrapolated past K=2) linearly in log(1 - unique)."""
    if k < 0:
        raise ValueError(f"K must be >= 0, got {k}")
    ks = np.array(sorted(RECSSD_UNIQUE_FRACTION), dtype=np.float64)
    lr = np.log1p(-np.array([RECSSD_UNIQUE_FRACTION[int(x)] for x in ks]))
    if k <= ks[-1]:
        v = float(np.interp(k, ks, lr))
    else:
        v = float(lr[-1] + (k - ks[-1]) * (lr[-1] - lr[-2]))
    return float(-np.expm1(v))


def k_locality_ids(num_rows: int, n: int, k: float = 1.0, rng=None, *, mean_reuse: float = 256.0,
                   unique_fraction: Optional[float] = None) -> np.ndarray:
    """RecSSD-style locality trace: new ids with probability u(K), else a re-reference of the id
    used ``d`` accesses earlier, d ~ 1 + Geometric (mean ``mean_reuse``)."""
    n = int(n)
    if n == 0:
        return np.zeros(0, np.int64)
    if mean_reuse < 1:
        raise ValueError(f"mean_reuse must be >= 1, got {mean_reuse}")
    g = _rng(rng)
    u = k_unique_fraction(k) if unique_fraction is None else float(unique_fraction)
    if not 0 < u <= 1:
        raise ValueError(f"unique fraction must be in (0, 1], got {u}")
    pos = np.arange(n, dtype=np.int64)
    new = g.random(n) < u
    gap = g.geometric(1.0 / mean_reuse, n).astype(np.int64) if mean_reuse > 1 else np.ones(n, np.int64)
    src = pos - gap
    new |= src < 0
    src[new] = pos[new]
    # Resolve chains of re-references to the new access they started from (pointer doubling).
    for _ in range(64):
        nxt = src[src]
        if np.array_equal(nxt, src):
            break
        src = nxt
    # New accesses get distinct rows (a random sample without replacement, reused cyclically
    # only when a stream has more new accesses than the table has rows).
    starts = np.flatnonzero(new)
    sample = g.choice(num_rows, size=min(starts.size, num_rows), replace=False).astype(np.int64)
    fresh = np.zeros(n, dtype=np.int64)
    fresh[starts] = sample[np.arange(starts.size) % sample.size]
    return fresh[src]


def binomial_ids(num_rows: int, n: int, rng=None, *, peaks: Sequence[float] = (0.25, 0.75),
                 width: float = 0.02) -> np.ndarray:
    """Bimodal ids (the thesis' "Binomial" distribution): equal mixture of normals centred at
    ``peaks`` (fractions of the table), standard deviation ``width`` of the table, clipped."""
    g = _rng(rng)
    n = int(n)
    which = g.integers(0, len(peaks), n)
    centre = np.asarray(peaks, dtype=np.float64)[which] * num_rows
    x = np.rint(g.normal(centre, width * num_rows)).astype(np.int64)
    return np.clip(x, 0, num_rows - 1)


def table_ids(num_rows: int, n: int, dist: str = "uniform", rng=None, *, alpha: float = 1.05,
              k: float = 1.0, mean_reuse: float = 256.0, scatter: bool = True, salt: int = 0) -> np.ndarray:
    """``n`` ids of distribution ``dist`` for one table (one continuous stream)."""
    if dist == "uniform":
        return uniform_ids(num_rows, n, rng)
    if dist == "zipf":
        return zipf_ids(num_rows, n, alpha, rng, scatter=scatter, salt=salt)
    if dist == "klocality":
        return k_locality_ids(num_rows, n, k, rng, mean_reuse=mean_reuse)
    if dist == "binomial":
        return binomial_ids(num_rows, n, rng)
    raise ValueError(f"unknown id distribution {dist!r} (known: {', '.join(DISTRIBUTIONS)})")


# ---------------------------------------------------------------------------------------
# Batches


def make_batches(shape: ModelShape, batch_size: int, num_batches: int, *, dist: str = "uniform",
                 seed: int = 0, alpha: float = 1.05, k: float = 1.0, mean_reuse: float = 256.0,
                 scatter: bool = True, lookups: Optional[int] = None, lengths: str = "fixed",
                 mode: str = "sum", table_names: Optional[Sequence[str]] = None) -> List[List[SlsRequest]]:
    """``num_batches`` batches; each is one ``SlsRequest`` per table with ``batch_size`` bags.

    Each table's ids are one stream over all batches (locality carries across batches), from
    its own generator (seeded by ``seed`` and the table number)."""
    if batch_size <= 0 or num_batches <= 0:
        raise ValueError(f"batch_size and num_batches must be positive, got {batch_size}, {num_batches}")
    if lengths not in ("fixed", "uniform"):
        raise ValueError(f"lengths must be 'fixed' or 'uniform', got {lengths!r}")
    L = int(lookups or shape.lookups)
    names = list(table_names) if table_names is not None else shape.table_names()
    if len(names) != shape.num_tables:
        raise ValueError(f"{len(names)} table names for {shape.num_tables} tables")
    B = int(batch_size)
    per_table = []
    for t in range(shape.num_tables):
        g = np.random.default_rng([int(seed), t])
        if lengths == "fixed":
            lens = np.full((num_batches, B), L, dtype=np.int64)
        else:
            lens = g.integers(1, 2 * L, (num_batches, B), dtype=np.int64)
        ids = table_ids(shape.num_rows, int(lens.sum()), dist, g, alpha=alpha, k=k,
                        mean_reuse=mean_reuse, scatter=scatter, salt=t)
        per_table.append((lens, ids))
    batches: List[List[SlsRequest]] = []
    cursors = [0] * shape.num_tables
    for b in range(num_batches):
        reqs = []
        for t, (lens, ids) in enumerate(per_table):
            ln = lens[b]
            total = int(ln.sum())
            idx = ids[cursors[t]:cursors[t] + total]
            cursors[t] += total
            off = np.zeros(B, dtype=np.int64)
            np.cumsum(ln[:-1], out=off[1:])
            reqs.append(SlsRequest(names[t], idx, off, mode))
        batches.append(reqs)
    return batches


# ---------------------------------------------------------------------------------------
# Binary trace files (read by benchmarks/csrc/sls_baselines.cc)
#
# Little-endian. Header: magic b"RFSLSTR1", u32 num_batches, u32 num_tables (requests per
# batch), u64 reserved. Then for every batch, for every request: u32 table index, u32 mode
# (0 sum, 1 mean), u64 num_bags, u64 num_indices, int64 offsets[num_bags] (bag starts, first
# 0, non-decreasing), int64 indices[num_indices]. Bag b is indices[offsets[b], offsets[b+1]),
# the last bag runs to num_indices.

TRACE_MAGIC = b"RFSLSTR1"
_HDR = struct.Struct("<8sIIQ")
_REQ = struct.Struct("<IIQQ")


def save_trace(path: str, batches: Sequence[Sequence[SlsRequest]], table_index: Dict[str, int]) -> int:
    """Writes batches to ``path``; ``table_index`` maps a table name to its index in the flat
    file the baselines read. Returns the bytes written."""
    nt = len(batches[0]) if batches else 0
    with open(path, "wb") as f:
        f.write(_HDR.pack(TRACE_MAGIC, len(batches), nt, 0))
        for reqs in batches:
            if len(reqs) != nt:
                raise ValueError("every batch must have the same number of requests")
            for r in reqs:
                idx = np.ascontiguousarray(np.asarray(r.indices), dtype="<i8").reshape(-1)
                off = np.ascontiguousarray(np.asarray(r.offsets), dtype="<i8").reshape(-1)
                if r.include_last_offset:
                    off = off[:-1]
                if r.per_sample_weights is not None:
                    raise ValueError("trace files carry no per-sample weights")
                if r.mode not in ("sum", "mean"):
                    raise ValueError(f"mode must be 'sum' or 'mean', got {r.mode!r}")
                f.write(_REQ.pack(table_index[r.table], 1 if r.mode == "mean" else 0, off.size, idx.size))
                f.write(off.tobytes())
                f.write(idx.tobytes())
        return f.tell()


def load_trace(path: str, table_names: Sequence[str]) -> List[List[SlsRequest]]:
    """Reads a file written by ``save_trace``; ``table_names[i]`` names table index i."""
    data = np.fromfile(path, dtype=np.uint8)
    buf = memoryview(data)
    magic, nb, nt, _ = _HDR.unpack_from(buf, 0)
    if magic != TRACE_MAGIC:
        raise ValueError(f"{path}: not an SLS trace file (magic {magic!r})")
    pos = _HDR.size
    batches = []
    for _ in range(nb):
        reqs = []
        for _ in range(nt):
            ti, mode, nbags, nidx = _REQ.unpack_from(buf, pos)
            pos += _REQ.size
            off = np.frombuffer(buf, dtype="<i8", count=nbags, offset=pos).astype(np.int64)
            pos += 8 * nbags
            idx = np.frombuffer(buf, dtype="<i8", count=nidx, offset=pos).astype(np.int64)
            pos += 8 * nidx
            reqs.append(SlsRequest(table_names[ti], idx, off, "mean" if mode else "sum"))
        batches.append(reqs)
    if pos != len(buf):
        raise ValueError(f"{path}: {len(buf) - pos} trailing bytes")
    return batches


# ---------------------------------------------------------------------------------------
# Trace diagnostics


def unique_fraction(ids) -> float:
    """Distinct ids / accesses (RecSSD's "unique accesses")."""
    ids = np.asarray(ids).reshape(-1)
    return float(np.unique(ids).size / ids.size) if ids.size else 0.0


def lru_hit_rate(ids, capacity: int) -> float:
    """Hit rate of a fully associative LRU cache of ``capacity`` ids over the stream (exact
    simulation; a Python loop, for diagnostics on up to ~10**6 accesses)."""
    if capacity <= 0:
        return 0.0
    cache: OrderedDict = OrderedDict()
    hits = 0
    ids = np.asarray(ids).reshape(-1).tolist()
    for x in ids:
        if x in cache:
            hits += 1
            cache.move_to_end(x)
        else:
            cache[x] = None
            if len(cache) > capacity:
                cache.popitem(last=False)
    return hits / len(ids) if ids else 0.0


def hot_mass(ids, num_rows: int, fraction: float) -> float:
    """Share of accesses that hit the ``fraction`` most accessed rows of the stream (what an
    ideal static hot-row partition of that size would serve)."""
    ids = np.asarray(ids).reshape(-1)
    if ids.size == 0:
        return 0.0
    counts = np.bincount(ids, minlength=num_rows)
    m = int(round(fraction * num_rows))
    if m <= 0:
        return 0.0
    top = np.partition(counts, num_rows - m)[num_rows - m:] if m < num_rows else counts
    return float(top.sum() / ids.size)
