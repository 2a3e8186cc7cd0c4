#include "reader/csrc/wal.h"

#include <dirent.h>
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <climits>
#include <cstring>

#include "reader/csrc/crc32c.h"
#include "reader/csrc/fault_injection.h"

namespace recflash {

WalWriter::~WalWriter() { Close(); }

Status WalWriter::Open(const std::string& path) {
  Close();
  path_ = path;
  file_bytes_ = 0;
  const bool existed = ::access(path.c_str(), F_OK) == 0;
  fd_ = ::open(path.c_str(), O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0644);
  if (fd_ < 0) return Status::FromErrno("open", path, errno);
  if (!existed) fault::FileCreated(path);
  RF_KILL_POINT("wal.rotate.after_open");
  return Status::OK();
}

void WalWriter::Close() {
  if (fd_ >= 0) ::close(fd_);
  fd_ = -1;
}

Status WalWriter::Append(uint8_t type, const std::string& payload) {
  iovec part{const_cast<char*>(payload.data()), payload.size()};
  return AppendParts(type, &part, 1);
}

Status WalWriter::AppendParts(uint8_t type, const iovec* parts, size_t nparts) {
  uint8_t hdr[9];
  uint64_t len = 0;
  uint32_t crc = crc32c::Value(&type, 1);
  for (size_t i = 0; i < nparts; i++) {
    len += parts[i].iov_len;
    crc = crc32c::Extend(crc, static_cast<const char*>(parts[i].iov_base), parts[i].iov_len);
  }
  if (len > UINT32_MAX) return Status::InvalidArgument("WAL record of " + std::to_string(len) + " bytes for '" + path_ + "' exceeds 4 GiB");
  const uint32_t len32 = static_cast<uint32_t>(len);
  std::memcpy(hdr, &crc, 4);
  std::memcpy(hdr + 4, &len32, 4);
  hdr[8] = type;
  std::vector<iovec> iov;
  iov.reserve(nparts + 1);
  iov.push_back({hdr, sizeof hdr});
  for (size_t i = 0; i < nparts; i++)
    if (parts[i].iov_len) iov.push_back(parts[i]);
  if (const int e = RF_FAULT(kWalAppend, path_)) return Status::FromErrno("write", path_, e);
  if (fault::KillPointDue("wal.append.mid_record")) {
    // Half the record reaches the file, then the process dies: replay must stop there.
    std::string rec;
    for (const iovec& v : iov) rec.append(static_cast<const char*>(v.iov_base), v.iov_len);
    (void)!::write(fd_, rec.data(), rec.size() / 2);
    fault::Die("wal.append.mid_record");
  }
  // writev may stop early (signals, huge records): advance through the vector and retry.
  size_t first = 0;
  while (first < iov.size()) {
    const int cnt = static_cast<int>(std::min<size_t>(iov.size() - first, IOV_MAX));
    ssize_t w = ::writev(fd_, iov.data() + first, cnt);
    if (w < 0) {
      if (errno == EINTR) continue;
      return Status::FromErrno("write", path_, errno);
    }
    size_t left = static_cast<size_t>(w);
    while (first < iov.size() && left >= iov[first].iov_len) left -= iov[first++].iov_len;
    if (left) {
      iov[first].iov_base = static_cast<char*>(iov[first].iov_base) + left;
      iov[first].iov_len -= left;
    }
  }
  const uint64_t total = sizeof hdr + len;
  bytes_written_ += total;
  file_bytes_ += total;
  unsynced_ += total;
  RF_KILL_POINT("wal.append.before_sync");
  return Status::OK();
}

Status WalWriter::Sync() {
  if (unsynced_ == 0) return Status::OK();
  if (const int e = RF_FAULT(kWalSync, path_)) return Status::FromErrno("fdatasync", path_, e);
  if (::fdatasync(fd_) != 0) return Status::FromErrno("fdatasync", path_, errno);
  fault::FileSynced(path_);
  RF_KILL_POINT("wal.sync.after");
  unsynced_ = 0;
  return Status::OK();
}

namespace {

// Whether the rest of the file from its current position holds only zero bytes.
bool RestIsZero(FILE* f) {
  char buf[1 << 16];
  for (size_t n; (n = std::fread(buf, 1, sizeof buf, f)) > 0;)
    for (size_t i = 0; i < n; i++)
      if (buf[i] != 0) return false;
  return true;
}

}  // namespace

Status ReadWalFile(const std::string& path, const std::function<Status(uint8_t, const std::string&)>& fn,
                   WalReadEnd* end, bool point_in_time) {
  *end = WalReadEnd();
  bool* torn_tail = &end->torn_tail;
  // One open, then fstat of that descriptor: no window between a check of the path and its
  // open in which a writer could retire the file. O_NONBLOCK: a FIFO in the file's place must
  // not hang the open (it is refused below as not a regular file).
  int fd = -1;
  if (const int e = RF_FAULT(kWalOpen, path))
    errno = e;
  else
    fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NONBLOCK);
  if (fd < 0) {
    const int e = errno;
    end->missing = e == ENOENT;
    return Status::FromErrno("open", path, e);
  }
  struct stat sb;
  if (::fstat(fd, &sb) != 0) {
    const int e = errno;
    ::close(fd);
    return Status::FromErrno("fstat", path, e);
  }
  if (!S_ISREG(sb.st_mode)) {
    ::close(fd);
    return Status::Corruption("WAL file '" + path + "' is not a regular file");
  }
  FILE* f = ::fdopen(fd, "rb");
  if (!f) {
    const int e = errno;
    ::close(fd);
    return Status::FromErrno("fdopen", path, e);
  }
  Status s;
  std::string payload;
  // A damaged length must not allocate beyond what the file holds (up to 4 GiB otherwise).
  // Records a live writer appends after this size are not read (a read-only open's snapshot).
  uint64_t left = sb.st_size > 0 ? static_cast<uint64_t>(sb.st_size) : 0;
  const uint64_t size = left;
  end->file_bytes = size;
  uint64_t last_at = 0;
  for (;;) {
    const uint64_t at = size - left;  // this record's offset
    last_at = at;
    uint8_t hdr[9];
    size_t got = std::fread(hdr, 1, 9, f);
    if (got == 0) break;
    if (got < 9) {
      *torn_tail = true;
      break;
    }
    left -= std::min<uint64_t>(left, 9);
    uint32_t crc, len;
    std::memcpy(&crc, hdr, 4);
    std::memcpy(&len, hdr + 4, 4);
    if (len > left) {  // the file ends inside the record (or its length is damaged: no telling)
      *torn_tail = true;
      break;
    }
    left -= len;
    payload.resize(len);
    if (std::fread(payload.data(), 1, len, f) != len) {
      *torn_tail = true;
      break;
    }
    if (crc32c::Extend(crc32c::Value(hdr + 8, 1), payload.data(), len) != crc) {
      *torn_tail = true;
      if (left == 0 || RestIsZero(f)) break;
      if (point_in_time) {
        *torn_tail = false;
        end->damaged = true;
        break;
      }
      s = Status::Corruption("WAL file '" + path + "': the record at byte " + std::to_string(at) + " of " +
                             std::to_string(size) + " fails its checksum and " + std::to_string(left) +
                             " bytes of later records follow it (damage, not a torn append); replaying up to it "
                             "would drop them. StoreOptions(wal_recovery='point_in_time') opens the store as of "
                             "the record before it");
      break;
    }
    s = fn(hdr[8], payload);
    if (!s.ok()) break;
  }
  std::fclose(f);
  if ((end->torn_tail || end->damaged) && s.ok()) end->dropped_bytes = size - last_at;
  return s;
}

Status ListWalFiles(const std::string& dir, std::vector<uint64_t>* numbers) {
  numbers->clear();
  DIR* d = ::opendir(dir.c_str());
  if (!d) return Status::FromErrno("opendir", dir, errno);
  while (dirent* e = ::readdir(d)) {
    const std::string name = e->d_name;
    uint64_t n;
    if (ParseWalFileName(name, &n)) numbers->push_back(n);
  }
  ::closedir(d);
  std::sort(numbers->begin(), numbers->end());
  return Status::OK();
}

Status ListWalFilesWithSizes(const std::string& dir, std::vector<WalFileInfo>* files, uint64_t* vanished) {
  files->clear();
  *vanished = 0;
  std::vector<uint64_t> numbers;
  RF_RETURN_IF_ERROR(ListWalFiles(dir, &numbers));
  for (uint64_t no : numbers) {
    const std::string path = WalFileName(dir, no);
    struct stat sb;
    if (::stat(path.c_str(), &sb) != 0) {
      const int e = errno;
      if (e == ENOENT) *vanished = no;
      return Status::FromErrno("stat", path, e);
    }
    files->push_back({no, sb.st_size > 0 ? static_cast<uint64_t>(sb.st_size) : 0});
  }
  return Status::OK();
}

WalSequenceBreak FindWalSequenceBreak(const std::vector<WalFileInfo>& files, uint64_t start) {
  WalSequenceBreak b;
  const WalFileInfo* prev = nullptr;
  for (const WalFileInfo& f : files) {
    if (f.number < start) continue;
    if (prev && (prev->bytes == 0 || f.number != prev->number + 1)) {
      b.found = true;
      b.last_good = prev->number;
      b.empty = prev->bytes == 0;
      b.next = f.number;
      return b;
    }
    prev = &f;
  }
  return b;
}

Status SyncWalFile(const std::string& path) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return Status::FromErrno("open", path, errno);
  Status s;
  if (::fdatasync(fd) != 0) s = Status::FromErrno("fdatasync", path, errno);
  ::close(fd);
  if (s.ok()) fault::FileSynced(path);
  return s;
}

}  // namespace recflash
