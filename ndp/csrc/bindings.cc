// Python bindings of the NDP engine: SlsEngine over an open store (the store's own binding
// unit, reader/csrc/bindings.cc, knows nothing of it). One call per batch of requests, the
// GIL released while the engine works.
#include "ndp/csrc/bindings.h"

#include <pybind11/numpy.h>
#include <pybind11/stl.h>

#include <algorithm>
#include <memory>

#include "ndp/csrc/sls.h"
#include "reader/csrc/py_bindings.h"

namespace recflash::ndp {

namespace py = pybind11;
using bind::Check;
using bind::GatherStatsDict;
using bind::OptionField;
using bind::OptionNames;
using bind::OptionsFromDict;
using bind::Raise;
using bind::StoreOf;

namespace {

// requests: [(table, indices int64, offsets int64 (B + 1), weights float32 | None, mean[, row format, dim])]
struct ParsedRequests {
  std::vector<SlsRequest> reqs;
  std::vector<py::object> keep;  // arrays stay alive while the GIL is released
  py::list outs;
};

ParsedRequests ParseSls(Store* store, const py::list& requests) {
  ParsedRequests pr;
  for (const auto& item : requests) {
    auto t = item.cast<py::tuple>();
    SlsRequest r;
    r.table = t[0].cast<std::string>();
    auto idx = t[1].cast<py::array_t<int64_t, py::array::c_style | py::array::forcecast>>();
    auto off = t[2].cast<py::array_t<int64_t, py::array::c_style | py::array::forcecast>>();
    pr.keep.push_back(idx);
    pr.keep.push_back(off);
    if (off.size() < 1) Raise(Status::InvalidArgument("sls on table '" + r.table + "': offsets must have B + 1 entries"));
    r.indices = idx.data();
    r.num_indices = static_cast<size_t>(idx.size());
    r.offsets = off.data();
    r.num_bags = static_cast<size_t>(off.size()) - 1;
    if (!t[3].is_none()) {
      auto w = t[3].cast<py::array_t<float, py::array::c_style | py::array::forcecast>>();
      if (static_cast<size_t>(w.size()) != r.num_indices)
        Raise(Status::InvalidArgument("sls on table '" + r.table + "': per_sample_weights must match indices"));
      pr.keep.push_back(w);
      r.weights = w.data();
    }
    r.mean = t[4].cast<bool>();
    FeatureDef d;
    Check(store->LookupFeature(r.table, &d));
    r.dim = d.type == ValueType::kFixedFloat32 ? d.dim : 0;
    if (t.size() >= 7) {  // (…, row format, dim): a float16 or int8 table
      r.format = static_cast<RowFormat>(t[5].cast<int>());
      r.dim = t[6].cast<uint32_t>();
    }
    py::array_t<float> out({static_cast<py::ssize_t>(r.num_bags), static_cast<py::ssize_t>(std::max<uint32_t>(r.dim, 1))});
    r.out = out.mutable_data();
    pr.outs.append(out);
    pr.reqs.push_back(std::move(r));
  }
  return pr;
}

py::tuple RunSls(Store* store, SlsEngine* engine, const py::list& requests) {
  ParsedRequests pr = ParseSls(store, requests);
  SlsStats ss;
  Status st;
  {
    py::gil_scoped_release nogil;
    st = engine->Run(pr.reqs, &ss);
  }
  Check(st);
  py::dict d;
  d["lookups"] = ss.lookups;
  d["unique_rows"] = ss.unique_rows;
  d["gather"] = GatherStatsDict(ss.gather);
  d["seconds"] = ss.seconds;
  return py::make_tuple(pr.outs, d);
}

// Every SLS engine option Python may set, once (see OptionField in py_bindings.h); exported
// as SLS_OPTION_NAMES.
#define RF_SLS_OPTION(key, field) RF_OPTION_FIELD(SlsOptions, key, field)
const OptionField<SlsOptions> kSlsOptions[] = {
    RF_SLS_OPTION("vector_grained", vector_grained),
    RF_SLS_OPTION("dense_page_rows", dense_page_rows),
    RF_SLS_OPTION("row_cache_bytes", row_cache_bytes),
    RF_SLS_OPTION("hot_rows_bytes", hot_rows_bytes),
    RF_SLS_OPTION("hot_rows_profile_ids", hot_rows_profile_ids),
    RF_SLS_OPTION("pooled_cache_bytes", pooled_cache_bytes),
    RF_SLS_OPTION("pooled_min_bag", pooled_min_bag),
    RF_SLS_OPTION("device_cache_bytes", device_cache_bytes),
    RF_SLS_OPTION("expected_tables", expected_tables),
};
#undef RF_SLS_OPTION

// An SLS engine with caches, bound to an open store (kept alive by the Python object).
class PySlsEngine {
 public:
  PySlsEngine(py::object store, const py::dict& opts) : store_obj_(store) {
    store_ = StoreOf(store);
    engine_ = std::make_unique<SlsEngine>(store_, OptionsFromDict(opts, kSlsOptions, "SLS engine"));
  }
  py::tuple Run(const py::list& requests) { return RunSls(store_, engine_.get(), requests); }
  void Profile(const py::list& requests) {
    ParsedRequests pr = ParseSls(store_, requests);
    Status st;
    {
      py::gil_scoped_release nogil;
      st = engine_->Profile(pr.reqs);
    }
    Check(st);
  }
  void Invalidate(const std::string& table, py::array_t<uint64_t, py::array::c_style> ids) {
    Status st;
    {
      py::gil_scoped_release nogil;
      st = engine_->Invalidate(table, ids.data(), ids.size());
    }
    Check(st);
  }
  std::string CacheStats() { return engine_->CacheStatsJson(); }

 private:
  py::object store_obj_;
  Store* store_;
  std::unique_ptr<SlsEngine> engine_;
};

}  // namespace

void InitNdp(py::module_& m) {
  py::class_<PySlsEngine>(m, "SlsEngine")
      .def(py::init<py::object, const py::dict&>(), py::arg("store"), py::arg("options"))
      .def("run", &PySlsEngine::Run)
      .def("profile", &PySlsEngine::Profile)
      .def("invalidate", &PySlsEngine::Invalidate)
      .def("cache_stats", &PySlsEngine::CacheStats);
  m.attr("SLS_OPTION_NAMES") = OptionNames(kSlsOptions);
}

}  // namespace recflash::ndp
