#include "reader/csrc/fault_injection.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <array>
#include <chrono>
#include <condition_variable>
#include <csignal>
#include <cstring>
#include <algorithm>
#include <map>
#include <mutex>
#include <random>

namespace recflash::fault {

std::atomic<bool> g_active{false};

namespace {

constexpr const char* kKindNames[] = {"page_write", "page_read",  "page_sync",   "wal_append",       "wal_sync",
                                      "fallocate",  "punch_hole", "meta_commit", "checkpoint_write", "ring_submit",
                                      "wal_open"};
static_assert(sizeof(kKindNames) / sizeof(kKindNames[0]) == static_cast<size_t>(Kind::kCount));

// Every RF_KILL_POINT / KillPointDue name in the engine, in the order of a flush.
const std::vector<const char*> kKillPoints = {
    "wal.append.mid_record",            // half a WAL record written (a torn tail)
    "wal.append.before_sync",           // record appended, not yet synced
    "wal.sync.after",                   // the WAL is durable
    "wal.rotate.after_open",            // a flush opened its new WAL file, pinned items not yet re-logged
    "pages.reserve.after_fallocate",    // page file extended, nothing written into it yet
    "pages.write.before_sync",          // new pages written into free slots, not yet fdatasync'ed
    "pages.sync.after",                 // pages durable, metadata not yet committed (store_impl.h step 2 -> 3)
    "meta.commit.before",               // the RocksDB batch about to be written
    "meta.commit.after",                // committed; old WAL files not yet deleted, freed slots not yet reusable
    "punch.before",                     // freed slots committed as free, hole not yet punched
    "punch.after",                      // hole punched
    "checkpoint.before_rename",         // clean-close checkpoint written to CHECKPOINT.tmp
    "dir.sync.before",                  // a directory entry (new WAL, checkpoint) not yet durable
};

struct Armed {
  bool on = false;
  uint64_t nth = 0;
  int err = 0;
  bool sticky = false;
  std::string path;
  uint64_t seen = 0;  // matching calls since arming
};

struct FileState {
  uint64_t synced_size = 0;
  bool entry_unsynced = false;            // created after its directory's last fsync
  std::map<uint64_t, std::string> pre;    // 4 KiB block offset -> bytes before the first unsynced overwrite
};

std::mutex g_mu;
std::array<Armed, static_cast<size_t>(Kind::kCount)> g_armed;
std::array<std::atomic<uint64_t>, static_cast<size_t>(Kind::kCount)> g_calls{};
std::string g_kill_name;  // armed kill point ("any": every point counts)
uint64_t g_kill_nth = 0, g_kill_seen = 0;
bool g_kill_power = false;
std::map<std::string, uint64_t> g_kill_hits;
bool g_tracking = false;
std::mt19937_64 g_rng;
std::map<std::string, FileState> g_files;
std::string g_pause_name;  // armed pause point
int g_pause_state = 0;     // 0: armed, no thread there yet; 1: a thread is held; 2: released
std::condition_variable g_pause_cv;

void RecomputeLocked() {
  bool any = g_tracking || !g_kill_name.empty() || !g_pause_name.empty();
  for (const Armed& a : g_armed) any = any || a.on;
  // Counting calls (Calls()) is also useful with nothing armed: a test arms "count only".
  g_active.store(any, std::memory_order_relaxed);
}

uint64_t FileSize(const std::string& path) {
  struct stat st;
  if (::stat(path.c_str(), &st) != 0) return 0;
  return static_cast<uint64_t>(st.st_size);
}

std::string Parent(const std::string& path) {
  const size_t slash = path.rfind('/');
  return slash == std::string::npos ? "." : path.substr(0, slash);
}

FileState& FileLocked(const std::string& path) {
  auto it = g_files.find(path);
  if (it == g_files.end()) {
    // First sight of a file that existed before: what it holds now is taken as durable.
    it = g_files.emplace(path, FileState{}).first;
    it->second.synced_size = FileSize(path);
  }
  return it->second;
}

// True when this hit of `name` is the armed one. Counts the hit.
bool DueLocked(const char* name) {
  g_kill_hits[name]++;
  if (g_kill_name.empty() || (g_kill_name != "any" && g_kill_name != name)) return false;
  return ++g_kill_seen == g_kill_nth;
}

}  // namespace

const char* KindName(Kind k) { return kKindNames[static_cast<int>(k)]; }

bool KindFromName(const std::string& name, Kind* out) {
  for (int i = 0; i < static_cast<int>(Kind::kCount); i++)
    if (name == kKindNames[i]) {
      *out = static_cast<Kind>(i);
      return true;
    }
  return false;
}

const std::vector<const char*>& KillPointNames() { return kKillPoints; }

int Inject(Kind k, const std::string& path) {
  const size_t i = static_cast<size_t>(k);
  g_calls[i].fetch_add(1, std::memory_order_relaxed);
  std::lock_guard<std::mutex> l(g_mu);
  Armed& a = g_armed[i];
  if (!a.on) return 0;
  if (!a.path.empty() && path.find(a.path) == std::string::npos) return 0;
  a.seen++;
  if (a.seen == a.nth || (a.sticky && a.seen > a.nth)) return a.err;
  return 0;
}

void Arm(Kind k, uint64_t nth, int err, bool sticky, const std::string& path_contains) {
  std::lock_guard<std::mutex> l(g_mu);
  g_armed[static_cast<size_t>(k)] = Armed{true, nth, err, sticky, path_contains, 0};
  RecomputeLocked();
}

void DisarmAll() {
  std::lock_guard<std::mutex> l(g_mu);
  for (Armed& a : g_armed) a = Armed{};
  for (auto& c : g_calls) c.store(0);
  g_kill_name.clear();
  g_kill_hits.clear();
  g_tracking = false;
  g_files.clear();
  if (g_pause_state == 1) {  // a held thread goes on (and disarms the point as it leaves)
    g_pause_state = 2;
    g_pause_cv.notify_all();
  } else {
    g_pause_name.clear();
  }
  RecomputeLocked();
}

uint64_t Calls(Kind k) { return g_calls[static_cast<size_t>(k)].load(); }

void ArmKillPoint(const std::string& name, uint64_t nth, bool power_loss, uint64_t seed) {
  std::lock_guard<std::mutex> l(g_mu);
  g_kill_name = name;
  g_kill_nth = nth;
  g_kill_seen = 0;
  g_kill_power = power_loss;
  if (power_loss) {
    g_tracking = true;
    g_rng.seed(seed);
  }
  RecomputeLocked();
}

std::vector<std::pair<std::string, uint64_t>> KillPointHits() {
  std::lock_guard<std::mutex> l(g_mu);
  return {g_kill_hits.begin(), g_kill_hits.end()};
}

bool KillPointDue(const char* name) {
  if (!g_active.load(std::memory_order_relaxed)) return false;
  std::lock_guard<std::mutex> l(g_mu);
  return DueLocked(name);
}

void KillPointHit(const char* name) {
  bool due;
  {
    std::lock_guard<std::mutex> l(g_mu);
    due = DueLocked(name);
  }
  if (due) Die(name);
}

void PausePointHit(const char* name) {
  std::unique_lock<std::mutex> l(g_mu);
  if (g_pause_name != name || g_pause_state != 0) return;
  g_pause_state = 1;
  g_pause_cv.notify_all();
  g_pause_cv.wait(l, [] { return g_pause_state == 2; });
  g_pause_name.clear();
  g_pause_state = 0;
  RecomputeLocked();
}

void ArmPausePoint(const std::string& name) {
  std::lock_guard<std::mutex> l(g_mu);
  g_pause_name = name;
  g_pause_state = 0;
  RecomputeLocked();
}

bool WaitPaused(double timeout_s) {
  std::unique_lock<std::mutex> l(g_mu);
  return g_pause_cv.wait_for(l, std::chrono::duration<double>(timeout_s), [] { return g_pause_state == 1; });
}

void ReleasePause() {
  std::lock_guard<std::mutex> l(g_mu);
  if (g_pause_state == 1) {
    g_pause_state = 2;
    g_pause_cv.notify_all();
  } else {
    g_pause_name.clear();  // armed, never reached
    g_pause_state = 0;
    RecomputeLocked();
  }
}

void Die(const char* name) {
  // One write(2): the parent reads the phase of the kill from stderr.
  std::string msg = std::string("recflash kill point: ") + name + "\n";
  (void)!::write(2, msg.data(), msg.size());
  bool power;
  {
    std::lock_guard<std::mutex> l(g_mu);
    power = g_kill_power;
  }
  if (power) PowerLoss(86);
  ::raise(SIGKILL);
  _exit(137);
}

bool Tracking() {
  if (!g_active.load(std::memory_order_relaxed)) return false;
  std::lock_guard<std::mutex> l(g_mu);
  return g_tracking;
}

void SetTracking(bool on, uint64_t seed) {
  std::lock_guard<std::mutex> l(g_mu);
  g_tracking = on;
  g_files.clear();
  g_rng.seed(seed);
  RecomputeLocked();
}

void BeforeOverwrite(const std::string& path, uint64_t offset, uint64_t len) {
  if (!g_active.load(std::memory_order_relaxed)) return;
  std::lock_guard<std::mutex> l(g_mu);
  if (!g_tracking) return;
  FileState& fs = FileLocked(path);
  const uint64_t end = std::min(offset + len, fs.synced_size);
  if (offset >= end) return;  // only appends: dropped by truncation to synced_size
  int fd = -1;
  for (uint64_t b = offset & ~4095ull; b < end; b += 4096) {
    if (fs.pre.count(b)) continue;  // the oldest unsynced pre-image is what a power loss restores
    if (fd < 0) fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
    if (fd < 0) return;
    std::string old(4096, '\0');
    const ssize_t r = ::pread(fd, old.data(), old.size(), static_cast<off_t>(b));
    old.resize(r > 0 ? static_cast<size_t>(r) : 0);
    fs.pre[b] = std::move(old);
  }
  if (fd >= 0) ::close(fd);
}

void FileCreated(const std::string& path) {
  if (!g_active.load(std::memory_order_relaxed)) return;
  std::lock_guard<std::mutex> l(g_mu);
  if (!g_tracking) return;
  FileState fs;
  fs.synced_size = 0;
  fs.entry_unsynced = true;
  g_files[path] = std::move(fs);
}

void FileSynced(const std::string& path) {
  if (!g_active.load(std::memory_order_relaxed)) return;
  std::lock_guard<std::mutex> l(g_mu);
  if (!g_tracking) return;
  FileState& fs = FileLocked(path);
  fs.synced_size = FileSize(path);
  fs.pre.clear();
}

void DirSynced(const std::string& dir) {
  if (!g_active.load(std::memory_order_relaxed)) return;
  std::lock_guard<std::mutex> l(g_mu);
  if (!g_tracking) return;
  std::string d = dir;
  while (d.size() > 1 && d.back() == '/') d.pop_back();
  for (auto& [path, fs] : g_files)
    if (Parent(path) == d) fs.entry_unsynced = false;
}

void PowerLoss(int exit_code) {
  std::unique_lock<std::mutex> l(g_mu);
  std::uniform_int_distribution<int> coin(0, 1), three(0, 2);
  for (auto& [path, fs] : g_files) {
    if (fs.entry_unsynced && coin(g_rng)) {
      ::unlink(path.c_str());  // its directory entry never reached the disk
      continue;
    }
    const int fd = ::open(path.c_str(), O_WRONLY | O_CLOEXEC);
    if (fd < 0) continue;
    // Overwritten blocks: each one reached the disk, did not, or tore (a mix of its 512 B
    // sectors, as a device without atomic 4 KiB writes may leave it).
    for (const auto& [off, old] : fs.pre) {
      const int how = three(g_rng);
      if (how == 0) continue;
      for (size_t s = 0; s < old.size(); s += 512) {
        if (how == 2 && coin(g_rng)) continue;
        const size_t n = std::min<size_t>(512, old.size() - s);
        (void)!::pwrite(fd, old.data() + s, n, static_cast<off_t>(off + s));
      }
    }
    // The unsynced tail: all of it, none of it, or a prefix (a torn append).
    const uint64_t size = FileSize(path);
    if (size > fs.synced_size) {
      const int how = three(g_rng);
      uint64_t keep = size;
      if (how == 1) keep = fs.synced_size;
      if (how == 2) keep = fs.synced_size + std::uniform_int_distribution<uint64_t>(0, size - fs.synced_size)(g_rng);
      if (keep < size) (void)!::ftruncate(fd, static_cast<off_t>(keep));
    }
    ::close(fd);
  }
  const std::string msg = "recflash power loss simulated\n";
  (void)!::write(2, msg.data(), msg.size());
  _exit(exit_code);
}

}  // namespace recflash::fault
