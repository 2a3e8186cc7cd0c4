"""Fixtures for the recflash tests.

Run with ``.venv/bin/pytest tests/`` or ``python -m pytest`` from the repository root (no root
folder is named ``recflash``, so the installed package is what tests import).
"""

from __future__ import annotations

import os
import sys

import pytest

_here = os.path.dirname(os.path.abspath(__file__))
if _here not in sys.path:  # storeutil lives next to this file
    sys.path.insert(0, _here)

from storeutil import small_options  # noqa: E402


@pytest.fixture(scope="session")
def cluster():
    """One local Ray cluster for every test module that reads through Ray: a second ray.init()
    in the same process after a shutdown sometimes never got its raylet up (the node timed out
    during startup), failing every test of the later module."""
    import ray

    # (ignore_reinit_error: a test that read through Ray without the fixture started one already)
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False, configure_logging=False,
             ignore_reinit_error=True)
    import ray.data

    ray.data.DataContext.get_current().enable_progress_bars = False
    yield ray
    ray.shutdown()


@pytest.fixture
def store_path(tmp_path):
    """A path where a new store gets created (does not exist yet)."""
    return str(tmp_path / "store")


@pytest.fixture
def opts():
    return small_options()


@pytest.fixture
def open_store(store_path, opts):
    """Factory opening stores (default: the test's store_path with small options); every store
    it opened is closed at teardown."""
    from recflash.reader import Store

    opened = []

    def _open(path=None, options=None):
        s = Store.open(path or store_path, options or opts)
        opened.append(s)
        return s

    yield _open
    for s in opened:
        try:
            s.close()
        except Exception:  # already closed, or the test left it broken on purpose
            pass
