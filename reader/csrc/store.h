// Store: the READER store engine's interface — features, puts and deletes through a WAL and
// group commit, flushes into pages placed by the pinner and merger, snapshot scans and gets,
// embedding-row gathers — with its options and the statistics reads return.
//
// The engine itself is StoreImpl (store_impl.h), as LevelDB splits DB (include/leveldb/db.h)
// from DBImpl (db/db_impl.h): bindings, the NDP engine and tools include only this header, so
// a change to the engine's members, locks or private steps recompiles the engine's own
// sources and nothing that merely uses a store. Store::Open returns the engine.
#pragma once
#include <algorithm>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "reader/csrc/column.h"
#include "reader/csrc/merger.h"
#include "reader/csrc/pinner.h"
#include "reader/csrc/status.h"
#include "reader/csrc/types.h"
#include "reader/csrc/version_set.h"

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
  // Threads that build the pages of a large flush (PageBatch: a bulk load's write buffer is
  // sized, dictionary-coded and packed on this many threads while the flush holds the write
  // lock). 1 builds on the flushing thread only.
  unsigned build_threads = 2;
  // Block-granular row reads (Store::GatherRows) are checked against crc32c sums of their
  // 512 B blocks taken from checksum-verified whole-page reads; a packed page without sums is
  // read whole once first. false: block reads are not verified (no DRAM for the sums).
  bool verify_block_reads = true;
  // What recovery does with a WAL record that fails its checksum while later records follow
  // it (damage, not the torn last append of a crash, which always just ends replay), or with a
  // WAL file missing between two others or cut to nothing before the last:
  // "tolerate_torn_tail" fails the open with a Corruption naming the file (and offset) (RocksDB's
  // kTolerateCorruptedTailRecords); "point_in_time" replays up to it and drops the rest, later
  // files included (kPointInTimeRecovery; a writable open deletes what it dropped before it
  // logs), stats()["wal_bytes_dropped"] counts the bytes replay passed over (torn tails included).
  std::string wal_recovery = "tolerate_torn_tail";
  // Accounting mode: the same flush, pinner, merger and reclamation decide the same layout,
  // but pages are not written (nor the WAL, nor the metadata), merges find their records
  // through the key index instead of reading pages, and reads are costed with AccountScan.
  // Reaches dataset sizes the disk cannot hold; nothing survives close().
  bool accounting = false;
  uint32_t max_io_bytes = 256u << 10;     // largest coalesced read
  // Bytes of page reads a scan keeps in flight (at least one read; 0: up to queue_depth
  // reads). Enough to keep the device streaming, not more: a deeper queue only delays the
  // first completion, and a virtualised disk measured here completed 32 reads of a scan in
  // one burst, so decoding waited for the last read; with less in flight the completions
  // came steadily at the same throughput and decoding overlapped the reads. A scan on several
  // threads (scan_threads) splits it between them: the budget is the scan's.
  uint64_t read_inflight_bytes = 768u << 10;
  // Of that budget, what a scan on one lane (the scan's thread and one ring: a compacted or
  // small feature, several features at once, a key scan) keeps in flight (0: all of it). This
  // disk signals a batch of reads only when all of it is done, and such a scan's decoding
  // (checksums, copies) is cheap next to its reads: with a third of the budget the next
  // window is read while the last one is decoded. Measured alternating on the compaction
  // benchmark's compact() store, a pass over its 175 features took 59 ms with 256 KiB, 62 ms
  // with 384 KiB and 69 ms with all 768 KiB; its default store's small features 14.3 vs
  // 15.9 ms. (Since ReadRuns tapers the budget near the end, the taper alone gets most of
  // that on the compact() store; large packed features still gain, 62.7 vs 67.6 ms for a pass
  // over the scan benchmark's compacted store.) A scan on several lanes is CPU-bound
  // placement and shares the whole budget. On a device that completes reads one by one,
  // raise it to read_inflight_bytes.
  uint64_t single_lane_inflight_bytes = 256u << 10;
  // Microseconds a reading thread polls its completion queue before it sleeps in the kernel
  // for its reads (0: it sleeps at once). On the virtual machine measured here a thread woken
  // from that sleep by a completion loses ~20 us (interrupt, wake-up, reschedule) per wait:
  // with 300 us, hot passes over the compaction benchmark's stores took 22 % (compact()) and
  // 14 % (default) less time, at 50 % and 36 % more CPU (the polling burns what the sleep
  // saved). For latency-bound readers with cores to spare; off by default, since concurrent
  // readers (Ray read tasks) need the cores. At most 10,000.
  uint32_t read_poll_us = 0;
  // What a thread of a scan on several lanes (a large fragmented feature's: scan_threads)
  // polls before it sleeps, when read_poll_us is less. Such a scan already holds a helper
  // core, and its lanes wait for the device many times (a window of the first reads, then
  // each refill); woken from the kernel each time, they lost ~20 us a wait. The poll yields
  // the core every ~10 us (IoRing::Poll), so other runnable threads are not held off.
  // Measured on the compaction benchmark's default store, reading every scan both ways in one
  // process, as a share of the read sequence's time:
  //   300 us: 0.955 (scans of 16-64 pages 0.950, of 128+ pages 0.931); 100 us: 0.971;
  //   without the yield 0.937 and 0.956; ~10 % more CPU with 100 us.
  // 0: lane scans sleep at once. At most 10,000.
  uint32_t lane_read_poll_us = 300;
  // Threads that read and place the pages of one large fragmented feature (a scan through
  // the key index): the scan's own thread and scan_threads - 1 helpers, each reading its share
  // of the pages on a ring of its own and placing them, after the placement plan was made in
  // parts by all of them. Such scans are CPU-bound (planning and placing every record
  // through the index copy costs more than reading its bytes), so a second core halves the
  // work on the scan's path. 1: the scan's thread only (many concurrent readers, one core).
  unsigned scan_threads = 2;
  // Page slots that merges and rewrites free are kept allocated in the page file, up to this
  // many write buffers' worth, for the next flushes to overwrite in place; slots beyond it are
  // returned to the filesystem (hole punched), and close() returns them all. Punching a slot
  // that the next flush fills again costs a fresh allocation each time, and on a discarding
  // virtualised disk measured here the rewritten slots' first read ran at 0.4 x the speed of
  // slots overwritten in place. A flush frees about what it writes, so a couple of buffers
  // cover the steady state. 0: every freed slot is punched at once.
  double free_reserve_buffers = 2.0;
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
  // Device reads the pages took: runs of adjacent pages, each up to max_io_bytes, as the
  // scan coalesces them. On a device whose requests have a fixed cost, this and not only the
  // bytes sets the read time (a feature whose pages lie in many short runs reads slower per
  // byte than one in a few long runs).
  uint64_t read_requests = 0;
  uint64_t items = 0;
  double seconds = 0;
  // Of `seconds`, the time the reading thread was blocked waiting for the device's
  // completions (a scan on several threads: the scan's own thread). The rest is the engine's
  // work: planning, checksums, decoding and placing records.
  double io_wait_seconds = 0;
  // Most bytes of page reads the read had in flight at once (a scan on several threads: the
  // sum of its threads' peaks, an upper bound). At most read_inflight_bytes, or one read
  // when a single read (a run of adjacent pages, up to max_io_bytes) is larger.
  uint64_t peak_inflight_bytes = 0;

  // Another read of the same call (ScanMany's second pass): every field summed, the peak
  // the larger of the two.
  void Add(const ReadStats& o) {
    pages_read += o.pages_read;
    bytes_read += o.bytes_read;
    useful_bytes += o.useful_bytes;
    encoded_bytes += o.encoded_bytes;
    read_requests += o.read_requests;
    items += o.items;
    seconds += o.seconds;
    io_wait_seconds += o.io_wait_seconds;
    peak_inflight_bytes = std::max(peak_inflight_bytes, o.peak_inflight_bytes);
  }
};

// What a row gather did (see Store::GatherRows).
struct GatherStats {
  uint64_t rows = 0;          // unique rows requested (not counting rows the caller has)
  uint64_t buffer_rows = 0;   // served from the write buffer (updates not yet flushed)
  uint64_t vector_rows = 0;   // served by block-granular reads at a computed address
  uint64_t page_rows = 0;     // served by whole-page reads (rows not in the packed layout, rows of dense pages)
  uint64_t device_reads = 0;  // read requests issued
  uint64_t device_bytes = 0;  // bytes requested from the device
  uint64_t verified_blocks = 0;  // block reads checked against their block checksums
  uint64_t first_touch_pages = 0;  // packed pages read whole to take their block checksums
  uint64_t dense_pages = 0;        // packed pages read whole for dense_page_rows or more rows
  double seconds = 0;           // until the rows were complete
};

// One table's part of Store::GatherRowsMany.
struct GatherRequest {
  std::string feature;
  const uint64_t* ids = nullptr;  // ascending, unique
  size_t n = 0;
  float* out = nullptr;           // n x dim, written
  GatherStats* stats = nullptr;
  // Optional: have[i] != 0 — the caller already holds row i (a cache) in out. Such a row is
  // not read for itself: it counts towards its page's dense_page_rows (so a cache does not
  // thin out the pages that are read whole) and is rewritten from its page when that page is
  // read whole anyway; a page holding only such rows is not read.
  const uint8_t* have = nullptr;
};

class Store {
 public:
  static Status Open(const std::string& path, const StoreOptions& options, std::unique_ptr<Store>* out);
  virtual ~Store() = default;

  virtual Status CreateFeature(const std::string& name, const std::string& type, FeatureDef* out) = 0;
  virtual Status LookupFeature(const std::string& name, FeatureDef* out) = 0;
  virtual std::vector<FeatureDef> Features() = 0;

  // values: n * width bytes for fixed-width types; for variable-width types the bytes
  // delimited by byte offsets[0..n].
  virtual Status Put(const std::string& feature, const uint64_t* keys, size_t n, const uint8_t* values,
                     size_t values_len, const int64_t* offsets) = 0;
  virtual Status Delete(const std::string& feature, const uint64_t* keys, size_t n) = 0;
  // force: also write what the pinner holds (close() uses it).
  virtual Status Flush(bool force) = 0;
  // Full merge of the named features (all when empty): every page holding them is gathered
  // and their items rewritten packed, in key order — the read-optimal layout.
  virtual Status Compact(const std::vector<std::string>& features) = 0;
  virtual Status Sync() = 0;
  virtual Status Close() = 0;

  // Items with lo <= key < hi; hi == UINT64_MAX means "no upper bound" (the largest key
  // included), since a half-open range could not otherwise reach it.
  virtual Status ScanMany(const std::vector<std::string>& features, uint64_t lo, uint64_t hi,
                          std::vector<ColumnData>* out, ReadStats* st) = 0;
  // The keys of the feature's live items with lo <= key < hi (hi == UINT64_MAX: no upper
  // bound), ascending: exactly the keys ScanMany({feature}, lo, hi) returns, buffered writes
  // and deletes included, and no value read, decoded or copied. Served, cheapest first, from
  // the page table (a segment whose record count equals its key span and that holds no
  // tombstone has every key of its span: no page read), else from the key index when it
  // describes the snapshot without a page read (a writer's, decoded from the checkpoint if it
  // was kept encoded; a read-only handle's once built, or taken from a CHECKPOINT of its
  // snapshot), else by reading the remaining segments' pages and decoding their keys only.
  // `st` counts the pages read (none when the page table or the index served), 8 useful
  // bytes per key returned from the store's pages, and the keys.
  virtual Status ScanKeys(const std::string& feature, uint64_t lo, uint64_t hi, HVec<uint64_t>* keys,
                          ReadStats* st) = 0;
  virtual Status Get(const std::string& feature, const uint64_t* keys, size_t n, ColumnData* out, ReadStats* st) = 0;
  // What scanning a whole feature would read, from the metadata alone (no I/O): pages,
  // bytes, useful and encoded bytes. Works in both modes.
  virtual Status AccountScan(const std::string& feature, ReadStats* st) = 0;
  // Key range and record count of every page holding the feature in the current snapshot,
  // ascending by min_key (ranges may overlap where old versions are not yet merged). Used to
  // split a scan into key ranges of similar size; buffered items are not counted.
  virtual Status KeyRanges(const std::string& feature, std::vector<PageRef>* out) = 0;
  virtual bool read_only() const = 0;

  // Rows of an embedding table (a fixed_size_list<float32, D> feature) for `ids` (ascending,
  // unique) into out[n x D]. A row in a packed page (one feature, run keys, all valid — the
  // layout load + compact() produce) has a computed address, and vector_grained reads just
  // the device blocks holding it (a 128-byte row: one 512-byte read); other rows are found
  // through the key index and read with their page (checksum verified), buffered updates
  // come from DRAM. Block reads cannot verify a page checksum (it covers the whole page), so
  // with verify_block_reads they are checked against crc32c sums of their blocks taken from
  // a verified whole-page read of the same page version (BlockSums); a mismatch is a
  // Corruption naming the file, offset, page and row.
  //
  // dense_page_rows (with vector_grained; 0: never): a packed page from which the call needs
  // at least this many rows is read whole instead, with the call's other such pages in runs of
  // adjacent pages (one device read per run, page checksums verified), and the remaining rows
  // block by block. On the disk measured here a request costs about as much device time as
  // 8-16 KiB of transfer (random 512-byte reads ~100 k/s, sequential ~1.3-2.5 GB/s), so two
  // 512-byte reads cost more than one 16 KiB page read merged into a run: a batch that touches
  // most pages of a table then reads it at sequential bandwidth, not at the random-read IOPS.
  virtual Status GatherRows(const std::string& feature, const uint64_t* ids, size_t n, bool vector_grained,
                            uint32_t dense_page_rows, float* out, GatherStats* st) = 0;
  // Several tables' rows in one ring pass: all block reads are queued together (the queue
  // does not drain between tables) and `done(r)` runs as soon as request r's rows are all in
  // its `out`, while the reads of other requests are still in flight — so the caller's work
  // on r (pooling) overlaps the I/O. A request may name the same table as another.
  using GatherDoneFn = std::function<Status(size_t request)>;
  virtual Status GatherRowsMany(const std::vector<GatherRequest>& requests, bool vector_grained,
                                uint32_t dense_page_rows, const GatherDoneFn& done) = 0;
  // Reads every packed page of an embedding table whose block checksums are not held yet
  // (whole pages, large coalesced reads, page checksums verified) and takes their block
  // checksums, so later block-granular reads of the table are verified without a first-touch
  // page read. Returns the pages read.
  virtual Status VerifyRows(const std::string& feature, uint64_t* pages_read) = 0;
  // A read-only handle counts every record of its pages as valid until it has the key
  // index (stats: items_exact false); this takes it now — from CHECKPOINT when it matches the
  // snapshot, else (with read_pages) by reading every live page — so counts are exact. A
  // writer's already are.
  virtual Status BuildKeyIndex(bool read_pages) = 0;
  virtual uint32_t block_size() const = 0;

  virtual std::string StatsJson() = 0;
  virtual Status CheckOpenStatus() = 0;
  virtual const std::string& path() const = 0;
  virtual uint32_t page_size() const = 0;
};

}  // namespace recflash
