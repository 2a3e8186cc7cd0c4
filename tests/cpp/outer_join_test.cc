// JoinKeys gives the sorted union of its inputs and each input key's row in it, on all three
// paths (one input holds the whole span; row-number-like keys; sparse keys), against a
// std::set reference; SpreadFixed puts each value at its row, zeros and null bits elsewhere.
#include <gtest/gtest.h>

#include <cstring>
#include <random>
#include <set>

#include "reader/csrc/outer_join.h"

namespace recflash {
namespace {

void CheckJoin(const std::vector<std::vector<uint64_t>>& inputs) {
  std::vector<KeySpan> in;
  std::set<uint64_t> ref;
  for (const auto& k : inputs) {
    in.push_back({k.data(), k.size()});
    ref.insert(k.begin(), k.end());
  }
  JoinedKeys j;
  JoinKeys(in, &j);
  ASSERT_EQ(j.keys.size(), ref.size());
  ASSERT_TRUE(std::equal(ref.begin(), ref.end(), j.keys.begin()));
  for (size_t i = 0; i < inputs.size(); i++) {
    const auto& k = inputs[i];
    if (j.identical[i]) {
      ASSERT_EQ(k.size(), j.keys.size()) << "input " << i;
      continue;
    }
    ASSERT_EQ(j.pos[i].size(), k.size()) << "input " << i;
    for (size_t r = 0; r < k.size(); r++) ASSERT_EQ(j.keys[j.pos[i][r]], k[r]) << "input " << i << " key " << r;
  }
}

std::vector<uint64_t> Sample(std::mt19937_64& rng, uint64_t base, uint64_t span, double keep) {
  std::vector<uint64_t> k;
  std::bernoulli_distribution take(keep);
  for (uint64_t x = 0; x < span; x++)
    if (take(rng)) k.push_back(base + x);
  return k;
}

TEST(OuterJoin, OneInputHoldsTheSpan) {
  std::mt19937_64 rng(1);
  std::vector<uint64_t> all(5000);
  for (size_t i = 0; i < all.size(); i++) all[i] = 1000 + i;
  CheckJoin({Sample(rng, 1000, 5000, 0.86), all, Sample(rng, 1000, 5000, 0.1), {}});
}

TEST(OuterJoin, RowNumberKeysWithGaps) {
  std::mt19937_64 rng(2);
  for (double keep : {0.95, 0.5, 0.2})
    CheckJoin({Sample(rng, 7, 20000, keep), Sample(rng, 7, 20000, keep), Sample(rng, 5000, 3000, 0.9)});
}

TEST(OuterJoin, SparseKeysMerge) {
  std::mt19937_64 rng(3);
  std::vector<std::vector<uint64_t>> in(4);
  for (auto& k : in) {
    std::set<uint64_t> s;
    while (s.size() < 3000) s.insert(rng() >> (rng() % 2 ? 1 : 20));
    k.assign(s.begin(), s.end());
  }
  in[3] = {0, UINT64_MAX - 1};  // the whole key space: no span-sized map
  CheckJoin(in);
}

TEST(OuterJoin, EmptyAndSingle) {
  CheckJoin({});
  CheckJoin({{}, {}});
  CheckJoin({{42}});
  CheckJoin({{42}, {}});
}

TEST(OuterJoin, SpreadFixedPlacesValuesAndNulls) {
  const std::vector<int64_t> pos = {0, 3, 4, 9, 16};
  const size_t n = 19;
  std::vector<uint32_t> vals = {11, 22, 33, 44, 55};
  std::vector<uint32_t> out(n, 0xdeadbeef);
  std::vector<uint8_t> valid((n + 7) / 8, 0xff);
  SpreadFixed(reinterpret_cast<const uint8_t*>(vals.data()), vals.size(), 4, pos.data(), n,
              reinterpret_cast<uint8_t*>(out.data()), valid.data());
  size_t v = 0;
  for (size_t row = 0; row < n; row++) {
    const bool set = v < pos.size() && static_cast<size_t>(pos[v]) == row;
    EXPECT_EQ((valid[row >> 3] >> (row & 7)) & 1, set ? 1 : 0) << row;
    EXPECT_EQ(out[row], set ? vals[v] : 0u) << row;
    if (set) v++;
  }
}

}  // namespace
}  // namespace recflash
