"""The contract between the engine and the Python package comes from one source: status codes
(one list in reader/csrc/status.h), store options (the engine's list, the dataclass checked
against it, unknown keys refused; the SLS engine's options likewise), value-type strings (one parser) and the store's file names."""

from __future__ import annotations

import dataclasses

import pytest

from recflash import _native
from recflash.reader import Store, StoreOptions, errors
from recflash.reader.errors import InvalidArgumentError, RecflashError, SchemaError
from recflash.reader.store import FILE_NAMES, parse_value_type


def test_every_status_code_maps_to_its_exception_class():
    codes = list(_native.STATUS_CODES)
    assert [c[0] for c in codes] == list(range(1, len(codes) + 1))  # OK is 0 and never raised
    for code, name, cls_name in codes:
        cls = getattr(errors, cls_name)
        assert issubclass(cls, RecflashError) and cls_name in errors.__all__, (code, name)
    assert {c[1] for c in codes} >= {"Corruption", "Stale", "ReadOnly", "UnknownFeature", "IOError"}


def test_store_options_match_the_engine_and_refuse_unknown_keys(tmp_path):
    assert {f.name for f in dataclasses.fields(StoreOptions)} == set(_native.STORE_OPTION_NAMES)
    with pytest.raises(TypeError):
        StoreOptions(page_sise=4096)  # noqa: the misspelling is the point
    o = StoreOptions()
    with pytest.raises(AttributeError):
        o.write_bufer_bytes = 1 << 20
    # The engine refuses keys it does not know, whoever builds the dict.
    with pytest.raises(InvalidArgumentError, match="unknown store option 'page_sise'"):
        _native.Store.open(str(tmp_path / "s"), {"page_sise": 4096})
    with pytest.raises(InvalidArgumentError, match="store option 'queue_depth'"):
        _native.Store.open(str(tmp_path / "s"), {"queue_depth": "deep"})
    assert not (tmp_path / "s").exists()


def test_sls_options_match_the_engine_and_refuse_unknown_keys(tmp_path):
    import inspect

    from recflash.ndp import EmbeddingStore, SlsEngine
    from recflash.torchrec_ext.backend import SLS_OPTION_NAMES

    params = set(inspect.signature(SlsEngine.__init__).parameters) - {"self", "tables"}
    assert params | {"expected_tables"} == set(_native.SLS_OPTION_NAMES)
    assert set(SLS_OPTION_NAMES) == params
    with Store.open(str(tmp_path / "s"), StoreOptions(direct_io=False)) as s:
        EmbeddingStore(s).create_table("t", 8, 4)
        with pytest.raises(InvalidArgumentError, match="unknown SLS engine option 'row_cache_byte'"):
            _native.SlsEngine(s.native_handle, {"row_cache_byte": 1 << 20})
        with pytest.raises(InvalidArgumentError, match="SLS engine option 'pooled_min_bag'"):
            _native.SlsEngine(s.native_handle, {"pooled_min_bag": "eight"})
        _native.SlsEngine(s.native_handle, {"row_cache_bytes": 1 << 20})


@pytest.mark.parametrize("given, canonical, dim", [
    ("float32", "float32", 0), ("INT64", "int64", 0), ("list< int64 >", "list<int64>", 0),
    ("list<float32>", "list<float32>", 0), ("binary", "binary", 0),
    ("fixed_size_list<float32,16>", "fixed_size_list<float32, 16>", 16),
])
def test_one_type_string_parser(given, canonical, dim):
    assert parse_value_type(given) == (canonical, dim)


@pytest.mark.parametrize("bad", ["float", "list<int32>", "fixed_size_list<float32, 0>", ""])
def test_type_parser_names_the_bad_type(bad):
    with pytest.raises(SchemaError, match="unknown value type"):
        parse_value_type(bad)


def test_file_names_come_from_the_engine(store_path, opts):
    with Store.open(store_path, opts) as s:
        s.create_feature("f", "float32")
    import os

    present = set(os.listdir(store_path))
    for role in ("marker", "pages", "meta", "wal", "lock", "checkpoint"):
        assert FILE_NAMES[role] in present, role


@pytest.mark.parametrize("option,value,message", [
    ("merge_threshold", -1.0, "merge_threshold -1 must be a finite value >= 1"),
    ("merge_threshold", float("nan"), "merge_threshold nan"),
    ("merge_threshold_bulk_load", 0.0, "merge_threshold_bulk_load 0"),
    ("merge_target_frac", -3.0, "merge_target_frac -3 must be in [0, 1]"),
    ("merge_low_benefit_frac", 1.5, "merge_low_benefit_frac 1.5"),
    ("merge_run_weight", float("inf"), "merge_run_weight inf"),
    ("pin_budget_frac", 5.0, "pin_budget_frac 5 must be in [0, 1]"),
    ("pin_threshold_frac", -0.1, "pin_threshold_frac"),
    ("space_amp_target", -1.0, "space_amp_target -1"),
    ("space_amp_target", 3.0, "space_amp_target 3 must not exceed space_amp_limit 2"),
    ("max_io_bytes", 0, "max_io_bytes must be at least 1"),
])
def test_tuning_options_out_of_range_are_refused(tmp_path, option, value, message):
    """A tuning knob outside its range fails the open by name, before anything is created."""
    with pytest.raises(InvalidArgumentError) as e:
        Store.open(str(tmp_path / "s"), StoreOptions(**{option: value}))
    assert message in str(e.value), str(e.value)
    assert not (tmp_path / "s").exists()
