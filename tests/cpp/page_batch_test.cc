// PageBatch: a flush's appends built on several threads hold every item once, each feature's
// items in key order across pages, and cost at most one page per extra thread; AddRun's
// batched sizing gives the pages that sizing every item (Add) gives, byte for byte.
#include <gtest/gtest.h>

#include <cstring>
#include <random>

#include "reader/csrc/format.h"
#include "reader/csrc/page_batch.h"

namespace recflash {
namespace {

constexpr uint32_t kPage = 16384;

FeatureDef Def(uint32_t id, ValueType t, uint32_t dim = 0) {
  FeatureDef d;
  d.id = id;
  d.name = "f" + std::to_string(id);
  d.type = t;
  d.dim = dim;
  return d;
}

// int64 values of a shape that exercises the packing choices.
std::vector<int64_t> Values(int shape, size_t n, uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::vector<int64_t> v(n);
  for (size_t i = 0; i < n; i++) {
    switch (shape) {
      case 0: v[i] = static_cast<int64_t>(rng() % 7); break;                      // few distinct
      case 1: v[i] = static_cast<int64_t>(rng() % 3000) * 977; break;             // dictionary, wide range
      case 2: v[i] = static_cast<int64_t>(rng() & 0xffffffffu); break;            // hashed ids: no dictionary
      case 3: v[i] = static_cast<int64_t>(i < n / 2 ? rng() % 50 : rng()); break;  // range widens mid-run
      case 4: v[i] = static_cast<int64_t>(i / 100); break;                         // slow growth
      default: v[i] = static_cast<int64_t>(rng() % 5000); break;                   // dictionary overflows
    }
  }
  return v;
}

std::vector<uint64_t> Keys(bool gaps, size_t n, uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::vector<uint64_t> k(n);
  uint64_t x = 100;
  for (size_t i = 0; i < n; i++) k[i] = x += gaps ? 1 + rng() % 3 : 1;
  return k;
}

// Pages from sizing every item on its own (Add), finished as they fill.
std::vector<std::vector<uint8_t>> PagesByAdd(const FeatureDef& d, const std::vector<uint64_t>& keys,
                                             const std::vector<int64_t>& vals) {
  std::vector<std::vector<uint8_t>> pages;
  PageBuilder pb(kPage, true);
  auto finish = [&] {
    pages.emplace_back(kPage);
    pb.Finish(pages.back().data(), 1, 0, nullptr);
    pb.Reset();
  };
  for (size_t i = 0; i < keys.size(); i++) {
    const auto* v = reinterpret_cast<const uint8_t*>(&vals[i]);
    if (!pb.Add(d, keys[i], v, 8, false)) {
      finish();
      EXPECT_TRUE(pb.Add(d, keys[i], v, 8, false));
    }
  }
  finish();
  return pages;
}

std::vector<std::vector<uint8_t>> PagesByAddRun(const FeatureDef& d, const std::vector<uint64_t>& keys,
                                                const std::vector<int64_t>& vals, size_t chunk) {
  std::vector<std::vector<uint8_t>> pages;
  PageBuilder pb(kPage, true);
  const auto* v = reinterpret_cast<const uint8_t*>(vals.data());
  for (size_t i = 0; i < keys.size();) {
    const size_t k = pb.AddRun(d, &keys[i], v + 8 * i, std::min(chunk, keys.size() - i));
    if (k == 0) {
      pages.emplace_back(kPage);
      pb.Finish(pages.back().data(), 1, 0, nullptr);
      pb.Reset();
      continue;
    }
    i += k;
  }
  pages.emplace_back(kPage);
  pb.Finish(pages.back().data(), 1, 0, nullptr);
  return pages;
}

TEST(AddRun, SameBytesAsSizingEveryItem) {
  const FeatureDef d = Def(3, ValueType::kInt64);
  for (int shape = 0; shape <= 5; shape++)
    for (bool gaps : {false, true})
      for (size_t chunk : {size_t{1} << 30, size_t{1000}, size_t{37}}) {
        SCOPED_TRACE(::testing::Message() << "shape " << shape << " gaps " << gaps << " chunk " << chunk);
        const size_t n = 60000;
        const auto keys = Keys(gaps, n, shape + 1);
        const auto vals = Values(shape, n, shape + 7);
        const auto a = PagesByAdd(d, keys, vals);
        const auto b = PagesByAddRun(d, keys, vals, chunk);
        ASSERT_EQ(a.size(), b.size());
        for (size_t p = 0; p < a.size(); p++) ASSERT_EQ(a[p], b[p]) << "page " << p;
      }
}

struct Feature {
  FeatureDef def;
  BufferedItems items;
  std::vector<int64_t> vals;  // int64 features
};

std::vector<Feature> MakeFeatures(size_t nfeat, size_t items, uint64_t seed) {
  std::vector<Feature> fs(nfeat);
  std::mt19937_64 rng(seed);
  for (size_t f = 0; f < nfeat; f++) {
    Feature& x = fs[f];
    const bool var = f % 7 == 6;
    x.def = Def(static_cast<uint32_t>(f + 1), var ? ValueType::kBinary : f % 5 == 4 ? ValueType::kFloat32 : ValueType::kInt64);
    const size_t n = items / 2 + rng() % items;
    x.items.keys = Keys(f % 3 == 1, n, seed + f);
    x.items.tomb.assign(n, 0);
    if (x.def.type == ValueType::kInt64) x.vals = Values(static_cast<int>(f % 6), n, seed * 31 + f);
    for (size_t i = 0; i < n; i++) {
      x.items.off.push_back(x.items.arena.size());
      if (x.def.type == ValueType::kInt64) {
        const auto* p = reinterpret_cast<const uint8_t*>(&x.vals[i]);
        x.items.arena.insert(x.items.arena.end(), p, p + 8);
        x.items.len.push_back(8);
      } else if (x.def.type == ValueType::kFloat32) {
        const float v = 0.5f * static_cast<float>(i);
        const auto* p = reinterpret_cast<const uint8_t*>(&v);
        x.items.arena.insert(x.items.arena.end(), p, p + 4);
        x.items.len.push_back(4);
      } else {
        const uint32_t len = static_cast<uint32_t>(i % 9);
        for (uint32_t j = 0; j < len; j++) x.items.arena.push_back(static_cast<uint8_t>('a' + (i + j) % 26));
        x.items.len.push_back(len);
      }
    }
  }
  return fs;
}

// Builds the features' appends on `threads` threads; checks every item comes back once, in
// key order per feature, from pages in batch order. Returns the page count.
size_t BuildAndCheck(const std::vector<Feature>& fs, unsigned threads, size_t min_items_per_thread) {
  std::vector<std::vector<AlignedBuffer>> pools;
  PageBatch batch(kPage, true, true, &pools);
  std::vector<AppendItems> runs;
  for (const Feature& f : fs) runs.push_back({&f.def, &f.items});
  EXPECT_TRUE(batch.AddRuns(runs, threads, min_items_per_thread).ok());
  batch.Close();
  std::vector<size_t> next(fs.size(), 0);
  for (size_t p = 0; p < batch.size(); p++) {
    StampPageId(batch.page(p), kPage, static_cast<uint32_t>(p));
    PageView pv;
    EXPECT_TRUE(PageView::Parse(batch.page(p), kPage, static_cast<uint32_t>(p), "test", &pv).ok());
    EXPECT_EQ(pv.nseg(), batch.summaries()[p].size());
    for (uint32_t s = 0; s < pv.nseg(); s++) {
      SegmentView sv = pv.Segment(s);
      const size_t f = sv.feature_id - 1;
      const Feature& x = fs[f];
      sv.width = x.def.fixed_width();
      EXPECT_TRUE(sv.Fits());
      std::vector<uint64_t> keys(sv.count);
      sv.DecodeKeys(keys.data());
      std::vector<int64_t> unpacked;
      for (uint32_t i = 0; i < sv.count; i++) {
        const size_t j = next[f]++;
        if (j >= x.items.size()) {
          ADD_FAILURE() << "feature " << f << " has more records than items";
          return 0;
        }
        EXPECT_EQ(keys[i], x.items.keys[j]) << "feature " << f << " item " << j;
        const uint8_t* v;
        uint32_t len;
        sv.Value(i, &v, &len);
        if (sv.packed) v = reinterpret_cast<const uint8_t*>(sv.unpacked->data() + i), len = 8;
        EXPECT_EQ(len, x.items.len[j]);
        EXPECT_EQ(std::memcmp(v, x.items.value(j), len), 0) << "feature " << f << " item " << j;
      }
    }
  }
  for (size_t f = 0; f < fs.size(); f++) EXPECT_EQ(next[f], fs[f].items.size()) << "feature " << f;
  return batch.size();
}

TEST(PageBatch, ThreadsKeepEveryItemInOrderAndCostAtMostAPagePerThread) {
  const auto fs = MakeFeatures(13, 40000, 5);
  const size_t one = BuildAndCheck(fs, 1, 0);
  ASSERT_GT(one, 20u);
  for (unsigned threads : {2u, 3u, 8u}) {
    SCOPED_TRACE(::testing::Message() << threads << " threads");
    const size_t many = BuildAndCheck(fs, threads, 1000);
    EXPECT_LE(many, one + threads - 1);
    EXPECT_GE(many + threads - 1, one);
  }
}

TEST(PageBatch, SmallAppendsStayOnOneThread) {
  const auto fs = MakeFeatures(4, 2000, 9);
  std::vector<std::vector<AlignedBuffer>> pools;
  PageBatch batch(kPage, true, true, &pools);
  std::vector<AppendItems> runs;
  for (const Feature& f : fs) runs.push_back({&f.def, &f.items});
  ASSERT_TRUE(batch.AddRuns(runs, 4, 1 << 20).ok());
  EXPECT_EQ(batch.threads_used(), 1u);
  EXPECT_EQ(BuildAndCheck(fs, 4, 1 << 20), BuildAndCheck(fs, 1, 0));
}

}  // namespace
}  // namespace recflash
