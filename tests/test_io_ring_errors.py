"""IoRing returns with nothing in flight on every error path (io_ring.h's promise), so a ring
that goes back to the pool after an error reads correctly on its next use.

Each scenario runs in a child process with a timeout: a ring with a stale request left in
its queue used to hang (its in-flight count wrapped) or deliver another call's bytes.
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap

import pytest

PAGE = 4096

CHILD = textwrap.dedent(
    r'''
    import errno, sys
    from recflash.reader import testing
    path, scenario = sys.argv[1], sys.argv[2]
    PAGE = 4096
    data = open(path, "rb").read()
    ring = testing.TestRing(4, 2 * PAGE)
    def expect_error(fn, word):
        try:
            fn()
        except RuntimeError as e:
            assert word in str(e), str(e)
        else:
            raise AssertionError("no error")
    if scenario == "oversized_run":
        # run 0 fits, run 1 does not: the call must refuse before queueing anything
        expect_error(lambda: ring.read_runs(path, PAGE, [(0, 1), (1, 3)]), "larger than a ring slot")
    elif scenario == "submit_error":
        testing.arm("ring_submit", nth=1, errno=errno.ENOMEM)
        expect_error(lambda: ring.read_runs(path, PAGE, [(0, 1), (2, 2), (5, 1)]), "io_uring_submit")
        testing.disarm()
    elif scenario == "read_error":
        testing.arm("page_read", nth=1, errno=errno.EIO)
        expect_error(lambda: ring.read_runs(path, PAGE, [(i, 1) for i in range(12)]), "Input/output error")
        testing.disarm()
    assert not ring.broken
    runs = [(0, 1), (1, 2), (3, 1), (4, 2), (6, 1), (7, 1)]
    for _ in range(3):
        got = ring.read_runs(path, PAGE, runs)
        for (first, count), b in zip(runs, got):
            assert b == data[first * PAGE:(first + count) * PAGE], (first, count)
    print("ok")
    '''
)


@pytest.fixture
def page_file(tmp_path):
    path = tmp_path / "pages.dat"
    # every page distinct, so a read delivered into the wrong run is caught
    path.write_bytes(b"".join(bytes([i]) * PAGE for i in range(16)))
    return str(path)


@pytest.mark.parametrize("scenario", ["oversized_run", "submit_error", "read_error"])
def test_ring_reads_correctly_after_an_error(page_file, scenario):
    try:
        r = subprocess.run([sys.executable, "-P", "-c", CHILD, page_file, scenario], capture_output=True, text=True,
                           timeout=60)
    except subprocess.TimeoutExpired:
        pytest.fail(f"{scenario}: the ring hung on its next use (a request of the failed call was left in flight)")
    assert r.returncode == 0 and r.stdout.strip() == "ok", r.stderr
