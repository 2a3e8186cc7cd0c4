// The k-way merge of sorted chunks by (key, newest seq first) that a scan falls back to when
// neither the key index nor a dense merge applies (MergeHeap, scan_merge.cc) and that keys-only
// scans use (MergeKeyChunks, key_merge.cc). One algorithm over two chunk types: the chunks'
// keys, seqs and how a run of records is emitted are the caller's.
//
// Each key is decided by its newest version (the chunk with the highest seq holding it); the
// older versions are skipped. A chunk's records are emitted in runs: a run extends while its
// keys stay below every other chunk's next key (those keys have no other version), so chunks
// that do not overlap cost one Emit each. Tombstones are emitted like any record (Emit drops
// them), so a deleted key hides its older versions.
#pragma once
#include <algorithm>
#include <cstdint>
#include <vector>

namespace recflash {

// order: the non-empty chunks sorted by (first key, newest seq first). Chunk c has size(c)
// records with ascending keys key(c, r) and version seq(c); lower_bound(c, r, bound) is the
// first record at or after r whose key is >= bound; emit(c, r0, r1) takes records [r0, r1).
template <typename Size, typename Key, typename Seq, typename LowerBound, typename Emit>
void MergeNewestFirst(const std::vector<uint32_t>& order, size_t nchunks, const Size& size, const Key& key,
                      const Seq& seq, const LowerBound& lower_bound, const Emit& emit) {
  struct HE {
    uint64_t key, seq;
    uint32_t c;
  };
  auto later = [](const HE& a, const HE& b) { return a.key > b.key || (a.key == b.key && a.seq < b.seq); };
  std::vector<HE> heap;
  std::vector<uint64_t> pos(nchunks, 0);
  size_t nx = 0;
  bool have_last = false;
  uint64_t last = 0;  // the last key decided (emitted, or hidden by a tombstone)
  for (;;) {
    while (nx < order.size() && (heap.empty() || key(order[nx], 0) <= heap.front().key)) {
      const uint32_t c = order[nx++];
      heap.push_back({key(c, 0), seq(c), c});
      std::push_heap(heap.begin(), heap.end(), later);
    }
    if (heap.empty()) break;
    std::pop_heap(heap.begin(), heap.end(), later);
    const HE t = heap.back();
    heap.pop_back();
    const uint64_t r = pos[t.c];
    uint64_t r1 = r + 1;
    if (!(have_last && key(t.c, r) == last)) {  // else an older version of a decided key
      uint64_t bound = UINT64_MAX;
      if (!heap.empty()) bound = heap.front().key;
      if (nx < order.size()) bound = std::min(bound, key(order[nx], 0));
      r1 = std::max(r + 1, static_cast<uint64_t>(lower_bound(t.c, r + 1, bound)));
      emit(t.c, r, r1);
      last = key(t.c, r1 - 1);
      have_last = true;
    }
    pos[t.c] = r1;
    if (r1 < size(t.c)) {
      heap.push_back({key(t.c, r1), t.seq, t.c});
      std::push_heap(heap.begin(), heap.end(), later);
    }
  }
}

}  // namespace recflash
