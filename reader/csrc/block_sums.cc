#include "reader/csrc/block_sums.h"

#include <fcntl.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <mutex>

#include "reader/csrc/crc32c.h"
#include "reader/csrc/fault_injection.h"
#include "reader/csrc/file_util.h"

namespace recflash {

namespace {
constexpr char kMagic[8] = {'R', 'F', 'B', 'S', 'U', 'M', '0', '1'};
}  // namespace

uint32_t BlockSums::Sum(const uint8_t* block, uint32_t block_size) { return crc32c::Value(block, block_size); }

void BlockSums::Record(uint32_t page, uint64_t seq, const uint8_t* data) {
  auto sums = std::make_unique<uint32_t[]>(blocks_per_page_);
  for (uint32_t b = 0; b < blocks_per_page_; b++) sums[b] = Sum(data + static_cast<size_t>(b) * block_size_, block_size_);
  WriterLock l(&mu_);
  Entry& e = pages_[page];
  e.seq = seq;
  e.sums = std::move(sums);
  dirty_ = true;
}

bool BlockSums::Has(uint32_t page, uint64_t seq) const {
  ReaderLock l(&mu_);
  auto it = pages_.find(page);
  return it != pages_.end() && it->second.seq == seq;
}

bool BlockSums::Lookup(uint32_t page, uint64_t seq, uint32_t first, uint32_t count, uint32_t* out) const {
  if (first + count > blocks_per_page_) return false;
  ReaderLock l(&mu_);
  auto it = pages_.find(page);
  if (it == pages_.end() || it->second.seq != seq) return false;
  std::memcpy(out, it->second.sums.get() + first, sizeof(uint32_t) * count);
  return true;
}

size_t BlockSums::pages() const {
  ReaderLock l(&mu_);
  return pages_.size();
}

size_t BlockSums::MemoryBytes() const {
  ReaderLock l(&mu_);
  return pages_.size() * (sizeof(Entry) + sizeof(uint32_t) * blocks_per_page_ + 32);
}

Status BlockSums::Save(const std::string& path) {
  ReaderLock l(&mu_);
  std::vector<uint8_t> buf;
  auto put = [&](const void* p, size_t n) {
    const uint8_t* b = static_cast<const uint8_t*>(p);
    buf.insert(buf.end(), b, b + n);
  };
  const uint64_t count = pages_.size();
  put(kMagic, 8);
  put(&page_size_, 4);
  put(&block_size_, 4);
  put(&count, 8);
  buf.reserve(buf.size() + count * (12 + 4ull * blocks_per_page_) + 4);
  for (const auto& [page, e] : pages_) {
    put(&page, 4);
    put(&e.seq, 8);
    put(e.sums.get(), 4ull * blocks_per_page_);
  }
  const uint32_t crc = crc32c::Value(buf.data(), buf.size());
  put(&crc, 4);
  const std::string tmp = path + ".tmp";
  if (const int e = RF_FAULT(kCheckpointWrite, tmp)) return Status::FromErrno("write", tmp, e);
  const int fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd < 0) return Status::FromErrno("open", tmp, errno);
  size_t done = 0;
  while (done < buf.size()) {
    const ssize_t w = ::write(fd, buf.data() + done, buf.size() - done);
    if (w < 0 && errno == EINTR) continue;
    if (w < 0) {
      const int e = errno;
      ::close(fd);
      return Status::FromErrno("write", tmp, e);
    }
    done += static_cast<size_t>(w);
  }
  if (::fsync(fd) != 0) {
    const int e = errno;
    ::close(fd);
    return Status::FromErrno("fsync", tmp, e);
  }
  ::close(fd);
  if (std::rename(tmp.c_str(), path.c_str()) != 0) return Status::FromErrno("rename", tmp, errno);
  dirty_ = false;
  return Status::OK();
}

void BlockSums::Load(const std::string& path) {
  std::string buf;
  if (!ReadWholeFile(path, &buf)) return;
  const size_t head = 8 + 4 + 4 + 8;
  if (buf.size() < head + 4 || std::memcmp(buf.data(), kMagic, 8) != 0) return;
  uint32_t ps, bs, crc;
  uint64_t count;
  std::memcpy(&ps, buf.data() + 8, 4);
  std::memcpy(&bs, buf.data() + 12, 4);
  std::memcpy(&count, buf.data() + 16, 8);
  const size_t entry = 12 + 4ull * blocks_per_page_;
  if (ps != page_size_ || bs != block_size_ || count > (buf.size() - head - 4) / entry ||
      buf.size() != head + count * entry + 4)
    return;  // (the count bound first: a damaged count must not overflow the size check)
  std::memcpy(&crc, buf.data() + buf.size() - 4, 4);
  if (crc32c::Value(buf.data(), buf.size() - 4) != crc) return;
  WriterLock l(&mu_);
  pages_.reserve(count);
  const uint8_t* p = reinterpret_cast<const uint8_t*>(buf.data()) + head;
  for (uint64_t i = 0; i < count; i++, p += entry) {
    uint32_t page;
    Entry e;
    std::memcpy(&page, p, 4);
    std::memcpy(&e.seq, p + 4, 8);
    e.sums = std::make_unique<uint32_t[]>(blocks_per_page_);
    std::memcpy(e.sums.get(), p + 12, 4ull * blocks_per_page_);
    pages_[page] = std::move(e);
  }
  dirty_ = false;
}

}  // namespace recflash
