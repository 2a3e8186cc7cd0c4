// Buffers of read results (HugeAlloc, column.h): from 64 KiB up kept for reuse when freed;
// from 2 MiB up also 2 MiB aligned and advised for transparent huge pages.
//
// Why a cache. A scan's output and its dense-placement slots are tens of MB of fresh memory,
// which the kernel zero-fills page by page on first touch; on this kind of virtual machine that
// ran at 1-2 GB/s and was a third of a large feature's first scan, and most of a many-feature
// scan_many. Freed blocks (numpy releasing a scanned column, a scan's scratch) wait here for the
// next read of a similar size instead of going back to the kernel. The cache is bounded
// (kCacheBytes): beyond it blocks are freed as before. Blocks below 2 MiB count too: a Ray
// read task's columns are that size, and glibc hands such blocks back to the kernel.
#include <sys/mman.h>

#include <cstdint>
#include <cstdlib>
#include <map>
#include <new>
#include <system_error>
#include <unordered_map>

#include "reader/csrc/column.h"
#include "reader/csrc/mutex.h"

namespace recflash {

namespace {

constexpr size_t kHuge = 2u << 20;
constexpr size_t kMinCached = 64u << 10;  // smaller blocks: plain malloc (glibc keeps them)
constexpr size_t kGrain = 64u << 10;
constexpr size_t kCacheBytes = 256u << 20;  // per process; what a long-running reader keeps beyond its live data

class BlockCache {
 public:
  void* Take(size_t bytes) {
    MutexLock l(&mu_);
    // Best fit among blocks no more than twice the request (a small read does not pin a
    // large block).
    auto it = free_.lower_bound(bytes);
    if (it == free_.end() || it->first > 2 * bytes) return nullptr;
    void* p = it->second;
    cached_ -= it->first;
    free_.erase(it);
    return p;
  }
  void Track(void* p, size_t bytes) {
    MutexLock l(&mu_);
    size_of_[p] = bytes;
  }
  // Keeps p for reuse, or frees it when the cache is full.
  void Give(void* p) {
    MutexLock l(&mu_);
    auto it = size_of_.find(p);
    const size_t bytes = it == size_of_.end() ? 0 : it->second;
    if (bytes && cached_ + bytes <= kCacheBytes) {
      free_.emplace(bytes, p);
      cached_ += bytes;
      return;
    }
    if (it != size_of_.end()) size_of_.erase(it);
    std::free(p);
  }

 private:
  Mutex mu_;
  std::multimap<size_t, void*> free_ RF_GUARDED_BY(mu_);     // size -> cached block
  std::unordered_map<void*, size_t> size_of_ RF_GUARDED_BY(mu_);  // every large block's size
  size_t cached_ RF_GUARDED_BY(mu_) = 0;
};

BlockCache& Cache() {
  static BlockCache* c = new BlockCache();  // never destroyed: frees may come during exit
  return *c;
}

// Blocks below kHuge are rounded to kGrain and cached too: a Ray read task's columns are a
// few hundred KB to 2 MB each, and glibc returns freed blocks of that size to the kernel
// (above its mmap threshold, or by trimming the heap's top), so every task faulted in and
// zero-filled its whole output again.
size_t Rounded(size_t bytes) {
  const size_t grain = bytes < kHuge ? kGrain : kHuge;
  return (bytes + grain - 1) / grain * grain;
}

}  // namespace

void* HugeAllocate(size_t bytes) {
  if (bytes < kMinCached) {
    void* p = std::malloc(bytes ? bytes : 1);
    if (!p) throw std::bad_alloc();
    return p;
  }
  const size_t rounded = Rounded(bytes);
  if (void* p = Cache().Take(rounded)) return p;
  void* p = nullptr;
  if (posix_memalign(&p, rounded >= kHuge ? kHuge : 4096, rounded) != 0) throw std::bad_alloc();
  if (rounded >= kHuge) ::madvise(p, rounded, MADV_HUGEPAGE);
  Cache().Track(p, rounded);
  return p;
}

void Populator::Start(std::vector<std::pair<void*, size_t>> ranges) {
#ifdef MADV_POPULATE_WRITE
  Join();
  size_t total = 0;
  for (const auto& r : ranges) total += r.second;
  if (total < kMinBytes) return;
  try {
    t_ = std::thread([ranges = std::move(ranges)]() {
      // The ranges a step at a time each, so all stay ahead of an owner that fills them
      // together (a scan's staging and output advance side by side).
      constexpr int kSteps = 16;
      const uintptr_t page = 4096;
      for (int k = 0; k < kSteps; k++) {
        for (const auto& [p, n] : ranges) {
          const uintptr_t b = reinterpret_cast<uintptr_t>(p);
          const uintptr_t a = (b + n * k / kSteps + page - 1) & ~(page - 1);
          const uintptr_t z = (b + n * (k + 1) / kSteps) & ~(page - 1);
          // Failure (an old kernel: EINVAL) only means the owner faults the pages itself.
          if (z > a && ::madvise(reinterpret_cast<void*>(a), z - a, MADV_POPULATE_WRITE) != 0) return;
        }
      }
    });
  } catch (const std::system_error&) {
    // No thread to be had: the owner faults its pages in itself, as without a populator.
  }
#else
  (void)ranges;
#endif
}

void HugeFree(void* p, size_t bytes) {
  if (!p) return;
  if (bytes < kMinCached) {
    std::free(p);
    return;
  }
  Cache().Give(p);
}

}  // namespace recflash
