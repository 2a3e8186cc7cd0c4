// Test-only fault injection for the engine's I/O (LevelDB's FaultInjectionTestEnv and
// RocksDB's kill points / FaultInjectionTestFS, in one small layer).
//
// Three tools, all off unless a test arms them through recflash.reader.testing:
//   * Injected errors: "fail the Nth call of kind K (optionally only on paths containing P)
//     with errno E", once or from then on (a full disk stays full).
//   * Kill points: named places in the engine's ordering (store_impl.h, "Crash safety"); on the
//     Nth hit of an armed point the process dies there (SIGKILL), or simulates a power loss.
//   * Power-loss tracking: remembers what was written since each file's last fsync/fdatasync
//     (pre-images of overwritten page ranges, appended tails, files whose directory entry was
//     not synced yet); a simulated power loss drops or tears exactly that, then _exit()s.
//
// Cost when off: one relaxed load of a global atomic per I/O call (RF_FAULT / RF_KILL_POINT).
#pragma once
#include <atomic>
#include <cstdint>
#include <string>
#include <vector>

namespace recflash::fault {

// I/O call kinds (site classes) that can be failed. Names (KindName) are the Python API.
enum class Kind : int {
  kPageWrite = 0,   // page writes through io_uring (pages.dat)
  kPageRead,        // page and block reads through io_uring (completion fails)
  kPageSync,        // fdatasync of pages.dat
  kWalAppend,       // WAL record append (writev)
  kWalSync,         // WAL fdatasync
  kFallocate,       // pages.dat space reservation
  kPunchHole,       // pages.dat hole punching of freed slots
  kMetaCommit,      // RocksDB write batch (sync) committing the metadata
  kCheckpointWrite, // clean-shutdown checkpoint and block-checksum files
  kRingSubmit,      // io_uring_submit itself
  kWalOpen,         // open of a WAL file for replay (ENOENT: a file listed, then retired)
  kCount
};
const char* KindName(Kind k);
bool KindFromName(const std::string& name, Kind* out);

// Anything armed or tracked. Read on every I/O call: keep it the only cost when off.
extern std::atomic<bool> g_active;

// errno to fail this call with, or 0. Counts the call while active.
int Inject(Kind k, const std::string& path);
inline int Check(Kind k, const std::string& path) {
  if (__builtin_expect(g_active.load(std::memory_order_relaxed), false)) return Inject(k, path);
  return 0;
}

// Kill points.
void KillPointHit(const char* name);
// Whether the next hit of `name` is the armed one (for points that must act before dying,
// like a torn WAL append). Counts the hit; the caller then calls Die().
bool KillPointDue(const char* name);
[[noreturn]] void Die(const char* name);
#define RF_KILL_POINT(name)                                                              \
  do {                                                                                   \
    if (__builtin_expect(::recflash::fault::g_active.load(std::memory_order_relaxed), 0)) \
      ::recflash::fault::KillPointHit(name);                                             \
  } while (0)

// Pause points: named places where a test holds a thread (the one that reaches the armed
// point first) while it changes the store from another thread, to make a race happen
// deterministically. Hit by RF_PAUSE_POINT; the held thread goes on at ReleasePause (or
// DisarmAll). One point is armed at a time; it disarms itself once passed.
void PausePointHit(const char* name);
#define RF_PAUSE_POINT(name)                                                             \
  do {                                                                                   \
    if (__builtin_expect(::recflash::fault::g_active.load(std::memory_order_relaxed), 0)) \
      ::recflash::fault::PausePointHit(name);                                            \
  } while (0)
void ArmPausePoint(const std::string& name);
// Waits until a thread is held at the armed point; false after timeout_s without one.
bool WaitPaused(double timeout_s);
void ReleasePause();

// Power-loss tracking hooks (no-ops unless tracking is on).
bool Tracking();
void BeforeOverwrite(const std::string& path, uint64_t offset, uint64_t len);  // in-place write
void FileCreated(const std::string& path);
void FileSynced(const std::string& path);  // fsync/fdatasync returned 0
void DirSynced(const std::string& dir);

// Arming (the testing binding).
void Arm(Kind k, uint64_t nth, int err, bool sticky, const std::string& path_contains);
void DisarmAll();
uint64_t Calls(Kind k);
void ArmKillPoint(const std::string& name, uint64_t nth, bool power_loss, uint64_t seed);
std::vector<std::pair<std::string, uint64_t>> KillPointHits();
void SetTracking(bool on, uint64_t seed);
// Drops/tears everything not durable, then _exit(exit_code) (never returns).
[[noreturn]] void PowerLoss(int exit_code);
// Every kill point the engine has (so a stress run can choose among all of them).
const std::vector<const char*>& KillPointNames();

}  // namespace recflash::fault

#define RF_FAULT(kind, path) ::recflash::fault::Check(::recflash::fault::Kind::kind, (path))
