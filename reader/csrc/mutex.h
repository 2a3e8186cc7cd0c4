// Mutex, MutexLock, SharedMutex and CondVar: the standard library's locks with Clang
// thread-safety annotations (LevelDB's port::Mutex / MutexLock idea). libstdc++'s std::mutex
// carries no capability attributes, so RF_GUARDED_BY(a std::mutex) cannot be checked; these
// wrappers make every RF_GUARDED_BY / RF_REQUIRES in the engine a compile-time check under
// `make tsa-check` (clang++ -Wthread-safety -Werror). Under GCC they are the plain locks.
#pragma once
#include <condition_variable>
#include <mutex>
#include <shared_mutex>

#include "reader/csrc/thread_annotations.h"

namespace recflash {

class CondVar;

class RF_CAPABILITY("mutex") Mutex {
 public:
  Mutex() = default;
  Mutex(const Mutex&) = delete;
  Mutex& operator=(const Mutex&) = delete;

  void Lock() RF_ACQUIRE() { mu_.lock(); }
  void Unlock() RF_RELEASE() { mu_.unlock(); }
  // Tells the analysis the caller holds the lock where it cannot see it (no runtime check).
  void AssertHeld() const RF_ASSERT_CAPABILITY(this) {}

 private:
  friend class CondVar;
  std::mutex mu_;
};

// Holds a Mutex for its scope; Unlock()/Lock() release and retake it inside the scope (the
// destructor releases only when held), as std::unique_lock does.
class RF_SCOPED_CAPABILITY MutexLock {
 public:
  explicit MutexLock(Mutex* mu) RF_ACQUIRE(mu) : mu_(mu) { mu_->Lock(); }
  ~MutexLock() RF_RELEASE() {
    if (held_) mu_->Unlock();
  }
  MutexLock(const MutexLock&) = delete;
  MutexLock& operator=(const MutexLock&) = delete;

  void Unlock() RF_RELEASE() {
    mu_->Unlock();
    held_ = false;
  }
  void Lock() RF_ACQUIRE() {
    mu_->Lock();
    held_ = true;
  }

 private:
  Mutex* const mu_;
  bool held_ = true;
};

// A condition variable waited on with a Mutex held (the caller's MutexLock stays the owner).
class CondVar {
 public:
  // Atomically releases `mu`, waits for a signal (or a spurious wake-up) and retakes it.
  void Wait(Mutex* mu) RF_REQUIRES(mu) {
    std::unique_lock<std::mutex> l(mu->mu_, std::adopt_lock);
    cv_.wait(l);
    l.release();  // the caller's lock object still owns the mutex
  }
  void Signal() { cv_.notify_one(); }
  void SignalAll() { cv_.notify_all(); }

 private:
  std::condition_variable cv_;
};

// A reader-writer lock: exclusive for writers, shared for readers.
class RF_CAPABILITY("shared_mutex") SharedMutex {
 public:
  SharedMutex() = default;
  SharedMutex(const SharedMutex&) = delete;
  SharedMutex& operator=(const SharedMutex&) = delete;

  void Lock() RF_ACQUIRE() { mu_.lock(); }
  void Unlock() RF_RELEASE() { mu_.unlock(); }
  void LockShared() RF_ACQUIRE_SHARED() { mu_.lock_shared(); }
  void UnlockShared() RF_RELEASE_SHARED() { mu_.unlock_shared(); }

 private:
  std::shared_mutex mu_;
};

class RF_SCOPED_CAPABILITY WriterLock {
 public:
  explicit WriterLock(SharedMutex* mu) RF_ACQUIRE(mu) : mu_(mu) { mu_->Lock(); }
  ~WriterLock() RF_RELEASE() { mu_->Unlock(); }
  WriterLock(const WriterLock&) = delete;
  WriterLock& operator=(const WriterLock&) = delete;

 private:
  SharedMutex* const mu_;
};

class RF_SCOPED_CAPABILITY ReaderLock {
 public:
  explicit ReaderLock(SharedMutex* mu) RF_ACQUIRE_SHARED(mu) : mu_(mu) { mu_->LockShared(); }
  ~ReaderLock() RF_RELEASE() { mu_->UnlockShared(); }
  ReaderLock(const ReaderLock&) = delete;
  ReaderLock& operator=(const ReaderLock&) = delete;

 private:
  SharedMutex* const mu_;
};

}  // namespace recflash
