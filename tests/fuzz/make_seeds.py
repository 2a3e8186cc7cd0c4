"""Writes the seed corpora of the fuzz targets into tests/fuzz/corpus/<target>/ from a real
store and real input files (run once; the seeds are committed). Regression inputs found by
fuzzing are added next to them by hand, named regress-*."""

from __future__ import annotations

import io
import os
import shutil
import struct
import sys
import tempfile

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)


def put(target: str, name: str, data: bytes) -> None:
    d = os.path.join(HERE, "corpus", target)
    os.makedirs(d, exist_ok=True)
    with open(os.path.join(d, name), "wb") as f:
        f.write(data)


def main() -> None:
    from recflash.reader import Store, StoreOptions
    from recflash.reader import testing

    work = tempfile.mkdtemp()
    path = os.path.join(work, "s")
    opts = StoreOptions(page_size=4096, write_buffer_bytes=64 << 10)
    s = Store.open(path, opts)
    s.create_feature("i", "int64")
    s.create_feature("b", "binary")
    s.create_feature("e", "fixed_size_list<float32, 4>")
    k = np.arange(0, 900, 3, dtype=np.uint64)
    s.put("i", k, (k * 7).astype(np.int64))
    s.put("b", k, [b"v%d" % x for x in k.tolist()])
    s.put("e", k, np.repeat(k.astype(np.float32)[:, None], 4, axis=1))
    s.flush()
    s.compact(["e"])
    s._s.gather_rows("e", k[:50], True)
    s.delete("i", k[::4])
    s.put("b", k[:20], [b"w" * 40] * 20)
    s.sync()
    wal_dir = os.path.join(path, "wal")
    wal = sorted(os.listdir(wal_dir))[-1]
    wal_bytes = open(os.path.join(wal_dir, wal), "rb").read()
    s.close()
    pages = open(os.path.join(path, "pages.dat"), "rb").read()
    for pid in range(min(4, len(pages) // 4096)):
        page = pages[pid * 4096:(pid + 1) * 4096]
        put("page_fixed", f"page-{pid}", page)
        if pid == 3:
            put("page_raw", "page-3", page)
    put("page_raw", "short", pages[3 * 4096:3 * 4096 + 100])
    # a dictionary-packed int64 page (few distinct ids over a 32-bit range)
    d = os.path.join(work, "dict")
    s = Store.open(d, StoreOptions(page_size=4096, compact_pages=True))
    s.create_feature("c", "int64")
    kd = np.arange(3000, dtype=np.uint64)
    s.put("c", kd, (np.array([7, 2**32 - 1, 123456789])[kd % 3]).astype(np.int64))
    s.close()
    put("page_fixed", "page-dict", open(os.path.join(d, "pages.dat"), "rb").read()[:4096])
    put("wal_file", "wal", wal_bytes)
    # store_wal / wal_file (framed) input format: [type, u16 length, payload]...
    with open(os.path.join(work, "w.log"), "wb") as f:
        f.write(wal_bytes)
    recs = testing._t.read_wal(os.path.join(work, "w.log"))
    framed = b"".join(bytes([t]) + struct.pack("<H", min(len(p), 65535)) + bytes(p)[:65535] for t, p in recs)
    put("store_wal", "records", framed)
    put("wal_file", "records", framed)
    ck = open(os.path.join(path, "CHECKPOINT"), "rb").read()
    put("store_checkpoint", "head", struct.pack("<H", 0) + ck[:64])
    put("store_checkpoint", "middle", struct.pack("<H", len(ck) // 2) + ck[len(ck) // 2:len(ck) // 2 + 64])
    # the feature count (offset 24) claiming 2**32 - 1 features
    put("store_checkpoint", "regress-nf-huge", struct.pack("<H", 24) + b"\xff\xff\xff\xff")
    if os.path.exists(os.path.join(path, "BLOCKSUMS")):
        put("block_sums", "blocksums", open(os.path.join(path, "BLOCKSUMS"), "rb").read())
    put("block_sums", "empty", b"")
    put("meta_values", "feature", bytes([0, 0]) + bytes([1, 0, 0, 0, 0]) + b"i")
    put("meta_values", "page", bytes([1, 0]) + bytes(48))
    put("meta_values", "state", bytes([2, 0]) + struct.pack("<QQIQQ", 10, 1, 3, 100, 4))
    hexes = ["%08x" % x for x in range(26)]
    line = "\t".join(["1"] + [str(i) for i in range(13)] + hexes)
    put("criteo", "lines", ("\n".join([line, line.replace("\t3\t", "\t\t")]) + "\n").encode())
    put("criteo", "nolabel", ("\t".join([str(i) for i in range(13)] + hexes) + "\n").encode())
    # lines past the last 128 bytes take the fast path: signs, long integers, 1..16-digit ids, gaps
    odd = "\t".join(["0", "-17", "007", "123456789012345678", ""] + [str(i) for i in range(9)]
                    + ["68fd1e64", "FFFFFFFF", "1", "", "0123456789abcdef", "123456789"] + hexes[:20])
    put("criteo", "fast", ("\n".join([line, odd, line, odd, line]) + "\n").encode())
    put("hex_ids", "ids", b"deadbeef\n0\n~\nffffffffffffffff\nABCDEF01\nxyz\n")
    put("csv_import", "typed", b"a,b,c\n1,2.5,x\n3,4,y\n,5,\n")
    put("csv_import", "skip", b"s,b\n1,2\n3\n4,5,6\n")
    buf = io.BytesIO()
    pq.write_table(pa.table({"a": pa.array([1, 2, None], pa.int64()), "s": pa.array(["x", None, "z"]),
                             "l": pa.array([[1], [], [2, 3]], pa.list_(pa.int64()))}), buf)
    put("parquet_import", "small", buf.getvalue())
    shutil.rmtree(work)


if __name__ == "__main__":
    main()
