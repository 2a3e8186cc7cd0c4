#include "reader/csrc/store_impl.h"

#include "reader/csrc/file_util.h"
#include "reader/csrc/store_internal.h"

#include <fcntl.h>
#include <sys/file.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <thread>

namespace recflash {

namespace fs = std::filesystem;
using namespace store_internal;

namespace {
bool WriterHoldsLock(const std::string& path);               // below
std::vector<std::string> MetaLogFiles(const std::string& dir);  // below

// Writes the store's marker (magic, this build's format, the page size) atomically: a
// temporary file renamed over it, the directory synced.
Status WriteMarker(const std::string& path, uint32_t page_size) {
  const std::string tmp = StoreFileName(path, FileKind::kMarkerTemp);
  {
    std::ofstream m(tmp, std::ios::trunc);
    m << kMarkerMagic << "\nformat " << kFormatVersion << "\npage_size " << page_size << "\n";
    m.flush();
    if (!m) return Status::IOError("cannot write '" + tmp + "'");
  }
  const std::string marker = StoreFileName(path, FileKind::kMarker);
  if (::rename(tmp.c_str(), marker.c_str()) != 0) return Status::FromErrno("rename", tmp, errno);
  return SyncDir(path);
}
}  // namespace

// ---------------------------------------------------------------------------------------
// Open / recovery

Status Store::Open(const std::string& path, const StoreOptions& options, std::unique_ptr<Store>* out) {
  // A read-only open races a live writer (a WAL file retired between listing and reading
  // it): it then simply takes a newer snapshot.
  const int attempts = options.read_only ? 5 : 1;
  Status st;
  for (int i = 0; i < attempts; i++) {
    std::unique_ptr<StoreImpl> s(new StoreImpl(options));
    st = s->OpenImpl(path);
    if (st.ok()) {
      *out = std::move(s);
      return Status::OK();
    }
    // Nothing to flush, but the files and the LOCK go now: a caller may retry the open (with
    // other options) in this process.
    s->closed_ = true;
    s->ReleaseResources();
    if (st.code() != Status::Code::kStale) break;
  }
  return st;
}

namespace {

// The tuning knobs' ranges: a value outside one (a negative fraction, NaN, a threshold below
// the ideal layout) would not fail anything at once, only make the merger, pinner or
// reclamation behave in ways nobody chose.
Status CheckTuningOptions(const StoreOptions& o) {
  auto num = [](double v) {
    std::ostringstream os;
    os << v;
    return os.str();
  };
  struct Range {
    const char* name;
    double value, lo, hi;  // hi 0: no upper bound (but finite)
    const char* what;
  };
  const Range ranges[] = {
      {"pin_budget_frac", o.pinner.budget_frac, 0, 1, "a fraction of the write buffer"},
      {"pin_threshold_frac", o.pinner.threshold_frac, 0, 1, "a fraction of a page"},
      {"merge_threshold", o.merger.threshold, 1, 0, "a fragmentation degree: pages held / ideal pages"},
      {"merge_threshold_bulk_load", o.merger.bulk_load_threshold, 1, 0, "a fragmentation degree"},
      {"merge_target_frac", o.merger.target_frac, 0, 1, "a fraction"},
      {"merge_low_benefit_frac", o.merger.low_benefit_frac, 0, 1, "a fraction of a page"},
      {"merge_min_slack_pages", o.merger.min_slack_pages, 0, 0, "pages"},
      {"merge_run_weight", o.merger.run_weight, 0, 0, "a weight"},
      {"space_amp_limit", o.reclaim.space_amp_limit, 1, 0, "pages in use / pages the live data needs"},
      {"space_amp_target", o.reclaim.space_amp_target, 1, 0, "pages in use / pages the live data needs"},
  };
  for (const Range& r : ranges) {
    const bool ok = r.value >= r.lo && std::isfinite(r.value) && (r.hi == 0 || r.value <= r.hi);  // NaN fails
    if (!ok)
      return Status::InvalidArgument(std::string(r.name) + " " + num(r.value) + " must be " +
                                     (r.hi == 0 ? "a finite value >= " + num(r.lo)
                                                : "in [" + num(r.lo) + ", " + num(r.hi) + "]") +
                                     " (" + r.what + ")");
  }
  if (o.reclaim.space_amp_target > o.reclaim.space_amp_limit)
    return Status::InvalidArgument("space_amp_target " + num(o.reclaim.space_amp_target) +
                                   " must not exceed space_amp_limit " + num(o.reclaim.space_amp_limit));
  if (o.max_io_bytes == 0) return Status::InvalidArgument("max_io_bytes must be at least 1 (rounded up to one page)");
  return Status::OK();
}

}  // namespace

Status StoreImpl::OpenImpl(const std::string& path) {
  const uint32_t ps = o_.page_size;
  if (ps < 4096 || ps > (1u << 20) || (ps & (ps - 1)) != 0)
    return Status::InvalidArgument("page_size " + std::to_string(ps) + " must be a power of two in [4096, 1 MiB]");
  if (o_.write_buffer_bytes < 4ull * ps)
    return Status::InvalidArgument("write_buffer_bytes " + std::to_string(o_.write_buffer_bytes) +
                                   " must be at least 4 pages (" + std::to_string(4ull * ps) + ")");
  if (o_.queue_depth < 1 || o_.queue_depth > 4096) return Status::InvalidArgument("queue_depth must be in [1, 4096]");
  if (o_.build_threads < 1 || o_.build_threads > 64) return Status::InvalidArgument("build_threads must be in [1, 64]");
  if (o_.scan_threads < 1 || o_.scan_threads > 16) return Status::InvalidArgument("scan_threads must be in [1, 16]");
  if (o_.read_poll_us > 10000) return Status::InvalidArgument("read_poll_us must be in [0, 10000]");
  if (o_.lane_read_poll_us > 10000) return Status::InvalidArgument("lane_read_poll_us must be in [0, 10000]");
  RF_RETURN_IF_ERROR(CheckTuningOptions(o_));
  if (o_.wal_recovery != "tolerate_torn_tail" && o_.wal_recovery != "point_in_time")
    return Status::InvalidArgument("wal_recovery '" + o_.wal_recovery +
                                   "' must be 'tolerate_torn_tail' or 'point_in_time'");
  if (!(o_.free_reserve_buffers >= 0 && o_.free_reserve_buffers <= 1024))  // also rejects NaN
    return Status::InvalidArgument("free_reserve_buffers " + std::to_string(o_.free_reserve_buffers) +
                                   " must be in [0, 1024] write buffers");
  path_ = path;
  std::error_code ec;
  const fs::path root(path);
  if (fs::exists(root, ec) && !fs::is_directory(root, ec))
    return Status::NotAStore("'" + path + "' is not a recflash store: it exists and is not a directory");
  if (o_.read_only && o_.accounting)
    return Status::InvalidArgument("store '" + path + "': read_only and accounting cannot be combined");
  if (o_.read_only && !fs::exists(StoreFileName(path, FileKind::kMarker), ec))
    return Status::NotAStore("'" + path + "' is not a recflash store (no " + FileBaseName(FileKind::kMarker) +
                             " marker): a read-only open needs an existing store");
  if (!fs::exists(root, ec)) {
    fs::create_directories(root, ec);
    if (ec) return Status::IOError("cannot create store directory '" + path + "': " + ec.message());
  }
  const fs::path marker = StoreFileName(path, FileKind::kMarker);
  int marker_format = 0;  // the format the store's marker names
  if (!fs::exists(marker, ec)) {
    std::vector<std::string> found;
    for (const auto& e : fs::directory_iterator(root, ec)) {
      if (found.size() < 5) found.push_back(e.path().filename().string());
    }
    if (!found.empty()) {
      std::string list;
      for (const auto& f : found) list += (list.empty() ? "" : ", ") + f;
      return Status::NotAStore("'" + path + "' is not a recflash store: no " + FileBaseName(FileKind::kMarker) +
                               " marker, and the directory is not empty (" + list + ")");
    }
    RF_RETURN_IF_ERROR(WriteMarker(path, ps));
    marker_format = kFormatVersion;
  } else {
    std::ifstream m(marker);
    std::string line, magic;
    int format = -1;
    uint32_t stored_ps = 0;
    std::getline(m, magic);
    while (std::getline(m, line)) {
      std::istringstream ls(line);
      std::string k;
      ls >> k;
      if (k == "format") ls >> format;
      if (k == "page_size") ls >> stored_ps;
    }
    if (magic != kMarkerMagic || format < 0 || stored_ps == 0)
      return Status::NotAStore("'" + path + "' is not a recflash store: " + marker.string() + " is malformed");
    if (format < kMinFormatVersion || format > kFormatVersion)
      return Status::NotAStore("'" + path + "' has store format " + std::to_string(format) + "; this build reads formats " +
                               std::to_string(kMinFormatVersion) + " to " + std::to_string(kFormatVersion));
    o_.page_size = stored_ps;  // the page size is fixed at creation
    marker_format = format;
  }

  // Parked helpers: the lanes of index placement (scan_threads - 1 per scan), and the sweep and
  // populator of a dense placement (two per scan) for two scans at a time.
  if (o_.scan_threads > 1 && !o_.accounting)
    lane_helpers_ = std::make_unique<LaneHelpers>(std::max<unsigned>(o_.scan_threads - 1, 4));
  if (o_.read_only) {
    // No LOCK: readers coexist with each other and with one writer. Safety comes from the
    // snapshot (metadata as of the open) and the per-read seq check, not from locking.
    wal_dir_ = StoreFileName(path, FileKind::kWalDir);
    // RocksDB's read-only open reads the MANIFEST, then opens the files it names; a writer's
    // metadata flush or compaction (every clean close moves the log into a table file)
    // deletes obsolete ones meanwhile. While a writer holds the LOCK that is a stale snapshot
    // (Store::Open reopens); with none, the files stay put now, so one more open tells a writer
    // that closed meanwhile from a file really missing (then the error stands).
    const std::string meta_dir = StoreFileName(path, FileKind::kMetaDir);
    std::vector<std::string> logs_before = MetaLogFiles(meta_dir);
    Status ms = meta_.Open(meta_dir, false, true);
    for (int i = 0; i < 2 && !ms.ok() && meta_.open_missed_file(); i++) {
      if (WriterHoldsLock(path))
        return Status::Stale("store '" + path + "': a file of its metadata database was gone when this read-only "
                             "open read it, while a writer holds the store's LOCK (its metadata flush or compaction "
                             "retired the file): " + ms.message() + "; reopen");
      logs_before = MetaLogFiles(meta_dir);
      ms = meta_.Open(meta_dir, false, true);
    }
    RF_RETURN_IF_ERROR(ms);
    {
      // RocksDB's open replayed the logs into memory: a log retired since this open began may
      // have been missed by it (MetaLogFiles), and then the snapshot is not to be trusted.
      const std::vector<std::string> logs_after = MetaLogFiles(meta_dir);
      for (const std::string& l : logs_before)
        if (!std::binary_search(logs_after.begin(), logs_after.end(), l))
          return Status::Stale("store '" + path + "': a writer moved its metadata log '" + l + "' into a table file "
                               "while this read-only open read the metadata, which may then lack that log's "
                               "commits; reopen");
    }
    pages_path_ = StoreFileName(path, FileKind::kPages);
    if (!fs::exists(pages_path_, ec))  // a writable open creates it with the store
      return Status::Corruption("store '" + path + "': '" + pages_path_ +
                                "' is missing: the page file was truncated, replaced or recreated (deleted)");
    RF_RETURN_IF_ERROR(file_.Open(pages_path_, o_.page_size, o_.direct_io, true));
    const uint32_t slot_bytes = PagesPerRead() * o_.page_size;
    rings_ = IoRingPool::Shared(o_.queue_depth, slot_bytes);
    RF_RETURN_IF_ERROR(rings_->Acquire(&write_ring_, /*reads=*/false));
    block_rings_ = IoRingPool::Shared(128, 4096);
    MutexLock wl(&write_mu_);  // nothing else can reach the store yet; the tables' rule holds anyway
    return RecoverReadOnly();
  }

  const std::string lock_path = StoreFileName(path, FileKind::kLock);
  lock_fd_ = ::open(lock_path.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0644);
  if (lock_fd_ < 0) return Status::FromErrno("open", lock_path, errno);
  if (::flock(lock_fd_, LOCK_EX | LOCK_NB) != 0) {
    ::close(lock_fd_);
    lock_fd_ = -1;
    return Status::Locked("store '" + path + "' is already open for writing (its LOCK is held by another process or "
                          "another Store object in this process)");
  }
  // A writer of this build may write what older formats do not know (dictionary pages, the
  // WAL rules of format 5), so the marker says this format before anything is written: an
  // older build then refuses the store by its format instead of misreading it.
  if (marker_format < kFormatVersion) RF_RETURN_IF_ERROR(WriteMarker(path, o_.page_size));

  wal_dir_ = StoreFileName(path, FileKind::kWalDir);
  wal_dir_created_ = !fs::exists(wal_dir_, ec);
  fs::create_directories(wal_dir_, ec);
  if (ec) return Status::IOError("cannot create '" + wal_dir_ + "': " + ec.message());
  RF_RETURN_IF_ERROR(meta_.Open(StoreFileName(path, FileKind::kMetaDir), true));
  pages_path_ = StoreFileName(path, FileKind::kPages);
  if (fs::exists(pages_path_, ec) && !fs::is_regular_file(pages_path_, ec))
    return Status::Corruption("store '" + path + "': '" + pages_path_ + "' is not a regular file");
  RF_RETURN_IF_ERROR(file_.Open(pages_path_, o_.page_size, o_.direct_io));
  // The entries of pages.dat, wal/ and meta/ in the store directory must be durable before
  // anything in them is: a power loss after a new store's first flush could otherwise leave
  // committed metadata naming pages of a pages.dat that never reached the directory.
  RF_RETURN_IF_ERROR(SyncDir(path));
  const uint32_t slot_bytes = PagesPerRead() * o_.page_size;
  rings_ = IoRingPool::Shared(o_.queue_depth, slot_bytes);
  RF_RETURN_IF_ERROR(rings_->Acquire(&write_ring_, /*reads=*/false));
  // Vector-grained reads: 4 KiB slots, 128 in flight. On the virtio disk measured here 256
  // in flight was no faster (fio and the raw io_uring reference at QD256 trailed QD128).
  block_rings_ = IoRingPool::Shared(128, 4096);
  if (o_.verify_block_reads && !o_.accounting) block_sums_ = std::make_unique<BlockSums>(o_.page_size, block_size_);
  MutexLock wl(&write_mu_);  // nothing else can reach the store yet; the tables' rule holds anyway
  RF_RETURN_IF_ERROR(Recover());
  ReturnLeftoverSlotsLocked();
  return Status::OK();
}

Status StoreImpl::LoadTables(uint32_t* max_pid) {
  bool found = false;
  RF_RETURN_IF_ERROR(meta_.LoadState(&pstate_, &found));
  opened_seq_ = pstate_.next_seq;
  // The WAL directory is made before the first commit: a committed state without it means it
  // was deleted, and with it whatever was logged but not yet flushed.
  if (found && (o_.read_only ? !fs::exists(wal_dir_) : wal_dir_created_)) {
    std::error_code ec;
    if (wal_dir_created_) fs::remove(wal_dir_, ec);  // the empty one this open made: the next open says so too
    return Status::Corruption("store '" + path_ + "': its WAL directory '" + wal_dir_ +
                              "' is missing although the metadata holds committed state: items logged since the "
                              "last flush are lost");
  }
  if (!found && !o_.accounting) {
    // The state record is committed with the first feature and every flush: pages without
    // it mean RocksDB lost committed records (a damaged or truncated log or table), not a
    // new store. Opening as empty would silently drop everything.
    uint64_t slots = 0;
    RF_RETURN_IF_ERROR(file_.SlotCount(&slots));
    if (slots > 0) {
      // RocksDB's read-only view of a database that a writer is flushing or closing need not
      // be consistent (the writer deletes the log it had just moved into a table, which the
      // read-only open had listed): a state record missing then is the race, not damage.
      // Seen once in ~2,200 opens beside a writer that opens, writes and closes in a loop.
      if (o_.read_only && WriterMovedOn())
        return Status::Stale("store '" + path_ + "': its metadata database showed no state record while a writer "
                             "was changing it; reopen");
      return Status::Corruption("metadata database of store '" + path_ + "' holds no state record but pages.dat spans " +
                                std::to_string(slots) + " pages: the RocksDB directory is damaged");
    }
  }
  std::vector<FeatureDef> defs;
  RF_RETURN_IF_ERROR(meta_.LoadFeatures(&defs));
  for (const auto& d : defs) {
    FeatureState* f = features_.Add(d);
    f->index.track_lengths(d.variable());
    MutexLock l(&mu_);
    defs_[d.name] = d;
  }
  std::vector<std::pair<uint32_t, PageMeta>> pages;
  RF_RETURN_IF_ERROR(meta_.LoadPages(&pages));
  *max_pid = 0;
  for (auto& [pid, pm] : pages) {
    for (const auto& sm : pm.segs)
      if (!features_.Get(sm.fid))
        return Status::Corruption("page record " + std::to_string(pid) + " names unknown feature id " +
                                  std::to_string(sm.fid) + " in '" + path_ + "'");
    pages_.MarkLive(pid, pm.seq, std::move(pm.segs));
    *max_pid = std::max(*max_pid, pid + 1);
  }
  return Status::OK();
}

namespace {

// The metadata database's log files (RocksDB's WAL, "<number>.log"), sorted. RocksDB's
// read-only open reads the MANIFEST, then replays the logs from the one it names on; a
// writer's metadata flush (every clean close moves the log into a table file) records the
// table in the MANIFEST and then deletes the log. Between the open's two reads it sees neither:
// its snapshot lacks the commits that log held while it has the later log's — a page table
// with pages missing whose keys reads then silently miss. A log there before the open and gone
// after it is how that shows (OpenImpl retries the open then).
std::vector<std::string> MetaLogFiles(const std::string& dir) {
  std::vector<std::string> logs;
  std::error_code ec;
  for (const auto& e : fs::directory_iterator(dir, ec)) {
    const std::string n = e.path().filename().string();
    if (n.size() > 4 && n.compare(n.size() - 4, 4, ".log") == 0) logs.push_back(n);
  }
  std::sort(logs.begin(), logs.end());
  return logs;
}

// Whether a writer holds the store's LOCK now (for a read-only handle, which takes no lock: a
// shared probe that is released at once, on a LOCK it does not create).
bool WriterHoldsLock(const std::string& path) {
  const int fd = ::open(StoreFileName(path, FileKind::kLock).c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return false;
  const bool held = ::flock(fd, LOCK_SH | LOCK_NB) != 0 && errno == EWOULDBLOCK;
  ::close(fd);  // releases a shared lock taken
  return held;
}

}  // namespace

bool StoreImpl::WriterMovedOn() {
  if (WriterHoldsLock(path_)) return true;
  // No writer now, but one may have committed and closed (releasing the LOCK) while this open
  // read the files its snapshot names: a committed state other than the snapshot's says so.
  // (A writer commits its metadata only after what the commit names is durable, and deletes
  // the WAL files below its new wal_start only after the commit.)
  // The re-read can itself meet a writer retiring a metadata file that RocksDB's read-only
  // open listed (a flush or compaction of the metadata, every clean close): it is tried again
  // a few times before an unreadable state counts as unchanged (the caller then reports damage).
  for (int attempt = 0; attempt < 3; attempt++) {
    if (attempt) std::this_thread::sleep_for(std::chrono::milliseconds(20));
    PersistentState now;
    if (MetaStore::ReadCurrentState(StoreFileName(path_, FileKind::kMetaDir), &now).ok())
      return now != pstate_;
  }
  return false;
}

Status StoreImpl::Recover() {
  const double t0 = Now();
  uint32_t max_pid = 0;
  RF_RETURN_IF_ERROR(LoadTables(&max_pid));
  if (o_.accounting && max_pid > 0)
    return Status::InvalidArgument("accounting mode needs a new store; '" + path_ + "' already holds pages");
  uint64_t slots = 0;
  RF_RETURN_IF_ERROR(file_.SlotCount(&slots));
  RF_RETURN_IF_ERROR(CheckPagesWithinFile(max_pid, slots));
  pages_.EnsureSlots(static_cast<uint32_t>(std::max<uint64_t>(slots, max_pid)));
  for (uint32_t p = 0; p < pages_.slots(); p++)
    if (!pages_.at(p).live) pages_.AddFree(p);

  opened_from_checkpoint_ = LoadCheckpoint();
  // A checkpoint that loaded stays until the first commit (CommitMetaLocked); one that did
  // not (another state, damaged) goes now.
  checkpoint_current_ = opened_from_checkpoint_;
  if (!checkpoint_current_) RF_RETURN_IF_ERROR(RetireCheckpointLocked());
  if (!opened_from_checkpoint_) RF_RETURN_IF_ERROR(RebuildFromPages());
  // A feature with nothing stored starts deferred (see KeyIndex).
  for (FeatureState* f : features_.All())
    if (f->pages.empty() && f->index.size() == 0 && !o_.accounting) f->index.Defer();

  WalReplay replay;
  RF_RETURN_IF_ERROR(ReplayWal(&replay));
  // The session logs to the last WAL file when that is empty (the fresh file of a session that
  // wrote nothing, or of a flush that pinned nothing), else to a new one right after it: the
  // files from wal_start on stay consecutive, and only the last is ever empty.
  wal_number_ = replay.last_empty ? replay.last_number : std::max(replay.last_number, pstate_.wal_start - 1) + 1;
  RF_RETURN_IF_ERROR(wal_.Open(WalFileName(wal_dir_, wal_number_)));
  RF_RETURN_IF_ERROR(SyncDir(wal_dir_));
  // Only a point_in_time open that dropped the newest files (or left them missing) gets here
  // with a newer file on record: that point becomes the store's state before it logs anything,
  // or the next default open would refuse the files this one dropped.
  if (pstate_.wal_last > wal_number_) RF_RETURN_IF_ERROR(RecordWalLastLocked());
  // What this session's commits may claim (PersistentState): the wal_start file is there, and
  // the files from it to wal_number_ are consecutive. A store last committed by an older
  // version may miss either (an empty file unlinked at its open): its commits keep saying so
  // until the first flush starts a fresh run of files.
  const bool start_there = replay.start_listed || wal_number_ == pstate_.wal_start;
  pstate_.wal_start_kept = start_there;
  pstate_.wal_files_consecutive = start_there && replay.consecutive;
  {
    MutexLock l(&mu_);  // no reader yet, but the rule for what readers reach holds anyway
    versions_.AssertHeld();
    versions_.InstallLocked(BuildVersion(1, features_, pages_));
  }
  recovery_seconds_ = Now() - t0;
  // A replayed buffer at or above write_buffer_bytes is flushed by the next write, not here:
  // the store must open (to be read, and to take the deletes that free space) also on a full
  // disk, where this flush would fail.
  return Status::OK();
}

Status StoreImpl::CheckPagesWithinFile(uint32_t max_pid, uint64_t slots) {
  // Committed pages were synced before their commit, and only free slots are ever trimmed:
  // a live page past the end means pages.dat was cut, replaced or recreated (or the marker's
  // page size changed), and every read of those pages would fail.
  if (max_pid <= slots) return Status::OK();
  const std::string msg = "store '" + path_ + "': the metadata lists page " + std::to_string(max_pid - 1) + " but '" +
                          pages_path_ + "' holds " + std::to_string(slots) + " pages of " +
                          std::to_string(o_.page_size) + " bytes";
  if (o_.read_only && WriterMovedOn())  // the writer may have freed and trimmed them since
    return Status::Stale(msg + " (a writer moved on, or the file was cut); reopen");
  return Status::Corruption(msg + ": the page file was truncated, replaced or recreated");
}

Status StoreImpl::RecoverReadOnly() {
  const double t0 = Now();
  uint32_t max_pid = 0;
  RF_RETURN_IF_ERROR(LoadTables(&max_pid));
  uint64_t slots = 0;
  RF_RETURN_IF_ERROR(file_.SlotCount(&slots));
  RF_RETURN_IF_ERROR(CheckPagesWithinFile(max_pid, slots));
  {
    MutexLock l(&mu_);
    ResetDerivedLocked();
  }
  // Derived state without reading pages. Counts in stats() are then upper bounds until
  // EnsureKeyIndex() runs.
  DeriveAllValid();
  key_index_ready_ = false;
  WalReplay replay;
  RF_RETURN_IF_ERROR(ReplayWal(&replay));
  {
    MutexLock l(&mu_);  // no reader yet, but the rule for what readers reach holds anyway
    versions_.AssertHeld();
    versions_.InstallLocked(BuildVersion(1, features_, pages_));
  }
  recovery_seconds_ = Now() - t0;
  return Status::OK();
}

Status StoreImpl::ExplainReadFailure(const Status& s) {
  if (!o_.read_only || s.code() != Status::Code::kCorruption) return s;
  // A page that fails verification under a read-only handle is most likely one a writer
  // rewrote, punched or is writing since this snapshot: the committed state moved on. Check
  // twice, since a writer commits its metadata only after its pages are durable.
  for (int i = 0; i < 2; i++) {
    PersistentState now;
    if (MetaStore::ReadCurrentState(StoreFileName(path_, FileKind::kMetaDir), &now).ok() && now.next_seq != opened_seq_)
      return Status::Stale("store '" + path_ + "' was changed by a writer since this read-only handle opened (" +
                           s.message() + "); reopen the store to read the current data");
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
  }
  return s;
}

}  // namespace recflash
