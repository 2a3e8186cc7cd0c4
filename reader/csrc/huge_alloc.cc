// Buffers of read results (HugeAlloc, column.h): from 64 KiB up mappings of their own, kept
// for reuse when freed; from 2 MiB up 2 MiB aligned. And the I/O buffers of rings and page
// batches (IoBufferAllocate), advised for transparent huge pages.
//
// Why a cache. A scan's output and its dense-placement slots are tens of MB of fresh memory,
// which the kernel zero-fills page by page on first touch; on this kind of virtual machine that
// ran at 1-2 GB/s and was a third of a large feature's first scan, and most of a many-feature
// scan_many. Freed blocks (numpy releasing a scanned column, a scan's scratch) wait here for the
// next read of a similar size instead of going back to the kernel. The cache is bounded
// (kCacheBytes): beyond it blocks are freed as before. Blocks below 2 MiB count too: a Ray
// read task's columns are that size, and glibc hands such blocks back to the kernel.
//
// Why large blocks grow. Reads that each need a little more than the last (a pass over the
// features smallest first, as the scan benchmark does) found no cached block large enough,
// so every one of them faulted in all of its memory afresh: 7,700 faults and ~0.5 GB zero-filled
// for one pass over 100 features, the first pass 20-30 % slower than the next. A request
// larger than every cached block now takes the largest one and moves it (mremap, page tables
// only) into an aligned mapping of the new size: only the added tail is fresh memory.
//
// Why results are not advised for huge pages, and I/O buffers are. Fresh memory the guest
// kernel has handed back to the host (free page reporting, on this kind of virtual machine:
// after ~2 s) is faulted in at 0.4-0.8 GB/s as transparent huge pages but at 2.2-3.0 GB/s as
// 4 KiB pages (64-256 MiB populated by one thread, measured both ways in alternation); huge
// pages only won for memory freed moments before (20 GB/s). A large feature's first scan after
// a long update phase (the scan benchmark's pass 1) faults in a few MB of fresh output and
// staging: its largest feature took 19-25 ms with huge pages and 9-13 ms without, every
// feature 0.18-0.19 s against 0.13-0.15 s. Scans of memory already faulted in (the cache's) took
// the same time either way. Reads into an I/O buffer, on the other hand, take markedly less
// device time on huge pages (io_ring.cc), so those keep the advice; they are few and long-lived
// (pooled by their rings and page batches), so they bypass the cache.
#include <sys/mman.h>

#include <cstdint>
#include <cstdlib>
#include <map>
#include <new>
#include <unordered_map>

#include "reader/csrc/column.h"
#include "reader/csrc/mutex.h"

namespace recflash {

namespace {

constexpr size_t kHuge = 2u << 20;
constexpr size_t kMinCached = 64u << 10;  // smaller blocks: plain malloc (glibc keeps them)
constexpr size_t kGrain = 64u << 10;
constexpr size_t kCacheBytes = 256u << 20;  // per process; what a long-running reader keeps beyond its live data

// An anonymous mapping of `bytes`, from kHuge up kHuge-aligned; with `huge_pages` advised for
// transparent huge pages. `prot` PROT_NONE reserves the range only. nullptr when refused.
void* Map(size_t bytes, int prot, bool huge_pages = false) {
  const size_t align = bytes >= kHuge ? kHuge : 0;
  const size_t span = bytes + align;
  const int flags = MAP_PRIVATE | MAP_ANONYMOUS | (prot == PROT_NONE ? MAP_NORESERVE : 0);
  void* raw = ::mmap(nullptr, span, prot, flags, -1, 0);
  if (raw == MAP_FAILED) return nullptr;
  if (!align) return raw;
  const uintptr_t b = reinterpret_cast<uintptr_t>(raw);
  const uintptr_t a = (b + kHuge - 1) & ~(kHuge - 1);
  if (a > b) ::munmap(raw, a - b);
  if (b + span > a + bytes) ::munmap(reinterpret_cast<void*>(a + bytes), b + span - (a + bytes));
  void* p = reinterpret_cast<void*>(a);
  if (huge_pages && prot != PROT_NONE) ::madvise(p, bytes, MADV_HUGEPAGE);
  return p;
}

class BlockCache {
 public:
  void* Take(size_t bytes) {
    MutexLock l(&mu_);
    // Best fit among blocks no more than twice the request (a small read does not pin a
    // large block).
    auto it = free_.lower_bound(bytes);
    if (it != free_.end() && it->first <= 2 * bytes) {
      void* p = it->second;
      Unfree(p, it->first);
      return p;
    }
    if (it != free_.end()) {
      // Only far larger blocks: the smallest of them is split, the rest stays cached (a range
      // of a mapping is a mapping of its own to munmap or mremap).
      uint8_t* p = static_cast<uint8_t*>(it->second);
      const size_t whole = it->first;
      const uint64_t origin = block_.at(p).origin;
      Unfree(p, whole);
      block_[p] = {bytes, origin};
      block_[p + bytes] = {whole - bytes, origin};
      AddFree(p + bytes, whole - bytes);
      return p;
    }
    if (free_.empty()) return nullptr;
    // Every cached block is smaller: grow the largest. Its pages move with it into a reserved
    // range of the new size (aligned for huge pages when that is large enough); a failure
    // leaves it cached.
    void* old = std::prev(it)->second;
    const size_t old_bytes = std::prev(it)->first;
    void* dest = Map(bytes, PROT_NONE);
    if (!dest) return nullptr;
    void* q = ::mremap(old, old_bytes, bytes, MREMAP_MAYMOVE | MREMAP_FIXED, dest);
    if (q == MAP_FAILED) {
      ::munmap(dest, bytes);
      return nullptr;
    }
    Unfree(old, old_bytes);
    block_.erase(old);
    block_[q] = {bytes, next_origin_++};
    return q;
  }
  // Unmaps every cached block.
  void ReleaseAll() {
    MutexLock l(&mu_);
    for (const auto& [p, bytes] : free_at_) {
      block_.erase(p);
      ::munmap(p, bytes);
    }
    free_.clear();
    free_at_.clear();
    cached_ = 0;
  }
  size_t cached() {
    MutexLock l(&mu_);
    return cached_;
  }
  void Track(void* p, size_t bytes) {
    MutexLock l(&mu_);
    block_[p] = {bytes, next_origin_++};
  }
  // Keeps p for reuse, joined with the cached blocks on either side of it that are pieces of
  // the same mapping, or frees it when the cache is full.
  //
  // Why join. A pass of reads of growing sizes (smallest feature first) splits the large
  // blocks of the previous pass into pieces for its small reads; kept apart, no piece was
  // large enough for the pass's large reads again, which grew some piece instead and faulted
  // in fresh memory for the rest: ~3,300 faults (13 MB) for the second largest feature of the
  // scan benchmark on every pass, not only the first. Joined, the pieces are the block again
  // once the small reads have released them.
  void Give(void* p) {
    MutexLock l(&mu_);
    auto it = block_.find(p);
    if (it == block_.end()) return;  // not a cached-size block (never handed out by Take/Track)
    const size_t bytes = it->second.bytes;
    if (cached_ + bytes > kCacheBytes) {
      block_.erase(it);
      ::munmap(p, bytes);
      return;
    }
    const uint64_t origin = it->second.origin;
    uint8_t* a = static_cast<uint8_t*>(p);
    size_t n = bytes;
    auto next = free_at_.find(a + n);
    if (next != free_at_.end() && block_.at(next->first).origin == origin) {
      void* q = next->first;
      const size_t m = next->second;
      Unfree(q, m);
      block_.erase(q);
      n += m;
    }
    auto prev = free_at_.lower_bound(a);
    if (prev != free_at_.begin()) {
      --prev;
      uint8_t* b = static_cast<uint8_t*>(prev->first);
      const size_t m = prev->second;
      if (b + m == a && block_.at(b).origin == origin) {
        Unfree(b, m);
        block_.erase(a);
        a = b;
        n += m;
      }
    }
    block_[a] = {n, origin};
    AddFree(a, n);
  }

 private:
  struct Block {
    size_t bytes = 0;
    uint64_t origin = 0;  // the mapping (Map or mremap) it is a piece of: only pieces of one join
  };
  void AddFree(void* p, size_t bytes) RF_REQUIRES(mu_) {
    free_.emplace(bytes, p);
    free_at_[p] = bytes;
    cached_ += bytes;
  }
  void Unfree(void* p, size_t bytes) RF_REQUIRES(mu_) {
    auto [lo, hi] = free_.equal_range(bytes);
    for (auto i = lo; i != hi; ++i)
      if (i->second == p) {
        free_.erase(i);
        break;
      }
    free_at_.erase(p);
    cached_ -= bytes;
  }

  Mutex mu_;
  std::multimap<size_t, void*> free_ RF_GUARDED_BY(mu_);  // size -> cached block
  std::map<void*, size_t> free_at_ RF_GUARDED_BY(mu_);    // the cached blocks by address
  std::unordered_map<void*, Block> block_ RF_GUARDED_BY(mu_);  // every large block, live or cached
  uint64_t next_origin_ RF_GUARDED_BY(mu_) = 1;
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

// An I/O buffer's mapping: whole 4 KiB pages.
size_t PageRounded(size_t bytes) { return (bytes + 4095) & ~size_t{4095}; }

}  // namespace

void* HugeAllocate(size_t bytes) {
  if (bytes < kMinCached) {
    void* p = std::malloc(bytes ? bytes : 1);
    if (!p) throw std::bad_alloc();
    return p;
  }
  const size_t rounded = Rounded(bytes);
  if (void* p = Cache().Take(rounded)) return p;
  void* p = Map(rounded, PROT_READ | PROT_WRITE);
  if (!p) throw std::bad_alloc();
  Cache().Track(p, rounded);
  return p;
}

void Populator::Start(std::vector<std::pair<void*, size_t>> ranges, LaneHelpers* helpers) {
#ifdef MADV_POPULATE_WRITE
  Join();
  size_t total = 0;
  for (const auto& r : ranges) total += r.second;
  if (total < kMinBytes) return;
  // No thread to be had: the owner faults its pages in itself, as without a populator.
  t_.Start(helpers, [ranges = std::move(ranges)]() {
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
#else
  (void)ranges;
  (void)helpers;
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

void HugeReleaseCached() { Cache().ReleaseAll(); }

void* IoBufferAllocate(size_t bytes) {
  void* p = Map(PageRounded(bytes), PROT_READ | PROT_WRITE, /*huge_pages=*/true);
  if (!p) throw std::bad_alloc();
  return p;
}

void IoBufferFree(void* p, size_t bytes) {
  if (p) ::munmap(p, PageRounded(bytes));
}

size_t HugeCachedBytes() { return Cache().cached(); }

}  // namespace recflash
