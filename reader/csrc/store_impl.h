// StoreImpl: the READER store engine behind the Store interface (store.h). Owns the page
// file, the WAL, the write buffer, the metadata manager and the pinner/merger/reclaimer, and
// serves snapshot reads.
//
// Concurrency. Writers (put/delete) go through a LevelDB-style group commit: they queue, the
// head of the queue appends the whole group to the WAL in one write (and one fsync when asked)
// and applies it to the write buffer. `write_mu_` serialises that with flushes, merges and
// reclamation, which run in the writer's thread. Readers never take `write_mu_`: they grab
// the current immutable Version (which pages hold each feature) and a copy of the buffered
// items under the short `mu_`, register the version number, and read without locks. A page
// freed by a flush or merge is reused (or punched) only after every reader registered on an
// older version is done — so a scan always sees one consistent state.
//
// Crash safety. Ordering on every flush/merge: (1) WAL synced, pinned items re-logged into a
// fresh WAL file (the current one while it is still empty: see FlushLocked); (2) new pages written into free slots and fdatasync'ed; (3) one RocksDB
// write batch (sync) commits the new page records, retired segments, freed pages and the new
// WAL start; (4) only then are old WAL files deleted and freed slots made reusable. A crash
// before (3) leaves the previous metadata pointing at untouched pages and the WAL replays the
// rest; a crash after (3) leaves orphaned slots that recovery treats as free.
//
// Lock order (a thread holding one may take only those after it):
//   write_mu_  ->  lazy_mu_  ->  mu_  ->  ring pools' own locks
// queue_mu_ (the group-commit queue) is never held together with another lock: the head
// writer releases it before taking write_mu_ and retakes it after releasing write_mu_.
// Functions named ...Locked say beside their declaration which lock they need. Writer-side
// tables (features_, pages_, pstate_, the planners) are read and changed under write_mu_;
// what readers reach (buffer_, defs_, the key indexes, the VersionSet) changes under both
// write_mu_ and mu_, so readers need only mu_. The annotations (RF_GUARDED_BY, RF_REQUIRES,
// RF_ACQUIRED_BEFORE) are Clang thread-safety attributes on the locks of mutex.h: `make
// tsa-check` (part of `make test`) compiles the engine with -Wthread-safety as errors. The
// few places where the rule is "written under both, read under either" (WriterBuffer,
// ReaderFeatures, VersionSet::current) are the documented exceptions the analysis cannot
// express.
//
// Sources by concern: store.cc (lifetime, feature catalog, close), store_open.cc (open,
// recovery, read-only handles racing a writer), store_wal_replay.cc (the WAL at open),
// store_key_index.cc (valid counts and key indexes: derived, rebuilt, decoded on use),
// store_checkpoint.cc (the derived state saved by a clean close), store_write.cc (group
// commit, flush, page commit),
// store_rewrite.cc (merge and reclamation execution), store_read.cc (scans, get),
// store_keys.cc (keys-only scans), store_gather.cc (embedding-row gathers), store_stats.cc
// (stats JSON); version_set.h, scan_merge.h, key_merge.h, write_batch.h and filename.h hold
// what they extract.
#pragma once
#include <algorithm>
#include <atomic>
#include <cstdlib>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <set>
#include <string>
#include <vector>

#include "reader/csrc/block_sums.h"
#include "reader/csrc/column.h"
#include "reader/csrc/format.h"
#include "reader/csrc/io_ring.h"
#include "reader/csrc/lane_helpers.h"
#include "reader/csrc/merger.h"
#include "reader/csrc/metadata.h"
#include "reader/csrc/mutex.h"
#include "reader/csrc/page_file.h"
#include "reader/csrc/pinner.h"
#include "reader/csrc/status.h"
#include "reader/csrc/thread_annotations.h"
#include "reader/csrc/version_set.h"
#include "reader/csrc/wal.h"
#include "reader/csrc/write_buffer.h"
#include "reader/csrc/store.h"
namespace recflash {

// What a read's rings reported: the device wait (the scan's own thread) and the peak bytes in
// flight (the sum over a scan's lanes) — ReadStats' io_wait_seconds and peak_inflight_bytes.
struct ReadIo {
  double wait_seconds = 0;
  uint64_t peak_inflight_bytes = 0;
};

class StoreImpl final : public Store {
 public:
  ~StoreImpl() override;
  Status CreateFeature(const std::string& name, const std::string& type, FeatureDef* out) override;
  Status LookupFeature(const std::string& name, FeatureDef* out) override;
  std::vector<FeatureDef> Features() override;
  Status Put(const std::string& feature, const uint64_t* keys, size_t n, const uint8_t* values, size_t values_len,
             const int64_t* offsets) override;
  Status Delete(const std::string& feature, const uint64_t* keys, size_t n) override;
  Status Flush(bool force) override;
  Status Compact(const std::vector<std::string>& features) override;
  Status Sync() override;
  Status Close() override;
  Status ScanMany(const std::vector<std::string>& features, uint64_t lo, uint64_t hi, std::vector<ColumnData>* out,
                  ReadStats* st) override;
  Status ScanKeys(const std::string& feature, uint64_t lo, uint64_t hi, HVec<uint64_t>* keys,
                  ReadStats* st) override;
  Status Get(const std::string& feature, const uint64_t* keys, size_t n, ColumnData* out, ReadStats* st) override;
  Status AccountScan(const std::string& feature, ReadStats* st) override;
  Status KeyRanges(const std::string& feature, std::vector<PageRef>* out) override;
  bool read_only() const override { return o_.read_only; }
  Status GatherRows(const std::string& feature, const uint64_t* ids, size_t n, bool vector_grained,
                    uint32_t dense_page_rows, float* out, GatherStats* st) override;
  Status GatherRowsMany(const std::vector<GatherRequest>& requests, bool vector_grained, uint32_t dense_page_rows,
                        const GatherDoneFn& done) override;
  Status VerifyRows(const std::string& feature, uint64_t* pages_read) override;
  Status BuildKeyIndex(bool read_pages) override {
    return read_pages ? EnsureKeyIndex() : TryKeyIndexFromCheckpoint();
  }
  uint32_t block_size() const override { return block_size_; }
  std::string StatsJson() override;
  Status CheckOpenStatus() override { return CheckOpen(); }
  const std::string& path() const override { return path_; }
  uint32_t page_size() const override { return o_.page_size; }

 private:
  friend class Store;  // Store::Open constructs and opens the engine
  struct WriteOp;
  struct Rec;
  // A flush's append (puts above every stored key of the feature): its buffered items,
  // written as they are (PageBatch::AddRuns), with no per-item record or index lookup.
  struct AppendRun {
    uint32_t fid;
    const BufferedItems* items;
    uint64_t bytes;  // logical bytes (8 + value per item)
    bool indexed;    // the feature's index is materialized: its keys join it after the write
  };

  class Gather;  // one GatherRowsMany call (store_gather.cc)

  explicit StoreImpl(const StoreOptions& o);
  Status OpenImpl(const std::string& path);
  // Feature table, page table and persistent state from RocksDB; *max_pid = one past the
  // highest live page id (0: no pages). Shared by both recovery paths.
  Status LoadTables(uint32_t* max_pid) RF_REQUIRES(write_mu_);
  Status Recover() RF_REQUIRES(write_mu_);
  // Read-only open: metadata and WAL only, no page read (see StoreOptions::read_only).
  Status RecoverReadOnly() RF_REQUIRES(write_mu_);
  // A read-only handle's derived state without the pages: every record of a non-retired
  // segment taken as valid (after ResetDerivedLocked).
  void DeriveAllValid() RF_REQUIRES(write_mu_);
  // Read-only handles build the key index (for get() and row gathers) on first use, from
  // the checkpoint when it matches their snapshot, else by reading the live pages.
  Status EnsureKeyIndex() RF_EXCLUDES(write_mu_);
  // A scan's cheaper variant: the key index from the checkpoint only (no page is read), tried
  // once per handle, when a scan meets a feature whose pages overlap (the index-guided merge
  // is then several times faster than merging the pages' chunks). Without a matching
  // checkpoint the handle stays as it was.
  Status TryKeyIndexFromCheckpoint() RF_EXCLUDES(write_mu_);
  // Both: replaces the read-only open's derived state with the checkpoint's when it describes
  // this snapshot. False (state unchanged) otherwise.
  bool SwapInCheckpointIndex() RF_REQUIRES(write_mu_) RF_EXCLUDES(lazy_mu_, mu_);
  // The feature's key index, decoded from its checkpoint bytes on first use (FeatureState::
  // index_lazy). Thread-safe; call before touching f->index.
  Status LoadIndex(FeatureState* f);
  // Whether f's index is still encoded (kept from the checkpoint until first use), and of
  // what kind: a dense run (a scan can do without it) or keys, whose entry count goes into
  // *entries (read from the header, nothing decoded; a scan decodes them while its first
  // reads are in flight). kDecodeNow: decoded already, or to be decoded by LoadIndex now.
  enum class PendingIndex { kDecodeNow, kDense, kKeys };
  PendingIndex IndexPending(FeatureState* f, uint64_t* entries);
  FeatureState* FeatureStateFor(uint32_t fid);
  void ResetDerivedLocked() RF_REQUIRES(write_mu_, mu_);
  // The tail of Close (and of a failed open): lane helpers, page file, rings, metadata
  // database and the LOCK, released without writing anything.
  void ReleaseResources();
  Status CheckWritable();
  // A read-only handle's page read failed verification: a writer moved on (Stale, reopen)
  // or the file is corrupt (the original status).
  Status ExplainReadFailure(const Status& s);
  // Read-only open: whether a writer holds the LOCK, or committed a state other than the one
  // this open loaded (and may have closed since). Either way what the snapshot names may have
  // been retired under the open: Stale (reopen) rather than Corruption.
  bool WriterMovedOn() RF_REQUIRES(write_mu_);
  Status RebuildFromPages() RF_REQUIRES(write_mu_);
  // Clean-shutdown checkpoint of the derived state (key indexes, valid counts), so a clean
  // reopen need not read every page. It only ever describes the committed state it was
  // written for: a writer that loaded it keeps it while it commits nothing (a session that
  // only reads neither deletes it nor rewrites it at close) and retires it (deleted, the
  // directory synced) before its first metadata commit, so a crash afterwards always falls
  // back to RebuildFromPages.
  Status WriteCheckpoint() RF_REQUIRES(write_mu_);
  bool LoadCheckpoint() RF_REQUIRES(write_mu_);
  // Deletes CHECKPOINT (if there) durably: at open when it did not load, and before the
  // first commit that moves the state past a kept one (CommitMetaLocked).
  Status RetireCheckpointLocked() RF_REQUIRES(write_mu_);
  // Every metadata commit goes through here, so none lands next to a checkpoint of the
  // state before it.
  Status CommitMetaLocked(rocksdb::WriteBatch* b) RF_REQUIRES(write_mu_);
  // Replays the WAL files from pstate_.wal_start on, after checking that the metadata's first
  // file is there and (when the state record says writers kept them so) that the files are
  // consecutive with only the last one empty: Corruption otherwise (Stale for a read-only open
  // while a writer holds the LOCK), or with wal_recovery "point_in_time" replay up to the
  // break, which a writable open then makes permanent (the later files deleted).
  struct WalReplay {
    uint64_t last_number = 0;  // the newest file from wal_start on left after replay (0: none)
    bool last_empty = false;   // ... and it is empty: the session logs to it
    bool start_listed = false;  // the wal_start file was there
    bool consecutive = false;   // the files from wal_start on are consecutive, only the last empty
  };
  Status ReplayWal(WalReplay* out) RF_REQUIRES(write_mu_);
  // Commits PersistentState::wal_last = wal_number_ (the state record alone) before this
  // session's first record goes into its file, or at a writable open that dropped the newest
  // files (point_in_time), so a later open can tell the newest files were deleted.
  Status RecordWalLastLocked() RF_REQUIRES(write_mu_);
  // Corruption (Stale for a read-only handle while a writer runs) when the metadata lists
  // pages at or past `slots`, the page file's length in pages.
  Status CheckPagesWithinFile(uint32_t max_pid, uint64_t slots) RF_REQUIRES(write_mu_);

  Status Write(WriteOp* w);
  // The writer side: every ...Locked function below needs write_mu_ held (they take mu_
  // themselves, briefly, where readers could see what they change) unless it says otherwise.
  Status FlushLocked(bool force) RF_REQUIRES(write_mu_);
  Status MaintainLocked() RF_REQUIRES(write_mu_);
  Status RewriteLocked(const std::vector<MoveTask>& tasks, bool merge) RF_REQUIRES(write_mu_);
  // Packs records (grouped by feature, ascending keys) into pages, writes them durably and
  // updates the tables; fills `dirty`/`freed` for the commit.
  // Appends (runs) come first, then the records.
  Status WriteRecordsLocked(const std::vector<AppendRun>& runs, std::vector<Rec>& recs, std::set<uint32_t>* dirty,
                            std::set<uint32_t>* freed, uint64_t* pages_written) RF_REQUIRES(write_mu_);
  // Whether the buffered items only append to the feature (puts above every stored key).
  static bool IsAppend(const FeatureState* f, const BufferedItems& b);
  // Builds the key index of a deferred feature by reading its pages (see KeyIndex).
  Status MaterializeIndexLocked(FeatureState* f) RF_REQUIRES(write_mu_);
  // Needs write_mu_ and mu_: it changes a key index readers consult.
  void InvalidateLocked(FeatureState* f, size_t pos, std::set<uint32_t>* dirty, std::set<uint32_t>* freed)
      RF_REQUIRES(write_mu_, mu_);
  template <typename PagePtr>
  Status WritePagesLocked(const std::vector<uint32_t>& ids, const PagePtr& page_ptr) RF_REQUIRES(write_mu_);
  void UpdateTablesLocked(const std::vector<Rec>& recs, const std::vector<uint32_t>& rec_page,
                          const std::vector<uint32_t>& ids, const std::vector<std::vector<SegmentSummary>>& summaries,
                          const std::vector<uint64_t>& seqs, std::set<uint32_t>* dirty, std::set<uint32_t>* freed)
      RF_REQUIRES(write_mu_);
  Status CommitLocked(const std::set<uint32_t>& dirty, const std::set<uint32_t>& freed) RF_REQUIRES(write_mu_);
  // Pages no reader can still see become free slots (punched). Takes mu_ (VersionSet).
  // Frees the slots no reader needs any more, keeping up to free_reserve_buffers of them
  // allocated for the next flushes and punching the rest.
  void ReleasePendingLocked() RF_REQUIRES(write_mu_);
  // Punches the kept free slots beyond the lowest max_kept (0 at close: all of them).
  void ReturnFreeSlotsLocked(size_t max_kept) RF_REQUIRES(write_mu_);
  // At a writable open: slots a crashed session (or a close that failed before its flush)
  // left allocated — kept for reuse, or allocated ahead — are free slots the open cannot tell
  // from holes. When the file allocates more than its pages in use, the tail is trimmed and
  // every free run punched.
  void ReturnLeftoverSlotsLocked() RF_REQUIRES(write_mu_);
  // Punches the slots (ascending), a run per call; the slots punched (failures are counted).
  uint64_t PunchSlotsLocked(const std::vector<uint32_t>& slots) RF_REQUIRES(write_mu_);
  // Gives back the page file's free tail (space allocated ahead for writes that are done),
  // at the end of an explicit flush and at close. Best effort, like hole punching.
  void TrimFileLocked() RF_REQUIRES(write_mu_);
  // One scan of `names` (ScanMany): with use_index, features whose pages overlap are resolved
  // through a copy of their key index, and fixed-width ones
  // are placed as their pages arrive; those whose pages disagree with
  // the index are listed in `redo` (their output unusable) for a pass without placement.
  Status ScanPass(const std::vector<std::string>& names, uint64_t lo, uint64_t hi, bool use_index,
                  std::vector<ColumnData>* out, ReadStats* st, std::vector<size_t>* redo);
  // Page pid's segment of feature `def`, which the scan's snapshot lists as `ref`, checked
  // against it: a page of another seq is Stale on a read-only handle when newer (a writer
  // rewrote it since the open), else Corruption; a missing segment is Corruption. With
  // keys_only the values are not decoded (see PageView::Find) and the keys and tombstones
  // must lie within the segment; otherwise the segment must fit def's value type.
  Status SnapshotSegment(uint32_t pid, const PageView& pv, const PageRef& ref, const FeatureDef& def, bool keys_only,
                         SegmentView* sv);
  // Reads the pages (ascending ids) through the ring, verifying each, and calls fn per page.
  using PageFn = std::function<Status(uint32_t pid, const PageView& page)>;
  // `idle`: see IoRing::ReadRuns. `inflight_bytes`: the ring's share of the read's budget
  // (0: all of read_inflight_bytes; a scan on one lane: SingleLaneInflight()).
  Status ReadPages(IoRing* ring, const std::vector<uint32_t>& sorted_pids, const PageFn& fn,
                   const IoRing::IdleFn& idle = nullptr, uint64_t inflight_bytes = 0);
  // ReadPages on a ring leased from the pool, for the reads of one call (get, scan_keys): a
  // read failure is explained (ExplainReadFailure) and the ring's wait and peak go to *io.
  // No pages: nothing is leased.
  Status ReadPagesLeased(const std::vector<uint32_t>& sorted_pids, const PageFn& fn, ReadIo* io);
  // What a scan on one lane (and get, scan_keys) keeps in flight: single_lane_inflight_bytes
  // of read_inflight_bytes (either 0: the other; both 0: no budget).
  uint64_t SingleLaneInflight() const {
    const uint64_t all = o_.read_inflight_bytes, one = o_.single_lane_inflight_bytes;
    return all && one ? std::min(all, one) : all ? all : one;
  }
  // Pages one device read (a ring slot) holds: max_io_bytes in whole pages, at least one.
  uint32_t PagesPerRead() const { return std::max(1u, o_.max_io_bytes / o_.page_size); }
  // `pids`: the pages read, in read order (their runs are the device reads).
  void FinishRead(const std::vector<uint32_t>& pids, uint64_t useful, double encoded, uint64_t items, double t0,
                  const ReadIo& io, ReadStats* st);
  Status CheckOpen();
  Status CheckReadable();
  BlockSums* LoadedBlockSums();  // null when block reads are not verified
  Status FeatureFor(const std::string& name, FeatureDef* def);

  StoreOptions o_;
  std::string path_, pages_path_, wal_dir_;
  int lock_fd_ = -1;
  PageFile file_;
  MetaStore meta_;
  IoRingPool* rings_ = nullptr;  // process-wide pools (IoRingPool::Shared)
  // Parked threads for the lanes of large index-placed scans (scan_threads - 1 of them;
  // made at open, started by the first such scan).
  std::unique_ptr<LaneHelpers> lane_helpers_;
  std::unique_ptr<IoRing> write_ring_;  // from rings_, given back at close
  IoRingPool* block_rings_ = nullptr;  // small slots, deep queue: vector-grained reads
  uint32_t block_size_ = 512;                // device logical block (O_DIRECT alignment)
  std::unique_ptr<BlockSums> block_sums_;    // checksums of blocks that vector reads verify
  std::once_flag block_sums_loaded_;

  // Writer side (guarded by write_mu_).
  Mutex write_mu_ RF_ACQUIRED_BEFORE(lazy_mu_);
  Mutex lazy_mu_ RF_ACQUIRED_BEFORE(mu_);  // decoding lazily loaded key indexes
  WalWriter wal_ RF_GUARDED_BY(write_mu_);
  uint64_t wal_number_ RF_GUARDED_BY(write_mu_) = 0;
  PersistentState pstate_ RF_GUARDED_BY(write_mu_);
  FeatureTable features_ RF_GUARDED_BY(write_mu_);
  LogicalPageTable pages_ RF_GUARDED_BY(write_mu_);
  Pinner pinner_ RF_GUARDED_BY(write_mu_);
  Merger merger_ RF_GUARDED_BY(write_mu_);
  Reclaimer reclaimer_ RF_GUARDED_BY(write_mu_);
  Status bg_error_ RF_GUARDED_BY(write_mu_);
  std::vector<std::vector<AlignedBuffer>> write_blocks_ RF_GUARDED_BY(write_mu_);  // page staging, a pool per build thread, reused

  // Group commit queue.
  Mutex queue_mu_;
  std::deque<WriteOp*> writers_ RF_GUARDED_BY(queue_mu_);

  // Shared with readers (guarded by mu_).
  Mutex mu_;
  WriteBuffer buffer_ RF_GUARDED_BY(mu_);
  // The writer reads the buffer holding write_mu_ alone: only the writer changes it, and it
  // changes it holding both locks, so a read under write_mu_ races with nothing. Read-only.
  const WriteBuffer& WriterBuffer() const RF_REQUIRES(write_mu_) RF_NO_THREAD_SAFETY_ANALYSIS { return buffer_; }
  // The mirror image for the feature table: features are added holding both locks, and a
  // FeatureState's key index changes holding both, so readers may look them up under mu_.
  const FeatureTable& ReaderFeatures() const RF_REQUIRES(mu_) RF_NO_THREAD_SAFETY_ANALYSIS { return features_; }
  // A read-only handle's page seqs, which its readers compare with each page they read: set
  // at the open and never changed (EnsureKeyIndex changes only valid counts), so unlocked.
  uint64_t OpenedPageSeq(uint32_t pid) const RF_NO_THREAD_SAFETY_ANALYSIS { return pages_.at(pid).seq; }
  VersionSet versions_{&mu_};
  std::map<std::string, FeatureDef> defs_ RF_GUARDED_BY(mu_);  // name -> definition (readers resolve names here)
  // The key index already describes pages of a version not yet installed (between a flush's
  // or merge's table update and its install): readers must not pair it with the current version.
  bool index_ahead_ RF_GUARDED_BY(mu_) = false;
  std::atomic<bool> closed_{false};

  // Counters.
  std::atomic<uint64_t> pages_read_{0}, bytes_read_{0}, useful_bytes_read_{0}, reads_{0}, read_requests_{0};
  // Feature scans resolved through the key index, and those that fell back to the k-way
  // merge because the index and the snapshot's pages disagreed (a writer mid-install).
  std::atomic<uint64_t> index_merges_{0}, index_merge_fallbacks_{0};
  std::atomic<uint64_t> lane_scans_{0};  // index placements read and placed on more than one thread
  uint64_t flushes_ RF_GUARDED_BY(write_mu_) = 0;  // lifetime byte counters live in pstate_
  uint64_t open_returned_slots_ RF_GUARDED_BY(write_mu_) = 0;  // free slots punched at open (ReturnLeftoverSlotsLocked)
  uint64_t punch_failures_ RF_GUARDED_BY(write_mu_) = 0;  // hole punches that failed (best effort, see ReleasePendingLocked)
  std::atomic<double> encoded_bytes_read_{0};
  uint64_t flush_pages_written_ RF_GUARDED_BY(write_mu_) = 0;
  uint64_t recovered_wal_records_ RF_GUARDED_BY(write_mu_) = 0;
  uint64_t wal_bytes_dropped_ RF_GUARDED_BY(write_mu_) = 0;
  bool wal_dir_created_ = false;  // this open made wal/ (set once in OpenImpl, before any thread)  // not replayed (wal_recovery point_in_time)
  bool opened_from_checkpoint_ RF_GUARDED_BY(write_mu_) = false;
  // The CHECKPOINT on disk describes the committed state (loaded at open, nothing committed
  // since, or written by this close): close need not write it again.
  bool checkpoint_current_ RF_GUARDED_BY(write_mu_) = false;
  uint64_t checkpoints_written_ RF_GUARDED_BY(write_mu_) = 0;
  // pstate_.next_seq as the open found it (set before the store is shared, then constant): a
  // read-only handle's snapshot, which readers compare without the writer's lock.
  uint64_t opened_seq_ = 0;
  bool key_index_ready_ RF_GUARDED_BY(write_mu_) = true;  // false on a read-only handle until EnsureKeyIndex
  // Readers may check it under mu_ instead: after the open it changes only holding both
  // write_mu_ and mu_ (EnsureKeyIndex, SwapInCheckpointIndex), so a read under mu_ races with
  // nothing, and it then agrees with the key indexes read in the same critical section.
  bool ReaderKeyIndexReady() const RF_REQUIRES(mu_) RF_NO_THREAD_SAFETY_ANALYSIS { return key_index_ready_; }
  std::atomic<bool> checkpoint_index_tried_{false};       // TryKeyIndexFromCheckpoint ran
  double recovery_seconds_ RF_GUARDED_BY(write_mu_) = 0;
};

}  // namespace recflash
