"""Randomised operation sequences compared against an in-memory dict model.

Two drivers: a hypothesis RuleBasedStateMachine (shrinks failures to a short op sequence) and
a seeded long-run generator (many more operations, so the write buffer flushes, the pinner and
the merger act many times, with uniform and Zipf keys).
"""

from __future__ import annotations

import random
import shutil
import tempfile

import numpy as np
import pytest
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, rule

from recflash.reader import Store
from storeutil import (KEY_MAX, TYPES, U64_MAX, Model, check_get, check_scan, check_scan_many, gen_keys,
                       gen_values, small_options)

FEATURES = {  # several features per type so pages mix features
    "f_float": "float32",
    "f_int": "int64",
    "f_lint": "list<int64>",
    "f_lflt": "list<float32>",
    "f_emb": "fixed_size_list<float32, 8>",
    "f_bin": "binary",
    "f_int2": "int64",
}
assert set(FEATURES.values()) == set(TYPES)
NAMES = sorted(FEATURES)
KEY_SPACE = 400

key_bound = st.one_of(st.integers(0, KEY_SPACE + 5),
                      st.sampled_from([0, 2**63, KEY_MAX, U64_MAX]))


class StoreMachine(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        self.dir = tempfile.mkdtemp(prefix="recflash-model-")
        self.path = self.dir + "/store"
        self.opts = small_options(write_buffer_bytes=32 << 10)
        self.store = Store.open(self.path, self.opts)
        self.model = Model()

    @initialize()
    def create_features(self):
        for f in NAMES:
            self.store.create_feature(f, FEATURES[f])
            self.model.create(f, FEATURES[f])

    def teardown(self):
        try:
            self.store.close()
        finally:
            shutil.rmtree(self.dir, ignore_errors=True)

    # -- writes ------------------------------------------------------------------------------
    @rule(f=st.sampled_from(NAMES), seed=st.integers(0, 2**32 - 1), n=st.integers(1, 300),
          skew=st.booleans(), as_arrow=st.booleans())
    def put(self, f, seed, n, skew, as_arrow):
        rng = np.random.default_rng(seed)
        keys = gen_keys(rng, n, space=KEY_SPACE, skew=skew)  # may contain duplicates
        vin, vpy = gen_values(FEATURES[f], n, rng, as_arrow=as_arrow)
        self.store.put(f, keys, vin)
        self.model.put(f, keys, vpy)

    @rule(f=st.sampled_from(NAMES), seed=st.integers(0, 2**32 - 1), n=st.integers(1, 150),
          skew=st.booleans())
    def delete(self, f, seed, n, skew):
        rng = np.random.default_rng(seed)
        keys = gen_keys(rng, n, space=KEY_SPACE, skew=skew)
        self.store.delete(f, keys)
        self.model.delete(f, keys)

    @rule()
    def flush(self):
        self.store.flush()

    @rule()
    def sync(self):
        self.store.sync()

    @rule()
    def reopen(self):
        self.store.close()
        self.store = Store.open(self.path, self.opts)
        assert self.store.features() == FEATURES
        assert self.store.stats()["live_items"] == self.model.live_items()

    # -- reads -------------------------------------------------------------------------------
    @rule(f=st.sampled_from(NAMES))
    def scan_all(self, f):
        check_scan(self.store.scan(f), self.model, f)

    @rule(f=st.sampled_from(NAMES), a=key_bound, b=key_bound)
    def scan_range(self, f, a, b):
        lo, hi = min(a, b), max(a, b)
        check_scan(self.store.scan(f, key_range=(lo, hi)), self.model, f, (lo, hi))

    @rule(f=st.sampled_from(NAMES), seed=st.integers(0, 2**32 - 1), n=st.integers(0, 100))
    def get(self, f, seed, n):
        rng = np.random.default_rng(seed)
        keys = gen_keys(rng, n, space=KEY_SPACE + 20)
        check_get(self.store.get(f, keys), self.model, f, keys)

    @rule(fs=st.lists(st.sampled_from(NAMES), min_size=1, max_size=4, unique=True),
          rng_=st.one_of(st.none(), st.tuples(key_bound, key_bound)))
    def scan_many(self, fs, rng_):
        if rng_ is not None:
            rng_ = (min(rng_), max(rng_))
        check_scan_many(self.store.scan_many(fs, key_range=rng_), self.model, fs, rng_)



TestStoreMachine = StoreMachine.TestCase
TestStoreMachine.settings = settings(
    max_examples=50, stateful_step_count=60, deadline=None, database=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much])


# ----------------------------------------------------------------------------------------------
# seeded long runs


@pytest.mark.parametrize("seed,skew", [(101, False), (202, True), (303, True)])
def test_long_random_run(tmp_path, seed, skew):
    """~1500 random operations; full comparison every 100 operations and after each reopen."""
    rnd = random.Random(seed)
    rng = np.random.default_rng(seed)
    path = str(tmp_path / "store")
    opts = small_options(write_buffer_bytes=48 << 10)
    model = Model()
    space = 3000
    s = Store.open(path, opts)
    try:
        for f in NAMES:
            s.create_feature(f, FEATURES[f])
            model.create(f, FEATURES[f])
        # an initial bulk load, so updates hit page-resident items
        for f in NAMES:
            keys = np.arange(0, space, 2, dtype=np.uint64)
            vin, vpy = gen_values(FEATURES[f], len(keys), rng)
            s.put(f, keys, vin)
            model.put(f, keys, vpy)
        s.flush()
        hot = NAMES[: 3]  # skewed feature popularity as well
        for op in range(1500):
            f = rnd.choice(hot) if (skew and rnd.random() < 0.6) else rnd.choice(NAMES)
            r = rnd.random()
            if r < 0.62:
                n = rnd.randint(1, 120)
                keys = gen_keys(rng, n, space=space, skew=skew)
                vin, vpy = gen_values(FEATURES[f], n, rng, as_arrow=rnd.random() < 0.3)
                s.put(f, keys, vin)
                model.put(f, keys, vpy)
            elif r < 0.77:
                keys = gen_keys(rng, rnd.randint(1, 60), space=space, skew=skew)
                s.delete(f, keys)
                model.delete(f, keys)
            elif r < 0.81:
                s.flush()
            elif r < 0.83:
                s.sync()
            elif r < 0.835:
                s.close()
                s = Store.open(path, opts)
                for g in NAMES:
                    check_scan(s.scan(g), model, g)
            elif r < 0.90:
                lo = rnd.randrange(space)
                hi = lo + rnd.choice([1, 10, 100, 1000, space])
                check_scan(s.scan(f, key_range=(lo, hi)), model, f, (lo, hi))
            elif r < 0.95:
                keys = gen_keys(rng, rnd.randint(1, 200), space=space + 100, skew=skew)
                check_get(s.get(f, keys), model, f, keys)
            else:
                fs = rnd.sample(NAMES, rnd.randint(2, 4))
                kr = None if rnd.random() < 0.5 else (rnd.randrange(space), space // 2 + space)
                if kr is not None and kr[0] > kr[1]:
                    kr = (kr[1], kr[0])
                check_scan_many(s.scan_many(fs, key_range=kr), model, fs, kr)
            if op % 100 == 99:
                for g in NAMES:
                    check_scan(s.scan(g), model, g)
    finally:
        s.close()
    with Store.open(path, opts) as s:
        for g in NAMES:
            check_scan(s.scan(g), model, g)
        check_scan_many(s.scan_many(NAMES), model, NAMES)
        assert s.stats()["live_items"] == model.live_items()
