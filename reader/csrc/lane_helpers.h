// LaneHelpers: threads kept parked for the lanes of a scan (StoreOptions::scan_threads).
//
// A thread started and joined per scan cost ~230 µs of the scan's time in a Python process
// on the 2-core virtual machine measured here (against ~20 µs in a small C++ program), more
// than a lane saves on a mid-sized feature; a parked thread wakes in a few µs. Scans from
// several threads share the helpers: a scan takes the ones idle at that moment (Claim) and
// runs with fewer lanes, or none, when others hold them.
#pragma once
#include <atomic>
#include <functional>
#include <memory>
#include <optional>
#include <thread>
#include <vector>

namespace recflash {

class LaneHelpers {
 public:
  explicit LaneHelpers(unsigned n);  // threads start on first Claim
  ~LaneHelpers();                    // waits for running jobs, then stops and joins
  LaneHelpers(const LaneHelpers&) = delete;
  LaneHelpers& operator=(const LaneHelpers&) = delete;

  // Helpers held by one scan; given back by the destructor, after every job ran.
  class Claim {
   public:
    Claim() = default;
    Claim(Claim&& o) noexcept : owner_(o.owner_), held_(std::move(o.held_)) { o.owner_ = nullptr; }
    Claim& operator=(Claim&&) = delete;
    ~Claim();
    size_t size() const { return held_.size(); }
    // Runs job on helper k (k < size()); one job per helper and Claim.
    void Run(size_t k, std::function<void()> job);
    // Waits until every job Run gave has returned (spinning a bounded while first, then
    // sleeping).
    void Wait();

   private:
    friend class LaneHelpers;
    LaneHelpers* owner_ = nullptr;
    std::vector<unsigned> held_;
  };
  // Up to `want` idle helpers. None in a process forked after the helpers started (the child
  // has no threads of the parent's).
  Claim Acquire(unsigned want);

 private:
  enum State : int { kIdle, kClaimed, kRunning, kDone, kStop };
  struct Slot {
    std::atomic<int> state{kIdle};
    std::function<void()> job;
    std::thread thread;
  };
  void Loop(Slot* s);
  void StartLocked();
  std::vector<std::unique_ptr<Slot>> slots_;
  std::atomic<bool> started_{false};
  std::atomic<int> owner_pid_{0};
  std::atomic_flag starting_ = ATOMIC_FLAG_INIT;
};

// One background job of a scan (a dense placement's sweep, the faulting-in of its buffers)
// on a parked helper when one is idle, else on a thread of its own. Two such threads started
// and joined per large feature cost a pass over 100 features a few per cent (see LaneHelpers).
class HelperThread {
 public:
  HelperThread() = default;
  ~HelperThread() { Join(); }
  HelperThread(const HelperThread&) = delete;
  HelperThread& operator=(const HelperThread&) = delete;
  // Starts `job` (helpers may be null: a thread of its own). False when no thread could be
  // had; the caller then does the work itself. One Start per Join.
  bool Start(LaneHelpers* helpers, std::function<void()> job);
  bool running() const { return claim_.has_value() || thread_.joinable(); }
  // Waits for the job to return (nothing when none runs).
  void Join();

 private:
  std::optional<LaneHelpers::Claim> claim_;
  std::thread thread_;
};

}  // namespace recflash
