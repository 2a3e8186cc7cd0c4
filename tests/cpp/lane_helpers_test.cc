// LaneHelpers: parked threads lent to scans.
#include "reader/csrc/lane_helpers.h"

#include <gtest/gtest.h>

#include <atomic>
#include <thread>
#include <vector>

namespace recflash {
namespace {

TEST(LaneHelpers, ClaimRunWaitAndGiveBack) {
  LaneHelpers h(2);
  std::atomic<int> ran{0};
  {
    LaneHelpers::Claim c = h.Acquire(5);
    ASSERT_EQ(c.size(), 2u);  // no more than there are
    EXPECT_EQ(h.Acquire(1).size(), 0u);  // all held
    for (size_t k = 0; k < c.size(); k++) c.Run(k, [&ran] { ran++; });
    c.Wait();
    EXPECT_EQ(ran.load(), 2);
  }
  // Given back by the claim's destructor; a claim that ran nothing gives them back too.
  { EXPECT_EQ(h.Acquire(2).size(), 2u); }
  LaneHelpers::Claim c = h.Acquire(1);
  EXPECT_EQ(c.size(), 1u);
  EXPECT_EQ(h.Acquire(2).size(), 1u);
}

TEST(LaneHelpers, ConcurrentScansShareThem) {
  LaneHelpers h(3);
  std::atomic<int> ran{0}, claimed{0};
  std::vector<std::thread> ts;
  for (int t = 0; t < 6; t++)
    ts.emplace_back([&] {
      for (int i = 0; i < 200; i++) {
        LaneHelpers::Claim c = h.Acquire(2);
        claimed += static_cast<int>(c.size());
        for (size_t k = 0; k < c.size(); k++) c.Run(k, [&ran] { ran++; });
      }  // the destructor waits for the jobs
    });
  for (std::thread& t : ts) t.join();
  EXPECT_EQ(ran.load(), claimed.load());
  EXPECT_GT(claimed.load(), 0);
}

TEST(LaneHelpers, NoneWhenAskedForNone) {
  LaneHelpers h(0);
  EXPECT_EQ(h.Acquire(3).size(), 0u);
  LaneHelpers h2(2);
  EXPECT_EQ(h2.Acquire(0).size(), 0u);
}

}  // namespace
}  // namespace recflash
