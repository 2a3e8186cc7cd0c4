"""The paper's LSM strategy (READER §2.1.2, §2.2), as the benchmark's `lsm` row.

- The write buffer holds `buffer_items` distinct items; each flush writes ONE append-only file:
  the buffered items sorted by (feature, key), packed `page_size // item_bytes` to a page
  (no page header — the most favourable packing), written with O_DIRECT.
- The old version of an updated item becomes invalid; per-file valid counts are exact (the
  middleware knows where every item's current version lives: a key -> file map).
- After every flush, every file more than half invalid is merged: its valid items are read
  (the whole file, O_DIRECT), all victims' valid items are sorted together by (feature, key)
  and written as new files of at most one buffer batch each; the victims are deleted (the
  file analogue of TRIM).
- A feature read reads, in every live file holding items of the feature, the page range
  holding them, and resolves versions (newest file wins) — benchmarks/csrc/page_reader.cc.

Modes: `io` writes and reads real files; `accounting` runs the identical policy on counts
only (no files, no values), so the paper's sizes fit in DRAM: per file it keeps the item
count per feature, and finds a victim's valid items by scanning the item -> file map.
"""
from __future__ import annotations

import os
import time
from typing import Optional

import numpy as np

from .common import PLAN_EXTENT, AlignedBuffer, plan_header, plan_op, read_direct, write_direct
from .workload import ItemBuffer, Workload


class _File:
    __slots__ = ("fid", "seq", "n", "valid", "cum", "gids", "path", "pages")

    def __init__(self, fid, seq, n, cum, gids, path, pages):
        self.fid, self.seq, self.n, self.valid, self.cum = fid, seq, n, n, cum
        self.gids, self.path, self.pages = gids, path, pages


class LsmStrategy:
    name = "lsm"

    def __init__(self, wl: Workload, mode: str, workdir: Optional[str]):
        self.wl = wl
        self.mode = mode
        self.io = mode == "io"
        self.page = wl.cfg.page_size
        self.ipp = self.page // wl.item_bytes
        self.dir = workdir
        if self.io:
            os.makedirs(workdir, exist_ok=True)
        self.loc = np.full(wl.N, -1, dtype=np.int32)  # item -> file holding its current version
        self.files: dict[int, _File] = {}
        self.next_fid = 0
        self.buf = AlignedBuffer(1 << 20) if self.io else None
        self.phase = "load"
        self.c = {p: dict(files_written=0, pages_written=0, bytes_written=0, merges=0, victims=0,
                          merge_items_moved=0, merge_bytes_read=0, merge_pages_written=0, files_deleted=0)
                  for p in ("load", "update")}
        self.max_live_files = 0

    # -- writing -------------------------------------------------------------------------
    def _write_file(self, gids: np.ndarray, vals: Optional[np.ndarray]) -> _File:
        wl = self.wl
        n = len(gids)
        pages = -(-n // self.ipp)
        fid = self.next_fid
        self.next_fid += 1
        cum = np.searchsorted(gids, wl.off).astype(np.int64)  # items of feature f: cum[f]..cum[f+1]
        path = None
        if self.io:
            nbytes = pages * self.page
            arr = self.buf.array(nbytes)
            arr[:] = 0
            items = arr.reshape(pages, self.page)[:, : self.ipp * wl.item_bytes].reshape(pages * self.ipp,
                                                                                       wl.item_bytes)
            items[:n, :8] = wl.keys[gids].view(np.uint8).reshape(n, 8)
            items[:n, 8:] = vals
            path = os.path.join(self.dir, f"{fid:08d}.lsm")
            write_direct(path, self.buf, nbytes)
        f = _File(fid, fid, n, cum, gids.astype(np.int64) if self.io else None, path, pages)
        self.files[fid] = f
        old = self.loc[gids]
        old = old[old >= 0]
        if len(old):
            dec = np.bincount(old, minlength=self.next_fid)
            for ofid in np.flatnonzero(dec):
                of = self.files.get(int(ofid))
                if of is not None:  # a merge victim is already gone
                    of.valid -= int(dec[ofid])
        self.loc[gids] = fid
        c = self.c[self.phase]
        c["files_written"] += 1
        c["pages_written"] += pages
        c["bytes_written"] += pages * self.page
        self.max_live_files = max(self.max_live_files, len(self.files))
        return f

    def _flush(self, gids: np.ndarray, vals: Optional[np.ndarray]) -> None:
        self._write_file(gids, vals)
        if self.phase == "update":
            self._merge()

    def _merge(self) -> None:
        victims = [f for f in self.files.values() if 2 * f.valid < f.n]
        if not victims:
            return
        c = self.c[self.phase]
        c["merges"] += 1
        c["victims"] += len(victims)
        vids = np.array([f.fid for f in victims], dtype=np.int64)
        if self.io:
            gl, vl = [], []
            for f in victims:
                if f.valid == 0:
                    continue
                data = read_direct(f.path, self.buf, f.pages * self.page)
                c["merge_bytes_read"] += f.pages * self.page
                items = data.reshape(f.pages, self.page)[:, : self.ipp * self.wl.item_bytes].reshape(
                    f.pages * self.ipp, self.wl.item_bytes)[: f.n]
                keep = self.loc[f.gids] == f.fid
                gl.append(f.gids[keep])
                vl.append(items[keep, 8:].copy())
            gids = np.concatenate(gl) if gl else np.zeros(0, np.int64)
            vals = np.concatenate(vl) if vl else np.zeros((0, self.wl.value_bytes), np.uint8)
            order = np.argsort(gids, kind="stable")
            gids, vals = gids[order], vals[order]
        else:
            mask = np.zeros(self.next_fid + 1, dtype=bool)
            mask[vids] = True
            # loc == -1 indexes mask[-1], which is the spare slot (False).
            gids = np.flatnonzero(mask[self.loc])
            vals = None
            c["merge_bytes_read"] += sum(f.pages for f in victims if f.valid) * self.page
        for f in victims:
            del self.files[f.fid]
            if f.path:
                os.unlink(f.path)
        c["files_deleted"] += len(victims)
        cap = self.wl.buffer_items
        before = c["pages_written"]
        for a in range(0, len(gids), cap):
            self._write_file(gids[a:a + cap], vals[a:a + cap] if vals is not None else None)
        c["merge_items_moved"] += len(gids)
        c["merge_pages_written"] += c["pages_written"] - before

    # -- phases --------------------------------------------------------------------------
    def load(self) -> float:
        wl = self.wl
        t = time.perf_counter()
        self.phase = "load"
        buf = ItemBuffer(wl.N, wl.buffer_items, self._flush)
        for f in range(wl.F):
            a, b = int(wl.off[f]), int(wl.off[f + 1])
            buf.add(np.arange(a, b, dtype=np.int64), wl.init_vals[a:b] if self.io else None)
        buf.flush()
        return time.perf_counter() - t

    def update(self) -> float:
        wl = self.wl
        t = time.perf_counter()
        self.phase = "update"
        buf = ItemBuffer(wl.N, wl.buffer_items, self._flush)
        done = 0
        for g, v in wl.iter_updates(values=self.io):
            buf.add(g, v)
            done += len(g)
        buf.flush()
        return time.perf_counter() - t

    # -- reads ---------------------------------------------------------------------------
    def live_files(self) -> list[_File]:
        return sorted(self.files.values(), key=lambda f: f.seq)

    def _counts(self):
        files = self.live_files()
        cum = np.stack([f.cum for f in files])  # files x (F + 1)
        first = cum[:, :-1]
        cnt = cum[:, 1:] - first
        return files, first, cnt

    def pages_per_feature(self) -> np.ndarray:
        _, first, cnt = self._counts()
        last = first + cnt - 1
        pages = np.where(cnt > 0, last // self.ipp - first // self.ipp + 1, 0)
        return pages.sum(axis=0)

    def write_plan(self, reads: np.ndarray, files_txt: str, plan_bin: str) -> None:
        files, first, cnt = self._counts()
        with open(files_txt, "w") as fl:
            for f in files:
                fl.write(f.path + "\n")
        with open(plan_bin, "wb") as out:
            out.write(plan_header(self.page, self.wl.item_bytes, len(reads)))
            per_feature = {}
            for f in np.unique(reads):
                rows = np.flatnonzero(cnt[:, f] > 0)
                ext = np.zeros(len(rows), PLAN_EXTENT)
                ext["file"] = rows
                ext["rank"] = [files[r].seq for r in rows]
                ext["first"] = first[rows, f]
                ext["n"] = cnt[rows, f]
                per_feature[int(f)] = plan_op(int(f), ext)
            for f in reads:
                out.write(per_feature[int(f)])

    def space_bytes(self) -> int:
        return sum(f.pages for f in self.files.values()) * self.page

    def metadata_bytes(self) -> int:
        # Exact validity needs a key -> file map: 8-byte key + 4-byte file id per item (4 bytes
        # with dense keys, an array indexed by key); per live file and feature the first item
        # and count (16 bytes), plus per file its valid count.
        per_item = 4 if self.wl.cfg.keys == "dense" else 12
        return per_item * self.wl.N + len(self.files) * (16 * self.wl.F + 16)

    def stats(self) -> dict:
        return {"live_files": len(self.files), "max_live_files": self.max_live_files,
                "pages_in_use": sum(f.pages for f in self.files.values()),
                "items_on_disk": sum(f.n for f in self.files.values()),
                "load": self.c["load"], "update": self.c["update"]}

    def cleanup(self) -> None:
        for f in self.files.values():
            if f.path and os.path.exists(f.path):
                os.unlink(f.path)
        if self.buf:
            self.buf.close()
