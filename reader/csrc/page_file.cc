#include "reader/csrc/page_file.h"

#include <fcntl.h>
#include <linux/falloc.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>

#include "reader/csrc/fault_injection.h"

namespace recflash {

PageFile::~PageFile() { Close(); }

Status PageFile::Open(const std::string& path, uint32_t page_size, bool direct, bool read_only) {
  path_ = path;
  page_size_ = page_size;
  const int mode = read_only ? O_RDONLY : (O_RDWR | O_CREAT);
  const bool existed = ::access(path.c_str(), F_OK) == 0;
  fd_ = ::open(path.c_str(), mode | O_CLOEXEC | (direct ? O_DIRECT : 0), 0644);
  if (fd_ < 0 && direct && errno == EINVAL) {
    fd_ = ::open(path.c_str(), mode | O_CLOEXEC, 0644);
    direct = false;
  }
  if (fd_ < 0) return Status::FromErrno("open", path, errno);
  if (!existed) fault::FileCreated(path);
  direct_ = direct;
  return Status::OK();
}

void PageFile::Close() {
  if (fd_ >= 0) ::close(fd_);
  fd_ = -1;
}

Status PageFile::SlotCount(uint64_t* n) const {
  struct stat st;
  if (::fstat(fd_, &st) != 0) return Status::FromErrno("fstat", path_, errno);
  *n = static_cast<uint64_t>(st.st_size) / page_size_;
  return Status::OK();
}

Status PageFile::AllocatedBytes(uint64_t* bytes) const {
  struct stat st;
  if (::fstat(fd_, &st) != 0) return Status::FromErrno("fstat", path_, errno);
  *bytes = static_cast<uint64_t>(st.st_blocks) * 512;
  return Status::OK();
}

Status PageFile::Reserve(uint64_t slots) {
  if (slots <= reserved_slots_ || no_fallocate_) return Status::OK();
  uint64_t have = 0;
  RF_RETURN_IF_ERROR(SlotCount(&have));
  reserved_slots_ = have;
  if (slots <= have) return Status::OK();
  const uint64_t ps = page_size_;
  const uint64_t step = std::clamp<uint64_t>(have * ps / 4, 1ull << 20, 256ull << 20) / ps;
  const uint64_t target = std::max(slots, have + std::max<uint64_t>(step, 1));
  auto alloc = [&](uint64_t to) {
    if (const int e = RF_FAULT(kFallocate, path_)) return e;
    if (::fallocate(fd_, 0, static_cast<off_t>(have * ps), static_cast<off_t>((to - have) * ps)) != 0) return errno;
    return 0;
  };
  uint64_t to = target;
  int err = alloc(to);
  // Allocating ahead is only an optimisation: on a nearly full disk take just what is needed.
  if (err == ENOSPC && target > slots) err = alloc(to = slots);
  if (err != 0) {
    if (err == EOPNOTSUPP) {  // e.g. tmpfs without it: plain extending writes still work
      no_fallocate_ = true;
      return Status::OK();
    }
    return Status::FromErrno("fallocate", path_, err);
  }
  reserved_slots_ = to;
  RF_KILL_POINT("pages.reserve.after_fallocate");
  return Status::OK();
}

Status PageFile::Truncate(uint64_t slots) {
  uint64_t have = 0;
  RF_RETURN_IF_ERROR(SlotCount(&have));
  if (have <= slots) return Status::OK();
  const uint64_t want = slots * page_size_;
  if (const int e = RF_FAULT(kFallocate, path_)) return Status::FromErrno("ftruncate", path_, e);
  if (::ftruncate(fd_, static_cast<off_t>(want)) != 0) return Status::FromErrno("ftruncate", path_, errno);
  reserved_slots_ = slots;
  return Status::OK();
}

Status PageFile::Punch(uint32_t first, uint32_t count) {
  RF_KILL_POINT("punch.before");
  if (const int e = RF_FAULT(kPunchHole, path_)) return Status::FromErrno("fallocate(PUNCH_HOLE)", path_, e);
  if (::fallocate(fd_, FALLOC_FL_PUNCH_HOLE | FALLOC_FL_KEEP_SIZE, static_cast<off_t>(first) * page_size_,
                  static_cast<off_t>(count) * page_size_) != 0) {
    // Filesystems without hole punching just keep the bytes; the slot is still reused.
    if (errno == EOPNOTSUPP) return Status::OK();
    return Status::FromErrno("fallocate(PUNCH_HOLE)", path_, errno);
  }
  RF_KILL_POINT("punch.after");
  return Status::OK();
}

Status PageFile::Sync() {
  RF_KILL_POINT("pages.write.before_sync");
  if (const int e = RF_FAULT(kPageSync, path_)) return Status::FromErrno("fdatasync", path_, e);
  if (::fdatasync(fd_) != 0) return Status::FromErrno("fdatasync", path_, errno);
  fault::FileSynced(path_);
  RF_KILL_POINT("pages.sync.after");
  return Status::OK();
}

}  // namespace recflash
