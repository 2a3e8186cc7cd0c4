// Python bindings of the store: one call per batch, numpy buffers in and out, the GIL released
// while the engine works. Status codes become the exception classes of recflash.reader.errors.
// Only the store is bound here; ingest/csrc and ndp/csrc bind their own code.
#include "reader/csrc/arrow_bindings.h"
#include "reader/csrc/outer_join.h"
#include "reader/csrc/py_bindings.h"

#include "reader/csrc/filename.h"
#include "reader/csrc/io_ring.h"

#include <pybind11/stl.h>

#include <cerrno>
#include <cstring>
#include <memory>

namespace recflash::bind {

void RegisterTestingBindings(py::module_& parent);  // testing_bindings.cc

void Raise(const Status& s) {
  // The class of each code comes from the one list in status.h (Status::Codes); errors.py
  // checks at import that it defines every class the list names.
  const char* cls_name = "RecflashError";
  for (const Status::CodeInfo& c : Status::Codes())
    if (c.code == static_cast<int>(s.code())) cls_name = c.python_class;
  py::object errors = py::module_::import("recflash.reader.errors");
  py::object cls = errors.attr(cls_name);
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

namespace {

// A read's statistics as a tuple, in the order of store.py's _READ_STATS; Python makes the
// dict only when last_read_stats() asks for it. A dict per read (ten keys, ten numbers) was a
// few µs of every scan's fixed cost, and garbage for the collector to walk.
py::tuple ReadStatsTuple(const ReadStats& st) {
  return py::make_tuple(st.pages_read, st.read_requests, st.bytes_read, st.useful_bytes, st.items, st.seconds,
                        st.io_wait_seconds, st.encoded_bytes, st.peak_inflight_bytes);
}

py::tuple Column(ColumnData&& c, bool variable) {
  py::object offsets = py::none();
  if (variable) offsets = ToNumpy(std::move(c.offsets));
  // `found` is filled by get() only: None for a scan's column.
  py::object found = c.found.empty() ? py::object(py::none()) : py::object(ToNumpy(std::move(c.found)));
  return py::make_tuple(ToNumpy(std::move(c.keys)), ToNumpy(std::move(c.values)), offsets, found);
}

}  // namespace

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
  d["dense_pages"] = g.dense_pages;
  d["seconds"] = g.seconds;
  return d;
}

namespace {

// Every store option Python may set, once (see OptionField in py_bindings.h); exported as
// STORE_OPTION_NAMES, and recflash.reader.StoreOptions is checked against them at import.
#define RF_OPTION(key, field) RF_OPTION_FIELD(StoreOptions, key, field)
const OptionField<StoreOptions> kStoreOptions[] = {
    RF_OPTION("page_size", page_size),
    RF_OPTION("write_buffer_bytes", write_buffer_bytes),
    RF_OPTION("direct_io", direct_io),
    RF_OPTION("accounting", accounting),
    RF_OPTION("read_only", read_only),
    RF_OPTION("compact_pages", compact_pages),
    RF_OPTION("sync_on_write", sync_on_write),
    RF_OPTION("bulk_load", bulk_load),
    RF_OPTION("queue_depth", queue_depth),
    RF_OPTION("build_threads", build_threads),
    RF_OPTION("max_io_bytes", max_io_bytes),
    RF_OPTION("read_inflight_bytes", read_inflight_bytes),
    RF_OPTION("single_lane_inflight_bytes", single_lane_inflight_bytes),
    RF_OPTION("read_poll_us", read_poll_us),
    RF_OPTION("lane_read_poll_us", lane_read_poll_us),
    RF_OPTION("scan_threads", scan_threads),
    RF_OPTION("free_reserve_buffers", free_reserve_buffers),
    RF_OPTION("verify_block_reads", verify_block_reads),
    RF_OPTION("wal_recovery", wal_recovery),
    RF_OPTION("pinner_enabled", pinner.enabled),
    RF_OPTION("pin_budget_frac", pinner.budget_frac),
    RF_OPTION("pin_threshold_frac", pinner.threshold_frac),
    RF_OPTION("pin_max_features", pinner.max_features),
    RF_OPTION("pin_max_flushes", pinner.max_flushes),
    RF_OPTION("merger_enabled", merger.enabled),
    RF_OPTION("merge_threshold", merger.threshold),
    RF_OPTION("merge_threshold_bulk_load", merger.bulk_load_threshold),
    RF_OPTION("merge_low_benefit_frac", merger.low_benefit_frac),
    RF_OPTION("merge_target_frac", merger.target_frac),
    RF_OPTION("merge_min_slack_pages", merger.min_slack_pages),
    RF_OPTION("merge_run_weight", merger.run_weight),
    RF_OPTION("reclaim_enabled", reclaim.enabled),
    RF_OPTION("space_amp_limit", reclaim.space_amp_limit),
    RF_OPTION("space_amp_target", reclaim.space_amp_target),
};
#undef RF_OPTION

// parse_value_type(s) -> (canonical type string, dim): the one parser of type strings.
py::tuple ParseValueTypePy(const std::string& s) {
  FeatureDef d;
  Check(ParseValueType(s, &d.type, &d.dim));
  return py::make_tuple(d.TypeString(), d.dim);
}

class PyStore {
 public:
  static std::unique_ptr<PyStore> Open(const std::string& path, const py::dict& opts) {
    StoreOptions o = OptionsFromDict(opts, kStoreOptions, "store");
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

  // Raises StoreClosedError after close(); nothing else (what last_read_stats needs).
  void CheckOpen() { Check(s_->CheckOpenStatus()); }

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

  // The engine's scan of `names` with the GIL released (the one read behind scan_many and
  // scan_table); a failure raises.
  std::vector<ColumnData> Scan(const std::vector<std::string>& names, uint64_t lo, uint64_t hi, ReadStats* rs) {
    std::vector<ColumnData> cols;
    Status st;
    {
      py::gil_scoped_release nogil;
      st = s_->ScanMany(names, lo, hi, &cols, rs);
    }
    Check(st);
    return cols;
  }

  py::tuple ScanMany(const std::vector<std::string>& names, uint64_t lo, uint64_t hi) {
    ReadStats rs;
    std::vector<ColumnData> cols = Scan(names, lo, hi, &rs);
    py::list out;
    for (size_t i = 0; i < cols.size(); i++) {
      FeatureDef d;
      Check(s_->LookupFeature(names[i], &d));
      out.append(Column(std::move(cols[i]), d.variable()));
    }
    return py::make_tuple(out, ReadStatsTuple(rs));
  }

  // (pyarrow.Table of `key` and `value` with `schema`, read stats) of one feature: Store.scan's
  // one crossing, the table made here over the engine's buffers (arrow_bindings.h says why).
  py::tuple ScanTable(const std::string& name, uint64_t lo, uint64_t hi, bool drop_max_key, const py::handle& schema) {
    ReadStats rs;
    std::vector<ColumnData> cols = Scan({name}, lo, hi, &rs);
    FeatureDef d;
    Check(s_->LookupFeature(name, &d));
    return py::make_tuple(bind::ScanTable(std::move(cols[0]), d, schema, drop_max_key), ReadStatsTuple(rs));
  }

  // (keys as a uint64 array the engine's buffer backs, read stats): one crossing per call.
  py::tuple ScanKeys(const std::string& name, uint64_t lo, uint64_t hi) {
    HVec<uint64_t> keys;
    ReadStats rs;
    Status st;
    {
      py::gil_scoped_release nogil;
      st = s_->ScanKeys(name, lo, hi, &keys, &rs);
    }
    Check(st);
    return py::make_tuple(ToNumpy(std::move(keys)), ReadStatsTuple(rs));
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
    return py::make_tuple(Column(std::move(col), d.variable()), ReadStatsTuple(rs));
  }

  py::tuple GatherRows(const std::string& name, py::array_t<uint64_t, py::array::c_style> ids, bool vector_grained,
                       uint32_t dense_page_rows) {
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
      st = s_->GatherRows(name, ids.data(), n, vector_grained, dense_page_rows, dst, &gs);
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

  void BuildKeyIndex(bool read_pages) {
    Status st;
    {
      py::gil_scoped_release nogil;
      st = s_->BuildKeyIndex(read_pages);
    }
    Check(st);
  }

  Store* store() { return s_.get(); }

  // (min_key, max_key, items) per page of the feature, ascending by min_key.
  py::tuple KeyRanges(const std::string& name) {
    std::vector<PageRef> refs;
    Check(s_->KeyRanges(name, &refs));
    std::vector<uint64_t> lo(refs.size()), hi(refs.size()), n(refs.size());
    std::vector<uint32_t> page(refs.size());
    for (size_t i = 0; i < refs.size(); i++) {
      lo[i] = refs[i].min_key;
      hi[i] = refs[i].max_key;
      n[i] = refs[i].count - refs[i].tombs;
      page[i] = refs[i].page;
    }
    return py::make_tuple(ToNumpy(std::move(lo)), ToNumpy(std::move(hi)), ToNumpy(std::move(n)),
                          ToNumpy(std::move(page)));
  }

  py::tuple AccountScan(const std::string& name) {
    ReadStats rs;
    Status st;
    {
      py::gil_scoped_release nogil;
      st = s_->AccountScan(name, &rs);
    }
    Check(st);
    return ReadStatsTuple(rs);
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

}  // namespace

Store* StoreOf(const py::object& native_store) {
  if (!py::isinstance<PyStore>(native_store))
    throw py::type_error("expected a recflash._native.Store, got " + std::string(py::str(py::type::handle_of(native_store).attr("__name__"))));
  return native_store.cast<PyStore&>().store();
}

void InitReader(py::module_& m) {
  py::class_<PyStore>(m, "Store")
      .def_static("open", &PyStore::Open, py::arg("path"), py::arg("options"))
      .def("create_feature", &PyStore::CreateFeature)
      .def("lookup", &PyStore::Lookup)
      .def("features", &PyStore::Features)
      .def("check_open", &PyStore::CheckOpen)
      .def("put", &PyStore::Put, py::arg("feature"), py::arg("keys"), py::arg("values"), py::arg("offsets") = py::none())
      .def("delete", &PyStore::Delete)
      .def("flush", &PyStore::Flush, py::arg("force") = false)
      .def("compact", &PyStore::Compact, py::arg("features") = std::vector<std::string>())
      .def("sync", &PyStore::Sync)
      .def("close", &PyStore::Close)
      .def("scan_many", &PyStore::ScanMany)
      .def("scan_table", &PyStore::ScanTable)
      .def("scan_keys", &PyStore::ScanKeys, py::arg("feature"), py::arg("lo"), py::arg("hi"))
      .def("get", &PyStore::Get)
      .def("account_scan", &PyStore::AccountScan)
      .def("key_ranges", &PyStore::KeyRanges)
      .def_property_readonly("read_only", &PyStore::read_only)
      .def("gather_rows", &PyStore::GatherRows, py::arg("feature"), py::arg("ids"), py::arg("vector_grained") = true,
           py::arg("dense_page_rows") = 0)
      .def("verify_rows", &PyStore::VerifyRows, py::arg("feature"))
      .def("build_key_index", &PyStore::BuildKeyIndex, py::arg("read_pages") = true)
      .def("stats_json", &PyStore::StatsJson)
      .def_property_readonly("page_size", &PyStore::page_size)
      .def_property_readonly("path", &PyStore::path);
  m.def(
      "join_keys",
      [](const std::vector<py::array_t<uint64_t, py::array::c_style>>& keys) {
        std::vector<KeySpan> in;
        for (const auto& k : keys) in.push_back({k.data(), static_cast<size_t>(k.size())});
        JoinedKeys j;
        {
          py::gil_scoped_release nogil;
          JoinKeys(in, &j);
        }
        py::list pos;
        for (size_t i = 0; i < in.size(); i++) {
          if (j.identical[i]) pos.append(py::none());
          else pos.append(ToNumpy(std::move(j.pos[i])));
        }
        return py::make_tuple(ToNumpy(std::move(j.keys)), pos);
      },
      py::arg("keys"),
      "Union of sorted unique uint64 key arrays -> (keys, [row of each input key, or None "
      "where the input holds every key])");
  m.def(
      "spread_fixed",
      [](py::array_t<uint8_t, py::array::c_style> values, uint32_t width,
         py::array_t<int64_t, py::array::c_style> pos, size_t n) {
        const size_t count = static_cast<size_t>(pos.size());
        if (width == 0 || static_cast<size_t>(values.size()) < count * width)
          throw py::value_error("spread_fixed: " + std::to_string(values.size()) + " value bytes for " +
                                std::to_string(count) + " values of width " + std::to_string(width));
        const int64_t* p = pos.data();
        for (size_t r = 0; r < count; r++)
          if (p[r] < 0 || static_cast<size_t>(p[r]) >= n || (r && p[r] <= p[r - 1]))
            throw py::value_error("spread_fixed: rows must ascend within [0, " + std::to_string(n) + ")");
        HVec<uint8_t> out(n * width), validity((n + 7) / 8);
        {
          py::gil_scoped_release nogil;
          SpreadFixed(values.data(), count, width, p, n, out.data(), validity.data());
        }
        return py::make_tuple(ToNumpy(std::move(validity)), ToNumpy(std::move(out)));
      },
      py::arg("values"), py::arg("width"), py::arg("pos"), py::arg("n"),
      "count fixed-width values to rows pos (ascending) of an n-row column -> (validity bitmap, "
      "values; zero bytes where null)");
  m.attr("MAX_KEY") = py::int_(UINT64_MAX);
  m.attr("STORE_OPTION_NAMES") = OptionNames(kStoreOptions);
  m.def("parse_value_type", &ParseValueTypePy, py::arg("type"),
        "Type string -> (canonical type string, dim); SchemaError for an unknown type");
  py::list codes;
  for (const Status::CodeInfo& c : Status::Codes()) codes.append(py::make_tuple(c.code, c.name, c.python_class));
  m.attr("STATUS_CODES") = codes;
  py::dict names;
  for (const auto& [role, name] : StoreFileNames()) names[py::str(role)] = name;
  m.attr("FILE_NAMES") = names;
  RegisterTestingBindings(m);  // recflash._native._testing (fault injection, kill points)
  // Test-only: "reverse" delivers each window of io_uring completions in descending request
  // order (see IoRing::CompletionOrder); "arrival" restores the kernel's order.
  m.def("_set_io_completion_order", [](const std::string& order) {
    if (order == "arrival") IoRing::SetCompletionOrderForTesting(IoRing::CompletionOrder::kArrival);
    else if (order == "reverse") IoRing::SetCompletionOrderForTesting(IoRing::CompletionOrder::kReverse);
    else throw py::value_error("completion order must be 'arrival' or 'reverse', got '" + order + "'");
  });
}

}  // namespace recflash::bind
