// Keys-only merges (key_merge.h) and KeyIndex::AppendLiveKeys: the live keys of hand-built
// page chunks and buffered writes must be what the scan merges resolve — per key the newest
// version (buffer > higher seq > lower seq), left out when a tombstone — whether the chunks
// are disjoint (concatenated), overlapping (k-way merge) or spans known from the page table.
#include <gtest/gtest.h>

#include <algorithm>
#include <map>
#include <random>

#include "reader/csrc/key_index.h"
#include "reader/csrc/key_merge.h"

namespace recflash {
namespace {

KeyChunk Keys(uint64_t seq, const std::vector<uint64_t>& keys, const std::vector<uint64_t>& tombs = {}) {
  KeyChunk c;
  c.seq = seq;
  c.keys = keys;
  if (!tombs.empty())
    for (uint64_t k : keys) c.tomb.push_back(std::find(tombs.begin(), tombs.end(), k) != tombs.end());
  return c;
}

std::vector<uint64_t> Merge(const std::vector<KeyChunk>& cs) {
  HVec<uint64_t> out;
  MergeKeyChunks(cs, &out);
  return std::vector<uint64_t>(out.begin(), out.end());
}

// By brute force: the newest record per key, live unless a tombstone.
std::vector<uint64_t> Expected(const std::vector<KeyChunk>& cs) {
  std::map<uint64_t, std::pair<uint64_t, bool>> best;  // key -> (seq, tomb)
  for (const KeyChunk& c : cs)
    for (uint64_t r = 0; r < c.size(); r++) {
      auto it = best.find(c.key(r));
      if (it == best.end() || it->second.first < c.seq) best[c.key(r)] = {c.seq, c.is_tomb(r)};
    }
  std::vector<uint64_t> out;
  for (const auto& [k, v] : best)
    if (!v.second) out.push_back(k);
  return out;
}

TEST(KeyMerge, DisjointChunksConcatenateInKeyOrder) {
  // Page order is not key order; spans and decoded keys mix.
  const std::vector<KeyChunk> cs = {Keys(3, {20, 25, 29}), KeyChunk::Span(1, 0, 9), Keys(2, {}),
                                    KeyChunk::Span(5, 10, 12)};
  EXPECT_EQ(Merge(cs), (std::vector<uint64_t>{0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 20, 25, 29}));
}

TEST(KeyMerge, NewestVersionWinsAndTombstonesHide) {
  // Key 5: put in seq 1, deleted in seq 2, put again in seq 3. Key 7: put in 1, deleted in 3.
  // Key 9: deleted in 1 (older), put in 2.
  const std::vector<KeyChunk> cs = {Keys(1, {5, 6, 7, 9}, {9}), Keys(2, {5, 9}, {5}), Keys(3, {5, 7}, {7})};
  EXPECT_EQ(Merge(cs), (std::vector<uint64_t>{5, 6, 9}));
  EXPECT_EQ(Merge(cs), Expected(cs));
}

TEST(KeyMerge, OverlappingSpansNeedNoDecodedKeys) {
  // An update page (seq 2) over a dense load (spans): the union, once per key.
  const std::vector<KeyChunk> cs = {KeyChunk::Span(1, 0, 99), KeyChunk::Span(1, 100, 199), Keys(2, {50, 150, 250})};
  std::vector<uint64_t> want;
  for (uint64_t k = 0; k < 200; k++) want.push_back(k);
  want.push_back(250);
  EXPECT_EQ(Merge(cs), want);
  // A delete in a newer page hides a span's key.
  const std::vector<KeyChunk> del = {KeyChunk::Span(1, 10, 14), Keys(4, {12}, {12})};
  EXPECT_EQ(Merge(del), (std::vector<uint64_t>{10, 11, 13, 14}));
}

TEST(KeyMerge, RandomChunksMatchBruteForce) {
  std::mt19937_64 rng(7);
  for (int round = 0; round < 300; round++) {
    std::vector<KeyChunk> cs;
    const int n = 1 + static_cast<int>(rng() % 6);
    for (int c = 0; c < n; c++) {
      const uint64_t seq = rng() % 4;  // equal seqs only on disjoint spans below
      if (rng() % 3 == 0) {
        const uint64_t first = 1000 * c + rng() % 50;  // spans of different chunks never share keys
        cs.push_back(KeyChunk::Span(10 + c, first, first + rng() % 40));
        continue;
      }
      std::vector<uint64_t> keys, tombs;
      for (uint64_t k = rng() % 20; k < 6000; k += 1 + rng() % 300) {
        keys.push_back(k);
        if (rng() % 4 == 0) tombs.push_back(k);
      }
      cs.push_back(Keys(20 + 4 * c + seq, keys, tombs));
    }
    ASSERT_EQ(Merge(cs), Expected(cs)) << "round " << round;
  }
}

TEST(KeyMerge, BufferedWritesOverlayThePagesKeys) {
  HVec<uint64_t> disk;
  for (uint64_t k : {2, 4, 6, 8, 10}) disk.push_back(k);
  HVec<uint64_t> out;
  // Put 1 (new), delete 4, put 6 again (already there), delete 7 (absent), put 12 (new).
  OverlayBufferedKeys(disk, {1, 4, 6, 7, 12}, {0, 1, 0, 1, 0}, &out);
  EXPECT_EQ(std::vector<uint64_t>(out.begin(), out.end()), (std::vector<uint64_t>{1, 2, 6, 8, 10, 12}));
  OverlayBufferedKeys(HVec<uint64_t>(), {3, 5}, {1, 0}, &out);
  EXPECT_EQ(std::vector<uint64_t>(out.begin(), out.end()), (std::vector<uint64_t>{5}));
  OverlayBufferedKeys(disk, {}, {}, &out);
  EXPECT_EQ(out.size(), 5u);
}

TEST(KeyIndexLiveKeys, TombstonesAndRangesDenseAndSparse) {
  for (bool dense : {true, false}) {
    KeyIndex idx;
    std::vector<uint64_t> keys;
    std::vector<uint32_t> locs;
    for (uint64_t i = 0; i < 10; i++) {
      keys.push_back(dense ? 100 + i : 100 + 3 * i);
      locs.push_back(static_cast<uint32_t>(i % 3) | (i % 4 == 1 ? KeyIndex::kTomb : 0u));
    }
    idx.InsertNew(keys, locs, {});
    ASSERT_EQ(idx.dense(), dense);
    std::vector<uint64_t> live;
    for (size_t i = 0; i < keys.size(); i++)
      if (i % 4 != 1) live.push_back(keys[i]);
    HVec<uint64_t> out;
    idx.AppendLiveKeys(0, UINT64_MAX, &out);
    EXPECT_EQ(std::vector<uint64_t>(out.begin(), out.end()), live);
    // [keys[2], keys[6]): appended after what out holds.
    HVec<uint64_t> part;
    part.push_back(1);
    idx.AppendLiveKeys(keys[2], keys[6], &part);
    std::vector<uint64_t> want = {1};
    for (size_t i = 2; i < 6; i++)
      if (i % 4 != 1) want.push_back(keys[i]);
    EXPECT_EQ(std::vector<uint64_t>(part.begin(), part.end()), want);
    HVec<uint64_t> none;
    idx.AppendLiveKeys(keys[9] + 1, UINT64_MAX, &none);
    idx.AppendLiveKeys(0, keys[0], &none);
    idx.AppendLiveKeys(keys[3], keys[3], &none);
    EXPECT_TRUE(none.empty());
  }
}

}  // namespace
}  // namespace recflash
