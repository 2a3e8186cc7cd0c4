// Pinner (READER §3.4): keeps the buffered items of some features in DRAM across a flush so
// that they are written together later instead of being scattered in scraps.
//
// The paper says both "pin the top-n features by buffered item count (max-heap)" and "unpin
// a feature when its pinned bytes reach a threshold (1/4 page)" — but the top features are
// usually already past the threshold. The reading that serves the stated purpose: a feature
// whose buffered bytes are *below* the threshold is a pinning candidate; candidates are taken
// from the max-heap by item count (those closest to a worthwhile batch first) while the pinned
// total stays within the budget (5 % of the buffer). A feature at or past the threshold is
// written. A feature pinned for `max_flushes` consecutive flushes is written anyway, so a
// feature that stops being updated does not hold DRAM (and its WAL) forever.
#pragma once
#include <cstdint>
#include <vector>

namespace recflash {

struct PinnerOptions {
  bool enabled = true;
  double budget_frac = 0.05;     // pinned bytes <= budget_frac * write buffer
  double threshold_frac = 0.25;  // a feature is written once its buffered bytes reach this * page
  uint32_t max_features = 1024;  // n of "top-n"
  uint32_t max_flushes = 8;
};

struct PinCandidate {
  uint32_t fid;
  uint64_t items;
  uint64_t bytes;
  uint32_t pinned_flushes;
};

struct PinnerStats {
  uint64_t flushes = 0;
  uint64_t features_pinned = 0;   // summed over flushes
  uint64_t items_pinned = 0;      // summed over flushes
  uint64_t bytes_pinned = 0;      // summed over flushes
  uint64_t released_threshold = 0;  // previously pinned features written because they reached the threshold
  uint64_t released_age = 0;        // written because they were pinned for max_flushes
};

class Pinner {
 public:
  explicit Pinner(const PinnerOptions& o) : o_(o) {}
  // Returns the ids of the features to keep pinned in this flush.
  std::vector<uint32_t> Choose(const std::vector<PinCandidate>& c, uint64_t buffer_capacity, uint32_t page_size);
  const PinnerStats& stats() const { return stats_; }
  const PinnerOptions& options() const { return o_; }

 private:
  PinnerOptions o_;
  PinnerStats stats_;
};

}  // namespace recflash
