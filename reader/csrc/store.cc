#include "reader/csrc/store_impl.h"

#include "reader/csrc/crc32c.h"
#include "reader/csrc/fault_injection.h"
#include "reader/csrc/store_internal.h"

#include <rocksdb/write_batch.h>

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

namespace fs = std::filesystem;
using namespace store_internal;

// Defined here, used by every part of the Store (see store_internal.h).
namespace store_internal {

Status SyncDir(const std::string& dir) {
  RF_KILL_POINT("dir.sync.before");
  int fd = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (fd < 0) return Status::FromErrno("open", dir, errno);
  int rc = ::fsync(fd);
  int err = errno;
  ::close(fd);
  if (rc != 0) return Status::FromErrno("fsync", dir, err);
  fault::DirSynced(dir);
  return Status::OK();
}

}  // namespace store_internal

// ---------------------------------------------------------------------------------------
// Open / recovery

StoreImpl::StoreImpl(const StoreOptions& o)
    : o_(o), pinner_(o.pinner), merger_(o.merger, o.bulk_load), reclaimer_(o.reclaim) {}

StoreImpl::~StoreImpl() {
  if (!closed_) Close();
}

// ---------------------------------------------------------------------------------------
// Features

Status StoreImpl::CheckReadable() {
  if (o_.accounting)
    return Status::InvalidArgument("store '" + path_ + "' is in accounting mode: it keeps no page contents to read "
                                   "(use account_scan() for read costs)");
  return Status::OK();
}

Status StoreImpl::CheckWritable() {
  RF_RETURN_IF_ERROR(CheckOpen());
  if (o_.read_only)
    return Status::ReadOnly("store '" + path_ + "' is open read-only; open it without read_only to write");
  return Status::OK();
}

Status StoreImpl::CheckOpen() {
  if (closed_) return Status::Closed("store '" + path_ + "' is closed");
  return Status::OK();
}

Status StoreImpl::FeatureFor(const std::string& name, FeatureDef* def) {
  MutexLock l(&mu_);
  auto it = defs_.find(name);
  if (it == defs_.end()) {
    std::string known;
    int shown = 0;
    for (const auto& [n, d] : defs_) {
      if (shown++ == 8) {
        known += ", ...";
        break;
      }
      known += (known.empty() ? "" : ", ") + n;
    }
    return Status::UnknownFeature("unknown feature '" + name + "' in store '" + path_ + "' (known: " +
                                  (known.empty() ? "none" : known) + ")");
  }
  *def = it->second;
  return Status::OK();
}

Status StoreImpl::CreateFeature(const std::string& name, const std::string& type, FeatureDef* out) {
  RF_RETURN_IF_ERROR(CheckWritable());
  if (name.empty() || name.size() > 255)
    return Status::InvalidArgument("feature name must be 1..255 bytes, got " + std::to_string(name.size()));
  ValueType vt;
  uint32_t dim;
  RF_RETURN_IF_ERROR(ParseValueType(type, &vt, &dim));
  MutexLock wl(&write_mu_);
  // After a failed write the tables may be ahead of the metadata (a flush whose commit failed
  // has moved wal_start to its new WAL file): committing the state now would name that file as
  // the first to replay while the flushed items' pages are not committed, and the next open
  // would delete the older files holding them. The store takes no more writes (see Write).
  RF_RETURN_IF_ERROR(bg_error_);
  if (FeatureState* f = features_.Find(name)) {
    if (f->def.type == vt && f->def.dim == dim) {
      *out = f->def;
      return Status::OK();
    }
    return Status::FeatureExists("feature '" + name + "' already exists in store '" + path_ + "' with type " +
                                 f->def.TypeString() + ", not " + type);
  }
  FeatureDef d;
  d.id = pstate_.next_fid;
  d.name = name;
  d.type = vt;
  d.dim = dim;
  if (d.fixed_width() + ValueAlign(d.fixed_width()) - 1 > PageBuilder::MaxValueBytes(o_.page_size))
    return Status::TooLarge("feature '" + name + "': a " + type + " value is " + std::to_string(d.fixed_width()) +
                            " bytes, more than a page of " + std::to_string(o_.page_size) + " bytes holds (" +
                            std::to_string(PageBuilder::MaxValueBytes(o_.page_size)) + ")");
  PersistentState next = pstate_;
  next.next_fid++;
  rocksdb::WriteBatch b;
  MetaStore::PutFeature(&b, d);
  MetaStore::PutState(&b, next);
  RF_RETURN_IF_ERROR(CommitMetaLocked(&b));
  pstate_ = next;
  {
    MutexLock l(&mu_);
    FeatureState* f = features_.Add(d);
    f->index.track_lengths(d.variable());
    if (!o_.accounting) f->index.Defer();  // accounting mode has no pages to materialize from
    defs_[name] = d;
  }
  *out = d;
  return Status::OK();
}

Status StoreImpl::LookupFeature(const std::string& name, FeatureDef* out) {
  RF_RETURN_IF_ERROR(CheckOpen());
  return FeatureFor(name, out);
}

std::vector<FeatureDef> StoreImpl::Features() {
  MutexLock l(&mu_);
  std::vector<FeatureDef> v;
  for (const auto& [n, d] : defs_) v.push_back(d);
  std::sort(v.begin(), v.end(), [](const FeatureDef& a, const FeatureDef& b) { return a.id < b.id; });
  return v;
}
// ---------------------------------------------------------------------------------------
// Close and statistics

Status StoreImpl::Close() {
  if (closed_) return Status::OK();
  Status s;
  if (o_.read_only) {
    MutexLock l(&mu_);
    closed_ = true;
    versions_.AssertHeld();
    versions_.WaitForNoReadersLocked();
  } else {
    MutexLock wl(&write_mu_);
    if (bg_error_.ok()) s = FlushLocked(true);
    if (s.ok()) {
      TrimFileLocked();
      ReturnFreeSlotsLocked(0);  // a closed store allocates only its pages in use
    }
    Status s2 = wal_.Sync();
    if (s.ok()) s = s2;
    // After a write error the tables in DRAM may be ahead of the committed metadata: no
    // checkpoint of them (the next open rebuilds from the committed pages).
    // A session that committed nothing leaves the checkpoint it loaded as it was.
    if (s.ok() && bg_error_.ok() && !o_.accounting && !checkpoint_current_) s = WriteCheckpoint();
    // Block checksums are a cache of verified page contents: losing them only costs a
    // whole-page read per page later, so a failure to save them does not fail the close.
    if (s.ok() && block_sums_ && block_sums_->dirty()) (void)block_sums_->Save(StoreFileName(path_, FileKind::kBlockSums));
    // The metadata is committed either way (synced log); the flush only makes later opens
    // cheaper, so its failure does not fail the close either.
    if (s.ok() && !o_.accounting) (void)meta_.FlushLog();
    MutexLock l(&mu_);
    closed_ = true;
    versions_.AssertHeld();
    versions_.WaitForNoReadersLocked();
    wal_.Close();
  }
  ReleaseResources();
  return s;
}

void StoreImpl::ReleaseResources() {
  // No scan runs any more (each registered as a reader, and none can start): the parked lane
  // helpers stop with the handle, not when its last Python reference goes.
  lane_helpers_.reset();
  file_.Close();
  if (write_ring_) rings_->Release(std::move(write_ring_));
  meta_.Close();
  if (lock_fd_ >= 0) {
    ::flock(lock_fd_, LOCK_UN);
    ::close(lock_fd_);
    lock_fd_ = -1;
  }
}

}  // namespace recflash
