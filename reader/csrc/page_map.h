// PageMap: page id -> position in a small list of pages (a feature's pages in a scan, its
// segment ranges in a checkpoint). Lookups run once per key on the read path (consecutive
// keys of a fragmented feature mostly name different pages), so the map is a flat table over
// the pages' id span when that span is small next to the lookups it serves — one load per
// lookup — and open addressing otherwise (a flat table over the ids of a three-page feature
// in a large store could be megabytes).
#pragma once
#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <utility>
#include <vector>

namespace recflash {

class PageMap {
 public:
  // pages[0, n) distinct; `lookups`: how many Finds the map will serve (sizes the flat table).
  template <typename PageOf>
  PageMap(size_t n, const PageOf& page_of, size_t lookups) {
    if (n == 0) return;
    uint32_t lo = UINT32_MAX, hi = 0;
    for (size_t j = 0; j < n; j++) {
      lo = std::min(lo, page_of(j));
      hi = std::max(hi, page_of(j));
    }
    if (uint64_t{hi} - lo <= 16 * uint64_t{lookups} + 4096) {
      base_ = lo;
      flat_.assign(uint64_t{hi} - lo + 1, -1);
      for (size_t j = 0; j < n; j++) flat_[page_of(j) - lo] = static_cast<int32_t>(j);
      return;
    }
    size_t cap = 16;
    while (cap < 2 * n) cap <<= 1;
    mask_ = cap - 1;
    slots_.assign(cap, {UINT32_MAX, -1});
    for (size_t j = 0; j < n; j++) {
      size_t h = Hash(page_of(j));
      while (slots_[h].first != UINT32_MAX) h = (h + 1) & mask_;
      slots_[h] = {page_of(j), static_cast<int32_t>(j)};
    }
  }

  // The page's position, or -1.
  int32_t Find(uint32_t page) const {
    if (!flat_.empty()) return page >= base_ && page - base_ < flat_.size() ? flat_[page - base_] : -1;
    if (slots_.empty()) return -1;
    for (size_t h = Hash(page);; h = (h + 1) & mask_) {
      if (slots_[h].first == page) return slots_[h].second;
      if (slots_[h].first == UINT32_MAX) return -1;
    }
  }

 private:
  size_t Hash(uint32_t page) const { return (page * 0x9E3779B1u) & mask_; }
  uint32_t base_ = 0;
  std::vector<int32_t> flat_;
  size_t mask_ = 0;
  std::vector<std::pair<uint32_t, int32_t>> slots_;
};

}  // namespace recflash
