// IoRing: batched page I/O through io_uring (liburing).
//
// Reads go into buffers registered with the kernel (io_uring_register_buffers) so each read
// skips the per-I/O page pinning; adjacent pages are coalesced into one request of up to
// `slot_bytes`; up to `depth` requests are in flight while the caller decodes completed ones.
// Writes are submitted as one batch and reaped together. No per-item syscalls anywhere.
#pragma once
#include <liburing.h>

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "reader/csrc/mutex.h"
#include "reader/csrc/status.h"

namespace recflash {

// A run of adjacent pages [first, first + count).
struct PageRun {
  uint32_t first;
  uint32_t count;
};

// Groups sorted, unique page ids into runs of at most `max_pages` adjacent pages.
std::vector<PageRun> CoalescePages(const std::vector<uint32_t>& sorted_pages, uint32_t max_pages);

// Aligned heap buffer for O_DIRECT.
class AlignedBuffer {
 public:
  AlignedBuffer() = default;
  explicit AlignedBuffer(size_t bytes);
  ~AlignedBuffer();
  AlignedBuffer(AlignedBuffer&& o) noexcept : p_(o.p_), n_(o.n_) { o.p_ = nullptr; o.n_ = 0; }
  AlignedBuffer& operator=(AlignedBuffer&& o) noexcept;
  AlignedBuffer(const AlignedBuffer&) = delete;
  uint8_t* data() const { return p_; }
  size_t size() const { return n_; }
  // Gives up ownership without freeing (memory the kernel may still write into).
  void release() {
    p_ = nullptr;
    n_ = 0;
  }

 private:
  void Free();

  uint8_t* p_ = nullptr;
  size_t n_ = 0;
};

class IoRing {
 public:
  // Order in which completed reads reach the callbacks. kArrival (the default) is the
  // kernel's; kReverse holds every completion of a window of in-flight reads (up to `depth`)
  // and delivers them in descending request order — a test-only knob that makes callers'
  // assumptions about completion order fail deterministically instead of by chance.
  enum class CompletionOrder { kArrival, kReverse };
  static void SetCompletionOrderForTesting(CompletionOrder order);
  static CompletionOrder completion_order();

  // Called for each completed run with its bytes (count * page_size). A non-OK status stops
  // the batch; the remaining in-flight reads are drained before returning.
  using RunCallback = std::function<Status(const PageRun& run, const uint8_t* data)>;
  // `idle`, when given, runs after every submission while reads are in flight: the caller's
  // own work (a scan's merge plan, pooling rows that already arrived) overlaps the I/O
  // instead of waiting behind it. It should return quickly once it has nothing left to do.
  using IdleFn = std::function<Status()>;

  static Status Create(unsigned depth, uint32_t slot_bytes, std::unique_ptr<IoRing>* out);
  ~IoRing();

  uint32_t slot_bytes() const { return slot_bytes_; }
  // Whether the read slots exist yet (made by the first read, see PrepareSlots).
  bool has_slots() const { return slots_.data() != nullptr; }
  // Every call below returns with nothing in flight, also on errors (a failed submit, a
  // failed read, a callback's error): the ring can go back to the pool and be reused. A ring
  // that could not be drained (the kernel refused every submit) reports broken() and the
  // pool drops it.
  bool broken() const { return broken_; }
  // The process that created the ring. A forked child shares the kernel ring with its
  // parent: it must neither use it nor tear it down (IoRingPool drops such rings).
  int owner_pid() const { return owner_pid_; }
  // Reads every run (each at most slot_bytes) from fd, calling cb as runs complete.
  // `max_inflight_bytes` (0: no limit) caps the bytes of the runs in flight below the ring's
  // depth: a device that completes a deep queue in one burst leaves the callbacks nothing to
  // do until the last read is in, while a shallower queue it completes in a steady stream
  // at the same throughput, the decoding overlapping the reads (see StoreOptions). Near the
  // end it tapers to 3/4 of what is left to read, so the last window, decoded after the
  // device is done, is small; a call that fits the budget whole keeps at least four reads in
  // flight that the budget has room for, so that its short runs do not go out one by one.
  Status ReadRuns(int fd, const std::string& path, uint32_t page_size, const std::vector<PageRun>& runs,
                  const RunCallback& cb, const IdleFn& idle = nullptr, uint64_t max_inflight_bytes = 0);
  // Called from a ReadRuns call's idle function (or a run callback): takes the completions
  // that are already there and issues what they free of the budget, so the device keeps
  // reading while the caller works; the runs taken are delivered after the current callback,
  // in completion order. Long idle work calls it every few tens of microseconds (a lane's
  // share of a placement plan, ~0.3 ms for a large fragmented feature, left the device idle
  // once its first window was in). Outside ReadRuns: nothing. Cheap when nothing completed.
  void Pump() {
    if (pump_) pump_();
  }
  // Most bytes the last ReadRuns had in flight at once (tests: the budget holds).
  uint64_t peak_inflight_bytes() const { return peak_inflight_bytes_; }
  // Runs the last ReadRuns took through Pump (tests).
  uint64_t pumped_runs() const { return pumped_runs_; }
  // Seconds the last ReadRuns or ReadBlocks spent blocked waiting for completions (its
  // `idle` work excluded): the device's share of the call, the rest was the caller's work.
  double wait_seconds() const { return wait_seconds_; }
  // Microseconds a wait for completions polls the completion queue before it sleeps in the
  // kernel (StoreOptions::read_poll_us; 0: it sleeps at once). Set by each read lease and
  // cleared when the ring goes back to its pool.
  void set_poll_us(uint32_t us) { poll_us_ = us; }
  // Reads arbitrary byte ranges (offset and length aligned to the device's logical block,
  // each at most slot_bytes): the vector-grained path. cb gets the block index and its bytes.
  struct Block {
    uint64_t offset;
    uint32_t len;
  };
  // `idle` as for ReadRuns. The callbacks only copy out, so slots are refilled right after
  // each reap.
  using BlockCallback = std::function<Status(size_t block, const uint8_t* data)>;
  Status ReadBlocks(int fd, const std::string& path, const std::vector<Block>& blocks, const BlockCallback& cb,
                    const IdleFn& idle = nullptr);
  // Writes each run from src (count * page_size bytes each, aligned); all submitted together.
  Status WriteRuns(int fd, const std::string& path, uint32_t page_size, const std::vector<PageRun>& runs,
                   const std::vector<const uint8_t*>& src);

 private:
  IoRing() = default;
  // Maps and registers the read slots on first use (see io_ring.cc).
  Status PrepareSlots();
  // io_uring_submit_and_wait with the test-only fault hook (kind ring_submit).
  int Submit(unsigned wait_nr, const std::string& path);
  // After an error: submits what is queued and reaps until `inflight` requests completed.
  Status Abandon(Status status, unsigned inflight);
  // Submits what is queued without waiting, runs `idle` (its status into *status) while the
  // device reads, then waits for `want` completions. False when the ring failed: *status then
  // holds the error and nothing is in flight (Abandon ran); the caller returns it.
  bool SubmitIdleWait(const std::string& path, const IdleFn& idle, unsigned want, unsigned inflight,
                      Status* status);
  // Polls for `want` completions for up to poll_us_; whether they are there.
  bool Poll(unsigned want);
  io_uring ring_{};
  bool broken_ = false;
  bool ring_ok_ = false;
  unsigned depth_ = 0;
  uint32_t slot_bytes_ = 0;
  AlignedBuffer slots_;  // depth_ slots of slot_bytes_, registered with the ring; empty until the first read
  bool registered_ = false;
  int owner_pid_ = 0;
  uint64_t peak_inflight_bytes_ = 0;
  double wait_seconds_ = 0;
  uint32_t poll_us_ = 0;
  std::function<void()> pump_;  // set while ReadRuns runs
  bool pumped_ = false;         // the idle function's pumps took completions (SubmitIdleWait)
  uint64_t pumped_runs_ = 0;
};

// A small pool so concurrent readers each get a ring of their own.
//
// Pools are shared by every store of the process (Shared): a ring's registered slots are
// megabytes the kernel zero-fills and pins, so creating them made up half of a read-only
// open, and a Ray worker opens the store once per read task. A closed store's rings wait
// here for the next open; at most `max_idle` of them per pool.
class IoRingPool {
 public:
  IoRingPool(unsigned depth, uint32_t slot_bytes, size_t max_idle = 8)
      : depth_(depth), slot_bytes_(slot_bytes), max_idle_(max_idle) {}
  // The process-wide pool for rings of this shape (never destroyed).
  static IoRingPool* Shared(unsigned depth, uint32_t slot_bytes);
  // `reads`: the lease will read (a scan's, a get's). An idle ring of that kind is preferred,
  // with read slots for reads and without for a store's write ring (which may never read), so
  // that neither a scan faults in slots an idle ring already had nor a write ring sits on them.
  Status Acquire(std::unique_ptr<IoRing>* out, bool reads = true);
  void Release(std::unique_ptr<IoRing> r);

 private:
  Mutex mu_;
  std::vector<std::unique_ptr<IoRing>> free_ RF_GUARDED_BY(mu_);
  unsigned depth_;
  uint32_t slot_bytes_;
  size_t max_idle_;
};

// RAII lease of a ring from a pool.
class RingLease {
 public:
  // `poll_us`: the ring's waits poll this long before sleeping (see IoRing::set_poll_us).
  explicit RingLease(IoRingPool* pool, uint32_t poll_us = 0) : pool_(pool), poll_us_(poll_us) {}
  ~RingLease() {
    if (ring_) pool_->Release(std::move(ring_));
  }
  Status Acquire() {
    Status s = pool_->Acquire(&ring_);
    if (ring_) ring_->set_poll_us(poll_us_);
    return s;
  }
  IoRing* get() const { return ring_.get(); }

 private:
  IoRingPool* pool_;
  uint32_t poll_us_;
  std::unique_ptr<IoRing> ring_;
};

}  // namespace recflash
