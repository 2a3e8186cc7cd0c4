"""recflash.ingest: file -> store -> scan round trips for every format, resume after a kill,
bad lines, schema refusal, import rules, Preprocessor -> Batch against a row-by-row
reference, the stats command and the quick benchmark.

The CLI runs as a subprocess where process behaviour matters (kill -9, Ctrl-C, exit codes)
and in-process (typer's CliRunner) elsewhere, to keep the suite fast.
"""

from __future__ import annotations

import gzip
import json
import math
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.csv as pcsv
import pyarrow.parquet as pq
import pytest
from typer.testing import CliRunner

from recflash.cli import app
from recflash.ingest import criteo, synthetic
from recflash.ingest.hexids import parse_hex_column
from recflash.reader import Store, StoreOptions

RECFLASH = str(Path(sys.executable).with_name("recflash"))
REPO = Path(__file__).resolve().parents[1]
SMALL = ["--write-buffer-mb", "8"]


def run_cli(*args: str, cwd: Path | None = None) -> subprocess.CompletedProcess:
    return subprocess.run([RECFLASH, *args], capture_output=True, text=True, cwd=cwd or "/tmp", timeout=300)


def invoke(*args: str):
    return CliRunner().invoke(app, list(args), catch_exceptions=False)


def criteo_reference(path: Path, no_label: bool = False) -> dict[str, dict[int, float | int]]:
    """Row by row, plain Python: feature -> {key: value} for the non-empty fields."""
    names = criteo.layout(39 if no_label else 40, no_label)
    out: dict[str, dict[int, float | int]] = {n: {} for n in names}
    opener = gzip.open if str(path).endswith(".gz") else open
    with opener(path, "rt") as f:
        for key, line in enumerate(f):
            fields = line.rstrip("\n").split("\t")
            for name, field in zip(names, fields):
                if field == "":
                    continue
                if name == "label":
                    out[name][key] = float(field)
                elif name.startswith("I"):
                    out[name][key] = int(field)
                else:
                    out[name][key] = int(field, 16)
    return out


def scan_dict(store: Store, feature: str) -> dict[int, object]:
    t = store.scan(feature)
    return dict(zip(t.column("key").to_pylist(), t.column("value").to_pylist()))


def assert_store_matches(store_path: Path, expected: dict[str, dict[int, object]]) -> None:
    with Store.open(str(store_path)) as s:
        assert set(expected) <= set(s.features())
        for name, exp in expected.items():
            got = scan_dict(s, name)
            assert got == exp, f"feature {name}: {len(got)} items, expected {len(exp)}"


# ---------------------------------------------------------------------------------------------
# hex parsing


def test_hex_parse_matches_python():
    rng = np.random.default_rng(3)
    vals = rng.integers(0, 1 << 32, 5000)
    strs = [f"{v:08x}" if i % 3 else f"{v:08X}" for i, v in enumerate(vals)]
    arr = pa.array(strs)
    got, valid, bad = parse_hex_column(arr)
    assert valid is None and bad is None
    assert got.tolist() == [int(s, 16) for s in strs]
    # nulls, other lengths, a 16-digit value, slices with an offset
    mixed = pa.array(["1f", None, "abcdef0123", "ffffffffffffffff", "0", "12345678", None, "7fffffffffffffff"])
    got, valid, bad = parse_hex_column(mixed.slice(1))
    assert bad is None
    assert valid.tolist() == [False, True, True, True, True, False, True]
    assert got.tolist() == [0xabcdef0123, -1, 0, 0x12345678, 0x7fffffffffffffff]


def _source_columns(path, fast: bool, monkeypatch):
    import recflash.ingest.sources as sources

    if not fast:
        monkeypatch.setattr(sources, "_parse_criteo_block", None)
    src = sources.CriteoSource([str(path)], block_bytes=1 << 16)
    src.prepare()
    out = [(c.n_rows, c.rows_read, c.position, c.columns) for c in src.chunks(None) if c.n_rows]
    monkeypatch.undo()
    return out


def test_fast_criteo_parser_matches_pyarrow(tmp_path, monkeypatch):
    src = tmp_path / "c.tsv"
    synthetic.write_criteo_tsv(src, 3000, seed=7)
    lines = src.read_text().splitlines()
    f = lines[5].split("\t")
    f[1], f[2], f[14] = "-17", "007", f[14].upper()  # negative, leading zeros, upper-case hex
    lines[5] = "\t".join(f)
    lines[9] = "\t".join([""] * 40)  # every field empty
    src.write_text("\n".join(lines))  # no newline after the last line
    fast = _source_columns(src, True, monkeypatch)
    slow = _source_columns(src, False, monkeypatch)
    assert len(fast) == len(slow) > 1
    for (n1, r1, p1, a), (n2, r2, p2, b) in zip(fast, slow):
        assert (n1, r1, p1) == (n2, r2, p2)
        assert a.keys() == b.keys()
        for k in a:
            assert (a[k].valid is None) == (b[k].valid is None), k
            if a[k].valid is not None:
                assert a[k].valid.tolist() == b[k].valid.tolist(), k
            assert a[k].values.dtype == b[k].values.dtype and a[k].values.tolist() == b[k].values.tolist(), k


@pytest.mark.parametrize("odd", ["1\t+5", "1\t5\r", "\n", "1\t1234567890123456789", "41 fields", "39 fields",
                                 "1\t\"5\""])
def test_fast_criteo_parser_leaves_odd_blocks_to_pyarrow(odd):
    from recflash._native import parse_criteo_block

    good = "\t".join(["1", "5"] + [""] * 12 + ["68fd1e64"] + [""] * 25) + "\n"
    assert parse_criteo_block(good.encode(), True) is not None
    if odd.endswith(" fields"):
        line = "\t" * (int(odd.split()[0]) - 1)
    else:
        line = odd + "\t" * (39 - odd.count("\t")) if odd != "\n" else odd
    assert parse_criteo_block((good + line + "\n").encode(), True) is None


@pytest.mark.parametrize("bad_value", ["1234567g", "12 45678", "-1234567", "0123456789abcdef0", "zz", "1234:678"])
def test_hex_parse_flags_bad_values(bad_value):
    arr = pa.array(["0000abcd", bad_value, None, "ffffffff"])
    _, _, bad = parse_hex_column(arr)
    assert bad is not None and bad.tolist() == [1]


# ---------------------------------------------------------------------------------------------
# round trips


@pytest.mark.parametrize("gz", [False, True])
def test_criteo_roundtrip(tmp_path, gz):
    src = tmp_path / ("day.tsv.gz" if gz else "day.tsv")
    synthetic.write_criteo_tsv(src, 6000, seed=5, chunk_rows=1000)
    store = tmp_path / "store"
    r = run_cli("import", "criteo", str(src), "--store", str(store), "--block-mb", "0.1", *SMALL)
    assert r.returncode == 0, r.stderr
    assert "imported 6,000 rows" in r.stdout
    expected = criteo_reference(src)
    assert_store_matches(store, expected)
    with Store.open(str(store)) as s:
        assert s.features() == criteo.STORE_TYPES
        # the synthetic generator's own values survive the text round trip
        t = pa.concat_tables([t for _, t in synthetic.chunks("criteo-kaggle", 6000, seed=5, chunk_rows=1000)])
        for name in ("label", "I2", "I12", "C3", "C22"):
            got = s.scan(name)
            col = t.column(name)
            keep = np.flatnonzero(col.is_valid().to_numpy(zero_copy_only=False))
            assert got.column("key").to_numpy().tolist() == keep.tolist()
            assert got.column("value").to_pylist() == col.take(pa.array(keep)).to_pylist()


def test_criteo_no_label_and_feature_subset(tmp_path):
    src = tmp_path / "test.txt"
    full = tmp_path / "full.tsv"
    synthetic.write_criteo_tsv(full, 500, seed=2)
    with open(full) as f, open(src, "w") as g:
        for line in f:
            g.write(line.split("\t", 1)[1])  # drop the label: Kaggle's test.txt
    store = tmp_path / "store"
    r = invoke("import", "criteo", str(src), "--store", str(store), "-q", *SMALL)
    assert r.exit_code == 2 and "--no-label" in r.output
    assert not store.exists()
    r = invoke("import", "criteo", str(src), "--store", str(store), "--no-label", "--features", "I1,C1,C26", "-q",
               *SMALL)
    assert r.exit_code == 0, r.output
    ref = criteo_reference(src, no_label=True)
    assert_store_matches(store, {k: ref[k] for k in ("I1", "C1", "C26")})
    with Store.open(str(store)) as s:
        assert list(s.features()) == ["I1", "C1", "C26"]


def test_csv_roundtrip(tmp_path):
    n = 3000
    rng = np.random.default_rng(1)
    ids = rng.permutation(10 * n)[:n].astype(np.int64)
    clicks = pa.array(rng.integers(-5, 1000, n), mask=rng.random(n) < 0.2)
    price = pa.array(rng.random(n) * 100, mask=rng.random(n) < 0.1)
    names = pa.array([f"item, \"{i}\"" for i in range(n)])
    table = pa.table({"id": ids, "clicks": clicks, "price": price, "name": names})
    src = tmp_path / "items.csv"
    pcsv.write_csv(table, src)
    store = tmp_path / "store"
    r = invoke("import", "csv", str(src), "--store", str(store), "--key", "id", "--block-mb", "0.02", "-q", *SMALL)
    assert r.exit_code == 0, r.output
    with Store.open(str(store)) as s:
        assert s.features() == {"clicks": "int64", "price": "float32", "name": "binary"}
        exp_clicks = {int(k): v for k, v in zip(ids, clicks.to_pylist()) if v is not None}
        assert scan_dict(s, "clicks") == exp_clicks
        got = scan_dict(s, "price")
        exp = {int(k): v for k, v in zip(ids, price.to_pylist()) if v is not None}
        assert got.keys() == exp.keys()
        assert all(math.isclose(got[k], exp[k], rel_tol=1e-6) for k in exp)
        assert scan_dict(s, "name") == {int(k): v.encode() for k, v in zip(ids, names.to_pylist())}


def _columnar_table(n: int) -> pa.Table:
    rng = np.random.default_rng(11)
    lists = [None if i % 7 == 3 else list(rng.integers(0, 1000, i % 5).tolist()) for i in range(n)]
    flists = [[float(x) for x in rng.random(i % 3)] for i in range(n)]
    emb = pa.FixedSizeListArray.from_arrays(pa.array(rng.random(n * 4).astype(np.float32)), 4)
    return pa.table({
        "uid": pa.array(np.arange(n, dtype=np.uint32) * 3 + 1),
        "age": pa.array(rng.integers(0, 90, n).astype(np.int16), mask=rng.random(n) < 0.3),
        "score": pa.array(rng.random(n)),
        "genres": pa.array(lists, type=pa.list_(pa.int32())),
        "weights": pa.array(flists, type=pa.large_list(pa.float64())),
        "emb": emb,
        "city": pa.array([["paris", "rome", None, "oslo"][i % 4] for i in range(n)]).dictionary_encode(),
        "flag": pa.array([i % 2 == 0 for i in range(n)]),
    })


def _check_columnar(store_path: Path, table: pa.Table) -> None:
    keys = table.column("uid").to_pylist()
    with Store.open(str(store_path)) as s:
        assert s.features() == {"age": "int64", "score": "float32", "genres": "list<int64>",
                                "weights": "list<float32>", "emb": "fixed_size_list<float32, 4>",
                                "city": "binary", "flag": "int64"}
        assert scan_dict(s, "age") == {k: v for k, v in zip(keys, table.column("age").to_pylist()) if v is not None}
        score = scan_dict(s, "score")
        assert all(abs(score[k] - v) < 1e-6 for k, v in zip(keys, table.column("score").to_pylist()))
        assert scan_dict(s, "genres") == {k: v for k, v in zip(keys, table.column("genres").to_pylist())
                                          if v is not None}
        w = scan_dict(s, "weights")
        assert all(np.allclose(w[k], v) for k, v in zip(keys, table.column("weights").to_pylist()))
        e = scan_dict(s, "emb")
        assert all(np.allclose(e[k], v) for k, v in zip(keys, table.column("emb").to_pylist()))
        assert scan_dict(s, "city") == {k: v.encode() for k, v in zip(keys, table.column("city").to_pylist())
                                        if v is not None}
        assert scan_dict(s, "flag") == {k: int(v) for k, v in zip(keys, table.column("flag").to_pylist())}


def test_parquet_roundtrip(tmp_path):
    table = _columnar_table(5000)
    src = tmp_path / "part.parquet"
    pq.write_table(table, src, row_group_size=1200)
    store = tmp_path / "store"
    r = invoke("import", "parquet", str(src), "--store", str(store), "--key", "uid", "-q", *SMALL)
    assert r.exit_code == 0, r.output
    _check_columnar(store, table)


@pytest.mark.parametrize("fmt", ["file", "stream"])
def test_arrow_roundtrip(tmp_path, fmt):
    table = _columnar_table(3000)
    src = tmp_path / f"data.{fmt}.arrow"
    with pa.OSFile(str(src), "wb") as sink:
        w = pa.ipc.new_file(sink, table.schema) if fmt == "file" else pa.ipc.new_stream(sink, table.schema)
        for b in table.to_batches(max_chunksize=700):
            w.write_batch(b)
        w.close()
    store = tmp_path / "store"
    r = invoke("import", "arrow", str(src), "--store", str(store), "--key", "uid", "-q", *SMALL)
    assert r.exit_code == 0, r.output
    _check_columnar(store, table)


def test_parquet_row_numbers_and_unsupported_types(tmp_path):
    t = pa.table({"a": pa.array(np.arange(100)), "s": pa.array([{"x": 1}] * 100)})
    src = tmp_path / "t.parquet"
    pq.write_table(t, src)
    store = tmp_path / "store"
    r = invoke("import", "parquet", str(src), "--store", str(store), "-q", *SMALL)
    assert r.exit_code == 2 and "s (struct" in r.output and "--features" in r.output
    assert not store.exists()
    r = invoke("import", "parquet", str(src), "--store", str(store), "--features", "a", "--key-offset", "1000", "-q",
               *SMALL)
    assert r.exit_code == 0, r.output
    assert_store_matches(store, {"a": {1000 + i: i for i in range(100)}})


def test_synthetic_presets(tmp_path):
    store = tmp_path / "store"
    r = invoke("import", "synthetic", "--store", str(store), "--preset", "criteo-kaggle", "--rows", "5000",
               "--seed", "9", "-q", *SMALL)
    assert r.exit_code == 0, r.output
    t = pa.concat_tables([t for _, t in synthetic.chunks("criteo-kaggle", 5000, seed=9)])
    with Store.open(str(store)) as s:
        for name in criteo.FEATURE_NAMES:
            col = t.column(name)
            exp = {i: v for i, v in enumerate(col.to_pylist()) if v is not None}
            assert scan_dict(s, name) == exp, name
        # Zipf: the most frequent id of a high-cardinality feature is far above uniform
        c3 = s.scan("C3").column("value").to_numpy()
        _, counts = np.unique(c3, return_counts=True)
        assert counts.max() > 50
    store2 = tmp_path / "zipf"
    r = invoke("import", "synthetic", "--store", str(store2), "--preset", "zipf", "--rows", "3000", "-q", *SMALL)
    assert r.exit_code == 0, r.output
    t = pa.concat_tables([t for _, t in synthetic.chunks("zipf", 3000)])
    with Store.open(str(store2)) as s:
        assert s.features()["m1"] == "list<int64>"
        assert scan_dict(s, "m2") == dict(enumerate(t.column("m2").to_pylist()))
        assert scan_dict(s, "s1") == dict(enumerate(t.column("s1").to_pylist()))


# ---------------------------------------------------------------------------------------------
# resume


def _journal(store: Path) -> dict | None:
    d = store / "imports"
    if not d.is_dir():
        return None
    files = [f for f in d.iterdir() if f.suffix == ".json"]
    if not files:
        return None
    try:
        return json.loads(files[0].read_text())
    except ValueError:
        return None


def _start_and_stop(cmd: list[str], store: Path, sig: int) -> tuple[subprocess.Popen, str]:
    # A shell that started pytest in the background may have left SIGINT ignored, and the
    # child would inherit that: give it the default disposition, as a terminal's Ctrl-C sees.
    p = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd="/tmp",
                         preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    deadline = time.time() + 60
    while time.time() < deadline:
        j = _journal(store)
        if j and j.get("position") and j["rows"] > 0:
            break
        if p.poll() is not None:
            break
        time.sleep(0.005)
    assert p.poll() is None, "the import finished before it could be interrupted; make the input larger"
    p.send_signal(sig)
    _, err = p.communicate(timeout=120)
    return p, err


@pytest.mark.parametrize("sig", [signal.SIGKILL, signal.SIGINT])
def test_resume_after_interruption(tmp_path, sig):
    src = tmp_path / "big.tsv"
    # Large enough that an import still has most of its chunks ahead when the first one is
    # durable (the C++ parser imports 120 k rows in well under a second).
    rows = 300_000
    synthetic.write_criteo_tsv(src, rows, seed=4)
    store = tmp_path / "store"
    cmd = [RECFLASH, "import", "criteo", str(src), "--store", str(store), "--block-mb", "0.25",
           "--write-buffer-mb", "4", "-q"]
    p, err = _start_and_stop(cmd, store, sig)
    if sig == signal.SIGKILL:
        assert p.returncode == -signal.SIGKILL
    else:
        assert p.returncode == 130, err
        assert "run the same command again to resume" in err
    j = _journal(store)
    assert j["status"] == "running" and 0 < j["rows"] < rows
    done_before = j["rows"]
    r = subprocess.run(cmd, capture_output=True, text=True, cwd="/tmp", timeout=300)
    assert r.returncode == 0, r.stderr
    assert "resumed an interrupted import" in r.stdout
    imported_now = int(r.stdout.split("imported ")[1].split(" rows")[0].replace(",", ""))
    assert imported_now == rows - done_before  # continued after the last durable chunk
    expected = criteo_reference(src)
    assert_store_matches(store, expected)
    with Store.open(str(store)) as s:
        st = s.stats()
        for name in ("label", "I1", "C5"):
            assert st["features"][name]["items"] == len(expected[name])  # nothing duplicated
    assert _journal(store)["status"] == "done"
    again = subprocess.run(cmd, capture_output=True, text=True, cwd="/tmp", timeout=120)
    assert again.returncode == 0 and "nothing to do" in again.stdout


def test_resume_refuses_changed_file(tmp_path):
    src = tmp_path / "d.tsv"
    synthetic.write_criteo_tsv(src, 2000, seed=1)
    store = tmp_path / "store"
    from recflash.ingest.importer import ImportOptions, run_import
    from recflash.ingest.journal import Journal
    from recflash.ingest.sources import CriteoSource

    res = run_import(CriteoSource([str(src)], block_bytes=64 << 10), str(store), ImportOptions(write_buffer_mb=8))
    j = Journal(str(store), res.job)
    state = j.load()
    state["status"] = "running"  # pretend it was interrupted half-way
    state["position"] = {"file": 0, "offset": 1000, "line": 5}
    j.save(state)
    with open(src, "a") as f:
        f.write(open(src).readline())
    r = invoke("import", "criteo", str(src), "--store", str(store), "--block-mb", "0.0625", "-q", *SMALL)
    assert r.exit_code == 2 and "changed since" in r.output and "--restart" in r.output


# ---------------------------------------------------------------------------------------------
# bad input


def _bad_tsv(tmp_path: Path) -> tuple[Path, list[str]]:
    src = tmp_path / "bad.tsv"
    synthetic.write_criteo_tsv(src, 400, seed=8)
    lines = src.read_text().splitlines(keepends=True)
    f = lines[6].split("\t")
    lines[6] = "\t".join(f[:30]) + "\n"  # line 7: 30 fields
    f = lines[11].split("\t")
    f[3] = "12x"  # line 12: I3 not an integer
    lines[11] = "\t".join(f)
    f = lines[19].split("\t")
    f[20] = "zz0000zz"  # line 20: C7 not hex
    lines[19] = "\t".join(f)
    src.write_text("".join(lines))
    return src, lines


def test_bad_lines_error_names_file_line_column_reason(tmp_path):
    src, _ = _bad_tsv(tmp_path)
    store = tmp_path / "store"
    r = run_cli("import", "criteo", str(src), "--store", str(store), "-q", *SMALL)
    assert r.returncode == 2
    assert f"{src}:7" in r.stderr and "expected 40 fields, got 30" in r.stderr
    assert "--on-bad-lines skip" in r.stderr
    # the bad lines one at a time: fix line 7, then line 12 is reported, then line 20
    lines = src.read_text().splitlines(keepends=True)
    good = tmp_path / "good.tsv"
    synthetic.write_criteo_tsv(good, 400, seed=8)
    lines[6] = good.read_text().splitlines(keepends=True)[6]
    src.write_text("".join(lines))
    r = run_cli("import", "criteo", str(src), "--store", str(store), "--restart", "-q", *SMALL)
    assert r.returncode == 2
    assert f"{src}:12" in r.stderr and "column I3" in r.stderr and "12x" in r.stderr
    lines[11] = good.read_text().splitlines(keepends=True)[11]
    src.write_text("".join(lines))
    r = run_cli("import", "criteo", str(src), "--store", str(store), "--restart", "-q", *SMALL)
    assert r.returncode == 2
    assert f"{src}:20" in r.stderr and "column C7" in r.stderr and "zz0000zz" in r.stderr


def test_bad_lines_skip_counts_and_samples(tmp_path):
    src, lines = _bad_tsv(tmp_path)
    store = tmp_path / "store"
    r = invoke("import", "criteo", str(src), "--store", str(store), "--on-bad-lines", "skip", "--block-mb", "0.01",
               "-q", *SMALL)
    assert r.exit_code == 0, r.output
    assert "imported 397 rows" in r.output and "skipped 3 bad line(s)" in r.output
    out = " ".join(r.output.split())
    assert f"{src}:7: expected 40 fields, got 30" in out
    assert f"{src}:12: column I3" in out
    assert f"{src}:20: column C7: not a hexadecimal id: 'zz0000zz'" in out
    good = [ln for i, ln in enumerate(lines) if i not in (6, 11, 19)]
    ref_file = tmp_path / "ref.tsv"
    ref_file.write_text("".join(good))
    assert_store_matches(store, criteo_reference(ref_file))  # keys stay dense: 0..396


def test_wrong_schema_refused_before_anything_is_written(tmp_path):
    src = tmp_path / "narrow.tsv"
    full = tmp_path / "full.tsv"
    synthetic.write_criteo_tsv(full, 50, seed=1)
    src.write_text("".join("\t".join(ln.split("\t")[:38]) + "\n" for ln in full.read_text().splitlines()))
    store = tmp_path / "store"
    r = run_cli("import", "criteo", str(full), str(src), "--store", str(store), "-q")
    assert r.returncode == 2
    assert f"{src}:1: 38 tab-separated field(s); the Criteo layout has 40" in " ".join(r.stderr.split())
    assert not store.exists()  # not even created
    # an existing store with a feature of another type: refused, nothing written
    with Store.open(str(store), StoreOptions(write_buffer_bytes=1 << 20)) as s:
        s.create_feature("C1", "binary")
    r = run_cli("import", "criteo", str(full), "--store", str(store), "-q")
    assert r.returncode == 2 and "C1 is binary" in r.stderr
    with Store.open(str(store)) as s:
        assert list(s.features()) == ["C1"]
        assert s.scan("C1").num_rows == 0
    assert not (store / "imports").exists()


def test_missing_file_and_bad_options(tmp_path):
    r = run_cli("import", "criteo", str(tmp_path / "nope.tsv"), "--store", str(tmp_path / "s"))
    assert r.returncode == 2 and "no such file" in r.stderr
    r = run_cli("import", "csv", str(tmp_path / "nope.csv"), "--store", str(tmp_path / "s"), "--types", "a")
    assert r.returncode == 2
    assert not (tmp_path / "s").exists()


def test_internal_failure_exit_code(tmp_path, monkeypatch):
    import recflash.ingest.importer as importer

    def boom(*a, **k):
        raise RuntimeError("simulated bug")

    monkeypatch.setattr(importer, "run_import", boom)
    r = CliRunner().invoke(app, ["import", "synthetic", "--store", str(tmp_path / "s"), "--rows", "10"])
    assert r.exit_code == 1 and "internal error" in r.output


# ---------------------------------------------------------------------------------------------
# existing data: upsert, append


def test_upsert_append_and_refusal(tmp_path):
    store = tmp_path / "store"
    a = tmp_path / "a.csv"
    pcsv.write_csv(pa.table({"x": pa.array(np.arange(10)), "y": pa.array(np.arange(10) * 2.0 + 0.25)}), a)
    r = invoke("import", "csv", str(a), "--store", str(store), "-q", *SMALL)
    assert r.exit_code == 0, r.output
    b = tmp_path / "b.csv"
    pcsv.write_csv(pa.table({"x": pa.array(np.arange(100, 105)), "y": pa.array([None, 1.5, None, 2.5, 3.5])}), b)
    r = invoke("import", "csv", str(b), "--store", str(store), "-q", *SMALL)
    assert r.exit_code == 2 and "--upsert" in r.output and "--append" in r.output
    # --append: keys 10..14
    r = invoke("import", "csv", str(b), "--store", str(store), "--append", "-q", *SMALL)
    assert r.exit_code == 0, r.output
    assert "keys 10..14" in r.output
    # --upsert with row numbers from 0: replaces x and y of keys 0..4, nulls leave y alone
    r = invoke("import", "csv", str(b), "--store", str(store), "--upsert", "-q", *SMALL)
    assert r.exit_code == 0, r.output
    with Store.open(str(store)) as s:
        x = scan_dict(s, "x")
        y = scan_dict(s, "y")
    assert [x[k] for k in range(15)] == [100, 101, 102, 103, 104, 5, 6, 7, 8, 9, 100, 101, 102, 103, 104]
    assert [y[k] for k in range(5)] == [0.25, 1.5, 4.25, 2.5, 3.5]
    assert sorted(y) == [0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 11, 13, 14]


# ---------------------------------------------------------------------------------------------
# preprocessing


def _reference_batch(table: pa.Table, dense, sparse, label, sizes, sparse_fill, hash_fn=None):
    """Plain Python, row by row. A missing id is sparse_fill (None: nothing); a missing list is
    an empty bag."""
    rows = table.to_pylist()
    is_list = {f: pa.types.is_list(table.schema.field(f).type) for f in sparse}
    dense_rows, labels = [], []
    per_feature_lengths = {f: [] for f in sparse}
    per_feature_values = {f: [] for f in sparse}
    for row in rows:
        dense_rows.append([0.0 if row[d] is None else math.log(1.0 + max(float(row[d]), 0.0)) for d in dense])
        labels.append(0.0 if row[label] is None else float(row[label]))
        for f in sparse:
            v = row[f]
            if isinstance(v, list):
                ids = v
            elif v is None and is_list[f]:
                ids = []
            elif v is None:
                ids = [] if sparse_fill is None else [sparse_fill]
            else:
                ids = [v]
            if hash_fn is not None:
                ids = [hash_fn(i) % sizes[f] for i in ids]
            elif sizes:
                ids = [i % sizes[f] for i in ids]
            per_feature_lengths[f].append(len(ids))
            per_feature_values[f].extend(ids)
    values = [v for f in sparse for v in per_feature_values[f]]
    lengths = [n for f in sparse for n in per_feature_lengths[f]]
    return dense_rows, values, lengths, labels


def _splitmix(x: int) -> int:
    m = (1 << 64) - 1
    z = (x + 0x9E3779B97F4A7C15) & m
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & m
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & m
    return z ^ (z >> 31)


@pytest.fixture(scope="module")
def criteo_store(tmp_path_factory):
    d = tmp_path_factory.mktemp("prep")
    src = d / "day.tsv"
    synthetic.write_criteo_tsv(src, 3000, seed=13)
    store = d / "store"
    r = run_cli("import", "criteo", str(src), "--store", str(store), "-q", *SMALL)
    assert r.returncode == 0, r.stderr
    return store


@pytest.mark.parametrize("hash_ids,sparse_fill", [(False, 0), (False, None), (True, 0)])
def test_preprocessor_matches_row_by_row_reference(criteo_store, hash_ids, sparse_fill):
    import torch
    from torchrec.datasets.utils import Batch
    from torchrec.sparse.jagged_tensor import KeyedJaggedTensor

    from recflash.ingest import Preprocessor

    sizes = {c: 1000 + 37 * i for i, c in enumerate(criteo.CAT_NAMES)}
    p = Preprocessor.criteo(table_sizes=sizes, hash_ids=hash_ids, sparse_fill=sparse_fill)
    with Store.open(str(criteo_store)) as s:
        table = s.scan_many(p.features, key_range=(100, 1100))
    batch = p(table)
    assert isinstance(batch, Batch) and isinstance(batch.sparse_features, KeyedJaggedTensor)
    dense, values, lengths, labels = _reference_batch(table, criteo.INT_NAMES, criteo.CAT_NAMES, "label", sizes,
                                                      sparse_fill, _splitmix if hash_ids else None)
    assert batch.dense_features.dtype == torch.float32 and tuple(batch.dense_features.shape) == (1000, 13)
    np.testing.assert_allclose(batch.dense_features.numpy(), np.array(dense, dtype=np.float64), rtol=1e-6)
    kjt = batch.sparse_features
    assert kjt.keys() == criteo.CAT_NAMES and kjt.stride() == 1000
    assert kjt.values().tolist() == values
    assert kjt.lengths().tolist() == lengths
    assert batch.labels.tolist() == labels
    # per-feature view agrees too
    jt = kjt["C22"]
    assert jt.lengths().tolist() == lengths[21 * 1000:22 * 1000]


def test_preprocessor_list_features_and_batches(tmp_path):
    from recflash.ingest import Preprocessor
    from recflash.ingest.preprocess import scan_joined

    store = tmp_path / "store"
    r = invoke("import", "synthetic", "--store", str(store), "--preset", "zipf", "--rows", "2500", "-q", *SMALL)
    assert r.exit_code == 0, r.output
    with Store.open(str(store)) as s:
        s.delete("s2", np.arange(0, 2500, 3, dtype=np.uint64))  # gaps
        s.delete("m1", np.arange(1, 2500, 5, dtype=np.uint64))
        p = Preprocessor(dense=["d1", "d2", "d3", "d4"], sparse=["s1", "s2", "m1", "m2"], label="label",
                         table_sizes=5000)
        table = s.scan_many(p.features)
        assert scan_joined(s, p.features).equals(table)
        assert scan_joined(s, p.features, key_range=(10, 400)).equals(s.scan_many(p.features, key_range=(10, 400)))
        dense, values, lengths, labels = _reference_batch(table, p.dense, p.sparse, "label", p.table_sizes, 0)
        batch = p(table)
        np.testing.assert_allclose(batch.dense_features.numpy(), np.array(dense), rtol=1e-6)
        assert batch.sparse_features.values().tolist() == values
        assert batch.sparse_features.lengths().tolist() == lengths
        # batches() over the store: same rows, in key order, in batches of 1000 (+ the rest)
        got = list(p.batches(s, batch_size=1000, scan_keys=700))
        assert [b.labels.shape[0] for b in got] == [1000, 1000, 500]
        allv = np.concatenate([b.dense_features.numpy() for b in got])
        np.testing.assert_allclose(allv, np.array(dense), rtol=1e-6)
        m1 = [b.sparse_features["m1"].lengths() for b in got]
        assert np.concatenate([x.numpy() for x in m1]).tolist() == lengths[2 * 2500:3 * 2500]
        # an empty window in the middle is skipped
        s.delete("label", np.arange(0, 2500, dtype=np.uint64))
        for f in p.features[1:]:
            s.delete(f, np.arange(1000, 2000, dtype=np.uint64))
        got = list(p.batches(s, batch_size=512, scan_keys=300))
        assert sum(b.labels.shape[0] for b in got) == 1500


# ---------------------------------------------------------------------------------------------
# stats


def test_stats_command(criteo_store, tmp_path):
    r = invoke("stats", "--store", str(criteo_store), "--json")
    assert r.exit_code == 0, r.output
    d = json.loads(r.output)
    assert d["features"]["C1"]["items"] == 3000 and d["features"]["C1"]["type"] == "int64"
    assert d["features"]["label"]["fragmentation"] >= 1.0
    assert "space_amplification" in d["store_stats"]
    assert d["imports"][0]["status"] == "done" and d["imports"][0]["rows"] == 3000
    png = tmp_path / "stats.png"
    r = invoke("stats", "--store", str(criteo_store), "--plot", str(png), "--scan")
    assert r.exit_code == 0, r.output
    assert png.stat().st_size > 10_000 and png.read_bytes()[:4] == b"\x89PNG"
    out = " ".join(r.output.split())
    assert "fragmentation degree" in out and "read (scan of every feature)" in out and "imports" in out
    r = invoke("stats", "--store", str(tmp_path / "none"))
    assert r.exit_code == 2


def test_stats_takes_the_store_like_info(criteo_store, tmp_path):
    """`recflash stats STORE` has the shape of `recflash info STORE`; --store stays an alias.
    Store errors exit 2 in both commands."""
    by_arg = invoke("stats", str(criteo_store), "--json")
    assert by_arg.exit_code == 0, by_arg.output
    by_opt = invoke("stats", "-s", str(criteo_store), "--json")
    assert json.loads(by_arg.output)["features"] == json.loads(by_opt.output)["features"]
    assert invoke("stats").exit_code == 2
    assert invoke("stats", str(criteo_store), "--store", str(tmp_path)).exit_code == 2
    for cmd in ("stats", "info"):
        r = invoke(cmd, str(tmp_path / "none"))
        assert r.exit_code == 2 and "no store at" in " ".join(r.output.split()), (cmd, r.output)


# ---------------------------------------------------------------------------------------------
# the quick benchmark


def test_benchmark_quick(tmp_path):
    out = tmp_path / "ingest.json"
    t0 = time.time()
    r = subprocess.run([sys.executable, str(REPO / "benchmarks" / "ingest.py"), "--quick", "--json", str(out),
                        "--dir", str(tmp_path / "work")], capture_output=True, text=True, cwd="/tmp", timeout=180)
    assert r.returncode == 0, r.stdout + r.stderr
    assert time.time() - t0 < 60
    d = json.loads(out.read_text())
    imp = d["import"]
    assert imp["rows"] > 0 and imp["tsv_bytes"] > 0 and imp["mb_per_s"] > 0 and imp["rows_per_s"] > 0
    assert imp["peak_rss_mb"] > 0 and imp["verified"] is True
    assert d["preprocess"]["samples_per_s"] > 0 and d["preprocess"]["end_to_end_samples_per_s"] > 0
    assert set(d["targets"]) >= {"import_mb_per_s", "peak_rss_mb", "preprocess_samples_per_s"}
    assert not (tmp_path / "work").exists() or not any((tmp_path / "work").iterdir())
