// Keys-only merge (Store::ScanKeys): the live keys of one feature in a key range, from its
// pages' records (keys, tombstone flags, the page's seq) and its buffered writes, with no
// value anywhere. The rules are the scan merges' (scan_merge.h): a buffered write is newer
// than any page, between pages the higher seq wins, and a tombstone hides older versions.
// No I/O and no store state: tests build chunks by hand.
#pragma once
#include <cstdint>
#include <vector>

#include "reader/csrc/column.h"

namespace recflash {

// One page's records of one feature inside the range: either decoded keys, or a span of
// consecutive keys — a segment whose record count equals its key span and that holds no
// tombstone has every key of [min_key, max_key] once, which the page table alone tells, so
// such a page is never read for its keys.
struct KeyChunk {
  uint64_t seq = 0;
  bool span = false;
  uint64_t first = 0;          // span: keys first, first + 1, ..., first + n - 1
  uint64_t n = 0;
  std::vector<uint64_t> keys;  // decoded: ascending, unique
  std::vector<uint8_t> tomb;   // decoded: per key, 1 for a delete; empty when none

  static KeyChunk Span(uint64_t seq, uint64_t first, uint64_t last) {
    KeyChunk c;
    c.seq = seq;
    c.span = true;
    c.first = first;
    c.n = last - first + 1;
    return c;
  }
  uint64_t size() const { return span ? n : keys.size(); }
  uint64_t key(uint64_t r) const { return span ? first + r : keys[r]; }
  bool is_tomb(uint64_t r) const { return !tomb.empty() && tomb[r] != 0; }
};

// Appends to *out the live keys of the chunks, ascending: per key the record of the highest
// seq, left out when it is a tombstone. Chunks with pairwise disjoint keys and no tombstones
// (a clean feature, the usual case) are concatenated in key order; the rest go through a
// k-way merge that emits runs of one chunk, so non-overlapping pages still cost a copy each.
void MergeKeyChunks(const std::vector<KeyChunk>& chunks, HVec<uint64_t>* out);

// Buffered writes over the pages' live keys `disk` (ascending): `bkeys` ascending and unique,
// btomb[i] != 0 for a delete. *out (cleared first): disk and the buffered puts, minus the
// buffered deletes, ascending.
void OverlayBufferedKeys(const HVec<uint64_t>& disk, const std::vector<uint64_t>& bkeys,
                         const std::vector<uint8_t>& btomb, HVec<uint64_t>* out);

}  // namespace recflash
