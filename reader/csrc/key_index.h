// KeyIndex: per feature, where the current version of each key lives (its page id).
//
// This is what makes validity exact: when a key is updated or deleted, the page holding the
// old version loses one valid item. It is derived state — rebuilt at open from the pages
// (highest page seq wins) — so it is never written to disk. A feature whose keys form one
// dense run [base, base + n) keeps no key array at all: 4 bytes per item instead of 12.
//
// Deferred index. A feature that has only ever been appended to — every write held keys
// above all of its stored keys, and no deletes — keeps no per-key state at all: its live
// segments hold pairwise disjoint key ranges, none holds a tombstone and every record in them
// is the current version. A key's page is then the one segment whose [min_key, max_key] holds
// it (from the page table), and a further append needs no lookup. Bulk loads stay deferred,
// so the index costs O(pages) instead of 4-12 bytes per item (an import of 300 M items used
// to hold 2.4 GB of key index). The store materializes the index (reads the feature's pages)
// before the first write that is not such an append: an update, a delete, a merge.
#pragma once
#include <atomic>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include "reader/csrc/column.h"

namespace recflash {

class KeyIndex {
 private:
  // The per-entry arrays, shared with the scans' snapshots (Snapshot) and copied by the
  // first change made while one is held.
  struct Entries {
    std::vector<uint64_t> keys;  // empty while dense (keys are base_ + i)
    std::vector<uint32_t> locs;
  };

 public:
  static constexpr uint32_t kTomb = 0x80000000u;  // location flag: a tombstone record
  static constexpr int64_t kAbsent = -1;

  // A scan's view of the entries with lo <= key < hi, keys ascending: where each key's
  // current version lived when it was taken. It shares the index's arrays instead of copying
  // them (the copy, 12 bytes per entry on the scan's own thread before its plan could start,
  // was a tenth of a fragmented feature's scan); a change to the index while a snapshot is
  // held copies the arrays first (copy-on-write), so a snapshot never changes under its
  // reader. Snapshots are taken, and the index changed, under the same lock; a snapshot may be
  // released anywhere. Of an index with a key array only (not dense, not deferred).
  class Snapshot {
   public:
    std::span<const uint64_t> keys() const { return keys_; }
    std::span<const uint32_t> locs() const { return locs_; }

   private:
    friend class KeyIndex;
    std::shared_ptr<const Entries> hold_;
    std::span<const uint64_t> keys_;
    std::span<const uint32_t> locs_;
  };

  size_t size() const { return e_->locs.size(); }  // 0 while deferred

  bool deferred() const { return deferred_; }
  // Starts deferring: only for an index that holds nothing yet.
  void Defer() {
    if (e_->locs.empty()) deferred_ = true;
  }
  // Deferred: records an append of n items whose largest key is max_key.
  void AppendDeferred(uint64_t n, uint64_t max_key) {
    deferred_items_ += n;
    deferred_max_ = max_key;
  }
  uint64_t deferred_items() const { return deferred_items_; }
  // Ends deferring; the caller then inserts every stored key (InsertNew).
  void Undefer() {
    deferred_ = false;
    deferred_items_ = 0;
    deferred_max_ = 0;
  }
  // Largest stored key (tombstones included), in either mode; false when there is none.
  bool LastKey(uint64_t* k) const {
    if (deferred_) {
      *k = deferred_max_;
      return deferred_items_ > 0;
    }
    if (e_->locs.empty()) return false;
    *k = key(e_->locs.size() - 1);
    return true;
  }
  int64_t Find(uint64_t key) const;
  // Find for ascending probes: resumes from *hint.
  int64_t FindFrom(uint64_t key, size_t* hint) const;
  uint64_t key(size_t i) const { return dense_ ? base_ + i : e_->keys[i]; }
  uint32_t loc(size_t i) const { return e_->locs[i]; }
  void set_loc(size_t i, uint32_t v) { Own().locs[i] = v; }
  // Value length of the current version; only tracked for variable-width features.
  void track_lengths(bool on) { track_lens_ = on; }
  uint32_t len(size_t i) const { return track_lens_ ? lens_[i] : 0; }
  void set_len(size_t i, uint32_t v) {
    if (track_lens_) lens_[i] = v;
  }
  // Inserts keys that are not present yet (ascending, unique).
  void InsertNew(const std::vector<uint64_t>& keys, const std::vector<uint32_t>& locs,
                 const std::vector<uint32_t>& lens);
  // The entries with lo <= key < hi (hi == UINT64_MAX: no upper bound), shared (see Snapshot).
  Snapshot Share(uint64_t lo, uint64_t hi) const;
  // How many entries Share(lo, hi) holds (two binary searches).
  size_t CountRange(uint64_t lo, uint64_t hi) const;
  // Appends the keys with lo <= key < hi (hi == UINT64_MAX: no upper bound) whose current
  // version is not a tombstone, ascending: the live keys the pages hold, with no page read
  // (Store::ScanKeys). Not for a deferred index, which holds no keys.
  void AppendLiveKeys(uint64_t lo, uint64_t hi, HVec<uint64_t>* out) const;
  // Removes the entries whose positions are listed (ascending).
  void Erase(const std::vector<size_t>& positions);
  // Checkpoint form (clean shutdown): appended to / parsed from a byte string.
  void Serialize(std::string* out) const;
  // Whether a Serialize output holds a dense run (read without decoding it).
  static bool SerializedDense(const std::string& blob) { return !blob.empty() && blob[0] == 1; }
  // Whether a Serialize output holds dense keys (a dense run, or deferred: one).
  static bool SerializedDenseKeys(const std::string& blob) { return !blob.empty() && (blob[0] == 1 || blob[0] == 2); }
  bool Deserialize(const char** p, const char* end);
  // What a serialized index claims, read without decoding its keys: enough for the
  // checkpoint loader to check it against the page table before trusting it.
  struct Summary {
    uint8_t mode = 0;          // 0 key runs, 1 dense run, 2 deferred, 3 raw keys
    bool track_lens = false;
    uint64_t entries = 0;      // index entries (tombstones included); deferred: items
    const uint32_t* runs = nullptr;  // (location, count) pairs, unaligned: read with memcpy
    uint64_t nruns = 0;
    const char* lens = nullptr;      // entries u32 lengths when tracked, unaligned
  };
  // Advances *p past one serialized index without decoding it (false if truncated).
  static bool Skip(const char** p, const char* end, Summary* summary = nullptr);
  size_t MemoryBytes() const { return e_->keys.capacity() * 8 + e_->locs.capacity() * 4 + lens_.capacity() * 4; }
  bool dense() const { return dense_; }

 private:
  // The positions [a, z) of the entries with lo <= key < hi.
  std::pair<size_t, size_t> Range(uint64_t lo, uint64_t hi) const;
  void Materialize();
  // The arrays, to be changed: copied first when a snapshot (or a copy of this index) shares them.
  Entries& Own() {
    if (e_.use_count() > 1) e_ = std::make_shared<Entries>(*e_);
    // A snapshot released on another thread (its count's decrement, a release) happens
    // before the change that follows.
    std::atomic_thread_fence(std::memory_order_acquire);
    return *e_;
  }
  bool deferred_ = false;
  uint64_t deferred_items_ = 0;
  uint64_t deferred_max_ = 0;
  bool dense_ = true;  // keys are base_ + i
  uint64_t base_ = 0;
  std::shared_ptr<Entries> e_ = std::make_shared<Entries>();
  bool track_lens_ = false;
  std::vector<uint32_t> lens_;
};

}  // namespace recflash
