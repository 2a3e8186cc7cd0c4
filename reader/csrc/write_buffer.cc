#include "reader/csrc/write_buffer.h"

#include <algorithm>
#include <numeric>

namespace recflash {

void FeatureBuffer::Append(const uint64_t* keys, size_t n, const uint8_t* values, const int64_t* offsets,
                           uint32_t width, bool tomb) {
  BufferedItems& b = items_;
  const bool was_sorted = normalized();
  const size_t start = b.keys.size();
  b.width = width;  // a feature's width never changes
  b.keys.insert(b.keys.end(), keys, keys + n);
  b.tomb.insert(b.tomb.end(), n, tomb ? 1 : 0);
  if (width) {
    if (tomb) {
      b.arena.insert(b.arena.end(), n * width, 0);
      bytes_ += n * ItemBytes(0);
    } else {
      b.arena.insert(b.arena.end(), values, values + n * width);
      bytes_ += n * ItemBytes(width);
    }
  } else {
    // reserve + push_back: resize would zero-fill both arrays before they are written.
    if (b.off.capacity() < start + n) b.off.reserve(std::max(start + n, 2 * b.off.capacity()));
    if (b.len.capacity() < start + n) b.len.reserve(std::max(start + n, 2 * b.len.capacity()));
    const uint64_t base = b.arena.size();
    if (tomb) {
      for (size_t i = 0; i < n; i++) {
        b.off.push_back(base);
        b.len.push_back(0);
      }
      bytes_ += n * ItemBytes(0);
    } else {
      b.arena.insert(b.arena.end(), values + offsets[0], values + offsets[n]);
      for (size_t i = 0; i < n; i++) {
        b.off.push_back(base + static_cast<uint64_t>(offsets[i] - offsets[0]));
        b.len.push_back(static_cast<uint32_t>(offsets[i + 1] - offsets[i]));
        bytes_ += ItemBytes(b.len.back());
      }
    }
  }
  // Keep the "already sorted" fast path for ascending appends (bulk loads). (No early exit:
  // the loop then vectorises, and an append is ascending or it is not.)
  if (was_sorted) {
    bool asc = start == 0 || n == 0 || b.keys[start] > b.keys[start - 1];
    for (size_t i = start + 1; i < b.keys.size(); i++) asc &= b.keys[i] > b.keys[i - 1];
    if (asc) sorted_ = b.keys.size();
  }
}

void FeatureBuffer::Normalize() {
  if (normalized()) return;
  BufferedItems& b = items_;
  const size_t n = b.keys.size();
  std::vector<uint32_t> idx(n);
  std::iota(idx.begin(), idx.end(), 0u);
  std::stable_sort(idx.begin(), idx.end(), [&](uint32_t x, uint32_t y) { return b.keys[x] < b.keys[y]; });
  BufferedItems out;
  out.width = b.width;
  out.keys.reserve(n);
  uint64_t bytes = 0;
  for (size_t i = 0; i < n; i++) {
    // Keep the last of a run of equal keys: stable sort preserved write order.
    if (i + 1 < n && b.keys[idx[i + 1]] == b.keys[idx[i]]) continue;
    const uint32_t j = idx[i];
    out.keys.push_back(b.keys[j]);
    out.tomb.push_back(b.tomb[j]);
    if (b.width) {
      out.arena.insert(out.arena.end(), b.value(j), b.value(j) + b.width);
    } else {
      out.off.push_back(out.arena.size());
      out.len.push_back(b.len[j]);
      out.arena.insert(out.arena.end(), b.value(j), b.value(j) + b.len[j]);
    }
    bytes += ItemBytes(b.length(j));
  }
  items_ = std::move(out);
  bytes_ = bytes;
  sorted_ = items_.keys.size();
}

void FeatureBuffer::Clear() {
  // Keep the capacity: the next flush cycle refills these vectors, and re-growing them from
  // nothing costs page faults and copies on every flush.
  items_.keys.clear();
  items_.tomb.clear();
  items_.off.clear();
  items_.len.clear();
  items_.arena.clear();
  sorted_ = 0;
  bytes_ = 0;
  pinned_flushes = 0;
}

size_t FeatureBuffer::CapacityBytes() const {
  return items_.keys.capacity() * 8 + items_.tomb.capacity() + items_.off.capacity() * 8 + items_.len.capacity() * 4 +
         items_.arena.capacity();
}

void FeatureBuffer::Release() {
  if (size()) return;
  items_ = BufferedItems();
  sorted_ = 0;
}

void WriteBuffer::TrimCapacity(size_t max_bytes) {
  size_t total = 0;
  std::vector<std::pair<size_t, FeatureBuffer*>> empty;
  for (auto& [fid, fb] : features_) {
    const size_t c = fb.CapacityBytes();
    total += c;
    if (fb.size() == 0 && c) empty.emplace_back(c, &fb);
  }
  if (total <= max_bytes) return;
  std::sort(empty.begin(), empty.end(), [](const auto& a, const auto& b) { return a.first > b.first; });
  for (auto& [c, fb] : empty) {
    if (total <= max_bytes) break;
    fb->Release();
    total -= c;
  }
}

void FeatureBuffer::CopyRange(uint64_t lo, uint64_t hi, BufferedItems* out) {
  Normalize();
  const auto& k = items_.keys;
  const size_t a = std::lower_bound(k.begin(), k.end(), lo) - k.begin();
  const size_t z = hi == UINT64_MAX ? k.size() : std::lower_bound(k.begin(), k.end(), hi) - k.begin();
  out->width = items_.width;
  out->keys.assign(k.begin() + a, k.begin() + z);
  out->tomb.assign(items_.tomb.begin() + a, items_.tomb.begin() + z);
  out->off.clear();
  out->len.clear();
  out->arena.clear();
  if (items_.width) {
    out->arena.assign(items_.value(a), items_.value(a) + (z - a) * items_.width);
    return;
  }
  out->len.assign(items_.len.begin() + a, items_.len.begin() + z);
  for (size_t i = a; i < z; i++) {
    out->off.push_back(out->arena.size());
    out->arena.insert(out->arena.end(), items_.value(i), items_.value(i) + items_.len[i]);
  }
}

void FeatureBuffer::CopyKeys(uint64_t lo, uint64_t hi, std::vector<uint64_t>* keys, std::vector<uint8_t>* tomb) {
  Normalize();
  const auto& k = items_.keys;
  const size_t a = std::lower_bound(k.begin(), k.end(), lo) - k.begin();
  const size_t z = hi == UINT64_MAX ? k.size() : std::lower_bound(k.begin(), k.end(), hi) - k.begin();
  keys->assign(k.begin() + a, k.begin() + std::max(a, z));
  tomb->assign(items_.tomb.begin() + a, items_.tomb.begin() + std::max(a, z));
}

uint64_t WriteBuffer::bytes() const {
  uint64_t b = 0;
  for (const auto& [fid, f] : features_) b += f.bytes();
  return b;
}

uint64_t WriteBuffer::items() const {
  uint64_t n = 0;
  for (const auto& [fid, f] : features_) n += f.size();
  return n;
}

}  // namespace recflash
