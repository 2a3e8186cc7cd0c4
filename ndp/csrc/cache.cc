#include "ndp/csrc/cache.h"

namespace recflash::ndp {

void RowCache::Touch(Entry& e) {
  if (e.protected_segment) {
    protected_.splice(protected_.begin(), protected_, e.lru);
    return;
  }
  protected_.splice(protected_.begin(), probation_, e.lru);
  e.protected_segment = true;
  protected_bytes_ += Cost(e);
  // The protected segment's least recent rows go back to probation's front (not out).
  const size_t cap = static_cast<size_t>(kProtectedFrac * static_cast<double>(budget_));
  while (protected_bytes_ > cap && protected_.size() > 1) {
    Entry& old = map_.find(protected_.back())->second;
    probation_.splice(probation_.begin(), protected_, old.lru);
    old.protected_segment = false;
    protected_bytes_ -= Cost(old);
  }
}

bool RowCache::Get(uint64_t key, float* out, uint32_t dim) {
  auto it = map_.find(key);
  if (it == map_.end()) {
    counters.misses++;
    return false;
  }
  Touch(it->second);
  std::memcpy(out, it->second.row.data(), dim * sizeof(float));
  counters.hits++;
  return true;
}

void RowCache::Put(uint64_t key, const float* row, uint32_t dim) {
  const size_t cost = dim * sizeof(float) + kOverhead;
  if (!budget_ || cost > budget_) return;
  auto it = map_.find(key);
  if (it != map_.end()) {
    std::memcpy(it->second.row.data(), row, dim * sizeof(float));
    Touch(it->second);
    return;
  }
  while (used_ + cost > budget_ && !map_.empty()) {
    std::list<uint64_t>& from = probation_.empty() ? protected_ : probation_;
    auto victim = map_.find(from.back());
    used_ -= Cost(victim->second);
    if (victim->second.protected_segment) protected_bytes_ -= Cost(victim->second);
    from.pop_back();
    map_.erase(victim);
    counters.evictions++;
  }
  probation_.push_front(key);
  map_.emplace(key, Entry{probation_.begin(), false, std::vector<float>(row, row + dim)});
  used_ += cost;
  counters.inserts++;
}

void RowCache::Erase(uint64_t key) {
  auto it = map_.find(key);
  if (it == map_.end()) return;
  used_ -= Cost(it->second);
  if (it->second.protected_segment) {
    protected_bytes_ -= Cost(it->second);
    protected_.erase(it->second.lru);
  } else {
    probation_.erase(it->second.lru);
  }
  map_.erase(it);
  counters.invalidations++;
}

BagKey PooledCache::Key(uint32_t fid, bool mean, const int64_t* ids, uint32_t len) {
  BagKey k{fid, len, mean, 0, 0};
  for (uint32_t i = 0; i < len; i++) {
    const uint64_t x = static_cast<uint64_t>(ids[i]);
    k.h1 += Mix64(x);
    k.h2 += Mix64(x ^ 0x5851f42d4c957f2dull);
  }
  return k;
}

bool PooledCache::Get(const BagKey& k, float* out, uint32_t dim) {
  auto it = map_.find(k);
  if (it == map_.end()) {
    counters.misses++;
    return false;
  }
  lru_.splice(lru_.begin(), lru_, it->second.lru);
  std::memcpy(out, it->second.pooled.data(), dim * sizeof(float));
  counters.hits++;
  return true;
}

void PooledCache::Put(const BagKey& k, const float* pooled, uint32_t dim) {
  const size_t cost = dim * sizeof(float) + 96;
  if (!budget_ || cost > budget_ || map_.count(k)) return;
  while (used_ + cost > budget_ && !lru_.empty()) {
    auto victim = map_.find(lru_.back());
    used_ -= victim->second.pooled.size() * sizeof(float) + 96;
    map_.erase(victim);
    lru_.pop_back();
    counters.evictions++;
  }
  lru_.push_front(k);
  map_.emplace(k, Entry{lru_.begin(), std::vector<float>(pooled, pooled + dim)});
  used_ += cost;
  counters.inserts++;
}

void PooledCache::ClearTable(uint32_t fid) {
  for (auto it = lru_.begin(); it != lru_.end();) {
    if (it->fid == fid) {
      auto m = map_.find(*it);
      used_ -= m->second.pooled.size() * sizeof(float) + 96;
      map_.erase(m);
      it = lru_.erase(it);
      counters.invalidations++;
    } else {
      ++it;
    }
  }
}

DirectMappedCache::DirectMappedCache(size_t budget_bytes, uint32_t dim) : dim_(dim) {
  slots_ = budget_bytes / (8 + dim * sizeof(float));
  tags_.assign(slots_, 0);
  data_.assign(slots_ * dim, 0.0f);
}

bool DirectMappedCache::Get(uint64_t key, float* out) {
  const size_t s = Slot(key);
  if (tags_[s] != key + 1) {
    counters.misses++;
    return false;
  }
  std::memcpy(out, data_.data() + s * dim_, dim_ * sizeof(float));
  counters.hits++;
  return true;
}

void DirectMappedCache::Put(uint64_t key, const float* row) {
  const size_t s = Slot(key);
  if (tags_[s] && tags_[s] != key + 1) counters.evictions++;
  tags_[s] = key + 1;
  std::memcpy(data_.data() + s * dim_, row, dim_ * sizeof(float));
  counters.inserts++;
}

void DirectMappedCache::Erase(uint64_t key) {
  const size_t s = Slot(key);
  if (tags_[s] == key + 1) {
    tags_[s] = 0;
    counters.invalidations++;
  }
}

}  // namespace recflash::ndp
