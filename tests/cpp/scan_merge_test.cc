// The scan merge strategies on hand-built page chunks: every strategy must give the same
// output — the newest version of each key (buffer > higher seq > lower seq), tombstones
// hiding older versions — and the index walk must refuse an index that disagrees.
#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <cstring>
#include <map>
#include <optional>
#include <random>
#include <thread>

#include "reader/csrc/format.h"
#include "reader/csrc/key_index.h"
#include "reader/csrc/scan_merge.h"

namespace recflash {
namespace {

// A chunk of fixed-width int64 records (value = key * 10 + seq) or tombstones.
PageChunk Chunk(uint64_t seq, const std::vector<uint64_t>& keys, const std::vector<uint64_t>& tombs = {}) {
  PageChunk c;
  c.seq = seq;
  c.enc = 9;
  for (uint64_t k : keys) {
    const bool t = std::find(tombs.begin(), tombs.end(), k) != tombs.end();
    c.keys.push_back(k);
    if (!tombs.empty()) c.tomb.push_back(t);
    const int64_t v = static_cast<int64_t>(k * 10 + seq);
    c.vals.insert(c.vals.end(), reinterpret_cast<const uint8_t*>(&v), reinterpret_cast<const uint8_t*>(&v) + 8);
  }
  c.clean = tombs.empty();
  return c;
}

BufferedItems Buffer(const std::vector<std::pair<uint64_t, std::optional<int64_t>>>& items) {
  BufferedItems b;
  for (const auto& [k, v] : items) {
    b.keys.push_back(k);
    b.tomb.push_back(!v.has_value());
    b.off.push_back(b.arena.size());
    b.len.push_back(v ? 8 : 0);
    if (v) b.arena.insert(b.arena.end(), reinterpret_cast<const uint8_t*>(&*v), reinterpret_cast<const uint8_t*>(&*v) + 8);
  }
  return b;
}

// The expected result, by brute force.
std::map<uint64_t, int64_t> Expected(const std::vector<PageChunk>& cs, const BufferedItems& b) {
  std::map<uint64_t, std::pair<uint64_t, std::optional<int64_t>>> best;  // key -> (seq, value)
  for (const PageChunk& c : cs)
    for (size_t r = 0; r < c.keys.size(); r++) {
      auto it = best.find(c.keys[r]);
      if (it != best.end() && it->second.first > c.seq) continue;
      std::optional<int64_t> v;
      if (c.tomb.empty() || !c.tomb[r]) {
        int64_t x;
        std::memcpy(&x, c.vals.data() + r * 8, 8);
        v = x;
      }
      best[c.keys[r]] = {c.seq, v};
    }
  for (size_t e = 0; e < b.size(); e++) {
    std::optional<int64_t> v;
    if (!b.tomb[e]) {
      int64_t x;
      std::memcpy(&x, b.value(e), 8);
      v = x;
    }
    best[b.keys[e]] = {UINT64_MAX, v};
  }
  std::map<uint64_t, int64_t> out;
  for (const auto& [k, sv] : best)
    if (sv.second) out[k] = *sv.second;
  return out;
}

std::map<uint64_t, int64_t> Output(const ColumnData& col) {
  std::map<uint64_t, int64_t> out;
  EXPECT_EQ(col.values.size(), col.keys.size() * 8);
  for (size_t i = 0; i < col.keys.size(); i++) {
    if (i) {
      EXPECT_LT(col.keys[i - 1], col.keys[i]) << "keys ascending and unique";
    }
    int64_t x;
    std::memcpy(&x, col.values.data() + i * 8, 8);
    out[col.keys[i]] = x;
  }
  return out;
}

std::vector<PageRef> Refs(const std::vector<PageChunk>& cs) {
  std::vector<PageRef> refs;
  for (size_t j = 0; j < cs.size(); j++) refs.push_back({static_cast<uint32_t>(100 + j), 0, 0, 0, false, cs[j].seq, 0, 0});
  return refs;
}

// The index a store would hold: each key's newest page version, tombstones flagged.
void IndexOf(const std::vector<PageChunk>& cs, HVec<uint64_t>* ik, HVec<uint32_t>* il) {
  std::map<uint64_t, std::pair<uint64_t, uint32_t>> best;
  for (size_t j = 0; j < cs.size(); j++)
    for (size_t r = 0; r < cs[j].keys.size(); r++) {
      auto& b = best[cs[j].keys[r]];
      if (b.first > cs[j].seq) continue;
      const bool tomb = !cs[j].tomb.empty() && cs[j].tomb[r];
      b = {cs[j].seq, static_cast<uint32_t>(100 + j) | (tomb ? KeyIndex::kTomb : 0)};
    }
  ik->clear();
  il->clear();
  for (const auto& [k, b] : best) {
    ik->push_back(k);
    il->push_back(b.second);
  }
}

struct Scenario {
  std::vector<PageChunk> cs;
  BufferedItems buf;
};

std::vector<Scenario> Scenarios() {
  std::vector<Scenario> v;
  // Overlapping versions: page 2 (seq 5) updates some keys of page 1 (seq 3) and deletes one.
  v.push_back({{Chunk(3, {1, 2, 3, 4, 5, 6}), Chunk(5, {2, 4, 9}, {4})}, Buffer({})});
  // The buffer overrides, inserts and deletes.
  v.push_back({{Chunk(3, {10, 20, 30, 40}), Chunk(4, {15, 30, 45})},
               Buffer({{5, 1}, {20, 2}, {30, std::nullopt}, {50, 3}})});
  // Sparse keys far apart (heap path), disjoint pages in any order.
  v.push_back({{Chunk(9, {1000000, 5000000}), Chunk(2, {10, 20}), Chunk(4, {300000})}, Buffer({{7, 70}})});
  // Many pages of a dense range, each updating the previous ones.
  Scenario dense;
  for (uint64_t s = 1; s <= 5; s++) {
    std::vector<uint64_t> keys, tombs;
    for (uint64_t k = s; k < 500; k += s) keys.push_back(k);
    if (s == 3) tombs = {3, 6, 9};
    dense.cs.push_back(Chunk(s, keys, tombs));
  }
  dense.buf = Buffer({{4, 44}, {100, std::nullopt}});
  v.push_back(std::move(dense));
  // Only buffered items.
  v.push_back({{}, Buffer({{1, 1}, {2, std::nullopt}, {3, 3}})});
  // Runs of stale records longer than the placement's four-record skips, at a page's start
  // and end, and keys up to the largest one.
  std::vector<uint64_t> old_keys, new_keys;
  for (uint64_t k = 10; k < 40; k++) old_keys.push_back(k);
  for (uint64_t k = UINT64_MAX - 9; k != 0; k++) old_keys.push_back(k);  // ... UINT64_MAX
  for (uint64_t k = 10; k < 19; k++) new_keys.push_back(k);
  for (uint64_t k = 25; k < 31; k++) new_keys.push_back(k);
  for (uint64_t k = UINT64_MAX - 6; k != UINT64_MAX; k++) new_keys.push_back(k);
  v.push_back({{Chunk(1, old_keys), Chunk(2, new_keys)}, Buffer({})});
  return v;
}

TEST(ScanMerge, HeapAndDenseAndIndexAgreeWithBruteForce) {
  for (const Scenario& sc : Scenarios()) {
    const auto want = Expected(sc.cs, sc.buf);
    const auto order = ChunkOrder(sc.cs);
    {
      ColumnData col;
      MergeSink sink(&col, 8, 8, sc.buf, sc.cs);
      MergeHeap(order, &sink);
      sink.Finish();
      EXPECT_EQ(Output(col), want) << "heap";
    }
    {
      ColumnData col;
      MergeSink sink(&col, 8, 8, sc.buf, sc.cs);
      if (MergeDense(order, &sink)) {
        sink.Finish();
        EXPECT_EQ(Output(col), want) << "dense";
      }
    }
    {
      HVec<uint64_t> ik;
      HVec<uint32_t> il;
      IndexOf(sc.cs, &ik, &il);
      const IndexEntries ix{ik, il};
      ColumnData col;
      MergeSink sink(&col, 8, 8, sc.buf, sc.cs);
      EXPECT_EQ(MergeChunks(&ix, Refs(sc.cs), &sink), MergeKind::kIndex);
      EXPECT_EQ(Output(col), want) << "index";
    }
    {
      ColumnData col;
      MergeSink sink(&col, 8, 8, sc.buf, sc.cs);
      const MergeKind k = MergeChunks(nullptr, Refs(sc.cs), &sink);
      EXPECT_NE(k, MergeKind::kIndex);
      EXPECT_EQ(Output(col), want) << "merge";
    }
  }
}

TEST(ScanMerge, DenseOnlyWhenTheKeySpanIsSmall) {
  const std::vector<PageChunk> sparse = {Chunk(1, {1, 1u << 30}), Chunk(2, {5, 1u << 31})};
  const BufferedItems none;
  ColumnData col;
  MergeSink sink(&col, 8, 8, none, sparse);
  EXPECT_FALSE(MergeDense(ChunkOrder(sparse), &sink));
  EXPECT_TRUE(col.keys.empty());
}

TEST(ScanMerge, AnIndexThatDisagreesFallsBackWithTheSameOutput) {
  Scenario sc = Scenarios()[0];
  HVec<uint64_t> ik;
  HVec<uint32_t> il;
  IndexOf(sc.cs, &ik, &il);
  il[0] = 555;  // names a page the scan did not read (a writer mid-install)
  IndexEntries ix{ik, il};
  ColumnData col;
  MergeSink sink(&col, 8, 8, sc.buf, sc.cs);
  EXPECT_EQ(MergeChunks(&ix, Refs(sc.cs), &sink), MergeKind::kIndexFallback);
  EXPECT_EQ(Output(col), Expected(sc.cs, sc.buf));
  // An index naming the right page but a key the page lacks also falls back.
  IndexOf(sc.cs, &ik, &il);
  ik.insert(ik.begin(), 0);
  il.insert(il.begin(), 100);
  ix = {ik, il};
  ColumnData col2;
  MergeSink sink2(&col2, 8, 8, sc.buf, sc.cs);
  EXPECT_EQ(MergeChunks(&ix, Refs(sc.cs), &sink2), MergeKind::kIndexFallback);
  EXPECT_EQ(Output(col2), Expected(sc.cs, sc.buf));
  EXPECT_DOUBLE_EQ(sink2.useful, static_cast<double>(Expected(sc.cs, sc.buf).size()) * 16);
}

// Index placement: each chunk written as a real page, pages placed in reverse order (the ring
// completes them in any order), output equal to the chunk merges'.
// The int64 feature (id 1, "f") the page-building tests write.
FeatureDef Int64Feature() {
  FeatureDef d;
  d.id = 1;
  d.name = "f";
  d.type = ValueType::kInt64;
  return d;
}

struct BuiltPage {
  std::vector<uint8_t> bytes;
  PageView pv;
  SegmentView sv;
};

std::vector<BuiltPage> BuildPages(const std::vector<PageChunk>& cs, const FeatureDef& d) {
  std::vector<BuiltPage> pages(cs.size());
  for (size_t j = 0; j < cs.size(); j++) {
    PageBuilder pb(16384);
    for (size_t r = 0; r < cs[j].keys.size(); r++) {
      const bool tomb = !cs[j].tomb.empty() && cs[j].tomb[r];
      EXPECT_TRUE(pb.Add(d, cs[j].keys[r], cs[j].vals.data() + r * 8, tomb ? 0 : 8, tomb));
    }
    pages[j].bytes.assign(16384, 0);
    std::vector<SegmentSummary> sums;
    pb.Finish(pages[j].bytes.data(), cs[j].seq, static_cast<uint32_t>(100 + j), &sums);
    EXPECT_TRUE(PageView::Parse(pages[j].bytes.data(), 16384, static_cast<uint32_t>(100 + j), "t", &pages[j].pv).ok());
    EXPECT_TRUE(pages[j].pv.Find(d.id, &pages[j].sv));
    pages[j].sv.width = 8;
  }
  return pages;
}

std::vector<PageRef> ValidRefs(const std::vector<PageChunk>& cs) {
  std::vector<PageRef> refs = Refs(cs);
  for (size_t j = 0; j < cs.size(); j++) refs[j].valid = refs[j].count = static_cast<uint32_t>(cs[j].keys.size());
  return refs;
}

TEST(ScanMerge, IndexPlacementAgreesWithBruteForce) {
  const FeatureDef d = Int64Feature();
  for (const Scenario& sc : Scenarios()) {
    if (sc.cs.empty()) continue;
    HVec<uint64_t> ik;
    HVec<uint32_t> il;
    IndexOf(sc.cs, &ik, &il);
    const std::vector<BuiltPage> pages = BuildPages(sc.cs, d);
    ColumnData col;
    IndexPlan plan;
    ASSERT_TRUE(PlanIndexPlacement(ik, il, ValidRefs(sc.cs), sc.buf, 8, &col, &plan));
    std::vector<uint64_t> scratch;
    double encoded = 0;
    for (size_t j = pages.size(); j-- > 0;)
      EXPECT_TRUE(PlaceIndexed(pages[j].sv, &plan, static_cast<uint32_t>(j), &col, &scratch, &encoded));
    EXPECT_EQ(Output(col), Expected(sc.cs, sc.buf));
    EXPECT_GT(encoded, 0);
    uint64_t buffered = 0;
    for (size_t e = 0; e < sc.buf.size(); e++) buffered += !sc.buf.tomb[e];
    EXPECT_EQ(plan.from_disk + buffered, col.keys.size());
  }
}

// Each ref's slots in `a` equal those in `b`, in order (a plan in several parts keeps each
// part's slots of a ref apart until Gather; slots past a ref's fill are unused).
void ExpectSameSlots(IndexPlan* a, IndexPlan* b, unsigned lanes) {
  ASSERT_EQ(a->first.size(), b->first.size()) << lanes;
  for (uint32_t j = 0; j + 1 < a->first.size(); j++) {
    a->Gather(j);
    b->Gather(j);
    const uint32_t n = a->fill[j] - a->first[j];
    ASSERT_EQ(n, b->fill[j] - b->first[j]) << lanes << " ref " << j;
    for (uint32_t k = 0; k < n; k++) {
      EXPECT_EQ(a->slots[a->first[j] + k].key, b->slots[b->first[j] + k].key) << lanes << " ref " << j << " slot " << k;
      EXPECT_EQ(a->slots[a->first[j] + k].pos, b->slots[b->first[j] + k].pos) << lanes << " ref " << j << " slot " << k;
    }
  }
}

// The plan by `lanes` threads (LanePlan; one: PlanIndexPlacement); whether it was made.
bool PlanOnLanes(const HVec<uint64_t>& ik, const HVec<uint32_t>& il, const std::vector<PageRef>& refs,
                 const BufferedItems& buf, unsigned lanes, ColumnData* col, IndexPlan* plan) {
  if (lanes == 1) return PlanIndexPlacement(ik, il, refs, buf, 8, col, plan);
  const IndexEntries ix{ik, il};
  LanePlan lp(&ix, refs, buf, 8, col, plan, lanes);
  std::atomic<int> agree{0};
  std::vector<std::thread> ts;
  for (unsigned l = 1; l < lanes; l++) ts.emplace_back([&lp, &agree, l] {
    lp.Share(l);
    agree += lp.Planned() ? 1 : -1;
  });
  lp.Share(0);
  const bool ok = lp.Planned();
  for (std::thread& t : ts) t.join();
  EXPECT_EQ(agree.load(), ok ? static_cast<int>(lanes) - 1 : 1 - static_cast<int>(lanes));
  return ok;
}

// The page table's view of the chunks under the index: each page's valid records (the
// entries naming it), records and tombstones, as a store's version holds them.
std::vector<PageRef> ExactRefs(const std::vector<PageChunk>& cs, const HVec<uint32_t>& il) {
  std::vector<PageRef> refs = Refs(cs);
  for (size_t j = 0; j < cs.size(); j++) {
    refs[j].count = static_cast<uint32_t>(cs[j].keys.size());
    for (uint8_t t : cs[j].tomb) refs[j].tombs += t;
  }
  for (uint32_t loc : il) refs[(loc & ~KeyIndex::kTomb) - 100].valid++;
  return refs;
}

// A fragmented feature as a store holds one after uniform updates: base pages of disjoint key
// ranges (seq 1-6), then update pages (seq 10-13) whose keys spread over the whole range.
std::vector<PageChunk> Fragmented(uint32_t seed) {
  std::mt19937 rng(seed);
  std::vector<PageChunk> cs;
  for (uint64_t b = 0; b < 6; b++) {
    std::vector<uint64_t> keys;
    for (uint64_t k = b * 1500; k < (b + 1) * 1500; k += 3) keys.push_back(k);
    cs.push_back(Chunk(b + 1, keys));
  }
  for (uint64_t u = 0; u < 4; u++) {
    std::vector<uint64_t> keys;
    for (uint64_t k = 0; k < 9000; k += 3)
      if (rng() % 5 == 0) keys.push_back(k);
    cs.push_back(Chunk(10 + u, keys));
  }
  return cs;
}

// The one-pass plan (a whole feature, nothing buffered, no tombstones, entries = the refs'
// valid records) gives each ref the slots the two-pass plan gives it, on any number of
// lanes, and the pages placed through it give the merged output.
TEST(ScanMerge, OnePassPlanEqualsTwoPassPlan) {
  const FeatureDef d = Int64Feature();
  std::vector<std::vector<PageChunk>> all = {Scenarios()[5].cs, Fragmented(1), Fragmented(2),
                                             {Chunk(3, {10, 20, 30}), Chunk(4, {40, 50})}};
  for (const std::vector<PageChunk>& cs : all) {
    HVec<uint64_t> ik;
    HVec<uint32_t> il;
    IndexOf(cs, &ik, &il);
    const std::vector<PageRef> refs = ExactRefs(cs, il);
    const std::vector<BuiltPage> pages = BuildPages(cs, d);
    const BufferedItems none;
    ColumnData col2;
    IndexPlan plan2;
    IndexPlanner two(ik, il, refs, none, 8, &col2, &plan2, 1);
    ASSERT_TRUE(two.fused());
    ASSERT_TRUE(two.PlanInOnePart());
    EXPECT_FALSE(plan2.fused);
    for (unsigned lanes : {1u, 2u, 3u, 7u}) {
      ColumnData col;
      IndexPlan plan;
      ASSERT_TRUE(PlanOnLanes(ik, il, refs, none, lanes, &col, &plan)) << lanes;
      EXPECT_TRUE(plan.fused) << lanes;
      EXPECT_EQ(plan.from_disk, plan2.from_disk) << lanes;
      EXPECT_EQ(std::vector<uint64_t>(col.keys.begin(), col.keys.end()),
                std::vector<uint64_t>(col2.keys.begin(), col2.keys.end()));
      ExpectSameSlots(&plan, &plan2, lanes);
      std::vector<uint64_t> scratch;
      double encoded = 0;
      for (size_t j = pages.size(); j-- > 0;)
        EXPECT_TRUE(PlaceIndexed(pages[j].sv, &plan, static_cast<uint32_t>(j), &col, &scratch, &encoded));
      EXPECT_EQ(Output(col), Expected(cs, none)) << lanes;
      EXPECT_EQ(plan.from_disk, col.keys.size());
    }
  }
}

// Valid counts that add up to the entries but split differently over the pages: the one-pass
// plan refuses, as the two-pass one does, on every lane. A tombstone entry the pages do not
// list: the plan is made the two-pass way, without that key.
TEST(ScanMerge, OnePassPlanRefusesCountsThatDisagree) {
  const FeatureDef d = Int64Feature();
  const std::vector<PageChunk> cs = Fragmented(3);
  const std::vector<BuiltPage> pages = BuildPages(cs, d);
  HVec<uint64_t> ik;
  HVec<uint32_t> il;
  IndexOf(cs, &ik, &il);
  const BufferedItems none;
  std::vector<PageRef> off = ExactRefs(cs, il);
  off[0].valid++;
  off[7].valid--;
  for (unsigned lanes : {1u, 2u, 3u}) {
    ColumnData col;
    IndexPlan plan;
    EXPECT_FALSE(PlanOnLanes(ik, il, off, none, lanes, &col, &plan)) << lanes;
  }
  const std::vector<PageRef> refs = ExactRefs(cs, il);
  const size_t e = ik.size() / 3;
  const uint64_t gone = ik[e];
  il[e] |= KeyIndex::kTomb;
  std::map<uint64_t, int64_t> want = Expected(cs, none);
  want.erase(gone);
  for (unsigned lanes : {1u, 2u}) {
    ColumnData col;
    IndexPlan plan;
    ASSERT_TRUE(PlanOnLanes(ik, il, refs, none, lanes, &col, &plan)) << lanes;
    EXPECT_FALSE(plan.fused);
    std::vector<uint64_t> scratch;
    double encoded = 0;
    for (size_t j = 0; j < pages.size(); j++)
      EXPECT_TRUE(PlaceIndexed(pages[j].sv, &plan, static_cast<uint32_t>(j), &col, &scratch, &encoded));
    EXPECT_EQ(Output(col), want) << lanes;
  }
}

// The one-pass plan on several lanes holds room for every entry once per lane: a feature so
// large that the extra room would pass 64 MiB is planned the two-pass way (on one lane the
// one-pass plan needs no extra room and is kept).
TEST(ScanMerge, OnePassPlanOnLanesIsCappedForHugeFeatures) {
  const size_t n = (size_t{64} << 20) / sizeof(IndexPlan::Slot) + 1;  // one entry past the cap on two lanes
  HVec<uint64_t> ik(n);
  HVec<uint32_t> il(n);
  for (size_t e = 0; e < n; e++) ik[e] = 3 * e, il[e] = e < n / 2 ? 100 : 101;
  std::vector<PageRef> refs = {{100, static_cast<uint32_t>(n / 2), static_cast<uint32_t>(n / 2), 0, false, 1, 0, 0},
                               {101, static_cast<uint32_t>(n - n / 2), static_cast<uint32_t>(n - n / 2), 0, false, 2, 0, 0}};
  const BufferedItems none;
  for (unsigned lanes : {1u, 2u}) {
    ColumnData col;
    IndexPlan plan;
    ASSERT_TRUE(PlanOnLanes(ik, il, refs, none, lanes, &col, &plan)) << lanes;
    EXPECT_EQ(plan.fused, lanes == 1) << lanes;
    EXPECT_EQ(plan.from_disk, n);
    ASSERT_EQ(col.keys.size(), n);
    EXPECT_EQ(col.keys[n - 1], 3 * (n - 1));
    for (uint32_t j = 0; j < 2; j++) {
      plan.Gather(j);
      EXPECT_EQ(plan.fill[j] - plan.first[j], refs[j].valid) << lanes << " ref " << j;
    }
  }
}

// The plan made by several lanes on threads of their own (LanePlan) equals the one made on
// one thread, slot for slot; placing the pages then gives the chunk merges' output. Each
// scenario also runs without its buffered items, where the plan is split into parts. The
// index copy is empty until lane 0's `prepare` fills it, as a scan takes it.
TEST(ScanMerge, LanePlanOnThreadsEqualsOneThread) {
  const FeatureDef d = Int64Feature();
  std::vector<Scenario> all = Scenarios();
  for (const Scenario& sc : Scenarios()) all.push_back({sc.cs, Buffer({})});
  for (const Scenario& sc : all) {
    if (sc.cs.empty()) continue;
    HVec<uint64_t> ik;
    HVec<uint32_t> il;
    IndexOf(sc.cs, &ik, &il);
    const std::vector<BuiltPage> pages = BuildPages(sc.cs, d);
    const std::vector<PageRef> refs = ValidRefs(sc.cs);
    ColumnData col1;
    IndexPlan plan1;
    ASSERT_TRUE(PlanIndexPlacement(ik, il, refs, sc.buf, 8, &col1, &plan1));
    for (unsigned lanes : {2u, 3u, 7u}) {
      ColumnData col;
      IndexPlan plan;
      HVec<uint64_t> copy_k;
      HVec<uint32_t> copy_l;
      IndexEntries ix;  // set by prepare, as a scan's snapshot is
      LanePlan lp(&ix, refs, sc.buf, 8, &col, &plan, lanes, [&] {
        copy_k.assign(ik.begin(), ik.end());
        copy_l.assign(il.begin(), il.end());
        ix = {copy_k, copy_l};
        return true;
      });
      std::vector<std::thread> ts;
      for (unsigned l = 1; l < lanes; l++) ts.emplace_back([&lp, l] {
        lp.Share(l);
        EXPECT_TRUE(lp.Planned());
      });
      lp.Share(0);
      lp.Share(0);  // a second call returns at once
      ASSERT_TRUE(lp.Planned());
      for (std::thread& t : ts) t.join();
      EXPECT_EQ(plan.from_disk, plan1.from_disk) << lanes;
      ExpectSameSlots(&plan, &plan1, lanes);
      EXPECT_EQ(std::vector<uint64_t>(col.keys.begin(), col.keys.end()),
                std::vector<uint64_t>(col1.keys.begin(), col1.keys.end()));
      std::vector<uint64_t> scratch;
      double encoded = 0;
      for (size_t j = 0; j < pages.size(); j++)
        EXPECT_TRUE(PlaceIndexed(pages[j].sv, &plan, static_cast<uint32_t>(j), &col, &scratch, &encoded));
      EXPECT_EQ(Output(col), Expected(sc.cs, sc.buf)) << lanes;
    }
  }
}

// An index entry naming a page the scan does not read, in any part: every lane learns that
// the plan failed, none waits forever.
TEST(ScanMerge, LanePlanRefusalReachesEveryLane) {
  const Scenario sc = Scenarios()[3];  // the dense one: hundreds of entries
  HVec<uint64_t> ik;
  HVec<uint32_t> il;
  for (size_t bad : {size_t{0}, size_t{1} << 30}) {
    IndexOf(sc.cs, &ik, &il);
    il[std::min(bad, il.size() - 1)] = 555;
    ColumnData col;
    IndexPlan plan;
    const IndexEntries ix{ik, il};
    LanePlan lp(&ix, ValidRefs(sc.cs), Buffer({}), 8, &col, &plan, 3);
    std::vector<std::thread> ts;
    for (unsigned l = 1; l < 3; l++) ts.emplace_back([&lp, l] {
      lp.Share(l);
      EXPECT_FALSE(lp.Planned());
    });
    lp.Share(0);
    EXPECT_FALSE(lp.Planned());
    for (std::thread& t : ts) t.join();
  }
}

// Lane 0's `prepare` cannot take the index snapshot (a writer moved the index past the scan's
// snapshot): the plan fails on every lane, helpers that reach Share first included.
TEST(ScanMerge, LanePlanPrepareRefusalReachesEveryLane) {
  const Scenario sc = Scenarios()[3];
  HVec<uint64_t> ik;
  HVec<uint32_t> il;
  for (unsigned lanes : {2u, 4u}) {
    ColumnData col;
    IndexPlan plan;
    std::atomic<unsigned> waiting{0};
    const IndexEntries ix{ik, il};
    LanePlan lp(&ix, ValidRefs(sc.cs), sc.buf, 8, &col, &plan, lanes, [&] {
      while (waiting.load() + 1 < lanes) std::this_thread::yield();  // the helpers are in Share
      return false;
    });
    std::vector<std::thread> ts;
    for (unsigned l = 1; l < lanes; l++) ts.emplace_back([&lp, &waiting, l] {
      waiting++;
      lp.Share(l);
      EXPECT_FALSE(lp.Planned());
    });
    lp.Share(0);
    EXPECT_FALSE(lp.Planned());
    for (std::thread& t : ts) t.join();
  }
}

TEST(ScanMerge, IndexPlacementRefusesAnIndexThatDisagrees) {
  const FeatureDef d = Int64Feature();
  const Scenario sc = Scenarios()[0];
  const std::vector<BuiltPage> pages = BuildPages(sc.cs, d);
  HVec<uint64_t> ik;
  HVec<uint32_t> il;
  // A location naming a page the scan does not read: refused by the plan.
  IndexOf(sc.cs, &ik, &il);
  il[0] = 555;
  ColumnData col;
  IndexPlan plan;
  EXPECT_FALSE(PlanIndexPlacement(ik, il, ValidRefs(sc.cs), sc.buf, 8, &col, &plan));
  // More entries for a page than its valid records: refused by the plan.
  IndexOf(sc.cs, &ik, &il);
  std::vector<PageRef> few = ValidRefs(sc.cs);
  few[0].valid = 2;
  EXPECT_FALSE(PlanIndexPlacement(ik, il, few, sc.buf, 8, &col, &plan));
  // A key the page lacks, and a key whose record on the page is a tombstone: refused by the page.
  std::vector<uint64_t> scratch;
  double encoded = 0;
  IndexOf(sc.cs, &ik, &il);
  ik.insert(ik.begin(), 0);
  il.insert(il.begin(), 100);
  ASSERT_TRUE(PlanIndexPlacement(ik, il, ValidRefs(sc.cs), sc.buf, 8, &col, &plan));
  EXPECT_FALSE(PlaceIndexed(pages[0].sv, &plan, 0, &col, &scratch, &encoded));
  IndexOf(sc.cs, &ik, &il);
  for (size_t e = 0; e < ik.size(); e++)
    if (ik[e] == 4) il[e] = 101;  // key 4's record on page 101 is a tombstone
  ASSERT_TRUE(PlanIndexPlacement(ik, il, ValidRefs(sc.cs), sc.buf, 8, &col, &plan));
  EXPECT_FALSE(PlaceIndexed(pages[1].sv, &plan, 1, &col, &scratch, &encoded));
  // A key past the page's last record, in the second half of its slots (placement searches
  // the two halves side by side): refused by the page.
  IndexOf(sc.cs, &ik, &il);
  ik.push_back(UINT64_MAX - 5);
  il.push_back(100);
  ASSERT_TRUE(PlanIndexPlacement(ik, il, ValidRefs(sc.cs), sc.buf, 8, &col, &plan));
  EXPECT_FALSE(PlaceIndexed(pages[0].sv, &plan, 0, &col, &scratch, &encoded));
}

TEST(ScanMerge, IndexPlacementChecksTheKeysOfACleanSegment) {
  // A segment whose records are all current takes the placement's fast path (record r to
  // slot r): it must still refuse an index whose keys differ from the page's, even when the
  // counts agree.
  const FeatureDef d = Int64Feature();
  const std::vector<PageChunk> cs = {Chunk(3, {10, 20, 30})};
  const std::vector<BuiltPage> pages = BuildPages(cs, d);
  HVec<uint64_t> ik;
  HVec<uint32_t> il;
  IndexOf(cs, &ik, &il);
  ASSERT_EQ(ik.size(), 3u);
  std::vector<uint64_t> scratch;
  double encoded = 0;
  ColumnData col;
  IndexPlan plan;
  ASSERT_TRUE(PlanIndexPlacement(ik, il, ValidRefs(cs), BufferedItems(), 8, &col, &plan));
  EXPECT_TRUE(PlaceIndexed(pages[0].sv, &plan, 0, &col, &scratch, &encoded));
  EXPECT_EQ(Output(col), Expected(cs, BufferedItems()));
  ik[1] = 21;  // still ascending, still three entries for the page's three records
  ASSERT_TRUE(PlanIndexPlacement(ik, il, ValidRefs(cs), BufferedItems(), 8, &col, &plan));
  EXPECT_FALSE(PlaceIndexed(pages[0].sv, &plan, 0, &col, &scratch, &encoded));
}

TEST(ScanMerge, DensePlacementAgreesWithBruteForceInAnyPageOrder) {
  const FeatureDef d = Int64Feature();
  int planned = 0;
  for (const Scenario& sc : Scenarios()) {
    if (sc.cs.size() < 2) continue;
    const std::vector<BuiltPage> pages = BuildPages(sc.cs, d);
    std::vector<PageRef> refs = ValidRefs(sc.cs);
    for (size_t j = 0; j < refs.size(); j++) {
      refs[j].min_key = sc.cs[j].keys.front();
      refs[j].max_key = sc.cs[j].keys.back();
    }
    for (int order = 0; order < 2; order++) {
      DensePlan plan;
      if (!PlanDensePlacement(refs, 0, UINT64_MAX, 8, &plan)) continue;
      planned++;
      std::vector<uint64_t> scratch;
      for (size_t x = 0; x < pages.size(); x++) {
        const size_t j = order == 0 ? x : pages.size() - 1 - x;  // oldest first, then newest first
        EXPECT_TRUE(PlaceDense(pages[j].sv, static_cast<uint32_t>(j), &plan, &scratch));
      }
      ColumnData col;
      uint64_t useful = 0;
      double encoded = 0;
      FinishDensePlacement(plan, sc.buf, &col, &useful, &encoded);
      EXPECT_EQ(Output(col), Expected(sc.cs, sc.buf)) << "order " << order;
      uint64_t buffered = 0;
      for (size_t e = 0; e < sc.buf.size(); e++) buffered += !sc.buf.tomb[e];
      EXPECT_EQ(useful, (col.keys.size() - buffered) * 16);  // buffered keys here are all distinct from pages'
    }
  }
  EXPECT_GE(planned, 4);  // the overlapping, buffered and dense scenarios, in both orders
  // Keys far apart: no slots.
  std::vector<PageRef> sparse(2);
  sparse[0] = {1, 2, 2, 0, false, 1, 10, 1u << 30};
  sparse[1] = {2, 2, 2, 0, false, 2, 5, 1u << 31};
  DensePlan plan;
  EXPECT_FALSE(PlanDensePlacement(sparse, 0, UINT64_MAX, 8, &plan));
}

TEST(ScanMerge, DensePlacementKeepsToTheRange) {
  const FeatureDef d = Int64Feature();
  const Scenario sc = Scenarios()[3];  // many pages of a dense range
  const std::vector<BuiltPage> pages = BuildPages(sc.cs, d);
  std::vector<PageRef> refs = ValidRefs(sc.cs);
  for (size_t j = 0; j < refs.size(); j++) {
    refs[j].min_key = sc.cs[j].keys.front();
    refs[j].max_key = sc.cs[j].keys.back();
  }
  DensePlan plan;
  ASSERT_TRUE(PlanDensePlacement(refs, 100, 199, 8, &plan));
  std::vector<uint64_t> scratch;
  for (size_t j = 0; j < pages.size(); j++)
    EXPECT_TRUE(PlaceDense(pages[j].sv, static_cast<uint32_t>(j), &plan, &scratch));
  ColumnData col;
  uint64_t useful = 0;
  double encoded = 0;
  FinishDensePlacement(plan, BufferedItems(), &col, &useful, &encoded);
  std::map<uint64_t, int64_t> want;
  for (const auto& [k, v] : Expected(sc.cs, BufferedItems()))
    if (k >= 100 && k <= 199) want[k] = v;
  EXPECT_EQ(Output(col), want);
  // Metadata listing a narrower key range than the page holds: refused, not written outside.
  std::vector<PageRef> narrow = refs;
  for (PageRef& r : narrow) r.max_key = 120;
  DensePlan p2;
  ASSERT_TRUE(PlanDensePlacement(narrow, 100, 199, 8, &p2));
  EXPECT_FALSE(PlaceDense(pages[0].sv, 0, &p2, &scratch));
}

TEST(ScanMerge, DensePlacementInWindowsAgreesWithBruteForce) {
  // The steady state the windows are for: base pages of consecutive keys and update pages
  // whose keys are dozens apart (each spanning many windows), tombstones on both, a buffer
  // overriding some keys; placed with windows from one slot up to the default, pages staged in
  // several orders, over the whole span and over ranges that cut pages.
  const FeatureDef d = Int64Feature();
  std::mt19937_64 rng(7);
  for (int round = 0; round < 4; round++) {
    std::vector<PageChunk> cs;
    uint64_t seq = 1;
    for (uint64_t k = 0; k < 3000; k += 500) {  // base: 6 pages of 500 consecutive keys
      std::vector<uint64_t> keys, tombs;
      for (uint64_t x = k; x < k + 500; x++) keys.push_back(x);
      if (round & 1) tombs = {k + 7, k + 8};
      cs.push_back(Chunk(seq++, keys, tombs));
    }
    for (int u = 0; u < 5; u++) {  // updates: ~1 key in 40 over the whole span
      std::vector<uint64_t> keys, tombs;
      for (uint64_t x = rng() % 40; x < 3000; x += 1 + rng() % 80) keys.push_back(x);
      if (round >= 2) tombs.push_back(keys[keys.size() / 2]);
      cs.push_back(Chunk(seq++, keys, tombs));
    }
    std::swap(cs[2], cs[8]);  // refs not in seq order
    const BufferedItems buf = Buffer({{5, 55}, {1234, std::nullopt}, {2999, 29}, {3500, 35}});
    const std::vector<BuiltPage> pages = BuildPages(cs, d);
    std::vector<PageRef> refs = ValidRefs(cs);
    for (size_t j = 0; j < refs.size(); j++) {
      refs[j].min_key = cs[j].keys.front();
      refs[j].max_key = cs[j].keys.back();
    }
    const std::pair<uint64_t, uint64_t> ranges[] = {{0, UINT64_MAX}, {250, 1700}, {1001, 1001}};
    for (const auto& [lo, hi] : ranges) {
      for (uint32_t window : {1u, 7u, 64u, 0u}) {
        DensePlan plan;
        ASSERT_TRUE(PlanDensePlacement(refs, lo, hi, 8, &plan));
        if (window) plan.window = window;
        std::vector<size_t> order(pages.size());
        for (size_t j = 0; j < order.size(); j++) order[j] = j;
        std::shuffle(order.begin(), order.end(), rng);
        if (window == 7) {  // pages in key order, as a single-feature scan reads them
          std::sort(order.begin(), order.end(), [&](size_t x, size_t y) { return plan.first[x] < plan.first[y]; });
        }
        std::vector<uint64_t> scratch;
        ColumnData col;
        const bool helper = window == 64 || (window == 0 && round & 1);
        LaneHelpers parked(1);  // rounds 2 and 3: the helper is a parked thread
        DenseSweep sweep(plan, buf, &col, helper, round >= 2 ? &parked : nullptr);
        EXPECT_EQ(sweep.background(), helper);
        for (size_t x = 0; x < order.size(); x++) {
          EXPECT_TRUE(PlaceDense(pages[order[x]].sv, static_cast<uint32_t>(order[x]), &plan, &scratch));
          sweep.Advance();  // sweeps what the pages so far allow
          if (window == 7 && lo == 0 && x + 2 == order.size()) {
            // In key order all but the last base page (keys 2500..2999) are in: all before it is out.
            EXPECT_GE(sweep.swept(), 2500u - 7);
            EXPECT_LE(sweep.swept(), 2500u);
          }
        }
        uint64_t useful = 0;
        double encoded = 0;
        sweep.Finish(&useful, &encoded);
        // With a helper, the windows left once every page is staged are split between the
        // helper and this thread (here: most of the span, the update pages reach across it).
        if (helper && window == 64 && lo == 0) {
          EXPECT_GE(sweep.split_slots(), 64u);
        }
        if (!helper) {
          EXPECT_EQ(sweep.split_slots(), 0u);
        }
        std::map<uint64_t, int64_t> want;
        size_t from_buffer = 0;
        for (const auto& [k, v] : Expected(cs, buf))
          if (k >= lo && k <= hi) want[k] = v;
        for (size_t e = 0; e < buf.size(); e++) from_buffer += !buf.tomb[e] && buf.keys[e] >= lo && buf.keys[e] <= hi;
        // (the buffer passed here is not cut to the range: a scan's copy would be)
        std::map<uint64_t, int64_t> got = Output(col);
        for (auto it = got.begin(); it != got.end();)
          it = (it->first < lo || it->first > hi) ? got.erase(it) : std::next(it);
        EXPECT_EQ(got, want) << "round " << round << " range " << lo << ".." << hi << " window " << window;
        EXPECT_EQ(useful, (want.size() - from_buffer) * 16) << "window " << window;
        EXPECT_GT(encoded, 0);
      }
    }
  }
}

// Float32 and int64 values (widths 4 and 8) after updates: base pages of consecutive keys, update pages whose key
// gaps take one-byte varints (the eight-at-a-time staging), two-byte and three-byte ones, one
// with tombstones; over the whole span (staged as the keys are decoded) and over a range that
// cuts pages (keys outside it trimmed by the general staging). Then pages whose keys a damaged
// key stream would repeat, send backwards by wrapping, or place outside their listed range.
void CheckVarintStaging(ValueType type, uint32_t width) {
  SCOPED_TRACE(width);
  FeatureDef d;
  d.id = 1;
  d.name = "f";
  d.type = type;
  std::mt19937_64 rng(11);
  struct P {
    uint64_t seq;
    std::vector<uint64_t> keys;
    std::vector<uint8_t> tomb;
  };
  auto value = [](uint64_t k, uint64_t seq) { return static_cast<uint64_t>(k * 7 + seq) | (seq << 40); };
  const uint64_t kSpan = 20000;
  std::vector<P> ps;
  for (uint64_t k = 0; k < kSpan; k += 1250) {  // base pages: 1,250 consecutive keys each
    P p{ps.size() + 1, {}, {}};
    for (uint64_t x = k; x < k + 1250; x++) p.keys.push_back(x);
    ps.push_back(p);
  }
  const uint64_t max_gap[] = {60, 127, 400, 3000};  // one-byte gaps only, mixed, two-byte, some three-byte
  for (uint64_t g : max_gap) {
    P p{ps.size() + 1, {}, {}};
    for (uint64_t x = rng() % 5; x < kSpan; x += 1 + rng() % g) p.keys.push_back(x);
    if (g == 3000) p.keys.push_back(kSpan - 1 + 17000);  // a 17,000 gap: three varint bytes
    ps.push_back(p);
  }
  {
    P p{ps.size() + 1, {}, {}};  // tombstones
    for (uint64_t x = 3; x < kSpan; x += 1 + rng() % 50) {
      p.keys.push_back(x);
      p.tomb.push_back(rng() % 9 == 0);
    }
    ps.push_back(p);
  }
  std::swap(ps[1], ps[9]);  // refs not in seq order
  std::vector<BuiltPage> pages(ps.size());
  std::vector<PageRef> refs;
  for (size_t j = 0; j < ps.size(); j++) {
    PageBuilder pb(16384);
    for (size_t r = 0; r < ps[j].keys.size(); r++) {
      const bool tomb = !ps[j].tomb.empty() && ps[j].tomb[r];
      const uint64_t v = value(ps[j].keys[r], ps[j].seq);  // little-endian: the low `width` bytes
      ASSERT_TRUE(pb.Add(d, ps[j].keys[r], reinterpret_cast<const uint8_t*>(&v), tomb ? 0 : width, tomb));
    }
    pages[j].bytes.assign(16384, 0);
    std::vector<SegmentSummary> sums;
    pb.Finish(pages[j].bytes.data(), ps[j].seq, static_cast<uint32_t>(100 + j), &sums);
    ASSERT_TRUE(PageView::Parse(pages[j].bytes.data(), 16384, static_cast<uint32_t>(100 + j), "t", &pages[j].pv).ok());
    ASSERT_TRUE(pages[j].pv.Find(d.id, &pages[j].sv));
    pages[j].sv.width = width;
    const uint32_t n = static_cast<uint32_t>(ps[j].keys.size());
    refs.push_back({static_cast<uint32_t>(100 + j), n, n, 0, false, ps[j].seq, ps[j].keys.front(), ps[j].keys.back()});
  }
  int varint_pages = 0;
  for (const BuiltPage& p : pages) varint_pages += !p.sv.run_keys && !p.sv.bitmap_keys && !p.sv.raw_keys && !p.sv.tomb;
  EXPECT_GE(varint_pages, 4);  // the update pages take the one-pass staging
  std::map<uint64_t, std::pair<uint64_t, std::optional<uint64_t>>> best;  // key -> (seq, value)
  for (const P& p : ps)
    for (size_t r = 0; r < p.keys.size(); r++) {
      auto& b = best[p.keys[r]];
      if (b.first > p.seq) continue;
      const bool tomb = !p.tomb.empty() && p.tomb[r];
      const uint64_t mask = width == 8 ? ~0ull : (1ull << (8 * width)) - 1;
      b = {p.seq, tomb ? std::nullopt : std::optional<uint64_t>(value(p.keys[r], p.seq) & mask)};
    }
  const std::pair<uint64_t, uint64_t> ranges[] = {{0, UINT64_MAX}, {1234, 15000}};
  for (const auto& [lo, hi] : ranges) {
    for (int order = 0; order < 2; order++) {
      DensePlan plan;
      ASSERT_TRUE(PlanDensePlacement(refs, lo, hi, width, &plan));
      std::vector<uint64_t> scratch;
      for (size_t x = 0; x < pages.size(); x++) {
        const size_t j = order == 0 ? x : pages.size() - 1 - x;
        EXPECT_TRUE(PlaceDense(pages[j].sv, static_cast<uint32_t>(j), &plan, &scratch)) << "page " << j;
      }
      ColumnData col;
      uint64_t useful = 0;
      double encoded = 0;
      FinishDensePlacement(plan, BufferedItems(), &col, &useful, &encoded);
      std::map<uint64_t, uint64_t> want, got;
      for (const auto& [k, b] : best)
        if (k >= lo && k <= hi && b.second) want[k] = *b.second;
      ASSERT_EQ(col.values.size(), col.keys.size() * width);
      for (size_t i = 0; i < col.keys.size(); i++) {
        uint64_t v = 0;
        std::memcpy(&v, col.values.data() + width * i, width);
        got[col.keys[i]] = v;
        if (i) {
          EXPECT_LT(col.keys[i - 1], col.keys[i]);
        }
      }
      EXPECT_EQ(got, want) << "range " << lo << ".." << hi << " order " << order;
      EXPECT_EQ(useful, want.size() * (8 + width));
    }
  }
  // Damaged key streams of the one-byte-gap page (index 16), in a copy.
  const size_t u = 16;
  ASSERT_FALSE(pages[u].sv.run_keys || pages[u].sv.bitmap_keys || pages[u].sv.raw_keys);
  auto refused = [&](const std::vector<uint8_t>& keys, uint32_t count, const std::vector<PageRef>& rs) {
    SegmentView sv = pages[u].sv;
    sv.keys = keys.data();
    sv.keys_bytes = static_cast<uint32_t>(keys.size());
    sv.count = count;
    DensePlan plan;
    EXPECT_TRUE(PlanDensePlacement(rs, 0, UINT64_MAX, width, &plan));
    std::vector<uint64_t> scratch;
    return !PlaceDense(sv, static_cast<uint32_t>(u), &plan, &scratch);
  };
  const std::vector<uint8_t> good(pages[u].sv.keys, pages[u].sv.keys + pages[u].sv.keys_bytes);
  const uint32_t count = pages[u].sv.count;
  EXPECT_FALSE(refused(good, count, refs));  // the copy itself places
  for (size_t at : {size_t{1}, size_t{5}, size_t{20}, good.size() - 3}) {
    std::vector<uint8_t> k = good;
    ASSERT_LT(k[at], 128);
    k[at] = 0;  // a repeated key: inside an eight-delta group or in the tail
    EXPECT_TRUE(refused(k, count, refs)) << "zero delta at byte " << at;
  }
  {
    // Keys k0, k0 + 5, then a delta of 2^64 - 3 wrapping back to k0 + 2 (inside the listed
    // range), then gaps of one: not ascending.
    std::vector<uint8_t> k = {good[0], 5};
    uint64_t wrap = UINT64_MAX - 2;
    while (wrap >= 128) {
      k.push_back(static_cast<uint8_t>(wrap | 128));
      wrap >>= 7;
    }
    k.push_back(static_cast<uint8_t>(wrap));
    for (uint32_t r = 3; r < count; r++) k.push_back(1);
    ASSERT_LT(good[0], 128);
    EXPECT_TRUE(refused(k, count, refs));
  }
  {
    std::vector<PageRef> narrow = refs;  // the page table lists a narrower key range than the page holds
    narrow[u].max_key = refs[u].max_key - 1;
    EXPECT_TRUE(refused(good, count, narrow));
    narrow = refs;
    narrow[u].min_key = refs[u].min_key + 1;
    EXPECT_TRUE(refused(good, count, narrow));
  }
}

TEST(ScanMerge, DensePlacementOfVarintKeysAgreesWithBruteForce) {
  CheckVarintStaging(ValueType::kFloat32, 4);
  CheckVarintStaging(ValueType::kInt64, 8);
}

TEST(ScanMerge, DensePlacementRefusesPagesThatDisagreeWithTheirMetadata) {
  const FeatureDef d = Int64Feature();
  const std::vector<PageChunk> cs = {Chunk(1, {1, 2, 3, 4, 5, 6}), Chunk(2, {2, 4, 6})};
  const std::vector<BuiltPage> pages = BuildPages(cs, d);
  std::vector<PageRef> refs = ValidRefs(cs);
  for (size_t j = 0; j < refs.size(); j++) {
    refs[j].min_key = cs[j].keys.front();
    refs[j].max_key = cs[j].keys.back();
  }
  std::vector<uint64_t> scratch;
  {
    DensePlan plan;  // the page table lists fewer records than the segment holds
    std::vector<PageRef> fewer = refs;
    fewer[0].count = 4;
    ASSERT_TRUE(PlanDensePlacement(fewer, 0, UINT64_MAX, 8, &plan));
    EXPECT_FALSE(PlaceDense(pages[0].sv, 0, &plan, &scratch));
    EXPECT_TRUE(PlaceDense(pages[1].sv, 1, &plan, &scratch));
  }
  {
    DensePlan plan;  // the same page twice
    ASSERT_TRUE(PlanDensePlacement(refs, 0, UINT64_MAX, 8, &plan));
    EXPECT_TRUE(PlaceDense(pages[1].sv, 1, &plan, &scratch));
    EXPECT_FALSE(PlaceDense(pages[1].sv, 1, &plan, &scratch));
  }
}

TEST(ScanMerge, VariableWidthValuesAndOffsets) {
  PageChunk a, b;
  a.seq = 1;
  b.seq = 2;
  auto add = [](PageChunk& c, uint64_t k, const std::string& v) {
    c.keys.push_back(k);
    c.vals.insert(c.vals.end(), v.begin(), v.end());
    c.lens.push_back(static_cast<uint32_t>(v.size()));
  };
  add(a, 1, "one");
  add(a, 2, "two");
  add(a, 3, "three");
  add(b, 2, "TWO!");
  add(b, 4, "");
  const std::vector<PageChunk> cs = {a, b};
  const BufferedItems none;
  ColumnData col;
  MergeSink sink(&col, 0, 1, none, cs);
  MergeChunks(nullptr, Refs(cs), &sink);
  EXPECT_EQ(std::vector<uint64_t>(col.keys.begin(), col.keys.end()), (std::vector<uint64_t>{1, 2, 3, 4}));
  EXPECT_EQ(std::string(col.values.begin(), col.values.end()), "oneTWO!three");
  EXPECT_EQ(col.offsets, (std::vector<int32_t>{0, 3, 7, 12, 12}));
}

TEST(ScanMerge, DecodeChunkTrimsToTheRange) {
  FeatureDef d;
  d.id = 1;
  d.type = ValueType::kInt64;
  PageBuilder pb(4096);
  for (uint64_t k = 10; k < 30; k++) {
    const int64_t v = static_cast<int64_t>(k);
    ASSERT_TRUE(pb.Add(d, k, reinterpret_cast<const uint8_t*>(&v), k == 15 ? 0 : 8, k == 15));
  }
  std::vector<uint8_t> buf(4096);
  std::vector<SegmentSummary> sums;
  pb.Finish(buf.data(), 4, 0, &sums);
  PageView pv;
  ASSERT_TRUE(PageView::Parse(buf.data(), 4096, 0, "t", &pv).ok());
  SegmentView sv;
  ASSERT_TRUE(pv.Find(1, &sv));
  sv.width = 8;
  PageChunk c;
  DecodeChunk(sv, pv.seq(), 12, 20, false, true, &c);
  EXPECT_EQ(c.keys, (std::vector<uint64_t>{12, 13, 14, 15, 16, 17, 18, 19}));
  EXPECT_EQ(c.tomb[3], 1);
  EXPECT_FALSE(c.clean);
  EXPECT_EQ(c.vals.size(), 8u * 8);
  PageChunk all;
  DecodeChunk(sv, pv.seq(), 0, 0, true, true, &all);
  EXPECT_EQ(all.keys.size(), 20u);
}

TEST(ScanMerge, CloseDirectGapsJoinsPartialPages) {
  ColumnData col;
  // Three pages of 4 records at slots 0, 4, 8; the range keeps [2, 4), [0, 4), [0, 1).
  for (uint64_t k = 0; k < 12; k++) {
    col.keys.push_back(k);
    const int64_t v = static_cast<int64_t>(k * 100);
    col.values.insert(col.values.end(), reinterpret_cast<const uint8_t*>(&v), reinterpret_cast<const uint8_t*>(&v) + 8);
  }
  EXPECT_EQ(CloseDirectGaps({0, 4, 8}, {{2, 4}, {0, 4}, {0, 1}}, 8, &col), 7u);
  EXPECT_EQ(std::vector<uint64_t>(col.keys.begin(), col.keys.end()), (std::vector<uint64_t>{2, 3, 4, 5, 6, 7, 8}));
  EXPECT_EQ(Output(col).at(8), 800);
}

}  // namespace
}  // namespace recflash
