// ColumnData: what a read returns for one feature (keys, packed values, offsets), in
// buffers that a Python binding hands to numpy without a copy.
#pragma once
#include <cstdint>
#include <cstdlib>
#include <new>
#include <utility>
#include <vector>

#include "reader/csrc/lane_helpers.h"

namespace recflash {

// Allocator for read results: large buffers are mappings of their own, 2 MiB aligned, and
// freed ones are reused by later reads (huge_alloc.cc: fresh memory is zero-filled by the
// kernel, and why these are not advised for huge pages). resize(n) leaves new
// elements uninitialised (default-initialised, as std::make_unique_for_overwrite does): a
// read sizes its output and then writes every element it keeps, so zero-filling first was
// a pass over the whole result for nothing. resize(n, value) still writes value.
void* HugeAllocate(size_t bytes);
// Frees a HugeAllocate block of `bytes` (what was asked for); large blocks are kept for reuse
// (huge_alloc.cc).
void HugeFree(void* p, size_t bytes);
// Returns the cached (freed, kept for reuse) blocks to the kernel; the bytes they hold.
void HugeReleaseCached();
size_t HugeCachedBytes();
// A buffer for reads or writes of the device: `bytes` (from 2 MiB up, a multiple of 4 KiB)
// 2 MiB aligned and advised for transparent huge pages, not cached (huge_alloc.cc). Freed with
// IoBufferFree(p, bytes).
void* IoBufferAllocate(size_t bytes);
void IoBufferFree(void* p, size_t bytes);

template <typename T>
struct HugeAlloc {
  using value_type = T;
  HugeAlloc() = default;
  template <typename U>
  HugeAlloc(const HugeAlloc<U>&) {}
  T* allocate(size_t n);
  void deallocate(T* p, size_t n) { HugeFree(p, n * sizeof(T)); }
  template <typename U>
  void construct(U* p) noexcept {
    ::new (static_cast<void*>(p)) U;
  }
  template <typename U, typename... Args>
  void construct(U* p, Args&&... args) {
    ::new (static_cast<void*>(p)) U(std::forward<Args>(args)...);
  }
  template <typename U>
  bool operator==(const HugeAlloc<U>&) const { return true; }
};
template <typename T>
T* HugeAlloc<T>::allocate(size_t n) {
  return static_cast<T*>(HugeAllocate(n * sizeof(T)));
}
template <typename T>
using HVec = std::vector<T, HugeAlloc<T>>;

// Faults in fresh read buffers on a helper thread while the reading thread works. Fresh memory
// is zero-filled by the kernel page by page on first touch (3-4 GB/s on this kind of virtual
// machine, far less for memory the guest never touched): for a large feature's first scan its
// output and staging buffers are tens of MB, and the faults ran on the scan's thread after the
// reads. madvise(MADV_POPULATE_WRITE) makes pages present and writable without writing them,
// so the owner may write the same buffers meanwhile; on blocks already faulted in (the block
// cache's) it only walks their page tables. Kernels without it: nothing happens.
class Populator {
 public:
  Populator() = default;
  Populator(const Populator&) = delete;
  Populator& operator=(const Populator&) = delete;
  ~Populator() { Join(); }
  // Faults in the whole pages of each range on a helper thread (a parked one of `helpers`
  // when one is idle, else a new one), in order; nothing when the ranges total less than
  // kMinBytes. The buffers must outlive the thread: Join (or the destructor) before they are
  // freed. One Start per Join.
  static constexpr size_t kMinBytes = 1u << 20;
  void Start(std::vector<std::pair<void*, size_t>> ranges, LaneHelpers* helpers = nullptr);
  void Join() { t_.Join(); }

 private:
  HelperThread t_;
};

// Result of a read for one feature. Values of fixed-width types are packed; variable-width
// ones are delimited by element offsets (Arrow list/binary offsets).
struct ColumnData {
  HVec<uint64_t> keys;
  HVec<uint8_t> values;
  std::vector<int32_t> offsets;  // variable-width types: size n + 1, in elements
  std::vector<uint8_t> found;    // get(): 1 where the key has a value
};

}  // namespace recflash
