// Must NOT compile under `make tsa-check`: it touches a guarded member without its lock, and
// calls a ...Locked-style function without the lock it requires. CMakeLists.txt compiles it
// at configure time and fails the check build if it compiles, so a change that silently
// switched the analysis off (macros defined empty, the flag dropped, a std::mutex member the
// analysis cannot see) is caught instead of passing vacuously.
#include "reader/csrc/mutex.h"

namespace {

class Probe {
 public:
  int Unlocked() { return value_; }  // error: reading value_ requires holding mu_
  int CallsLocked() { return ReadLocked(); }  // error: calling ReadLocked requires holding mu_
  int Locked() {
    recflash::MutexLock l(&mu_);
    return ReadLocked();  // fine
  }

 private:
  int ReadLocked() RF_REQUIRES(mu_) { return value_; }
  recflash::Mutex mu_;
  int value_ RF_GUARDED_BY(mu_) = 0;
};

}  // namespace

int main() {
  Probe p;
  return p.Unlocked() + p.CallsLocked() + p.Locked();
}
