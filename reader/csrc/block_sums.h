// BlockSums: crc32c of every device block (512 B where the device allows) of the pages that
// block-granular ("vector-grained") reads serve.
//
// A block read cannot check the page checksum, which covers the whole page. The sums are
// therefore taken from a page whose page checksum verified (a whole-page read), tagged with
// the page's seq, and every later block read of that page is checked against them: a row
// read at 512 B granularity is as well protected as one read with its page. A page that was
// rewritten carries a new seq, so sums never vouch for bytes they were not taken from.
//
// Cost: 4 bytes of DRAM per block (0.8 % of the data at 512 B blocks) plus a small entry per
// page. The sums are saved at a clean close when they changed and loaded by the next reader.
// An entry stays true for as long as the file holds that page version: sums are only taken
// from pages of an installed (committed) version, and a committed seq is never issued again
// (not even after a crash), so a (page, seq) pair names one content forever.
#pragma once
#include <atomic>
#include <cstdint>
#include <memory>
#include "reader/csrc/mutex.h"
#include <string>
#include <unordered_map>
#include <vector>

#include "reader/csrc/status.h"

namespace recflash {

class BlockSums {
 public:
  BlockSums(uint32_t page_size, uint32_t block_size)
      : page_size_(page_size), block_size_(block_size), blocks_per_page_(page_size / block_size) {}

  uint32_t block_size() const { return block_size_; }
  uint32_t blocks_per_page() const { return blocks_per_page_; }

  // Records the sums of a verified page (page_size bytes at `data`), replacing older ones.
  void Record(uint32_t page, uint64_t seq, const uint8_t* data);
  // True when sums taken from exactly this version (seq) of the page are held.
  bool Has(uint32_t page, uint64_t seq) const;
  // Copies the sums of blocks [first, first + count) of the page into out; false when the
  // page's sums are missing or belong to another version of it.
  bool Lookup(uint32_t page, uint64_t seq, uint32_t first, uint32_t count, uint32_t* out) const;
  // Checksum of one block as Record computes it.
  static uint32_t Sum(const uint8_t* block, uint32_t block_size);

  size_t pages() const;
  size_t MemoryBytes() const;

  // True when sums were recorded since the last Load/Save.
  bool dirty() const { return dirty_.load(); }
  // Writes every entry to `path` (a temporary file, fsync, rename): after a clean close no
  // write-back of it is left for later. Load reads such a file back if its sizes and trailing
  // checksum match; a missing or damaged file only means the sums are taken again, so Load
  // never fails the open.
  Status Save(const std::string& path);
  void Load(const std::string& path);

 private:
  struct Entry {
    uint64_t seq = 0;
    std::unique_ptr<uint32_t[]> sums;
  };
  const uint32_t page_size_, block_size_, blocks_per_page_;
  mutable SharedMutex mu_;
  std::atomic<bool> dirty_{false};
  std::unordered_map<uint32_t, Entry> pages_ RF_GUARDED_BY(mu_);
};

}  // namespace recflash
