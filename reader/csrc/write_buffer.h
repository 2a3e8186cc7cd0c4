// WriteBuffer: the DRAM buffer of acknowledged puts/deletes not yet in pages, one
// FeatureBuffer per feature so a flush writes "all KV-items of a feature in a batch".
#pragma once
#include <cstdint>
#include <map>
#include <vector>

#include "reader/csrc/types.h"

namespace recflash {

// Items of one feature, sorted by key and unique (the latest write of each key wins).
struct BufferedItems {
  std::vector<uint64_t> keys;
  std::vector<uint8_t> tomb;
  // width > 0 (what a FeatureBuffer of a fixed-width feature holds): item i's value is
  // arena[i * width, +width) — a tombstone's slot zeroed — and off/len stay empty: a bulk
  // load appends tens of millions of items per second, and two per-item vectors describing
  // what the width already says were a third of the append's work and memory.
  // width == 0: item i's value is arena[off[i], +len[i]).
  uint32_t width = 0;
  std::vector<uint64_t> off;  // into arena (width == 0)
  std::vector<uint32_t> len;  // (width == 0)
  std::vector<uint8_t> arena;
  size_t size() const { return keys.size(); }
  const uint8_t* value(size_t i) const { return arena.data() + (width ? i * width : off[i]); }
  uint32_t length(size_t i) const { return width ? (tomb[i] ? 0 : width) : len[i]; }
};

class FeatureBuffer {
 public:
  // Appends n items; `values` holds n * width bytes (width > 0) or the bytes delimited by
  // byte offsets[0..n] (width == 0). Deletes pass tomb = true and no values.
  void Append(const uint64_t* keys, size_t n, const uint8_t* values, const int64_t* offsets, uint32_t width,
              bool tomb);
  // Sorts by key keeping the last write of each key, and compacts the arena.
  void Normalize();
  bool normalized() const { return sorted_ == items_.keys.size(); }
  const BufferedItems& items() const { return items_; }  // valid after Normalize()
  size_t size() const { return items_.keys.size(); }
  uint64_t bytes() const { return bytes_; }
  void Clear();
  // Bytes the vectors hold allocated (capacity), and giving them back (empty buffers only).
  size_t CapacityBytes() const;
  void Release();
  // Copies the entries with lo <= key < hi (normalized first).
  void CopyRange(uint64_t lo, uint64_t hi, BufferedItems* out);
  // The same entries' keys and tombstone flags only (Store::ScanKeys: no value is copied).
  void CopyKeys(uint64_t lo, uint64_t hi, std::vector<uint64_t>* keys, std::vector<uint8_t>* tomb);

  uint32_t pinned_flushes = 0;  // consecutive flushes this feature stayed pinned

 private:
  BufferedItems items_;
  size_t sorted_ = 0;  // prefix [0, sorted_) is sorted and unique
  uint64_t bytes_ = 0;
};

class WriteBuffer {
 public:
  FeatureBuffer& feature(uint32_t fid) { return features_[fid]; }
  FeatureBuffer* find(uint32_t fid) {
    auto it = features_.find(fid);
    return it == features_.end() ? nullptr : &it->second;
  }
  const FeatureBuffer* find(uint32_t fid) const {
    auto it = features_.find(fid);
    return it == features_.end() ? nullptr : &it->second;
  }
  std::map<uint32_t, FeatureBuffer>& all() { return features_; }
  uint64_t bytes() const;
  uint64_t items() const;
  void Erase(uint32_t fid) { features_.erase(fid); }
  // Empty feature buffers keep their capacity for the next flush cycle; this releases the
  // largest of them until all buffers together hold at most max_bytes. Without it a bulk load
  // (each feature's items in one batch) would leave tens of bytes per loaded item allocated.
  void TrimCapacity(size_t max_bytes);

 private:
  std::map<uint32_t, FeatureBuffer> features_;
};

}  // namespace recflash
