// Store: the READER store engine. Owns the page file, the WAL, the write buffer, the
// metadata manager and the pinner/merger/reclaimer, and serves snapshot reads.
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
// fresh WAL file; (2) new pages written into free slots and fdatasync'ed; (3) one RocksDB
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
// recovery, checkpoint), store_write.cc (group commit, flush, page commit),
// store_rewrite.cc (merge and reclamation execution), store_read.cc (scans, get),
// store_gather.cc (embedding-row gathers), store_stats.cc (stats JSON); version_set.h,
// scan_merge.h, write_batch.h and filename.h hold what they extract.
#pragma once
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

namespace recflash {

struct StoreOptions {
  uint32_t page_size = 16384;             // fixed when the store is created
  uint64_t write_buffer_bytes = 64ull << 20;
  bool direct_io = true;                  // O_DIRECT page file
  bool sync_on_write = false;             // fsync the WAL on every put/delete
  // Bulk-load mode (imports). Puts and deletes are not logged: sync() and flush() write the
  // whole buffer into pages and commit the metadata (nothing stays pinned), so a sync is the
  // durability point exactly as with the WAL, but every item reaches the device once instead
  // of twice and the put path copies values once. A crash loses what was put since the last
  // sync, as with the WAL and sync_on_write off; an importer resumes from its last sync.
  bool bulk_load = false;
  unsigned queue_depth = 32;              // io_uring requests in flight
  // Block-granular row reads (Store::GatherRows) are checked against crc32c sums of their
  // 512 B blocks taken from checksum-verified whole-page reads; a packed page without sums is
  // read whole once first. false: block reads are not verified (no DRAM for the sums).
  bool verify_block_reads = true;
  // Accounting mode: the same flush, pinner, merger and reclamation decide the same layout,
  // but pages are not written (nor the WAL, nor the metadata), merges find their records
  // through the key index instead of reading pages, and reads are costed with AccountScan.
  // Reaches dataset sizes the disk cannot hold; nothing survives close().
  bool accounting = false;
  uint32_t max_io_bytes = 256u << 10;     // largest coalesced read
  // Read-only handle (many processes at once, e.g. Ray read tasks): no LOCK taken, RocksDB
  // opened read-only, the WAL replayed into DRAM without touching files, no checkpoint
  // consumed, writes refused. The handle reads the snapshot of its open; every page read
  // checks the page's seq against it, so a page a writer rewrote since then fails with a
  // Stale status (reopen) instead of returning other data.
  bool read_only = false;
  // Compact pages: int64 values stored frame-of-reference packed (1, 2 or 4 bytes each when a
  // segment's value range allows; 32-bit hashed ids take 4 bytes, small counts 1-2). Off by
  // default, so item sizes stay what the amplification benchmarks assume; `recflash import`
  // turns it on. Readers need no option (segments describe themselves). Accounting mode
  // ignores it: it does not know the values of records it merges.
  bool compact_pages = false;
  PinnerOptions pinner;
  MergerOptions merger;
  ReclaimOptions reclaim;
};

struct ReadStats {
  uint64_t pages_read = 0;
  uint64_t bytes_read = 0;
  uint64_t useful_bytes = 0;  // logical bytes (8 + value) of the items returned from pages
  // On-disk (encoded) bytes of those items: their share of the segments they were read from.
  // bytes_read / encoded_bytes is the layout's read amplification (1.0 = only own bytes),
  // independent of how well keys compress.
  double encoded_bytes = 0;
  uint64_t items = 0;
  double seconds = 0;
};

// What a row gather did (see Store::GatherRows).
struct GatherStats {
  uint64_t rows = 0;          // unique rows requested
  uint64_t buffer_rows = 0;   // served from the write buffer (updates not yet flushed)
  uint64_t vector_rows = 0;   // served by block-granular reads at a computed address
  uint64_t page_rows = 0;     // served by whole-page reads (rows not in the packed layout)
  uint64_t device_reads = 0;  // read requests issued
  uint64_t device_bytes = 0;  // bytes requested from the device
  uint64_t verified_blocks = 0;  // block reads checked against their block checksums
  uint64_t first_touch_pages = 0;  // packed pages read whole to take their block checksums
  double seconds = 0;           // until the rows were complete
};

// One table's part of Store::GatherRowsMany.
struct GatherRequest {
  std::string feature;
  const uint64_t* ids = nullptr;  // ascending, unique
  size_t n = 0;
  float* out = nullptr;           // n x dim, written
  GatherStats* stats = nullptr;
};

class Store {
 public:
  static Status Open(const std::string& path, const StoreOptions& options, std::unique_ptr<Store>* out);
  ~Store();

  Status CreateFeature(const std::string& name, const std::string& type, FeatureDef* out);
  Status LookupFeature(const std::string& name, FeatureDef* out);
  std::vector<FeatureDef> Features();

  // values: n * width bytes for fixed-width types; for variable-width types the bytes
  // delimited by byte offsets[0..n].
  Status Put(const std::string& feature, const uint64_t* keys, size_t n, const uint8_t* values, size_t values_len,
             const int64_t* offsets);
  Status Delete(const std::string& feature, const uint64_t* keys, size_t n);
  // force: also write what the pinner holds (close() uses it).
  Status Flush(bool force);
  // Full merge of the named features (all when empty): every page holding them is gathered
  // and their items rewritten packed, in key order — the read-optimal layout.
  Status Compact(const std::vector<std::string>& features);
  Status Sync();
  Status Close();

  // Items with lo <= key < hi; hi == UINT64_MAX means "no upper bound" (the largest key
  // included), since a half-open range could not otherwise reach it.
  Status ScanMany(const std::vector<std::string>& features, uint64_t lo, uint64_t hi, std::vector<ColumnData>* out,
                  ReadStats* st);
  Status Get(const std::string& feature, const uint64_t* keys, size_t n, ColumnData* out, ReadStats* st);
  // What scanning a whole feature would read, from the metadata alone (no I/O): pages,
  // bytes, useful and encoded bytes. Works in both modes.
  Status AccountScan(const std::string& feature, ReadStats* st);
  // Key range and record count of every page holding the feature in the current snapshot,
  // ascending by min_key (ranges may overlap where old versions are not yet merged). Used to
  // split a scan into key ranges of similar size; buffered items are not counted.
  Status KeyRanges(const std::string& feature, std::vector<PageRef>* out);
  bool read_only() const { return o_.read_only; }

  // Rows of an embedding table (a fixed_size_list<float32, D> feature) for `ids` (ascending,
  // unique) into out[n x D]. A row in a packed page (one feature, run keys, all valid — the
  // layout load + compact() produce) has a computed address, and vector_grained reads just
  // the device blocks holding it (a 128-byte row: one 512-byte read); other rows are found
  // through the key index and read with their page (checksum verified), buffered updates
  // come from DRAM. Block reads cannot verify a page checksum (it covers the whole page), so
  // with verify_block_reads they are checked against crc32c sums of their blocks taken from
  // a verified whole-page read of the same page version (BlockSums); a mismatch is a
  // Corruption naming the file, offset, page and row.
  Status GatherRows(const std::string& feature, const uint64_t* ids, size_t n, bool vector_grained, float* out,
                    GatherStats* st);
  // Several tables' rows in one ring pass: all block reads are queued together (the queue
  // does not drain between tables) and `done(r)` runs as soon as request r's rows are all in
  // its `out`, while the reads of other requests are still in flight — so the caller's work
  // on r (pooling) overlaps the I/O. A request may name the same table as another.
  using GatherDoneFn = std::function<Status(size_t request)>;
  Status GatherRowsMany(const std::vector<GatherRequest>& requests, bool vector_grained, const GatherDoneFn& done);
  // Reads every packed page of an embedding table whose block checksums are not held yet
  // (whole pages, large coalesced reads, page checksums verified) and takes their block
  // checksums, so later block-granular reads of the table are verified without a first-touch
  // page read. Returns the pages read.
  Status VerifyRows(const std::string& feature, uint64_t* pages_read);
  uint32_t block_size() const { return block_size_; }

  std::string StatsJson();
  Status CheckOpenStatus() { return CheckOpen(); }
  const std::string& path() const { return path_; }
  uint32_t page_size() const { return o_.page_size; }

 private:
  struct WriteOp;
  struct Rec;
  // A flush's append to a deferred-index feature: its buffered items, written as they are.
  struct AppendRun {
    uint32_t fid;
    const BufferedItems* items;
    uint64_t bytes;  // logical bytes (8 + value per item)
  };

  class Gather;  // one GatherRowsMany call (store_gather.cc)

  explicit Store(const StoreOptions& o);
  Status OpenImpl(const std::string& path);
  // Feature table, page table and persistent state from RocksDB; *max_pid = one past the
  // highest live page id (0: no pages). Shared by both recovery paths.
  Status LoadTables(uint32_t* max_pid) RF_REQUIRES(write_mu_);
  Status Recover() RF_REQUIRES(write_mu_);
  // Read-only open: metadata and WAL only, no page read (see StoreOptions::read_only).
  Status RecoverReadOnly() RF_REQUIRES(write_mu_);
  // Read-only handles build the key index (for get() and row gathers) on first use, from
  // the checkpoint when it matches their snapshot, else by reading the live pages.
  Status EnsureKeyIndex() RF_EXCLUDES(write_mu_);
  // The feature's key index, decoded from its checkpoint bytes on first use (FeatureState::
  // index_lazy). Thread-safe; call before touching f->index.
  Status LoadIndex(FeatureState* f);
  FeatureState* FeatureStateFor(uint32_t fid);
  void ResetDerivedLocked() RF_REQUIRES(write_mu_, mu_);
  Status CheckWritable();
  // A read-only handle's page read failed verification: a writer moved on (Stale, reopen)
  // or the file is corrupt (the original status).
  Status ExplainReadFailure(const Status& s);
  Status RebuildFromPages() RF_REQUIRES(write_mu_);
  // Clean-shutdown checkpoint of the derived state (key indexes, valid counts), so a clean
  // reopen need not read every page. Consumed (deleted) at open: it only ever describes the
  // exact state at close, and a crash afterwards always falls back to RebuildFromPages.
  Status WriteCheckpoint() RF_REQUIRES(write_mu_);
  bool LoadCheckpoint() RF_REQUIRES(write_mu_);
  Status ReplayWal(uint64_t* max_number) RF_REQUIRES(write_mu_);

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
  void ReleasePendingLocked() RF_REQUIRES(write_mu_);
  // Gives back the page file's free tail (space allocated ahead for writes that are done),
  // at the end of an explicit flush and at close. Best effort, like hole punching.
  void TrimFileLocked() RF_REQUIRES(write_mu_);
  // Reads the pages (ascending ids) through the ring, verifying each, and calls fn per page.
  using PageFn = std::function<Status(uint32_t pid, const PageView& page)>;
  Status ReadPages(IoRing* ring, const std::vector<uint32_t>& sorted_pids, const PageFn& fn);
  void FinishRead(uint64_t pages, uint64_t useful, double encoded, uint64_t items, double t0, ReadStats* st);
  Status CheckOpen();
  Status CheckReadable();
  BlockSums* LoadedBlockSums();  // null when block reads are not verified
  Status FeatureFor(const std::string& name, FeatureDef* def);

  StoreOptions o_;
  std::string path_, pages_path_, wal_dir_;
  int lock_fd_ = -1;
  PageFile file_;
  MetaStore meta_;
  std::unique_ptr<IoRingPool> rings_;
  std::unique_ptr<IoRing> write_ring_;
  std::unique_ptr<IoRingPool> block_rings_;  // small slots, deep queue: vector-grained reads
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
  std::vector<AlignedBuffer> write_blocks_ RF_GUARDED_BY(write_mu_);                  // page staging for writes, reused

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
  std::atomic<uint64_t> pages_read_{0}, bytes_read_{0}, useful_bytes_read_{0}, reads_{0};
  // Feature scans resolved through the key index, and those that fell back to the k-way
  // merge because the index and the snapshot's pages disagreed (a writer mid-install).
  std::atomic<uint64_t> index_merges_{0}, index_merge_fallbacks_{0};
  uint64_t flushes_ RF_GUARDED_BY(write_mu_) = 0;  // lifetime byte counters live in pstate_
  uint64_t punch_failures_ RF_GUARDED_BY(write_mu_) = 0;  // hole punches that failed (best effort, see ReleasePendingLocked)
  std::atomic<double> encoded_bytes_read_{0};
  uint64_t flush_pages_written_ RF_GUARDED_BY(write_mu_) = 0;
  uint64_t recovered_wal_records_ RF_GUARDED_BY(write_mu_) = 0;
  bool opened_from_checkpoint_ RF_GUARDED_BY(write_mu_) = false;
  // pstate_.next_seq as the open found it (set before the store is shared, then constant): a
  // read-only handle's snapshot, which readers compare without the writer's lock.
  uint64_t opened_seq_ = 0;
  bool key_index_ready_ RF_GUARDED_BY(write_mu_) = true;  // false on a read-only handle until EnsureKeyIndex
  double recovery_seconds_ RF_GUARDED_BY(write_mu_) = 0;
};

}  // namespace recflash
