// PageFile: the file of logical pages, opened with O_DIRECT (falls back to buffered I/O only
// where the filesystem refuses O_DIRECT, e.g. tmpfs, and says so in stats).
#pragma once
#include <cstdint>
#include <string>

#include "reader/csrc/status.h"

namespace recflash {

class PageFile {
 public:
  PageFile() = default;
  ~PageFile();
  PageFile(const PageFile&) = delete;
  PageFile& operator=(const PageFile&) = delete;

  // read_only: O_RDONLY, the file must exist (no create).
  Status Open(const std::string& path, uint32_t page_size, bool direct, bool read_only = false);
  void Close();
  int fd() const { return fd_; }
  const std::string& path() const { return path_; }
  uint32_t page_size() const { return page_size_; }
  bool direct() const { return direct_; }
  // Number of page slots the file currently spans.
  Status SlotCount(uint64_t* n) const;
  // Makes sure the file spans at least `slots` pages, allocating ahead (fallocate) in steps
  // of a quarter of its size (1 MiB .. 256 MiB). Why: an O_DIRECT write past the end of the
  // file, or into a hole, takes ext4's inode lock exclusively, so the writes of one flush
  // that io_uring has in flight queue up on it (measured: ~6 % of an import's CPU time spent
  // by io_uring workers spinning on that lock); a write into allocated space takes it shared.
  // Slots allocated ahead and not yet written are free slots, also after a crash.
  Status Reserve(uint64_t slots);
  // Gives back the file's tail past `slots` pages (space allocated ahead and not used, or
  // free slots at the end): what a user's disk pays is the file's allocated bytes.
  Status Truncate(uint64_t slots);
  // Bytes the filesystem has allocated to the file (st_blocks), holes not counted.
  Status AllocatedBytes(uint64_t* bytes) const;
  // Releases the space of pages [first, first + count) (the file analogue of TRIM).
  Status Punch(uint32_t first, uint32_t count);
  Status Sync();

 private:
  int fd_ = -1;
  bool direct_ = false;
  uint64_t reserved_slots_ = 0;  // the file spans at least this many pages
  bool no_fallocate_ = false;   // the filesystem lacks fallocate: do not retry
  uint32_t page_size_ = 0;
  std::string path_;
};

}  // namespace recflash
