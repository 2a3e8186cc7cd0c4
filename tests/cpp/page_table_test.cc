// LogicalPageTable's free slots: which slots a flush is given, and which freed slots stay
// allocated in the page file (kept) or are handed back to be punched.
#include <gtest/gtest.h>

#include "reader/csrc/metadata.h"

namespace recflash {
namespace {

// A table of `n` slots, all live.
LogicalPageTable Table(uint32_t n) {
  LogicalPageTable t;
  t.EnsureSlots(n);
  for (uint32_t p = 0; p < n; p++) t.MarkLive(p, p + 1, {});
  return t;
}

void Free(LogicalPageTable* t, std::initializer_list<uint32_t> pids, bool kept) {
  for (uint32_t p : pids) {
    t->MarkDead(p);
    t->AddFree(p, kept);
  }
}

TEST(PageTable, AllocatesKeptRunsBeforeLowerReturnedOnes) {
  LogicalPageTable t = Table(20);
  Free(&t, {2, 3, 4}, /*kept=*/false);
  Free(&t, {10, 11, 12}, /*kept=*/true);
  EXPECT_EQ(t.kept_slots(), 3u);
  // A run of 3 exists at 2 (returned) and at 10 (kept): the kept one is overwritten.
  EXPECT_EQ(t.Allocate(3), (std::vector<uint32_t>{10, 11, 12}));
  EXPECT_EQ(t.kept_slots(), 0u);
  EXPECT_EQ(t.free_slots(), 3u);
  // No kept run left: the returned run is still used before the file grows.
  EXPECT_EQ(t.Allocate(3), (std::vector<uint32_t>{2, 3, 4}));
  EXPECT_EQ(t.Allocate(2), (std::vector<uint32_t>{20, 21}));  // appended
}

TEST(PageTable, SmallWritesFillKeptHolesFirst) {
  LogicalPageTable t = Table(20);
  Free(&t, {1, 5}, /*kept=*/false);
  Free(&t, {9, 15}, /*kept=*/true);
  EXPECT_EQ(t.Allocate(1), (std::vector<uint32_t>{9}));
  EXPECT_EQ(t.Allocate(2), (std::vector<uint32_t>{15, 1}));  // the last kept slot, then a returned one
  EXPECT_EQ(t.free_slots(), 1u);
  EXPECT_EQ(t.kept_slots(), 0u);
}

TEST(PageTable, ReturnsTheHighestKeptSlotsBeyondTheReserve) {
  LogicalPageTable t = Table(30);
  Free(&t, {3, 4, 5, 20, 21, 27}, /*kept=*/true);
  Free(&t, {8}, /*kept=*/false);
  // Keep the 4 lowest: 21 and 27 are returned (ascending, for coalescing into punches).
  EXPECT_EQ(t.ReturnKeptBeyond(4), (std::vector<uint32_t>{21, 27}));
  EXPECT_EQ(t.kept_slots(), 4u);
  EXPECT_EQ(t.free_slots(), 7u);  // returned slots stay free (reusable)
  EXPECT_TRUE(t.ReturnKeptBeyond(4).empty());
  EXPECT_EQ(t.ReturnKeptBeyond(0), (std::vector<uint32_t>{3, 4, 5, 20}));
  EXPECT_EQ(t.kept_slots(), 0u);
}

TEST(PageTable, ReusedAndTrimmedSlotsLeaveTheKeptSet) {
  LogicalPageTable t = Table(10);
  Free(&t, {7, 8, 9}, /*kept=*/true);
  Free(&t, {2}, /*kept=*/true);
  // The free tail (7..9) is cut off the file: those slots are neither free nor kept any more.
  EXPECT_EQ(t.TrimFreeTail(), 7u);
  EXPECT_EQ(t.kept_slots(), 1u);
  // A slot that becomes live again (a recovery re-marking it) leaves both sets.
  t.MarkLive(2, 99, {});
  EXPECT_EQ(t.kept_slots(), 0u);
  EXPECT_EQ(t.free_slots(), 0u);
  EXPECT_TRUE(t.ReturnKeptBeyond(0).empty());
}

}  // namespace
}  // namespace recflash
