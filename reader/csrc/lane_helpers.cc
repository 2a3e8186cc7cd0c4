#include "reader/csrc/lane_helpers.h"

#include <unistd.h>

#include <chrono>
#include <system_error>

namespace recflash {

namespace {

// How long Claim::Wait spins before it sleeps (see there).
constexpr std::chrono::microseconds kWaitSpin{200};

inline void PauseCpu() {
#if defined(__x86_64__) || defined(__i386__)
  __builtin_ia32_pause();
#elif defined(__aarch64__)
  asm volatile("yield");
#endif
}

}  // namespace

LaneHelpers::LaneHelpers(unsigned n) {
  for (unsigned i = 0; i < n; i++) slots_.push_back(std::make_unique<Slot>());
}

LaneHelpers::~LaneHelpers() {
  if (owner_pid_.load() != ::getpid()) {
    // Not started, or started by the parent of this forked process: no thread to join here,
    // and std::thread must not be destroyed joinable.
    for (auto& s : slots_)
      if (s->thread.joinable()) s->thread.detach();
    return;
  }
  for (auto& s : slots_) {
    if (!s->thread.joinable()) continue;
    // A claimed helper belongs to a scan still running (the store's close waits for those).
    int expect = kIdle;
    while (!s->state.compare_exchange_weak(expect, kStop)) {
      s->state.wait(expect);
      expect = kIdle;
    }
    s->state.notify_all();
    s->thread.join();
  }
}

void LaneHelpers::StartLocked() {
  for (auto& s : slots_) {
    try {
      s->thread = std::thread([this, p = s.get()] { Loop(p); });
    } catch (const std::system_error&) {
      s->state = kStop;  // never claimed
    }
  }
  owner_pid_ = ::getpid();
  started_ = true;
}

LaneHelpers::Claim LaneHelpers::Acquire(unsigned want) {
  Claim c;
  if (want == 0 || slots_.empty()) return c;
  if (!started_.load()) {
    // One scan starts them; a scan arriving meanwhile runs without helpers.
    if (starting_.test_and_set()) return c;
    if (!started_.load()) StartLocked();
  }
  if (owner_pid_.load() != ::getpid()) return c;
  c.owner_ = this;
  for (unsigned i = 0; i < slots_.size() && c.held_.size() < want; i++) {
    int expect = kIdle;
    if (slots_[i]->state.compare_exchange_strong(expect, kClaimed)) c.held_.push_back(i);
  }
  return c;
}

void LaneHelpers::Loop(Slot* s) {
  for (;;) {
    int st = s->state.load();
    while (st != kRunning && st != kStop) {
      s->state.wait(st);
      st = s->state.load();
    }
    if (st == kStop) return;
    s->job();
    s->job = nullptr;
    s->state = kDone;
    s->state.notify_all();
  }
}

void LaneHelpers::Claim::Run(size_t k, std::function<void()> job) {
  Slot* s = owner_->slots_[held_[k]].get();
  s->job = std::move(job);
  s->state = kRunning;  // publishes the job
  s->state.notify_all();
}

void LaneHelpers::Claim::Wait() {
  if (!owner_) return;
  // A scan's lanes end within some µs of each other (the helper's share arrives in the same
  // burst of completions), so the scan's thread spins a bounded while before it sleeps: put
  // to sleep in the kernel and woken by the helper's notify, it returned ~20 µs after the
  // last lane ended on the 2-core virtual machine measured here, ~4 % of a fragmented
  // feature's scan; spinning, ~2 µs. Scans alternating spin and sleep on the compaction
  // benchmark's store: 2-2.5 % less time with the spin, in each of three runs.
  const auto until = std::chrono::steady_clock::now() + kWaitSpin;
  for (unsigned i : held_) {
    Slot* s = owner_->slots_[i].get();
    while (s->state.load(std::memory_order_acquire) == kRunning && std::chrono::steady_clock::now() < until)
      for (int k = 0; k < 16; k++) PauseCpu();
    for (int st = s->state.load(); st == kRunning; st = s->state.load()) s->state.wait(st);
  }
}

LaneHelpers::Claim::~Claim() {
  if (!owner_) return;
  Wait();
  for (unsigned i : held_) {
    Slot* s = owner_->slots_[i].get();
    s->state = kIdle;
    s->state.notify_all();
  }
}

bool HelperThread::Start(LaneHelpers* helpers, std::function<void()> job) {
  Join();
  if (helpers) {
    claim_.emplace(helpers->Acquire(1));
    if (claim_->size() == 1) {
      claim_->Run(0, std::move(job));
      return true;
    }
    claim_.reset();
  }
  try {
    thread_ = std::thread(std::move(job));
  } catch (const std::system_error&) {
    return false;
  }
  return true;
}

void HelperThread::Join() {
  claim_.reset();  // waits for the job, then gives the helper back
  if (thread_.joinable()) thread_.join();
}

}  // namespace recflash
