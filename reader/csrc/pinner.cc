#include "reader/csrc/pinner.h"

#include <queue>

namespace recflash {

std::vector<uint32_t> Pinner::Choose(const std::vector<PinCandidate>& cands, uint64_t buffer_capacity,
                                     uint32_t page_size) {
  stats_.flushes++;
  std::vector<uint32_t> pinned;
  if (!o_.enabled) return pinned;
  const uint64_t threshold = static_cast<uint64_t>(o_.threshold_frac * page_size);
  const uint64_t budget = static_cast<uint64_t>(o_.budget_frac * buffer_capacity);
  // Max-heap on buffered item count (the paper's rec-aware pin structure).
  auto cmp = [](const PinCandidate& a, const PinCandidate& b) { return a.items < b.items; };
  std::priority_queue<PinCandidate, std::vector<PinCandidate>, decltype(cmp)> heap(cmp);
  for (const auto& c : cands) {
    if (c.bytes >= threshold) {
      if (c.pinned_flushes > 0) stats_.released_threshold++;
      continue;
    }
    if (c.pinned_flushes >= o_.max_flushes) {
      stats_.released_age++;
      continue;
    }
    heap.push(c);
  }
  uint64_t used = 0;
  while (!heap.empty() && pinned.size() < o_.max_features) {
    PinCandidate c = heap.top();
    heap.pop();
    if (used + c.bytes > budget) continue;  // a smaller one may still fit
    used += c.bytes;
    pinned.push_back(c.fid);
    stats_.features_pinned++;
    stats_.items_pinned += c.items;
    stats_.bytes_pinned += c.bytes;
  }
  return pinned;
}

}  // namespace recflash
