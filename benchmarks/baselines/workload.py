"""The one workload every strategy of the compaction benchmark runs (READER §4.1).

- F features with lognormal sizes (sigma `feature_sigma`), N items in total. Item ids ("gid")
  are global: feature f owns gids off[f] .. off[f+1]-1, and within a feature gid order is key
  order, so sorting by gid is sorting by (feature, key).
- An item is an 8-byte key plus a value of item_bytes - 8 bytes: `int64` for 8-byte values,
  `fixed_size_list<float32, k>` for larger ones.
- Keys: `sparse` (default) = distinct random 64-bit ids per feature (no strategy gains from
  key compression); `dense` = 0 .. n_f - 1.
- Initial load: feature after feature, each in one batch.
- Updates: U existing items, uniform or Zipf (s = 0.99 over item ranks, ranks scattered over
  the items by a multiplicative permutation), in batches of `batch` updates.
- Feature reads: every feature once (random order), then Zipf-weighted (s = 1 over a random
  ranking of the features) repeated reads, `reads` in total.

The updates are generated batch by batch from their own seeded stream, so an accounting run
regenerates exactly the same sequence for every strategy without holding it in memory.
"""
from __future__ import annotations

import dataclasses
import math
from typing import Iterator, Optional

import numpy as np

from .common import item_checksums

ZIPF_UPDATE_S = 0.99
ZIPF_READ_S = 1.0


@dataclasses.dataclass
class WorkloadConfig:
    items: int
    features: int
    item_bytes: int = 16
    updates: int = 0
    update_dist: str = "uniform"
    keys: str = "sparse"
    write_buffer_frac: float = 0.025
    page_size: int = 16384
    reads: int = 0
    feature_sigma: float = 1.0
    batch: int = 0
    seed: int = 42


class Workload:
    def __init__(self, cfg: WorkloadConfig, materialize: bool):
        """materialize: build keys, values and the update stream in memory (io mode)."""
        if cfg.item_bytes < 16 or (cfg.item_bytes - 8) % 4:
            raise ValueError(f"--item-bytes must be 16 or 8 + 4k (k >= 2), got {cfg.item_bytes}")
        if cfg.page_size % 4096 or cfg.page_size < cfg.item_bytes:
            raise ValueError(f"--page-size must be a multiple of 4096, got {cfg.page_size}")
        self.cfg = cfg
        self.item_bytes = cfg.item_bytes
        self.value_bytes = cfg.item_bytes - 8
        self.value_type = ("int64" if self.value_bytes == 8
                           else f"fixed_size_list<float32, {self.value_bytes // 4}>")
        rng = np.random.default_rng([cfg.seed, 1])
        F = cfg.features
        w = rng.lognormal(0.0, cfg.feature_sigma, F)
        sizes = np.maximum(1, np.floor(w / w.sum() * cfg.items)).astype(np.int64)
        sizes[np.argmax(sizes)] += cfg.items - int(sizes.sum())
        if sizes.min() < 1:
            raise ValueError("too few items for the number of features")
        self.sizes = sizes
        self.N = int(sizes.sum())
        self.F = F
        self.off = np.zeros(F + 1, np.int64)
        np.cumsum(sizes, out=self.off[1:])
        self.U = int(cfg.updates)
        self.buffer_bytes = int(cfg.write_buffer_frac * self.N * self.item_bytes)
        self.buffer_items = max(1, self.buffer_bytes // self.item_bytes)
        self.batch = int(cfg.batch) or int(min(65536, max(1024, self.buffer_items // 4)))
        self.reads = self._reads(rng)
        self.keys: Optional[np.ndarray] = None
        self.init_vals: Optional[np.ndarray] = None
        self.upd_gids: Optional[np.ndarray] = None
        self.upd_vals: Optional[np.ndarray] = None
        self.expected: Optional[np.ndarray] = None  # per-feature checksum after the updates
        if materialize:
            self._materialize()

    # -- generation ----------------------------------------------------------------------
    def _reads(self, rng) -> np.ndarray:
        F = self.F
        total = max(F, int(self.cfg.reads))
        first = rng.permutation(F)
        rank_of = rng.permutation(F)  # feature -> Zipf rank
        p = 1.0 / np.power(np.arange(1, F + 1, dtype=np.float64), ZIPF_READ_S)
        p /= p.sum()
        order = np.argsort(rank_of)  # rank r -> feature
        rep = order[rng.choice(F, size=total - F, p=p)]
        return np.concatenate([first, rep]).astype(np.int64)

    def _materialize(self) -> None:
        cfg = self.cfg
        rng = np.random.default_rng([cfg.seed, 2])
        if cfg.keys == "dense":
            self.keys = (np.arange(self.N, dtype=np.int64) - np.repeat(self.off[:-1], self.sizes)).astype(np.uint64)
        else:
            keys = np.empty(self.N, np.uint64)
            for f in range(self.F):
                a, b = self.off[f], self.off[f + 1]
                k = np.unique(rng.integers(0, np.iinfo(np.uint64).max, b - a, dtype=np.uint64))
                while len(k) < b - a:  # a collision in 2^64: draw again
                    k = np.unique(np.concatenate(
                        [k, rng.integers(0, np.iinfo(np.uint64).max, b - a - len(k), dtype=np.uint64)]))
                keys[a:b] = k
            self.keys = keys
        self.init_vals = self.make_values(rng, self.N)
        gids, vals = [], []
        for g, v in self.iter_updates(values=True):
            gids.append(g)
            vals.append(v)
        self.upd_gids = np.concatenate(gids) if gids else np.zeros(0, np.int64)
        self.upd_vals = np.concatenate(vals) if vals else np.zeros((0, self.value_bytes), np.uint8)
        # Final contents: the last update of an item wins.
        final = self.init_vals.copy()
        if self.U:
            rev = self.upd_gids[::-1]
            u, idx = np.unique(rev, return_index=True)
            final[u] = self.upd_vals[self.U - 1 - idx]
        terms = item_checksums(self.keys, final)
        self.expected = np.add.reduceat(terms, self.off[:-1]).astype(np.uint64)
        del final, terms

    def make_values(self, rng, n: int) -> np.ndarray:
        if self.value_bytes == 8:
            return rng.integers(0, np.iinfo(np.int64).max, n, dtype=np.int64).view(np.uint8).reshape(n, 8)
        k = self.value_bytes // 4
        return rng.random((n, k), dtype=np.float32).view(np.uint8).reshape(n, self.value_bytes)

    def iter_updates(self, values: bool) -> Iterator[tuple[np.ndarray, Optional[np.ndarray]]]:
        """(gids int64[b], values uint8[b, V] or None) per batch, the same stream every call."""
        if self.upd_gids is not None:
            for a in range(0, self.U, self.batch):
                b = min(self.U, a + self.batch)
                yield self.upd_gids[a:b], (self.upd_vals[a:b] if values else None)
            return
        rng = np.random.default_rng([self.cfg.seed, 3])
        vrng = np.random.default_rng([self.cfg.seed, 4])
        N = self.N
        zipf = self.cfg.update_dist == "zipf"
        if zipf:
            s = ZIPF_UPDATE_S
            a_mul = _coprime_multiplier(N)
            b_add = int(rng.integers(0, N))
            base = float(N) ** (1.0 - s) - 1.0
        for a in range(0, self.U, self.batch):
            b = min(self.U, a + self.batch)
            if zipf:
                u = rng.random(b - a)
                r = np.floor(np.power(base * u + 1.0, 1.0 / (1.0 - s))).astype(np.int64) - 1
                np.clip(r, 0, N - 1, out=r)
                g = ((r.astype(np.uint64) * np.uint64(a_mul) + np.uint64(b_add)) % np.uint64(N)).astype(np.int64)
            else:
                g = rng.integers(0, N, b - a, dtype=np.int64)
            # Values come from their own stream so accounting runs (values=False) draw the
            # same gids as io runs.
            yield g, (self.make_values(vrng, b - a) if values else None)

    # -- helpers -------------------------------------------------------------------------
    def hash_keys(self, gids: np.ndarray) -> np.ndarray:
        """Keys for accounting runs, computed instead of stored: splitmix64 of the item id (a
        bijection, so keys are distinct; random-looking, so nothing compresses them)."""
        with np.errstate(over="ignore"):
            z = gids.astype(np.uint64) + np.uint64((self.cfg.seed * 0x9E3779B97F4A7C15) % (1 << 64))
            z = (z ^ (z >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
            z = (z ^ (z >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
            z = z ^ (z >> np.uint64(31))
        return np.minimum(z, np.uint64(np.iinfo(np.uint64).max - 1))

    def zero_values(self, n: int):
        if self.value_bytes == 8:
            return np.zeros(n, np.int64)
        return np.zeros((n, self.value_bytes // 4), np.float32)

    def feature_of(self, gids: np.ndarray) -> np.ndarray:
        return np.searchsorted(self.off, gids, side="right") - 1

    def describe(self) -> dict:
        c = self.cfg
        s = self.sizes
        return {
            "items": self.N, "features": self.F, "item_bytes": self.item_bytes,
            "value_bytes": self.value_bytes, "value_type": self.value_type, "keys": c.keys,
            "feature_sizes": {"distribution": f"lognormal(0, {c.feature_sigma})", "min": int(s.min()),
                              "median": float(np.median(s)), "mean": float(s.mean()), "max": int(s.max())},
            "updates": self.U, "update_dist": c.update_dist,
            "update_zipf_s": ZIPF_UPDATE_S if c.update_dist == "zipf" else None,
            "update_batch": self.batch, "write_buffer_frac": c.write_buffer_frac,
            "write_buffer_bytes": self.buffer_bytes, "write_buffer_items": self.buffer_items,
            "page_size": c.page_size, "dataset_bytes": self.N * self.item_bytes,
            "reads": int(len(self.reads)), "reads_first_pass": self.F,
            "reads_repeated_zipf": int(len(self.reads) - self.F), "read_zipf_s": ZIPF_READ_S,
            "seed": c.seed,
        }


def _coprime_multiplier(n: int) -> int:
    a = 2654435761 % n if n > 2 else 1
    while a < 2 or math.gcd(a, n) != 1:
        a += 1
        if a >= n:
            return 1
    return a


class ItemBuffer:
    """A DRAM write buffer of `cap` distinct items (the lsm and opt strategies): an update of an
    item already buffered replaces it in place; a flush happens exactly when the buffer holds
    `cap` distinct items. flush_fn(gids, values_or_None) receives the buffered items with
    duplicates resolved (last wins), sorted by gid."""

    def __init__(self, N: int, cap: int, flush_fn):
        self.cap = cap
        self.flush_fn = flush_fn
        self.in_buf = np.zeros(N, dtype=bool)
        self.count = 0
        self.g: list[np.ndarray] = []
        self.v: list[np.ndarray] = []

    def add(self, gids: np.ndarray, vals: Optional[np.ndarray]) -> None:
        while len(gids):
            room = self.cap - self.count
            _, first = np.unique(gids, return_index=True)
            new = np.zeros(len(gids), dtype=bool)
            new[first] = True
            new &= ~self.in_buf[gids]
            c = np.cumsum(new)
            if c[-1] <= room:
                k = len(gids)
            else:
                k = int(np.searchsorted(c, room + 1))  # gids[:k] hold exactly `room` new items
            take = gids[:k]
            self.g.append(take)
            if vals is not None:
                self.v.append(vals[:k])
            self.in_buf[take] = True
            self.count += int(c[k - 1]) if k else 0
            gids = gids[k:]
            vals = vals[k:] if vals is not None else None
            if self.count >= self.cap:
                self.flush()

    def flush(self) -> None:
        if not self.g:
            return
        g = np.concatenate(self.g)
        rev = g[::-1]
        u, idx = np.unique(rev, return_index=True)
        vals = None
        if self.v:
            v = np.concatenate(self.v)
            vals = v[len(g) - 1 - idx]
        self.in_buf[u] = False
        self.g, self.v, self.count = [], [], 0
        self.flush_fn(u, vals)
