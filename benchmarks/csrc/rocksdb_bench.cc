// Real-RocksDB strategies (`rocksdb`, `rocksdb-universal`) of benchmarks/compaction.py.
//
// Data comes from binary files written by the Python side (no per-item Python):
//   WORKLOAD/offsets.bin   u64[F + 1]    item offsets of the features (item ids are global)
//   WORKLOAD/keys.bin      u64[N]        the key of every item id
//   WORKLOAD/init_vals.bin u8[N * V]     initial values
//   WORKLOAD/upd_gids.bin  u64[U]        item id of every update, in order
//   WORKLOAD/upd_vals.bin  u8[U * V]     their values
// A RocksDB key is big-endian feature id (4 bytes) || big-endian key (8 bytes), so a feature is
// one contiguous key range and the prefix extractor (fixed, 4 bytes) names it.
//
//   rocksdb_bench write --db DIR --workload DIR --style leveled|universal --page-size B
//       --write-buffer B --cache B --value-bytes V --batch B
//     load: each feature written in WriteBatches (of at most 1 Mi items), then Flush and
//     wait until no flush/compaction is pending or running; update: the updates in
//     WriteBatches of --batch, then Flush and wait again. Prints JSON: phase times and the
//     statistics tickers (flush / compaction bytes written and read, WAL bytes) and
//     /proc/self/io deltas per phase, SST sizes, files per level.
//   rocksdb_bench read --db DIR --plan PLAN.bin --out OUT.bin [same options]
//     opens the DB (auto compaction off, so nothing runs in the background), then for each
//     feature id in PLAN.bin (u64 n, u32 fid[n]) iterates the feature: Seek(prefix) with
//     prefix_same_as_start and an upper bound, copying every key and value out. Per read:
//     {f64 seconds, u64 device bytes read (/proc/self/io read_bytes delta, which counts
//     O_DIRECT reads), u64 items, u64 checksum, u64 perf_context block_read_byte}.
//     checksum = sum(key * 0x9E3779B97F4A7C15 + first 8 value bytes) mod 2^64.
//
// Options beyond RocksDB 7.8's defaults: no compression, block size = page size, block cache
// --cache bytes (index and filter blocks live in the table readers, i.e. DRAM metadata),
// use_direct_reads, use_direct_io_for_flush_and_compaction, write_buffer_size = the budget,
// max_background_jobs = 2 (this machine has 2 cores), statistics on. WAL on, not synced.
#include <rocksdb/cache.h>
#include <rocksdb/db.h>
#include <rocksdb/iostats_context.h>
#include <rocksdb/options.h>
#include <rocksdb/perf_context.h>
#include <rocksdb/perf_level.h>
#include <rocksdb/slice_transform.h>
#include <rocksdb/statistics.h>
#include <rocksdb/table.h>
#include <rocksdb/write_batch.h>
#include <sys/resource.h>
#include <unistd.h>

#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <map>
#include <memory>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

using namespace ROCKSDB_NAMESPACE;

namespace {

constexpr uint64_t kMix = 0x9E3779B97F4A7C15ull;

[[noreturn]] void Die(const std::string& msg) {
  std::fprintf(stderr, "rocksdb_bench: %s\n", msg.c_str());
  std::exit(2);
}

void Check(const Status& s, const char* what) {
  if (!s.ok()) Die(std::string(what) + ": " + s.ToString());
}

double Now() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

template <typename T>
std::vector<T> ReadFile(const std::string& path) {
  std::ifstream in(path, std::ios::binary | std::ios::ate);
  if (!in) Die("cannot open " + path);
  const size_t bytes = in.tellg();
  if (bytes % sizeof(T)) Die(path + ": size not a multiple of the element size");
  std::vector<T> v(bytes / sizeof(T));
  in.seekg(0);
  in.read(reinterpret_cast<char*>(v.data()), bytes);
  if (!in) Die("cannot read " + path);
  return v;
}

struct ProcIo {
  uint64_t read_bytes = 0, write_bytes = 0, rchar = 0, wchar = 0;
};

ProcIo ReadProcIo() {
  ProcIo r;
  FILE* f = std::fopen("/proc/self/io", "r");
  if (!f) return r;
  char name[64];
  unsigned long long v;
  while (std::fscanf(f, "%63[^:]: %llu\n", name, &v) == 2) {
    std::string n = name;
    if (n == "read_bytes") r.read_bytes = v;
    else if (n == "write_bytes") r.write_bytes = v;
    else if (n == "rchar") r.rchar = v;
    else if (n == "wchar") r.wchar = v;
  }
  std::fclose(f);
  return r;
}

void PutBE32(char* p, uint32_t v) {
  for (int i = 3; i >= 0; i--) p[3 - i] = static_cast<char>(v >> (8 * i));
}
void PutBE64(char* p, uint64_t v) {
  for (int i = 7; i >= 0; i--) p[7 - i] = static_cast<char>(v >> (8 * i));
}
uint64_t GetBE64(const char* p) {
  uint64_t v = 0;
  for (int i = 0; i < 8; i++) v = (v << 8) | static_cast<uint8_t>(p[i]);
  return v;
}

struct Args {
  std::string mode, db, workload, plan, out, style = "leveled";
  uint64_t page = 16384, write_buffer = 64 << 20, cache = 8 << 20, value_bytes = 8, batch = 65536;
};

Args Parse(int argc, char** argv) {
  if (argc < 2) Die("usage: rocksdb_bench write|read --db DIR ...");
  Args a;
  a.mode = argv[1];
  for (int i = 2; i < argc; i++) {
    std::string k = argv[i];
    if (i + 1 >= argc) Die("missing value for " + k);
    std::string v = argv[++i];
    if (k == "--db") a.db = v;
    else if (k == "--workload") a.workload = v;
    else if (k == "--plan") a.plan = v;
    else if (k == "--out") a.out = v;
    else if (k == "--style") a.style = v;
    else if (k == "--page-size") a.page = std::stoull(v);
    else if (k == "--write-buffer") a.write_buffer = std::stoull(v);
    else if (k == "--cache") a.cache = std::stoull(v);
    else if (k == "--value-bytes") a.value_bytes = std::stoull(v);
    else if (k == "--batch") a.batch = std::stoull(v);
    else Die("unknown option " + k);
  }
  if (a.db.empty()) Die("--db is required");
  if (a.style != "leveled" && a.style != "universal") Die("--style must be leveled or universal");
  return a;
}

Options MakeOptions(const Args& a) {
  Options o;
  o.create_if_missing = true;
  o.compression = kNoCompression;
  o.bottommost_compression = kNoCompression;
  o.write_buffer_size = a.write_buffer;
  o.max_background_jobs = 2;
  o.use_direct_reads = true;
  o.use_direct_io_for_flush_and_compaction = true;
  o.prefix_extractor.reset(NewFixedPrefixTransform(4));
  o.statistics = CreateDBStatistics();
  if (a.style == "universal") o.compaction_style = kCompactionStyleUniversal;
  BlockBasedTableOptions t;
  t.block_size = a.page;
  t.block_cache = NewLRUCache(a.cache);
  t.cache_index_and_filter_blocks = false;
  o.table_factory.reset(NewBlockBasedTableFactory(t));
  return o;
}

uint64_t IntProp(DB* db, const std::string& name) {
  uint64_t v = 0;
  db->GetIntProperty(name, &v);
  return v;
}

// Waits until no flush is pending or running and no compaction is running. RocksDB can report
// "compaction-pending" while its picker declines to schedule anything (universal compaction does
// after a load); such a state, stable for 1 s with nothing running, counts as idle.
// *idle_at is when the DB was first seen idle (the 1 s of watching is not work).
bool WaitIdle(DB* db, double* idle_at) {
  int idle_ticks = 0;
  for (;;) {
    const double now = Now();
    const bool busy = IntProp(db, "rocksdb.mem-table-flush-pending") != 0 ||
                      IntProp(db, "rocksdb.num-running-flushes") != 0 ||
                      IntProp(db, "rocksdb.num-running-compactions") != 0;
    if (!busy && IntProp(db, "rocksdb.compaction-pending") == 0) {
      *idle_at = now;
      return false;
    }
    if (busy || idle_ticks == 0) *idle_at = now;
    idle_ticks = busy ? 0 : idle_ticks + 1;
    if (idle_ticks >= 50) return true;  // pending but not scheduled
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
}

const std::vector<std::pair<const char*, Tickers>> kTickers = {
    {"flush_write_bytes", FLUSH_WRITE_BYTES},     {"compact_write_bytes", COMPACT_WRITE_BYTES},
    {"compact_read_bytes", COMPACT_READ_BYTES},   {"wal_bytes", WAL_FILE_BYTES},
    {"bytes_written", BYTES_WRITTEN},             {"stall_micros", STALL_MICROS},
};

std::map<std::string, uint64_t> Tick(const Options& o) {
  std::map<std::string, uint64_t> m;
  for (auto& [n, t] : kTickers) m[n] = o.statistics->getTickerCount(t);
  return m;
}

std::string Delta(const std::map<std::string, uint64_t>& a, const std::map<std::string, uint64_t>& b,
                  const ProcIo& ia, const ProcIo& ib, double secs) {
  std::ostringstream s;
  s << "{\"seconds\": " << secs;
  for (auto& [n, v] : b) s << ", \"" << n << "\": " << (v - a.at(n));
  s << ", \"proc_read_bytes\": " << (ib.read_bytes - ia.read_bytes)
    << ", \"proc_write_bytes\": " << (ib.write_bytes - ia.write_bytes) << "}";
  return s.str();
}

std::string LevelInfo(DB* db) {
  std::ostringstream s;
  s << "{\"total_sst_bytes\": " << IntProp(db, "rocksdb.total-sst-files-size")
    << ", \"live_sst_bytes\": " << IntProp(db, "rocksdb.live-sst-files-size")
    << ", \"estimate_live_data_size\": " << IntProp(db, "rocksdb.estimate-live-data-size")
    << ", \"table_readers_mem\": " << IntProp(db, "rocksdb.estimate-table-readers-mem")
    << ", \"files_per_level\": [";
  for (int l = 0; l < 7; l++) {
    std::string v;
    db->GetProperty("rocksdb.num-files-at-level" + std::to_string(l), &v);
    s << (l ? ", " : "") << (v.empty() ? "0" : v);
  }
  s << "]}";
  return s.str();
}

int Write(const Args& a) {
  auto offsets = ReadFile<uint64_t>(a.workload + "/offsets.bin");
  auto keys = ReadFile<uint64_t>(a.workload + "/keys.bin");
  auto init = ReadFile<uint8_t>(a.workload + "/init_vals.bin");
  auto gids = ReadFile<uint64_t>(a.workload + "/upd_gids.bin");
  auto vals = ReadFile<uint8_t>(a.workload + "/upd_vals.bin");
  const uint64_t F = offsets.size() - 1, N = keys.size(), U = gids.size(), V = a.value_bytes;
  if (offsets.back() != N || init.size() != N * V || vals.size() != U * V) Die("inconsistent workload files");
  // Feature of every item id.
  std::vector<uint32_t> fid(N);
  for (uint64_t f = 0; f < F; f++)
    for (uint64_t g = offsets[f]; g < offsets[f + 1]; g++) fid[g] = static_cast<uint32_t>(f);

  Options o = MakeOptions(a);
  DB* raw = nullptr;
  Check(DB::Open(o, a.db, &raw), "open");
  std::unique_ptr<DB> db(raw);
  WriteOptions wo;
  char kbuf[12];
  auto put = [&](WriteBatch& b, uint64_t g, const uint8_t* v) {
    PutBE32(kbuf, fid[g]);
    PutBE64(kbuf + 4, keys[g]);
    b.Put(Slice(kbuf, 12), Slice(reinterpret_cast<const char*>(v), V));
  };

  auto t0 = Tick(o);
  auto io0 = ReadProcIo();
  double s0 = Now();
  for (uint64_t f = 0; f < F; f++) {
    for (uint64_t g = offsets[f]; g < offsets[f + 1];) {
      WriteBatch b;
      const uint64_t end = std::min<uint64_t>(offsets[f + 1], g + (uint64_t{1} << 20));
      for (; g < end; g++) put(b, g, &init[g * V]);
      Check(db->Write(wo, &b), "load write");
    }
  }
  FlushOptions fo;
  fo.wait = true;
  Check(db->Flush(fo), "flush");
  double s1 = 0;
  const bool pending_after_load = WaitIdle(db.get(), &s1);
  auto t1 = Tick(o);
  auto io1 = ReadProcIo();
  std::string after_load = LevelInfo(db.get());

  for (uint64_t i = 0; i < U;) {
    WriteBatch b;
    const uint64_t end = std::min<uint64_t>(U, i + a.batch);
    for (; i < end; i++) put(b, gids[i], &vals[i * V]);
    Check(db->Write(wo, &b), "update write");
  }
  Check(db->Flush(fo), "flush");
  double s2 = 0;
  const bool pending_after_update = WaitIdle(db.get(), &s2);
  auto t2 = Tick(o);
  auto io2 = ReadProcIo();
  std::string after_update = LevelInfo(db.get());
  std::string stats;
  db->GetProperty("rocksdb.stats", &stats);
  Check(db->Close(), "close");
  db.reset();
  rusage ru{};
  getrusage(RUSAGE_SELF, &ru);
  std::printf("{\"load\": %s, \"update\": %s, \"after_load\": %s, \"after_update\": %s, "
              "\"compaction_pending_unscheduled_after_load\": %s, "
              "\"compaction_pending_unscheduled_after_update\": %s, \"maxrss_kb\": %ld}\n",
              Delta(t0, t1, io0, io1, s1 - s0).c_str(), Delta(t1, t2, io1, io2, s2 - s1).c_str(),
              after_load.c_str(), after_update.c_str(), pending_after_load ? "true" : "false",
              pending_after_update ? "true" : "false", ru.ru_maxrss);
  // The compaction summary, for the curious (stderr keeps stdout one JSON line).
  std::fprintf(stderr, "%s\n", stats.c_str());
  return 0;
}

int Read(const Args& a) {
  std::ifstream in(a.plan, std::ios::binary);
  if (!in) Die("cannot open " + a.plan);
  uint64_t n = 0;
  in.read(reinterpret_cast<char*>(&n), 8);
  std::vector<uint32_t> fids(n);
  in.read(reinterpret_cast<char*>(fids.data()), n * 4);
  if (!in) Die("truncated plan");

  Options o = MakeOptions(a);
  o.create_if_missing = false;
  o.disable_auto_compactions = true;
  DB* raw = nullptr;
  Check(DB::Open(o, a.db, &raw), "open");
  std::unique_ptr<DB> db(raw);
  std::string info = LevelInfo(db.get());

  SetPerfLevel(PerfLevel::kEnableCount);
  struct Res {
    double seconds;
    uint64_t bytes, items, checksum, block_read_bytes;
  };
  std::vector<Res> res;
  res.reserve(n);
  std::vector<uint64_t> out_keys;
  std::vector<char> out_vals;
  const uint64_t V = a.value_bytes;
  double total = 0;
  uint64_t total_bytes = 0, total_items = 0;
  auto io_start = ReadProcIo();
  rusage ru0{};
  getrusage(RUSAGE_SELF, &ru0);
  for (uint64_t i = 0; i < n; i++) {
    char lo[4], hi[4];
    PutBE32(lo, fids[i]);
    PutBE32(hi, fids[i] + 1);
    Slice upper(hi, 4);
    ReadOptions ro;
    ro.prefix_same_as_start = true;
    ro.iterate_upper_bound = &upper;
    get_perf_context()->Reset();
    auto io0 = ReadProcIo();
    const double t0 = Now();
    uint64_t items = 0, sum = 0;
    {
      std::unique_ptr<Iterator> it(db->NewIterator(ro));
      for (it->Seek(Slice(lo, 4)); it->Valid(); it->Next()) {
        const Slice k = it->key(), v = it->value();
        if (k.size() != 12 || v.size() != V) Die("unexpected key/value size");
        const uint64_t key = GetBE64(k.data() + 4);
        if (out_keys.size() <= items) {
          out_keys.resize(std::max<size_t>(1024, out_keys.size() * 2));
          out_vals.resize(out_keys.size() * V);
        }
        out_keys[items] = key;
        std::memcpy(&out_vals[items * V], v.data(), V);
        uint64_t v0;
        std::memcpy(&v0, v.data(), 8);
        sum += key * kMix + v0;
        items++;
      }
      Check(it->status(), "iterator");
    }
    const double t1 = Now();
    auto io1 = ReadProcIo();
    res.push_back({t1 - t0, io1.read_bytes - io0.read_bytes, items, sum, get_perf_context()->block_read_byte});
    total += t1 - t0;
    total_bytes += io1.read_bytes - io0.read_bytes;
    total_items += items;
  }
  auto io_end = ReadProcIo();
  rusage ru1{};
  getrusage(RUSAGE_SELF, &ru1);
  auto secs = [](const timeval& t) { return t.tv_sec + t.tv_usec / 1e6; };
  const double read_cpu = secs(ru1.ru_utime) - secs(ru0.ru_utime) + secs(ru1.ru_stime) - secs(ru0.ru_stime);
  FILE* out = std::fopen(a.out.c_str(), "wb");
  if (!out) Die("cannot write " + a.out);
  if (!res.empty() && std::fwrite(res.data(), sizeof(Res), res.size(), out) != res.size()) Die("write failed");
  std::fclose(out);
  Check(db->Close(), "close");
  db.reset();
  rusage ru{};
  getrusage(RUSAGE_SELF, &ru);
  std::printf("{\"ops\": %llu, \"seconds\": %.6f, \"bytes_read\": %llu, \"proc_read_bytes_total\": %llu, "
              "\"items\": %llu, \"block_cache_data_hit\": %llu, \"block_cache_data_miss\": %llu, "
              "\"read_cpu_s\": %.3f, \"db\": %s, \"maxrss_kb\": %ld}\n",
              (unsigned long long)n, total, (unsigned long long)total_bytes,
              (unsigned long long)(io_end.read_bytes - io_start.read_bytes), (unsigned long long)total_items,
              (unsigned long long)o.statistics->getTickerCount(BLOCK_CACHE_DATA_HIT),
              (unsigned long long)o.statistics->getTickerCount(BLOCK_CACHE_DATA_MISS), read_cpu, info.c_str(),
              ru.ru_maxrss);
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  Args a = Parse(argc, argv);
  if (a.mode == "write") return Write(a);
  if (a.mode == "read") return Read(a);
  Die("mode must be write or read");
}
