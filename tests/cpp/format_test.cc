// Page encode/decode round trips for every value type and key encoding (run, varint, raw,
// bitmap), tombstones, compact int64 packing, keys-only segment views, page verification, and
// page-run coalescing.
#include <gtest/gtest.h>

#include <cstring>
#include <random>

#include "reader/csrc/format.h"
#include "reader/csrc/io_ring.h"

namespace recflash {
namespace {

constexpr uint32_t kPage = 16384;

enum class Keys { kRun, kVarint, kRaw, kBitmap };

std::vector<uint64_t> MakeKeys(Keys k, size_t n) {
  std::vector<uint64_t> v;
  std::mt19937_64 rng(n);
  uint64_t x = 1000;
  for (size_t i = 0; i < n; i++) {
    switch (k) {
      case Keys::kRun: x += 1; break;
      case Keys::kVarint: x += 1 + rng() % 200; break;   // 1-2 byte deltas
      case Keys::kRaw: x += (1ull << 50) + rng() % (1ull << 40); break;  // 8-byte deltas
      case Keys::kBitmap: x += 1 + rng() % 3; break;     // dense with gaps: a bitmap is smaller
    }
    v.push_back(x);
  }
  return v;
}

FeatureDef Def(ValueType t, uint32_t dim = 0) {
  FeatureDef d;
  d.id = 3;
  d.name = "f";
  d.type = t;
  d.dim = dim;
  return d;
}

// Values of item i: deterministic bytes of the type's shape.
std::vector<uint8_t> Value(const FeatureDef& d, size_t i) {
  std::vector<uint8_t> v;
  auto put = [&](const void* p, size_t n) { v.insert(v.end(), static_cast<const uint8_t*>(p), static_cast<const uint8_t*>(p) + n); };
  switch (d.type) {
    case ValueType::kFloat32: { const float f = 0.5f * i; put(&f, 4); break; }
    case ValueType::kInt64: { const int64_t x = 1000 + static_cast<int64_t>(i % 250); put(&x, 8); break; }
    case ValueType::kFixedFloat32: for (uint32_t j = 0; j < d.dim; j++) { const float f = i + 0.25f * j; put(&f, 4); } break;
    case ValueType::kListInt64: for (size_t j = 0; j < i % 4; j++) { const int64_t x = -static_cast<int64_t>(i * j); put(&x, 8); } break;
    case ValueType::kListFloat32: for (size_t j = 0; j < i % 3; j++) { const float f = 1.0f * i * j; put(&f, 4); } break;
    case ValueType::kBinary: for (size_t j = 0; j < i % 7; j++) v.push_back(static_cast<uint8_t>('a' + (i + j) % 26)); break;
  }
  return v;
}

struct Case {
  ValueType type;
  uint32_t dim;
  Keys keys;
  bool compact;
  bool tombs;
};

void RoundTrip(const Case& c) {
  SCOPED_TRACE(::testing::Message() << "type " << static_cast<int>(c.type) << " keys " << static_cast<int>(c.keys)
                                    << " compact " << c.compact << " tombs " << c.tombs);
  const FeatureDef d = Def(c.type, c.dim);
  const std::vector<uint64_t> keys = MakeKeys(c.keys, 200);
  PageBuilder pb(kPage, c.compact);
  std::vector<std::vector<uint8_t>> vals;
  size_t n = 0;
  for (; n < keys.size(); n++) {
    const bool tomb = c.tombs && n % 5 == 2;
    vals.push_back(tomb ? std::vector<uint8_t>() : Value(d, n));
    if (!pb.Add(d, keys[n], vals[n].data(), static_cast<uint32_t>(vals[n].size()), tomb)) break;
  }
  ASSERT_GT(n, 10u);
  std::vector<uint8_t> buf(kPage);
  std::vector<SegmentSummary> sums;
  pb.Finish(buf.data(), 77, 5, &sums);
  PageView pv;
  ASSERT_TRUE(PageView::Parse(buf.data(), kPage, 5, "test", &pv).ok());
  EXPECT_EQ(pv.seq(), 77u);
  SegmentView sv;
  ASSERT_TRUE(pv.Find(d.id, &sv));
  ASSERT_EQ(sv.count, n);
  EXPECT_EQ(sv.min_key, keys[0]);
  EXPECT_EQ(sv.max_key, keys[n - 1]);
  if (!c.tombs) {
    switch (c.keys) {
      case Keys::kRun: EXPECT_TRUE(sv.run_keys); break;
      case Keys::kVarint: EXPECT_TRUE(!sv.run_keys && !sv.raw_keys && !sv.bitmap_keys); break;
      case Keys::kRaw: EXPECT_TRUE(sv.raw_keys); break;
      case Keys::kBitmap: EXPECT_EQ(sv.bitmap_keys, c.compact); break;
    }
  }
  sv.width = d.fixed_width();
  std::vector<uint64_t> got(sv.count);
  sv.DecodeKeys(got.data());
  for (size_t i = 0; i < n; i++) {
    ASSERT_EQ(got[i], keys[i]) << i;
    const bool tomb = c.tombs && i % 5 == 2;
    ASSERT_EQ(sv.is_tomb(static_cast<uint32_t>(i)), tomb) << i;
    if (tomb) continue;
    const uint8_t* p;
    uint32_t len;
    sv.Value(static_cast<uint32_t>(i), &p, &len);
    ASSERT_EQ(len, vals[i].size()) << i;
    ASSERT_EQ(std::memcmp(p, vals[i].data(), len), 0) << i;
  }
  // Keys only (Store::ScanKeys): the same keys and tombstones, the values not located and
  // packed int64s not widened.
  SegmentView ko;
  ASSERT_TRUE(pv.Find(d.id, &ko, true));
  EXPECT_FALSE(ko.damaged);
  EXPECT_EQ(ko.values, nullptr);
  EXPECT_EQ(ko.unpacked, nullptr);
  ASSERT_EQ(ko.count, n);
  std::vector<uint64_t> kk(ko.count);
  ko.DecodeKeys(kk.data());
  EXPECT_EQ(kk, got);
  for (size_t i = 0; i < n; i++) ASSERT_EQ(ko.is_tomb(static_cast<uint32_t>(i)), sv.is_tomb(static_cast<uint32_t>(i))) << i;
}

TEST(PageFormat, EveryValueTypeAndKeyEncodingRoundTrips) {
  const std::pair<ValueType, uint32_t> types[] = {
      {ValueType::kFloat32, 0},     {ValueType::kInt64, 0},       {ValueType::kFixedFloat32, 16},
      {ValueType::kListInt64, 0},   {ValueType::kListFloat32, 0}, {ValueType::kBinary, 0}};
  for (const auto& [t, dim] : types)
    for (Keys k : {Keys::kRun, Keys::kVarint, Keys::kRaw, Keys::kBitmap})
      for (bool compact : {false, true})
        for (bool tombs : {false, true}) RoundTrip({t, dim, k, compact, tombs});
}

TEST(PageFormat, AddRunMatchesAdd) {
  const FeatureDef d = Def(ValueType::kInt64);
  std::vector<uint64_t> keys;
  std::vector<int64_t> vals;
  for (uint64_t i = 0; i < 3000; i++) {
    keys.push_back(10 + i);
    vals.push_back(static_cast<int64_t>(i % 100));
  }
  PageBuilder pb(kPage, true);
  const size_t took = pb.AddRun(d, keys.data(), reinterpret_cast<const uint8_t*>(vals.data()), keys.size());
  ASSERT_GT(took, 0u);
  std::vector<uint8_t> buf(kPage);
  std::vector<SegmentSummary> sums;
  pb.Finish(buf.data(), 1, 0, &sums);
  PageView pv;
  ASSERT_TRUE(PageView::Parse(buf.data(), kPage, 0, "test", &pv).ok());
  SegmentView sv;
  ASSERT_TRUE(pv.Find(d.id, &sv));
  ASSERT_EQ(sv.count, took);
  sv.width = 8;
  for (uint32_t i = 0; i < took; i++) {
    const uint8_t* p;
    uint32_t len;
    sv.Value(i, &p, &len);
    int64_t x;
    std::memcpy(&x, p, 8);
    ASSERT_EQ(x, vals[i]) << i;
  }
}

// Varint key decoding takes eight one-byte deltas at once; runs of them of every length next
// to longer deltas, and streams ending at every offset, decode to the keys written.
TEST(PageFormat, VarintKeysDecodeAcrossOneByteRuns) {
  const FeatureDef d = Def(ValueType::kFloat32);
  std::mt19937_64 rng(7);
  for (size_t n : {1, 7, 8, 9, 15, 16, 17, 31, 64, 333, 1200}) {
    for (int mode = 0; mode < 3; mode++) {
      SCOPED_TRACE(::testing::Message() << "n " << n << " mode " << mode);
      std::vector<uint64_t> keys;
      uint64_t x = 5;
      for (size_t i = 0; i < n; i++) {
        uint64_t delta = 1 + rng() % 127;                           // one byte
        if (mode == 1 && rng() % 9 == 0) delta = 128 + rng() % 20000;  // two or three bytes
        if (mode == 2 && i % 8 == 5) delta = (1ull << 40) + rng() % 1000;  // six bytes
        keys.push_back(x += delta);
      }
      PageBuilder pb(kPage, false);
      const float v = 1.5f;
      size_t took = 0;
      while (took < n && pb.Add(d, keys[took], reinterpret_cast<const uint8_t*>(&v), 4, false)) took++;
      ASSERT_EQ(took, n);
      std::vector<uint8_t> buf(kPage);
      pb.Finish(buf.data(), 1, 0, nullptr);
      PageView pv;
      ASSERT_TRUE(PageView::Parse(buf.data(), kPage, 0, "test", &pv).ok());
      SegmentView sv;
      ASSERT_TRUE(pv.Find(d.id, &sv));
      sv.width = 4;
      std::vector<uint64_t> got(sv.count);
      sv.DecodeKeys(got.data());
      ASSERT_EQ(got, keys);
    }
  }
}

TEST(PageFormat, VerificationCatchesCorruptionAndMisdirection) {
  const FeatureDef d = Def(ValueType::kFloat32);
  PageBuilder pb(kPage);
  const float v = 1.0f;
  ASSERT_TRUE(pb.Add(d, 1, reinterpret_cast<const uint8_t*>(&v), 4, false));
  std::vector<uint8_t> buf(kPage);
  std::vector<SegmentSummary> sums;
  pb.Finish(buf.data(), 1, 9, &sums);
  PageView pv;
  EXPECT_TRUE(PageView::Parse(buf.data(), kPage, 9, "f", &pv).ok());
  EXPECT_EQ(PageView::Parse(buf.data(), kPage, 8, "f", &pv).code(), Status::Code::kCorruption);  // another slot's page
  buf[kPage / 2] ^= 1;
  EXPECT_EQ(PageView::Parse(buf.data(), kPage, 9, "f", &pv).code(), Status::Code::kCorruption);
  std::vector<uint8_t> zero(kPage, 0);  // never written
  EXPECT_EQ(PageView::Parse(zero.data(), kPage, 9, "f", &pv).code(), Status::Code::kCorruption);
}

TEST(PageFormat, StampPageIdRechecksums) {
  const FeatureDef d = Def(ValueType::kFloat32);
  PageBuilder pb(kPage);
  const float v = 1.0f;
  ASSERT_TRUE(pb.Add(d, 1, reinterpret_cast<const uint8_t*>(&v), 4, false));
  std::vector<uint8_t> buf(kPage);
  std::vector<SegmentSummary> sums;
  pb.Finish(buf.data(), 1, 0, &sums, false);
  StampPageId(buf.data(), kPage, 12);
  PageView pv;
  EXPECT_TRUE(PageView::Parse(buf.data(), kPage, 12, "f", &pv).ok());
}

TEST(Coalesce, AdjacentPagesUpToTheLimit) {
  auto runs = CoalescePages({1, 2, 3, 7, 8, 10}, 2);
  std::vector<std::pair<uint32_t, uint32_t>> got;
  for (const PageRun& r : runs) got.emplace_back(r.first, r.count);
  EXPECT_EQ(got, (std::vector<std::pair<uint32_t, uint32_t>>{{1, 2}, {3, 1}, {7, 2}, {10, 1}}));
  EXPECT_TRUE(CoalescePages({}, 8).empty());
  EXPECT_EQ(CoalescePages({5, 6, 7, 8}, UINT32_MAX).size(), 1u);
}

}  // namespace
}  // namespace recflash
