// FeatureBuffer keeps fixed-width items without per-item offsets (value i at i * width, a
// tombstone's slot zeroed) and variable-width ones with offsets; both must normalize to the
// last write per key in key order, and copy a key range (whole, or its keys alone), against
// a std::map model.
#include <gtest/gtest.h>

#include <cstring>
#include <map>
#include <optional>
#include <random>
#include <string>

#include "reader/csrc/write_buffer.h"

namespace recflash {
namespace {

using Model = std::map<uint64_t, std::optional<std::string>>;  // nullopt: deleted

void ExpectEqual(const BufferedItems& b, const Model& m, uint64_t lo, uint64_t hi) {
  size_t i = 0;
  for (auto it = m.lower_bound(lo); it != m.end() && it->first < hi; ++it, ++i) {
    ASSERT_LT(i, b.size());
    EXPECT_EQ(b.keys[i], it->first);
    EXPECT_EQ(b.tomb[i] != 0, !it->second.has_value()) << "key " << it->first;
    if (it->second) {
      ASSERT_EQ(b.length(i), it->second->size()) << "key " << it->first;
      EXPECT_EQ(std::string(reinterpret_cast<const char*>(b.value(i)), b.length(i)), *it->second) << "key " << it->first;
    } else {
      EXPECT_EQ(b.length(i), 0u);
    }
  }
  EXPECT_EQ(i, b.size());
}

void RunModel(uint32_t width, uint64_t seed) {
  std::mt19937_64 rng(seed);
  FeatureBuffer fb;
  Model m;
  for (int batch = 0; batch < 60; batch++) {
    const size_t n = 1 + rng() % 50;
    const bool tomb = rng() % 5 == 0;
    const bool ascending = rng() % 2 == 0;  // the normalized fast path, and the general one
    std::vector<uint64_t> keys(n);
    uint64_t k = rng() % 400;
    for (size_t i = 0; i < n; i++) keys[i] = ascending ? (k += 1 + rng() % 3) : rng() % 400;
    std::string values;
    std::vector<int64_t> offsets{0};
    for (size_t i = 0; i < n; i++) {
      const size_t len = width ? width : rng() % 12;
      std::string v;
      for (size_t j = 0; j < len; j++) v += static_cast<char>('a' + rng() % 26);
      values += v;
      offsets.push_back(static_cast<int64_t>(values.size()));
      m[keys[i]] = tomb ? std::nullopt : std::optional<std::string>(v);
    }
    fb.Append(keys.data(), n, tomb ? nullptr : reinterpret_cast<const uint8_t*>(values.data()),
              width || tomb ? nullptr : offsets.data(), width, tomb);
    if (rng() % 4 == 0) {
      BufferedItems part;
      const uint64_t lo = rng() % 300, hi = lo + rng() % 200;
      fb.CopyRange(lo, hi, &part);
      ExpectEqual(part, m, lo, hi);
      // The keys-only copy (Store::ScanKeys) holds the same keys and tombstone flags.
      std::vector<uint64_t> keys;
      std::vector<uint8_t> tombs;
      fb.CopyKeys(lo, hi, &keys, &tombs);
      EXPECT_EQ(keys, part.keys);
      EXPECT_EQ(tombs, part.tomb);
    }
  }
  fb.Normalize();
  ExpectEqual(fb.items(), m, 0, UINT64_MAX);
  uint64_t bytes = 0;
  for (const auto& [k, v] : m) bytes += ItemBytes(v ? static_cast<uint32_t>(v->size()) : 0);
  EXPECT_EQ(fb.bytes(), bytes);
  EXPECT_EQ(fb.items().off.empty(), width != 0);  // fixed width: no per-item offsets
}

TEST(WriteBuffer, FixedWidthItemsNormalizeToTheLastWrite) {
  for (uint64_t seed = 1; seed <= 20; seed++) RunModel(8, seed);
  for (uint64_t seed = 1; seed <= 5; seed++) RunModel(12, seed);
}

TEST(WriteBuffer, VariableWidthItemsNormalizeToTheLastWrite) {
  for (uint64_t seed = 1; seed <= 20; seed++) RunModel(0, seed);
}

}  // namespace
}  // namespace recflash
