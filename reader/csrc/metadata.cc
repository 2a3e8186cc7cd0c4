#include "reader/csrc/metadata.h"

#include <rocksdb/db.h>
#include <rocksdb/env.h>
#include <rocksdb/file_system.h>
#include <rocksdb/options.h>
#include <rocksdb/table.h>
#include <rocksdb/write_batch.h>
#include <sys/statvfs.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <filesystem>

#include "reader/csrc/fault_injection.h"

namespace recflash {

namespace {

void PutU32BE(std::string* s, uint32_t v) {
  for (int i = 3; i >= 0; i--) s->push_back(static_cast<char>((v >> (8 * i)) & 0xff));
}
uint32_t GetU32BE(const char* p) {
  uint32_t v = 0;
  for (int i = 0; i < 4; i++) v = (v << 8) | static_cast<uint8_t>(p[i]);
  return v;
}
template <typename T>
void PutRaw(std::string* s, T v) {
  s->append(reinterpret_cast<const char*>(&v), sizeof v);
}
template <typename T>
bool GetRaw(const std::string& s, size_t* pos, T* v) {
  if (*pos + sizeof(T) > s.size()) return false;
  std::memcpy(v, s.data() + *pos, sizeof(T));
  *pos += sizeof(T);
  return true;
}
std::string Key(char tag, uint32_t id) {
  std::string k(1, tag);
  PutU32BE(&k, id);
  return k;
}

}  // namespace

void LogicalPageTable::MarkLive(uint32_t pid, uint64_t seq, std::vector<SegMeta> segs) {
  EnsureSlots(pid + 1);
  PageMeta& p = pages_[pid];
  if (!p.live) live_++;
  p.live = true;
  p.seq = seq;
  p.segs = std::move(segs);
  free_.erase(pid);
  kept_.erase(pid);
}

void LogicalPageTable::MarkDead(uint32_t pid) {
  PageMeta& p = pages_[pid];
  if (p.live) live_--;
  p.live = false;
  p.segs.clear();
  p.segs.shrink_to_fit();
}

std::vector<uint32_t> LogicalPageTable::Allocate(uint32_t n) {
  std::vector<uint32_t> out;
  if (n == 0) return out;
  auto take = [&](uint32_t pid) {
    out.push_back(pid);
    free_.erase(pid);
    kept_.erase(pid);
  };
  // First contiguous run long enough, of kept slots, else of any free slots. Kept first: a
  // punched slot written again costs the filesystem a fresh allocation, and on thinly
  // provisioned or discarding devices its first read (a virtualised disk measured here read
  // 16 KiB holes punched and rewritten at 0.4 x the speed of slots overwritten in place).
  auto first_run = [n](const std::set<uint32_t>& slots, uint32_t* start) {
    uint32_t run_start = 0, run_len = 0;
    for (uint32_t pid : slots) {
      if (run_len && pid == run_start + run_len) {
        run_len++;
      } else {
        run_start = pid;
        run_len = 1;
      }
      if (run_len == n) break;
    }
    *start = run_start;
    return run_len == n;
  };
  uint32_t start;
  if (first_run(kept_, &start) || first_run(free_, &start)) {
    for (uint32_t i = 0; i < n; i++) take(start + i);
  } else if (n <= 2 && !free_.empty()) {
    // Small writes fill holes.
    while (out.size() < n && !kept_.empty()) take(*kept_.begin());
    while (out.size() < n && !free_.empty()) take(*free_.begin());
  }
  // Otherwise append at the end of the file, contiguously.
  uint32_t next = static_cast<uint32_t>(pages_.size());
  while (out.size() < n) out.push_back(next++);
  EnsureSlots(next);
  return out;
}

uint32_t LogicalPageTable::TrimFreeTail() {
  // pop_back never reallocates: references to the slots that stay remain valid.
  while (!pages_.empty() && !pages_.back().live && free_.erase(static_cast<uint32_t>(pages_.size() - 1))) {
    kept_.erase(static_cast<uint32_t>(pages_.size() - 1));
    pages_.pop_back();
  }
  return slots();
}

std::vector<uint32_t> LogicalPageTable::ReturnKeptBeyond(size_t max_kept) {
  std::vector<uint32_t> out;
  while (kept_.size() > max_kept) {
    auto last = std::prev(kept_.end());
    out.push_back(*last);
    kept_.erase(last);
  }
  std::reverse(out.begin(), out.end());
  return out;
}

size_t LogicalPageTable::MemoryBytes() const {
  size_t b = pages_.capacity() * sizeof(PageMeta) + (free_.size() + kept_.size()) * 40;
  for (const auto& p : pages_) b += p.segs.capacity() * sizeof(SegMeta);
  return b;
}

void FeatureState::RemovePages(const std::set<uint32_t>& gone) {
  pages.erase(std::remove_if(pages.begin(), pages.end(), [&](uint32_t p) { return gone.count(p) > 0; }),
              pages.end());
}

FeatureState* FeatureTable::Add(const FeatureDef& def) {
  if (features_.size() <= def.id) features_.resize(def.id + 1);
  features_[def.id] = std::make_unique<FeatureState>();
  features_[def.id]->def = def;
  by_name_[def.name] = def.id;
  return features_[def.id].get();
}

std::vector<FeatureState*> FeatureTable::All() {
  std::vector<FeatureState*> v;
  for (auto& f : features_)
    if (f) v.push_back(f.get());
  return v;
}

size_t FeatureTable::MemoryBytes() const {
  size_t b = features_.capacity() * sizeof(void*);
  for (const auto& f : features_)
    if (f)
      b += sizeof(FeatureState) + f->def.name.size() + f->index.MemoryBytes() + f->index_blob.capacity() +
           f->index_ranges.capacity() * sizeof(FeatureState::SegmentRange) +
           f->pages.capacity() * 4;
  return b;
}

MetaStore::MetaStore() = default;

void MetaStore::Close() { db_.reset(); }

Status MetaStore::FlushLog() {
  // Only a log worth replaying, and only with ample room: a table file written into a nearly
  // full disk fails, and RocksDB (built with assertions, as Debian ships it) aborts the
  // process when the DB is then closed. Skipping costs only the replay at the next open.
  constexpr uint64_t kMinLogBytes = 128u << 10;
  constexpr uint64_t kMinFreeBytes = 64u << 20;
  uint64_t log_bytes = 0;
  std::error_code ec;
  for (const auto& e : std::filesystem::directory_iterator(dir_, ec))
    if (e.path().extension() == ".log") {
      const auto n = std::filesystem::file_size(e.path(), ec);
      if (!ec) log_bytes += n;
    }
  if (ec || log_bytes < kMinLogBytes) return Status::OK();
  struct statvfs fs;
  if (::statvfs(dir_.c_str(), &fs) != 0) return Status::OK();
  const uint64_t free_bytes = static_cast<uint64_t>(fs.f_bavail) * fs.f_frsize;
  if (free_bytes < kMinFreeBytes + 4 * log_bytes) return Status::OK();
  rocksdb::FlushOptions fo;
  fo.wait = true;
  rocksdb::Status s = db_->Flush(fo);
  if (!s.ok()) return Status::IOError("metadata flush failed in '" + dir_ + "': " + s.ToString());
  return Status::OK();
}

namespace {
// A RocksDB error of a read as the store's status: damage it detects (a block checksum, a bad
// table) is a Corruption like the engine's own, not an I/O error to retry.
Status FromRocks(const rocksdb::Status& s, const std::string& what, const std::string& dir) {
  if (s.IsCorruption()) return Status::Corruption(what + " in '" + dir + "': the metadata database is damaged: " + s.ToString());
  return Status::IOError(what + " in '" + dir + "': " + s.ToString());
}
}  // namespace

namespace {

// The file system a read-only open reads the metadata through: the default one, with a pause
// point where RocksDB lists the directory's logs to replay, once it has read the MANIFEST (the
// first listing after this thread opened a MANIFEST; an earlier one cleans up obsolete files).
// A test holds the open there while a writer retires a log: the race store_open.cc's log check
// catches, made to happen on demand.
thread_local bool t_manifest_opened = false;

class ReadOnlyMetaFileSystem : public rocksdb::FileSystemWrapper {
 public:
  ReadOnlyMetaFileSystem() : rocksdb::FileSystemWrapper(rocksdb::FileSystem::Default()) {}
  const char* Name() const override { return "RecflashReadOnlyMeta"; }
  rocksdb::IOStatus NewSequentialFile(const std::string& f, const rocksdb::FileOptions& options,
                                      std::unique_ptr<rocksdb::FSSequentialFile>* r,
                                      rocksdb::IODebugContext* dbg) override {
    if (f.find("/MANIFEST-") != std::string::npos) t_manifest_opened = true;
    return target()->NewSequentialFile(f, options, r, dbg);
  }
  rocksdb::IOStatus GetChildren(const std::string& dir, const rocksdb::IOOptions& options,
                                std::vector<std::string>* result, rocksdb::IODebugContext* dbg) override {
    if (t_manifest_opened) RF_PAUSE_POINT("meta.read_only.before_log_listing");
    return target()->GetChildren(dir, options, result, dbg);
  }
};

rocksdb::Env* ReadOnlyMetaEnv() {
  static const std::unique_ptr<rocksdb::Env> env = rocksdb::NewCompositeEnv(std::make_shared<ReadOnlyMetaFileSystem>());
  return env.get();
}

}  // namespace

MetaStore::~MetaStore() { db_.reset(); }

Status MetaStore::Open(const std::string& dir, bool create, bool read_only) {
  dir_ = dir;
  rocksdb::Options o;
  o.create_if_missing = create;
  o.error_if_exists = false;
  o.max_open_files = 64;
  o.keep_log_file_num = 2;
  o.write_buffer_size = 8 << 20;
  o.max_background_jobs = 1;
  o.info_log_level = rocksdb::InfoLogLevel::WARN_LEVEL;
  // Every commit is a synced write: only the last record of RocksDB's log can be torn by a
  // crash. Damage anywhere else must fail the open (Corruption) instead of silently dropping
  // committed metadata from there on, as the default point-in-time recovery would.
  o.wal_recovery_mode = rocksdb::WALRecoveryMode::kTolerateCorruptedTailRecords;
  o.paranoid_checks = true;
  rocksdb::BlockBasedTableOptions t;
  t.block_size = 16 << 10;
  o.table_factory.reset(rocksdb::NewBlockBasedTableFactory(t));
  if (read_only) {
    o.env = ReadOnlyMetaEnv();
    t_manifest_opened = false;
  }
  rocksdb::DB* db = nullptr;
  rocksdb::Status s = read_only ? rocksdb::DB::OpenForReadOnly(o, dir, &db, /*error_if_wal_file_exists=*/false)
                                : rocksdb::DB::Open(o, dir, &db);
  // RocksDB reports a file it cannot open as an IOError or (reading a MANIFEST) a Corruption
  // wrapping one; ENOENT shows only in the message.
  open_missed_file_ = !s.ok() && (s.IsPathNotFound() || s.ToString().find("No such file or directory") != std::string::npos);
  if (!s.ok()) {
    if (s.IsIOError() && s.ToString().find("lock") != std::string::npos)
      return Status::Locked("metadata database '" + dir + "' is locked by another process: " + s.ToString());
    if (s.IsCorruption())
      return Status::Corruption("metadata database '" + dir + "' is damaged: " + s.ToString());
    if (s.IsNoSpace()) return Status::FromErrno("open of metadata database (RocksDB: " + s.ToString() + ")", dir, ENOSPC);
    return Status::IOError("cannot open metadata database '" + dir + "': " + s.ToString());
  }
  db_.reset(db);
  return Status::OK();
}

Status MetaStore::ReadCurrentState(const std::string& dir, PersistentState* st) {
  MetaStore m;
  RF_RETURN_IF_ERROR(m.Open(dir, false, true));
  bool found = false;
  return m.LoadState(st, &found);
}

Status MetaStore::ReadFormat(std::string* value, bool* found) {
  rocksdb::Status s = db_->Get(rocksdb::ReadOptions(), "format", value);
  *found = s.ok();
  if (s.ok() || s.IsNotFound()) return Status::OK();
  return FromRocks(s, "metadata read failed", dir_);
}

Status MetaStore::WriteFormat(const std::string& value) {
  rocksdb::WriteBatch b;
  b.Put("format", value);
  return Commit(&b);
}

void MetaStore::PutFeature(rocksdb::WriteBatch* b, const FeatureDef& f) {
  std::string v;
  PutRaw<uint8_t>(&v, static_cast<uint8_t>(f.type));
  PutRaw<uint32_t>(&v, f.dim);
  v += f.name;
  b->Put(Key('F', f.id), v);
}

void MetaStore::PutPage(rocksdb::WriteBatch* b, uint32_t pid, const PageMeta& p) {
  std::string v;
  PutRaw<uint64_t>(&v, p.seq);
  PutRaw<uint16_t>(&v, static_cast<uint16_t>(p.segs.size()));
  for (const auto& s : p.segs) {
    PutRaw<uint32_t>(&v, s.fid);
    PutRaw<uint32_t>(&v, s.count);
    PutRaw<uint32_t>(&v, s.tombs);
    PutRaw<uint64_t>(&v, s.min_key);
    PutRaw<uint64_t>(&v, s.max_key);
    PutRaw<uint32_t>(&v, s.length);
    PutRaw<uint8_t>(&v, s.retired ? 1 : 0);
  }
  b->Put(Key('P', pid), v);
}

void MetaStore::DeletePage(rocksdb::WriteBatch* b, uint32_t pid) { b->Delete(Key('P', pid)); }

void MetaStore::PutState(rocksdb::WriteBatch* b, const PersistentState& st) {
  std::string v;
  PutRaw<uint64_t>(&v, st.next_seq);
  PutRaw<uint64_t>(&v, st.wal_start);
  PutRaw<uint32_t>(&v, st.next_fid);
  PutRaw<uint64_t>(&v, st.user_bytes_written);
  PutRaw<uint64_t>(&v, st.pages_written);
  PutRaw<uint8_t>(&v, st.wal_start_kept ? 1 : 0);
  PutRaw<uint8_t>(&v, st.wal_files_consecutive ? 1 : 0);
  PutRaw<uint64_t>(&v, st.wal_last);
  b->Put("S", v);
}

Status MetaStore::Commit(rocksdb::WriteBatch* b) {
  rocksdb::WriteOptions wo;
  wo.sync = true;
  RF_KILL_POINT("meta.commit.before");
  if (const int e = RF_FAULT(kMetaCommit, dir_)) return Status::FromErrno("metadata commit (RocksDB write)", dir_, e);
  bytes_committed_ += b->GetDataSize();
  rocksdb::Status s = db_->Write(wo, b);
  // A full disk keeps its errno, so it surfaces as DiskFullError like the engine's own writes.
  if (s.IsNoSpace()) return Status::FromErrno("metadata commit (RocksDB: " + s.ToString() + ")", dir_, ENOSPC);
  if (!s.ok()) return Status::IOError("metadata commit failed in '" + dir_ + "': " + s.ToString());
  RF_KILL_POINT("meta.commit.after");
  return Status::OK();
}

namespace {
// Strict UTF-8 as Python decodes it (no overlong forms, surrogates or code points > U+10FFFF).
bool ValidUtf8(const std::string& s) {
  const size_t n = s.size();
  size_t i = 0;
  while (i < n) {
    const auto c = static_cast<uint8_t>(s[i]);
    const size_t len = c < 0x80 ? 1 : (c >= 0xC2 && c <= 0xDF) ? 2 : (c >> 4) == 0xE ? 3 : (c >= 0xF0 && c <= 0xF4) ? 4 : 0;
    if (len == 0 || i + len > n) return false;
    for (size_t k = 1; k < len; k++)
      if ((static_cast<uint8_t>(s[i + k]) >> 6) != 2) return false;
    const auto c1 = len > 1 ? static_cast<uint8_t>(s[i + 1]) : 0;
    if ((c == 0xE0 && c1 < 0xA0) || (c == 0xED && c1 >= 0xA0) || (c == 0xF0 && c1 < 0x90) || (c == 0xF4 && c1 >= 0x90))
      return false;
    i += len;
  }
  return true;
}
}  // namespace

Status MetaStore::LoadFeatures(std::vector<FeatureDef>* out) {
  std::unique_ptr<rocksdb::Iterator> it(db_->NewIterator(rocksdb::ReadOptions()));
  for (it->Seek("F"); it->Valid() && it->key().starts_with("F"); it->Next()) {
    if (it->key().size() != 5) continue;
    const std::string v = it->value().ToString();
    FeatureDef f;
    f.id = GetU32BE(it->key().data() + 1);
    size_t pos = 0;
    uint8_t t;
    if (!GetRaw(v, &pos, &t) || !GetRaw(v, &pos, &f.dim))
      return Status::Corruption("feature record " + std::to_string(f.id) + " in '" + dir_ + "' is truncated");
    f.type = static_cast<ValueType>(t);
    f.name = v.substr(pos);
    // Names came from Python strings and types from ParseValueType: anything else is damage,
    // and must not reach a reader (an undecodable name cannot even be put into an error).
    const bool fsl = f.type == ValueType::kFixedFloat32;
    if (t < static_cast<uint8_t>(ValueType::kFloat32) || t > static_cast<uint8_t>(ValueType::kBinary) ||
        (fsl && (f.dim == 0 || f.dim > (1u << 20))) || f.name.empty() || f.name.size() > 255 || !ValidUtf8(f.name))
      return Status::Corruption("feature record " + std::to_string(f.id) + " in '" + dir_ +
                                "' is damaged (type, dimension or name out of range)");
    out->push_back(f);
  }
  if (!it->status().ok()) return FromRocks(it->status(), "metadata scan failed", dir_);
  return Status::OK();
}

Status MetaStore::LoadPages(std::vector<std::pair<uint32_t, PageMeta>>* out) {
  std::unique_ptr<rocksdb::Iterator> it(db_->NewIterator(rocksdb::ReadOptions()));
  for (it->Seek("P"); it->Valid() && it->key().starts_with("P"); it->Next()) {
    if (it->key().size() != 5) continue;
    const uint32_t pid = GetU32BE(it->key().data() + 1);
    const std::string v = it->value().ToString();
    PageMeta p;
    p.live = true;
    size_t pos = 0;
    uint16_t n = 0;
    bool ok = GetRaw(v, &pos, &p.seq) && GetRaw(v, &pos, &n);
    for (uint16_t i = 0; ok && i < n; i++) {
      SegMeta s;
      uint8_t retired = 0;
      ok = GetRaw(v, &pos, &s.fid) && GetRaw(v, &pos, &s.count) && GetRaw(v, &pos, &s.tombs) &&
           GetRaw(v, &pos, &s.min_key) && GetRaw(v, &pos, &s.max_key) && GetRaw(v, &pos, &s.length) &&
           GetRaw(v, &pos, &retired);
      s.retired = retired != 0;
      p.segs.push_back(s);
    }
    if (!ok) return Status::Corruption("page record " + std::to_string(pid) + " in '" + dir_ + "' is truncated");
    out->emplace_back(pid, std::move(p));
  }
  if (!it->status().ok()) return FromRocks(it->status(), "metadata scan failed", dir_);
  return Status::OK();
}

Status MetaStore::LoadState(PersistentState* st, bool* found) {
  std::string v;
  rocksdb::Status s = db_->Get(rocksdb::ReadOptions(), "S", &v);
  *found = s.ok();
  if (s.IsNotFound()) return Status::OK();
  if (!s.ok()) return FromRocks(s, "metadata read failed", dir_);
  size_t pos = 0;
  if (!GetRaw(v, &pos, &st->next_seq) || !GetRaw(v, &pos, &st->wal_start) || !GetRaw(v, &pos, &st->next_fid))
    return Status::Corruption("state record in '" + dir_ + "' is truncated");
  // Counters were added later; a record without them starts them at zero.
  if (pos < v.size() && (!GetRaw(v, &pos, &st->user_bytes_written) || !GetRaw(v, &pos, &st->pages_written)))
    return Status::Corruption("state record in '" + dir_ + "' is truncated");
  uint8_t kept = 0;
  if (pos < v.size() && !GetRaw(v, &pos, &kept)) return Status::Corruption("state record in '" + dir_ + "' is truncated");
  st->wal_start_kept = kept != 0;
  // Added after wal_start_kept: a record without it (an older version's commit) may have gaps.
  uint8_t consecutive = 0;
  if (pos < v.size() && !GetRaw(v, &pos, &consecutive))
    return Status::Corruption("state record in '" + dir_ + "' is truncated");
  st->wal_files_consecutive = consecutive != 0;
  // Added after wal_files_consecutive: a record without it names no newest file (0).
  if (pos < v.size() && !GetRaw(v, &pos, &st->wal_last))
    return Status::Corruption("state record in '" + dir_ + "' is truncated");
  return Status::OK();
}

}  // namespace recflash
