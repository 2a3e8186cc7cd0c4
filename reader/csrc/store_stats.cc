#include "reader/csrc/store_impl.h"

#include "reader/csrc/crc32c.h"
#include "reader/csrc/store_internal.h"

#include <fcntl.h>
#include <sys/file.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/uio.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <numeric>
#include <sstream>
#include <thread>
#include <unordered_map>

namespace recflash {

namespace fs = std::filesystem;
using namespace store_internal;

namespace {

class JsonWriter {
 public:
  void Open() { Sep(); s_ += '{'; first_ = true; }
  void Close() { s_ += '}'; first_ = false; }
  void Key(const std::string& k) {
    Sep();
    s_ += '"';
    for (char c : k) {
      if (c == '"' || c == '\\') s_ += '\\';
      s_ += c;
    }
    s_ += "\":";
    first_ = true;
  }
  void Num(double v) {
    Sep();
    if (!std::isfinite(v)) {
      s_ += "null";
    } else if (v == std::floor(v) && std::fabs(v) < 9e15) {
      s_ += std::to_string(static_cast<long long>(v));
    } else {
      std::ostringstream o;
      o.precision(17);
      o << v;
      s_ += o.str();
    }
  }
  void Str(const std::string& v) {
    Sep();
    s_ += '"' + v + '"';
  }
  void Bool(bool v) { Sep(); s_ += v ? "true" : "false"; }
  void KV(const std::string& k, double v) { Key(k); Num(v); }
  std::string str() const { return s_; }

 private:
  void Sep() {
    if (!first_) s_ += ',';
    first_ = false;
  }
  std::string s_;
  bool first_ = true;
};

}  // namespace

// ---------------------------------------------------------------------------------------
// Statistics

std::string StoreImpl::StatsJson() {
  MutexLock wl(&write_mu_);  // the tables belong to the writer side
  const uint32_t ps = o_.page_size;
  uint64_t live_items = 0, live_bytes = 0, tombs = 0, buffered_items = 0, buffered_bytes = 0;
  for (FeatureState* f : features_.All()) {
    live_items += f->live_items;
    live_bytes += f->live_bytes;
    tombs += f->tombs;
  }
  {
    MutexLock l(&mu_);
    buffered_items = buffer_.items();
    buffered_bytes = buffer_.bytes();
  }
  const uint64_t pages = pages_.live_pages();
  const uint64_t file_bytes = pages * ps;
  double need = 0;
  const double disk_amp = Reclaimer::SpaceAmp(pages_, ps, &need);
  const size_t meta_bytes = features_.MemoryBytes() + pages_.MemoryBytes();
  uint64_t slots = 0;
  if (!closed_) file_.SlotCount(&slots);
  uint64_t wal_bytes = wal_.bytes_written();

  JsonWriter j;
  j.Open();
  j.KV("page_size", ps);
  j.KV("pages_in_use", static_cast<double>(pages));
  j.KV("file_bytes", static_cast<double>(file_bytes));
  j.KV("file_slots", static_cast<double>(std::max<uint64_t>(slots, pages_.slots())));
  j.KV("free_slots", static_cast<double>(pages_.free_slots()));
  j.KV("kept_free_slots", static_cast<double>(pages_.kept_slots()));
  j.KV("live_items", static_cast<double>(live_items));
  j.KV("live_item_bytes", static_cast<double>(live_bytes));
  j.KV("tombstones", static_cast<double>(tombs));
  j.KV("buffered_items", static_cast<double>(buffered_items));
  j.KV("buffered_bytes", static_cast<double>(buffered_bytes));
  j.KV("space_amplification", live_bytes ? static_cast<double>(file_bytes) / live_bytes : 0.0);
  j.KV("space_amplification_pages", disk_amp);
  j.KV("read_amplification", useful_bytes_read_ ? static_cast<double>(bytes_read_) / useful_bytes_read_ : 0.0);
  const uint64_t user_bytes = pstate_.user_bytes_written;
  const uint64_t bytes_written = pstate_.pages_written * ps;
  j.KV("write_amplification", user_bytes ? static_cast<double>(bytes_written) / user_bytes : 0.0);
  j.KV("write_amplification_session_total",
       user_bytes ? static_cast<double>(bytes_written + wal_bytes + meta_.bytes_committed()) / user_bytes : 0.0);
  j.KV("read_amplification_encoded", encoded_bytes_read_ > 0 ? bytes_read_ / encoded_bytes_read_ : 0.0);
  j.KV("pages_read", static_cast<double>(pages_read_));
  j.KV("bytes_read", static_cast<double>(bytes_read_));
  j.KV("useful_bytes_read", static_cast<double>(useful_bytes_read_));
  j.KV("reads", static_cast<double>(reads_));
  j.KV("read_requests", static_cast<double>(read_requests_));
  j.KV("index_merges", static_cast<double>(index_merges_));
  j.KV("lane_scans", static_cast<double>(lane_scans_));
  j.KV("index_merge_fallbacks", static_cast<double>(index_merge_fallbacks_));
  j.KV("pages_written", static_cast<double>(pstate_.pages_written));
  j.KV("bytes_written", static_cast<double>(bytes_written));
  j.KV("flush_pages_written", static_cast<double>(flush_pages_written_));
  j.KV("user_bytes_written", static_cast<double>(user_bytes));
  j.KV("wal_bytes_written", static_cast<double>(wal_bytes));
  j.KV("metadata_bytes_committed", static_cast<double>(meta_.bytes_committed()));
  j.KV("metadata_dram_bytes", static_cast<double>(meta_bytes));
  j.KV("metadata_dram_bytes_per_item", live_items ? static_cast<double>(meta_bytes) / live_items : 0.0);
  j.KV("disk_bytes_per_item", live_items ? static_cast<double>(file_bytes) / live_items : 0.0);
  j.KV("flushes", static_cast<double>(flushes_));
  j.KV("punch_failures", static_cast<double>(punch_failures_));
  j.KV("open_returned_slots", static_cast<double>(open_returned_slots_));
  j.KV("recovery_seconds", recovery_seconds_);
  j.KV("recovered_wal_records", static_cast<double>(recovered_wal_records_));
  j.KV("wal_bytes_dropped", static_cast<double>(wal_bytes_dropped_));
  j.Key("read_only");
  j.Bool(o_.read_only);
  j.Key("opened_from_checkpoint");
  j.Bool(opened_from_checkpoint_);
  // Whether item counts (live_items, per-feature items, fragmentation) are exact: a read-only
  // handle counts every record of its pages as valid until it has the key index (from a
  // matching CHECKPOINT or the pages), so its counts are upper bounds until then.
  j.Key("items_exact");
  j.Bool(key_index_ready_);
  // Whether the CHECKPOINT on disk describes the committed state (kept from the open while
  // nothing was committed, or written by close), and how many this handle wrote.
  j.Key("checkpoint_current");
  j.Bool(checkpoint_current_);
  j.KV("checkpoints_written", static_cast<double>(checkpoints_written_));
  j.Key("direct_io");
  j.Bool(file_.direct() || closed_);
  j.Key("fragmentation");
  j.Open();
  for (FeatureState* f : features_.All()) j.KV(f->def.name, FragmentationDegree(*f, pages_, ps));
  j.Close();
  j.Key("features");
  j.Open();
  for (FeatureState* f : features_.All()) {
    j.Key(f->def.name);
    j.Open();
    j.Key("type");
    j.Str(f->def.TypeString());
    j.KV("items", static_cast<double>(f->live_items));
    j.KV("valid_bytes", static_cast<double>(f->live_bytes));
    j.KV("tombstones", static_cast<double>(f->tombs));
    j.KV("pages", static_cast<double>(f->pages.size()));
    j.KV("fragmentation", FragmentationDegree(*f, pages_, ps));
    j.KV("key_index_bytes", static_cast<double>(f->index_lazy ? f->index_blob.size() : f->index.MemoryBytes()));
    j.Key("dense_keys");
    j.Bool(f->index_lazy ? KeyIndex::SerializedDenseKeys(f->index_blob) : f->index.dense());
    j.Close();
  }
  j.Close();
  const auto& p = pinner_.stats();
  j.Key("pinner");
  j.Open();
  j.Key("enabled");
  j.Bool(pinner_.options().enabled);
  j.KV("flushes", static_cast<double>(p.flushes));
  j.KV("features_pinned", static_cast<double>(p.features_pinned));
  j.KV("items_pinned", static_cast<double>(p.items_pinned));
  j.KV("bytes_pinned", static_cast<double>(p.bytes_pinned));
  j.KV("released_threshold", static_cast<double>(p.released_threshold));
  j.KV("released_age", static_cast<double>(p.released_age));
  j.Close();
  const auto& m = merger_.stats();
  j.Key("merger");
  j.Open();
  j.Key("enabled");
  j.Bool(merger_.options().enabled);
  j.KV("threshold", merger_.options().threshold);
  j.KV("bulk_load_threshold", merger_.options().bulk_load_threshold);
  j.Key("bulk_load");
  j.Bool(merger_.bulk_load());
  j.KV("low_benefit_frac", merger_.options().low_benefit_frac);
  j.KV("run_weight", merger_.options().run_weight);
  j.KV("checks", static_cast<double>(m.checks));
  j.KV("victims", static_cast<double>(m.victims));
  j.KV("pages_gathered", static_cast<double>(m.pages_gathered));
  j.KV("items_moved", static_cast<double>(m.items_moved));
  j.KV("pages_written", static_cast<double>(m.pages_written));
  j.KV("bytes_written", static_cast<double>(m.bytes_written));
  j.KV("pages_released", static_cast<double>(m.pages_released));
  j.Close();
  const auto& r = reclaimer_.stats();
  j.Key("reclaimer");
  j.Open();
  j.Key("enabled");
  j.Bool(reclaimer_.options().enabled);
  j.KV("space_amp_limit", reclaimer_.options().space_amp_limit);
  j.KV("runs", static_cast<double>(r.runs));
  j.KV("pages_cleaned", static_cast<double>(r.pages_cleaned));
  j.KV("items_moved", static_cast<double>(r.items_moved));
  j.KV("bytes_written", static_cast<double>(r.bytes_written));
  j.KV("pages_released", static_cast<double>(r.pages_released));
  j.Close();
  j.Close();
  return j.str();
}

}  // namespace recflash
