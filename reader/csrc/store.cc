#include "reader/csrc/store.h"

#include "reader/csrc/crc32c.h"
#include "reader/csrc/fault_injection.h"

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

namespace {

constexpr const char* kMarkerName = "RECFLASH";
constexpr const char* kMarkerMagic = "recflash store";
constexpr int kFormatVersion = 3;     // 2: aligned fixed-width values; 3: raw u64 keys
constexpr int kMinFormatVersion = 2;  // format 2 stores open (their pages stay readable)
constexpr uint8_t kOpPut = 1;
constexpr uint8_t kOpDelete = 2;

double Now() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

template <typename T>
void Append(std::string* s, const T& v) {
  s->append(reinterpret_cast<const char*>(&v), sizeof v);
}

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

// WAL payload of one put/delete call:
//   u8 op | u32 fid | u32 n | u32 width | u64 keys[n] | (variable put) u32 lens[n] | values
std::string EncodeBatch(uint8_t op, uint32_t fid, const uint64_t* keys, size_t n, uint32_t width,
                        const uint8_t* values, const int64_t* offsets) {
  std::string p;
  p.reserve(17 + n * 12 + (op == kOpPut ? (width ? n * width : offsets[n] - offsets[0]) : 0));
  Append(&p, op);
  Append(&p, fid);
  Append(&p, static_cast<uint32_t>(n));
  Append(&p, width);
  p.append(reinterpret_cast<const char*>(keys), n * 8);
  if (op == kOpPut) {
    if (width) {
      p.append(reinterpret_cast<const char*>(values), n * width);
    } else {
      for (size_t i = 0; i < n; i++) Append(&p, static_cast<uint32_t>(offsets[i + 1] - offsets[i]));
      p.append(reinterpret_cast<const char*>(values) + offsets[0], offsets[n] - offsets[0]);
    }
  }
  return p;
}

// The same payload as EncodeBatch, as pieces pointing at the caller's arrays (no copy).
void BatchParts(uint8_t op, uint32_t fid, const uint64_t* keys, size_t n, uint32_t width, const uint8_t* values,
                const int64_t* offsets, uint8_t header[13], std::vector<uint32_t>* lens, std::vector<iovec>* parts,
                size_t* bytes) {
  const uint32_t n32 = static_cast<uint32_t>(n);
  header[0] = op;
  std::memcpy(header + 1, &fid, 4);
  std::memcpy(header + 5, &n32, 4);
  std::memcpy(header + 9, &width, 4);
  parts->clear();
  parts->push_back({header, 13});
  parts->push_back({const_cast<uint64_t*>(keys), n * 8});
  if (op == kOpPut) {
    if (width) {
      parts->push_back({const_cast<uint8_t*>(values), n * width});
    } else {
      lens->resize(n);
      for (size_t i = 0; i < n; i++) (*lens)[i] = static_cast<uint32_t>(offsets[i + 1] - offsets[i]);
      parts->push_back({lens->data(), n * 4});
      parts->push_back({const_cast<uint8_t*>(values) + offsets[0], static_cast<size_t>(offsets[n] - offsets[0])});
    }
  }
  *bytes = 0;
  for (const iovec& v : *parts) *bytes += v.iov_len;
}

// Buffered items of one feature re-encoded as WAL payloads (puts and deletes separately).
void EncodeBuffered(uint32_t fid, uint32_t width, const BufferedItems& b, std::vector<std::string>* out) {
  std::vector<uint64_t> pk, dk;
  std::vector<uint8_t> vals;
  std::vector<int64_t> offs{0};
  for (size_t i = 0; i < b.size(); i++) {
    if (b.tomb[i]) {
      dk.push_back(b.keys[i]);
      continue;
    }
    pk.push_back(b.keys[i]);
    vals.insert(vals.end(), b.value(i), b.value(i) + b.len[i]);
    offs.push_back(static_cast<int64_t>(vals.size()));
  }
  if (!pk.empty()) out->push_back(EncodeBatch(kOpPut, fid, pk.data(), pk.size(), width, vals.data(), offs.data()));
  if (!dk.empty()) out->push_back(EncodeBatch(kOpDelete, fid, dk.data(), dk.size(), width, nullptr, nullptr));
}

class JsonWriter {
 public:
  void Open() { Sep(); s_ += '{'; first_ = true; }
  void Close() { s_ += '}'; first_ = false; }
  void Key(const std::string& k) {
    Sep();
    s_ += '"';
    for (char c : k) {
      if (c == '"' || c == '\\') s_ += '\\';
      s_ += c;
    }
    s_ += "\":";
    first_ = true;
  }
  void Num(double v) {
    Sep();
    if (!std::isfinite(v)) {
      s_ += "null";
    } else if (v == std::floor(v) && std::fabs(v) < 9e15) {
      s_ += std::to_string(static_cast<long long>(v));
    } else {
      std::ostringstream o;
      o.precision(17);
      o << v;
      s_ += o.str();
    }
  }
  void Str(const std::string& v) {
    Sep();
    s_ += '"' + v + '"';
  }
  void Bool(bool v) { Sep(); s_ += v ? "true" : "false"; }
  void KV(const std::string& k, double v) { Key(k); Num(v); }
  std::string str() const { return s_; }

 private:
  void Sep() {
    if (!first_) s_ += ',';
    first_ = false;
  }
  std::string s_;
  bool first_ = true;
};

}  // namespace

void* HugeAllocate(size_t bytes) {
  constexpr size_t kHuge = 2u << 20;
  if (bytes < kHuge) {
    void* p = std::malloc(bytes ? bytes : 1);
    if (!p) throw std::bad_alloc();
    return p;
  }
  void* p = nullptr;
  const size_t rounded = (bytes + kHuge - 1) / kHuge * kHuge;
  if (posix_memalign(&p, kHuge, rounded) != 0) throw std::bad_alloc();
  ::madvise(p, rounded, MADV_HUGEPAGE);
  return p;
}

// ---------------------------------------------------------------------------------------
// Internal types

struct Store::WriteOp {
  // WAL payload, written from the caller's buffers: header (op, fid, n, width), keys,
  // (variable-width puts) u32 lengths, values. Empty in bulk-load mode.
  uint8_t header[13];
  std::vector<uint32_t> lens;
  std::vector<iovec> parts;
  size_t payload_bytes = 0;
  uint32_t fid = 0;
  const uint64_t* keys = nullptr;
  size_t n = 0;
  const uint8_t* values = nullptr;
  const int64_t* offsets = nullptr;
  uint32_t width = 0;
  bool tomb = false;
  bool sync = false;
  bool done = false;
  Status status;
  std::condition_variable cv;
};

struct Store::Rec {
  uint32_t fid;
  uint64_t key;
  bool tomb;
  const uint8_t* value;
  uint32_t len;
  int64_t pos;  // KeyIndex position of the current version, or kAbsent
};

class Store::ReaderGuard {
 public:
  ReaderGuard(Store* s, uint64_t v) : s_(s), v_(v) {}
  ~ReaderGuard() {
    std::lock_guard<std::mutex> l(s_->mu_);
    s_->readers_.erase(s_->readers_.find(v_));
    s_->readers_cv_.notify_all();
  }

 private:
  Store* s_;
  uint64_t v_;
};

// ---------------------------------------------------------------------------------------
// Open / recovery

Store::Store(const StoreOptions& o)
    : o_(o), pinner_(o.pinner), merger_(o.merger), reclaimer_(o.reclaim) {}

Store::~Store() {
  if (!closed_) Close();
}

Status Store::Open(const std::string& path, const StoreOptions& options, std::unique_ptr<Store>* out) {
  // A read-only open races a live writer (a WAL file retired between listing and reading
  // it): it then simply takes a newer snapshot.
  const int attempts = options.read_only ? 5 : 1;
  Status st;
  for (int i = 0; i < attempts; i++) {
    std::unique_ptr<Store> s(new Store(options));
    st = s->OpenImpl(path);
    if (st.ok()) {
      *out = std::move(s);
      return Status::OK();
    }
    s->closed_ = true;  // nothing to flush
    if (st.code() != Status::Code::kStale) break;
  }
  return st;
}

Status Store::OpenImpl(const std::string& path) {
  const uint32_t ps = o_.page_size;
  if (ps < 4096 || ps > (1u << 20) || (ps & (ps - 1)) != 0)
    return Status::InvalidArgument("page_size " + std::to_string(ps) + " must be a power of two in [4096, 1 MiB]");
  if (o_.write_buffer_bytes < 4ull * ps)
    return Status::InvalidArgument("write_buffer_bytes " + std::to_string(o_.write_buffer_bytes) +
                                   " must be at least 4 pages (" + std::to_string(4ull * ps) + ")");
  if (o_.queue_depth < 1 || o_.queue_depth > 4096) return Status::InvalidArgument("queue_depth must be in [1, 4096]");
  path_ = path;
  std::error_code ec;
  const fs::path root(path);
  if (fs::exists(root, ec) && !fs::is_directory(root, ec))
    return Status::NotAStore("'" + path + "' is not a recflash store: it exists and is not a directory");
  if (o_.read_only && o_.accounting)
    return Status::InvalidArgument("store '" + path + "': read_only and accounting cannot be combined");
  if (o_.read_only && !fs::exists(root / kMarkerName, ec))
    return Status::NotAStore("'" + path + "' is not a recflash store (no " + kMarkerName +
                             " marker): a read-only open needs an existing store");
  if (!fs::exists(root, ec)) {
    fs::create_directories(root, ec);
    if (ec) return Status::IOError("cannot create store directory '" + path + "': " + ec.message());
  }
  const fs::path marker = root / kMarkerName;
  if (!fs::exists(marker, ec)) {
    std::vector<std::string> found;
    for (const auto& e : fs::directory_iterator(root, ec)) {
      if (found.size() < 5) found.push_back(e.path().filename().string());
    }
    if (!found.empty()) {
      std::string list;
      for (const auto& f : found) list += (list.empty() ? "" : ", ") + f;
      return Status::NotAStore("'" + path + "' is not a recflash store: no " + kMarkerName +
                               " marker, and the directory is not empty (" + list + ")");
    }
    const std::string tmp = (root / "RECFLASH.tmp").string();
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

  if (o_.read_only) {
    // No LOCK: readers coexist with each other and with one writer. Safety comes from the
    // snapshot (metadata as of the open) and the per-read seq check, not from locking.
    wal_dir_ = (root / "wal").string();
    RF_RETURN_IF_ERROR(meta_.Open((root / "meta").string(), false, true));
    pages_path_ = (root / "pages.dat").string();
    RF_RETURN_IF_ERROR(file_.Open(pages_path_, o_.page_size, o_.direct_io, true));
    const uint32_t slot_bytes = std::max(o_.page_size, o_.max_io_bytes / o_.page_size * o_.page_size);
    rings_ = std::make_unique<IoRingPool>(o_.queue_depth, slot_bytes);
    RF_RETURN_IF_ERROR(IoRing::Create(o_.queue_depth, slot_bytes, &write_ring_));
    block_rings_ = std::make_unique<IoRingPool>(128, 4096);
    return RecoverReadOnly();
  }

  const std::string lock_path = (root / "LOCK").string();
  lock_fd_ = ::open(lock_path.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0644);
  if (lock_fd_ < 0) return Status::FromErrno("open", lock_path, errno);
  if (::flock(lock_fd_, LOCK_EX | LOCK_NB) != 0) {
    ::close(lock_fd_);
    lock_fd_ = -1;
    return Status::Locked("store '" + path + "' is already open for writing (its LOCK is held by another process or "
                          "another Store object in this process)");
  }

  wal_dir_ = (root / "wal").string();
  fs::create_directories(wal_dir_, ec);
  if (ec) return Status::IOError("cannot create '" + wal_dir_ + "': " + ec.message());
  RF_RETURN_IF_ERROR(meta_.Open((root / "meta").string(), true));
  pages_path_ = (root / "pages.dat").string();
  RF_RETURN_IF_ERROR(file_.Open(pages_path_, o_.page_size, o_.direct_io));
  const uint32_t slot_bytes = std::max(o_.page_size, o_.max_io_bytes / o_.page_size * o_.page_size);
  rings_ = std::make_unique<IoRingPool>(o_.queue_depth, slot_bytes);
  RF_RETURN_IF_ERROR(IoRing::Create(o_.queue_depth, slot_bytes, &write_ring_));
  // Vector-grained reads: 4 KiB slots, 128 in flight. On the virtio disk measured here 256
  // in flight was no faster (fio and the raw io_uring reference at QD256 trailed QD128).
  block_rings_ = std::make_unique<IoRingPool>(128, 4096);
  if (o_.verify_block_reads && !o_.accounting) block_sums_ = std::make_unique<BlockSums>(o_.page_size, block_size_);
  return Recover();
}

Status Store::LoadTables(uint32_t* max_pid) {
  bool found = false;
  RF_RETURN_IF_ERROR(meta_.LoadState(&pstate_, &found));
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

Status Store::Recover() {
  const double t0 = Now();
  uint32_t max_pid = 0;
  RF_RETURN_IF_ERROR(LoadTables(&max_pid));
  if (o_.accounting && max_pid > 0)
    return Status::InvalidArgument("accounting mode needs a new store; '" + path_ + "' already holds pages");
  uint64_t slots = 0;
  RF_RETURN_IF_ERROR(file_.SlotCount(&slots));
  pages_.EnsureSlots(static_cast<uint32_t>(std::max<uint64_t>(slots, max_pid)));
  for (uint32_t p = 0; p < pages_.slots(); p++)
    if (!pages_.at(p).live) pages_.AddFree(p);

  opened_from_checkpoint_ = LoadCheckpoint();
  const std::string ckpt = path_ + "/CHECKPOINT";
  if (fs::exists(ckpt)) {
    ::unlink(ckpt.c_str());
    RF_RETURN_IF_ERROR(SyncDir(path_));
  }
  if (!opened_from_checkpoint_) RF_RETURN_IF_ERROR(RebuildFromPages());
  // A feature with nothing stored starts deferred (see KeyIndex).
  for (FeatureState* f : features_.All())
    if (f->pages.empty() && f->index.size() == 0 && !o_.accounting) f->index.Defer();

  uint64_t max_no = 0;
  RF_RETURN_IF_ERROR(ReplayWal(&max_no));
  wal_number_ = std::max(max_no, pstate_.wal_start - 1) + 1;
  RF_RETURN_IF_ERROR(wal_.Open(WalFileName(wal_dir_, wal_number_)));
  RF_RETURN_IF_ERROR(SyncDir(wal_dir_));
  current_ = BuildVersion(1);
  recovery_seconds_ = Now() - t0;
  // A replayed buffer at or above write_buffer_bytes is flushed by the next write, not here:
  // the store must open (to be read, and to take the deletes that free space) also on a full
  // disk, where this flush would fail.
  return Status::OK();
}

Status Store::RecoverReadOnly() {
  const double t0 = Now();
  uint32_t max_pid = 0;
  RF_RETURN_IF_ERROR(LoadTables(&max_pid));
  ResetDerivedLocked();
  // Derived state without reading pages: every record of a non-retired segment is taken as
  // valid. Counts in stats() are then upper bounds until EnsureKeyIndex() runs.
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
  key_index_ready_ = false;
  uint64_t max_no = 0;
  RF_RETURN_IF_ERROR(ReplayWal(&max_no));
  current_ = BuildVersion(1);
  recovery_seconds_ = Now() - t0;
  return Status::OK();
}

void Store::ResetDerivedLocked() {
  for (FeatureState* f : features_.All()) {
    f->index = KeyIndex();
    f->index.track_lengths(f->def.variable());
    f->index_lazy = false;
    f->index_blob.clear();
    f->pages.clear();
    f->live_items = f->live_bytes = f->tombs = 0;
  }
  for (uint32_t p = 0; p < pages_.slots(); p++)
    for (auto& sm : pages_.at(p).segs) {
      sm.valid = 0;
      sm.valid_bytes = 0;
    }
}

Status Store::EnsureKeyIndex() {
  std::lock_guard<std::mutex> wl(write_mu_);
  if (key_index_ready_) return Status::OK();
  {
    std::lock_guard<std::mutex> l(mu_);
    ResetDerivedLocked();
  }
  // The checkpoint describes the state at a writer's clean close; it is used only when its
  // seq and page count match this snapshot (LoadCheckpoint checks), else the pages are read.
  opened_from_checkpoint_ = LoadCheckpoint();
  if (!opened_from_checkpoint_) {
    Status s = RebuildFromPages();
    if (!s.ok()) return ExplainReadFailure(s);
  }
  auto v = BuildVersion(current_->number + 1);
  std::lock_guard<std::mutex> l(mu_);
  current_ = v;
  key_index_ready_ = true;
  return Status::OK();
}

FeatureState* Store::FeatureStateFor(uint32_t fid) {
  std::lock_guard<std::mutex> l(mu_);
  return features_.Get(fid);
}

Status Store::LoadIndex(FeatureState* f) {
  std::lock_guard<std::mutex> l(lazy_mu_);
  if (!f->index_lazy) return Status::OK();
  const char* p = f->index_blob.data();
  const char* end = p + f->index_blob.size();
  KeyIndex idx;
  if (!idx.Deserialize(&p, end) || p != end)
    return Status::Corruption("checkpoint key index of feature '" + f->def.name + "' in '" + path_ +
                              "' does not decode");
  {
    std::lock_guard<std::mutex> ml(mu_);  // get() reads indexes under mu_
    f->index = std::move(idx);
    f->index_lazy = false;
  }
  std::string().swap(f->index_blob);
  return Status::OK();
}

Status Store::ExplainReadFailure(const Status& s) {
  if (!o_.read_only || s.code() != Status::Code::kCorruption) return s;
  // A page that fails verification under a read-only handle is most likely one a writer
  // rewrote, punched or is writing since this snapshot: the committed state moved on. Check
  // twice, since a writer commits its metadata only after its pages are durable.
  for (int i = 0; i < 2; i++) {
    PersistentState now;
    if (MetaStore::ReadCurrentState(path_ + "/meta", &now).ok() && now.next_seq != pstate_.next_seq)
      return Status::Stale("store '" + path_ + "' was changed by a writer since this read-only handle opened (" +
                           s.message() + "); reopen the store to read the current data");
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
  }
  return s;
}

Status Store::RebuildFromPages() {
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
  auto cb = [&](uint32_t pid, const PageView& pv) -> Status {
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
constexpr uint64_t kCheckpointMagic = 0x33544b4348434652ull;  // "RFCHCKT3": compact key index form
}

Status Store::WriteCheckpoint() {
  // Streamed a feature at a time (a large key index is not copied whole), crc32c over all.
  const std::string tmp = path_ + "/CHECKPOINT.tmp";
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
  if (::rename(tmp.c_str(), (path_ + "/CHECKPOINT").c_str()) != 0) return Status::FromErrno("rename", tmp, errno);
  return SyncDir(path_);
}

bool Store::LoadCheckpoint() {
  std::ifstream in(path_ + "/CHECKPOINT", std::ios::binary);
  if (!in) return false;
  std::string data((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
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
  struct F {
    uint32_t id;
    uint64_t items, bytes, tombs;
    const char* blob;
    size_t blob_len;
  };
  if (nf > static_cast<size_t>(end - p) / 28) return false;  // each feature takes >= 28 bytes
  std::vector<F> fs(nf);
  for (auto& f : fs) {
    if (!take(&f.id) || !take(&f.items) || !take(&f.bytes) || !take(&f.tombs) || !features_.Get(f.id)) return false;
    f.blob = p;
    if (!KeyIndex::Skip(&p, end)) return false;  // decoded on first use (LoadIndex)
    f.blob_len = static_cast<size_t>(p - f.blob);
  }
  std::vector<std::pair<uint32_t, std::vector<std::pair<uint32_t, uint64_t>>>> segs;
  for (uint64_t i = 0; i < live; i++) {
    uint32_t pid;
    if (!take(&pid) || pid >= pages_.slots() || !pages_.at(pid).live) return false;
    std::vector<std::pair<uint32_t, uint64_t>> v(pages_.at(pid).segs.size());
    for (auto& [valid, bytes] : v)
      if (!take(&valid) || !take(&bytes)) return false;
    segs.emplace_back(pid, std::move(v));
  }
  if (p != end) return false;
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
      if (!pm.segs[i].retired && pm.segs[i].valid > 0) features_.Get(pm.segs[i].fid)->pages.push_back(pid);
    }
  }
  return true;
}

Status Store::ReplayWal(uint64_t* max_number) {
  std::vector<uint64_t> numbers;
  RF_RETURN_IF_ERROR(ListWalFiles(wal_dir_, &numbers));
  *max_number = 0;
  for (uint64_t no : numbers) {
    const std::string name = WalFileName(wal_dir_, no);
    *max_number = std::max(*max_number, no);
    if (no < pstate_.wal_start) {
      if (!o_.read_only) ::unlink(name.c_str());  // its items are in committed pages
      continue;
    }
    std::error_code ec;
    if (!fs::exists(name, ec) && o_.read_only)
      return Status::Stale("store '" + path_ + "': WAL file '" + name + "' was retired by a writer during the "
                           "read-only open; reopen");
    if (fs::file_size(name, ec) == 0 && !ec) {
      if (!o_.read_only) ::unlink(name.c_str());  // holds nothing (e.g. the fresh file of a session that wrote nothing)
      continue;
    }
    bool torn = false;
    RF_RETURN_IF_ERROR(ReadWalFile(
        name,
        [&](uint8_t type, const std::string& p) -> Status {
          if (type != kWalBatch) return Status::Corruption("unknown WAL record type in '" + name + "'");
          if (p.size() < 13) return Status::Corruption("short WAL record in '" + name + "'");
          uint8_t op = static_cast<uint8_t>(p[0]);
          uint32_t fid, n, width;
          std::memcpy(&fid, p.data() + 1, 4);
          std::memcpy(&n, p.data() + 5, 4);
          std::memcpy(&width, p.data() + 9, 4);
          FeatureState* f = features_.Get(fid);
          if (!f) return Status::Corruption("WAL record in '" + name + "' names unknown feature id " + std::to_string(fid));
          size_t pos = 13;
          if (p.size() < pos + 8ull * n) return Status::Corruption("truncated WAL record in '" + name + "'");
          std::vector<uint64_t> keys(n);
          std::memcpy(keys.data(), p.data() + pos, 8ull * n);
          pos += 8ull * n;
          FeatureBuffer& fb = buffer_.feature(fid);
          if (op == kOpDelete) {
            fb.Append(keys.data(), n, nullptr, nullptr, width, true);
          } else if (width) {
            if (p.size() < pos + static_cast<size_t>(n) * width) return Status::Corruption("truncated WAL record in '" + name + "'");
            fb.Append(keys.data(), n, reinterpret_cast<const uint8_t*>(p.data() + pos), nullptr, width, false);
          } else {
            std::vector<int64_t> offs(n + 1, 0);
            for (uint32_t i = 0; i < n; i++) {
              uint32_t len;
              std::memcpy(&len, p.data() + pos + 4ull * i, 4);
              offs[i + 1] = offs[i] + len;
            }
            pos += 4ull * n;
            if (p.size() < pos + static_cast<size_t>(offs[n])) return Status::Corruption("truncated WAL record in '" + name + "'");
            fb.Append(keys.data(), n, reinterpret_cast<const uint8_t*>(p.data() + pos), offs.data(), 0, false);
          }
          recovered_wal_records_++;
          return Status::OK();
        },
        &torn));
  }
  return Status::OK();
}

// ---------------------------------------------------------------------------------------
// Features

Status Store::CheckReadable() {
  if (o_.accounting)
    return Status::InvalidArgument("store '" + path_ + "' is in accounting mode: it keeps no page contents to read "
                                   "(use account_scan() for read costs)");
  return Status::OK();
}

Status Store::CheckWritable() {
  RF_RETURN_IF_ERROR(CheckOpen());
  if (o_.read_only)
    return Status::ReadOnly("store '" + path_ + "' is open read-only; open it without read_only to write");
  return Status::OK();
}

Status Store::CheckOpen() {
  if (closed_) return Status::Closed("store '" + path_ + "' is closed");
  return Status::OK();
}

Status Store::FeatureFor(const std::string& name, FeatureDef* def) {
  std::lock_guard<std::mutex> l(mu_);
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

Status Store::CreateFeature(const std::string& name, const std::string& type, FeatureDef* out) {
  RF_RETURN_IF_ERROR(CheckWritable());
  if (name.empty() || name.size() > 255)
    return Status::InvalidArgument("feature name must be 1..255 bytes, got " + std::to_string(name.size()));
  ValueType vt;
  uint32_t dim;
  RF_RETURN_IF_ERROR(ParseValueType(type, &vt, &dim));
  std::lock_guard<std::mutex> wl(write_mu_);
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
  RF_RETURN_IF_ERROR(meta_.Commit(&b));
  pstate_ = next;
  {
    std::lock_guard<std::mutex> l(mu_);
    FeatureState* f = features_.Add(d);
    f->index.track_lengths(d.variable());
    if (!o_.accounting) f->index.Defer();  // accounting mode has no pages to materialize from
    defs_[name] = d;
  }
  *out = d;
  return Status::OK();
}

Status Store::LookupFeature(const std::string& name, FeatureDef* out) {
  RF_RETURN_IF_ERROR(CheckOpen());
  return FeatureFor(name, out);
}

std::vector<FeatureDef> Store::Features() {
  std::lock_guard<std::mutex> l(mu_);
  std::vector<FeatureDef> v;
  for (const auto& [n, d] : defs_) v.push_back(d);
  std::sort(v.begin(), v.end(), [](const FeatureDef& a, const FeatureDef& b) { return a.id < b.id; });
  return v;
}

// ---------------------------------------------------------------------------------------
// Write path

Status Store::Put(const std::string& feature, const uint64_t* keys, size_t n, const uint8_t* values,
                  size_t values_len, const int64_t* offsets) {
  RF_RETURN_IF_ERROR(CheckWritable());
  FeatureDef def;
  RF_RETURN_IF_ERROR(FeatureFor(feature, &def));
  if (n == 0) return Status::OK();
  const uint32_t width = def.fixed_width();
  const uint32_t max_value = PageBuilder::MaxValueBytes(o_.page_size);
  if (width) {
    if (values_len != n * width)
      return Status::InvalidArgument("feature '" + feature + "': " + std::to_string(n) + " keys need " +
                                     std::to_string(n * width) + " value bytes, got " + std::to_string(values_len));
  } else {
    if (!offsets) return Status::InvalidArgument("feature '" + feature + "': variable-width values need offsets");
    const uint32_t elem = def.element_size();
    if (offsets[0] < 0 || static_cast<size_t>(offsets[n]) > values_len)
      return Status::InvalidArgument("feature '" + feature + "': value offsets out of bounds");
    for (size_t i = 0; i < n; i++) {
      const int64_t len = offsets[i + 1] - offsets[i];
      if (len < 0) return Status::InvalidArgument("feature '" + feature + "': value offsets decrease at item " + std::to_string(i));
      if (len % elem) return Status::Schema("feature '" + feature + "': value of key " + std::to_string(keys[i]) +
                                            " is not a whole number of elements");
      if (len > max_value)
        return Status::TooLarge("feature '" + feature + "': the value of key " + std::to_string(keys[i]) + " is " +
                                std::to_string(len) + " bytes; a page of " + std::to_string(o_.page_size) +
                                " bytes holds at most " + std::to_string(max_value));
    }
  }
  WriteOp w;
  if (!o_.bulk_load && !o_.accounting)
    BatchParts(kOpPut, def.id, keys, n, width, values, offsets, w.header, &w.lens, &w.parts, &w.payload_bytes);
  w.fid = def.id;
  w.keys = keys;
  w.n = n;
  w.values = values;
  w.offsets = offsets;
  w.width = width;
  return Write(&w);
}

Status Store::Delete(const std::string& feature, const uint64_t* keys, size_t n) {
  RF_RETURN_IF_ERROR(CheckWritable());
  FeatureDef def;
  RF_RETURN_IF_ERROR(FeatureFor(feature, &def));
  if (n == 0) return Status::OK();
  WriteOp w;
  if (!o_.bulk_load && !o_.accounting)
    BatchParts(kOpDelete, def.id, keys, n, def.fixed_width(), nullptr, nullptr, w.header, &w.lens, &w.parts,
               &w.payload_bytes);
  w.fid = def.id;
  w.keys = keys;
  w.n = n;
  w.width = def.fixed_width();
  w.tomb = true;
  return Write(&w);
}

Status Store::Write(WriteOp* w) {
  std::unique_lock<std::mutex> ql(queue_mu_);
  writers_.push_back(w);
  while (!w->done && writers_.front() != w) w->cv.wait(ql);
  if (w->done) return w->status;
  // This writer leads a group: everything queued behind it goes into one WAL write.
  std::vector<WriteOp*> group;
  size_t bytes = 0;
  for (WriteOp* x : writers_) {
    if (!group.empty() && bytes + x->payload_bytes > (8u << 20)) break;
    group.push_back(x);
    bytes += x->payload_bytes;
  }
  ql.unlock();

  Status s;
  {
    std::lock_guard<std::mutex> wl(write_mu_);
    s = closed_ ? Status::Closed("store '" + path_ + "' is closed") : bg_error_;
    bool sync = o_.sync_on_write;
    const bool logged = !o_.accounting && !o_.bulk_load;
    for (WriteOp* x : group) {
      if (!s.ok() || !logged) break;
      s = wal_.AppendParts(kWalBatch, x->parts.data(), x->parts.size());
      // A failed append may have left part of a record in the log; replay stops there, so
      // nothing appended behind it would survive: the store takes no more writes (RocksDB
      // does the same on a WAL write error).
      if (s.code() == Status::Code::kIOError) bg_error_ = s;
      sync = sync || x->sync;
    }
    if (s.ok() && sync && logged) {
      s = wal_.Sync();
      // After a failed fsync the kernel may have dropped the dirty pages; a later fsync
      // could then succeed without them ("fsyncgate"): no acknowledgement after this one.
      if (!s.ok()) bg_error_ = s;
    }
    if (s.ok()) {
      std::lock_guard<std::mutex> l(mu_);
      for (WriteOp* x : group)
        buffer_.feature(x->fid).Append(x->keys, x->n, x->values, x->offsets, x->width, x->tomb);
    }
    if (s.ok()) {
      uint64_t buffered;
      {
        std::lock_guard<std::mutex> l(mu_);
        buffered = buffer_.bytes();
      }
      if (buffered >= o_.write_buffer_bytes) s = FlushLocked(o_.bulk_load);
    }
  }

  ql.lock();
  for (WriteOp* x : group) {
    writers_.pop_front();
    x->status = s;
    x->done = true;
    if (x != w) x->cv.notify_one();
  }
  if (!writers_.empty()) writers_.front()->cv.notify_one();
  return s;
}

Status Store::Sync() {
  RF_RETURN_IF_ERROR(CheckWritable());
  std::lock_guard<std::mutex> wl(write_mu_);
  RF_RETURN_IF_ERROR(bg_error_);
  // Bulk-load mode has no log to sync: the buffer itself goes to pages.
  if (o_.bulk_load) return FlushLocked(true);
  Status s = wal_.Sync();
  if (!s.ok()) bg_error_ = s;  // see Write: a failed fsync is not retried
  return s;
}

Status Store::Flush(bool force) {
  RF_RETURN_IF_ERROR(CheckWritable());
  std::lock_guard<std::mutex> wl(write_mu_);
  // Bulk-load mode never pins: unlogged items held back would not be durable after flush().
  return FlushLocked(force || o_.bulk_load);
}

Status Store::FlushLocked(bool force) {
  RF_RETURN_IF_ERROR(bg_error_);
  std::vector<uint32_t> write_fids;
  std::set<uint32_t> pinned;
  {
    std::lock_guard<std::mutex> l(mu_);
    std::vector<PinCandidate> cands;
    for (auto& [fid, fb] : buffer_.all()) {
      fb.Normalize();
      if (fb.size()) cands.push_back({fid, fb.size(), fb.bytes(), fb.pinned_flushes});
    }
    if (!force)
      for (uint32_t fid : pinner_.Choose(cands, o_.write_buffer_bytes, o_.page_size)) pinned.insert(fid);
    for (const auto& c : cands)
      if (!pinned.count(c.fid)) write_fids.push_back(c.fid);
  }
  // Everything acknowledged so far becomes durable first (flush is a durability point).
  Status s = o_.accounting ? Status::OK() : wal_.Sync();
  if (!s.ok()) return bg_error_ = s;
  if (write_fids.empty()) return Status::OK();

  // Start a new WAL file holding only what stays pinned; once this flush commits, the older
  // files are obsolete. In bulk-load mode nothing is logged: while the open file is empty and
  // the only live one, there is nothing to rotate away.
  const bool rotate = !o_.accounting && !(o_.bulk_load && wal_.file_bytes() == 0 && pstate_.wal_start == wal_number_);
  const uint64_t new_wal = rotate ? wal_number_ + 1 : wal_number_;
  if (rotate) s = wal_.Open(WalFileName(wal_dir_, new_wal));
  if (s.ok() && rotate) {
    for (uint32_t fid : pinned) {
      std::vector<std::string> payloads;
      EncodeBuffered(fid, features_.Get(fid)->def.fixed_width(), buffer_.find(fid)->items(), &payloads);
      for (const auto& p : payloads)
        if (s.ok()) s = wal_.Append(kWalBatch, p);
    }
    if (s.ok()) s = wal_.Sync();
    if (s.ok()) s = SyncDir(wal_dir_);
  }
  if (!s.ok()) return bg_error_ = s;
  wal_number_ = new_wal;

  for (uint32_t fid : write_fids) {
    s = LoadIndex(features_.Get(fid));
    if (!s.ok()) return bg_error_ = s;
  }
  // Items are written grouped by feature, ascending keys. The buffer is not modified until
  // the new version is installed (no writer runs: we hold write_mu_), so records point into it.
  // A feature whose index is deferred and whose buffered items are all puts above its stored
  // keys is an append: its items go to pages straight from the buffer (no per-item record, no
  // index lookup) and the index stays deferred. Everything else takes the general path.
  std::vector<AppendRun> runs;
  std::vector<Rec> recs;
  for (uint32_t fid : write_fids) {
    FeatureState* f = features_.Get(fid);
    const BufferedItems& b = buffer_.find(fid)->items();
    f->touched = true;
    if (f->index.deferred() && IsAppend(f, b)) {
      uint64_t bytes = 0;
      if (f->def.fixed_width()) {
        bytes = b.size() * ItemBytes(f->def.fixed_width());
      } else {
        for (size_t i = 0; i < b.size(); i++) bytes += ItemBytes(b.len[i]);
      }
      pstate_.user_bytes_written += bytes;
      runs.push_back({fid, &b, bytes});
      continue;
    }
    s = MaterializeIndexLocked(f);
    if (!s.ok()) return bg_error_ = s;
    size_t hint = 0;
    for (size_t i = 0; i < b.size(); i++) {
      const int64_t pos = f->index.FindFrom(b.keys[i], &hint);
      pstate_.user_bytes_written += ItemBytes(b.len[i]);
      if (b.tomb[i] && pos == KeyIndex::kAbsent) continue;  // nothing on disk to hide
      if (b.tomb[i] && pos != KeyIndex::kAbsent && (f->index.loc(pos) & KeyIndex::kTomb)) continue;  // already deleted
      recs.push_back({fid, b.keys[i], b.tomb[i] != 0, b.value(i), b.len[i], pos});
    }
  }
  std::set<uint32_t> dirty, freed;
  uint64_t pw = 0;
  s = WriteRecordsLocked(runs, recs, &dirty, &freed, &pw);
  flush_pages_written_ += pw;
  if (s.ok()) {
    pstate_.wal_start = new_wal;
    s = CommitLocked(dirty, freed);
  }
  if (!s.ok()) return bg_error_ = s;
  {
    // Install: the flushed items leave the buffer in the same step that the version naming
    // their pages appears, so readers see them exactly once.
    auto v = BuildVersion(current_->number + 1);
    std::lock_guard<std::mutex> l(mu_);
    for (uint32_t fid : write_fids) buffer_.find(fid)->Clear();
    buffer_.TrimCapacity(o_.write_buffer_bytes);
    for (uint32_t fid : pinned) buffer_.find(fid)->pinned_flushes++;
    current_ = v;
    index_ahead_ = false;
    for (uint32_t p : freed) pending_free_.emplace_back(v->number, p);
  }
  std::vector<uint64_t> numbers;
  if (rotate && ListWalFiles(wal_dir_, &numbers).ok())
    for (uint64_t no : numbers)
      if (no < new_wal) ::unlink(WalFileName(wal_dir_, no).c_str());
  flushes_++;
  ReleasePendingLocked();
  s = MaintainLocked();
  if (!s.ok()) return bg_error_ = s;
  return Status::OK();
}

void Store::InvalidateLocked(FeatureState* f, size_t pos, std::set<uint32_t>* dirty, std::set<uint32_t>* freed) {
  const uint32_t loc = f->index.loc(pos);
  const uint32_t pid = loc & ~KeyIndex::kTomb;
  PageMeta& pm = pages_.at(pid);
  SegMeta* sm = pm.seg(f->def.id);
  sm->valid--;
  if (loc & KeyIndex::kTomb) {
    f->tombs--;
  } else {
    const uint64_t b = ItemBytes(f->def.variable() ? f->index.len(pos) : f->def.fixed_width());
    sm->valid_bytes -= b;
    f->live_items--;
    f->live_bytes -= b;
  }
  if (sm->valid == 0) {
    sm->retired = true;
    auto it = std::find(f->pages.begin(), f->pages.end(), pid);
    if (it != f->pages.end()) {
      *it = f->pages.back();
      f->pages.pop_back();
    }
    if (pm.valid() == 0) {
      dirty->erase(pid);
      freed->insert(pid);
    } else {
      dirty->insert(pid);
    }
  }
}

bool Store::IsAppend(const FeatureState* f, const BufferedItems& b) {
  if (b.size() == 0) return false;
  if (std::memchr(b.tomb.data(), 1, b.tomb.size()) != nullptr) return false;
  uint64_t last;
  if (f->index.LastKey(&last) && b.keys.front() <= last) return false;
  const uint32_t w = f->def.fixed_width();
  // Fixed-width values are packed in key order (see FeatureBuffer): value i at i * width.
  return w == 0 || (b.arena.size() == b.size() * w && b.off.back() == (b.size() - 1) * w);
}

Status Store::MaterializeIndexLocked(FeatureState* f) {
  if (!f->index.deferred()) return Status::OK();
  // Every record of the feature's live segments is current (see KeyIndex): read them all.
  struct R {
    uint64_t key;
    uint32_t pid;
    uint32_t len;
  };
  std::vector<R> recs;
  recs.reserve(f->index.deferred_items());
  std::vector<uint32_t> pids = f->pages;
  std::sort(pids.begin(), pids.end());
  std::vector<uint64_t> keys;
  const FeatureDef& def = f->def;
  auto cb = [&](uint32_t pid, const PageView& pv) -> Status {
    SegmentView sv;
    if (!pv.Find(def.id, &sv))
      return Status::Corruption("page " + std::to_string(pid) + " of '" + pages_path_ +
                                "' lacks the segment of feature '" + def.name + "' that the page table names");
    sv.width = def.fixed_width();
    keys.resize(sv.count);
    sv.DecodeKeys(keys.data());
    for (uint32_t i = 0; i < sv.count; i++) {
      const uint8_t* v;
      uint32_t len;
      sv.Value(i, &v, &len);
      recs.push_back({keys[i], pid, len});
    }
    return Status::OK();
  };
  if (!pids.empty()) {
    RF_RETURN_IF_ERROR(ReadPages(write_ring_.get(), pids, cb));
    pages_read_ += pids.size();
    bytes_read_ += pids.size() * static_cast<uint64_t>(o_.page_size);
  }
  std::sort(recs.begin(), recs.end(), [](const R& a, const R& b) { return a.key < b.key; });
  std::vector<uint64_t> k(recs.size());
  std::vector<uint32_t> l(recs.size()), n(recs.size());
  for (size_t i = 0; i < recs.size(); i++) {
    k[i] = recs[i].key;
    l[i] = recs[i].pid;
    n[i] = recs[i].len;
  }
  std::vector<R>().swap(recs);
  std::lock_guard<std::mutex> index_lock(mu_);  // get() reads the key index under mu_
  f->index.Undefer();
  f->index.InsertNew(k, l, n);
  return Status::OK();
}

Status Store::WriteRecordsLocked(const std::vector<AppendRun>& runs, std::vector<Rec>& recs,
                                 std::set<uint32_t>* dirty, std::set<uint32_t>* freed, uint64_t* pages_written) {
  *pages_written = 0;
  if (recs.empty() && runs.empty()) return Status::OK();
  const uint32_t ps = o_.page_size;
  constexpr uint32_t kBlockPages = 32;
  std::vector<AlignedBuffer>& blocks = write_blocks_;  // reused across flushes: no faults
  size_t blocks_used = 0;
  std::vector<std::vector<SegmentSummary>> summaries;
  std::vector<uint64_t> seqs;
  std::vector<uint32_t> rec_page(recs.size());
  PageBuilder pb(ps, o_.compact_pages && !o_.accounting);
  AlignedBuffer scratch(o_.accounting ? ps : 0);  // accounting: pages are built, not kept
  auto page_ptr = [&](size_t i) {
    return o_.accounting ? scratch.data() : blocks[i / kBlockPages].data() + (i % kBlockPages) * static_cast<size_t>(ps);
  };
  auto finish = [&]() {
    const size_t i = summaries.size();
    if (!o_.accounting && i % kBlockPages == 0 && ++blocks_used > blocks.size())
      blocks.emplace_back(static_cast<size_t>(kBlockPages) * ps);
    summaries.emplace_back();
    seqs.push_back(pstate_.next_seq++);
    // No checksum yet: StampPageId computes it once the page id is known.
    pb.Finish(page_ptr(i), seqs.back(), 0, &summaries.back(), false);
    pb.Reset();
  };
  auto too_large = [](const FeatureDef& def, uint64_t key) {
    return Status::TooLarge("feature '" + def.name + "': the value of key " + std::to_string(key) +
                            " does not fit in a page");
  };
  for (const AppendRun& run : runs) {
    const FeatureDef& def = features_.Get(run.fid)->def;
    const BufferedItems& b = *run.items;
    const uint32_t w = def.fixed_width();
    for (size_t i = 0; i < b.size();) {
      const size_t k = w ? pb.AddRun(def, &b.keys[i], b.arena.data() + i * w, b.size() - i)
                         : (pb.Add(def, b.keys[i], b.value(i), b.len[i], false) ? 1 : 0);
      if (k == 0) {
        if (pb.empty()) return too_large(def, b.keys[i]);
        finish();
        continue;
      }
      i += k;
    }
  }
  for (size_t r = 0; r < recs.size(); r++) {
    const Rec& x = recs[r];
    const FeatureDef& def = features_.Get(x.fid)->def;
    if (!pb.Add(def, x.key, x.value, x.len, x.tomb)) {
      finish();
      if (!pb.Add(def, x.key, x.value, x.len, x.tomb)) return too_large(def, x.key);
    }
    rec_page[r] = static_cast<uint32_t>(summaries.size());
  }
  finish();
  const size_t npages = summaries.size();
  const std::vector<uint32_t> ids = pages_.Allocate(static_cast<uint32_t>(npages));
  if (!o_.accounting) RF_RETURN_IF_ERROR(WritePagesLocked(ids, page_ptr));
  pstate_.pages_written += npages;
  *pages_written = npages;

  // The pages are durable: update the tables (committed to RocksDB by the caller).
  UpdateTablesLocked(recs, rec_page, ids, summaries, seqs, dirty, freed);
  if (!runs.empty()) {
    std::lock_guard<std::mutex> index_lock(mu_);
    for (const AppendRun& run : runs) {
      FeatureState* f = features_.Get(run.fid);
      f->live_items += run.items->size();
      f->live_bytes += run.bytes;
      f->index.AppendDeferred(run.items->size(), run.items->keys.back());
    }
  }
  return Status::OK();
}

template <typename PagePtr>
Status Store::WritePagesLocked(const std::vector<uint32_t>& ids, const PagePtr& page_ptr) {
  const uint32_t ps = o_.page_size;
  constexpr uint32_t kBlockPages = 32;
  const size_t npages = ids.size();
  for (size_t i = 0; i < npages; i++) StampPageId(page_ptr(i), ps, ids[i]);
  if (npages) RF_RETURN_IF_ERROR(file_.Reserve(static_cast<uint64_t>(*std::max_element(ids.begin(), ids.end())) + 1));
  // Runs of consecutive ids within one block go out as one write.
  std::vector<PageRun> runs;
  std::vector<const uint8_t*> src;
  const uint32_t max_run = std::max(1u, o_.max_io_bytes / ps);
  for (size_t i = 0; i < npages; i++) {
    if (!runs.empty() && ids[i] == runs.back().first + runs.back().count && i % kBlockPages != 0 &&
        runs.back().count < max_run) {
      runs.back().count++;
    } else {
      runs.push_back({ids[i], 1});
      src.push_back(page_ptr(i));
    }
  }
  RF_RETURN_IF_ERROR(write_ring_->WriteRuns(file_.fd(), pages_path_, ps, runs, src));
  return file_.Sync();
}

void Store::UpdateTablesLocked(const std::vector<Rec>& recs, const std::vector<uint32_t>& rec_page,
                               const std::vector<uint32_t>& ids,
                               const std::vector<std::vector<SegmentSummary>>& summaries,
                               const std::vector<uint64_t>& seqs, std::set<uint32_t>* dirty, std::set<uint32_t>* freed) {
  const size_t npages = ids.size();
  for (size_t i = 0; i < npages; i++) {
    std::vector<SegMeta> segs;
    for (const auto& s : summaries[i]) {
      SegMeta m;
      m.fid = s.feature_id;
      m.count = s.count;
      m.tombs = s.tombs;
      m.min_key = s.min_key;
      m.max_key = s.max_key;
      m.length = s.length;
      m.valid = s.count;
      m.valid_bytes = s.item_bytes;
      segs.push_back(m);
      features_.Get(s.feature_id)->pages.push_back(ids[i]);
    }
    pages_.MarkLive(ids[i], seqs[i], std::move(segs));
    dirty->insert(ids[i]);
  }
  std::vector<uint64_t> new_keys;
  std::vector<uint32_t> new_locs, new_lens;
  std::lock_guard<std::mutex> index_lock(mu_);  // get() reads the key index under mu_
  index_ahead_ = true;                          // until the caller installs the new version
  for (size_t r = 0; r < recs.size(); r++) {
    const Rec& x = recs[r];
    FeatureState* f = features_.Get(x.fid);
    const uint32_t loc = ids[rec_page[r]] | (x.tomb ? KeyIndex::kTomb : 0);
    if (x.tomb) {
      f->tombs++;
    } else {
      f->live_items++;
      f->live_bytes += ItemBytes(x.len);
    }
    if (x.pos != KeyIndex::kAbsent) {
      InvalidateLocked(f, static_cast<size_t>(x.pos), dirty, freed);
      f->index.set_loc(static_cast<size_t>(x.pos), loc);
      f->index.set_len(static_cast<size_t>(x.pos), x.tomb ? 0 : x.len);
    } else {
      new_keys.push_back(x.key);
      new_locs.push_back(loc);
      new_lens.push_back(x.tomb ? 0 : x.len);
    }
    const bool last_of_feature = r + 1 == recs.size() || recs[r + 1].fid != x.fid;
    if (last_of_feature && !new_keys.empty()) {
      f->index.InsertNew(new_keys, new_locs, new_lens);
      new_keys.clear();
      new_locs.clear();
      new_lens.clear();
    }
  }
}

Status Store::CommitLocked(const std::set<uint32_t>& dirty, const std::set<uint32_t>& freed) {
  rocksdb::WriteBatch b;
  for (uint32_t p : dirty)
    if (pages_.at(p).live) MetaStore::PutPage(&b, p, pages_.at(p));
  for (uint32_t p : freed) MetaStore::DeletePage(&b, p);
  MetaStore::PutState(&b, pstate_);
  if (!o_.accounting && !o_.read_only) RF_RETURN_IF_ERROR(meta_.Commit(&b));
  for (uint32_t p : freed) pages_.MarkDead(p);
  return Status::OK();
}

void Store::ReleasePendingLocked() {
  std::vector<uint32_t> release;
  {
    std::lock_guard<std::mutex> l(mu_);
    const uint64_t oldest = readers_.empty() ? UINT64_MAX : *readers_.begin();
    auto it = std::partition(pending_free_.begin(), pending_free_.end(),
                             [&](const std::pair<uint64_t, uint32_t>& e) { return e.first > oldest; });
    for (auto j = it; j != pending_free_.end(); ++j) release.push_back(j->second);
    pending_free_.erase(it, pending_free_.end());
  }
  std::sort(release.begin(), release.end());
  for (const PageRun& r : CoalescePages(release, UINT32_MAX)) {
    // Best effort: the slot is reusable either way (a failure only keeps its old bytes
    // allocated), so it is counted in stats rather than failing the flush.
    if (!o_.accounting && !file_.Punch(r.first, r.count).ok()) punch_failures_++;
    for (uint32_t i = 0; i < r.count; i++) pages_.AddFree(r.first + i);
  }
}

std::shared_ptr<const Version> Store::BuildVersion(uint64_t number) {
  auto v = std::make_shared<Version>();
  v->number = number;
  for (FeatureState* f : features_.All()) {
    if (v->features.size() <= f->def.id) v->features.resize(f->def.id + 1);
    auto refs = std::make_shared<std::vector<PageRef>>();
    refs->reserve(f->pages.size());
    for (uint32_t p : f->pages) {
      const PageMeta& pm = pages_.at(p);
      for (const auto& s : pm.segs)
        if (s.fid == f->def.id && !s.retired && s.valid > 0)
          refs->push_back({p, s.count, s.valid, s.tombs, pm.segs.size() == 1, pm.seq, s.min_key, s.max_key});
    }
    std::sort(refs->begin(), refs->end(), [](const PageRef& a, const PageRef& b) {
      return a.min_key < b.min_key || (a.min_key == b.min_key && a.page < b.page);
    });
    v->features[f->def.id] = std::move(refs);
  }
  return v;
}

uint32_t Store::DeferredPage(const Version& v, uint32_t fid, uint64_t key) {
  if (fid >= v.features.size() || !v.features[fid]) return UINT32_MAX;
  const std::vector<PageRef>& refs = *v.features[fid];  // sorted by min_key, disjoint
  auto it = std::upper_bound(refs.begin(), refs.end(), key, [](uint64_t k, const PageRef& r) { return k < r.min_key; });
  if (it == refs.begin()) return UINT32_MAX;
  --it;
  return key <= it->max_key ? it->page : UINT32_MAX;
}

// ---------------------------------------------------------------------------------------
// Merger and reclamation

Status Store::Compact(const std::vector<std::string>& names) {
  RF_RETURN_IF_ERROR(CheckWritable());
  std::vector<FeatureDef> defs;
  for (const auto& n : names) {
    FeatureDef d;
    RF_RETURN_IF_ERROR(FeatureFor(n, &d));
    defs.push_back(d);
  }
  std::lock_guard<std::mutex> wl(write_mu_);
  RF_RETURN_IF_ERROR(FlushLocked(true));
  if (names.empty())
    for (FeatureState* f : features_.All()) defs.push_back(f->def);
  for (const FeatureDef& d : defs) {
    FeatureState* f = features_.Get(d.id);
    if (f->pages.size() < 2 && (f->pages.empty() || pages_.at(f->pages[0]).seg(d.id)->valid ==
                                                         pages_.at(f->pages[0]).seg(d.id)->count))
      continue;  // already packed
    std::vector<MoveTask> tasks;
    for (uint32_t p : f->pages) tasks.push_back({p, d.id});
    merger_.stats().victims++;
    merger_.stats().pages_gathered += tasks.size();
    Status s = RewriteLocked(tasks, true);
    if (!s.ok()) return bg_error_ = s;  // DRAM tables may be ahead of the metadata, as in a flush
  }
  return Status::OK();
}

Status Store::MaintainLocked() {
  std::vector<FeatureState*> touched;
  for (FeatureState* f : features_.All())
    if (f->touched) {
      touched.push_back(f);
      f->touched = false;
    }
  std::vector<MoveTask> tasks = merger_.Plan(touched, pages_, o_.page_size);
  if (!tasks.empty()) RF_RETURN_IF_ERROR(RewriteLocked(tasks, true));
  tasks = reclaimer_.Plan(pages_, o_.page_size);
  if (!tasks.empty()) RF_RETURN_IF_ERROR(RewriteLocked(tasks, false));
  return Status::OK();
}

Status Store::RewriteLocked(const std::vector<MoveTask>& tasks, bool merge) {
  const uint32_t ps = o_.page_size;
  std::map<uint32_t, std::vector<uint32_t>> want;  // page -> features to move out of it
  for (const auto& t : tasks) want[t.page].push_back(t.fid);
  std::vector<uint32_t> pids;
  for (const auto& [p, f] : want) pids.push_back(p);
  // Moving records needs each key's current location: load checkpointed indexes and
  // materialize deferred ones first.
  for (const auto& [pid, wf] : want) {
    const bool all = std::find(wf.begin(), wf.end(), MoveTask::kAllFeatures) != wf.end();
    for (const auto& sm : pages_.at(pid).segs) {
      FeatureState* f = features_.Get(sm.fid);
      RF_RETURN_IF_ERROR(LoadIndex(f));
      if (sm.retired || (!all && std::find(wf.begin(), wf.end(), sm.fid) == wf.end())) continue;
      RF_RETURN_IF_ERROR(MaterializeIndexLocked(f));
    }
  }

  struct Moved {
    uint32_t fid;
    uint64_t key;
    bool tomb;
    uint64_t off;
    uint32_t len;
    int64_t pos;
  };
  std::vector<Moved> moved;
  std::vector<uint8_t> arena;
  std::map<uint32_t, std::set<uint32_t>> src_pages;  // fid -> pages its records leave
  std::vector<uint64_t> keys;
  auto cb = [&](uint32_t pid, const PageView& pv) -> Status {
    const auto& wf = want[pid];
    const bool all = std::find(wf.begin(), wf.end(), MoveTask::kAllFeatures) != wf.end();
    for (uint32_t si = 0; si < pv.nseg(); si++) {
      SegmentView sv = pv.Segment(si);
      if (!all && std::find(wf.begin(), wf.end(), sv.feature_id) == wf.end()) continue;
      SegMeta* sm = pages_.at(pid).seg(sv.feature_id);
      if (!sm || sm->retired) continue;
      FeatureState* f = features_.Get(sv.feature_id);
      sv.width = f->def.fixed_width();
      keys.resize(sv.count);
      sv.DecodeKeys(keys.data());
      size_t hint = 0;
      for (uint32_t i = 0; i < sv.count; i++) {
        const int64_t pos = f->index.FindFrom(keys[i], &hint);
        if (pos == KeyIndex::kAbsent || (f->index.loc(pos) & ~KeyIndex::kTomb) != pid) continue;  // stale
        const uint8_t* v;
        uint32_t len;
        sv.Value(i, &v, &len);
        const bool tomb = (f->index.loc(pos) & KeyIndex::kTomb) != 0;
        if (tomb) len = 0;
        moved.push_back({sv.feature_id, keys[i], tomb, arena.size(), len, pos});
        arena.insert(arena.end(), v, v + len);
      }
      src_pages[sv.feature_id].insert(pid);
    }
    return Status::OK();
  };
  if (o_.accounting) {
    // No page contents: a record of F in page p is valid iff F's key index points at p.
    std::map<uint32_t, std::vector<uint8_t>> in_victim;  // fid -> page bitmap
    for (const auto& [pid, wf] : want) {
      const bool all = std::find(wf.begin(), wf.end(), MoveTask::kAllFeatures) != wf.end();
      for (const auto& sm : pages_.at(pid).segs) {
        if (sm.retired || (!all && std::find(wf.begin(), wf.end(), sm.fid) == wf.end())) continue;
        auto& bm = in_victim[sm.fid];
        bm.resize(pages_.slots(), 0);
        bm[pid] = 1;
        src_pages[sm.fid].insert(pid);
      }
    }
    uint32_t max_len = 0;
    for (auto& [fid, bm] : in_victim) {
      const FeatureState* f = features_.Get(fid);
      const KeyIndex& idx = f->index;
      const uint32_t w = f->def.fixed_width();
      for (size_t i = 0; i < idx.size(); i++) {
        const uint32_t loc = idx.loc(i);
        const uint32_t p = loc & ~KeyIndex::kTomb;
        if (p >= bm.size() || !bm[p]) continue;
        const bool tomb = (loc & KeyIndex::kTomb) != 0;
        const uint32_t len = tomb ? 0 : (w ? w : idx.len(i));
        max_len = std::max(max_len, len);
        moved.push_back({fid, idx.key(i), tomb, 0, len, static_cast<int64_t>(i)});
      }
    }
    arena.assign(std::max<uint32_t>(max_len, 1), 0);  // values do not matter, sizes do
  } else {
    RF_RETURN_IF_ERROR(ReadPages(write_ring_.get(), pids, cb));
  }
  pages_read_ += pids.size();
  bytes_read_ += pids.size() * static_cast<uint64_t>(ps);

  std::sort(moved.begin(), moved.end(),
            [](const Moved& a, const Moved& b) { return a.fid < b.fid || (a.fid == b.fid && a.key < b.key); });
  // A tombstone can go once no other live segment of its feature could still hold an older
  // version of the key (recovery would otherwise resurrect it).
  std::vector<Rec> recs;
  std::map<uint32_t, std::vector<size_t>> drop;  // fid -> index positions of dropped tombstones
  for (const Moved& m : moved) {
    if (m.tomb) {
      FeatureState* f = features_.Get(m.fid);
      const auto& src = src_pages[m.fid];
      bool covered = false;
      for (uint32_t p : f->pages) {
        if (src.count(p)) continue;
        const SegMeta* s = pages_.at(p).seg(m.fid);
        if (s && !s->retired && s->min_key <= m.key && m.key <= s->max_key) {
          covered = true;
          break;
        }
      }
      if (!covered) {
        drop[m.fid].push_back(static_cast<size_t>(m.pos));
        continue;
      }
    }
    recs.push_back({m.fid, m.key, m.tomb, arena.data() + m.off, m.len, m.pos});
  }
  std::set<uint32_t> dirty, freed;
  uint64_t pw = 0;
  RF_RETURN_IF_ERROR(WriteRecordsLocked({}, recs, &dirty, &freed, &pw));
  std::unique_lock<std::mutex> index_lock(mu_);
  index_ahead_ = true;
  for (auto& [fid, positions] : drop) {
    FeatureState* f = features_.Get(fid);
    std::sort(positions.begin(), positions.end());
    for (size_t pos : positions) InvalidateLocked(f, pos, &dirty, &freed);
    f->index.Erase(positions);
  }
  index_lock.unlock();
  RF_RETURN_IF_ERROR(CommitLocked(dirty, freed));
  {
    auto v = BuildVersion(current_->number + 1);
    std::lock_guard<std::mutex> l(mu_);
    current_ = v;
    index_ahead_ = false;
    for (uint32_t p : freed) pending_free_.emplace_back(v->number, p);
  }
  if (merge) {
    auto& st = merger_.stats();
    st.items_moved += recs.size();
    st.pages_written += pw;
    st.bytes_written += pw * ps;
    st.pages_released += freed.size();
  } else {
    auto& st = reclaimer_.stats();
    st.items_moved += recs.size();
    st.bytes_written += pw * ps;
    st.pages_released += freed.size();
  }
  ReleasePendingLocked();
  return Status::OK();
}

// ---------------------------------------------------------------------------------------
// Read path

namespace {

// Page id -> position in a feature's page list: open addressing, a few ns per lookup
// whatever the page ids (a flat table over the id range could be megabytes for a
// three-page feature of a large store).
class ChunkOfPage {
 public:
  explicit ChunkOfPage(const std::vector<PageRef>& refs) {
    size_t cap = 16;
    while (cap < 2 * refs.size()) cap <<= 1;
    mask_ = cap - 1;
    slots_.assign(cap, {UINT32_MAX, -1});
    for (size_t j = 0; j < refs.size(); j++) {
      size_t h = Hash(refs[j].page);
      while (slots_[h].first != UINT32_MAX) h = (h + 1) & mask_;
      slots_[h] = {refs[j].page, static_cast<int32_t>(j)};
    }
  }
  int32_t Find(uint32_t page) const {
    for (size_t h = Hash(page);; h = (h + 1) & mask_) {
      if (slots_[h].first == page) return slots_[h].second;
      if (slots_[h].first == UINT32_MAX) return -1;
    }
  }

 private:
  size_t Hash(uint32_t page) const { return (page * 0x9E3779B1u) & mask_; }
  size_t mask_;
  std::vector<std::pair<uint32_t, int32_t>> slots_;
};

}  // namespace

Status Store::ReadPages(IoRing* ring, const std::vector<uint32_t>& sorted_pids, const PageFn& fn) {
  const uint32_t ps = o_.page_size;
  const auto runs = CoalescePages(sorted_pids, ring->slot_bytes() / ps);
  return ring->ReadRuns(file_.fd(), pages_path_, ps, runs, [&](const PageRun& run, const uint8_t* data) -> Status {
    for (uint32_t k = 0; k < run.count; k++) {
      PageView pv;
      RF_RETURN_IF_ERROR(PageView::Parse(data + static_cast<size_t>(k) * ps, ps, run.first + k, pages_path_, &pv));
      RF_RETURN_IF_ERROR(fn(run.first + k, pv));
    }
    return Status::OK();
  });
}

void Store::FinishRead(uint64_t pages, uint64_t useful, double encoded, uint64_t items, double t0, ReadStats* st) {
  st->pages_read = pages;
  st->bytes_read = pages * static_cast<uint64_t>(o_.page_size);
  st->useful_bytes = useful;
  st->encoded_bytes = encoded;
  st->items = items;
  st->seconds = Now() - t0;
  pages_read_ += st->pages_read;
  bytes_read_ += st->bytes_read;
  useful_bytes_read_ += useful;
  encoded_bytes_read_ = encoded_bytes_read_ + encoded;
  reads_++;
}

Status Store::ScanMany(const std::vector<std::string>& names, uint64_t lo, uint64_t hi, std::vector<ColumnData>* out,
                       ReadStats* st) {
  const double t0 = Now();
  RF_RETURN_IF_ERROR(CheckOpen());
  RF_RETURN_IF_ERROR(CheckReadable());
  const size_t nf = names.size();
  const bool to_end = hi == UINT64_MAX;
  // Upper-bound position of hi in a sorted key array.
  auto upper = [&](const uint64_t* b, const uint64_t* e) { return to_end ? e : std::lower_bound(b, e, hi); };
  std::vector<FeatureDef> defs(nf);
  for (size_t i = 0; i < nf; i++) {
    RF_RETURN_IF_ERROR(FeatureFor(names[i], &defs[i]));
    // Checkpointed key indexes decode on first use; the index-guided merge below needs them.
    if (FeatureState* f = FeatureStateFor(defs[i].id)) RF_RETURN_IF_ERROR(LoadIndex(f));
  }
  out->assign(nf, ColumnData());
  std::vector<BufferedItems> buf(nf);
  std::shared_ptr<const Version> v;
  // Sparse-key features whose pages overlap (after updates) are resolved through a private
  // copy of their key index: it names the page of every key's current version, so the
  // output is one pass in key order with a cursor per page — no comparisons between pages.
  // The copy is taken with the version under mu_ so both describe the same state.
  std::vector<std::vector<uint64_t>> ikeys(nf);
  std::vector<std::vector<uint32_t>> ilocs(nf);
  std::vector<uint8_t> indexed(nf, 0);
  {
    std::lock_guard<std::mutex> l(mu_);
    if (closed_) return Status::Closed("store '" + path_ + "' is closed");
    v = current_;
    readers_.insert(v->number);
    for (size_t i = 0; i < nf; i++) {
      if (FeatureBuffer* fb = buffer_.find(defs[i].id)) fb->CopyRange(lo, hi, &buf[i]);
      if (index_ahead_ || o_.accounting || defs[i].id >= v->features.size() || !v->features[defs[i].id]) continue;
      const FeatureState* f = features_.Get(defs[i].id);
      if (!f || f->index.dense()) continue;  // dense keys: the scatter below is as fast
      const auto& rs = *v->features[defs[i].id];
      bool overlapping = false;
      for (size_t j = 0; j < rs.size() && !overlapping; j++)
        overlapping = rs[j].valid != rs[j].count || rs[j].tombs || (j > 0 && rs[j - 1].max_key >= rs[j].min_key);
      if (!overlapping) continue;  // direct placement or a plain concatenation
      f->index.CopyRange(lo, hi, &ikeys[i], &ilocs[i]);
      indexed[i] = 1;
    }
  }
  ReaderGuard guard(this, v->number);
  const uint32_t ps = o_.page_size;
  if (lo >= hi && !to_end) hi = lo;  // empty range

  // Pages per feature overlapping [lo, hi); a page shared by several features is read once.
  std::vector<std::vector<PageRef>> refs(nf);
  std::unordered_map<uint32_t, std::vector<std::pair<uint32_t, uint32_t>>> users;
  std::vector<uint32_t> pids;
  for (size_t i = 0; i < nf; i++) {
    if ((lo >= hi && !to_end) || defs[i].id >= v->features.size() || !v->features[defs[i].id]) continue;
    for (const PageRef& r : *v->features[defs[i].id]) {
      if (r.max_key < lo || (!to_end && r.min_key >= hi)) continue;
      auto& u = users[r.page];
      if (u.empty()) pids.push_back(r.page);
      u.emplace_back(static_cast<uint32_t>(i), static_cast<uint32_t>(refs[i].size()));
      refs[i].push_back(r);
    }
  }
  std::sort(pids.begin(), pids.end());

  struct Chunk {
    uint64_t seq = 0;
    double enc = 0;     // encoded bytes per record
    bool clean = true;  // no stale records and no tombstones
    std::vector<uint64_t> keys;
    std::vector<uint8_t> tomb;
    std::vector<uint8_t> vals;
    std::vector<uint32_t> lens;  // variable-width only
  };
  std::vector<std::vector<Chunk>> chunks(nf);
  for (size_t i = 0; i < nf; i++) chunks[i].resize(refs[i].size());
  // Direct placement: a fixed-width feature whose pages are clean (no stale records, no
  // tombstones) and hold disjoint key ranges, with nothing buffered in the range, decodes
  // each page straight into its final place in the output — no intermediate copy, no merge.
  std::vector<uint8_t> direct(nf, 0);
  std::vector<std::vector<uint64_t>> slot(nf);               // output start of each page
  std::vector<std::vector<std::pair<uint32_t, uint32_t>>> span(nf);  // [a, z) kept per page
  for (size_t i = 0; i < nf; i++) {
    const auto& rs = refs[i];
    bool ok = defs[i].fixed_width() > 0 && buf[i].size() == 0;
    for (size_t j = 0; j < rs.size() && ok; j++)
      ok = rs[j].valid == rs[j].count && rs[j].tombs == 0 && (j == 0 || rs[j - 1].max_key < rs[j].min_key);
    if (!ok) continue;
    direct[i] = 1;
    uint64_t total = 0;
    slot[i].resize(rs.size());
    span[i].assign(rs.size(), {0, 0});
    for (size_t j = 0; j < rs.size(); j++) {
      slot[i][j] = total;
      total += rs[j].count;
    }
    (*out)[i].keys.resize(total);
    (*out)[i].values.resize(total * defs[i].fixed_width());
  }
  double encoded = 0;
  auto cb = [&](uint32_t pid, const PageView& pv) -> Status {
    for (const auto& [i, j] : users[pid]) {
      const FeatureDef& def = defs[i];
      if (pv.seq() != refs[i][j].seq)
        return Status::Stale("store '" + path_ + "': page " + std::to_string(pid) + " of '" + pages_path_ +
                             "' was rewritten by a writer since this read-only handle opened (seq " +
                             std::to_string(pv.seq()) + ", snapshot expects " + std::to_string(refs[i][j].seq) +
                             "); reopen the store to read the current data");
      SegmentView sv;
      if (!pv.Find(def.id, &sv))
        return Status::Corruption("page " + std::to_string(pid) + " of '" + pages_path_ +
                                  "' lacks the segment of feature '" + def.name + "' that the metadata lists");
      sv.width = def.fixed_width();
      if (direct[i]) {
        if (sv.count != refs[i][j].count)
          return Status::Corruption("page " + std::to_string(pid) + " of '" + pages_path_ + "': feature '" +
                                    def.name + "' segment has " + std::to_string(sv.count) +
                                    " records, the metadata says " + std::to_string(refs[i][j].count));
        ColumnData& col = (*out)[i];
        uint64_t* kp = col.keys.data() + slot[i][j];
        sv.DecodeKeys(kp);
        uint32_t a = 0, z = sv.count;
        if (sv.min_key < lo) a = static_cast<uint32_t>(std::lower_bound(kp, kp + sv.count, lo) - kp);
        if (!to_end && sv.max_key >= hi) z = static_cast<uint32_t>(upper(kp, kp + sv.count) - kp);
        span[i][j] = {a, z};
        encoded += (z - a) * sv.bytes_per_record();
        std::memcpy(col.values.data() + (slot[i][j] + a) * sv.width, sv.values + static_cast<size_t>(a) * sv.width,
                    static_cast<size_t>(z - a) * sv.width);
        continue;
      }
      Chunk& c = chunks[i][j];
      c.keys.resize(sv.count);  // decoded in place; trimmed to [lo, hi) when partial
      sv.DecodeKeys(c.keys.data());
      const size_t a = sv.min_key < lo ? std::lower_bound(c.keys.begin(), c.keys.end(), lo) - c.keys.begin() : 0;
      const size_t z = !to_end && sv.max_key >= hi ? upper(c.keys.data(), c.keys.data() + sv.count) - c.keys.data()
                                                   : sv.count;
      c.seq = pv.seq();
      c.enc = sv.bytes_per_record();
      c.clean = refs[i][j].valid == refs[i][j].count && !sv.tomb;
      if (z < sv.count) c.keys.resize(z);
      if (a > 0) c.keys.erase(c.keys.begin(), c.keys.begin() + a);
      if (sv.tomb) {
        c.tomb.resize(z - a);
        for (size_t r = a; r < z; r++) c.tomb[r - a] = sv.is_tomb(static_cast<uint32_t>(r));
      }
      if (sv.width) {
        c.vals.assign(sv.values + a * sv.width, sv.values + z * sv.width);
      } else {
        for (size_t r = a; r < z; r++) {
          const uint8_t* p;
          uint32_t len;
          sv.Value(static_cast<uint32_t>(r), &p, &len);
          c.vals.insert(c.vals.end(), p, p + len);
          c.lens.push_back(len);
        }
      }
    }
    return Status::OK();
  };
  if (!pids.empty()) {
    RingLease ring(rings_.get());
    RF_RETURN_IF_ERROR(ring.Acquire());
    Status rs = ReadPages(ring.get(), pids, cb);
    if (!rs.ok()) return ExplainReadFailure(rs);
  }

  uint64_t useful = 0, items = 0;
  for (size_t i = 0; i < nf; i++) {
    const FeatureDef& def = defs[i];
    const uint32_t w = def.fixed_width();
    const uint32_t elem = def.element_size();
    ColumnData& col = (*out)[i];
    if (direct[i]) {
      // Close the gaps left by range boundaries (only the first and last page are partial).
      uint64_t wpos = 0;
      for (size_t j = 0; j < refs[i].size(); j++) {
        const auto [a, z] = span[i][j];
        const uint64_t from = slot[i][j] + a;
        if (from != wpos && z > a) {
          std::memmove(col.keys.data() + wpos, col.keys.data() + from, (z - a) * 8ull);
          std::memmove(col.values.data() + wpos * w, col.values.data() + from * w, static_cast<size_t>(z - a) * w);
        }
        wpos += z - a;
      }
      col.keys.resize(wpos);
      col.values.resize(wpos * w);
      useful += wpos * ItemBytes(w);
      items += wpos;
      continue;
    }
    auto& cs = chunks[i];
    const BufferedItems& b = buf[i];
    // Chunks (one per page) in order of first key.
    std::vector<uint32_t> order;
    size_t total = 0, vbytes = 0;
    for (uint32_t c = 0; c < cs.size(); c++) {
      if (cs[c].keys.empty()) continue;
      order.push_back(c);
      total += cs[c].keys.size();
      vbytes += cs[c].vals.size();
    }
    std::sort(order.begin(), order.end(), [&](uint32_t a, uint32_t c) {
      return cs[a].keys.front() < cs[c].keys.front() ||
             (cs[a].keys.front() == cs[c].keys.front() && cs[a].seq > cs[c].seq);
    });
    std::vector<std::vector<uint64_t>> voff(w ? 0 : cs.size());  // value byte offsets per chunk
    for (size_t c = 0; c < voff.size(); c++) {
      voff[c].resize(cs[c].lens.size() + 1, 0);
      for (size_t r = 0; r < cs[c].lens.size(); r++) voff[c][r + 1] = voff[c][r] + cs[c].lens[r];
    }
    col.keys.reserve(total + b.size());
    col.values.reserve(vbytes + b.arena.size());
    if (!w) col.offsets.push_back(0);
    uint64_t out_bytes = 0;
    size_t k = 0;  // buffer cursor
    auto emit_buf = [&](size_t e) {
      if (b.tomb[e]) return;
      col.keys.push_back(b.keys[e]);
      col.values.insert(col.values.end(), b.value(e), b.value(e) + b.len[e]);
      out_bytes += b.len[e];
      if (!w) col.offsets.push_back(static_cast<int32_t>(out_bytes / elem));
    };
    // Copies records [r0, r1) of a chunk: all are current versions (tombstones skipped).
    auto copy_disk = [&](uint32_t c, uint32_t r0, uint32_t r1) {
      const Chunk& ch = cs[c];
      if (r0 >= r1) return;
      encoded += (r1 - r0) * ch.enc;
      if (ch.tomb.empty()) {
        col.keys.insert(col.keys.end(), ch.keys.begin() + r0, ch.keys.begin() + r1);
        if (w) {
          col.values.insert(col.values.end(), ch.vals.begin() + static_cast<size_t>(r0) * w,
                            ch.vals.begin() + static_cast<size_t>(r1) * w);
          out_bytes += static_cast<uint64_t>(r1 - r0) * w;
          useful += static_cast<uint64_t>(r1 - r0) * ItemBytes(w);
        } else {
          col.values.insert(col.values.end(), ch.vals.begin() + voff[c][r0], ch.vals.begin() + voff[c][r1]);
          for (uint32_t r = r0; r < r1; r++) {
            out_bytes += ch.lens[r];
            useful += ItemBytes(ch.lens[r]);
            col.offsets.push_back(static_cast<int32_t>(out_bytes / elem));
          }
        }
        return;
      }
      for (uint32_t r = r0; r < r1; r++) {
        if (ch.tomb[r]) continue;
        col.keys.push_back(ch.keys[r]);
        const uint32_t len = w ? w : ch.lens[r];
        const uint64_t off = w ? static_cast<uint64_t>(r) * w : voff[c][r];
        col.values.insert(col.values.end(), ch.vals.begin() + off, ch.vals.begin() + off + len);
        out_bytes += len;
        useful += ItemBytes(len);
        if (!w) col.offsets.push_back(static_cast<int32_t>(out_bytes / elem));
      }
    };
    // A run of winning records, overlaid with the buffered writes (which are newer).
    auto emit_run = [&](uint32_t c, uint32_t r0, uint32_t r1) {
      const Chunk& ch = cs[c];
      while (k < b.size() && b.keys[k] < ch.keys[r0]) emit_buf(k++);
      uint32_t r = r0;
      while (r < r1) {
        if (k < b.size() && b.keys[k] <= ch.keys[r1 - 1]) {
          const uint64_t bk = b.keys[k];
          uint32_t rr = static_cast<uint32_t>(std::lower_bound(ch.keys.begin() + r, ch.keys.begin() + r1, bk) - ch.keys.begin());
          copy_disk(c, r, rr);
          emit_buf(k++);
          if (rr < r1 && ch.keys[rr] == bk) rr++;  // overridden by the buffer
          r = rr;
        } else {
          copy_disk(c, r, r1);
          r = r1;
        }
      }
    };
    // Index-guided merge: walk the index copy in key order; each key's record is the next
    // record of its page's chunk at or after that chunk's cursor (stale records are skipped
    // on the way). Any disagreement between index and pages falls back to the k-way merge.
    if (indexed[i]) {
      const uint64_t useful0 = useful;
      const double encoded0 = encoded;
      const auto& ik = ikeys[i];
      const auto& il = ilocs[i];
      const ChunkOfPage chunk_of(refs[i]);
      std::vector<uint32_t> cur(cs.size(), 0);
      const size_t nb = b.size();
      // on_buf(e) for a buffered entry (newer than any page), on_disk(c, r) for the record
      // holding a key's current version. False when the index and the pages disagree.
      auto walk = [&](auto&& on_buf, auto&& on_disk) -> bool {
        for (size_t e = 0; e < ik.size(); e++) {
          const uint64_t key = ik[e];
          while (k < nb && b.keys[k] < key) on_buf(k++);
          if (k < nb && b.keys[k] == key) {
            on_buf(k++);
            continue;
          }
          const uint32_t loc = il[e];
          if (loc & KeyIndex::kTomb) continue;
          const int32_t cj = chunk_of.Find(loc);
          if (cj < 0) return false;
          const uint32_t c = static_cast<uint32_t>(cj);
          const Chunk& ch = cs[c];
          const uint32_t cn = static_cast<uint32_t>(ch.keys.size());
          uint32_t r = cur[c];
          while (r < cn && ch.keys[r] < key) r++;
          if (r == cn || ch.keys[r] != key || (!ch.tomb.empty() && ch.tomb[r])) return false;
          cur[c] = r + 1;
          on_disk(c, r);
        }
        while (k < nb) on_buf(k++);
        return true;
      };
      bool ok;
      if (w) {
        // Output sized for the worst case up front, written through raw pointers.
        col.keys.resize(ik.size() + nb);
        col.values.resize((ik.size() + nb) * static_cast<size_t>(w));
        uint64_t* kp = col.keys.data();
        uint8_t* vp = col.values.data();
        size_t o = 0, from_disk = 0;
        auto put = [&](uint64_t key, const uint8_t* val) {
          kp[o] = key;
          if (w == 8) std::memcpy(vp + o * 8, val, 8);
          else if (w == 4) std::memcpy(vp + o * 4, val, 4);
          else std::memcpy(vp + o * w, val, w);
          o++;
        };
        ok = walk([&](size_t e) { if (!b.tomb[e]) put(b.keys[e], b.value(e)); },
                  [&](uint32_t c, uint32_t r) {
                    const Chunk& ch = cs[c];
                    encoded += ch.enc;
                    from_disk++;
                    put(ch.keys[r], ch.vals.data() + static_cast<size_t>(r) * w);
                  });
        if (ok) {
          useful += from_disk * ItemBytes(w);
          col.keys.resize(o);
          col.values.resize(o * static_cast<size_t>(w));
        }
      } else {
        col.keys.reserve(ik.size() + nb);
        ok = walk(emit_buf, [&](uint32_t c, uint32_t r) { copy_disk(c, r, r + 1); });
      }
      if (ok) {
        order.clear();  // resolved: skip the merges below
        index_merges_++;
      } else {
        index_merge_fallbacks_++;
        useful = useful0;
        encoded = encoded0;
        col.keys.clear();
        col.values.clear();
        col.offsets.clear();
        if (!w) col.offsets.push_back(0);
        out_bytes = 0;
        k = 0;
      }
    }
    // K-way merge of the chunks by (key, newest seq first), emitting maximal runs of one
    // chunk at a time: a run extends while its keys stay below every other chunk's next key,
    // so non-overlapping pages cost one bulk copy each and only interleaved stretches pay
    // for heap operations. An older version of an emitted key is skipped.
    // Dense keys (the usual case: item ids): scatter each page's records into a slot per key,
    // pages in ascending seq so the newest version lands last, then sweep the slots in key
    // order. O(records + key span), no comparisons between pages. Windows bound the memory.
    uint64_t kmin = UINT64_MAX, kmax = 0;
    for (uint32_t c : order) {
      kmin = std::min(kmin, cs[c].keys.front());
      kmax = std::max(kmax, cs[c].keys.back());
    }
    const bool dense = order.size() > 1 && kmax - kmin < 2 * total + 4096;
    if (dense) {
      constexpr uint64_t kWindow = 1u << 22;
      std::vector<uint32_t> by_seq(order);
      std::sort(by_seq.begin(), by_seq.end(), [&](uint32_t a, uint32_t c) { return cs[a].seq < cs[c].seq; });
      std::vector<uint32_t> wc(std::min<uint64_t>(kWindow, kmax - kmin + 1)), wr(wc.size());
      std::vector<uint32_t> cur(cs.size(), 0);
      for (uint64_t wlo = kmin;; wlo += kWindow) {
        const uint64_t span = std::min<uint64_t>(kWindow, kmax - wlo + 1);
        std::fill(wc.begin(), wc.begin() + span, 0u);
        for (uint32_t c : by_seq) {
          const auto& ks = cs[c].keys;
          uint32_t r = cur[c];
          const uint32_t n = static_cast<uint32_t>(ks.size());
          for (; r < n && ks[r] - wlo < span; r++) {
            wc[ks[r] - wlo] = c + 1;
            wr[ks[r] - wlo] = r;
          }
          cur[c] = r;
        }
        for (uint64_t x = 0; x < span; x++) {
          if (!wc[x]) continue;
          const uint64_t key = wlo + x;
          while (k < b.size() && b.keys[k] < key) emit_buf(k++);
          if (k < b.size() && b.keys[k] == key) {
            emit_buf(k++);  // the buffered write is newer
            continue;
          }
          const uint32_t c = wc[x] - 1, r = wr[x];
          const Chunk& ch = cs[c];
          if (!ch.tomb.empty() && ch.tomb[r]) continue;
          encoded += ch.enc;
          col.keys.push_back(key);
          if (w) {
            const size_t at = col.values.size();
            col.values.resize(at + w);
            std::memcpy(col.values.data() + at, ch.vals.data() + static_cast<size_t>(r) * w, w);
            out_bytes += w;
            useful += ItemBytes(w);
          } else {
            const uint32_t len = ch.lens[r];
            col.values.insert(col.values.end(), ch.vals.begin() + voff[c][r], ch.vals.begin() + voff[c][r] + len);
            out_bytes += len;
            useful += ItemBytes(len);
            col.offsets.push_back(static_cast<int32_t>(out_bytes / elem));
          }
        }
        if (kmax - wlo < kWindow) break;
      }
      order.clear();  // consumed: skip the merge below
    }
    struct HE {
      uint64_t key, seq;
      uint32_t c;
    };
    auto later = [](const HE& a, const HE& b2) { return a.key > b2.key || (a.key == b2.key && a.seq < b2.seq); };
    std::vector<HE> heap;
    std::vector<uint32_t> pos(cs.size(), 0);
    size_t nx = 0;
    bool have_last = false;
    uint64_t last = 0;
    for (;;) {
      while (nx < order.size() && (heap.empty() || cs[order[nx]].keys.front() <= heap.front().key)) {
        const uint32_t c = order[nx++];
        heap.push_back({cs[c].keys[0], cs[c].seq, c});
        std::push_heap(heap.begin(), heap.end(), later);
      }
      if (heap.empty()) break;
      std::pop_heap(heap.begin(), heap.end(), later);
      const HE t = heap.back();
      heap.pop_back();
      const Chunk& ch = cs[t.c];
      const uint32_t r = pos[t.c];
      const uint32_t n = static_cast<uint32_t>(ch.keys.size());
      uint32_t r1 = r + 1;
      if (have_last && ch.keys[r] == last) {
        // an older version of a key already emitted
      } else {
        uint64_t bound = UINT64_MAX;
        if (!heap.empty()) bound = heap.front().key;
        if (nx < order.size()) bound = std::min(bound, cs[order[nx]].keys.front());
        r1 = static_cast<uint32_t>(std::lower_bound(ch.keys.begin() + r + 1, ch.keys.end(), bound) - ch.keys.begin());
        emit_run(t.c, r, r1);
        last = ch.keys[r1 - 1];
        have_last = true;
      }
      pos[t.c] = r1;
      if (r1 < n) {
        heap.push_back({ch.keys[r1], ch.seq, t.c});
        std::push_heap(heap.begin(), heap.end(), later);
      }
    }
    while (k < b.size()) emit_buf(k++);
    items += col.keys.size();
  }
  FinishRead(pids.size(), useful, encoded, items, t0, st);
  return Status::OK();
}

Status Store::Get(const std::string& name, const uint64_t* keys, size_t n, ColumnData* out, ReadStats* st) {
  const double t0 = Now();
  RF_RETURN_IF_ERROR(CheckOpen());
  RF_RETURN_IF_ERROR(CheckReadable());
  RF_RETURN_IF_ERROR(EnsureKeyIndex());
  FeatureDef def;
  RF_RETURN_IF_ERROR(FeatureFor(name, &def));
  RF_RETURN_IF_ERROR(LoadIndex(FeatureStateFor(def.id)));
  const uint32_t w = def.fixed_width();
  const uint32_t ps = o_.page_size;
  // Unique requested keys, ascending.
  std::vector<uint64_t> uk(keys, keys + n);
  std::sort(uk.begin(), uk.end());
  uk.erase(std::unique(uk.begin(), uk.end()), uk.end());
  struct Best {
    int src = 0;  // 0 none, 1 buffer, 2 page
    bool tomb = false;
    uint64_t seq = 0;
    uint64_t off = 0;
    uint32_t len = 0;
  };
  std::vector<Best> best(uk.size());
  std::vector<uint8_t> arena;
  std::shared_ptr<const Version> v;
  // Page of each requested key's current version, from the key index. Buffer, index and
  // version are read under mu_: the writer mutates the index under mu_ too, and a page the
  // index names stays readable while this reader is registered (pending-free rule).
  std::unordered_map<uint32_t, std::vector<uint32_t>> want;  // page -> positions in uk
  bool deferred = false;
  {
    std::lock_guard<std::mutex> l(mu_);
    if (closed_) return Status::Closed("store '" + path_ + "' is closed");
    v = current_;
    readers_.insert(v->number);
    if (FeatureBuffer* fb = buffer_.find(def.id)) {
      fb->Normalize();
      const BufferedItems& b = fb->items();
      size_t j = 0;
      for (size_t i = 0; i < uk.size(); i++) {
        j = std::lower_bound(b.keys.begin() + j, b.keys.end(), uk[i]) - b.keys.begin();
        if (j < b.size() && b.keys[j] == uk[i]) {
          best[i].src = 1;
          best[i].tomb = b.tomb[j] != 0;
          best[i].off = arena.size();
          best[i].len = b.len[j];
          arena.insert(arena.end(), b.value(j), b.value(j) + b.len[j]);
        }
      }
    }
    const FeatureState* f = features_.Get(def.id);
    deferred = f->index.deferred();
    size_t hint = 0;
    for (size_t i = 0; i < uk.size(); i++) {
      if (best[i].src == 1) continue;
      if (deferred) {  // the one segment whose key range holds the key, if any (see KeyIndex)
        const uint32_t pid = DeferredPage(*v, def.id, uk[i]);
        if (pid != UINT32_MAX) want[pid].push_back(static_cast<uint32_t>(i));
        continue;
      }
      const int64_t pos = f->index.FindFrom(uk[i], &hint);
      if (pos == KeyIndex::kAbsent) continue;
      const uint32_t loc = f->index.loc(static_cast<size_t>(pos));
      if (loc & KeyIndex::kTomb) continue;
      want[loc].push_back(static_cast<uint32_t>(i));
    }
  }
  ReaderGuard guard(this, v->number);
  std::vector<uint32_t> pids;
  for (const auto& [p, ks] : want) pids.push_back(p);
  std::sort(pids.begin(), pids.end());
  uint64_t useful = 0;
  double encoded = 0;
  std::vector<uint64_t> tmp;
  auto cb = [&](uint32_t pid, const PageView& pv) -> Status {
    // (pages_ is immutable on a read-only handle once its key index is built.)
    if (o_.read_only && pv.seq() != pages_.at(pid).seq)
      return Status::Stale("store '" + path_ + "': page " + std::to_string(pid) + " of '" + pages_path_ +
                           "' was rewritten by a writer since this read-only handle opened; reopen the store");
    SegmentView sv;
    if (!pv.Find(def.id, &sv))
      return Status::Corruption("page " + std::to_string(pid) + " of '" + pages_path_ +
                                "' lacks the segment of feature '" + def.name + "' that the key index names");
    sv.width = w;
    tmp.resize(sv.count);
    sv.DecodeKeys(tmp.data());
    for (uint32_t u : want[pid]) {
      auto f = std::lower_bound(tmp.begin(), tmp.end(), uk[u]);
      if ((f == tmp.end() || *f != uk[u]) && deferred) continue;  // a gap in the segment's range: absent
      if (f == tmp.end() || *f != uk[u])
        return Status::Corruption("page " + std::to_string(pid) + " of '" + pages_path_ + "' lacks key " +
                                  std::to_string(uk[u]) + " of feature '" + def.name + "' that the key index names");
      const uint32_t r = static_cast<uint32_t>(f - tmp.begin());
      const uint8_t* p;
      uint32_t len;
      sv.Value(r, &p, &len);
      Best& bb = best[u];
      bb.src = 2;
      bb.seq = pv.seq();
      bb.tomb = false;
      bb.off = arena.size();
      bb.len = len;
      arena.insert(arena.end(), p, p + len);
      encoded += sv.bytes_per_record();
    }
    return Status::OK();
  };
  if (!pids.empty()) {
    RingLease ring(rings_.get());
    RF_RETURN_IF_ERROR(ring.Acquire());
    Status rs = ReadPages(ring.get(), pids, cb);
    if (!rs.ok()) return ExplainReadFailure(rs);
  }
  // Output aligned with the request.
  out->keys.assign(keys, keys + n);
  out->found.assign(n, 0);
  out->values.clear();
  out->offsets.clear();
  if (!w) out->offsets.push_back(0);
  const uint32_t elem = def.element_size();
  uint64_t items = 0;
  for (size_t i = 0; i < n; i++) {
    const size_t u = std::lower_bound(uk.begin(), uk.end(), keys[i]) - uk.begin();
    const Best& bb = best[u];
    const bool hit = bb.src != 0 && !bb.tomb;
    out->found[i] = hit;
    if (hit) {
      out->values.insert(out->values.end(), arena.begin() + bb.off, arena.begin() + bb.off + bb.len);
      items++;
      if (bb.src == 2) useful += ItemBytes(bb.len);
    } else if (w) {
      out->values.resize(out->values.size() + w, 0);
    }
    if (!w) out->offsets.push_back(static_cast<int32_t>(out->values.size() / elem));
  }
  FinishRead(pids.size(), useful, encoded, items, t0, st);
  return Status::OK();
}

Status Store::KeyRanges(const std::string& name, std::vector<PageRef>* out) {
  RF_RETURN_IF_ERROR(CheckOpen());
  FeatureDef def;
  RF_RETURN_IF_ERROR(FeatureFor(name, &def));
  std::shared_ptr<const Version> v;
  {
    std::lock_guard<std::mutex> l(mu_);
    v = current_;
  }
  out->clear();
  if (def.id < v->features.size() && v->features[def.id]) *out = *v->features[def.id];  // sorted by min_key
  return Status::OK();
}

Status Store::AccountScan(const std::string& name, ReadStats* st) {
  const double t0 = Now();
  RF_RETURN_IF_ERROR(CheckOpen());
  FeatureDef def;
  RF_RETURN_IF_ERROR(FeatureFor(name, &def));
  std::lock_guard<std::mutex> wl(write_mu_);  // the tables belong to the writer side
  const FeatureState* f = features_.Get(def.id);
  double encoded = 0;
  for (uint32_t p : f->pages)
    for (const auto& sm : pages_.at(p).segs)
      if (sm.fid == def.id && !sm.retired) encoded += sm.live_disk_bytes();
  *st = ReadStats();
  st->pages_read = f->pages.size();
  st->bytes_read = f->pages.size() * static_cast<uint64_t>(o_.page_size);
  st->useful_bytes = f->live_bytes;
  st->encoded_bytes = encoded;
  st->items = f->live_items;
  st->seconds = Now() - t0;
  return Status::OK();
}

// ---------------------------------------------------------------------------------------
// Embedding rows (the NDP engine's gather)

Status Store::GatherRows(const std::string& name, const uint64_t* ids, size_t n, bool vector_grained, float* out,
                         GatherStats* st) {
  std::vector<GatherRequest> one(1);
  one[0].feature = name;
  one[0].ids = ids;
  one[0].n = n;
  one[0].out = out;
  one[0].stats = st;
  return GatherRowsMany(one, vector_grained, nullptr);
}

BlockSums* Store::LoadedBlockSums() {
  if (!o_.verify_block_reads || !block_sums_) return nullptr;
  std::call_once(block_sums_loaded_, [this] { block_sums_->Load(path_ + "/BLOCKSUMS"); });
  return block_sums_.get();
}

Status Store::GatherRowsMany(const std::vector<GatherRequest>& reqs, bool vector_grained, const GatherDoneFn& done) {
  const double t0 = Now();
  RF_RETURN_IF_ERROR(CheckOpen());
  RF_RETURN_IF_ERROR(CheckReadable());
  RF_RETURN_IF_ERROR(EnsureKeyIndex());
  // Block reads are verified against checksums a whole-page read took; a read-only handle may
  // race a writer reusing slots, so it reads whole (verified, seq-checked) pages only.
  if (o_.read_only) vector_grained = false;
  const size_t nr = reqs.size();
  std::vector<FeatureDef> defs(nr);
  for (size_t r = 0; r < nr; r++) {
    const GatherRequest& q = reqs[r];
    RF_RETURN_IF_ERROR(FeatureFor(q.feature, &defs[r]));
    RF_RETURN_IF_ERROR(LoadIndex(FeatureStateFor(defs[r].id)));
    if (defs[r].type != ValueType::kFixedFloat32)
      return Status::Schema("feature '" + q.feature + "' is " + defs[r].TypeString() +
                            "; embedding rows need fixed_size_list<float32, D>");
    for (size_t i = 1; i < q.n; i++)
      if (q.ids[i] <= q.ids[i - 1]) return Status::InvalidArgument("row ids for '" + q.feature + "' must be ascending and unique");
    *q.stats = GatherStats();
    q.stats->rows = q.n;
  }
  const uint32_t ps = o_.page_size;
  constexpr uint32_t kNone = UINT32_MAX;
  std::vector<std::vector<uint32_t>> locs(nr);
  std::shared_ptr<const Version> v;
  std::vector<uint8_t> deferred(nr, 0);  // the request's table keeps no key index (see KeyIndex)
  {
    std::lock_guard<std::mutex> l(mu_);
    if (closed_) return Status::Closed("store '" + path_ + "' is closed");
    for (size_t r = 0; r < nr; r++) {
      const GatherRequest& q = reqs[r];
      const FeatureDef& def = defs[r];
      const uint32_t w = def.fixed_width();
      std::vector<uint32_t>& loc = locs[r];
      loc.assign(q.n, kNone);
      FeatureBuffer* fb = buffer_.find(def.id);
      if (fb) fb->Normalize();
      const FeatureState* f = features_.Get(def.id);
      size_t hint = 0, j = 0;
      for (size_t i = 0; i < q.n; i++) {
        if (fb) {
          const BufferedItems& b = fb->items();
          j = std::lower_bound(b.keys.begin() + j, b.keys.end(), q.ids[i]) - b.keys.begin();
          if (j < b.size() && b.keys[j] == q.ids[i]) {
            if (b.tomb[j])
              return Status::InvalidArgument("row " + std::to_string(q.ids[i]) + " of table '" + q.feature + "' was deleted");
            std::memcpy(q.out + i * def.dim, b.value(j), w);
            q.stats->buffer_rows++;
            continue;
          }
        }
        auto not_stored = [&](uint64_t id) {
          return Status::InvalidArgument("row " + std::to_string(id) + " is not in table '" + q.feature + "' (" +
                                         std::to_string(f->live_items) + " rows stored)");
        };
        if (f->index.deferred()) {  // the one segment whose key range holds the row (checked on read)
          deferred[r] = 1;
          loc[i] = DeferredPage(*current_, def.id, q.ids[i]);
          if (loc[i] == UINT32_MAX) return not_stored(q.ids[i]);
          continue;
        }
        const int64_t pos = f->index.FindFrom(q.ids[i], &hint);
        if (pos == KeyIndex::kAbsent || (f->index.loc(static_cast<size_t>(pos)) & KeyIndex::kTomb))
          return not_stored(q.ids[i]);
        loc[i] = f->index.loc(static_cast<size_t>(pos));
      }
    }
    v = current_;
    readers_.insert(v->number);
  }
  ReaderGuard guard(this, v->number);
  BlockSums* sums = vector_grained ? LoadedBlockSums() : nullptr;

  // Rows still to arrive per request; a request is handed to `done` when its count reaches 0.
  std::vector<size_t> pending(nr, 0);
  std::vector<size_t> ready;
  auto arrived = [&](uint32_t r) {
    if (--pending[r] == 0) ready.push_back(r);
  };
  auto run_ready = [&]() -> Status {
    while (!ready.empty()) {
      const size_t r = ready.back();
      ready.pop_back();
      reqs[r].stats->seconds = Now() - t0;
      if (done) RF_RETURN_IF_ERROR(done(r));
    }
    return Status::OK();
  };

  // Computed addresses for rows in packed pages; everything else goes through its page.
  struct Need {
    uint64_t off;
    uint64_t seq;  // the page version the address was computed for
    uint32_t r, i;
  };
  struct PageNeed {
    uint32_t page, r, i;
    bool take_sums;  // a packed page read whole to take its block checksums
  };
  std::vector<Need> needs;
  std::vector<PageNeed> by_page;
  static const std::vector<PageRef> kNoRefs;
  for (uint32_t r = 0; r < nr; r++) {
    const GatherRequest& q = reqs[r];
    const FeatureDef& def = defs[r];
    const uint32_t w = def.fixed_width();
    const uint64_t row_base = SoloRowBase(w);
    const std::vector<PageRef>& refs =
        def.id < v->features.size() && v->features[def.id] ? *v->features[def.id] : kNoRefs;
    for (uint32_t i = 0; i < q.n; i++) {
      const uint32_t loc = locs[r][i];
      if (loc == kNone) continue;
      pending[r]++;
      const PageRef* ref = nullptr;
      auto it = std::upper_bound(refs.begin(), refs.end(), q.ids[i], [](uint64_t k, const PageRef& x) { return k < x.min_key; });
      for (int steps = 0; it != refs.begin() && steps < 16; steps++) {
        --it;
        if (it->page == loc) {
          ref = &*it;
          break;
        }
      }
      if (vector_grained && ref && ref->solo && ref->tombs == 0 && ref->valid == ref->count &&
          ref->max_key - ref->min_key + 1 == ref->count) {
        needs.push_back({static_cast<uint64_t>(loc) * ps + row_base + (q.ids[i] - ref->min_key) * w, ref->seq, r, i});
      } else {
        by_page.push_back({loc, r, i, false});
      }
    }
    if (pending[r] == 0) ready.push_back(r);
  }

  if (!needs.empty()) {
    // Blocks: each need's device blocks, adjacent ones of a page merged up to 4 KiB. With
    // verification, a block whose page has no sums for this version moves its rows to the
    // page path, which takes the sums (first touch).
    std::sort(needs.begin(), needs.end(), [](const Need& a, const Need& b) { return a.off < b.off; });
    const uint64_t bs = block_size_;
    std::vector<IoRing::Block> blocks;
    std::vector<size_t> first_need;   // blocks[k] serves needs[first_need[k] .. first_need[k + 1])
    std::vector<size_t> first_sum;    // blocks[k]'s expected sums: expect[first_sum[k] ..]
    std::vector<uint32_t> expect;
    std::vector<Need> kept;
    kept.reserve(needs.size());
    auto close_block = [&]() {
      if (blocks.empty() || !sums) return;
      const IoRing::Block& b = blocks.back();
      const uint32_t page = static_cast<uint32_t>(b.offset / ps);
      const uint32_t count = b.len / static_cast<uint32_t>(bs);
      const size_t at = expect.size();
      expect.resize(at + count);
      if (sums->Lookup(page, kept[first_need.back()].seq, static_cast<uint32_t>((b.offset % ps) / bs), count, expect.data() + at)) {
        first_sum.push_back(at);
        return;
      }
      expect.resize(at);
      for (size_t k = first_need.back(); k < kept.size(); k++) by_page.push_back({page, kept[k].r, kept[k].i, true});
      kept.resize(first_need.back());
      blocks.pop_back();
      first_need.pop_back();
    };
    for (const Need& nd : needs) {
      const uint32_t w = defs[nd.r].fixed_width();
      const uint64_t lo = nd.off / bs * bs;
      const uint64_t hi = (nd.off + w + bs - 1) / bs * bs;
      if (!blocks.empty() && lo <= blocks.back().offset + blocks.back().len && hi - blocks.back().offset <= 4096 &&
          lo / ps == blocks.back().offset / ps) {
        blocks.back().len = static_cast<uint32_t>(std::max<uint64_t>(blocks.back().offset + blocks.back().len, hi) -
                                                  blocks.back().offset);
      } else {
        close_block();
        blocks.push_back({lo, static_cast<uint32_t>(hi - lo)});
        first_need.push_back(kept.size());
      }
      kept.push_back(nd);
    }
    close_block();
    first_need.push_back(kept.size());
    for (size_t k = 0; k + 1 < first_need.size(); k++) {
      GatherStats* s = reqs[kept[first_need[k]].r].stats;
      s->device_reads++;
      s->device_bytes += blocks[k].len;
      if (sums) s->verified_blocks += blocks[k].len / bs;
      for (size_t x = first_need[k]; x < first_need[k + 1]; x++) reqs[kept[x].r].stats->vector_rows++;
    }
    if (!blocks.empty()) {
      RingLease ring(block_rings_.get());
      RF_RETURN_IF_ERROR(ring.Acquire());
      RF_RETURN_IF_ERROR(ring.get()->ReadBlocks(
          file_.fd(), pages_path_, blocks,
          [&](size_t b, const uint8_t* data) -> Status {
            const IoRing::Block& blk = blocks[b];
            if (sums) {
              for (uint32_t j = 0; j < blk.len / bs; j++) {
                const uint32_t got = BlockSums::Sum(data + j * bs, static_cast<uint32_t>(bs));
                const uint32_t want = expect[first_sum[b] + j];
                if (got != want) {
                  const Need& nd = kept[first_need[b]];
                  return Status::Corruption("block at offset " + std::to_string(blk.offset + j * bs) + " (page " +
                                            std::to_string(blk.offset / ps) + ") of '" + pages_path_ +
                                            "' fails its checksum (taken " + std::to_string(want) + ", read " +
                                            std::to_string(got) + ") reading row " + std::to_string(reqs[nd.r].ids[nd.i]) +
                                            " of '" + reqs[nd.r].feature + "'");
                }
              }
            }
            for (size_t k = first_need[b]; k < first_need[b + 1]; k++) {
              const Need& nd = kept[k];
              const FeatureDef& def = defs[nd.r];
              std::memcpy(reqs[nd.r].out + static_cast<size_t>(nd.i) * def.dim, data + (nd.off - blk.offset), def.fixed_width());
              arrived(nd.r);
            }
            return Status::OK();
          },
          run_ready));
    }
  }
  RF_RETURN_IF_ERROR(run_ready());

  if (!by_page.empty()) {
    std::sort(by_page.begin(), by_page.end(), [](const PageNeed& a, const PageNeed& b) {
      return a.page != b.page ? a.page < b.page : a.r != b.r ? a.r < b.r : a.i < b.i;
    });
    std::vector<uint32_t> pids;
    for (const PageNeed& p : by_page)
      if (pids.empty() || pids.back() != p.page) pids.push_back(p.page);
    for (uint32_t r = 0; r < nr; r++) {  // per-request page statistics
      std::vector<uint32_t> mine;
      for (const PageNeed& p : by_page)
        if (p.r == r) {
          reqs[r].stats->page_rows++;
          if (p.take_sums && (mine.empty() || mine.back() != p.page)) reqs[r].stats->first_touch_pages++;
          if (mine.empty() || mine.back() != p.page) mine.push_back(p.page);
        }
      if (mine.empty()) continue;
      reqs[r].stats->device_reads += CoalescePages(mine, rings_ ? (o_.max_io_bytes / ps) : 1).size();
      reqs[r].stats->device_bytes += mine.size() * static_cast<uint64_t>(ps);
    }
    std::vector<uint64_t> keys;
    RingLease ring(rings_.get());
    RF_RETURN_IF_ERROR(ring.Acquire());
    Status rs = ReadPages(ring.get(), pids, [&](uint32_t pid, const PageView& pv) -> Status {
      if (o_.read_only && pv.seq() != pages_.at(pid).seq)
        return Status::Stale("store '" + path_ + "': page " + std::to_string(pid) + " of '" + pages_path_ +
                             "' was rewritten by a writer since this read-only handle opened; reopen the store");
      // Pages complete in any order (io_uring), so find this page's rows by search.
      size_t cursor = std::lower_bound(by_page.begin(), by_page.end(), pid,
                                       [](const PageNeed& a, uint32_t p) { return a.page < p; }) - by_page.begin();
      uint32_t decoded_fid = UINT32_MAX;
      SegmentView sv;
      bool take_sums = false;
      for (; cursor < by_page.size() && by_page[cursor].page == pid; cursor++) {
        const PageNeed& pn = by_page[cursor];
        const GatherRequest& q = reqs[pn.r];
        const FeatureDef& def = defs[pn.r];
        take_sums |= pn.take_sums;
        if (def.id != decoded_fid) {
          if (!pv.Find(def.id, &sv))
            return Status::Corruption("page " + std::to_string(pid) + " of '" + pages_path_ + "' lacks the segment of '" +
                                      q.feature + "' that the key index names");
          sv.width = def.fixed_width();
          keys.resize(sv.count);
          sv.DecodeKeys(keys.data());
          decoded_fid = def.id;
        }
        auto f = std::lower_bound(keys.begin(), keys.end(), q.ids[pn.i]);
        if ((f == keys.end() || *f != q.ids[pn.i]) && deferred[pn.r])  // a gap in the segment's key range
          return Status::InvalidArgument("row " + std::to_string(q.ids[pn.i]) + " is not in table '" + q.feature + "'");
        if (f == keys.end() || *f != q.ids[pn.i])
          return Status::Corruption("page " + std::to_string(pid) + " of '" + pages_path_ + "' lacks row " +
                                    std::to_string(q.ids[pn.i]) + " of '" + q.feature + "' that the key index names");
        const uint8_t* p;
        uint32_t len;
        sv.Value(static_cast<uint32_t>(f - keys.begin()), &p, &len);
        std::memcpy(q.out + static_cast<size_t>(pn.i) * def.dim, p, def.fixed_width());
        arrived(pn.r);
      }
      if (take_sums && sums) sums->Record(pid, pv.seq(), pv.data());
      return Status::OK();
    });
    if (!rs.ok()) return ExplainReadFailure(rs);
    RF_RETURN_IF_ERROR(run_ready());
  }
  return Status::OK();
}

Status Store::VerifyRows(const std::string& name, uint64_t* pages_read) {
  *pages_read = 0;
  RF_RETURN_IF_ERROR(CheckOpen());
  RF_RETURN_IF_ERROR(CheckReadable());
  FeatureDef def;
  RF_RETURN_IF_ERROR(FeatureFor(name, &def));
  if (def.type != ValueType::kFixedFloat32)
    return Status::Schema("feature '" + name + "' is " + def.TypeString() + "; embedding rows need fixed_size_list<float32, D>");
  BlockSums* sums = LoadedBlockSums();
  if (!sums) return Status::OK();
  std::shared_ptr<const Version> v;
  {
    std::lock_guard<std::mutex> l(mu_);
    if (closed_) return Status::Closed("store '" + path_ + "' is closed");
    v = current_;
    readers_.insert(v->number);
  }
  ReaderGuard guard(this, v->number);
  if (def.id >= v->features.size() || !v->features[def.id]) return Status::OK();
  std::vector<uint32_t> pids;
  for (const PageRef& ref : *v->features[def.id])
    if (ref.solo && ref.tombs == 0 && ref.valid == ref.count && ref.max_key - ref.min_key + 1 == ref.count &&
        !sums->Has(ref.page, ref.seq))
      pids.push_back(ref.page);
  std::sort(pids.begin(), pids.end());
  pids.erase(std::unique(pids.begin(), pids.end()), pids.end());
  if (pids.empty()) return Status::OK();
  RingLease ring(rings_.get());
  RF_RETURN_IF_ERROR(ring.Acquire());
  RF_RETURN_IF_ERROR(ReadPages(ring.get(), pids, [&](uint32_t pid, const PageView& pv) -> Status {
    sums->Record(pid, pv.seq(), pv.data());
    return Status::OK();
  }));
  *pages_read = pids.size();
  return Status::OK();
}

// ---------------------------------------------------------------------------------------
// Close and statistics

Status Store::Close() {
  if (closed_) return Status::OK();
  Status s;
  if (o_.read_only) {
    std::unique_lock<std::mutex> l(mu_);
    closed_ = true;
    readers_cv_.wait(l, [&] { return readers_.empty(); });
  } else {
    std::lock_guard<std::mutex> wl(write_mu_);
    if (bg_error_.ok()) s = FlushLocked(true);
    Status s2 = wal_.Sync();
    if (s.ok()) s = s2;
    // After a write error the tables in DRAM may be ahead of the committed metadata: no
    // checkpoint of them (the next open rebuilds from the committed pages).
    if (s.ok() && bg_error_.ok() && !o_.accounting) s = WriteCheckpoint();
    // Block checksums are a cache of verified page contents: losing them only costs a
    // whole-page read per page later, so a failure to save them does not fail the close.
    if (s.ok() && block_sums_ && block_sums_->dirty()) (void)block_sums_->Save(path_ + "/BLOCKSUMS");
    std::unique_lock<std::mutex> l(mu_);
    closed_ = true;
    readers_cv_.wait(l, [&] { return readers_.empty(); });
  }
  wal_.Close();
  file_.Close();
  write_ring_.reset();
  rings_.reset();
  block_rings_.reset();
  meta_.Close();
  if (lock_fd_ >= 0) {
    ::flock(lock_fd_, LOCK_UN);
    ::close(lock_fd_);
    lock_fd_ = -1;
  }
  return s;
}

std::string Store::StatsJson() {
  std::lock_guard<std::mutex> wl(write_mu_);  // the tables belong to the writer side
  const uint32_t ps = o_.page_size;
  uint64_t live_items = 0, live_bytes = 0, tombs = 0, buffered_items = 0, buffered_bytes = 0;
  for (FeatureState* f : features_.All()) {
    live_items += f->live_items;
    live_bytes += f->live_bytes;
    tombs += f->tombs;
  }
  {
    std::lock_guard<std::mutex> l(mu_);
    buffered_items = buffer_.items();
    buffered_bytes = buffer_.bytes();
  }
  const uint64_t pages = pages_.live_pages();
  const uint64_t file_bytes = pages * ps;
  double need = 0;
  const double disk_amp = Reclaimer::SpaceAmp(pages_, ps, &need);
  const size_t meta_bytes = features_.MemoryBytes() + pages_.MemoryBytes();
  uint64_t slots = 0;
  if (!closed_) file_.SlotCount(&slots);
  uint64_t wal_bytes = wal_.bytes_written();

  JsonWriter j;
  j.Open();
  j.KV("page_size", ps);
  j.KV("pages_in_use", static_cast<double>(pages));
  j.KV("file_bytes", static_cast<double>(file_bytes));
  j.KV("file_slots", static_cast<double>(std::max<uint64_t>(slots, pages_.slots())));
  j.KV("free_slots", static_cast<double>(pages_.free_slots()));
  j.KV("live_items", static_cast<double>(live_items));
  j.KV("live_item_bytes", static_cast<double>(live_bytes));
  j.KV("tombstones", static_cast<double>(tombs));
  j.KV("buffered_items", static_cast<double>(buffered_items));
  j.KV("buffered_bytes", static_cast<double>(buffered_bytes));
  j.KV("space_amplification", live_bytes ? static_cast<double>(file_bytes) / live_bytes : 0.0);
  j.KV("space_amplification_pages", disk_amp);
  j.KV("read_amplification", useful_bytes_read_ ? static_cast<double>(bytes_read_) / useful_bytes_read_ : 0.0);
  const uint64_t user_bytes = pstate_.user_bytes_written;
  const uint64_t bytes_written = pstate_.pages_written * ps;
  j.KV("write_amplification", user_bytes ? static_cast<double>(bytes_written) / user_bytes : 0.0);
  j.KV("write_amplification_session_total",
       user_bytes ? static_cast<double>(bytes_written + wal_bytes + meta_.bytes_committed()) / user_bytes : 0.0);
  j.KV("read_amplification_encoded", encoded_bytes_read_ > 0 ? bytes_read_ / encoded_bytes_read_ : 0.0);
  j.KV("pages_read", static_cast<double>(pages_read_));
  j.KV("bytes_read", static_cast<double>(bytes_read_));
  j.KV("useful_bytes_read", static_cast<double>(useful_bytes_read_));
  j.KV("reads", static_cast<double>(reads_));
  j.KV("index_merges", static_cast<double>(index_merges_));
  j.KV("index_merge_fallbacks", static_cast<double>(index_merge_fallbacks_));
  j.KV("pages_written", static_cast<double>(pstate_.pages_written));
  j.KV("bytes_written", static_cast<double>(bytes_written));
  j.KV("flush_pages_written", static_cast<double>(flush_pages_written_));
  j.KV("user_bytes_written", static_cast<double>(user_bytes));
  j.KV("wal_bytes_written", static_cast<double>(wal_bytes));
  j.KV("metadata_bytes_committed", static_cast<double>(meta_.bytes_committed()));
  j.KV("metadata_dram_bytes", static_cast<double>(meta_bytes));
  j.KV("metadata_dram_bytes_per_item", live_items ? static_cast<double>(meta_bytes) / live_items : 0.0);
  j.KV("disk_bytes_per_item", live_items ? static_cast<double>(file_bytes) / live_items : 0.0);
  j.KV("flushes", static_cast<double>(flushes_));
  j.KV("punch_failures", static_cast<double>(punch_failures_));
  j.KV("recovery_seconds", recovery_seconds_);
  j.KV("recovered_wal_records", static_cast<double>(recovered_wal_records_));
  j.Key("read_only");
  j.Bool(o_.read_only);
  j.Key("opened_from_checkpoint");
  j.Bool(opened_from_checkpoint_);
  j.Key("direct_io");
  j.Bool(file_.direct() || closed_);
  j.Key("fragmentation");
  j.Open();
  for (FeatureState* f : features_.All()) j.KV(f->def.name, FragmentationDegree(*f, pages_, ps));
  j.Close();
  j.Key("features");
  j.Open();
  for (FeatureState* f : features_.All()) {
    j.Key(f->def.name);
    j.Open();
    j.Key("type");
    j.Str(f->def.TypeString());
    j.KV("items", static_cast<double>(f->live_items));
    j.KV("valid_bytes", static_cast<double>(f->live_bytes));
    j.KV("tombstones", static_cast<double>(f->tombs));
    j.KV("pages", static_cast<double>(f->pages.size()));
    j.KV("fragmentation", FragmentationDegree(*f, pages_, ps));
    j.KV("key_index_bytes", static_cast<double>(f->index_lazy ? f->index_blob.size() : f->index.MemoryBytes()));
    j.Key("dense_keys");
    j.Bool(f->index_lazy ? (!f->index_blob.empty() && f->index_blob[0] != 0) : f->index.dense());
    j.Close();
  }
  j.Close();
  const auto& p = pinner_.stats();
  j.Key("pinner");
  j.Open();
  j.Key("enabled");
  j.Bool(pinner_.options().enabled);
  j.KV("flushes", static_cast<double>(p.flushes));
  j.KV("features_pinned", static_cast<double>(p.features_pinned));
  j.KV("items_pinned", static_cast<double>(p.items_pinned));
  j.KV("bytes_pinned", static_cast<double>(p.bytes_pinned));
  j.KV("released_threshold", static_cast<double>(p.released_threshold));
  j.KV("released_age", static_cast<double>(p.released_age));
  j.Close();
  const auto& m = merger_.stats();
  j.Key("merger");
  j.Open();
  j.Key("enabled");
  j.Bool(merger_.options().enabled);
  j.KV("threshold", merger_.options().threshold);
  j.KV("low_benefit_frac", merger_.options().low_benefit_frac);
  j.KV("checks", static_cast<double>(m.checks));
  j.KV("victims", static_cast<double>(m.victims));
  j.KV("pages_gathered", static_cast<double>(m.pages_gathered));
  j.KV("items_moved", static_cast<double>(m.items_moved));
  j.KV("pages_written", static_cast<double>(m.pages_written));
  j.KV("bytes_written", static_cast<double>(m.bytes_written));
  j.KV("pages_released", static_cast<double>(m.pages_released));
  j.Close();
  const auto& r = reclaimer_.stats();
  j.Key("reclaimer");
  j.Open();
  j.Key("enabled");
  j.Bool(reclaimer_.options().enabled);
  j.KV("space_amp_limit", reclaimer_.options().space_amp_limit);
  j.KV("runs", static_cast<double>(r.runs));
  j.KV("pages_cleaned", static_cast<double>(r.pages_cleaned));
  j.KV("items_moved", static_cast<double>(r.items_moved));
  j.KV("bytes_written", static_cast<double>(r.bytes_written));
  j.KV("pages_released", static_cast<double>(r.pages_released));
  j.Close();
  j.Close();
  return j.str();
}

}  // namespace recflash
