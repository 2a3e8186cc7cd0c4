#include "reader/csrc/filename.h"

#include <cstdio>
#include <cstdlib>

namespace recflash {

namespace {

struct Entry {
  FileKind kind;
  const char* role;
  const char* name;
};
constexpr Entry kEntries[] = {
    {FileKind::kMarker, "marker", "RECFLASH"},
    {FileKind::kMarkerTemp, "marker_temp", "RECFLASH.tmp"},
    {FileKind::kLock, "lock", "LOCK"},
    {FileKind::kPages, "pages", "pages.dat"},
    {FileKind::kMetaDir, "meta", "meta"},
    {FileKind::kWalDir, "wal", "wal"},
    {FileKind::kCheckpoint, "checkpoint", "CHECKPOINT"},
    {FileKind::kCheckpointTemp, "checkpoint_temp", "CHECKPOINT.tmp"},
    {FileKind::kBlockSums, "block_sums", "BLOCKSUMS"},
};
constexpr const char* kWalSuffix = ".log";

}  // namespace

const char* FileBaseName(FileKind kind) {
  for (const Entry& e : kEntries)
    if (e.kind == kind) return e.name;
  return "";  // unreachable: every kind has an entry
}

std::string StoreFileName(const std::string& dir, FileKind kind) { return dir + "/" + FileBaseName(kind); }

std::vector<std::pair<std::string, std::string>> StoreFileNames() {
  std::vector<std::pair<std::string, std::string>> v;
  for (const Entry& e : kEntries) v.emplace_back(e.role, e.name);
  return v;
}

std::string WalFileName(const std::string& wal_dir, uint64_t number) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%06llu%s", static_cast<unsigned long long>(number), kWalSuffix);
  return wal_dir + "/" + buf;
}

bool ParseWalFileName(const std::string& name, uint64_t* number) {
  const std::string suffix = kWalSuffix;
  if (name.size() <= suffix.size() || name.compare(name.size() - suffix.size(), suffix.size(), suffix) != 0)
    return false;
  char* end = nullptr;
  const unsigned long long n = std::strtoull(name.c_str(), &end, 10);
  if (end != name.c_str() + (name.size() - suffix.size())) return false;
  *number = n;
  return true;
}

}  // namespace recflash
