// PageBatch: the new pages of one flush, built in memory before any of them is written.
//
// A flush writes its items as new pages: first the appends (a deferred-index feature's
// buffered items as they are: AddRuns), then single records (updates, deletes, writes to a
// feature whose index is materialized: AddRecord). Pages are built into aligned blocks that
// the caller keeps across flushes (no page faults per flush). A page gets its seq and page id
// when the batch is written, because ids are allocated once the page count is known.
//
// Threads. Building a large append — a bulk load's write buffer: millions of items, hundreds
// of pages — is CPU work (sizing, dictionary coding, packing) that nothing else can do while
// the flush holds the write lock, and it was most of an import's writer thread. AddRuns
// therefore splits the runs into contiguous groups of features of about equal bytes and
// builds each group on its own thread, into its own blocks. Each group ends in a partly
// filled page; those are not written as they are: their segments move into the last group's
// open page (overflowing into new pages), so the batch holds one partly filled page at its
// end, as a one-thread build does. Only where page boundaries fall differs from a one-thread
// build (each group starts a fresh page), which can cost one page per extra group at most.
// Small flushes (under `min_items_per_thread` per thread) build on the calling thread, item
// for item as before.
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

#include "reader/csrc/format.h"
#include "reader/csrc/io_ring.h"
#include "reader/csrc/status.h"
#include "reader/csrc/types.h"
#include "reader/csrc/write_buffer.h"

namespace recflash {

// One feature's append: its buffered items (normalized: ascending keys, no tombstones).
struct AppendItems {
  const FeatureDef* def;
  const BufferedItems* items;
};

class PageBatch {
 public:
  // pools: staging blocks, one pool per thread, kept by the caller across flushes (grown as
  // needed). keep = false (accounting mode): pages are built and counted, not kept.
  PageBatch(uint32_t page_size, bool compact, bool keep, std::vector<std::vector<AlignedBuffer>>* pools);

  // Adds the appends in order, on up to min(threads, pools->size()) threads.
  Status AddRuns(const std::vector<AppendItems>& runs, unsigned threads, size_t min_items_per_thread);
  // Adds one record after the runs; fails only when the value cannot fit in any page.
  Status AddRecord(const FeatureDef& def, uint64_t key, const uint8_t* value, uint32_t len, bool tomb);
  // Finishes the open page, if any. No Add after it.
  void Close();

  size_t size() const { return lanes_.back().summaries.size(); }  // finished pages
  // Index the page that the last record added will have (the open page's).
  size_t open_page() const { return size(); }
  uint8_t* page(size_t i) const { return lanes_.back().pages[i]; }  // keep only
  const std::vector<std::vector<SegmentSummary>>& summaries() const { return lanes_.back().summaries; }
  unsigned threads_used() const { return threads_used_; }

 private:
  // One thread's pages: a builder over its own pool of blocks.
  struct Lane {
    Lane(uint32_t page_size, bool compact, bool keep, std::vector<AlignedBuffer>* pool)
        : pb(page_size, compact), page_size(page_size), keep(keep), pool(pool), scratch(keep ? 0 : page_size) {}
    PageBuilder pb;
    uint32_t page_size;
    bool keep;
    std::vector<AlignedBuffer>* pool;
    AlignedBuffer scratch;  // !keep: every page is built here and dropped
    size_t slots_used = 0;  // pages built into this lane's pool
    std::vector<uint8_t*> pages;
    std::vector<std::vector<SegmentSummary>> summaries;

    void FinishPage();
    Status AddItems(const FeatureDef& def, const uint64_t* keys, const uint8_t* values, const uint32_t* offsets,
                    size_t n);  // fixed width: values packed; variable: delimited by offsets[0..n]
    Status Add(const FeatureDef& def, uint64_t key, const uint8_t* value, uint32_t len, bool tomb);
  };
  static constexpr uint32_t kBlockPages = 32;

  uint32_t page_size_;
  bool compact_;
  bool keep_;
  std::vector<std::vector<AlignedBuffer>>* pools_;
  // lanes_.back() is the main lane: after AddRuns it holds every finished page, in order,
  // and takes everything added later.
  std::vector<Lane> lanes_;
  unsigned threads_used_ = 1;
};

}  // namespace recflash
