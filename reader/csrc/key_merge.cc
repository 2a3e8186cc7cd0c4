#include "reader/csrc/key_merge.h"

#include "reader/csrc/run_merge.h"

#include <algorithm>
#include <cstring>

namespace recflash {

namespace {

// The first record at or after r whose key is >= bound (records of a chunk ascend).
uint64_t LowerBound(const KeyChunk& c, uint64_t r, uint64_t bound) {
  if (c.span) {
    if (bound <= c.first + r) return r;
    return std::min<uint64_t>(c.n, bound - c.first);
  }
  return static_cast<uint64_t>(std::lower_bound(c.keys.begin() + r, c.keys.end(), bound) - c.keys.begin());
}

// Records [r0, r1) of c that are not tombstones, appended.
void EmitRun(const KeyChunk& c, uint64_t r0, uint64_t r1, HVec<uint64_t>* out) {
  if (r1 <= r0) return;
  const size_t base = out->size();
  out->resize(base + (r1 - r0));
  uint64_t* o = out->data() + base;
  if (c.span) {
    for (uint64_t r = r0; r < r1; r++) *o++ = c.first + r;
    return;
  }
  if (c.tomb.empty()) {
    std::memcpy(o, c.keys.data() + r0, (r1 - r0) * sizeof(uint64_t));
    return;
  }
  size_t w = 0;
  for (uint64_t r = r0; r < r1; r++) {
    o[w] = c.keys[r];
    w += c.tomb[r] == 0;
  }
  out->resize(base + w);
}

}  // namespace

void MergeKeyChunks(const std::vector<KeyChunk>& cs, HVec<uint64_t>* out) {
  std::vector<uint32_t> order;
  uint64_t total = 0;
  for (uint32_t c = 0; c < cs.size(); c++)
    if (cs[c].size()) {
      order.push_back(c);
      total += cs[c].size();
    }
  std::sort(order.begin(), order.end(), [&](uint32_t a, uint32_t b) {
    return cs[a].key(0) < cs[b].key(0) || (cs[a].key(0) == cs[b].key(0) && cs[a].seq > cs[b].seq);
  });
  bool simple = true;  // disjoint, no tombstones
  for (size_t i = 0; i < order.size() && simple; i++) {
    const KeyChunk& c = cs[order[i]];
    simple = c.tomb.empty() && (i == 0 || c.key(0) > cs[order[i - 1]].key(cs[order[i - 1]].size() - 1));
  }
  if (simple) {
    out->reserve(out->size() + total);
    for (uint32_t c : order) EmitRun(cs[c], 0, cs[c].size(), out);
    return;
  }
  MergeNewestFirst(
      order, cs.size(), [&](uint32_t c) { return cs[c].size(); }, [&](uint32_t c, uint64_t r) { return cs[c].key(r); },
      [&](uint32_t c) { return cs[c].seq; },
      [&](uint32_t c, uint64_t r, uint64_t bound) { return LowerBound(cs[c], r, bound); },
      [&](uint32_t c, uint64_t r0, uint64_t r1) { EmitRun(cs[c], r0, r1, out); });
}

void OverlayBufferedKeys(const HVec<uint64_t>& disk, const std::vector<uint64_t>& bkeys,
                         const std::vector<uint8_t>& btomb, HVec<uint64_t>* out) {
  out->clear();
  out->reserve(disk.size() + bkeys.size());
  size_t i = 0, j = 0;
  const size_t nd = disk.size(), nb = bkeys.size();
  while (j < nb) {
    // The page keys below the next buffered key, in one copy.
    const size_t z = std::lower_bound(disk.begin() + i, disk.end(), bkeys[j]) - disk.begin();
    out->insert(out->end(), disk.begin() + i, disk.begin() + z);
    i = z;
    if (i < nd && disk[i] == bkeys[j]) i++;  // the buffered write is newer
    if (!btomb[j]) out->push_back(bkeys[j]);
    j++;
  }
  out->insert(out->end(), disk.begin() + i, disk.end());
}

}  // namespace recflash
