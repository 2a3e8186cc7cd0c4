// Pinner, Merger and Reclaimer plans on hand-built inputs: they are pure planners, so a plan
// follows from the candidates and page table alone.
#include <gtest/gtest.h>

#include <algorithm>

#include "reader/csrc/merger.h"
#include "reader/csrc/pinner.h"

namespace recflash {
namespace {

constexpr uint32_t kPage = 4096;

TEST(Pinner, PinsSmallFeaturesByItemCountWithinTheBudget) {
  PinnerOptions o;  // threshold 1/4 page = 1024 B, budget 5 % of the buffer
  Pinner p(o);
  // Buffer 40 KiB: budget 2048 B.
  const std::vector<PinCandidate> c = {
      {1, 100, 800, 0},   // small, most items: pinned first
      {2, 50, 900, 0},    // small, fits beside 1 (800 + 900 <= 2048)
      {3, 90, 1200, 0},   // past the threshold: written
      {4, 10, 600, 0},    // would exceed the budget after 1 and 2
  };
  std::vector<uint32_t> pinned = p.Choose(c, 40960, kPage);
  std::sort(pinned.begin(), pinned.end());
  EXPECT_EQ(pinned, (std::vector<uint32_t>{1, 2}));
  EXPECT_EQ(p.stats().features_pinned, 2u);
  EXPECT_EQ(p.stats().items_pinned, 150u);
  EXPECT_EQ(p.stats().bytes_pinned, 1700u);
}

TEST(Pinner, ReleasesByThresholdAndAge) {
  PinnerOptions o;
  o.max_flushes = 3;
  Pinner p(o);
  const std::vector<PinCandidate> c = {{1, 5, 2000, 2}, {2, 5, 100, 3}, {3, 5, 100, 2}};
  EXPECT_EQ(p.Choose(c, 1 << 20, kPage), (std::vector<uint32_t>{3}));
  EXPECT_EQ(p.stats().released_threshold, 1u);
  EXPECT_EQ(p.stats().released_age, 1u);
}

TEST(Pinner, DisabledAndTopNBound) {
  PinnerOptions off;
  off.enabled = false;
  Pinner none(off);
  EXPECT_TRUE(none.Choose({{1, 5, 10, 0}}, 1 << 20, kPage).empty());
  PinnerOptions top;
  top.max_features = 2;
  Pinner p(top);
  EXPECT_EQ(p.Choose({{1, 5, 10, 0}, {2, 9, 10, 0}, {3, 7, 10, 0}}, 1 << 20, kPage), (std::vector<uint32_t>{2, 3}));
}

// A page table where feature `fid` has one segment of `bytes` on-disk bytes in each page.
struct Layout {
  LogicalPageTable pt;
  FeatureState f;
  void AddPage(uint32_t pid, uint32_t fid, uint32_t bytes, uint32_t count = 10) {
    pt.EnsureSlots(pid + 1);
    SegMeta s;
    s.fid = fid;
    s.count = s.valid = count;
    s.length = bytes;
    pt.MarkLive(pid, pid + 1, {s});
    if (fid == f.def.id) f.pages.push_back(pid);
  }
};

TEST(Merger, GathersAFragmentedFeatureEmptiestFirst) {
  Layout l;
  l.f.def.id = 7;
  for (uint32_t p = 0; p < 8; p++) l.AddPage(p, 7, 200 + 10 * p);  // 8 pages, < 1 page of data
  l.AddPage(8, 7, PagePayload(kPage));                               // a full page: never gathered
  Merger m(MergerOptions{});
  std::vector<MoveTask> tasks = m.Plan({&l.f}, l.pt, kPage);
  ASSERT_FALSE(tasks.empty());
  for (const MoveTask& t : tasks) {
    EXPECT_EQ(t.fid, 7u);
    EXPECT_NE(t.page, 8u);
  }
  EXPECT_EQ(tasks.front().page, 0u);  // the emptiest page first
  EXPECT_EQ(m.stats().victims, 1u);
  EXPECT_EQ(m.stats().pages_gathered, tasks.size());
}

TEST(Merger, LeavesCompactFeaturesAndSlackAlone) {
  Layout l;
  l.f.def.id = 1;
  l.AddPage(0, 1, PagePayload(kPage));
  l.AddPage(1, 1, 100);  // ideal 2 pages, has 2: within the slack
  Merger m(MergerOptions{});
  EXPECT_TRUE(m.Plan({&l.f}, l.pt, kPage).empty());
  MergerOptions off;
  off.enabled = false;
  Layout frag;
  frag.f.def.id = 2;
  for (uint32_t p = 0; p < 6; p++) frag.AddPage(p, 2, 100);
  EXPECT_TRUE(Merger(off).Plan({&frag.f}, frag.pt, kPage).empty());
  EXPECT_FALSE(Merger(MergerOptions{}).Plan({&frag.f}, frag.pt, kPage).empty());
}

TEST(Merger, RunWeightGathersPagesOutsideRunsFirst) {
  // Pages 0-5 are one run of the feature (a merge's output, since thinned by updates); 10, 20
  // and 30 each stand alone (flushes'). Emptiest first takes the run's pages first, splitting it;
  // with run_weight the lone pages go first, then the run's ends, its inside last.
  auto layout = [](Layout* l) {
    l->f.def.id = 5;
    const uint32_t payload = PagePayload(kPage);
    for (uint32_t p = 0; p <= 5; p++) l->AddPage(p, 5, payload * 35 / 100 + p);
    for (uint32_t p : {10u, 20u, 30u}) l->AddPage(p, 5, payload * 55 / 100 + p);
    l->AddPage(40, 5, payload);
  };
  Layout plain;
  layout(&plain);
  MergerOptions emptiest_first;
  emptiest_first.run_weight = 0.0;
  const std::vector<MoveTask> emptiest = Merger(emptiest_first).Plan({&plain.f}, plain.pt, kPage);
  ASSERT_FALSE(emptiest.empty());
  EXPECT_EQ(emptiest.front().page, 0u);
  EXPECT_LT(emptiest[1].page, 6u);

  Layout l;
  layout(&l);
  MergerOptions o;
  o.run_weight = 1.0;
  Merger m(o);
  const std::vector<MoveTask> tasks = m.Plan({&l.f}, l.pt, kPage);
  ASSERT_GE(tasks.size(), 4u);
  std::vector<uint32_t> order;
  for (const MoveTask& t : tasks) order.push_back(t.page);
  EXPECT_EQ(std::vector<uint32_t>(order.begin(), order.begin() + 3), (std::vector<uint32_t>{10, 20, 30}));
  EXPECT_TRUE(order[3] == 0 || order[3] == 5) << order[3];
  for (size_t i = 3; i < order.size(); i++) EXPECT_NE(order[i], 40u);
  // The run's ends before any page inside it.
  size_t last_end = 0, first_inside = order.size();
  for (size_t i = 0; i < order.size(); i++) {
    if (order[i] == 0 || order[i] == 5) last_end = i;
    if (order[i] >= 1 && order[i] <= 4) first_inside = std::min(first_inside, i);
  }
  EXPECT_LT(last_end, first_inside);
  EXPECT_EQ(m.stats().pages_gathered, tasks.size());
}

TEST(Merger, FragmentationDegree) {
  Layout l;
  l.f.def.id = 3;
  for (uint32_t p = 0; p < 4; p++) l.AddPage(p, 3, 100);
  EXPECT_DOUBLE_EQ(FragmentationDegree(l.f, l.pt, kPage), 4.0);
  FeatureState empty;
  EXPECT_DOUBLE_EQ(FragmentationDegree(empty, l.pt, kPage), 0.0);
}

TEST(Reclaimer, RewritesTheLeastUtilisedPagesPastTheLimit) {
  Layout l;
  l.f.def.id = 99;  // pages belong to other features
  const uint32_t payload = PagePayload(kPage);
  for (uint32_t p = 0; p < 10; p++) l.AddPage(p, p % 3, p < 2 ? payload : payload / 20 + p);
  double need = 0;
  EXPECT_GT(Reclaimer::SpaceAmp(l.pt, kPage, &need), 2.0);
  Reclaimer r(ReclaimOptions{});
  std::vector<MoveTask> tasks = r.Plan(l.pt, kPage);
  ASSERT_FALSE(tasks.empty());
  for (const MoveTask& t : tasks) {
    EXPECT_EQ(t.fid, MoveTask::kAllFeatures);
    EXPECT_GE(t.page, 2u);  // full pages stay
  }
  EXPECT_EQ(tasks.front().page, 2u);  // least utilised first
  ReclaimOptions lax;
  lax.space_amp_limit = 100;
  EXPECT_TRUE(Reclaimer(lax).Plan(l.pt, kPage).empty());
}

}  // namespace
}  // namespace recflash
