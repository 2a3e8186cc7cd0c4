// SlsEngine: SparseLengthsSum (embedding-bag pooling) next to the store.
//
// For each request the (index, position) pairs are sorted by row id and de-duplicated
// (RecSSD's sorted (input id, result id) pairs), the unique rows are gathered once from the
// store (Store::GatherRows: computed addresses, vector-grained reads), and pooled into the
// bags by position — so only the pooled [B, dim] result leaves the engine.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

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
  uint32_t dim = 0;                  // expected row width; checked against the table
};

struct SlsStats {
  uint64_t lookups = 0;       // indices over all bags
  uint64_t unique_rows = 0;   // rows gathered after de-duplication
  GatherStats gather;         // summed over tables
  double seconds = 0;
};

class SlsEngine {
 public:
  explicit SlsEngine(Store* store) : store_(store) {}
  Status Run(const std::vector<SlsRequest>& requests, bool vector_grained, SlsStats* stats);

 private:
  Store* store_;
};

}  // namespace recflash::ndp
