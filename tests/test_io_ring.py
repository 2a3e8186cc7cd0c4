"""IoRing (reader/csrc/io_ring.h), each case in a child process with a timeout (a stalled
read loop or a hung ring spins forever):

- it returns with nothing in flight on every error path (io_ring.h's promise), so a ring that
  goes back to the pool after an error reads correctly on its next use (a ring with a stale
  request left in its queue used to hang, its in-flight count wrapped, or deliver another
  call's bytes);
- ReadRuns keeps at most its byte budget of runs in flight (StoreOptions
  read_inflight_bytes), tapering to 3/4 of what is left near the end (a call that fits the
  budget: never below four reads), still reads a run larger than the budget, and never
  stalls — also when completions are held back (the reverse completion order keeps completed
  slots until the ring is idle).
"""

from __future__ import annotations

import subprocess
import sys
import textwrap

import pytest

PAGE = 4096

ERRORS_CHILD = textwrap.dedent(
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
    elif scenario == "submit_error_after_first":
        # a batch of three or more submits its first read alone: the submit of the rest fails
        # with that one in flight
        testing.arm("ring_submit", nth=2, errno=errno.ENOMEM)
        expect_error(lambda: ring.read_runs(path, PAGE, [(0, 1), (2, 2), (5, 1), (7, 1)]), "io_uring_submit")
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

BUDGET_CHILD = textwrap.dedent(
    r'''
    import sys
    from recflash import _native
    from recflash.reader import testing
    path, order = sys.argv[1], sys.argv[2]
    PAGE = 4096
    data = open(path, "rb").read()
    _native._set_io_completion_order(order)

    def read(ring, runs, budget_pages):
        """Reads `runs` under the budget, checks every run's bytes; the peak in pages."""
        got = ring.read_runs(path, PAGE, runs, max_inflight_bytes=budget_pages * PAGE)
        for (first, count), b in zip(runs, got):
            assert b == data[first * PAGE:(first + count) * PAGE], (budget_pages, first, count)
        return ring.peak_inflight_bytes // PAGE

    ring = testing.TestRing(8, 4 * PAGE)
    runs = [(0, 1), (2, 3), (6, 1), (8, 4), (13, 2), (16, 1), (18, 1), (20, 3), (24, 4), (29, 1), (31, 1)]
    for budget_pages in (0, 1, 2, 3, 5, 8, 100):
        for _ in range(2):
            peak = read(ring, runs, budget_pages)
            if budget_pages == 0:
                # no budget: the ring's depth (8 runs) decides
                assert peak > 8, (budget_pages, peak)
            else:
                # within the budget, or a single run larger than it
                assert peak <= max(budget_pages, 4), (budget_pages, peak)
                if budget_pages >= 5:
                    assert peak > 1, (budget_pages, peak)
    # The budget tapers to 3/4 of what is left to read, so the last window is small: sixteen
    # one-page runs under a budget of all sixteen keep at most twelve in flight, and in arrival
    # order at least nine (the first window is not starved; completions may come back while
    # it is still being queued).
    ones = [(i, 1) for i in range(0, 32, 2)]
    ring = testing.TestRing(32, 4 * PAGE)  # deep enough for all sixteen
    peak = read(ring, ones, 16)
    assert peak <= 12 and (order == "reverse" or peak >= 9), peak
    # ...but a call that fits its budget whole keeps four reads in flight that the budget has
    # room for: five one-page runs (a small fragmented feature) under a budget of eight pages
    # go out four at once, where the taper alone (3/4 of five pages) let three go and then one
    # at a time, each waiting for a completion.
    five = [(i, 1) for i in range(0, 10, 2)]
    peak = read(ring, five, 8)
    assert peak == 4, peak
    peak = read(ring, five, 2)  # and never past the budget
    assert peak == 2, peak
    # An idle function that pumps the ring (a lane making its plan): the reads it takes are
    # delivered afterwards, each run once with its own bytes, and more go out meanwhile.
    six = [(i, 1) for i in range(0, 12, 2)]
    got = ring.read_runs(path, PAGE, six, max_inflight_bytes=2 * PAGE, idle_pump_ms=20)
    for (first, count), b in zip(six, got):
        assert b == data[first * PAGE:(first + count) * PAGE], (first, count)
    assert ring.pumped_runs >= 2, ring.pumped_runs
    assert ring.peak_inflight_bytes <= 2 * PAGE, ring.peak_inflight_bytes
    read(ring, five, 8)  # and a call without pumps afterwards counts none
    assert ring.pumped_runs == 0, ring.pumped_runs
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


def run_child(child: str, page_file: str, arg: str, hang: str) -> None:
    try:
        r = subprocess.run([sys.executable, "-P", "-c", child, page_file, arg], capture_output=True, text=True,
                           timeout=60)
    except subprocess.TimeoutExpired:
        pytest.fail(f"{arg}: {hang}")
    assert r.returncode == 0 and r.stdout.strip() == "ok", r.stdout + r.stderr


@pytest.mark.parametrize("scenario", ["oversized_run", "submit_error", "submit_error_after_first", "read_error"])
def test_ring_reads_correctly_after_an_error(page_file, scenario):
    run_child(ERRORS_CHILD, page_file, scenario,
              "the ring hung on its next use (a request of the failed call was left in flight)")


@pytest.mark.parametrize("order", ["arrival", "reverse"])
def test_read_runs_keeps_within_its_inflight_budget(page_file, order):
    run_child(BUDGET_CHILD, page_file, order, "the read loop stalled under an in-flight byte budget")
