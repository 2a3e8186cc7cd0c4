"""Bad input to the ``recflash`` commands: a clear one-line message naming what and where,
exit code 2, no traceback; and import jobs reported as they are (changed inputs of completed
imports, failed / interrupted / killed jobs, values too long for a page).

Like tests/test_ingest.py: in-process through typer's CliRunner, a subprocess where the
process matters (a traceback on stderr, Ctrl-C)."""

from __future__ import annotations

import json
import re
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from typer.testing import CliRunner

from recflash.cli import app
from recflash.reader import Store

RECFLASH = str(Path(sys.executable).with_name("recflash"))
REPO = Path(__file__).resolve().parents[1]
SMALL = ["--write-buffer-mb", "8"]


def invoke(*args: str):
    r = CliRunner().invoke(app, [str(a) for a in args], catch_exceptions=False)
    r.flat = " ".join(r.output.split())  # rich may wrap long lines
    return r


def run_cli(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([RECFLASH, *map(str, args)], capture_output=True, text=True, cwd="/tmp", timeout=120)


def _jobs(store: Path) -> list[dict]:
    r = invoke("stats", store, "--json")
    assert r.exit_code == 0, r.output
    return json.loads(r.output)["imports"]


def _journal_files(store: Path) -> list[Path]:
    return sorted((store / "imports").glob("*.json"))


# -- 1: messages are formatted ----------------------------------------------------------------


def test_key_column_of_text_names_the_column(tmp_path):
    src = tmp_path / "good.csv"
    src.write_text("a,c\n1,x\n2,y\n")
    r = invoke("import", "csv", src, "--store", tmp_path / "s", "--key", "c", "-q")
    assert r.exit_code == 2
    assert "key column 'c'" in r.flat and "--types c=int64" in r.flat and "{self" not in r.flat


# -- 2, 3: numeric options of import synthetic -------------------------------------------------


@pytest.mark.parametrize("option, value, message", [
    ("--vocab", "0", "--vocab must be > 0"),
    ("--vocab", "-3", "--vocab must be > 0"),
    ("--vocab", str(1 << 70), "--vocab must be <= 2**62"),
    ("--seed", "-1", "--seed must be >= 0"),
    ("--rows", "-1", "--rows must be >= 0"),
    ("--rows", str(1 << 64), "--rows must be < 2**63"),
    ("--alpha", "0", "--alpha must be > 0"),
    ("--alpha", "inf", "--alpha must be a finite number"),
    ("--write-buffer-mb", "nan", "--write-buffer-mb must be a number > 0"),
    ("--write-buffer-mb", "inf", "--write-buffer-mb must be a number > 0"),
])
def test_synthetic_numeric_options_are_checked(tmp_path, option, value, message):
    store = tmp_path / "s"
    r = invoke("import", "synthetic", "--preset", "zipf", "--store", store, "-n", "10", option, value, "-q")
    assert r.exit_code == 2, r.output
    assert message in r.flat
    assert not store.exists()


def test_negative_seed_is_bad_input_not_a_traceback(tmp_path):
    r = run_cli("import", "synthetic", "--store", tmp_path / "s", "--seed", "-1", "-n", "10")
    assert r.returncode == 2
    assert "--seed must be >= 0" in r.stderr
    assert "Traceback" not in r.stderr and "internal error" not in r.stderr


def test_vocab_of_one_gives_only_id_zero(tmp_path):
    store = tmp_path / "s"
    r = invoke("import", "synthetic", "--preset", "zipf", "--vocab", "1", "--store", store, "-n", "300", "-q")
    assert r.exit_code == 0, r.output
    with Store.open(str(store)) as s:
        assert set(s.scan("s1").column("value").to_pylist()) == {0}
        assert {v for lst in s.scan("m1").column("value").to_pylist() for v in lst} == {0}


# -- 4: output paths ---------------------------------------------------------------------------


@pytest.fixture
def small_store(tmp_path):
    store = tmp_path / "small"
    r = invoke("import", "synthetic", "--preset", "zipf", "--store", store, "-n", "100", "-q")
    assert r.exit_code == 0, r.output
    return store


def test_stats_plot_path_checked_first(small_store, tmp_path):
    for path, message in [
        ("/nonexistent/p.png", "--plot /nonexistent/p.png: the directory /nonexistent does not exist"),
        (tmp_path, "is a directory"),
        (tmp_path / "p.xyz", "cannot write .xyz files"),
    ]:
        r = invoke("stats", small_store, "--plot", path)
        assert r.exit_code == 2, r.output
        assert message in r.flat
    r = run_cli("stats", small_store, "--plot", "/nonexistent/p.png")
    assert r.returncode == 2 and "Traceback" not in r.stderr and "/nonexistent" in r.stderr


def test_summary_json_path_checked_before_the_import(tmp_path):
    src = tmp_path / "good.csv"
    src.write_text("a,b\n1,2\n")
    store = tmp_path / "sj"
    r = run_cli("import", "csv", src, "--store", store, "-q", "--summary-json", "/nonexistent/x.json")
    assert r.returncode == 2
    assert "--summary-json /nonexistent/x.json: the directory /nonexistent does not exist" in r.stderr
    assert "Traceback" not in r.stderr
    assert not store.exists()  # nothing was imported


def test_summary_json_write_failure_is_one_line(tmp_path, monkeypatch):
    src = tmp_path / "good.csv"
    src.write_text("a,b\n1,2\n")
    real = Path.write_text

    def write_text(self, *a, **k):
        if self.name == "x.json":
            raise OSError(28, "No space left on device")
        return real(self, *a, **k)

    monkeypatch.setattr(Path, "write_text", write_text)
    r = invoke("import", "csv", src, "--store", tmp_path / "s", "-q", "--summary-json", tmp_path / "x.json")
    assert r.exit_code == 2
    assert "imported 1 rows" in r.flat  # the import's own outcome came first
    assert "--summary-json" in r.flat and "No space left on device" in r.flat and "unaffected" in r.flat


# -- 5: a store path that cannot be a directory -----------------------------------------------


def test_store_under_a_regular_file(tmp_path):
    f = tmp_path / "good.csv"
    f.write_text("a\n1\n")
    r = run_cli("import", "synthetic", "--store", f / "x", "-n", "10")
    assert r.returncode == 2
    assert f"--store {f / 'x'}: cannot create the store directory: {f} is not a directory" in r.stderr
    assert "IOError_" not in r.stderr and "Traceback" not in r.stderr
    r = invoke("import", "synthetic", "--store", f, "-n", "10")
    assert r.exit_code == 2 and "exists and is not a directory" in r.flat


def test_store_errors_drop_the_underscore_and_the_importer_says_bad_input(tmp_path):
    from recflash.ingest.errors import BadInputError
    from recflash.ingest.importer import ImportOptions, run_import
    from recflash.ingest.sources import SyntheticSource
    from recflash.reader._cli import error_text
    from recflash.reader.errors import IOError_

    assert error_text(IOError_("cannot create store directory")) == "IOError: cannot create store directory"
    f = tmp_path / "file"
    f.write_text("x")
    with pytest.raises(BadInputError, match="cannot create store directory"):
        run_import(SyntheticSource("zipf", 10), str(f / "x"), ImportOptions())


# -- 6: a completed import whose input changed ------------------------------------------------


def test_completed_import_refuses_a_changed_input(tmp_path):
    src = tmp_path / "r1.csv"
    src.write_text("a,b\n1,2\n3,4\n")
    store = tmp_path / "rr"
    cmd = ["import", "csv", src, "--store", store, "-q", *SMALL]
    assert invoke(*cmd).exit_code == 0
    r = invoke(*cmd)
    assert r.exit_code == 0 and "nothing to do" in r.flat and "--upsert --restart" in r.flat
    with open(src, "a") as f:
        f.write("5,6\n")
    r = invoke(*cmd)
    assert r.exit_code == 2
    assert f"{src} changed since the completed import read it (size 12 -> 16" in r.flat
    assert "--upsert --restart" in r.flat and "nothing to do" not in r.flat
    # --restart alone is refused (the features hold items) and keeps the completed job's record
    r = invoke(*cmd, "--restart")
    assert r.exit_code == 2 and "--upsert" in r.flat
    assert [j["status"] for j in _jobs(store)] == ["done"]
    # the options the message names import it again, over the same keys
    r = invoke(*cmd, "--upsert", "--restart")
    assert r.exit_code == 0 and "keys 0..2" in r.flat, r.output
    with Store.open(str(store)) as s:
        assert s.scan("a").column("value").to_pylist() == [1, 3, 5]
    # an --append job gets its keys back with --key-offset
    b = tmp_path / "b.csv"
    b.write_text("a,b\n7,8\n")
    assert invoke("import", "csv", b, "--store", store, "--append", "-q").exit_code == 0
    with open(b, "a") as f:
        f.write("9,10\n")
    r = invoke("import", "csv", b, "--store", store, "--append", "-q")
    assert r.exit_code == 2 and "--upsert --restart --key-offset 3 instead of --append" in r.flat


def test_completed_import_refuses_same_size_content_with_its_mtime_set_back(tmp_path):
    """Size and mtime alone would call this file unchanged and report "nothing to do" over the
    old values; the inode change time (no user call sets it back) tells."""
    import os

    src = tmp_path / "r2.csv"
    src.write_text("a,b\n1,2\n3,4\n")
    store = tmp_path / "rs"
    cmd = ["import", "csv", src, "--store", store, "-q", *SMALL]
    assert invoke(*cmd).exit_code == 0
    st = os.stat(src)
    time.sleep(0.01)  # (a coarse clock must still see the inode change)
    src.write_text("a,b\n7,2\n3,9\n")  # same size
    os.utime(src, ns=(st.st_atime_ns, st.st_mtime_ns))
    assert os.stat(src).st_size == st.st_size and os.stat(src).st_mtime_ns == st.st_mtime_ns
    r = invoke(*cmd)
    assert r.exit_code == 2 and "nothing to do" not in r.flat
    assert f"{src} changed since the completed import read it (same size and modification time, but its inode " \
           "changed since" in r.flat, r.flat
    assert "--upsert --restart" in r.flat
    # a file replaced by another of the same size and mtime
    other = tmp_path / "r2.new"
    other.write_text("a,b\n5,2\n3,9\n")
    os.utime(other, ns=(st.st_atime_ns, st.st_mtime_ns))
    os.replace(other, src)
    r = invoke(*cmd)
    assert r.exit_code == 2 and "another file (inode) by that name" in r.flat, r.flat
    # a journal of an earlier version records no inode fields: size and mtime decide, as they did
    (jf,) = list((store / "imports").glob("*.json"))
    state = json.loads(jf.read_text())
    for f in state["files"]:
        f.pop("ino"), f.pop("ctime_ns")
    jf.write_text(json.dumps(state))
    r = invoke(*cmd)
    assert r.exit_code == 0 and "nothing to do" in r.flat
    with Store.open(str(store)) as s:
        assert s.scan("a").column("value").to_pylist() == [1, 3]  # (the old values: what that check missed)


def test_input_changed_during_the_import_is_not_recorded_as_what_was_read(tmp_path):
    """The journal records the input as the run began reading it: a file changed while the
    import ran (here its permissions, after its rows were written) must not enter the journal
    as the identity those rows came from, or the rerun would report "nothing to do"."""
    import os

    from recflash.ingest.importer import ImportOptions, run_import
    from recflash.ingest.sources import CsvSource

    src = tmp_path / "r3.csv"
    src.write_text("a,b\n1,2\n3,4\n")
    store = tmp_path / "rd"
    changed = []

    def progress(_):
        if not changed:
            time.sleep(0.01)
            os.chmod(src, 0o600)
            changed.append(True)

    res = run_import(CsvSource([str(src)]), str(store), ImportOptions(write_buffer_mb=8), progress=progress)
    assert res.status == "done" and changed
    r = invoke("import", "csv", src, "--store", store, "-q", *SMALL)
    assert r.exit_code == 2 and "changed since the completed import read it" in r.flat, r.flat


# -- 7: job status in recflash stats -----------------------------------------------------------


def test_failed_import_is_shown_failed(tmp_path):
    src = tmp_path / "bad.csv"
    src.write_text("a,b\n1,2\n3,x\n")
    store = tmp_path / "fb"
    r = invoke("import", "csv", src, "--store", store, "--types", "b=int64", "-q")
    assert r.exit_code == 2 and f"{src}:3" in r.flat
    (job,) = _jobs(store)
    assert job["status"] == "failed" and job["journal_status"] == "running"
    assert f"{src}:3" in job["error"]
    r = invoke("stats", store)
    assert re.search(r"csv\s+failed", r.output)


def _wait_for_rows(p: subprocess.Popen, store: Path) -> None:
    deadline = time.time() + 60
    while time.time() < deadline and p.poll() is None:
        files = _journal_files(store) if (store / "imports").is_dir() else []
        if files:
            try:
                if json.loads(files[0].read_text())["rows"] > 0:
                    return
            except ValueError:
                pass
        time.sleep(0.005)
    raise AssertionError("the import finished before it could be interrupted")


def test_interrupted_killed_and_foreign_jobs(tmp_path):
    store = tmp_path / "fi"
    cmd = [RECFLASH, "import", "synthetic", "--store", str(store), "-n", "3000000", "--write-buffer-mb", "2", "-q"]
    p = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd="/tmp",
                         preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    _wait_for_rows(p, store)
    assert _jobs(store)[0]["status"] == "running"  # its process is alive
    p.send_signal(signal.SIGINT)
    _, err = p.communicate(timeout=120)
    assert p.returncode == 130, err
    (job,) = _jobs(store)
    assert job["status"] == "interrupted" and job["ended"] == "interrupted"

    # what a kill -9 leaves: a "running" journal whose process is gone
    (path,) = _journal_files(store)
    state = json.loads(path.read_text())
    dead = subprocess.Popen(["true"])
    dead.wait()
    path.write_text(json.dumps(dict(state, ended=None, pid=dead.pid, pid_start=None)))
    assert _jobs(store)[0]["status"] == "killed"
    assert re.search(r"synthetic\s+killed", invoke("stats", store).output)
    path.write_text(json.dumps(dict(state, ended=None, host="another-host")))
    assert _jobs(store)[0]["status"] == "running or interrupted"
    state.pop("pid"), state.pop("host")  # a journal of a recflash that did not record processes
    path.write_text(json.dumps(dict(state, ended=None)))
    assert _jobs(store)[0]["status"] == "running or interrupted"


def test_killed_job_whose_process_is_not_reaped_yet(tmp_path):
    """kill -9 of an import whose parent has not waited for it yet (a zombie: its pid still
    answers kill(pid, 0)) is a killed job, not a running one."""
    from recflash.ingest.journal import job_status, process_identity

    victim = subprocess.Popen(["sleep", "60"])
    try:
        alive = {"status": "running", "ended": None, "pid": victim.pid, "host": process_identity()["host"],
                 "pid_start": None}
        assert job_status(alive) == "running"
        victim.kill()
        deadline = time.time() + 10
        while time.time() < deadline:  # not reaped: no wait() until the state is read
            with open(f"/proc/{victim.pid}/stat", "rb") as f:
                if f.read().rsplit(b")", 1)[1].split()[0] == b"Z":
                    break
            time.sleep(0.01)
        else:
            raise AssertionError("the killed process never became a zombie")
        assert job_status(alive) == "killed"
    finally:
        victim.kill()
        victim.wait()


# -- 8: a value longer than a page ---------------------------------------------------------------


@pytest.fixture
def wide_csv(tmp_path):
    src = tmp_path / "wide.csv"
    src.write_text("t,n\nab,1\n" + "x" * 20000 + ",2\ncd,3\n")  # line 3: a 20,000-byte field
    return src


def test_value_longer_than_a_page_names_file_and_line(wide_csv, tmp_path):
    r = invoke("import", "csv", wide_csv, "--store", tmp_path / "w", "-q")
    assert r.exit_code == 2
    assert f"{wide_csv}:3: column t: a value of 20000 bytes" in r.flat and "--page-size" in r.flat
    r = invoke("import", "csv", wide_csv, "--store", tmp_path / "w2", "--on-bad-lines", "skip", "-q")
    assert r.exit_code == 0, r.output
    assert "imported 2 rows" in r.flat and f"{wide_csv}:3: column t" in r.flat
    with Store.open(str(tmp_path / "w2")) as s:
        assert s.scan("t").column("value").to_pylist() == [b"ab", b"cd"]
    pq.write_table(pa.table({"t": ["a", "b" * 20000], "l": [[1], [2] * 3000]}), tmp_path / "w.parquet")
    r = invoke("import", "parquet", tmp_path / "w.parquet", "--store", tmp_path / "w3", "-q")
    assert r.exit_code == 2 and "w.parquet: row 1: column" in r.flat
    assert invoke("import", "csv", wide_csv, "--store", tmp_path / "w4", "--page-size", "32768",
                  "-q").exit_code == 0


def test_value_the_engine_refuses_names_the_lines(wide_csv, tmp_path, monkeypatch):
    import recflash.ingest.importer as importer

    monkeypatch.setattr(importer, "max_value_bytes", lambda page_size: None)  # only the engine checks
    r = invoke("import", "csv", wide_csv, "--store", tmp_path / "w", "--on-bad-lines", "skip", "-q")
    assert r.exit_code == 2
    assert f"{wide_csv}: lines 2..4: feature 't': the value of key 1 is 20000 bytes" in r.flat
    assert "--on-bad-lines does not apply" in r.flat


# -- 9, 10: documentation ----------------------------------------------------------------------


def test_readme_api_tour_runs_as_written(tmp_path, monkeypatch):
    text = (REPO / "README.md").read_text()
    tour = text[text.index("## API tour"):]
    code = tour[tour.index("```python\n") + len("```python\n"):]
    code = code[:code.index("```")]
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    exec(compile(code, "README.md (API tour)", "exec"), {})


def test_criteo_help_names_the_compressions():
    r = invoke("import", "criteo", "--help")
    assert r.exit_code == 0 and ".zst" in r.flat and ".gz" in r.flat


def test_info_and_stats_counts_are_exact_or_marked_as_bounds(tmp_path):
    """After updates no merge has dropped, a read-only open counts replaced records too. With
    the CHECKPOINT of a clean close the counts are exact; without it they are printed as bounds
    (≤), and --exact counts by reading the pages."""
    import numpy as np

    from recflash.reader import StoreOptions

    path = str(tmp_path / "s")
    s = Store.open(path, StoreOptions(write_buffer_bytes=1 << 20, merger_enabled=False))
    s.create_feature("f", "float32")
    k = np.arange(100_000, dtype=np.uint64)
    s.put("f", k, np.zeros(len(k), np.float32))
    s.flush()
    for r in range(3):
        s.put("f", k[r::7], np.ones(len(k[r::7]), np.float32))
        s.flush()
    s.close()

    def live(args):
        r = invoke(*args)
        assert r.exit_code == 0, r.output
        return r.output

    out = live(["info", path])
    assert re.search(r"live items\s+100,000", out) and "≤" not in out, out
    Path(path, "CHECKPOINT").unlink()  # as after a crash: no counts to load
    out = live(["info", path])
    assert re.search(r"live items\s+≤ 142,858", out) and "--exact" in out, out
    out = live(["stats", path])
    assert "≤ 142,858 items" in out, out
    for cmd in (["info", path, "--exact"], ["stats", path, "--exact"]):
        out = live(cmd)
        assert "100,000" in out and "≤" not in out, out
    import os
    import subprocess
    import sys

    # after a crash, deletes replayed from the WAL are in no page yet: shown beside the counts
    subprocess.run([sys.executable, "-c", "import os, numpy as np; from recflash.reader import Store; "
                    f"s = Store.open({path!r}); s.delete('f', np.arange(10, dtype=np.uint64)); s.sync(); "
                    "os._exit(0)"], check=True)
    out = live(["info", path, "--exact"])
    assert re.search(r"buffered writes \(WAL, not flushed\)\s+10 — not in the item counts", out), out
    assert os.path.exists(path)
    with Store.open(path, read_only=True) as r:
        assert r.stats()["items_exact"] is False
        assert r.build_key_index(read_pages=False) is False  # no checkpoint to take it from
        assert r.build_key_index() is True and r.stats()["live_items"] == 100_000


def test_every_command_has_a_one_line_summary():
    """The command lists of ``recflash --help`` (and of its groups) show each command's first
    docstring paragraph with its line breaks: it must be one line, the rest after a blank line."""
    import inspect

    import typer

    def walk(cmd, path):
        for name, sub in (getattr(cmd, "commands", None) or {}).items():  # a group
            yield from walk(sub, path + [name])
        if path:
            yield " ".join(path), cmd

    seen = []
    for name, cmd in walk(typer.main.get_command(app), []):
        first = inspect.cleandoc(cmd.short_help or cmd.help or "").split("\n\n")[0]
        assert first and "\n" not in first, f"recflash {name}: summary spans lines: {first!r}"
        seen.append(name)
    assert {"info", "stats", "import criteo", "ndp serve"} <= set(seen)
