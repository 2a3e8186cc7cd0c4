// Python bindings: one call per batch, numpy buffers in and out, the GIL released while the
// engine works. Status codes become the exception classes of recflash.reader.errors.
#include <pybind11/numpy.h>
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <cerrno>
#include <cstring>
#include <memory>

#include "ingest/csrc/criteo_tsv.h"
#include "ingest/csrc/hex_ids.h"
#include "ndp/csrc/sls.h"
#include "reader/csrc/store.h"

namespace py = pybind11;
using namespace recflash;

void RegisterTestingBindings(py::module_& parent);  // testing_bindings.cc

namespace {

[[noreturn]] void Raise(const Status& s) {
  static const char* kClass[] = {"RecflashError",      "UnknownFeatureError", "FeatureExistsError",
                                 "SchemaError",        "InvalidArgumentError", "ValueTooLargeError",
                                 "NotAStoreError",     "CorruptionError",     "StoreLockedError",
                                 "StoreClosedError",   "IOError_",            "ReadOnlyError",
                                 "StaleSnapshotError"};
  py::object errors = py::module_::import("recflash.reader.errors");
  py::object cls = errors.attr(kClass[static_cast<int>(s.code())]);
  if (s.sys_errno() != 0) {
    // OS errors carry their errno (e.errno == errno.ENOSPC); a full disk has its own class.
    if (s.sys_errno() == ENOSPC) cls = errors.attr("DiskFullError");
    py::object exc = cls(s.message());
    exc.attr("errno") = s.sys_errno();
    PyErr_SetObject(cls.ptr(), exc.ptr());
    throw py::error_already_set();
  }
  PyErr_SetString(cls.ptr(), s.message().c_str());
  throw py::error_already_set();
}

void Check(const Status& s) {
  if (!s.ok()) Raise(s);
}

// Moves a vector into a numpy array that owns it (no copy).
template <typename V>
py::array_t<typename V::value_type> ToNumpy(V&& v) {
  using T = typename V::value_type;
  auto* heap = new V(std::move(v));
  py::capsule owner(heap, [](void* p) { delete static_cast<V*>(p); });
  return py::array_t<T>({static_cast<py::ssize_t>(heap->size())}, {sizeof(T)}, heap->data(), owner);
}

py::dict ReadStatsDict(const ReadStats& st) {
  py::dict d;
  d["pages_read"] = st.pages_read;
  d["bytes_read"] = st.bytes_read;
  d["useful_bytes"] = st.useful_bytes;
  d["items"] = st.items;
  d["seconds"] = st.seconds;
  d["encoded_bytes"] = st.encoded_bytes;
  d["read_amplification"] = st.useful_bytes ? static_cast<double>(st.bytes_read) / st.useful_bytes : 0.0;
  d["read_amplification_encoded"] = st.encoded_bytes > 0 ? st.bytes_read / st.encoded_bytes : 0.0;
  return d;
}

py::tuple Column(ColumnData&& c, bool variable) {
  py::object offsets = py::none();
  if (variable) offsets = ToNumpy(std::move(c.offsets));
  return py::make_tuple(ToNumpy(std::move(c.keys)), ToNumpy(std::move(c.values)), offsets, ToNumpy(std::move(c.found)));
}

py::dict GatherStatsDict(const GatherStats& g) {
  py::dict d;
  d["rows"] = g.rows;
  d["buffer_rows"] = g.buffer_rows;
  d["vector_rows"] = g.vector_rows;
  d["page_rows"] = g.page_rows;
  d["device_reads"] = g.device_reads;
  d["device_bytes"] = g.device_bytes;
  d["verified_blocks"] = g.verified_blocks;
  d["first_touch_pages"] = g.first_touch_pages;
  d["seconds"] = g.seconds;
  return d;
}

// requests: [(table, indices int64, offsets int64 (B + 1), weights float32 | None, mean)]
struct ParsedRequests {
  std::vector<ndp::SlsRequest> reqs;
  std::vector<py::object> keep;  // arrays stay alive while the GIL is released
  py::list outs;
};

ParsedRequests ParseSls(Store* store, const py::list& requests) {
  ParsedRequests pr;
  for (const auto& item : requests) {
    auto t = item.cast<py::tuple>();
    ndp::SlsRequest r;
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
    py::array_t<float> out({static_cast<py::ssize_t>(r.num_bags), static_cast<py::ssize_t>(std::max<uint32_t>(r.dim, 1))});
    r.out = out.mutable_data();
    pr.outs.append(out);
    pr.reqs.push_back(std::move(r));
  }
  return pr;
}

py::tuple RunSls(Store* store, ndp::SlsEngine* engine, const py::list& requests) {
  ParsedRequests pr = ParseSls(store, requests);
  ndp::SlsStats ss;
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

// parse_hex_ids(offsets int32[n + 1], data uint8[], validity uint8[] | None, bit_offset)
//   -> (values int64[m], keep bool[n] | None when every entry has a value, bad int64[] | None)
py::tuple ParseHexIdsPy(py::array_t<int32_t, py::array::c_style> offsets, py::array_t<uint8_t, py::array::c_style> data,
                        py::object validity, int64_t bit_offset) {
  if (offsets.size() < 1) throw py::value_error("parse_hex_ids: offsets need n + 1 entries");
  const size_t n = static_cast<size_t>(offsets.size() - 1);
  const int32_t* off = offsets.data();
  if (off[0] < 0 || off[n] < off[0] || static_cast<size_t>(off[n]) > static_cast<size_t>(data.size()))
    throw py::value_error("parse_hex_ids: offsets out of the data's bounds");
  const uint8_t* bits = nullptr;
  py::array_t<uint8_t, py::array::c_style> vb;
  if (!validity.is_none()) {
    vb = validity.cast<py::array_t<uint8_t, py::array::c_style>>();
    if (static_cast<size_t>(vb.size()) * 8 < static_cast<size_t>(bit_offset) + n)
      throw py::value_error("parse_hex_ids: validity bitmap too short");
    bits = vb.data();
  }
  py::array_t<int64_t> values(static_cast<py::ssize_t>(n));
  py::array_t<bool> keep(static_cast<py::ssize_t>(n));
  std::vector<int64_t> bad;
  size_t m;
  {
    py::gil_scoped_release nogil;
    m = recflash::ingest::ParseHexIds(off, data.data(), bits, bit_offset, n, values.mutable_data(),
                                      reinterpret_cast<uint8_t*>(keep.mutable_data()), &bad);
  }
  values.resize({static_cast<py::ssize_t>(m)});
  py::object keep_out = m == n ? py::object(py::none()) : py::object(keep);
  py::object bad_out = py::none();
  if (!bad.empty()) {
    py::array_t<int64_t> b(static_cast<py::ssize_t>(bad.size()));
    std::memcpy(b.mutable_data(), bad.data(), bad.size() * 8);
    bad_out = b;
  }
  return py::make_tuple(values, keep_out, bad_out);
}

// parse_criteo_block(data: buffer, has_label) -> None (not for the fast path: use the general
// parser) or (rows, [(values, present bool[rows] | None), ...] one per field in layout order;
// the label's values are float32, the others int64).
py::object ParseCriteoBlockPy(py::buffer data, bool has_label) {
  py::buffer_info info = data.request();
  const auto* p = static_cast<const uint8_t*>(info.ptr);
  const size_t n = static_cast<size_t>(info.size * info.itemsize);
  recflash::ingest::CriteoColumns cols;
  bool ok;
  {
    py::gil_scoped_release nogil;
    ok = recflash::ingest::ParseCriteoBlock(p, n, has_label, &cols);
  }
  if (!ok) return py::none();
  py::list fields;
  for (size_t f = 0; f < cols.values.size(); f++) {
    py::object values;
    if (has_label && f == 0) {
      py::array_t<float> a(static_cast<py::ssize_t>(cols.labels.size()));
      std::memcpy(a.mutable_data(), cols.labels.data(), cols.labels.size() * sizeof(float));
      values = a;
    } else {
      py::array_t<int64_t> a(static_cast<py::ssize_t>(cols.values[f].size()));
      std::memcpy(a.mutable_data(), cols.values[f].data(), cols.values[f].size() * 8);
      values = a;
    }
    py::object present = py::none();
    if (cols.missing[f]) {
      py::array_t<bool> m(static_cast<py::ssize_t>(cols.rows));
      std::memcpy(m.mutable_data(), cols.present[f].data(), cols.rows);
      present = m;
    }
    fields.append(py::make_tuple(values, present));
  }
  return py::make_tuple(cols.rows, fields);
}

// count_lines(data: buffer) -> lines (newlines, plus a last line without one)
size_t CountLinesPy(py::buffer data) {
  py::buffer_info info = data.request();
  py::gil_scoped_release nogil;
  return recflash::ingest::CountLines(static_cast<const uint8_t*>(info.ptr), static_cast<size_t>(info.size * info.itemsize));
}

// Sets `field` from options[key] when present (options dicts come from Python dataclasses).
template <typename T>
void GetOpt(const py::dict& options, const char* key, T& field) {
  if (options.contains(key)) field = options[key].cast<T>();
}

StoreOptions OptionsFromDict(const py::dict& d) {
  StoreOptions o;
  auto get = [&](const char* k, auto& field) { GetOpt(d, k, field); };
  get("page_size", o.page_size);
  get("write_buffer_bytes", o.write_buffer_bytes);
  get("direct_io", o.direct_io);
  get("accounting", o.accounting);
  get("read_only", o.read_only);
  get("compact_pages", o.compact_pages);
  get("sync_on_write", o.sync_on_write);
  get("bulk_load", o.bulk_load);
  get("queue_depth", o.queue_depth);
  get("max_io_bytes", o.max_io_bytes);
  get("verify_block_reads", o.verify_block_reads);
  get("pinner_enabled", o.pinner.enabled);
  get("pin_budget_frac", o.pinner.budget_frac);
  get("pin_threshold_frac", o.pinner.threshold_frac);
  get("pin_max_features", o.pinner.max_features);
  get("pin_max_flushes", o.pinner.max_flushes);
  get("merger_enabled", o.merger.enabled);
  get("merge_threshold", o.merger.threshold);
  get("merge_low_benefit_frac", o.merger.low_benefit_frac);
  get("merge_target_frac", o.merger.target_frac);
  get("merge_min_slack_pages", o.merger.min_slack_pages);
  get("reclaim_enabled", o.reclaim.enabled);
  get("space_amp_limit", o.reclaim.space_amp_limit);
  get("space_amp_target", o.reclaim.space_amp_target);
  return o;
}

class PyStore {
 public:
  static std::unique_ptr<PyStore> Open(const std::string& path, const py::dict& opts) {
    StoreOptions o = OptionsFromDict(opts);
    std::unique_ptr<Store> s;
    Status st;
    {
      py::gil_scoped_release nogil;
      st = Store::Open(path, o, &s);
    }
    Check(st);
    auto p = std::make_unique<PyStore>();
    p->s_ = std::move(s);
    return p;
  }

  py::tuple CreateFeature(const std::string& name, const std::string& type) {
    FeatureDef d;
    Check(s_->CreateFeature(name, type, &d));
    return py::make_tuple(d.id, d.TypeString(), d.dim);
  }

  py::tuple Lookup(const std::string& name) {
    FeatureDef d;
    Check(s_->LookupFeature(name, &d));
    return py::make_tuple(d.id, d.TypeString(), d.dim);
  }

  py::list Features() {
    Check(s_->CheckOpenStatus());
    py::list l;
    for (const auto& d : s_->Features()) l.append(py::make_tuple(d.name, d.TypeString()));
    return l;
  }

  void Put(const std::string& name, py::array_t<uint64_t, py::array::c_style> keys,
           py::array_t<uint8_t, py::array::c_style> values, py::object offsets) {
    const int64_t* off = nullptr;
    py::array_t<int64_t, py::array::c_style> off_arr;
    if (!offsets.is_none()) {
      off_arr = offsets.cast<py::array_t<int64_t, py::array::c_style>>();
      if (static_cast<size_t>(off_arr.size()) != static_cast<size_t>(keys.size()) + 1)
        Raise(Status::InvalidArgument("feature '" + name + "': offsets must have len(keys) + 1 entries"));
      off = off_arr.data();
    }
    Status st;
    {
      py::gil_scoped_release nogil;
      st = s_->Put(name, keys.data(), keys.size(), values.data(), values.size(), off);
    }
    Check(st);
  }

  void Delete(const std::string& name, py::array_t<uint64_t, py::array::c_style> keys) {
    Status st;
    {
      py::gil_scoped_release nogil;
      st = s_->Delete(name, keys.data(), keys.size());
    }
    Check(st);
  }

  void Flush(bool force) {
    Status st;
    {
      py::gil_scoped_release nogil;
      st = s_->Flush(force);
    }
    Check(st);
  }

  void Compact(const std::vector<std::string>& names) {
    Status st;
    {
      py::gil_scoped_release nogil;
      st = s_->Compact(names);
    }
    Check(st);
  }

  void Sync() {
    Status st;
    {
      py::gil_scoped_release nogil;
      st = s_->Sync();
    }
    Check(st);
  }

  void Close() {
    Status st;
    {
      py::gil_scoped_release nogil;
      st = s_->Close();
    }
    Check(st);
  }

  py::tuple ScanMany(const std::vector<std::string>& names, uint64_t lo, uint64_t hi) {
    std::vector<ColumnData> cols;
    ReadStats rs;
    Status st;
    {
      py::gil_scoped_release nogil;
      st = s_->ScanMany(names, lo, hi, &cols, &rs);
    }
    Check(st);
    py::list out;
    for (size_t i = 0; i < cols.size(); i++) {
      FeatureDef d;
      Check(s_->LookupFeature(names[i], &d));
      out.append(Column(std::move(cols[i]), d.variable()));
    }
    return py::make_tuple(out, ReadStatsDict(rs));
  }

  py::tuple Get(const std::string& name, py::array_t<uint64_t, py::array::c_style> keys) {
    ColumnData col;
    ReadStats rs;
    Status st;
    {
      py::gil_scoped_release nogil;
      st = s_->Get(name, keys.data(), keys.size(), &col, &rs);
    }
    Check(st);
    FeatureDef d;
    Check(s_->LookupFeature(name, &d));
    return py::make_tuple(Column(std::move(col), d.variable()), ReadStatsDict(rs));
  }

  py::tuple GatherRows(const std::string& name, py::array_t<uint64_t, py::array::c_style> ids, bool vector_grained) {
    FeatureDef d;
    Check(s_->LookupFeature(name, &d));
    const size_t n = static_cast<size_t>(ids.size());
    const py::ssize_t dim = d.type == ValueType::kFixedFloat32 ? d.dim : 1;
    py::array_t<float> out({static_cast<py::ssize_t>(n), dim});
    float* dst = out.mutable_data();
    GatherStats gs;
    Status st;
    {
      py::gil_scoped_release nogil;
      st = s_->GatherRows(name, ids.data(), n, vector_grained, dst, &gs);
    }
    Check(st);
    return py::make_tuple(out, GatherStatsDict(gs));
  }

  uint64_t VerifyRows(const std::string& name) {
    uint64_t pages = 0;
    Status st;
    {
      py::gil_scoped_release nogil;
      st = s_->VerifyRows(name, &pages);
    }
    Check(st);
    return pages;
  }

  py::tuple Sls(const py::list& requests, bool vector_grained) {
    ndp::SlsOptions o;
    o.vector_grained = vector_grained;
    ndp::SlsEngine engine(s_.get(), o);
    return RunSls(s_.get(), &engine, requests);
  }

  Store* store() { return s_.get(); }

  // (min_key, max_key, items) per page of the feature, ascending by min_key.
  py::tuple KeyRanges(const std::string& name) {
    std::vector<PageRef> refs;
    Check(s_->KeyRanges(name, &refs));
    std::vector<uint64_t> lo(refs.size()), hi(refs.size()), n(refs.size());
    for (size_t i = 0; i < refs.size(); i++) {
      lo[i] = refs[i].min_key;
      hi[i] = refs[i].max_key;
      n[i] = refs[i].count - refs[i].tombs;
    }
    return py::make_tuple(ToNumpy(std::move(lo)), ToNumpy(std::move(hi)), ToNumpy(std::move(n)));
  }

  py::dict AccountScan(const std::string& name) {
    ReadStats rs;
    Status st;
    {
      py::gil_scoped_release nogil;
      st = s_->AccountScan(name, &rs);
    }
    Check(st);
    return ReadStatsDict(rs);
  }

  std::string StatsJson() {
    Check(s_->CheckOpenStatus());
    py::gil_scoped_release nogil;
    return s_->StatsJson();
  }

  uint32_t page_size() const { return s_->page_size(); }
  bool read_only() const { return s_->read_only(); }
  std::string path() const { return s_->path(); }

 private:
  std::unique_ptr<Store> s_;
};

// An SLS engine with caches, bound to an open store (kept alive by the Python object).
class PySlsEngine {
 public:
  PySlsEngine(py::object store, const py::dict& opts) : store_obj_(store) {
    store_ = store.cast<PyStore&>().store();
    ndp::SlsOptions o;
    auto get = [&](const char* k, auto& field) { GetOpt(opts, k, field); };
    get("vector_grained", o.vector_grained);
    get("row_cache_bytes", o.row_cache_bytes);
    get("hot_rows_bytes", o.hot_rows_bytes);
    get("pooled_cache_bytes", o.pooled_cache_bytes);
    get("pooled_min_bag", o.pooled_min_bag);
    get("device_cache_bytes", o.device_cache_bytes);
    get("expected_tables", o.expected_tables);
    engine_ = std::make_unique<ndp::SlsEngine>(store_, o);
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
  std::unique_ptr<ndp::SlsEngine> engine_;
};

}  // namespace

PYBIND11_MODULE(_native, m) {
  m.doc() = "recflash storage engine (C++20, io_uring, O_DIRECT, RocksDB metadata)";
  m.def("parse_criteo_block", &ParseCriteoBlockPy, py::arg("data"), py::arg("has_label"),
        "Criteo TSV block -> columns, or None outside the fast path; see ingest/csrc/criteo_tsv.h");
  m.def("count_lines", &CountLinesPy, py::arg("data"));
  m.def("parse_hex_ids", &ParseHexIdsPy, py::arg("offsets"), py::arg("data"), py::arg("validity"),
        py::arg("bit_offset"), "Hex id strings (Arrow string buffers) -> int64 values; see ingest/csrc/hex_ids.h");
  py::class_<PyStore>(m, "Store")
      .def_static("open", &PyStore::Open, py::arg("path"), py::arg("options"))
      .def("create_feature", &PyStore::CreateFeature)
      .def("lookup", &PyStore::Lookup)
      .def("features", &PyStore::Features)
      .def("put", &PyStore::Put, py::arg("feature"), py::arg("keys"), py::arg("values"), py::arg("offsets") = py::none())
      .def("delete", &PyStore::Delete)
      .def("flush", &PyStore::Flush, py::arg("force") = false)
      .def("compact", &PyStore::Compact, py::arg("features") = std::vector<std::string>())
      .def("sync", &PyStore::Sync)
      .def("close", &PyStore::Close)
      .def("scan_many", &PyStore::ScanMany)
      .def("get", &PyStore::Get)
      .def("account_scan", &PyStore::AccountScan)
      .def("key_ranges", &PyStore::KeyRanges)
      .def_property_readonly("read_only", &PyStore::read_only)
      .def("gather_rows", &PyStore::GatherRows, py::arg("feature"), py::arg("ids"), py::arg("vector_grained") = true)
      .def("verify_rows", &PyStore::VerifyRows, py::arg("feature"))
      .def("sls", &PyStore::Sls, py::arg("requests"), py::arg("vector_grained") = true)
      .def("stats_json", &PyStore::StatsJson)
      .def_property_readonly("page_size", &PyStore::page_size)
      .def_property_readonly("path", &PyStore::path);
  py::class_<PySlsEngine>(m, "SlsEngine")
      .def(py::init<py::object, const py::dict&>(), py::arg("store"), py::arg("options"))
      .def("run", &PySlsEngine::Run)
      .def("profile", &PySlsEngine::Profile)
      .def("invalidate", &PySlsEngine::Invalidate)
      .def("cache_stats", &PySlsEngine::CacheStats);
  m.attr("MAX_KEY") = py::int_(UINT64_MAX);
  // Test-only: "reverse" delivers each window of io_uring completions in descending request
  // order (see IoRing::CompletionOrder); "arrival" restores the kernel's order.
  RegisterTestingBindings(m);
  m.def("_set_io_completion_order", [](const std::string& order) {
    if (order == "arrival") IoRing::SetCompletionOrderForTesting(IoRing::CompletionOrder::kArrival);
    else if (order == "reverse") IoRing::SetCompletionOrderForTesting(IoRing::CompletionOrder::kReverse);
    else throw py::value_error("completion order must be 'arrival' or 'reverse', got '" + order + "'");
  });
}
