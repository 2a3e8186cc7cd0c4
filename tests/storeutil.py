"""Shared helpers for the recflash store tests: value generators per type, an in-memory model
of the store, and comparison helpers that check a scan / get / scan_many result against it.

Kept free of pytest imports so that subprocess scripts could reuse the value conventions.
"""

from __future__ import annotations

import bisect
from typing import Any, Iterable

import numpy as np
import pyarrow as pa

U64_MAX = 2**64 - 1
#: the largest key random test data uses: every uint64 is a key (test_max_uint64_key)
KEY_MAX = U64_MAX
PAGE_SIZE = 4096

FSL_TYPE = "fixed_size_list<float32, 8>"
FSL_DIM = 8

#: every value type of the contract, in the contract's spelling
TYPES = ["float32", "int64", "list<int64>", "list<float32>", FSL_TYPE, "binary"]

ARROW_TYPES = {
    "float32": pa.float32(),
    "int64": pa.int64(),
    "list<int64>": pa.list_(pa.int64()),
    "list<float32>": pa.list_(pa.float32()),
    FSL_TYPE: pa.list_(pa.float32(), FSL_DIM),
    "binary": pa.binary(),
}

#: safe feature names for each type (used by several test files)
TYPE_FEATURE = {
    "float32": "rating",
    "int64": "count",
    "list<int64>": "history",
    "list<float32>": "weights",
    FSL_TYPE: "emb8",
    "binary": "blob",
}


def small_options(**kw):
    """Small StoreOptions so flushes, the pinner and the merger run with little data."""
    from recflash.reader import StoreOptions

    args = dict(page_size=PAGE_SIZE, write_buffer_bytes=256 << 10)
    args.update(kw)
    return StoreOptions(**args)


# ----------------------------------------------------------------------------------------------
# key and value generation


def gen_keys(rng: np.random.Generator, n: int, space: int = 1000, skew: bool = False,
             edges: bool = True) -> np.ndarray:
    """n uint64 keys (duplicates possible) from [0, space), uniform or Zipf-like; with `edges`
    a few of them are replaced by 0, KEY_MAX and large random keys."""
    if skew:
        keys = (rng.zipf(1.3, n) - 1) % space
    else:
        keys = rng.integers(0, space, n)
    keys = keys.astype(np.uint64)
    if edges and n >= 4:
        for _ in range(int(rng.integers(0, 3))):
            i = int(rng.integers(0, n))
            choice = int(rng.integers(0, 3))
            if choice == 0:
                keys[i] = 0
            elif choice == 1:
                keys[i] = np.uint64(KEY_MAX)
            else:
                keys[i] = rng.integers(0, KEY_MAX, dtype=np.uint64, endpoint=True)
    return keys


def gen_values(type_str: str, n: int, rng: np.random.Generator, as_arrow: bool = False):
    """Values for `n` keys of a feature of type `type_str`.

    Returns (input accepted by Store.put, python list of the values as Arrow's to_pylist()
    would return them after a float32 round trip)."""
    if type_str == "float32":
        v = (rng.standard_normal(n) * 100).astype(np.float32)
        py = [float(x) for x in v]
        if as_arrow:
            return pa.array(v, type=pa.float32()), py
        # float64 input is cast to float32; these float64 values are exactly float32 values
        return (v.astype(np.float64) if rng.integers(0, 2) else v), py
    if type_str == "int64":
        v = rng.integers(-(2**62), 2**62, n, dtype=np.int64)
        if n >= 2 and rng.integers(0, 4) == 0:
            v[0] = np.iinfo(np.int64).min
            v[-1] = np.iinfo(np.int64).max
        py = [int(x) for x in v]
        return (pa.array(v, type=pa.int64()) if as_arrow else v), py
    if type_str == "list<int64>":
        lens = rng.integers(0, 9, n)
        py = [[int(x) for x in rng.integers(-(2**40), 2**40, int(m))] for m in lens]
        return (pa.array(py, type=pa.list_(pa.int64())) if as_arrow else py), py
    if type_str == "list<float32>":
        lens = rng.integers(0, 9, n)
        py = [[float(x) for x in (rng.standard_normal(int(m)) * 10).astype(np.float32)]
              for m in lens]
        return (pa.array(py, type=pa.list_(pa.float32())) if as_arrow else py), py
    if type_str == FSL_TYPE:
        v = (rng.standard_normal((n, FSL_DIM)) * 10).astype(np.float32)
        py = [[float(x) for x in row] for row in v]
        if as_arrow:
            return pa.FixedSizeListArray.from_arrays(pa.array(v.reshape(-1), pa.float32()),
                                                     FSL_DIM), py
        return v, py
    if type_str == "binary":
        lens = rng.integers(0, 65, n)
        py = [rng.bytes(int(m)) for m in lens]
        return (pa.array(py, type=pa.binary()) if as_arrow else py), py
    raise AssertionError(type_str)


# ----------------------------------------------------------------------------------------------
# the model


class Model:
    """Dict model of the store: feature -> {key: python value}."""

    def __init__(self) -> None:
        self.types: dict[str, str] = {}
        self.data: dict[str, dict[int, Any]] = {}

    def create(self, feature: str, type_str: str) -> None:
        self.types.setdefault(feature, type_str)
        self.data.setdefault(feature, {})

    def put(self, feature: str, keys: Iterable[int], values: list) -> None:
        d = self.data[feature]
        for k, v in zip((int(k) for k in keys), values):
            d[k] = v  # later duplicates overwrite earlier ones: last wins

    def delete(self, feature: str, keys: Iterable[int]) -> None:
        d = self.data[feature]
        for k in keys:
            d.pop(int(k), None)

    def items(self, feature: str, key_range=None) -> tuple[list[int], list]:
        d = self.data[feature]
        ks = sorted(d)
        if key_range is not None:
            lo, hi = key_range
            ks = ks[bisect.bisect_left(ks, lo):bisect.bisect_left(ks, hi)]
        return ks, [d[k] for k in ks]

    def live_items(self) -> int:
        return sum(len(d) for d in self.data.values())


# ----------------------------------------------------------------------------------------------
# comparisons


def _fmt_diff(what: str, got: list, want: list, limit: int = 5) -> str:
    lines = [f"{what}: got {len(got)} entries, expected {len(want)}"]
    n = 0
    for i, (g, w) in enumerate(zip(got, want)):
        if g != w:
            lines.append(f"  [{i}] got {g!r:.120} expected {w!r:.120}")
            n += 1
            if n >= limit:
                break
    return "\n".join(lines)


def check_scan(table: pa.Table, model: Model, feature: str, key_range=None) -> None:
    """A scan result must equal the model: schema, ascending unique keys, values."""
    assert isinstance(table, pa.Table), type(table)
    assert table.column_names == ["key", "value"], table.column_names
    assert table.schema.field("key").type == pa.uint64(), table.schema
    want_type = ARROW_TYPES[model.types[feature]]
    assert table.schema.field("value").type == want_type, (table.schema, want_type)
    keys = table.column("key").to_pylist()
    vals = table.column("value").to_pylist()
    want_keys, want_vals = model.items(feature, key_range)
    assert all(a < b for a, b in zip(keys, keys[1:])), \
        f"scan({feature!r}) keys not strictly ascending"
    assert keys == want_keys, _fmt_diff(f"scan({feature!r}, {key_range}) keys", keys, want_keys)
    assert vals == want_vals, _fmt_diff(f"scan({feature!r}, {key_range}) values", vals,
                                        want_vals)
    assert table.column("value").null_count == 0


def check_get(arr, model: Model, feature: str, keys) -> None:
    if isinstance(arr, pa.ChunkedArray):
        arr = arr.combine_chunks()
    assert isinstance(arr, pa.Array), type(arr)
    assert arr.type == ARROW_TYPES[model.types[feature]], arr.type
    assert len(arr) == len(keys)
    d = model.data[feature]
    want = [d.get(int(k)) for k in keys]
    got = arr.to_pylist()
    assert got == want, _fmt_diff(f"get({feature!r})", got, want)


def check_scan_many(table: pa.Table, model: Model, features: list[str], key_range=None) -> None:
    assert isinstance(table, pa.Table), type(table)
    assert table.column_names == ["key", *features], table.column_names
    assert table.schema.field("key").type == pa.uint64()
    for f in features:
        assert table.schema.field(f).type == ARROW_TYPES[model.types[f]], (f, table.schema)
    keyset: set[int] = set()
    for f in features:
        keyset.update(model.items(f, key_range)[0])
    want_keys = sorted(keyset)
    keys = table.column("key").to_pylist()
    assert keys == want_keys, _fmt_diff(f"scan_many({features}, {key_range}) keys", keys,
                                        want_keys)
    for f in features:
        d = model.data[f]
        got = table.column(f).to_pylist()
        want = [d.get(k) for k in want_keys]
        assert got == want, _fmt_diff(f"scan_many column {f!r}", got, want)


def stats_number_fields(d: dict) -> dict[str, float]:
    """The numeric (non-bool) entries of a stats sub-dict, flattened one level."""
    out: dict[str, float] = {}
    for k, v in d.items():
        if isinstance(v, bool):
            continue
        if isinstance(v, (int, float)):
            out[k] = v
        elif isinstance(v, dict):
            for k2, v2 in v.items():
                if isinstance(v2, (int, float)) and not isinstance(v2, bool):
                    out[f"{k}.{k2}"] = v2
    return out


def open_held_at(path, options, point: str, change):
    """``Store.open(path, options)`` in a thread, held at the engine's pause point ``point``
    while ``change()`` runs (e.g. a writer moving the store on). Returns the store (or the
    exception the open raised) and how many WAL files were opened for replay meanwhile (by the
    open, its own reopens, and anything ``change()`` opened)."""
    import threading

    from recflash.reader import Store, testing

    out = {}

    def run():
        try:
            out["store"] = Store.open(path, options)
        except BaseException as e:  # noqa: BLE001 - returned to the test
            out["err"] = e

    testing.disarm()
    testing.arm("wal_open", nth=1 << 40)  # counts the WAL files opened for replay, fails none
    testing.arm_pause_point(point)
    t = threading.Thread(target=run)
    try:
        t.start()
        assert testing.wait_paused(30), f"the open never reached {point}"
        change()
    finally:
        testing.release_pause()
        t.join(60)
        opened = testing.calls("wal_open")
        testing.disarm()
    assert not t.is_alive()
    return out.get("store", out.get("err")), opened
