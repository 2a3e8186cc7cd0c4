#include "reader/csrc/store_impl.h"

#include "reader/csrc/crc32c.h"
#include "reader/csrc/fault_injection.h"
#include "reader/csrc/file_util.h"
#include "reader/csrc/page_map.h"
#include "reader/csrc/store_internal.h"

#include <fcntl.h>
#include <sys/file.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/uio.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <numeric>
#include <sstream>
#include <thread>
#include <unordered_map>

namespace recflash {

// The checkpoint file's first word (its header: magic, next seq, live pages).
constexpr uint64_t kCheckpointMagic = 0x33544b4348434652ull;  // "RFCHCKT3": compact key index form

namespace fs = std::filesystem;
using namespace store_internal;

namespace {
bool WriterHoldsLock(const std::string& path);  // below
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
    const std::string tmp = StoreFileName(path, FileKind::kMarkerTemp);
    {
      std::ofstream m(tmp, std::ios::trunc);
      m << kMarkerMagic << "\nformat " << kFormatVersion << "\npage_size " << ps << "\n";
      m.flush();
      if (!m) return Status::IOError("cannot write '" + tmp + "'");
    }
    if (::rename(tmp.c_str(), marker.c_str()) != 0) return Status::FromErrno("rename", tmp, errno);
    RF_RETURN_IF_ERROR(SyncDir(path));
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
    Status ms = meta_.Open(StoreFileName(path, FileKind::kMetaDir), false, true);
    for (int i = 0; i < 2 && !ms.ok() && meta_.open_missed_file(); i++) {
      if (WriterHoldsLock(path))
        return Status::Stale("store '" + path + "': a file of its metadata database was gone when this read-only "
                             "open read it, while a writer holds the store's LOCK (its metadata flush or compaction "
                             "retired the file): " + ms.message() + "; reopen");
      ms = meta_.Open(StoreFileName(path, FileKind::kMetaDir), false, true);
    }
    RF_RETURN_IF_ERROR(ms);
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
    if (slots > 0)
      return Status::Corruption("metadata database of store '" + path_ + "' holds no state record but pages.dat spans " +
                                std::to_string(slots) + " pages: the RocksDB directory is damaged");
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
      return now.next_seq != pstate_.next_seq || now.wal_start != pstate_.wal_start;
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

void StoreImpl::DeriveAllValid() {
  for (uint32_t p = 0; p < pages_.slots(); p++) {
    PageMeta& pm = pages_.at(p);
    if (!pm.live) continue;
    for (auto& sm : pm.segs) {
      if (sm.retired) continue;
      FeatureState* f = features_.Get(sm.fid);
      const uint32_t w = f->def.fixed_width();
      const uint32_t items = sm.count - sm.tombs;
      sm.valid = sm.count;
      sm.valid_bytes = w ? static_cast<uint64_t>(items) * ItemBytes(w) : static_cast<uint64_t>(items) * 8 + sm.length;
      f->pages.push_back(p);
      f->live_items += items;
      f->live_bytes += sm.valid_bytes;
      f->tombs += sm.tombs;
    }
  }
}

void StoreImpl::ResetDerivedLocked() {
  for (FeatureState* f : features_.All()) {
    f->index = KeyIndex();
    f->index.track_lengths(f->def.variable());
    f->index_lazy = false;
    f->index_blob.clear();
    f->index_ranges.clear();
    f->pages.clear();
    f->live_items = f->live_bytes = f->tombs = 0;
  }
  for (uint32_t p = 0; p < pages_.slots(); p++)
    for (auto& sm : pages_.at(p).segs) {
      sm.valid = 0;
      sm.valid_bytes = 0;
    }
}

Status StoreImpl::EnsureKeyIndex() {
  MutexLock wl(&write_mu_);
  if (key_index_ready_) return Status::OK();
  // The checkpoint describes the state at a writer's clean close; it is used only when its
  // seq and page count match this snapshot, else the pages are read.
  if (SwapInCheckpointIndex()) return Status::OK();
  {
    MutexLock l(&mu_);
    ResetDerivedLocked();
  }
  Status s = RebuildFromPages();
  if (!s.ok()) return ExplainReadFailure(s);
  auto v = BuildVersion(versions_.current()->number + 1, features_, pages_);
  MutexLock l(&mu_);
  versions_.AssertHeld();
  versions_.InstallLocked(v);
  key_index_ready_ = true;
  return Status::OK();
}

Status StoreImpl::TryKeyIndexFromCheckpoint() {
  if (checkpoint_index_tried_.load(std::memory_order_acquire)) return Status::OK();
  MutexLock wl(&write_mu_);
  if (!key_index_ready_ && !checkpoint_index_tried_.load(std::memory_order_relaxed)) SwapInCheckpointIndex();
  checkpoint_index_tried_.store(true, std::memory_order_release);
  return Status::OK();
}

bool StoreImpl::SwapInCheckpointIndex() {
  // The header names the state the checkpoint describes: without one of this snapshot the
  // derived state is not touched at all (a writer is open and retired it, or wrote since).
  uint64_t head[3];
  if (!ReadFilePrefix(StoreFileName(path_, FileKind::kCheckpoint), head, sizeof(head)) ||
      head[0] != kCheckpointMagic || head[1] != pstate_.next_seq || head[2] != pages_.live_pages())
    return false;
  // Scans read the feature states under mu_ and decode indexes under lazy_mu_: both are held
  // while the derived state is replaced, so no reader sees it half way.
  MutexLock zl(&lazy_mu_);
  MutexLock l(&mu_);
  versions_.AssertHeld();
  ResetDerivedLocked();
  if (!LoadCheckpoint()) {  // damaged or disagreeing: back to what the open derived
    ResetDerivedLocked();
    DeriveAllValid();
    return false;
  }
  versions_.InstallLocked(BuildVersion(versions_.current()->number + 1, features_, pages_));
  opened_from_checkpoint_ = true;
  key_index_ready_ = true;
  return true;
}

FeatureState* StoreImpl::FeatureStateFor(uint32_t fid) {
  MutexLock l(&mu_);
  return const_cast<FeatureState*>(ReaderFeatures().Get(fid));  // LoadIndex fills it, under lazy_mu_
}

StoreImpl::PendingIndex StoreImpl::IndexPending(FeatureState* f, uint64_t* entries) {
  MutexLock l(&lazy_mu_);
  if (!f->index_lazy) return PendingIndex::kDecodeNow;
  if (KeyIndex::SerializedDense(f->index_blob)) return PendingIndex::kDense;
  const char* p = f->index_blob.data();
  KeyIndex::Summary sum;
  // Key runs or raw keys only; a deferred index, or a blob that does not parse, is left to
  // LoadIndex (cheap for the one, an error naming the feature and the file for the other).
  if (!KeyIndex::Skip(&p, p + f->index_blob.size(), &sum) || (sum.mode != 0 && sum.mode != 3))
    return PendingIndex::kDecodeNow;
  *entries = sum.entries;
  return PendingIndex::kKeys;
}

Status StoreImpl::LoadIndex(FeatureState* f) {
  MutexLock l(&lazy_mu_);
  if (!f->index_lazy) return Status::OK();
  const char* p = f->index_blob.data();
  const char* end = p + f->index_blob.size();
  KeyIndex idx;
  if (!idx.Deserialize(&p, end) || p != end)
    return Status::Corruption("checkpoint key index of feature '" + f->def.name + "' in '" + path_ +
                              "' does not decode");
  // Each key must fall in the key range of the segment its location names (LoadCheckpoint
  // checked the locations and counts; the keys are only decoded here).
  const std::vector<FeatureState::SegmentRange>& ranges = f->index_ranges;
  const PageMap range_of(ranges.size(), [&](size_t x) { return ranges[x].page; }, idx.size());
  // Consecutive keys of a fragmented feature mostly name different pages, so the check runs
  // without branches on the data: each entry's range bounds by table lookup (a page with no
  // segment gets bounds no key meets), the verdicts OR-ed; the first offender is looked for
  // only when one exists. A feature's first scan after an open pays for this decode.
  const size_t nr = ranges.size();
  std::vector<uint64_t> lo(nr + 1, UINT64_MAX), hi(nr + 1, 0);
  for (size_t x = 0; x < nr; x++) lo[x] = ranges[x].min_key, hi[x] = ranges[x].max_key;
  auto bounds_of = [&](uint32_t loc) {
    const int32_t x = range_of.Find(loc & ~KeyIndex::kTomb);
    return x < 0 ? nr : static_cast<size_t>(x);
  };
  uint64_t bad = 0;
  for (size_t i = 0; i < idx.size(); i++) {
    const size_t x = bounds_of(idx.loc(i));
    const uint64_t k = idx.key(i);
    bad |= static_cast<uint64_t>(k < lo[x]) | static_cast<uint64_t>(k > hi[x]);
  }
  if (bad) {
    for (size_t i = 0; i < idx.size(); i++) {
      const size_t x = bounds_of(idx.loc(i));
      const uint64_t k = idx.key(i);
      if (k < lo[x] || k > hi[x])
        return Status::Corruption("checkpoint key index of feature '" + f->def.name + "' in '" + path_ +
                                  "' places key " + std::to_string(k) + " in page " +
                                  std::to_string(idx.loc(i) & ~KeyIndex::kTomb) + ", whose segment does not cover it");
    }
  }
  {
    MutexLock ml(&mu_);  // get() reads indexes under mu_
    f->index = std::move(idx);
    f->index_lazy = false;
  }
  std::string().swap(f->index_blob);
  std::vector<FeatureState::SegmentRange>().swap(f->index_ranges);
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

// About 150 lines on purpose: deciding which features stay deferred, reading the other
// features' pages, resolving the newest version per key and retiring emptied segments form one
// pass over the same per-feature record lists; recovery reads best as one sequence.
Status StoreImpl::RebuildFromPages() {
  struct R {
    uint64_t key;
    uint64_t seq;
    uint32_t pid;
    uint32_t len;
    bool tomb;
  };
  const size_t nfid = features_.All().empty() ? 0 : features_.All().back()->def.id + 1;
  std::vector<std::vector<R>> recs(nfid);
  std::vector<uint32_t> live;
  for (uint32_t p = 0; p < pages_.slots(); p++)
    if (pages_.at(p).live) live.push_back(p);
  const uint32_t ps = o_.page_size;

  // A fixed-width feature whose live segments hold pairwise disjoint key ranges and no
  // tombstones has exactly one version of each key, all valid: its state follows from the
  // page records alone and its index stays deferred (see KeyIndex). So reopening after a
  // crash in the middle of a bulk load reads no pages and builds no per-key index for it.
  std::vector<uint8_t> deferred(nfid, 0);
  std::vector<uint32_t> live_read;  // pages holding a segment of a feature that is not deferred
  if (!o_.accounting) {
    std::vector<std::vector<std::pair<uint64_t, uint64_t>>> ranges(nfid);
    std::vector<uint8_t> ok(nfid, 1);
    for (uint32_t pid : live)
      for (const auto& sm : pages_.at(pid).segs) {
        if (sm.retired) continue;
        if (sm.tombs) ok[sm.fid] = 0;
        ranges[sm.fid].emplace_back(sm.min_key, sm.max_key);
      }
    for (uint32_t fid = 0; fid < nfid; fid++) {
      FeatureState* f = features_.Get(fid);
      if (!f || !ok[fid] || f->def.fixed_width() == 0) continue;
      auto& r = ranges[fid];
      std::sort(r.begin(), r.end());
      bool disjoint = true;
      for (size_t i = 1; i < r.size() && disjoint; i++) disjoint = r[i].first > r[i - 1].second;
      if (!disjoint) continue;
      deferred[fid] = 1;
      f->index.Defer();
      std::vector<std::pair<uint64_t, uint64_t>>().swap(r);
    }
    std::vector<uint32_t> to_read;
    std::vector<uint64_t> max_key(nfid, 0);
    for (uint32_t pid : live) {
      PageMeta& pm = pages_.at(pid);
      bool read = false;
      for (auto& sm : pm.segs) {
        if (sm.retired) continue;
        if (!deferred[sm.fid]) {
          read = true;
          continue;
        }
        FeatureState* f = features_.Get(sm.fid);
        const uint64_t b = static_cast<uint64_t>(sm.count) * ItemBytes(f->def.fixed_width());
        sm.valid = sm.count;
        sm.valid_bytes = b;
        f->live_items += sm.count;
        f->live_bytes += b;
        max_key[sm.fid] = std::max(max_key[sm.fid], sm.max_key);
        f->index.AppendDeferred(sm.count, max_key[sm.fid]);
      }
      if (read) to_read.push_back(pid);
    }
    live_read.swap(to_read);
  } else {
    live_read = live;
  }
  std::vector<uint64_t> keys;
  auto cb = [&](uint32_t pid, const PageView& pv) RF_REQUIRES(write_mu_) -> Status {
    PageMeta& pm = pages_.at(pid);
    if (pv.seq() != pm.seq)
      return Status::Corruption("page " + std::to_string(pid) + " of '" + pages_path_ + "' has seq " +
                                std::to_string(pv.seq()) + " but the metadata expects " + std::to_string(pm.seq));
    for (auto& sm : pm.segs) {
      if (sm.retired || deferred[sm.fid]) continue;
      SegmentView sv;
      if (!pv.Find(sm.fid, &sv) || sv.count != sm.count)
        return Status::Corruption("page " + std::to_string(pid) + " of '" + pages_path_ +
                                  "' does not hold the segment of feature id " + std::to_string(sm.fid) +
                                  " its metadata lists");
      const FeatureDef& def = features_.Get(sm.fid)->def;
      sv.width = def.fixed_width();
      RF_RETURN_IF_ERROR(CheckSegmentFits(sv, pid, pages_path_, def));
      keys.resize(sv.count);
      sv.DecodeKeys(keys.data());
      auto& out = recs[sm.fid];
      for (uint32_t i = 0; i < sv.count; i++) {
        const uint8_t* v;
        uint32_t len;
        sv.Value(i, &v, &len);
        out.push_back({keys[i], pv.seq(), pid, sv.is_tomb(i) ? 0u : len, sv.is_tomb(i)});
      }
    }
    return Status::OK();
  };
  if (!live_read.empty()) {
    RF_RETURN_IF_ERROR(ReadPages(write_ring_.get(), live_read, cb));
    pages_read_ += live_read.size();
    bytes_read_ += static_cast<uint64_t>(live_read.size()) * ps;
  }
  // Highest seq wins per key.
  for (uint32_t fid = 0; fid < recs.size(); fid++) {
    auto& v = recs[fid];
    if (v.empty()) continue;
    FeatureState* f = features_.Get(fid);
    std::sort(v.begin(), v.end(), [](const R& a, const R& b) { return a.key < b.key || (a.key == b.key && a.seq > b.seq); });
    std::vector<uint64_t> k;
    std::vector<uint32_t> l, n;
    for (size_t i = 0; i < v.size(); i++) {
      if (i > 0 && v[i].key == v[i - 1].key) continue;
      const R& r = v[i];
      k.push_back(r.key);
      l.push_back(r.pid | (r.tomb ? KeyIndex::kTomb : 0));
      n.push_back(r.len);
      SegMeta* sm = pages_.at(r.pid).seg(fid);
      sm->valid++;
      if (r.tomb) {
        f->tombs++;
      } else {
        sm->valid_bytes += ItemBytes(r.len);
        f->live_items++;
        f->live_bytes += ItemBytes(r.len);
      }
    }
    f->index.InsertNew(k, l, n);
    std::vector<R>().swap(v);
  }
  // Segments that lost every record to newer versions are retired; empty pages freed.
  std::set<uint32_t> dirty, freed;
  for (uint32_t pid : live) {
    PageMeta& pm = pages_.at(pid);
    for (auto& sm : pm.segs) {
      if (sm.retired) continue;
      if (sm.valid == 0) {
        sm.retired = true;
        dirty.insert(pid);
      } else {
        features_.Get(sm.fid)->pages.push_back(pid);
      }
    }
    if (pm.valid() == 0) {
      dirty.erase(pid);
      freed.insert(pid);
    }
  }
  if (!dirty.empty() || !freed.empty()) {
    RF_RETURN_IF_ERROR(CommitLocked(dirty, freed));
    for (uint32_t p : freed) pages_.AddFree(p);
  }
  return Status::OK();
}

namespace {

// One feature's record in the checkpoint, parsed but not yet applied.
struct CheckpointFeature {
  uint32_t id;
  uint64_t items, bytes, tombs;
  const char* blob;
  size_t blob_len;
  KeyIndex::Summary sum;
};

using CheckpointSegs = std::vector<std::pair<uint32_t, std::vector<std::pair<uint32_t, uint64_t>>>>;

// True when the checkpoint's derived state is consistent with the page table: per feature,
// the index's entries and locations match the segments' valid counts and bytes, which sum to
// the feature's counters, and no segment claims more valid records than it holds. Linear in
// segments plus index runs: a clean reopen of a large store must stay cheap.
bool CheckpointAgrees(const std::vector<CheckpointFeature>& fs, const CheckpointSegs& segs,
                      const std::vector<uint32_t>& slot_of, FeatureTable* features, LogicalPageTable* pages) {
  struct SegRef {
    uint32_t slot, i;  // entry in segs, segment index in the page
  };
  std::vector<std::vector<SegRef>> of_feature;  // fid -> its live segments
  for (uint32_t slot = 0; slot < segs.size(); slot++) {
    const auto& [pid, v] = segs[slot];
    const PageMeta& pm = pages->at(pid);
    for (uint32_t i = 0; i < v.size(); i++) {
      const SegMeta& sm = pm.segs[i];
      const FeatureState* f = features->Get(sm.fid);
      if (!f) return false;
      if (sm.retired) {
        if (v[i].first != 0 || v[i].second != 0) return false;
        continue;
      }
      const uint32_t valid = v[i].first;
      const uint32_t w = f->def.fixed_width();
      const uint64_t most = w ? static_cast<uint64_t>(valid) * ItemBytes(w) : static_cast<uint64_t>(valid) * 8 + sm.length;
      if (valid > sm.count || v[i].second > most) return false;
      if (sm.fid >= of_feature.size()) of_feature.resize(sm.fid + 1);
      of_feature[sm.fid].push_back({slot, i});
    }
  }
  // Per-slot tallies of one feature's index entries; reset through its own segment list.
  std::vector<uint64_t> entries_at(segs.size(), 0), tombs_at(segs.size(), 0), bytes_at(segs.size(), 0);
  // Per slot, the feature (id + 1) whose live segment it holds while that feature is checked:
  // a run's page must hold one of the feature's live segments, and after uniform updates a
  // large feature's index has a run per few keys (looking the segment up in the page table for
  // each took most of a clean reopen's CPU).
  std::vector<uint32_t> owner(segs.size(), 0);
  static const std::vector<SegRef> kNone;
  for (const CheckpointFeature& f : fs) {
    const FeatureState* st = features->Get(f.id);
    const uint32_t w = st->def.fixed_width();
    const std::vector<SegRef>& mine = f.id < of_feature.size() ? of_feature[f.id] : kNone;
    for (const SegRef& r : mine) owner[r.slot] = f.id + 1;
    uint64_t valid_sum = 0, bytes_sum = 0;
    for (const SegRef& r : mine) {
      valid_sum += segs[r.slot].second[r.i].first;
      bytes_sum += segs[r.slot].second[r.i].second;
    }
    if (f.items > UINT64_MAX - f.tombs || valid_sum != f.items + f.tombs || bytes_sum != f.bytes) return false;
    if (f.sum.track_lens != st->def.variable()) return false;
    if (f.sum.mode == 2) {  // deferred: every record of every live segment is current, no tombstones
      // (a variable-width feature's bytes per segment are bounded above, not known exactly)
      if (f.tombs != 0 || f.sum.entries != f.items) return false;
      for (const SegRef& r : mine) {
        const SegMeta& sm = pages->at(segs[r.slot].first).segs[r.i];
        const auto& [valid, bytes] = segs[r.slot].second[r.i];
        if (sm.tombs != 0 || valid != sm.count || (w && bytes != static_cast<uint64_t>(sm.count) * ItemBytes(w)))
          return false;
      }
      continue;
    }
    if (f.sum.entries != f.items + f.tombs) return false;
    uint64_t at = 0;
    bool ok = true;
    for (uint64_t r = 0; r < f.sum.nruns && ok; r++) {
      uint32_t run[2];
      std::memcpy(run, f.sum.runs + 2 * r, sizeof(run));
      const uint32_t loc = run[0], count = run[1];
      const uint32_t pid = loc & ~KeyIndex::kTomb;
      if (count > f.sum.entries - at || pid >= slot_of.size() || slot_of[pid] == UINT32_MAX ||
          owner[slot_of[pid]] != f.id + 1) {
        ok = false;
        break;
      }
      const uint32_t slot = slot_of[pid];
      entries_at[slot] += count;
      if (loc & KeyIndex::kTomb) {
        tombs_at[slot] += count;
      } else if (w) {
        bytes_at[slot] += static_cast<uint64_t>(count) * ItemBytes(w);
      } else {
        for (uint64_t k = at; k < at + count; k++) {
          uint32_t len;
          std::memcpy(&len, f.sum.lens + 4 * k, 4);
          bytes_at[slot] += ItemBytes(len);
        }
      }
      at += count;
    }
    ok = ok && at == f.sum.entries;
    // Every run landed on one of this feature's segments (seg(f.id) above), so comparing and
    // resetting through its own list covers every tally touched.
    uint64_t tombs = 0;
    for (const SegRef& r : mine) {
      const auto& [valid, bytes] = segs[r.slot].second[r.i];
      if (entries_at[r.slot] != valid || bytes_at[r.slot] != bytes) ok = false;
      tombs += tombs_at[r.slot];
      entries_at[r.slot] = tombs_at[r.slot] = bytes_at[r.slot] = 0;
    }
    if (!ok || tombs != f.tombs) return false;
  }
  return true;
}
}

Status StoreImpl::RetireCheckpointLocked() {
  checkpoint_current_ = false;
  const std::string ckpt = StoreFileName(path_, FileKind::kCheckpoint);
  if (::unlink(ckpt.c_str()) != 0) return errno == ENOENT ? Status::OK() : Status::FromErrno("unlink", ckpt, errno);
  return SyncDir(path_);
}

Status StoreImpl::CommitMetaLocked(rocksdb::WriteBatch* b) {
  // The deletion durable before the commit: a crash in between finds no checkpoint (a
  // rebuild), never one of an older state next to newer metadata. (The open would refuse
  // that one too, by its seq and the page table, but not rely on it.)
  if (checkpoint_current_) RF_RETURN_IF_ERROR(RetireCheckpointLocked());
  return meta_.Commit(b);
}

Status StoreImpl::WriteCheckpoint() {
  // Streamed a feature at a time (a large key index is not copied whole), crc32c over all.
  const std::string tmp = StoreFileName(path_, FileKind::kCheckpointTemp);
  if (const int e = RF_FAULT(kCheckpointWrite, tmp)) return Status::FromErrno("write", tmp, e);
  FILE* f = std::fopen(tmp.c_str(), "wb");
  if (!f) return Status::FromErrno("open", tmp, errno);
  uint32_t crc = 0;
  bool ok = true;
  std::string out;
  auto emit = [&]() {
    crc = crc32c::Extend(crc, out.data(), out.size());
    ok = ok && std::fwrite(out.data(), 1, out.size(), f) == out.size();
    out.clear();
  };
  Append(&out, kCheckpointMagic);
  Append(&out, pstate_.next_seq);
  Append(&out, static_cast<uint64_t>(pages_.live_pages()));
  auto feats = features_.All();
  Append(&out, static_cast<uint32_t>(feats.size()));
  for (FeatureState* fs : feats) {
    Append(&out, fs->def.id);
    Append(&out, fs->live_items);
    Append(&out, fs->live_bytes);
    Append(&out, fs->tombs);
    if (fs->index_lazy)
      out += fs->index_blob;  // never decoded this session: unchanged
    else
      fs->index.Serialize(&out);
    emit();
  }
  for (uint32_t p = 0; p < pages_.slots(); p++) {
    const PageMeta& pm = pages_.at(p);
    if (!pm.live) continue;
    Append(&out, p);
    for (const auto& sm : pm.segs) {
      Append(&out, sm.valid);
      Append(&out, sm.valid_bytes);
    }
    if (out.size() > (1u << 20)) emit();
  }
  emit();
  Append(&out, crc);
  ok = ok && std::fwrite(out.data(), 1, out.size(), f) == out.size() && std::fflush(f) == 0 && ::fsync(fileno(f)) == 0;
  std::fclose(f);
  if (!ok) return Status::IOError("cannot write checkpoint '" + tmp + "'");
  RF_KILL_POINT("checkpoint.before_rename");
  if (::rename(tmp.c_str(), StoreFileName(path_, FileKind::kCheckpoint).c_str()) != 0) return Status::FromErrno("rename", tmp, errno);
  RF_RETURN_IF_ERROR(SyncDir(path_));
  checkpoints_written_++;
  checkpoint_current_ = true;
  return Status::OK();
}

bool StoreImpl::LoadCheckpoint() {
  std::string data;
  if (!ReadWholeFile(StoreFileName(path_, FileKind::kCheckpoint), &data)) return false;
  if (data.size() < 4) return false;
  uint32_t crc;
  std::memcpy(&crc, data.data() + data.size() - 4, 4);
  if (crc32c::Value(data.data(), data.size() - 4) != crc) return false;
  const char* p = data.data();
  const char* end = data.data() + data.size() - 4;
  auto take = [&](auto* v) {
    if (end - p < static_cast<ptrdiff_t>(sizeof(*v))) return false;
    std::memcpy(v, p, sizeof(*v));
    p += sizeof(*v);
    return true;
  };
  uint64_t magic, seq, live;
  uint32_t nf;
  if (!take(&magic) || magic != kCheckpointMagic || !take(&seq) || seq != pstate_.next_seq || !take(&live) ||
      live != pages_.live_pages() || !take(&nf))
    return false;
  // Parse into scratch state first: a mismatch anywhere leaves the tables untouched.
  using F = CheckpointFeature;
  if (nf > static_cast<size_t>(end - p) / 28) return false;  // each feature takes >= 28 bytes
  if (nf != features_.All().size()) return false;            // every feature, once
  std::vector<F> fs(nf);
  std::vector<uint8_t> seen_feature;
  for (auto& f : fs) {
    if (!take(&f.id) || !take(&f.items) || !take(&f.bytes) || !take(&f.tombs) || !features_.Get(f.id)) return false;
    if (f.id >= seen_feature.size()) seen_feature.resize(f.id + 1, 0);
    if (seen_feature[f.id]++) return false;
    f.blob = p;
    if (!KeyIndex::Skip(&p, end, &f.sum)) return false;  // decoded on first use (LoadIndex)
    f.blob_len = static_cast<size_t>(p - f.blob);
  }
  std::vector<std::pair<uint32_t, std::vector<std::pair<uint32_t, uint64_t>>>> segs;
  std::vector<uint32_t> slot_of(pages_.slots(), UINT32_MAX);  // page -> its entry in segs
  for (uint64_t i = 0; i < live; i++) {
    uint32_t pid;
    if (!take(&pid) || pid >= pages_.slots() || !pages_.at(pid).live || slot_of[pid] != UINT32_MAX) return false;
    slot_of[pid] = static_cast<uint32_t>(segs.size());
    std::vector<std::pair<uint32_t, uint64_t>> v(pages_.at(pid).segs.size());
    for (auto& [valid, bytes] : v)
      if (!take(&valid) || !take(&bytes)) return false;
    segs.emplace_back(pid, std::move(v));
  }
  if (p != end) return false;
  // The crc says the bytes are the ones written; these checks say the derived state agrees
  // with the page table (RocksDB), so a bad checkpoint is rebuilt from the pages instead of
  // steering reads: every count and location the index claims is cross-checked.
  if (!CheckpointAgrees(fs, segs, slot_of, &features_, &pages_)) return false;
  for (auto& f : fs) {
    FeatureState* st = features_.Get(f.id);
    st->live_items = f.items;
    st->live_bytes = f.bytes;
    st->tombs = f.tombs;
    st->index = KeyIndex();
    st->index.track_lengths(st->def.variable());
    st->index_blob.assign(f.blob, f.blob_len);
    st->index_lazy = true;
  }
  for (auto& [pid, v] : segs) {
    PageMeta& pm = pages_.at(pid);
    for (size_t i = 0; i < v.size(); i++) {
      pm.segs[i].valid = v[i].first;
      pm.segs[i].valid_bytes = v[i].second;
      const SegMeta& sm = pm.segs[i];
      if (sm.retired || sm.valid == 0) continue;
      FeatureState* st = features_.Get(sm.fid);
      st->pages.push_back(pid);
      st->index_ranges.push_back({pid, sm.min_key, sm.max_key});
    }
  }
  return true;
}


Status StoreImpl::ReplayWal(WalReplay* out) {
  RF_PAUSE_POINT("wal.replay.before_list");  // metadata read, wal/ not listed yet: tests move a writer on here
  std::vector<WalFileInfo> files;
  uint64_t vanished = 0;
  Status listed = ListWalFilesWithSizes(wal_dir_, &files, &vanished);
  if (vanished && o_.read_only)  // as a file gone at its open for replay (below)
    return Status::Stale("store '" + path_ + "': WAL file '" + WalFileName(wal_dir_, vanished) +
                         "' was listed by this read-only open but was gone when its size was read: a writer "
                         "retired it during the open; a reopen sees the newer state");
  RF_RETURN_IF_ERROR(listed);
  *out = WalReplay();
  const bool point_in_time = o_.wal_recovery == "point_in_time";
  std::vector<uint64_t> numbers;
  for (const WalFileInfo& f : files) numbers.push_back(f.number);
  out->start_listed = std::binary_search(numbers.begin(), numbers.end(), pstate_.wal_start);
  // The wal_start file is kept until a commit moves past it (made durable before that commit
  // names it), and a commit deletes only the files below its new wal_start. So it is never
  // legitimately missing: with later files there, the metadata is older than the WAL, i.e. it
  // lost commits (a truncated RocksDB log), whose items were in the deleted files — replaying
  // the later ones onto the old state would mix two states, and a writer would then reuse the
  // slots of the lost commits' pages; without, the file was deleted with what it logged.
  if (pstate_.wal_start_kept && !out->start_listed) {
    const bool later = !numbers.empty() && numbers.back() > pstate_.wal_start;
    const std::string msg = "store '" + path_ + "': the metadata names WAL file " +
                            WalFileName(wal_dir_, pstate_.wal_start) + " as the first to replay, but it is missing" +
                            (later ? " while later WAL files exist" : "");
    if (o_.read_only && WriterMovedOn())  // it may have committed past the snapshot's state since: retry
      return Status::Stale(msg + " (a writer moved on, or the metadata lost commits); reopen");
    return Status::Corruption(msg + (later ? ": the metadata database lost commits (its log damaged or truncated)"
                                           : ": it was deleted, and with it what was logged since the last flush"));
  }
  // The files from wal_start on are consecutive and only the last may be empty (writers keep
  // them so: FindWalSequenceBreak). A missing number was deleted, an empty file before the
  // last was cut to nothing; either way records are gone, synced ones among them, and
  // replaying the later files without them would apply writes on top of a state that never
  // existed. Stores whose last commit predates the rule may have gaps (their writers unlinked
  // empty files at open): they open as before.
  uint64_t replay_to = UINT64_MAX;  // no file numbered above it is replayed (point_in_time)
  const WalSequenceBreak brk = FindWalSequenceBreak(files, pstate_.wal_start);
  if (brk.found && pstate_.wal_files_consecutive) {
    const auto name = [&](uint64_t no) {
      std::string q(1, '\'');  // (not "'" + string: GCC 12 warns on that, -Wrestrict)
      q += WalFileName(wal_dir_, no);
      q += '\'';
      return q;
    };
    std::string what;
    if (brk.empty)
      what = "WAL file " + name(brk.last_good) + " is empty although a later one, " + name(brk.next) +
             ", exists: only the newest WAL file can be empty, so it was cut to zero bytes";
    else if (brk.next == brk.last_good + 2)
      what = "WAL file " + name(brk.last_good + 1) + " is missing between " + name(brk.last_good) + " and " +
             name(brk.next);
    else
      what = "WAL files " + name(brk.last_good + 1) + " to " + name(brk.next - 1) + " are missing between " +
             name(brk.last_good) + " and " + name(brk.next);
    const std::string msg = "store '" + path_ + "': " + what + " (the WAL files from the first one the metadata names, " +
                            name(pstate_.wal_start) + ", on are consecutive)";
    // A read-only open takes no lock: a writer's commit deletes the files below its new
    // wal_start while this open lists them, so its snapshot may name files being retired.
    if (o_.read_only && WriterMovedOn())
      return Status::Stale(msg + ": a writer holds the store's LOCK or committed since this read-only open read "
                                 "its metadata, and may have retired WAL files under that snapshot; reopen");
    if (!point_in_time)
      return Status::Corruption(msg + ": the records it held are lost, synced writes among them, and replaying the "
                                      "later WAL files without them would mix states. Restore it, or open with "
                                      "StoreOptions(wal_recovery='point_in_time') to open the store as of the WAL files up to " +
                                      name(brk.last_good) + " (a writable open then deletes the later ones)");
    replay_to = brk.last_good;
  }
  out->consecutive = !brk.found || replay_to != UINT64_MAX;  // point_in_time: the later files go below
  std::vector<uint64_t> skipped, replayed;  // from wal_start on: passed over (point_in_time) / read
  uint64_t cut_at = 0;                      // with a damaged record (point_in_time): its offset in replay_to
  bool damaged = false;
  for (const WalFileInfo& f : files) {
    const uint64_t no = f.number;
    const std::string name = WalFileName(wal_dir_, no);
    if (no < pstate_.wal_start) {
      if (!o_.read_only) ::unlink(name.c_str());  // its items are in committed pages
      continue;
    }
    if (no > replay_to) {
      skipped.push_back(no);
      wal_bytes_dropped_ += f.bytes;
      continue;
    }
    RF_PAUSE_POINT("wal.replay.before_open");  // listed, not yet opened: tests retire it here
    WalReadEnd end;
    Status read = ReadWalFile(
        name,
        [&](uint8_t type, const std::string& p) RF_REQUIRES(write_mu_) -> Status {
          if (type != kWalBatch) return Status::Corruption("unknown WAL record type in '" + name + "'");
          DecodedBatch d;
          RF_RETURN_IF_ERROR(DecodeBatch(p, name, &d));
          if (!features_.Get(d.fid))
            return Status::Corruption("WAL record in '" + name + "' names unknown feature id " + std::to_string(d.fid));
          MutexLock l(&mu_);
          buffer_.feature(d.fid).Append(d.keys.data(), d.n, d.values, d.offsets.empty() ? nullptr : d.offsets.data(),
                                        d.width, d.is_delete());
          recovered_wal_records_++;
          return Status::OK();
        },
        &end, point_in_time);
    // Listed above, gone at its open. A read-only open takes no lock: the writer committed a
    // flush past this file since the metadata snapshot was taken and deleted it. The snapshot
    // is stale, not damaged; Store::Open reopens, and the reopen judges the state it finds (a
    // wal_start file missing with no writer is still Corruption above). A writable open holds
    // the LOCK, so nobody may retire its files: the IOError stands.
    if (end.missing && o_.read_only)
      return Status::Stale("store '" + path_ + "': WAL file '" + name + "' was listed by this read-only open but "
                           "was gone when it was opened for replay: a writer retired it during the open (the "
                           "store moved past the metadata this open read); a reopen sees the newer state");
    RF_RETURN_IF_ERROR(read);
    // An empty file (the fresh file of a session that wrote nothing) stays: the session reuses
    // it when it is the last, and before the last one it is a break (above).
    if (end.file_bytes == 0) continue;
    replayed.push_back(no);
    wal_bytes_dropped_ += end.dropped_bytes;
    // Point in time: nothing logged after the damage is replayed, later files included (a torn
    // tail is different: the file's writer died there, and the next session wrote the next file).
    if (end.damaged) {
      damaged = true;
      cut_at = end.file_bytes - end.dropped_bytes;
      replay_to = no;
    }
  }
  if (replay_to != UINT64_MAX) {
    out->last_number = replay_to;
    for (const WalFileInfo& f : files)
      if (f.number == replay_to) out->last_empty = damaged ? cut_at == 0 : f.bytes == 0;
  } else if (!files.empty() && files.back().number >= pstate_.wal_start) {
    out->last_number = files.back().number;
    out->last_empty = files.back().bytes == 0;
  }
  if (o_.read_only) return Status::OK();
  // A writable point_in_time open makes the point it opened at the store's state before this
  // session logs anything: the later files are deleted (the directory synced), then the
  // damaged record and what follows it cut from its file. Otherwise this session's file would
  // follow them, and the next open would replay them again (or, with point_in_time, drop this
  // session's writes with them). In that order, a crash part way leaves the break (or the
  // damage) for the next open to refuse, never a cut file followed by the dropped ones.
  for (uint64_t no : skipped) {
    const std::string name = WalFileName(wal_dir_, no);
    if (::unlink(name.c_str()) != 0 && errno != ENOENT) return Status::FromErrno("unlink", name, errno);
  }
  if (!skipped.empty()) RF_RETURN_IF_ERROR(SyncDir(wal_dir_));
  if (damaged) {
    const std::string name = WalFileName(wal_dir_, replay_to);
    if (::truncate(name.c_str(), static_cast<off_t>(cut_at)) != 0) return Status::FromErrno("truncate", name, errno);
    RF_RETURN_IF_ERROR(SyncWalFile(name));
  }
  // The session's file follows the last one only once what that holds is durable: a process
  // killed before syncing its appends leaves them in the page cache, and a power loss after
  // this open created its file could then cut the last file to nothing behind it (an empty file
  // before the last, which the next open refuses). Earlier files were synced before their
  // successor was made.
  if (!out->last_empty)
    for (uint64_t no : replayed) RF_RETURN_IF_ERROR(SyncWalFile(WalFileName(wal_dir_, no)));
  return Status::OK();
}

}  // namespace recflash
