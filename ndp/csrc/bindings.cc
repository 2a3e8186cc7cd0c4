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

// Every SLS engine option Python may set, once (the store's options follow the same rule):
// exported as SLS_OPTION_NAMES, and a key not listed here is refused, never ignored.
struct SlsOptionField {
  const char* name;
  void (*set)(SlsOptions& o, const py::handle& v);
};
#define RF_SLS_OPTION(key, field) \
  { key, [](SlsOptions& o, const py::handle& v) { o.field = v.cast<decltype(o.field)>(); } }
const SlsOptionField kSlsOptions[] = {
    RF_SLS_OPTION("vector_grained", vector_grained),
    RF_SLS_OPTION("row_cache_bytes", row_cache_bytes),
    RF_SLS_OPTION("hot_rows_bytes", hot_rows_bytes),
    RF_SLS_OPTION("pooled_cache_bytes", pooled_cache_bytes),
    RF_SLS_OPTION("pooled_min_bag", pooled_min_bag),
    RF_SLS_OPTION("device_cache_bytes", device_cache_bytes),
    RF_SLS_OPTION("expected_tables", expected_tables),
};
#undef RF_SLS_OPTION

SlsOptions SlsOptionsFromDict(const py::dict& d) {
  SlsOptions o;
  for (const auto& [key, value] : d) {
    const std::string k = py::str(key);
    const SlsOptionField* f = nullptr;
    for (const SlsOptionField& x : kSlsOptions)
      if (k == x.name) f = &x;
    if (!f) {
      std::string known;
      for (const SlsOptionField& x : kSlsOptions) known += (known.empty() ? "" : ", ") + std::string(x.name);
      Raise(Status::InvalidArgument("unknown SLS engine option '" + k + "' (known: " + known + ")"));
    }
    try {
      f->set(o, value);
    } catch (const py::cast_error&) {
      Raise(Status::InvalidArgument("SLS engine option '" + k + "' has the wrong type (" +
                                    std::string(py::str(py::type::of(value))) + ")"));
    }
  }
  return o;
}

// An SLS engine with caches, bound to an open store (kept alive by the Python object).
class PySlsEngine {
 public:
  PySlsEngine(py::object store, const py::dict& opts) : store_obj_(store) {
    store_ = StoreOf(store);
    engine_ = std::make_unique<SlsEngine>(store_, SlsOptionsFromDict(opts));
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
  py::list names;
  for (const SlsOptionField& x : kSlsOptions) names.append(x.name);
  m.attr("SLS_OPTION_NAMES") = names;
}

}  // namespace recflash::ndp
