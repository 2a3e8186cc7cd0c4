// recflash._native._testing: the test-only controls of the engine (fault injection, kill
// points, power-loss simulation, and direct access to pieces the store does not expose).
// Nothing here is part of the product API; recflash.reader.testing wraps it for pytest.
#include <fcntl.h>
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>
#include <rocksdb/db.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstring>
#include <memory>
#include <optional>
#include <thread>

#include "reader/csrc/block_sums.h"
#include "reader/csrc/crc32c.h"
#include "reader/csrc/fault_injection.h"
#include "reader/csrc/format.h"
#include "reader/csrc/wal.h"
#include "reader/csrc/io_ring.h"
#include "reader/csrc/status.h"

namespace py = pybind11;
using namespace recflash;

namespace {

fault::Kind KindArg(const std::string& name) {
  fault::Kind k;
  if (!fault::KindFromName(name, &k)) {
    std::string all;
    for (int i = 0; i < static_cast<int>(fault::Kind::kCount); i++)
      all += std::string(i ? ", " : "") + fault::KindName(static_cast<fault::Kind>(i));
    throw py::value_error("unknown fault kind '" + name + "' (kinds: " + all + ")");
  }
  return k;
}

// An IoRing of its own, so a test can make one call fail and check the next on the same ring.
class TestRing {
 public:
  TestRing(unsigned depth, uint32_t slot_bytes) {
    Status s = IoRing::Create(depth, slot_bytes, &ring_);
    if (!s.ok()) throw std::runtime_error(s.ToString());
  }
  // Bytes of each run, in run order. Errors come back as RuntimeError("<Code>: message").
  // idle_pump_ms > 0: an idle function that works that long, pumping the ring halfway and at
  // its end (IoRing::Pump), as a lane's plan does.
  std::vector<py::bytes> ReadRuns(const std::string& path, uint32_t page_size,
                                  const std::vector<std::pair<uint32_t, uint32_t>>& runs,
                                  uint64_t max_inflight_bytes, double idle_pump_ms) {
    const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
    if (fd < 0) throw std::runtime_error("cannot open " + path);
    std::vector<PageRun> pr;
    for (auto [f, c] : runs) pr.push_back({f, c});
    std::vector<std::string> out(pr.size());
    Status s;
    {
      py::gil_scoped_release nogil;
      s = ring_->ReadRuns(fd, path, page_size, pr, [&](const PageRun& r, const uint8_t* data) {
        for (size_t i = 0; i < pr.size(); i++)
          if (pr[i].first == r.first && pr[i].count == r.count)
            out[i].assign(reinterpret_cast<const char*>(data), static_cast<size_t>(r.count) * page_size);
        return Status::OK();
      }, idle_pump_ms > 0 ? IoRing::IdleFn([&]() {
        for (int half = 0; half < 2; half++) {
          std::this_thread::sleep_for(std::chrono::duration<double, std::milli>(idle_pump_ms / 2));
          ring_->Pump();
        }
        return Status::OK();
      }) : IoRing::IdleFn(), max_inflight_bytes);
    }
    ::close(fd);
    if (!s.ok()) throw std::runtime_error(s.ToString());
    std::vector<py::bytes> res;
    for (auto& o : out) res.emplace_back(o);
    return res;
  }
  bool broken() const { return ring_->broken(); }
  uint64_t peak_inflight_bytes() const { return ring_->peak_inflight_bytes(); }
  uint64_t pumped_runs() const { return ring_->pumped_runs(); }

 private:
  std::unique_ptr<IoRing> ring_;
};

Status StatusOf(int code, const std::string& m) {
  using C = Status::Code;
  switch (static_cast<C>(code)) {
    case C::kOk: return Status::OK();
    case C::kUnknownFeature: return Status::UnknownFeature(m);
    case C::kFeatureExists: return Status::FeatureExists(m);
    case C::kSchema: return Status::Schema(m);
    case C::kInvalidArgument: return Status::InvalidArgument(m);
    case C::kTooLarge: return Status::TooLarge(m);
    case C::kNotAStore: return Status::NotAStore(m);
    case C::kCorruption: return Status::Corruption(m);
    case C::kLocked: return Status::Locked(m);
    case C::kClosed: return Status::Closed(m);
    case C::kIOError: return Status::IOError(m);
    case C::kReadOnly: return Status::ReadOnly(m);
    case C::kStale: return Status::Stale(m);
  }
  throw py::value_error("no status code " + std::to_string(code));
}

// Fuzz entry: a page's bytes (padded or cut to page_size). fix_checksum stamps the id and a
// valid crc32c first, so the checks behind the checksum are reached too. Returns the number
// of segments, or raises RuntimeError("Corruption: ...") — the same status a read gets.
int DecodePage(const std::string& bytes, uint32_t page_size, uint32_t page_id, bool fix_checksum) {
  AlignedBuffer buf(page_size);
  std::memset(buf.data(), 0, page_size);
  std::memcpy(buf.data(), bytes.data(), std::min<size_t>(bytes.size(), page_size));
  if (fix_checksum && page_size >= 64) StampPageId(buf.data(), page_size, page_id);
  PageView v;
  Status s = PageView::Parse(buf.data(), page_size, page_id, "fuzz", &v);
  if (!s.ok()) throw std::runtime_error(s.ToString());
  // Decode every segment as each value type would (readers check Fits() first, then decode
  // keys and values): nothing may be read outside the page.
  std::vector<uint64_t> keys;
  uint64_t sink = 0;
  for (uint32_t i = 0; i < v.nseg(); i++) {
    for (uint32_t width : {0u, 4u, 8u, 16u}) {
      SegmentView sv = v.Segment(i);
      sv.width = width;
      if (!sv.Fits()) continue;
      keys.resize(sv.count);
      sv.DecodeKeys(keys.data());
      for (uint32_t j = 0; j < sv.count; j++) {
        const uint8_t* p;
        uint32_t len;
        sv.Value(j, &p, &len);
        for (uint32_t k = 0; k < len; k += 64) sink += p[k];
        if (len) sink += p[len - 1];
      }
    }
  }
  volatile uint64_t keep = sink;
  (void)keep;
  return static_cast<int>(v.nseg());
}

// Fuzz entry: the records of a WAL file (framing and record checksums), as (type, payload).
py::list ReadWal(const std::string& path, bool point_in_time) {
  py::list out;
  WalReadEnd end;
  Status s = ReadWalFile(path, [&](uint8_t type, const std::string& p) {
    out.append(py::make_tuple(type, py::bytes(p)));
    return Status::OK();
  }, &end, point_in_time);
  if (!s.ok()) throw std::runtime_error(s.ToString());
  return out;
}

// A closed store's RocksDB metadata directory, opened for the two probes below.
std::unique_ptr<rocksdb::DB> OpenMetaDb(const std::string& dir, bool read_only) {
  rocksdb::Options o;
  rocksdb::DB* raw = nullptr;
  const rocksdb::Status s = read_only ? rocksdb::DB::OpenForReadOnly(o, dir, &raw) : rocksdb::DB::Open(o, dir, &raw);
  if (!s.ok()) throw std::runtime_error(s.ToString());
  return std::unique_ptr<rocksdb::DB>(raw);
}

// The record of kind `kind` (0 a feature record, 1 a page record, 2 the state record) that
// `pick` chooses among those of that kind: its key and value.
std::pair<std::string, std::string> PickMetaRecord(rocksdb::DB* db, int kind, int pick) {
  const char prefix = kind == 0 ? 'F' : kind == 1 ? 'P' : 'S';
  std::vector<std::pair<std::string, std::string>> recs;
  std::unique_ptr<rocksdb::Iterator> it(db->NewIterator(rocksdb::ReadOptions()));
  for (it->Seek(std::string(1, prefix)); it->Valid() && it->key().size() && it->key()[0] == prefix; it->Next())
    recs.emplace_back(it->key().ToString(), it->value().ToString());
  if (recs.empty()) throw std::runtime_error("no record of that kind");
  return recs[static_cast<size_t>(pick) % recs.size()];
}

// Fuzz entry: overwrites the value of one metadata record of a closed store (kinds and
// `pick` as PickMetaRecord), or deletes it (no value): the records RocksDB lost, or a
// read-only view of it that a writer's flush left inconsistent.
void MetaPut(const std::string& dir, int kind, int pick, const std::optional<std::string>& value) {
  std::unique_ptr<rocksdb::DB> db = OpenMetaDb(dir, false);
  const std::string key = PickMetaRecord(db.get(), kind, pick).first;
  rocksdb::WriteOptions wo;
  wo.sync = true;
  const rocksdb::Status s = value ? db->Put(wo, key, *value) : db->Delete(wo, key);
  if (!s.ok()) throw std::runtime_error(s.ToString());
}

// The value of one metadata record of a closed store (kinds as MetaPut): lets a test rewrite
// a record as an older version wrote it (the state record without its later fields).
py::bytes MetaGet(const std::string& dir, int kind, int pick) {
  return py::bytes(PickMetaRecord(OpenMetaDb(dir, true).get(), kind, pick).second);
}

}  // namespace

namespace recflash::bind {

void RegisterTestingBindings(py::module_& parent) {
  py::module_ m = parent.def_submodule("_testing", "test-only fault injection and engine probes");
  m.def("kinds", [] {
    std::vector<std::string> v;
    for (int i = 0; i < static_cast<int>(fault::Kind::kCount); i++) v.push_back(fault::KindName(static_cast<fault::Kind>(i)));
    return v;
  });
  m.def("arm", [](const std::string& kind, uint64_t nth, int err, bool sticky, const std::string& path) {
    if (nth == 0) throw py::value_error("nth counts from 1");
    fault::Arm(KindArg(kind), nth, err, sticky, path);
  }, py::arg("kind"), py::arg("nth") = 1, py::arg("errno") = EIO, py::arg("sticky") = false, py::arg("path") = "");
  m.def("disarm", &fault::DisarmAll);
  m.def("calls", [](const std::string& kind) { return fault::Calls(KindArg(kind)); });
  m.def("kill_points", [] {
    std::vector<std::string> v(fault::KillPointNames().begin(), fault::KillPointNames().end());
    return v;
  });
  m.def("arm_kill_point", [](const std::string& name, uint64_t nth, bool power_loss, uint64_t seed) {
    bool known = name == "any";
    for (const char* k : fault::KillPointNames()) known = known || name == k;
    if (!known) throw py::value_error("unknown kill point '" + name + "'");
    fault::ArmKillPoint(name, nth, power_loss, seed);
  }, py::arg("name"), py::arg("nth") = 1, py::arg("power_loss") = false, py::arg("seed") = 0);
  m.def("kill_point_hits", [] {
    py::dict d;
    for (auto& [k, v] : fault::KillPointHits()) d[py::str(k)] = v;
    return d;
  });
  m.def("arm_pause_point", &fault::ArmPausePoint, py::arg("name"));
  m.def("wait_paused", [](double timeout_s) {
    py::gil_scoped_release nogil;
    return fault::WaitPaused(timeout_s);
  }, py::arg("timeout_s"));
  m.def("release_pause", &fault::ReleasePause);
  m.def("track_power_loss", &fault::SetTracking, py::arg("on"), py::arg("seed") = 0);
  m.def("power_loss", [](int code) { fault::PowerLoss(code); }, py::arg("exit_code") = 86);
  m.def("status_to_string", [](int code, const std::string& msg) { return StatusOf(code, msg).ToString(); });
  m.def("decode_page", &DecodePage, py::arg("data"), py::arg("page_size"), py::arg("page_id") = 0,
        py::arg("fix_checksum") = false);
  m.def("read_wal", &ReadWal, py::arg("path"), py::arg("point_in_time") = true);
  m.def("meta_put", &MetaPut, py::arg("dir"), py::arg("kind"), py::arg("pick"), py::arg("value"));
  m.def("meta_get", &MetaGet, py::arg("dir"), py::arg("kind"), py::arg("pick"));
  m.def("meta_delete", [](const std::string& dir, int kind, int pick) { MetaPut(dir, kind, pick, std::nullopt); },
        py::arg("dir"), py::arg("kind"), py::arg("pick"));
  m.def("load_block_sums", [](const std::string& path, uint32_t page_size, uint32_t block_size) {
    BlockSums b(page_size, block_size);
    b.Load(path);
    return b.Has(0, 0);
  });
  m.def("crc32c", [](const std::string& data) { return crc32c::Value(data.data(), data.size()); });
  py::class_<TestRing>(m, "TestRing")
      .def(py::init<unsigned, uint32_t>(), py::arg("depth"), py::arg("slot_bytes"))
      .def("read_runs", &TestRing::ReadRuns, py::arg("path"), py::arg("page_size"), py::arg("runs"),
           py::arg("max_inflight_bytes") = 0, py::arg("idle_pump_ms") = 0.0)
      .def_property_readonly("peak_inflight_bytes", &TestRing::peak_inflight_bytes)
      .def_property_readonly("pumped_runs", &TestRing::pumped_runs)
      .def_property_readonly("broken", &TestRing::broken);
}

}  // namespace recflash::bind
