// SlsEngine: SparseLengthsSum (embedding-bag pooling) next to the store.
//
// For each request the (index, position) pairs are sorted by row id and de-duplicated
// (RecSSD's sorted (input id, result id) pairs), the unique rows are gathered once from the
// store (Store::GatherRows: computed addresses, vector-grained reads), and pooled into the
// bags by position — so only the pooled [B, dim] result leaves the engine.
#pragma once
#include <cstdint>
#include <memory>

#include <string>
#include <unordered_map>
#include <vector>

#include "ndp/csrc/cache.h"
#include "ndp/csrc/row_format.h"
#include "reader/csrc/mutex.h"
#include "reader/csrc/store.h"

namespace recflash::ndp {

struct SlsRequest {
  std::string table;
  const int64_t* indices = nullptr;
  size_t num_indices = 0;
  const int64_t* offsets = nullptr;  // num_bags + 1 entries: bag b is indices[offsets[b], offsets[b+1])
  size_t num_bags = 0;
  const float* weights = nullptr;    // per-sample weights (num_indices) or null
  bool mean = false;                 // mode "mean" instead of "sum"
  float* out = nullptr;              // num_bags x dim, written (not accumulated)
  uint32_t dim = 0;                  // values per row (the pooled width)
  RowFormat format = RowFormat::kFloat32;  // how a stored row holds them; the table's stored
                                           // width must be RowWords(format, dim)
};

struct SlsStats {
  uint64_t lookups = 0;       // indices over all bags
  uint64_t unique_rows = 0;   // rows gathered after de-duplication
  GatherStats gather;         // summed over tables (seconds: until the last table's rows were in)
  double seconds = 0;
};

struct SlsOptions {
  bool vector_grained = true;     // block-granular reads at computed addresses (else pages)
  // With vector_grained: a page from which one call needs this many rows or more is read
  // whole, in runs with adjacent ones (Store::GatherRows); 0: block reads only.
  uint32_t dense_page_rows = 0;
  size_t row_cache_bytes = 0;     // host LRU row cache
  size_t hot_rows_bytes = 0;      // static hot-row partition (filled by Profile, or automatically)
  // With hot_rows_bytes and no Profile call: the ids of the first hot_rows_profile_ids
  // lookups Run serves are counted, then the hottest of them fill the partition (once).
  // 0: only Profile fills it.
  uint64_t hot_rows_profile_ids = 100000;
  size_t pooled_cache_bytes = 0;  // pooled-embedding cache
  uint32_t pooled_min_bag = 8;    // only bags at least this long are cached
  size_t device_cache_bytes = 0;  // store-side direct-mapped row cache, split over tables
  uint32_t expected_tables = 1;
};

class SlsEngine {
 public:
  explicit SlsEngine(Store* store, const SlsOptions& o = SlsOptions());
  Status Run(const std::vector<SlsRequest>& requests, SlsStats* stats);
  // Counts row frequencies over a representative trace and keeps the hottest rows that fit
  // hot_rows_bytes in DRAM; they are then pooled without touching the store. Replaces the
  // automatic profile (hot_rows_profile_ids) from then on.
  Status Profile(const std::vector<SlsRequest>& requests);
  // Rows of `table` were rewritten (update_rows): drop or refresh every cached copy.
  Status Invalidate(const std::string& table, const uint64_t* ids, size_t n);
  std::string CacheStatsJson();

 private:
  // Per-table state of one Run, kept across calls so its buffers are reused.
  struct Work {
    FeatureDef def;
    std::vector<uint8_t> done;  // bags answered by the pooled cache
    bool pool_cacheable = false;
    std::vector<uint32_t> order, uid_of, miss_u;
    std::vector<uint64_t> uids;
    uint32_t words = 0;          // stored width of a row (RowWords)
    std::vector<float> rows, decoded;  // raw rows; decoded (quantized formats only)
    std::vector<uint8_t> held;  // per unique row: served by a cache (GatherRequest::have)
    DirectMappedCache* dev = nullptr;
    GatherStats gs;
  };
  Status Prepare(const SlsRequest& r, Work* wk) RF_REQUIRES(mu_);
  void Pool(const SlsRequest& r, Work* wk) RF_REQUIRES(mu_);
  DirectMappedCache* DeviceCache(uint32_t fid, uint32_t dim) RF_REQUIRES(mu_);
  struct HotTable {
    std::string name;
    uint32_t words = 0;
  };
  // The hottest rows of `freq` (RowKey -> count) that fit hot_rows_bytes into hot_.
  Status FillHot(const std::unordered_map<uint64_t, uint32_t>& freq,
                 std::unordered_map<uint32_t, HotTable>& tables) RF_REQUIRES(mu_);
  // Automatic profile: counts the ids Run served until hot_rows_profile_ids, then FillHot.
  void AutoProfile(const std::vector<SlsRequest>& requests) RF_REQUIRES(mu_);
  Store* store_;
  SlsOptions o_;
  Mutex mu_;  // one Run at a time per engine (caches are not thread-safe)
  RowCache rows_ RF_GUARDED_BY(mu_);
  PooledCache pooled_ RF_GUARDED_BY(mu_);
  HotRows hot_ RF_GUARDED_BY(mu_);
  std::unordered_map<uint32_t, std::unique_ptr<DirectMappedCache>> device_ RF_GUARDED_BY(mu_);
  std::vector<Work> work_ RF_GUARDED_BY(mu_);
  bool auto_profile_ RF_GUARDED_BY(mu_) = false;  // still counting for the automatic profile
  uint64_t auto_seen_ RF_GUARDED_BY(mu_) = 0;
  std::unordered_map<uint64_t, uint32_t> auto_freq_ RF_GUARDED_BY(mu_);
  std::unordered_map<uint32_t, HotTable> auto_tables_ RF_GUARDED_BY(mu_);
};

}  // namespace recflash::ndp
