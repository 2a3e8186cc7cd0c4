"""The read-optimal strategy (READER §4.1, "OPT"), as the benchmark's `opt` rows.

Every feature owns a contiguous run of pages (features never share a page), items packed
`page_size // item_bytes` to a page in key order. Updates are in place, by read-modify-write
of the page holding the item:
- `default` (the paper's way): one page written per updated item — update amplification
  page_size / item_bytes. Doing that for real would write U pages (e.g. 2 x 4 M x 16 KiB =
  128 GiB), so it is counted, not executed.
- `batched-rmw`: the same write buffer as every strategy; at each flush every page holding a
  buffered item is read, patched and written back once. This is executed for real (O_DIRECT,
  runs of adjacent pages in requests of up to 1 MiB) and is what leaves the file in its final
  state; the per-item variant would leave the identical file.
Feature reads: the feature's pages, sequentially, O_DIRECT (benchmarks/csrc/page_reader.cc).
"""
from __future__ import annotations

import os
import time
from typing import Optional

import numpy as np

from .common import O_DIRECT, PLAN_EXTENT, AlignedBuffer, plan_header, plan_op, write_direct
from .workload import ItemBuffer, Workload

RMW_IO_BYTES = 1 << 20


class OptStrategy:
    name = "opt"

    def __init__(self, wl: Workload, mode: str, workdir: Optional[str]):
        self.wl = wl
        self.io = mode == "io"
        self.page = wl.cfg.page_size
        self.ipp = self.page // wl.item_bytes
        self.fpages = -(-wl.sizes // self.ipp)
        self.base = np.zeros(wl.F + 1, np.int64)
        np.cumsum(self.fpages, out=self.base[1:])
        self.total_pages = int(self.base[-1])
        self.path = os.path.join(workdir, "opt.dat") if self.io else None
        if self.io:
            os.makedirs(workdir, exist_ok=True)
        self.buf = AlignedBuffer(RMW_IO_BYTES) if self.io else None
        self.c = dict(flushes=0, dirty_pages=0, batched_bytes_written=0, batched_bytes_read=0,
                      per_item_pages=0, per_item_bytes_written=0, updates=0, load_bytes_written=0)

    def position(self, gids: np.ndarray) -> np.ndarray:
        """Item slot (page * ipp + index in page) of every gid."""
        f = self.wl.feature_of(gids)
        return self.base[f] * self.ipp + (gids - self.wl.off[f])

    def load(self) -> float:
        wl = self.wl
        t = time.perf_counter()
        nbytes = self.total_pages * self.page
        if self.io:
            # Written in chunks of whole features (at most ~64 MiB each, bigger features alone).
            f0 = 0
            while f0 < wl.F:
                f1 = f0 + 1
                while f1 < wl.F and (self.base[f1 + 1] - self.base[f0]) * self.page <= 64 << 20:
                    f1 += 1
                p0, p1 = int(self.base[f0]), int(self.base[f1])
                n = (p1 - p0) * self.page
                arr = self.buf.array(n)
                arr[:] = 0
                items = arr.reshape(p1 - p0, self.page)[:, : self.ipp * wl.item_bytes].reshape(
                    (p1 - p0) * self.ipp, wl.item_bytes)
                g = np.arange(wl.off[f0], wl.off[f1], dtype=np.int64)
                pos = self.position(g) - p0 * self.ipp
                items[pos, :8] = wl.keys[g].view(np.uint8).reshape(-1, 8)
                items[pos, 8:] = wl.init_vals[g]
                write_direct(self.path, self.buf, n, offset=p0 * self.page, sync=False)
                f0 = f1
            fd = os.open(self.path, os.O_WRONLY)
            os.fdatasync(fd)
            os.close(fd)
        self.c["load_bytes_written"] = nbytes
        return time.perf_counter() - t

    def _flush(self, gids: np.ndarray, vals: Optional[np.ndarray]) -> None:
        pos = self.position(gids)  # gids sorted -> pos sorted (gid order = layout order)
        pages = pos // self.ipp
        dirty = np.unique(pages)
        self.c["flushes"] += 1
        self.c["dirty_pages"] += len(dirty)
        self.c["batched_bytes_written"] += len(dirty) * self.page
        self.c["batched_bytes_read"] += len(dirty) * self.page
        if not self.io:
            return
        # Runs of adjacent dirty pages, cut into requests of at most RMW_IO_BYTES.
        max_pages = RMW_IO_BYTES // self.page
        brk = np.flatnonzero(np.diff(dirty) != 1) + 1
        starts = np.concatenate([[0], brk])
        ends = np.concatenate([brk, [len(dirty)]])
        fd = os.open(self.path, os.O_RDWR | O_DIRECT)
        try:
            V = self.wl.value_bytes
            col = np.arange(V)
            for s, e in zip(starts, ends):
                p = int(dirty[s])
                last = int(dirty[e - 1])
                while p <= last:
                    q = min(last + 1, p + max_pages)
                    nbytes = (q - p) * self.page
                    arr = self.buf.array(nbytes)
                    mv = self.buf.view(nbytes)
                    if os.preadv(fd, [mv], p * self.page) != nbytes:
                        raise OSError(f"short read of {self.path}")
                    a = np.searchsorted(pages, p)
                    b = np.searchsorted(pages, q)
                    off = (pages[a:b] - p) * self.page + (pos[a:b] % self.ipp) * self.wl.item_bytes + 8
                    arr[off[:, None] + col] = vals[a:b]
                    if os.pwrite(fd, mv, p * self.page) != nbytes:
                        raise OSError(f"short write of {self.path}")
                    p = q
            os.fdatasync(fd)
        finally:
            os.close(fd)

    def update(self) -> float:
        wl = self.wl
        t = time.perf_counter()
        buf = ItemBuffer(wl.N, wl.buffer_items, self._flush)
        for g, v in wl.iter_updates(values=self.io):
            buf.add(g, v)
            self.c["updates"] += len(g)
        buf.flush()
        self.c["per_item_pages"] = self.c["updates"]
        self.c["per_item_bytes_written"] = self.c["updates"] * self.page
        return time.perf_counter() - t

    def pages_per_feature(self) -> np.ndarray:
        return self.fpages.copy()

    def write_plan(self, reads: np.ndarray, files_txt: str, plan_bin: str) -> None:
        with open(files_txt, "w") as fl:
            fl.write(self.path + "\n")
        with open(plan_bin, "wb") as out:
            out.write(plan_header(self.page, self.wl.item_bytes, len(reads)))
            for f in reads:
                f = int(f)
                out.write(plan_op(f, np.array([(0, 0, int(self.base[f]) * self.ipp, int(self.wl.sizes[f]))], PLAN_EXTENT)))

    def space_bytes(self) -> int:
        return self.total_pages * self.page

    def metadata_bytes(self) -> int:
        # Per feature its first page and item count (16 bytes); per page its smallest key
        # (8 bytes) to find the page of an updated key (dense keys: computed, nothing).
        per_page = 0 if self.wl.cfg.keys == "dense" else 8
        return 16 * self.wl.F + per_page * self.total_pages

    def stats(self) -> dict:
        return {"pages": self.total_pages, **self.c}

    def cleanup(self) -> None:
        if self.path and os.path.exists(self.path):
            os.unlink(self.path)
        if self.buf:
            self.buf.close()
