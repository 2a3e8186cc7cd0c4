// The read-buffer cache (huge_alloc.cc): freed blocks are reused whole, split when far larger
// than a request, and grown (their pages moved, not faulted in again) when every cached block
// is smaller; live blocks never overlap, whatever the sequence. Result blocks are not advised
// for transparent huge pages, I/O buffers are.
#include <gtest/gtest.h>

#include <cstring>
#include <fstream>
#include <random>
#include <sstream>
#include <string>
#include <vector>

#include "reader/csrc/column.h"

namespace recflash {
namespace {

constexpr size_t kMiB = 1u << 20;

TEST(HugeAlloc, GrowsTheLargestCachedBlockKeepingItsPages) {
  HugeReleaseCached();
  auto* a = static_cast<uint8_t*>(HugeAllocate(6 * kMiB));
  for (size_t i = 0; i < 6 * kMiB; i++) a[i] = static_cast<uint8_t>(i * 7 + 1);
  HugeFree(a, 6 * kMiB);
  EXPECT_EQ(HugeCachedBytes(), 6 * kMiB);
  // Larger than anything cached: the 6 MiB block moves into the new one, its bytes with it.
  auto* b = static_cast<uint8_t*>(HugeAllocate(20 * kMiB));
  EXPECT_EQ(HugeCachedBytes(), 0u);
  for (size_t i = 0; i < 6 * kMiB; i += 4093) ASSERT_EQ(b[i], static_cast<uint8_t>(i * 7 + 1)) << i;
  std::memset(b, 0x5a, 20 * kMiB);  // the whole block is mapped and writable
  HugeFree(b, 20 * kMiB);
  HugeReleaseCached();
}

TEST(HugeAlloc, SplitsAFarLargerBlockAndReusesACloseOne) {
  HugeReleaseCached();
  auto* big = static_cast<uint8_t*>(HugeAllocate(16 * kMiB));
  HugeFree(big, 16 * kMiB);
  // A quarter of it: the block is split, the rest stays cached.
  auto* x = static_cast<uint8_t*>(HugeAllocate(4 * kMiB));
  EXPECT_EQ(x, big);
  EXPECT_EQ(HugeCachedBytes(), 12 * kMiB);
  auto* y = static_cast<uint8_t*>(HugeAllocate(3 * kMiB));
  EXPECT_EQ(y, big + 4 * kMiB);
  EXPECT_EQ(HugeCachedBytes(), 8 * kMiB);
  std::memset(x, 1, 4 * kMiB);
  std::memset(y, 2, 3 * kMiB);
  HugeFree(x, 4 * kMiB);
  // Within twice the request: reused whole.
  auto* z = static_cast<uint8_t*>(HugeAllocate(3 * kMiB));
  EXPECT_EQ(z, x);
  EXPECT_EQ(y[0], 2);
  HugeFree(y, 3 * kMiB);
  HugeFree(z, 3 * kMiB);
  HugeReleaseCached();
  EXPECT_EQ(HugeCachedBytes(), 0u);
}

TEST(HugeAlloc, PiecesOfABlockJoinAgainWhenFreed) {
  HugeReleaseCached();
  auto* big = static_cast<uint8_t*>(HugeAllocate(24 * kMiB));
  std::memset(big, 7, 24 * kMiB);
  HugeFree(big, 24 * kMiB);
  // Small reads split it into pieces (each far smaller than the cached block)...
  auto* a = static_cast<uint8_t*>(HugeAllocate(2 * kMiB));
  auto* b = static_cast<uint8_t*>(HugeAllocate(4 * kMiB));
  auto* c = static_cast<uint8_t*>(HugeAllocate(1 * kMiB));
  EXPECT_EQ(a, big);
  EXPECT_EQ(b, big + 2 * kMiB);
  EXPECT_EQ(HugeCachedBytes(), 17 * kMiB);
  // ... which, freed in any order, are the whole block again: the next large read takes it
  // as it is (same address, its pages kept), not a grown piece.
  HugeFree(b, 4 * kMiB);
  HugeFree(a, 2 * kMiB);
  HugeFree(c, 1 * kMiB);
  EXPECT_EQ(HugeCachedBytes(), 24 * kMiB);
  auto* again = static_cast<uint8_t*>(HugeAllocate(24 * kMiB));
  EXPECT_EQ(again, big);
  EXPECT_EQ(again[24 * kMiB - 1], 7);
  EXPECT_EQ(HugeCachedBytes(), 0u);
  HugeFree(again, 24 * kMiB);
  HugeReleaseCached();
}

TEST(HugeAlloc, LiveBlocksNeverOverlap) {
  HugeReleaseCached();
  std::mt19937_64 rng(7);
  struct Live {
    uint8_t* p;
    size_t n;
    uint8_t tag;
  };
  std::vector<Live> live;
  uint8_t tag = 0;
  auto check = [](const Live& l) {
    for (size_t i = 0; i < l.n; i += 997) ASSERT_EQ(l.p[i], l.tag) << "block of " << l.n << " at " << i;
    ASSERT_EQ(l.p[l.n - 1], l.tag);
  };
  for (int step = 0; step < 600; step++) {
    if (live.empty() || rng() % 3 != 0) {
      // Sizes across the classes: malloc'd, 64 KiB grain, 2 MiB grain.
      const size_t sizes[] = {1000, 70000, 300000, 1500000, 2 * kMiB + 5, 5 * kMiB, 11 * kMiB};
      const size_t n = sizes[rng() % 7] + rng() % 50000;
      auto* p = static_cast<uint8_t*>(HugeAllocate(n));
      for (const Live& l : live) ASSERT_TRUE(p + n <= l.p || l.p + l.n <= p) << "new block overlaps a live one";
      std::memset(p, ++tag, n);
      live.push_back({p, n, tag});
    } else {
      const size_t k = rng() % live.size();
      check(live[k]);
      HugeFree(live[k].p, live[k].n);
      live.erase(live.begin() + static_cast<long>(k));
    }
    if (step % 50 == 0)
      for (const Live& l : live) check(l);
  }
  for (const Live& l : live) {
    check(l);
    HugeFree(l.p, l.n);
  }
  HugeReleaseCached();
}

// The VmFlags line of the mapping that holds p (/proc/self/smaps); "" when none does.
std::string VmFlagsOf(const void* p) {
  std::ifstream smaps("/proc/self/smaps");
  const auto a = reinterpret_cast<uintptr_t>(p);
  std::string line;
  bool inside = false;
  while (std::getline(smaps, line)) {
    uintptr_t lo = 0, hi = 0;
    char dash = 0;
    std::istringstream head(line);
    if (head >> std::hex >> lo >> dash >> hi && dash == '-' && line.find(' ') != std::string::npos &&
        line.find(':') > line.find(' ')) {
      inside = lo <= a && a < hi;
      continue;
    }
    if (inside && line.rfind("VmFlags:", 0) == 0) return line;
  }
  return "";
}

bool AdvisedHuge(const void* p) {
  const std::string flags = VmFlagsOf(p);
  EXPECT_FALSE(flags.empty()) << "no mapping holds the block";
  return (" " + flags + " ").find(" hg ") != std::string::npos;
}

TEST(HugeAlloc, OnlyIoBuffersAreAdvisedForHugePages) {
  HugeReleaseCached();
  // A fresh result block, and one grown from a cached block.
  auto* r = static_cast<uint8_t*>(HugeAllocate(8 * kMiB));
  std::memset(r, 1, 8 * kMiB);
  EXPECT_FALSE(AdvisedHuge(r));
  HugeFree(r, 8 * kMiB);
  auto* g = static_cast<uint8_t*>(HugeAllocate(20 * kMiB));
  std::memset(g, 2, 20 * kMiB);
  EXPECT_FALSE(AdvisedHuge(g));
  HugeFree(g, 20 * kMiB);
  HugeReleaseCached();
  auto* io = static_cast<uint8_t*>(IoBufferAllocate(4 * kMiB + 100));
  EXPECT_EQ(reinterpret_cast<uintptr_t>(io) % (2 * kMiB), 0u);
  std::memset(io, 3, 4 * kMiB + 100);
  EXPECT_TRUE(AdvisedHuge(io));
  IoBufferFree(io, 4 * kMiB + 100);
  EXPECT_EQ(HugeCachedBytes(), 0u);  // not cached
}

}  // namespace
}  // namespace recflash
