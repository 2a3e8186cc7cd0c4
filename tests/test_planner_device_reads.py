"""The planner's device-read estimate (expected_device_reads) against what the engine reads."""

from __future__ import annotations

import numpy as np
import pytest

from recflash.ndp import EmbeddingStore
from recflash.reader import Store, StoreOptions
from recflash.torchrec_ext.planner import expected_device_reads


@pytest.fixture(scope="module")
def table(tmp_path_factory):
    path = tmp_path_factory.mktemp("planner") / "s"
    s = Store.open(str(path), StoreOptions(write_buffer_bytes=4 << 20))
    t = EmbeddingStore(s)
    rows = 40_000
    t.create_table("v", rows, 32)
    t.load_table("v", np.random.default_rng(0).standard_normal((rows, 32)).astype(np.float32), progress=False)
    yield s, rows
    s.close()


@pytest.mark.parametrize("lookups", [20, 500, 4_000, 30_000])
@pytest.mark.parametrize("dense_page_rows", [0, 2, 3])
def test_expected_device_reads_match_the_engine(table, lookups, dense_page_rows):
    s, rows = table
    rng = np.random.default_rng(lookups + dense_page_rows)
    measured = []
    for _ in range(8):
        ids = np.unique(rng.integers(0, rows, lookups))
        _, g = s.gather_rows(EmbeddingStore.feature_name("v"), ids, True, dense_page_rows)
        measured.append(g["device_reads"])
    predicted = expected_device_reads(rows, 128, lookups, dense_page_rows, page_size=s.page_size)
    # blocks of rows within 4 KiB of each other merge into one read, which the model ignores
    assert 0.8 <= predicted / np.mean(measured) <= 1.25, (predicted, measured)


def test_pages_only_and_bad_input():
    # every touched page whole: a table touched all over is a run of requests of 16 pages
    assert expected_device_reads(160_000, 128, 10**7, vector_grained=False) == pytest.approx(1_260 / 16, rel=0.05)
    assert expected_device_reads(0, 128, 10) == 0 and expected_device_reads(10, 128, 0) == 0
    # a large threshold on a dense batch: no overflow, and everything is block reads
    assert 0 < expected_device_reads(100_000, 128, 10**6, dense_page_rows=1000) <= 100_000
