#include "reader/csrc/wal.h"

#include <dirent.h>
#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>

#include "reader/csrc/crc32c.h"

namespace recflash {

WalWriter::~WalWriter() { Close(); }

Status WalWriter::Open(const std::string& path) {
  Close();
  path_ = path;
  fd_ = ::open(path.c_str(), O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0644);
  if (fd_ < 0) return Status::FromErrno("open", path, errno);
  return Status::OK();
}

void WalWriter::Close() {
  if (fd_ >= 0) ::close(fd_);
  fd_ = -1;
}

Status WalWriter::Append(uint8_t type, const std::string& payload) {
  std::string rec(9, '\0');
  const uint32_t len = static_cast<uint32_t>(payload.size());
  rec[8] = static_cast<char>(type);
  uint32_t crc = crc32c::Extend(crc32c::Value(&rec[8], 1), payload.data(), payload.size());
  std::memcpy(&rec[0], &crc, 4);
  std::memcpy(&rec[4], &len, 4);
  rec += payload;
  const char* p = rec.data();
  size_t n = rec.size();
  while (n > 0) {
    ssize_t w = ::write(fd_, p, n);
    if (w < 0) {
      if (errno == EINTR) continue;
      return Status::FromErrno("write", path_, errno);
    }
    p += w;
    n -= static_cast<size_t>(w);
  }
  bytes_written_ += rec.size();
  unsynced_ += rec.size();
  return Status::OK();
}

Status WalWriter::Sync() {
  if (unsynced_ == 0) return Status::OK();
  if (::fdatasync(fd_) != 0) return Status::FromErrno("fdatasync", path_, errno);
  unsynced_ = 0;
  return Status::OK();
}

Status ReadWalFile(const std::string& path, const std::function<Status(uint8_t, const std::string&)>& fn,
                   bool* torn_tail) {
  *torn_tail = false;
  FILE* f = std::fopen(path.c_str(), "rb");
  if (!f) return Status::FromErrno("open", path, errno);
  Status s;
  std::string payload;
  for (;;) {
    uint8_t hdr[9];
    size_t got = std::fread(hdr, 1, 9, f);
    if (got == 0) break;
    if (got < 9) {
      *torn_tail = true;
      break;
    }
    uint32_t crc, len;
    std::memcpy(&crc, hdr, 4);
    std::memcpy(&len, hdr + 4, 4);
    payload.resize(len);
    if (std::fread(payload.data(), 1, len, f) != len) {
      *torn_tail = true;
      break;
    }
    if (crc32c::Extend(crc32c::Value(hdr + 8, 1), payload.data(), len) != crc) {
      *torn_tail = true;
      break;
    }
    s = fn(hdr[8], payload);
    if (!s.ok()) break;
  }
  std::fclose(f);
  return s;
}

std::string WalFileName(const std::string& dir, uint64_t number) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%06llu.log", static_cast<unsigned long long>(number));
  return dir + "/" + buf;
}

Status ListWalFiles(const std::string& dir, std::vector<uint64_t>* numbers) {
  numbers->clear();
  DIR* d = ::opendir(dir.c_str());
  if (!d) return Status::FromErrno("opendir", dir, errno);
  while (dirent* e = ::readdir(d)) {
    const std::string name = e->d_name;
    if (name.size() > 4 && name.compare(name.size() - 4, 4, ".log") == 0) {
      char* end = nullptr;
      unsigned long long n = std::strtoull(name.c_str(), &end, 10);
      if (end && std::string(end) == ".log") numbers->push_back(n);
    }
  }
  ::closedir(d);
  std::sort(numbers->begin(), numbers->end());
  return Status::OK();
}

}  // namespace recflash
