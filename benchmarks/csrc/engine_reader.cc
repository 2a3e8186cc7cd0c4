// READER's feature reads for benchmarks/compaction.py, replayed through the engine's C++ API
// (Store::ScanMany) with no Python in between: what the engine itself takes for a round's
// reads when it is driven the way page_reader drives the `opt` and `lsm` layouts.
//
// The READER rows' read_time_s is the wall time of recflash.reader.Store.scan() from Python:
// the engine, its binding, the Arrow table, and between two reads the benchmark's check of
// the result. page_reader has none of that (one C++ loop, its check a few microseconds after
// its timer), and this virtual disk serves a read more slowly when it idled before it. This
// harness runs the same engine code over the same reads in page_reader's kind of loop, so
// each READER row also shows read_time_native_s: the share of a gap to `opt` that is the
// engine's, and the share that is the Python API's.
//
// Usage: engine_reader STORE_DIR PLAN.txt OUT.bin [--option NAME=VALUE ...]
//   PLAN.txt   one feature name per line, the reads in order
//   OUT.bin    per read {f64 seconds, f64 engine_seconds, f64 io_wait_seconds, u64 bytes_read,
//              u64 pages_read, u64 items, u64 checksum}
//   --option   a StoreOptions field the reads depend on (page_size, write_buffer_bytes,
//              direct_io, queue_depth, max_io_bytes, read_inflight_bytes,
//              single_lane_inflight_bytes, read_poll_us, lane_read_poll_us, scan_threads,
//              verify_block_reads);
//              the others keep the engine's defaults (no write happens).
// The checksum is item_checksum.cc's (page_reader's formula): sum(key * 0x9E3779B97F4A7C15 + first
// 8 value bytes) (mod 2^64), taken after the timer, so the benchmark checks these reads against
// the expected contents as it checks the Python ones. Prints one JSON line of totals.
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <memory>
#include <string>
#include <vector>

#include "reader/csrc/store.h"

extern "C" uint64_t rf_items_checksum(const uint64_t* keys, const uint8_t* values, uint64_t n, uint64_t stride);

namespace {

using recflash::ColumnData;
using recflash::ReadStats;
using recflash::Status;
using recflash::Store;
using recflash::StoreOptions;

struct OpResult {
  double seconds, engine_seconds, io_wait_seconds;
  uint64_t bytes_read, pages_read, items, checksum;
};
static_assert(sizeof(OpResult) == 56);

[[noreturn]] void Die(const std::string& msg) {
  std::fprintf(stderr, "engine_reader: %s\n", msg.c_str());
  std::exit(1);
}

double Now() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

void SetOption(StoreOptions* o, const std::string& kv) {
  const size_t eq = kv.find('=');
  if (eq == std::string::npos) Die("--option wants NAME=VALUE, got '" + kv + "'");
  const std::string k = kv.substr(0, eq), v = kv.substr(eq + 1);
  const uint64_t n = std::strtoull(v.c_str(), nullptr, 10);
  const bool b = v == "1" || v == "true" || v == "True";
  if (k == "page_size") o->page_size = static_cast<uint32_t>(n);
  else if (k == "write_buffer_bytes") o->write_buffer_bytes = n;
  else if (k == "direct_io") o->direct_io = b;
  else if (k == "queue_depth") o->queue_depth = static_cast<uint32_t>(n);
  else if (k == "max_io_bytes") o->max_io_bytes = static_cast<uint32_t>(n);
  else if (k == "read_inflight_bytes") o->read_inflight_bytes = n;
  else if (k == "single_lane_inflight_bytes") o->single_lane_inflight_bytes = n;
  else if (k == "read_poll_us") o->read_poll_us = static_cast<uint32_t>(n);
  else if (k == "lane_read_poll_us") o->lane_read_poll_us = static_cast<uint32_t>(n);
  else if (k == "scan_threads") o->scan_threads = static_cast<uint32_t>(n);
  else if (k == "verify_block_reads") o->verify_block_reads = b;
  else Die("unknown or unsupported option '" + k + "'");
}

// The check of a scan's items: rf_items_checksum (item_checksum.cc), the one the Python side
// applies to the timed scans' tables.
uint64_t Checksum(const ColumnData& c) {
  const size_t n = c.keys.size();
  if (n == 0) return 0;
  const size_t stride = c.values.size() / n;
  if (stride < 8) Die("values narrower than 8 bytes");
  return rf_items_checksum(c.keys.data(), c.values.data(), n, stride);
}

}  // namespace

int main(int argc, char** argv) {
  if (argc < 4) Die("usage: engine_reader STORE_DIR PLAN.txt OUT.bin [--option NAME=VALUE ...]");
  StoreOptions o;
  for (int i = 4; i < argc; i++) {
    if (std::string(argv[i]) != "--option" || i + 1 >= argc) Die(std::string("unknown argument ") + argv[i]);
    SetOption(&o, argv[++i]);
  }
  std::vector<std::string> names;
  {
    std::ifstream in(argv[2]);
    if (!in) Die(std::string("cannot open ") + argv[2]);
    std::string line;
    while (std::getline(in, line))
      if (!line.empty()) names.push_back(line);
  }
  // A process's first read prepares its ring's buffers (10-20 ms: io_ring.cc, PrepareSlots);
  // the benchmark's Python process has long done so, and its rings outlive a store (they are
  // pooled per process). So one untimed scan on a first open, then the timed reads on a fresh
  // open, as the Python side's: key indexes are decoded by the timed reads, as there.
  std::unique_ptr<Store> store;
  Status st = Store::Open(argv[1], o, &store);
  if (!st.ok()) Die("open " + std::string(argv[1]) + ": " + st.ToString());
  if (!names.empty()) {
    std::vector<ColumnData> cols;
    ReadStats rs;
    st = store->ScanMany({names[0]}, 0, UINT64_MAX, &cols, &rs);
    if (st.ok()) st = store->Close();
    store.reset();
    if (st.ok()) st = Store::Open(argv[1], o, &store);
    if (!st.ok()) Die("warm-up scan and reopen of " + std::string(argv[1]) + ": " + st.ToString());
  }
  std::vector<OpResult> out(names.size());
  double total = 0;
  for (size_t i = 0; i < names.size(); i++) {
    std::vector<ColumnData> cols;
    ReadStats rs;
    const double t = Now();
    st = store->ScanMany({names[i]}, 0, UINT64_MAX, &cols, &rs);
    const double dt = Now() - t;
    if (!st.ok()) Die("scan of '" + names[i] + "': " + st.ToString());
    total += dt;
    out[i] = {dt, rs.seconds, rs.io_wait_seconds, rs.bytes_read, rs.pages_read, cols[0].keys.size(), Checksum(cols[0])};
  }
  st = store->Close();
  if (!st.ok()) Die("close: " + st.ToString());
  FILE* f = std::fopen(argv[3], "wb");
  if (!f || std::fwrite(out.data(), sizeof(OpResult), out.size(), f) != out.size() || std::fclose(f) != 0)
    Die(std::string("cannot write ") + argv[3]);
  std::printf("{\"reads\": %zu, \"seconds\": %.6f}\n", names.size(), total);
  return 0;
}
