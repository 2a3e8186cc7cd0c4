// KeyIndex: per feature, where the current version of each key lives (its page id).
//
// This is what makes validity exact: when a key is updated or deleted, the page holding the
// old version loses one valid item. It is derived state — rebuilt at open from the pages
// (highest page seq wins) — so it is never written to disk. A feature whose keys form one
// dense run [base, base + n) keeps no key array at all: 4 bytes per item instead of 12.
#pragma once
#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

namespace recflash {

class KeyIndex {
 public:
  static constexpr uint32_t kTomb = 0x80000000u;  // location flag: a tombstone record
  static constexpr int64_t kAbsent = -1;

  size_t size() const { return locs_.size(); }
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
  // Removes the entries whose positions are listed (ascending).
  void Erase(const std::vector<size_t>& positions);
  // Checkpoint form (clean shutdown): appended to / parsed from a byte string.
  void Serialize(std::string* out) const;
  bool Deserialize(const char** p, const char* end);
  // Advances *p past one serialized index without decoding it (false if truncated).
  static bool Skip(const char** p, const char* end);
  size_t MemoryBytes() const { return keys_.capacity() * 8 + locs_.capacity() * 4 + lens_.capacity() * 4; }
  bool dense() const { return dense_; }

 private:
  void Materialize();
  bool dense_ = true;  // keys are base_ + i
  uint64_t base_ = 0;
  std::vector<uint64_t> keys_;
  std::vector<uint32_t> locs_;
  bool track_lens_ = false;
  std::vector<uint32_t> lens_;
};

}  // namespace recflash
