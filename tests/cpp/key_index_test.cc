// KeyIndex: dense and sparse keys, ascending probes, erase, deferral, snapshots, checkpoint round trip.
#include <gtest/gtest.h>

#include <algorithm>
#include <string>

#include "reader/csrc/key_index.h"

namespace recflash {
namespace {

KeyIndex Build(const std::vector<uint64_t>& keys, bool lens = false) {
  KeyIndex idx;
  idx.track_lengths(lens);
  std::vector<uint32_t> locs, ls;
  for (size_t i = 0; i < keys.size(); i++) {
    locs.push_back(static_cast<uint32_t>(i % 5));
    ls.push_back(static_cast<uint32_t>(i * 3));
  }
  idx.InsertNew(keys, locs, ls);
  return idx;
}

TEST(KeyIndex, DenseRunKeepsNoKeyArray) {
  KeyIndex idx = Build({10, 11, 12, 13});
  EXPECT_TRUE(idx.dense());
  EXPECT_EQ(idx.size(), 4u);
  EXPECT_EQ(idx.Find(12), 2);
  EXPECT_EQ(idx.Find(9), KeyIndex::kAbsent);
  EXPECT_EQ(idx.Find(14), KeyIndex::kAbsent);
  EXPECT_EQ(idx.key(3), 13u);
  // A gap turns it sparse, keeping every key findable.
  idx.InsertNew({20}, {4}, {0});
  EXPECT_FALSE(idx.dense());
  EXPECT_EQ(idx.Find(20), 4);
  EXPECT_EQ(idx.Find(13), 3);
  EXPECT_EQ(idx.loc(4), 4u);
}

TEST(KeyIndex, SparseInsertFindFromAndErase) {
  KeyIndex idx = Build({5, 50, 500}, true);
  idx.InsertNew({1, 70, 9000}, {7, 8, 9}, {11, 12, 13});
  ASSERT_EQ(idx.size(), 6u);
  const std::vector<uint64_t> want = {1, 5, 50, 70, 500, 9000};
  for (size_t i = 0; i < want.size(); i++) EXPECT_EQ(idx.key(i), want[i]);
  EXPECT_EQ(idx.len(idx.Find(70)), 12u);
  size_t hint = 0;
  EXPECT_EQ(idx.FindFrom(5, &hint), 1);
  EXPECT_EQ(idx.FindFrom(60, &hint), KeyIndex::kAbsent);
  EXPECT_EQ(idx.FindFrom(9000, &hint), 5);
  idx.Erase({0, 3});
  EXPECT_EQ(idx.size(), 4u);
  EXPECT_EQ(idx.Find(1), KeyIndex::kAbsent);
  EXPECT_EQ(idx.Find(70), KeyIndex::kAbsent);
  EXPECT_EQ(idx.Find(500), 2);
  KeyIndex::Snapshot s = idx.Share(6, 9000);
  EXPECT_EQ(std::vector<uint64_t>(s.keys().begin(), s.keys().end()), (std::vector<uint64_t>{50, 500}));
  EXPECT_EQ(s.locs().size(), 2u);
  s = idx.Share(6, UINT64_MAX);
  EXPECT_EQ(std::vector<uint64_t>(s.keys().begin(), s.keys().end()), (std::vector<uint64_t>{50, 500, 9000}));
}

// A snapshot shares the index's arrays and never changes under its reader: every change made
// while it is held (a location, an insert that merges or appends, an erase, a reload from a
// checkpoint) goes to a copy; once it is released, changes are made in place again.
TEST(KeyIndex, SnapshotsAreCopiedOnWriteAndNeverChange) {
  KeyIndex idx = Build({5, 50, 500}, false);
  const std::vector<uint64_t> keys = {5, 50, 500};
  std::vector<uint32_t> locs;
  for (size_t i = 0; i < keys.size(); i++) locs.push_back(idx.loc(i));
  auto same = [&](const KeyIndex::Snapshot& s) {
    return std::vector<uint64_t>(s.keys().begin(), s.keys().end()) == keys &&
           std::vector<uint32_t>(s.locs().begin(), s.locs().end()) == locs;
  };
  {
    KeyIndex::Snapshot s = idx.Share(0, UINT64_MAX);
    const uint64_t* shared = s.keys().data();
    ASSERT_TRUE(same(s));
    idx.set_loc(1, 77);
    EXPECT_TRUE(same(s));
    EXPECT_EQ(idx.loc(1), 77u);
    KeyIndex::Snapshot s2 = idx.Share(0, UINT64_MAX);
    EXPECT_NE(s2.keys().data(), shared);  // the change copied the arrays
    idx.InsertNew({7}, {9}, {});             // a merge into the middle
    idx.InsertNew({9000}, {10}, {});         // an append
    idx.Erase({0});
    EXPECT_TRUE(same(s));
    EXPECT_EQ(std::vector<uint64_t>(s2.keys().begin(), s2.keys().end()), keys);
    EXPECT_EQ(s2.locs()[1], 77u);
    EXPECT_EQ(idx.size(), 4u);
    EXPECT_EQ(idx.key(0), 7u);
    EXPECT_EQ(idx.key(3), 9000u);
    std::string blob;
    Build({1, 2, 1000}, false).Serialize(&blob);
    const char* p = blob.data();
    ASSERT_TRUE(idx.Deserialize(&p, blob.data() + blob.size()));
    EXPECT_EQ(idx.key(2), 1000u);
    EXPECT_TRUE(same(s));
  }
  // Nothing shares the arrays now: a change is made in place.
  const uint64_t* before = idx.Share(0, UINT64_MAX).keys().data();
  idx.set_loc(0, 5);
  EXPECT_EQ(idx.Share(0, UINT64_MAX).keys().data(), before);
  // A copy of the index is a value: changing one leaves the other as it was.
  KeyIndex copy = idx;
  copy.set_loc(0, 6);
  EXPECT_EQ(idx.loc(0), 5u);
  EXPECT_EQ(copy.loc(0), 6u);
  // A dense index has no key array to share.
  EXPECT_TRUE(Build({10, 11, 12}, false).Share(0, UINT64_MAX).keys().empty());
}

TEST(KeyIndex, DeferredTracksOnlyTheLastKey) {
  KeyIndex idx;
  uint64_t last = 0;
  EXPECT_FALSE(idx.LastKey(&last));
  idx.Defer();
  ASSERT_TRUE(idx.deferred());
  idx.AppendDeferred(100, 99);
  idx.AppendDeferred(50, 400);
  EXPECT_EQ(idx.deferred_items(), 150u);
  ASSERT_TRUE(idx.LastKey(&last));
  EXPECT_EQ(last, 400u);
  EXPECT_EQ(idx.size(), 0u);
  idx.Undefer();
  EXPECT_FALSE(idx.deferred());
  KeyIndex full = Build({1, 2});
  full.Defer();  // holds keys: stays an index
  EXPECT_FALSE(full.deferred());
}

TEST(KeyIndex, CheckpointRoundTripAndSkip) {
  // A dense run; near ids (varint runs); sparse 64-bit keys, up to the largest (raw keys).
  const std::vector<uint64_t> sparse = {1ull << 40, 3ull << 50, 1ull << 62, UINT64_MAX - 1, UINT64_MAX};
  for (int kind : {0, 1, 2}) {
    KeyIndex idx = kind == 0 ? Build({100, 101, 102}, true) : kind == 1 ? Build({3, 30, 300, 3000}, true)
                                                                         : Build(sparse, true);
    idx.set_loc(1, 42 | KeyIndex::kTomb);
    std::string blob;
    idx.Serialize(&blob);
    blob += "tail";
    const char* p = blob.data();
    KeyIndex back;
    ASSERT_TRUE(back.Deserialize(&p, blob.data() + blob.size()));
    EXPECT_EQ(std::string(p), "tail");
    ASSERT_EQ(back.size(), idx.size());
    for (size_t i = 0; i < idx.size(); i++) {
      EXPECT_EQ(back.key(i), idx.key(i));
      EXPECT_EQ(back.loc(i), idx.loc(i));
      EXPECT_EQ(back.len(i), idx.len(i));
    }
    const char* q = blob.data();
    ASSERT_TRUE(KeyIndex::Skip(&q, blob.data() + blob.size()));
    EXPECT_EQ(q, p);
    const char* r = blob.data();
    KeyIndex cut;
    EXPECT_FALSE(cut.Deserialize(&r, blob.data() + 3));  // truncated
    if (kind == 2) {
      EXPECT_EQ(blob[0], 3) << "sparse keys are stored raw";
      const char* s = blob.data();
      EXPECT_FALSE(cut.Deserialize(&s, blob.data() + 18 + 8 * 3));  // cut inside the keys
      const char* t = blob.data();
      EXPECT_FALSE(KeyIndex::Skip(&t, blob.data() + 18 + 8 * 3));
      std::string swapped = blob;  // two keys out of order: refused, not a broken index
      std::swap_ranges(swapped.begin() + 18, swapped.begin() + 26, swapped.begin() + 26);
      const char* u = swapped.data();
      EXPECT_FALSE(cut.Deserialize(&u, swapped.data() + swapped.size()));
    } else {
      EXPECT_NE(blob[0], 3);
    }
  }
}

}  // namespace
}  // namespace recflash
