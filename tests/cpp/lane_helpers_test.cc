// LaneHelpers: parked threads lent to scans.
#include "reader/csrc/lane_helpers.h"

#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
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

// Wait spins a bounded while before it sleeps: it returns once every job has, whether a job
// ends within the spin or long after it (then woken by the helper), and every job's writes
// are visible when it returns.
TEST(LaneHelpers, WaitReturnsAfterShortAndLongJobs) {
  LaneHelpers h(2);
  for (int ms : {0, 1, 20}) {
    std::vector<int> out(2, 0);
    LaneHelpers::Claim c = h.Acquire(2);
    ASSERT_EQ(c.size(), 2u);
    const auto t0 = std::chrono::steady_clock::now();
    for (size_t k = 0; k < c.size(); k++)
      c.Run(k, [&out, k, ms] {
        std::this_thread::sleep_for(std::chrono::milliseconds(ms * static_cast<int>(k + 1)));
        out[k] = static_cast<int>(k) + 1;
      });
    c.Wait();
    const auto waited = std::chrono::steady_clock::now() - t0;
    EXPECT_EQ(out, (std::vector<int>{1, 2})) << ms << " ms jobs";
    EXPECT_GE(waited, std::chrono::milliseconds(2 * ms));
  }
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

// HelperThread: a scan's background job on a parked helper when one is idle (the same thread
// each time), on a thread of its own when none is, and on a thread of its own without helpers.
TEST(LaneHelpers, HelperThreadUsesAParkedHelperOrItsOwn) {
  LaneHelpers h(1);
  const std::thread::id caller = std::this_thread::get_id();
  std::thread::id first, second, own;
  {
    HelperThread t;
    ASSERT_TRUE(t.Start(&h, [&] { first = std::this_thread::get_id(); }));
    EXPECT_TRUE(t.running());
    EXPECT_EQ(h.Acquire(1).size(), 0u);  // held while the job may run
    t.Join();
    EXPECT_FALSE(t.running());
    EXPECT_EQ(h.Acquire(1).size(), 1u);  // given back by Join
    std::atomic<bool> go{false}, done{false};
    ASSERT_TRUE(t.Start(&h, [&] {
      second = std::this_thread::get_id();
      while (!go.load()) std::this_thread::yield();
      done = true;
    }));
    // The only helper is busy: a second job gets a thread of its own.
    HelperThread u;
    ASSERT_TRUE(u.Start(&h, [&] { own = std::this_thread::get_id(); }));
    u.Join();
    go = true;
    t.Join();  // waits for the job
    EXPECT_TRUE(done.load());
  }
  EXPECT_NE(first, caller);
  EXPECT_EQ(first, second);  // parked, not a new thread
  EXPECT_NE(own, first);
  EXPECT_NE(own, caller);
  std::thread::id alone;
  HelperThread v;
  ASSERT_TRUE(v.Start(nullptr, [&] { alone = std::this_thread::get_id(); }));
  v.Join();
  EXPECT_NE(alone, caller);
  EXPECT_NE(alone, first);
}

TEST(LaneHelpers, NoneWhenAskedForNone) {
  LaneHelpers h(0);
  EXPECT_EQ(h.Acquire(3).size(), 0u);
  LaneHelpers h2(2);
  EXPECT_EQ(h2.Acquire(0).size(), 0u);
}

}  // namespace
}  // namespace recflash
