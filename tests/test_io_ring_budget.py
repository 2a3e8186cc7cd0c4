"""IoRing::ReadRuns keeps at most its byte budget of runs in flight (StoreOptions
read_inflight_bytes), still reads a run larger than the budget, and never stalls — also when
completions are held back (the reverse completion order keeps completed slots until the
ring is idle, the case where a budget counted over held slots would stop issuing).

Each case runs in a child process with a timeout: a stalled read loop spins forever.
"""

from __future__ import annotations

import subprocess
import sys
import textwrap

import pytest

PAGE = 4096

CHILD = textwrap.dedent(
    r'''
    import sys
    from recflash import _native
    from recflash.reader import testing
    path, order = sys.argv[1], sys.argv[2]
    PAGE = 4096
    data = open(path, "rb").read()
    _native._set_io_completion_order(order)
    ring = testing.TestRing(8, 4 * PAGE)
    runs = [(0, 1), (2, 3), (6, 1), (8, 4), (13, 2), (16, 1), (18, 1), (20, 3), (24, 4), (29, 1), (31, 1)]
    for budget_pages in (0, 1, 2, 3, 5, 8, 100):
        for _ in range(2):
            got = ring.read_runs(path, PAGE, runs, max_inflight_bytes=budget_pages * PAGE)
            for (first, count), b in zip(runs, got):
                assert b == data[first * PAGE:(first + count) * PAGE], (budget_pages, first, count)
            peak = ring.peak_inflight_bytes // PAGE
            if budget_pages == 0:
                # no budget: the ring's depth (8 runs) decides
                assert peak > 8, (budget_pages, peak)
            else:
                # within the budget, or a single run larger than it
                assert peak <= max(budget_pages, 4), (budget_pages, peak)
                if budget_pages >= 5:
                    assert peak > 1, (budget_pages, peak)
    assert not ring.broken
    print("ok")
    '''
)


@pytest.fixture
def page_file(tmp_path):
    path = tmp_path / "pages.dat"
    # every page distinct, so a read delivered into the wrong run is caught
    path.write_bytes(b"".join(bytes([i]) * PAGE for i in range(32)))
    return str(path)


@pytest.mark.parametrize("order", ["arrival", "reverse"])
def test_read_runs_keeps_within_its_inflight_budget(page_file, order):
    try:
        r = subprocess.run([sys.executable, "-P", "-c", CHILD, page_file, order], capture_output=True, text=True,
                           timeout=60)
    except subprocess.TimeoutExpired:
        pytest.fail(f"{order}: the read loop stalled under an in-flight byte budget")
    assert r.returncode == 0 and r.stdout.strip() == "ok", r.stdout + r.stderr
