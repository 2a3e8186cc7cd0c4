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
#include <cstddef>
#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "reader/csrc/column.h"

namespace recflash {

class KeyIndex {
 public:
  static constexpr uint32_t kTomb = 0x80000000u;  // location flag: a tombstone record
  static constexpr int64_t kAbsent = -1;

  size_t size() const { return locs_.size(); }  // 0 while deferred

  bool deferred() const { return deferred_; }
  // Starts deferring: only for an index that holds nothing yet.
  void Defer() {
    if (locs_.empty()) deferred_ = true;
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
    if (locs_.empty()) return false;
    *k = key(locs_.size() - 1);
    return true;
  }
  int64_t Find(uint64_t key) const;
  // Find for ascending probes: resumes from *hint.
  int64_t FindFrom(uint64_t key, size_t* hint) const;
  uint64_t key(size_t i) const { return dense_ ? base_ + i : keys_[i]; }
  uint32_t loc(size_t i) const { return locs_[i]; }
  void set_loc(size_t i, uint32_t v) { locs_[i] = v; }
  // Value length of the current version; only tracked for variable-width features.
  void track_lengths(bool on) { track_lens_ = on; }
  uint32_t len(size_t i) const { return track_lens_ ? lens_[i] : 0; }
  void set_len(size_t i, uint32_t v) {
    if (track_lens_) lens_[i] = v;
  }
  // Inserts keys that are not present yet (ascending, unique).
  void InsertNew(const std::vector<uint64_t>& keys, const std::vector<uint32_t>& locs,
                 const std::vector<uint32_t>& lens);
  // Copies the entries with lo <= key < hi (hi == UINT64_MAX: no upper bound), keys
  // ascending: a reader's private snapshot of where each key's current version lives.
  // Into reused read buffers (HVec): a fresh vector per scan faulted in its memory page by
  // page, ~100 µs of a 40 k-key scan's time before its reads were even submitted.
  void CopyRange(uint64_t lo, uint64_t hi, HVec<uint64_t>* keys, HVec<uint32_t>* locs) const;
  // How many entries CopyRange(lo, hi) copies (two binary searches).
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
  size_t MemoryBytes() const { return keys_.capacity() * 8 + locs_.capacity() * 4 + lens_.capacity() * 4; }
  bool dense() const { return dense_; }

 private:
  // The positions [a, z) of the entries with lo <= key < hi.
  std::pair<size_t, size_t> Range(uint64_t lo, uint64_t hi) const;
  void Materialize();
  bool deferred_ = false;
  uint64_t deferred_items_ = 0;
  uint64_t deferred_max_ = 0;
  bool dense_ = true;  // keys are base_ + i
  uint64_t base_ = 0;
  std::vector<uint64_t> keys_;
  std::vector<uint32_t> locs_;
  bool track_lens_ = false;
  std::vector<uint32_t> lens_;
};

}  // namespace recflash
