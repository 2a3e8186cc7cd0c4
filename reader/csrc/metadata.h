// The metadata manager (READER §3.2): the feature table and the logical page table, cached
// in DRAM, persisted in RocksDB.
//
// Persisted (MetaStore, RocksDB, written with sync before anything depends on it):
//   "format"       store format marker and page size
//   "F" + be32 id  feature definition
//   "P" + be32 id  logical page record: seq + per-feature segments (count, key range,
//                  on-disk length, retired flag)
//   "S"            state: next page seq, first live WAL file, next feature id, lifetime
//                  counters, and which WAL-file rules its writer kept (wal_start_kept,
//                  wal_files_consecutive)
// Valid counts are *derived*: recovery rebuilds them (and the KeyIndex) by reading the live
// pages, the highest seq winning per key. Persisting them would mean rewriting almost every
// page record on every flush under uniform updates; the "retired" flag is persisted instead
// whenever a segment loses its last valid item, so stale records never come back.
#pragma once

#include <cstdint>
#include <memory>
#include <set>
#include <string>
#include <unordered_map>
#include <vector>

#include "reader/csrc/key_index.h"
#include "reader/csrc/status.h"
#include "reader/csrc/types.h"

// RocksDB stays out of this header (every part of the Store includes it): the .cc files that
// build write batches include <rocksdb/write_batch.h> themselves.
namespace rocksdb {
class DB;
class WriteBatch;
}  // namespace rocksdb

namespace recflash {

struct SegMeta {
  uint32_t fid = 0;
  uint32_t count = 0;        // records written (tombstones included)
  uint32_t tombs = 0;        // tombstone records written
  uint64_t min_key = 0, max_key = 0;
  uint32_t length = 0;       // on-disk bytes of the segment
  bool retired = false;      // no valid record left; ignored by reads and recovery
  // Derived (DRAM only):
  uint32_t valid = 0;        // valid records (current versions and live tombstones)
  uint64_t valid_bytes = 0;  // logical bytes of valid non-tombstone records
  // Records for every key of [min_key, max_key] and no tombstone: the page table names the
  // segment's keys (no page read needed to know them).
  bool gapless() const { return tombs == 0 && count > 0 && max_key - min_key + 1 == count; }
  // On-disk bytes still holding valid records (estimate: length scaled by validity).
  double live_disk_bytes() const { return count ? static_cast<double>(length) * valid / count : 0.0; }
};

struct PageMeta {
  bool live = false;
  uint64_t seq = 0;
  std::vector<SegMeta> segs;
  SegMeta* seg(uint32_t fid) {
    for (auto& s : segs)
      if (s.fid == fid) return &s;
    return nullptr;
  }
  uint32_t valid() const {
    uint32_t v = 0;
    for (const auto& s : segs) v += s.retired ? 0 : s.valid;
    return v;
  }
  double live_disk_bytes() const {
    double b = 0;
    for (const auto& s : segs)
      if (!s.retired) b += s.live_disk_bytes();
    return b;
  }
};

// Logical page id -> page record; also owns the free-slot set.
class LogicalPageTable {
 public:
  PageMeta& at(uint32_t pid) { return pages_[pid]; }
  const PageMeta& at(uint32_t pid) const { return pages_[pid]; }
  uint32_t slots() const { return static_cast<uint32_t>(pages_.size()); }
  uint64_t live_pages() const { return live_; }
  void EnsureSlots(uint32_t n) {
    if (pages_.size() < n) pages_.resize(n);
  }
  void MarkLive(uint32_t pid, uint64_t seq, std::vector<SegMeta> segs);
  void MarkDead(uint32_t pid);  // the slot stays unallocatable until AddFree
  // A free slot is either kept (its bytes still allocated in the page file, for the next
  // flushes to overwrite) or returned to the filesystem (hole punched, or never known to be
  // allocated, e.g. at open).
  void AddFree(uint32_t pid, bool kept = false) {
    free_.insert(pid);
    if (kept) kept_.insert(pid);
  }
  // Allocates n slots, preferring one contiguous run so a feature's pages read sequentially,
  // and kept slots over returned ones.
  std::vector<uint32_t> Allocate(uint32_t n);
  size_t free_slots() const { return free_.size(); }
  std::vector<uint32_t> FreeSlots() const { return {free_.begin(), free_.end()}; }  // ascending
  size_t kept_slots() const { return kept_.size(); }
  // Marks the kept slots beyond the `max_kept` lowest as returned and lists them ascending
  // (the caller punches them). The highest go: Allocate takes the lowest runs first.
  std::vector<uint32_t> ReturnKeptBeyond(size_t max_kept);
  // Drops the free slots at the end of the table (the file's tail past its last page in use,
  // e.g. space allocated ahead and never written) and returns the slot count left.
  uint32_t TrimFreeTail();
  size_t MemoryBytes() const;

 private:
  std::vector<PageMeta> pages_;
  std::set<uint32_t> free_;
  std::set<uint32_t> kept_;  // the free slots whose bytes are still allocated (a subset of free_)
  uint64_t live_ = 0;
};

// Feature -> definition, key index and the live pages holding its (non-retired) segments.
struct FeatureState {
  FeatureDef def;
  KeyIndex index;
  // Loaded lazily from a checkpoint: the serialized index until first use (Store::LoadIndex).
  // A clean reopen then costs nothing for features a session never writes or looks up, and
  // close() writes their bytes back unchanged.
  bool index_lazy = false;
  std::string index_blob;
  // With index_blob: the key range of each segment the index may name (its page id), taken
  // from the page table at the open. LoadIndex checks the decoded keys against these instead
  // of the page table, which readers must not read (it belongs to the writer, and a flush of
  // another feature may grow it meanwhile). A lazy feature's segments cannot change before
  // its index is loaded: every writer path loads the index first.
  struct SegmentRange {
    uint32_t page;
    uint64_t min_key, max_key;
  };
  std::vector<SegmentRange> index_ranges;
  std::vector<uint32_t> pages;  // unordered
  uint64_t live_items = 0;      // valid non-tombstone items on disk
  uint64_t live_bytes = 0;      // their logical bytes
  uint64_t tombs = 0;           // live tombstone records
  bool touched = false;         // updated by the last flush (merger candidate)
  void RemovePages(const std::set<uint32_t>& gone);
};

class FeatureTable {
 public:
  FeatureState* Find(const std::string& name) {
    auto it = by_name_.find(name);
    return it == by_name_.end() ? nullptr : features_[it->second].get();
  }
  FeatureState* Get(uint32_t fid) { return fid < features_.size() ? features_[fid].get() : nullptr; }
  const FeatureState* Get(uint32_t fid) const { return fid < features_.size() ? features_[fid].get() : nullptr; }
  FeatureState* Add(const FeatureDef& def);
  std::vector<FeatureState*> All();
  size_t MemoryBytes() const;

 private:
  std::vector<std::unique_ptr<FeatureState>> features_;  // indexed by id
  std::unordered_map<std::string, uint32_t> by_name_;
};

struct PersistentState {
  uint64_t next_seq = 1;
  uint64_t wal_start = 1;
  uint32_t next_fid = 0;
  // Lifetime counters, committed with each flush/merge so amplification figures survive
  // reopening. (Items acknowledged but not yet flushed count once their flush commits.)
  uint64_t user_bytes_written = 0;
  uint64_t pages_written = 0;
  // The WAL file wal_start names is kept until a commit moves wal_start past it (older
  // versions unlinked it at open when empty), so its absence while later WAL files exist means
  // commits were lost from the metadata (see StoreImpl::ReplayWal). Committed true by this
  // version once its session knows the file is there (the open found or made it, or a flush
  // made it); false in records written before the rule.
  bool wal_start_kept = false;
  // The WAL files from wal_start on are consecutive and only the last may be empty (see
  // FindWalSequenceBreak), so the open refuses a gap or an empty file before the last one
  // (StoreImpl::ReplayWal). Committed true by this version once its session knows its files are
  // so: at once when the open found them so (always, when the loaded record said so), else
  // from the session's first flush, which starts a fresh run. False in records written before
  // the rule, whose writers unlinked empty files at open and left gaps.
  bool wal_files_consecutive = false;
  // The newest WAL file a session of this store logs to (0: not recorded; records written
  // before the rule). Committed before the first record goes into a file past the recorded one
  // (StoreImpl::RecordWalLastLocked) and by each flush with the file it starts, so the open
  // refuses newest files missing below it (deleted, with synced writes in them), which nothing
  // after them in the directory would otherwise tell.
  uint64_t wal_last = 0;

  // The same commit's state (every field: a commit that writes no page, such as
  // create_feature, still moves next_fid and the counters of what it committed).
  bool operator==(const PersistentState&) const = default;
};

// RocksDB-backed persistence of the tables.
class MetaStore {
 public:
  MetaStore();  // out of line, as the destructor: rocksdb::DB is incomplete here
  ~MetaStore();
  // Opens (creating if `create`) the RocksDB directory. read_only: RocksDB's read-only
  // instance (no LOCK taken, nothing written; a live writer's WAL is replayed in memory),
  // a snapshot of the metadata as of the open.
  Status Open(const std::string& dir, bool create, bool read_only = false);
  // Whether the last Open failed because a file the database names was gone when RocksDB
  // opened it (ENOENT): for a read-only open, what a writer's metadata flush or compaction
  // does when it deletes obsolete files between the open's read of the MANIFEST and its open
  // of those files.
  bool open_missed_file() const { return open_missed_file_; }
  // The state record as committed now (a fresh read-only open): lets a read-only handle
  // tell "a writer moved on since my snapshot" from real corruption.
  static Status ReadCurrentState(const std::string& dir, PersistentState* st);
  void Close();
  // Moves what RocksDB holds only in its log into a table file. Without it every open
  // replays the log of the whole import into a memtable (a 2 M-row store: 0.5 MB of log,
  // most of a 14 ms read-only open, paid by every Ray read task). A no-op for a short log
  // or on a nearly full disk (see metadata.cc).
  Status FlushLog();
  Status ReadFormat(std::string* value, bool* found);
  Status WriteFormat(const std::string& value);
  Status LoadFeatures(std::vector<FeatureDef>* out);
  Status LoadPages(std::vector<std::pair<uint32_t, PageMeta>>* out);
  Status LoadState(PersistentState* st, bool* found);

  static void PutFeature(rocksdb::WriteBatch* b, const FeatureDef& f);
  static void PutPage(rocksdb::WriteBatch* b, uint32_t pid, const PageMeta& p);
  static void DeletePage(rocksdb::WriteBatch* b, uint32_t pid);
  static void PutState(rocksdb::WriteBatch* b, const PersistentState& st);
  // Atomically and durably applies the batch.
  Status Commit(rocksdb::WriteBatch* b);
  uint64_t bytes_committed() const { return bytes_committed_; }

 private:
  std::unique_ptr<rocksdb::DB> db_;
  std::string dir_;
  uint64_t bytes_committed_ = 0;
  bool open_missed_file_ = false;
};

}  // namespace recflash
