#include "reader/csrc/io_ring.h"

#include <sched.h>
#include <sys/uio.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <map>

#include "reader/csrc/clock.h"
#include "reader/csrc/column.h"
#include "reader/csrc/fault_injection.h"

namespace recflash {

namespace {
std::atomic<IoRing::CompletionOrder> g_completion_order{IoRing::CompletionOrder::kArrival};
}  // namespace

void IoRing::SetCompletionOrderForTesting(CompletionOrder order) { g_completion_order.store(order); }
IoRing::CompletionOrder IoRing::completion_order() { return g_completion_order.load(std::memory_order_relaxed); }

std::vector<PageRun> CoalescePages(const std::vector<uint32_t>& pages, uint32_t max_pages) {
  std::vector<PageRun> runs;
  for (uint32_t p : pages) {
    if (!runs.empty() && runs.back().first + runs.back().count == p && runs.back().count < max_pages) {
      runs.back().count++;
    } else {
      runs.push_back({p, 1});
    }
  }
  return runs;
}

// From 2 MiB up the buffer comes from IoBufferAllocate (column.h): 2 MiB aligned and advised
// for transparent huge pages. Reads into huge pages took markedly less device time on this virtual
// disk (the compacted layout of the compaction benchmark, 1,312 feature reads of 777 MB: device
// busy 494-602 ms vs 652-1,042 ms, read time 0.39-0.50 vs 0.51-0.72 s), likely because the host
// then sees a 256 KiB read as one memory segment instead of up to 64. posix_memalign(4096) had
// left a quarter of an 8 MiB ring on 4 KiB pages.
constexpr size_t kHugeBuffer = 2u << 20;

AlignedBuffer::AlignedBuffer(size_t bytes) : n_(bytes) {
  if (bytes >= kHugeBuffer) {
    p_ = static_cast<uint8_t*>(IoBufferAllocate(bytes));
    return;
  }
  void* p = nullptr;
  if (posix_memalign(&p, 4096, bytes ? bytes : 4096) != 0) throw std::bad_alloc();
  p_ = static_cast<uint8_t*>(p);
}

void AlignedBuffer::Free() {
  if (n_ >= kHugeBuffer) {
    IoBufferFree(p_, n_);
  } else {
    std::free(p_);
  }
}

AlignedBuffer::~AlignedBuffer() { Free(); }

AlignedBuffer& AlignedBuffer::operator=(AlignedBuffer&& o) noexcept {
  if (this != &o) {
    Free();
    p_ = o.p_;
    n_ = o.n_;
    o.p_ = nullptr;
    o.n_ = 0;
  }
  return *this;
}

Status IoRing::Create(unsigned depth, uint32_t slot_bytes, std::unique_ptr<IoRing>* out) {
  std::unique_ptr<IoRing> r(new IoRing());
  r->depth_ = depth;
  r->slot_bytes_ = slot_bytes;
  r->owner_pid_ = ::getpid();
  int rc = io_uring_queue_init(depth * 2, &r->ring_, 0);
  if (rc < 0) return Status::FromErrno("io_uring_queue_init", "(ring)", -rc);
  r->ring_ok_ = true;
  *out = std::move(r);
  return Status::OK();
}

// The slots are mapped and registered at the first read, not when the ring is made. Why:
// registering pins, so it faults in the whole arena (depth x slot_bytes, 8 MiB by default) at
// once, and fresh memory on this kind of virtual machine faults in slowly as huge pages
// (huge_alloc.cc): 10-20 ms, up to half of a cold process's writable open. A ring that only
// writes (WriteRuns writes from the caller's pages; a small upsert's flush runs no read) now
// never pays it. Pooled rings keep their slots, so later reads find them ready.
Status IoRing::PrepareSlots() {
  if (slots_.data()) return Status::OK();
  try {
    slots_ = AlignedBuffer(static_cast<size_t>(depth_) * slot_bytes_);
  } catch (const std::bad_alloc&) {
    return Status::IOError("cannot allocate " + std::to_string(static_cast<size_t>(depth_) * slot_bytes_) +
                           " bytes of read buffers for an io_uring ring");
  }
  std::vector<iovec> iov(depth_);
  for (unsigned i = 0; i < depth_; i++) {
    iov[i].iov_base = slots_.data() + static_cast<size_t>(i) * slot_bytes_;
    iov[i].iov_len = slot_bytes_;
  }
  // Registration can fail under a low RLIMIT_MEMLOCK; plain reads still work then.
  registered_ = io_uring_register_buffers(&ring_, iov.data(), depth_) == 0;
  return Status::OK();
}

IoRing::~IoRing() {
  if (ring_ok_) {
    if (registered_ && !broken_) io_uring_unregister_buffers(&ring_);
    io_uring_queue_exit(&ring_);
  }
  // A ring that could not be drained may still complete reads into its slots after the
  // exit (the kernel tears the ring down asynchronously): never hand that memory back.
  if (broken_) slots_.release();
}

namespace {

inline void CpuRelax() {
#if defined(__x86_64__) || defined(__i386__)
  __builtin_ia32_pause();
#endif
}

}  // namespace

bool IoRing::Poll(unsigned want) {
  if (poll_us_ == 0) return false;
  // The clock is read every 64 probes: a probe is a load of the completion queue's tail.
  // Every 256th (~10 us) yields the core, so that a runnable thread of another reader or
  // process is not held off by the poll (nothing else runnable: it returns at once).
  const double end = Now() + poll_us_ * 1e-6;
  for (unsigned i = 1;; i++) {
    if (io_uring_cq_ready(&ring_) >= want) return true;
    if (i % 256 == 0) {
      sched_yield();
    } else {
      CpuRelax();
    }
    if (i % 64 == 0 && Now() > end) return io_uring_cq_ready(&ring_) >= want;
  }
}

int IoRing::Submit(unsigned wait_nr, const std::string& path) {
  if (const int e = RF_FAULT(kRingSubmit, path)) return -e;
  if (wait_nr == 0) return io_uring_submit_and_wait(&ring_, 0);
  const double t = Now();
  if (poll_us_ > 0) {
    // Submitted first, then polled; only if that runs out, the sleep (nothing left to submit).
    const int sent = io_uring_submit(&ring_);
    if (sent < 0) return sent;
    if (Poll(wait_nr)) {
      wait_seconds_ += Now() - t;
      return sent;
    }
  }
  const int rc = io_uring_submit_and_wait(&ring_, wait_nr);
  wait_seconds_ += Now() - t;
  return rc;
}

bool IoRing::SubmitIdleWait(const std::string& path, const IdleFn& idle, unsigned want, unsigned inflight,
                            Status* status) {
  int rc;
  do rc = Submit(0, path);  // (a wait below would not submit what is still queued)
  while (rc == -EINTR);
  if (rc < 0) {
    *status = Abandon(Status::FromErrno("io_uring_submit", path, -rc), inflight);
    return false;
  }
  pumped_ = false;
  *status = idle();
  // Its pumps took completions (and the wait below might have none left to see): those are
  // delivered first.
  if (pumped_) return true;
  io_uring_cqe* first;
  const double t = Now();
  Poll(want);  // (then the wait below returns without entering the kernel)
  do rc = io_uring_wait_cqe_nr(&ring_, &first, want);
  while (rc == -EINTR);
  wait_seconds_ += Now() - t;
  if (rc < 0) {
    if (status->ok()) *status = Status::FromErrno("io_uring_wait_cqe", path, -rc);
    *status = Abandon(*status, inflight);
    return false;
  }
  return true;
}

Status IoRing::Abandon(Status status, unsigned inflight) {
  // Every request prepared or submitted must complete before the ring (and its slots, or
  // the caller's write buffers) can be used again: io_ring.h promises a ring comes back
  // idle. Submit what is still queued and reap until nothing is outstanding.
  unsigned failures = 0;
  while (inflight > 0) {
    const int rc = io_uring_submit_and_wait(&ring_, 1);
    if (rc < 0 && rc != -EINTR) {
      if (++failures > 1000) {
        broken_ = true;  // the pool drops it; its slots are leaked rather than reused
        return status;
      }
      ::usleep(1000);
      continue;
    }
    io_uring_cqe* cqe;
    unsigned head, seen = 0;
    io_uring_for_each_cqe(&ring_, head, cqe) seen++;
    io_uring_cq_advance(&ring_, seen);
    inflight -= std::min(seen, inflight);
  }
  return status;
}

Status IoRing::ReadRuns(int fd, const std::string& path, uint32_t page_size, const std::vector<PageRun>& runs,
                        const RunCallback& cb, const IdleFn& idle, uint64_t max_inflight_bytes) {
  RF_RETURN_IF_ERROR(PrepareSlots());
  struct Pending {
    size_t run = 0;
    uint32_t done = 0;  // bytes already read (short reads are resubmitted)
  };
  std::vector<Pending> slot(depth_);
  std::vector<unsigned> free_slots;
  for (unsigned i = 0; i < depth_; i++) free_slots.push_back(depth_ - 1 - i);
  for (const PageRun& r : runs)
    if (static_cast<uint64_t>(r.count) * page_size > slot_bytes_)
      return Status::InvalidArgument("read run of pages " + std::to_string(r.first) + ".." +
                                     std::to_string(r.first + r.count - 1) + " of '" + path +
                                     "' is larger than a ring slot (" + std::to_string(slot_bytes_) + " bytes)");
  size_t next = 0;
  unsigned inflight = 0;
  uint64_t inflight_bytes = 0;  // of the runs submitted and not yet completed
  uint64_t unissued_bytes = 0;  // of the runs not yet submitted
  for (const PageRun& r : runs) unissued_bytes += static_cast<uint64_t>(r.count) * page_size;
  Status status;
  const bool reverse = completion_order() == CompletionOrder::kReverse;
  std::vector<unsigned> held;  // kReverse: completed slots not yet delivered
  // The next run may go out: a free slot, and within the byte budget (always when nothing
  // is in flight, so a run larger than the budget still goes and the loop cannot stall).
  // Near the end the budget tapers to 3/4 of what is left to read (in flight or not), so the
  // last windows shrink: the decoding of the final one overlaps no read, and it is now a
  // fraction of the budget. (A lane of a fragmented scan placed its last 384 KiB, ~230 us,
  // after the device was done.) Measured alternating on the compaction benchmark's default
  // store: its lane-scanned features 5-9 % faster per pass (1/2: 1 %, 5/8: 5 %, 7/8: 7 %),
  // packed ones -1 to +3 %.
  //
  // A call that fits its budget whole is not tapered below kMinReads reads in flight: its
  // short runs (a small fragmented feature's pages, a few runs of 2-3 pages each) would
  // otherwise go out one by one near the end, each waiting for the one before it. With
  // 160 KiB in five runs the taper let three go, then one at a time, so such a feature paid
  // the device's latency two or three times over (and a virtio notification per read).
  // Measured alternating on the compaction benchmark's default store, its 342 reads of
  // features under 16 pages (~4.6 runs each, ten passes): 0.80-0.84 s with the taper alone,
  // 0.62-0.75 s with at least 2 reads, 0.60-0.67 s with 4, 0.68-0.77 s with 8; its lanes'
  // shares of the features of 16-64 pages 1-10 % faster (three pairs). Longer calls keep the
  // taper, which is what shortens their last window; long runs are unaffected anyway (two
  // reads of up to max_io_bytes do not fit a one-lane budget).
  constexpr unsigned kMinReads = 4;
  const bool fits_budget = unissued_bytes <= max_inflight_bytes;  // the whole call
  auto may_issue = [&]() {
    if (next >= runs.size() || free_slots.empty()) return false;
    if (max_inflight_bytes == 0 || inflight == 0) return true;
    const uint64_t after = inflight_bytes + static_cast<uint64_t>(runs[next].count) * page_size;
    if (fits_budget && inflight < kMinReads && after <= max_inflight_bytes) return true;
    const uint64_t budget = std::min(max_inflight_bytes, (unissued_bytes + inflight_bytes) / 4 * 3);
    return after <= budget;
  };
  peak_inflight_bytes_ = 0;
  wait_seconds_ = 0;
  auto issue = [&](unsigned s) {
    slot[s] = Pending{next, 0};
    const uint64_t bytes = static_cast<uint64_t>(runs[next++].count) * page_size;
    unissued_bytes -= bytes;
    inflight_bytes += bytes;
    peak_inflight_bytes_ = std::max(peak_inflight_bytes_, inflight_bytes);
  };

  auto submit_slot = [&](unsigned s) {
    const PageRun& r = runs[slot[s].run];
    const uint32_t total = r.count * page_size;
    uint8_t* buf = slots_.data() + static_cast<size_t>(s) * slot_bytes_;
    io_uring_sqe* sqe = io_uring_get_sqe(&ring_);
    const uint64_t off = static_cast<uint64_t>(r.first) * page_size + slot[s].done;
    if (registered_) {
      io_uring_prep_read_fixed(sqe, fd, buf + slot[s].done, total - slot[s].done, off, static_cast<int>(s));
    } else {
      io_uring_prep_read(sqe, fd, buf + slot[s].done, total - slot[s].done, off);
    }
    io_uring_sqe_set_data64(sqe, s);
    inflight++;
  };

  // The first read of a batch of kFirstAloneMin or more goes to the kernel on its own, the
  // rest after it. A single submit of n reads hands the device nothing until the kernel has
  // prepared all n (~30 us for ten on this kind of virtual disk, which then serves them
  // about one at a time): submitted alone, the first is being read meanwhile. Fragmented
  // scans (ten reads) took 2-3 % less time, measured scan by scan against one submit; for
  // batches of one or two reads the extra system call does not pay.
  constexpr size_t kFirstAloneMin = 3;
  bool first_alone = runs.size() >= kFirstAloneMin;
  // Submits what is queued without waiting; false (status set) when the kernel refused.
  auto push = [&]() {
    const int rc = Submit(0, path);
    if (rc >= 0 || rc == -EINTR) return true;
    status = Status::FromErrno("io_uring_submit", path, -rc);
    return false;
  };
  unsigned unsent = 0;  // prepared by the refill below, not yet submitted
  // Issues what the slots and the budget allow. Queued reads are submitted in fours, or at
  // once when few are left in flight. False when the kernel refused (status set).
  auto refill = [&]() {
    while (status.ok() && may_issue()) {
      const unsigned f = free_slots.back();
      free_slots.pop_back();
      issue(f);
      submit_slot(f);
      if (++unsent >= 4 || inflight - unsent < depth_ / 4) {
        if (!push()) return false;
        unsent = 0;
      }
    }
    return true;
  };
  std::deque<unsigned> ready;  // completed runs not yet delivered, in completion order
  // Takes the completions there are: complete runs to `ready` (kReverse: `held`), short reads
  // resubmitted, failed ones recorded in `status`.
  auto reap = [&]() {
    io_uring_cqe* cqe;
    unsigned head, seen = 0;
    std::vector<unsigned> completed;
    io_uring_for_each_cqe(&ring_, head, cqe) {
      seen++;
      const unsigned s = static_cast<unsigned>(io_uring_cqe_get_data64(cqe));
      inflight--;
      int res = cqe->res;
      if (res > 0)
        if (const int e = RF_FAULT(kPageRead, path)) res = -e;
      const PageRun& r = runs[slot[s].run];
      const uint32_t total = r.count * page_size;
      if (res < 0) {
        if (res == -EAGAIN || res == -EINTR) {
          completed.push_back(s | 0x80000000u);  // resubmit
          continue;
        }
        if (status.ok())
          status = Status::FromErrno("read of pages " + std::to_string(r.first) + ".." +
                                         std::to_string(r.first + r.count - 1),
                                     path, -res);
        free_slots.push_back(s);
        continue;
      }
      if (res == 0) {
        if (status.ok())
          status = Status::Corruption("page " + std::to_string(r.first + slot[s].done / page_size) + " of '" + path +
                                      "' lies beyond the end of the file");
        free_slots.push_back(s);
        continue;
      }
      slot[s].done += static_cast<uint32_t>(res);
      if (slot[s].done < total) {
        completed.push_back(s | 0x80000000u);
      } else {
        inflight_bytes -= total;
        completed.push_back(s);
      }
    }
    io_uring_cq_advance(&ring_, seen);
    for (unsigned c : completed) {
      const unsigned s = c & 0x7fffffffu;
      if (c & 0x80000000u) {
        if (status.ok()) {
          submit_slot(s);
        } else {
          free_slots.push_back(s);
        }
        continue;
      }
      if (reverse) {
        held.push_back(s);
      } else {
        ready.push_back(s);
      }
    }
  };
  pumped_runs_ = 0;
  struct PumpReset {
    IoRing* r;
    ~PumpReset() { r->pump_ = nullptr; }
  } pump_reset{this};
  pump_ = [&]() {
    if (io_uring_cq_ready(&ring_) == 0) return;
    const size_t before = ready.size() + held.size();
    reap();
    pumped_runs_ += ready.size() + held.size() - before;
    pumped_ = true;
    // A refused submit leaves status set: the loop below stops issuing and drains.
    if (!refill()) next = runs.size();
  };
  while (next < runs.size() || inflight > 0 || !ready.empty()) {
    if (ready.empty()) {
      bool queued = unsent > 0;
      unsent = 0;  // (submitted by this round's submit or wait)
      while (status.ok() && may_issue()) {
        unsigned s = free_slots.back();
        free_slots.pop_back();
        issue(s);
        submit_slot(s);
        queued = true;
        if (first_alone) {
          first_alone = false;
          if (may_issue() && !push()) return Abandon(status, inflight);
        }
      }
      if (!status.ok() && inflight == 0) break;
      if (idle && status.ok() && inflight > 0) {
        if (!SubmitIdleWait(path, idle, 1, inflight, &status)) return status;
      } else if (queued || inflight > 0) {
        int rc = Submit(1, path);
        if (rc < 0 && rc != -EINTR) {
          if (status.ok()) status = Status::FromErrno("io_uring_submit", path, -rc);
          return Abandon(status, inflight);
        }
      }
      reap();
    }
    while (!ready.empty()) {
      const unsigned s = ready.front();
      ready.pop_front();
      // Refill before delivering, and again after: the reaped run's bytes already left the
      // in-flight budget, so its successor goes to the device while the callback verifies
      // and places this one (refilling only after it left the device one read short for the
      // callback's time: 1.6-1.9 % more scan time, compacted and fragmented features alike,
      // measured alternating scan by scan). Delivering a whole batch of completions before
      // issuing more let the queue drain and refill in one go, the device idle meanwhile.
      if (!refill()) return Abandon(status, inflight);
      if (status.ok()) status = cb(runs[slot[s].run], slots_.data() + static_cast<size_t>(s) * slot_bytes_);
      free_slots.push_back(s);
      if (!refill()) return Abandon(status, inflight);
    }
    if (!held.empty() && inflight == 0 && (free_slots.empty() || next >= runs.size() || !status.ok())) {
      std::sort(held.begin(), held.end(), [&](unsigned a, unsigned b) { return slot[a].run > slot[b].run; });
      for (unsigned s : held) {
        if (status.ok()) status = cb(runs[slot[s].run], slots_.data() + static_cast<size_t>(s) * slot_bytes_);
        free_slots.push_back(s);
      }
      held.clear();
    }
    if (!status.ok()) next = runs.size();  // stop issuing; drain what is in flight
  }
  return status;
}

Status IoRing::ReadBlocks(int fd, const std::string& path, const std::vector<Block>& blocks, const BlockCallback& cb,
                          const IdleFn& idle) {
  RF_RETURN_IF_ERROR(PrepareSlots());
  wait_seconds_ = 0;
  std::vector<size_t> slot_block(depth_);
  std::vector<uint32_t> slot_done(depth_, 0);
  std::vector<unsigned> free_slots;
  for (unsigned i = 0; i < depth_; i++) free_slots.push_back(depth_ - 1 - i);
  size_t next = 0;
  unsigned inflight = 0;
  Status status;
  const bool reverse = completion_order() == CompletionOrder::kReverse;
  std::vector<unsigned> held;  // kReverse: completed slots not yet delivered
  auto submit = [&](unsigned sl) {
    const Block& b = blocks[slot_block[sl]];
    uint8_t* buf = slots_.data() + static_cast<size_t>(sl) * slot_bytes_;
    io_uring_sqe* sqe = io_uring_get_sqe(&ring_);
    const uint32_t done = slot_done[sl];
    if (registered_) {
      io_uring_prep_read_fixed(sqe, fd, buf + done, b.len - done, b.offset + done, static_cast<int>(sl));
    } else {
      io_uring_prep_read(sqe, fd, buf + done, b.len - done, b.offset + done);
    }
    io_uring_sqe_set_data64(sqe, sl);
    inflight++;
  };
  auto deliver = [&](unsigned sl) {
    if (status.ok()) status = cb(slot_block[sl], slots_.data() + static_cast<size_t>(sl) * slot_bytes_);
    free_slots.push_back(sl);
  };
  for (const Block& b : blocks)
    if (b.len > slot_bytes_)
      return Status::InvalidArgument("block read of " + std::to_string(b.len) + " bytes at offset " +
                                     std::to_string(b.offset) + " of '" + path + "' is larger than a ring slot (" +
                                     std::to_string(slot_bytes_) + " bytes)");
  std::vector<unsigned> again;
  while (next < blocks.size() || inflight > 0) {
    while (status.ok() && next < blocks.size() && !free_slots.empty()) {
      const unsigned sl = free_slots.back();
      free_slots.pop_back();
      slot_block[sl] = next++;
      slot_done[sl] = 0;
      submit(sl);
    }
    if (inflight == 0) break;
    // Wait for one completion and refill at once. (Reaping an eighth of the queue per wait
    // saved syscalls but measured no faster against the raw io_uring reference.)
    const unsigned want = 1;
    if (idle && status.ok()) {
      if (!SubmitIdleWait(path, idle, want, inflight, &status)) return status;
    } else {
      int rc = Submit(want, path);
      if (rc < 0 && rc != -EINTR) {
        if (status.ok()) status = Status::FromErrno("io_uring_submit", path, -rc);
        return Abandon(status, inflight);
      }
    }
    io_uring_cqe* cqe;
    unsigned head, seen = 0;
    again.clear();
    io_uring_for_each_cqe(&ring_, head, cqe) {
      seen++;
      const unsigned sl = static_cast<unsigned>(io_uring_cqe_get_data64(cqe));
      inflight--;
      const Block& b = blocks[slot_block[sl]];
      int res = cqe->res;
      if (res > 0)
        if (const int e = RF_FAULT(kPageRead, path)) res = -e;
      if (res < 0) {
        if (res == -EAGAIN || res == -EINTR) {
          again.push_back(sl);
          continue;
        }
        if (status.ok())
          status = Status::FromErrno("read of " + std::to_string(b.len) + " bytes at offset " + std::to_string(b.offset),
                                     path, -res);
        free_slots.push_back(sl);
        continue;
      }
      if (res == 0) {
        if (status.ok()) status = Status::Corruption("offset " + std::to_string(b.offset) + " of '" + path + "' lies beyond the end of the file");
        free_slots.push_back(sl);
        continue;
      }
      slot_done[sl] += static_cast<uint32_t>(res);
      if (slot_done[sl] < b.len) {
        again.push_back(sl);
      } else if (reverse) {
        held.push_back(sl);
      } else {
        deliver(sl);  // copies out at once, so the slot is refilled before the next wait
      }
    }
    io_uring_cq_advance(&ring_, seen);
    for (unsigned sl : again) {
      if (status.ok()) submit(sl);
      else free_slots.push_back(sl);
    }
    if (!held.empty() && inflight == 0 && (free_slots.empty() || next >= blocks.size() || !status.ok())) {
      std::sort(held.begin(), held.end(), [&](unsigned a, unsigned b) { return slot_block[a] > slot_block[b]; });
      for (unsigned sl : held) deliver(sl);
      held.clear();
    }
    if (!status.ok()) next = blocks.size();
  }
  return status;
}

Status IoRing::WriteRuns(int fd, const std::string& path, uint32_t page_size, const std::vector<PageRun>& runs,
                         const std::vector<const uint8_t*>& src) {
  struct Pending {
    uint32_t done = 0;
  };
  std::vector<Pending> st(runs.size());
  size_t next = 0;
  unsigned inflight = 0;
  Status status;
  auto run_error = [&](size_t i, int err) {
    if (status.ok())
      status = Status::FromErrno("write of pages " + std::to_string(runs[i].first) + ".." +
                                     std::to_string(runs[i].first + runs[i].count - 1),
                                 path, err);
  };
  auto submit = [&](size_t i) {
    const uint32_t total = runs[i].count * page_size;
    const uint64_t off = static_cast<uint64_t>(runs[i].first) * page_size + st[i].done;
    if (const int e = RF_FAULT(kPageWrite, path)) {
      run_error(i, e);  // as if the device had failed it: nothing submitted
      return;
    }
    fault::BeforeOverwrite(path, off, total - st[i].done);
    io_uring_sqe* sqe = io_uring_get_sqe(&ring_);
    io_uring_prep_write(sqe, fd, src[i] + st[i].done, total - st[i].done, off);
    io_uring_sqe_set_data64(sqe, i);
    inflight++;
  };
  while (next < runs.size() || inflight > 0) {
    while (status.ok() && next < runs.size() && inflight < depth_) submit(next++);
    if (inflight == 0) break;
    int rc = Submit(1, path);
    if (rc < 0 && rc != -EINTR) {
      if (status.ok()) status = Status::FromErrno("io_uring_submit", path, -rc);
      return Abandon(status, inflight);
    }
    io_uring_cqe* cqe;
    unsigned head, seen = 0;
    std::vector<size_t> again;
    io_uring_for_each_cqe(&ring_, head, cqe) {
      seen++;
      const size_t i = io_uring_cqe_get_data64(cqe);
      inflight--;
      if (cqe->res < 0) {
        if (cqe->res == -EAGAIN || cqe->res == -EINTR) {
          again.push_back(i);
        } else {
          run_error(i, -cqe->res);
        }
        continue;
      }
      st[i].done += static_cast<uint32_t>(cqe->res);
      if (st[i].done < runs[i].count * page_size) again.push_back(i);
    }
    io_uring_cq_advance(&ring_, seen);
    for (size_t i : again)
      if (status.ok()) submit(i);
    if (!status.ok()) next = runs.size();
  }
  return status;
}

IoRingPool* IoRingPool::Shared(unsigned depth, uint32_t slot_bytes) {
  static Mutex mu;
  static auto* pools = new std::map<std::pair<unsigned, uint32_t>, std::unique_ptr<IoRingPool>>();
  MutexLock l(&mu);
  auto& p = (*pools)[{depth, slot_bytes}];
  // A few idle rings per shape: enough for a process's concurrent scans to reuse theirs.
  if (!p) p = std::make_unique<IoRingPool>(depth, slot_bytes, 4);
  return p.get();
}

Status IoRingPool::Acquire(std::unique_ptr<IoRing>* out, bool reads) {
  {
    MutexLock l(&mu_);
    // Inherited through fork(): the kernel ring is the parent's. Leak it (its memory is this
    // process's copy) rather than unregister the parent's buffers.
    for (auto it = free_.begin(); it != free_.end();) {
      if ((*it)->owner_pid() != ::getpid()) {
        (void)it->release();
        it = free_.erase(it);
      } else {
        ++it;
      }
    }
    if (!free_.empty()) {
      auto pick = free_.end() - 1;  // the most recently released, unless one of the right kind idles
      for (auto it = free_.rbegin(); it != free_.rend(); ++it)
        if ((*it)->has_slots() == reads) {
          pick = std::next(it).base();
          break;
        }
      *out = std::move(*pick);
      free_.erase(pick);
      return Status::OK();
    }
  }
  return IoRing::Create(depth_, slot_bytes_, out);
}

void IoRingPool::Release(std::unique_ptr<IoRing> r) {
  if (!r || r->broken()) return;  // requests may still be outstanding: never lend it out again
  if (r->owner_pid() != ::getpid()) {
    (void)r.release();  // created before a fork (see Acquire)
    return;
  }
  r->set_poll_us(0);  // back to sleeping waits: a ring taken without a lease (a store's write ring) does not poll
  MutexLock l(&mu_);
  if (free_.size() < max_idle_) free_.push_back(std::move(r));
}

}  // namespace recflash
