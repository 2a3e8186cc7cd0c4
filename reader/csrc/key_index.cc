#include "reader/csrc/key_index.h"

#include <algorithm>
#include <cstring>

#include "reader/csrc/varint.h"

namespace recflash {

int64_t KeyIndex::Find(uint64_t key) const {
  const std::vector<uint64_t>& ks = e_->keys;
  const std::vector<uint32_t>& ls = e_->locs;
  if (dense_) {
    if (key < base_ || key - base_ >= ls.size()) return kAbsent;
    return static_cast<int64_t>(key - base_);
  }
  auto it = std::lower_bound(ks.begin(), ks.end(), key);
  if (it == ks.end() || *it != key) return kAbsent;
  return it - ks.begin();
}

int64_t KeyIndex::FindFrom(uint64_t key, size_t* hint) const {
  const std::vector<uint64_t>& ks = e_->keys;
  const std::vector<uint32_t>& ls = e_->locs;
  if (dense_) return Find(key);
  size_t i = *hint;
  if (i > ks.size() || (i > 0 && ks[i - 1] >= key)) i = 0;
  // Gallop forward from the hint, then binary search the bracket.
  size_t step = 1, hi = i;
  while (hi < ks.size() && ks[hi] < key) {
    i = hi + 1;
    hi += step;
    step <<= 1;
  }
  hi = std::min(hi, ks.size());
  auto it = std::lower_bound(ks.begin() + i, ks.begin() + hi, key);
  *hint = it - ks.begin();
  if (it == ks.end() || *it != key) return kAbsent;
  return it - ks.begin();
}

std::pair<size_t, size_t> KeyIndex::Range(uint64_t lo, uint64_t hi) const {
  const std::vector<uint64_t>& ks = e_->keys;
  const std::vector<uint32_t>& ls = e_->locs;
  size_t a, z;
  if (dense_) {
    const uint64_t n = ls.size();
    a = lo <= base_ ? 0 : std::min<uint64_t>(lo - base_, n);
    z = hi == UINT64_MAX ? n : (hi <= base_ ? 0 : std::min<uint64_t>(hi - base_, n));
  } else {
    a = std::lower_bound(ks.begin(), ks.end(), lo) - ks.begin();
    z = hi == UINT64_MAX ? ks.size() : std::lower_bound(ks.begin(), ks.end(), hi) - ks.begin();
  }
  return {a, std::max(a, z)};
}

size_t KeyIndex::CountRange(uint64_t lo, uint64_t hi) const {
  const auto [a, z] = Range(lo, hi);
  return z - a;
}

KeyIndex::Snapshot KeyIndex::Share(uint64_t lo, uint64_t hi) const {
  const auto [a, z] = Range(lo, hi);
  Snapshot snap;
  if (dense_ || deferred_) return snap;  // (no key array to share: see Snapshot)
  snap.hold_ = e_;
  snap.keys_ = std::span<const uint64_t>(e_->keys).subspan(a, z - a);
  snap.locs_ = std::span<const uint32_t>(e_->locs).subspan(a, z - a);
  return snap;
}

void KeyIndex::AppendLiveKeys(uint64_t lo, uint64_t hi, HVec<uint64_t>* out) const {
  const std::vector<uint64_t>& ks = e_->keys;
  const std::vector<uint32_t>& ls = e_->locs;
  const auto [a, z] = Range(lo, hi);
  const size_t base = out->size();
  out->resize(base + (z - a));
  uint64_t* o = out->data() + base;
  size_t w = 0;
  // Branch-free: a tombstone's slot is written and then overwritten by the next live key.
  if (dense_) {
    for (size_t i = a; i < z; i++) {
      o[w] = base_ + i;
      w += (ls[i] & kTomb) == 0;
    }
  } else {
    for (size_t i = a; i < z; i++) {
      o[w] = ks[i];
      w += (ls[i] & kTomb) == 0;
    }
  }
  out->resize(base + w);
}

void KeyIndex::Materialize() {
  if (!dense_) return;
  Entries& own = Own();
  std::vector<uint64_t>& ks = own.keys;
  const std::vector<uint32_t>& ls = own.locs;
  ks.resize(ls.size());
  for (size_t i = 0; i < ls.size(); i++) ks[i] = base_ + i;
  dense_ = false;
}

void KeyIndex::InsertNew(const std::vector<uint64_t>& keys, const std::vector<uint32_t>& locs,
                         const std::vector<uint32_t>& lens) {
  if (keys.empty()) return;
  Entries& own = Own();
  std::vector<uint64_t>& ks = own.keys;
  std::vector<uint32_t>& ls = own.locs;
  if (dense_) {
    if (ls.empty()) base_ = keys.front();
    bool extends = keys.front() == base_ + ls.size();
    for (size_t i = 1; i < keys.size() && extends; i++) extends = keys[i] == keys[i - 1] + 1;
    if (extends) {
      ls.insert(ls.end(), locs.begin(), locs.end());
      if (track_lens_) lens_.insert(lens_.end(), lens.begin(), lens.end());
      return;
    }
    if (keys.back() + 1 == base_ && !ls.empty()) {
      bool run = true;
      for (size_t i = 1; i < keys.size() && run; i++) run = keys[i] == keys[i - 1] + 1;
      if (run) {
        ls.insert(ls.begin(), locs.begin(), locs.end());
        if (track_lens_) lens_.insert(lens_.begin(), lens.begin(), lens.end());
        base_ = keys.front();
        return;
      }
    }
    Materialize();
  }
  if (ks.empty() || keys.front() > ks.back()) {
    // Appending past the end (bulk loads, row-number keys with gaps): no merge.
    ks.insert(ks.end(), keys.begin(), keys.end());
    ls.insert(ls.end(), locs.begin(), locs.end());
    if (track_lens_) lens_.insert(lens_.end(), lens.begin(), lens.end());
    return;
  }
  std::vector<uint64_t> k;
  std::vector<uint32_t> l, n;
  k.reserve(ks.size() + keys.size());
  l.reserve(ks.size() + keys.size());
  if (track_lens_) n.reserve(ks.size() + keys.size());
  size_t a = 0, b = 0;
  while (a < ks.size() || b < keys.size()) {
    if (b == keys.size() || (a < ks.size() && ks[a] < keys[b])) {
      k.push_back(ks[a]);
      if (track_lens_) n.push_back(lens_[a]);
      l.push_back(ls[a++]);
    } else {
      k.push_back(keys[b]);
      if (track_lens_) n.push_back(lens[b]);
      l.push_back(locs[b++]);
    }
  }
  ks = std::move(k);
  ls = std::move(l);
  lens_ = std::move(n);
}

void KeyIndex::Erase(const std::vector<size_t>& positions) {
  if (positions.empty()) return;
  Entries& own = Own();
  std::vector<uint64_t>& ks = own.keys;
  std::vector<uint32_t>& ls = own.locs;
  // Erasing at either end of a dense run keeps it dense.
  if (dense_) {
    bool prefix = true, suffix = true;
    for (size_t i = 0; i < positions.size(); i++) {
      prefix = prefix && positions[i] == i;
      suffix = suffix && positions[i] == ls.size() - positions.size() + i;
    }
    if (prefix) {
      ls.erase(ls.begin(), ls.begin() + positions.size());
      if (track_lens_) lens_.erase(lens_.begin(), lens_.begin() + positions.size());
      base_ += positions.size();
      return;
    }
    if (suffix) {
      ls.resize(ls.size() - positions.size());
      if (track_lens_) lens_.resize(ls.size());
      return;
    }
    Materialize();
  }
  size_t w = 0, p = 0;
  for (size_t i = 0; i < ks.size(); i++) {
    if (p < positions.size() && positions[p] == i) {
      p++;
      continue;
    }
    ks[w] = ks[i];
    ls[w] = ls[i];
    if (track_lens_) lens_[w] = lens_[i];
    w++;
  }
  ks.resize(w);
  ls.resize(w);
  if (track_lens_) lens_.resize(w);
}

}  // namespace recflash

namespace recflash {

namespace {
template <typename T>
void Put(std::string* s, const T& v) {
  s->append(reinterpret_cast<const char*>(&v), sizeof v);
}
template <typename T>
bool Take(const char** p, const char* end, T* v) {
  if (end - *p < static_cast<ptrdiff_t>(sizeof(T))) return false;
  std::memcpy(v, *p, sizeof(T));
  *p += sizeof(T);
  return true;
}
template <typename T>
bool TakeVec(const char** p, const char* end, size_t n, std::vector<T>* v) {
  // Division, not n * sizeof(T): a damaged n must not overflow past the bound.
  if (n > static_cast<size_t>(end - *p) / sizeof(T)) return false;
  v->resize(n);
  if (n) std::memcpy(v->data(), *p, n * sizeof(T));  // (an empty vector's data() may be null)
  *p += n * sizeof(T);
  return true;
}
}  // namespace

// Checkpoint form, compact because the checkpoint lives next to the pages on disk:
//   u8 mode (0 keys, 1 dense run, 2 deferred, 3 raw keys) | u8 track_lens | u64 base
//   (deferred: max key) | u64 n (deferred: items, and nothing follows) | mode 0: u64 bytes,
//   keys as runs of consecutive ids (LEB128 gap and length per run: near-dense ids cost a
//   fraction of a byte each); mode 3: n u64 keys | u64 runs, locations as (loc, count) runs
//   (consecutive keys mostly live in the same page) | lengths raw (when tracked).
// Mode 3 is written for sparse keys, whose runs take 7 bytes or more per key anyway: a
// feature's first scan after an open decodes its index, and varints cost ~25 ns per key
// there (a 70 k-key feature: 1.8 ms), a copy almost nothing.
void KeyIndex::Serialize(std::string* out) const {
  const std::vector<uint64_t>& ks = e_->keys;
  const std::vector<uint32_t>& ls = e_->locs;
  if (deferred_) {
    Put<uint8_t>(out, 2);
    Put<uint8_t>(out, track_lens_ ? 1 : 0);
    Put<uint64_t>(out, deferred_max_);
    Put<uint64_t>(out, deferred_items_);
    return;
  }
  const size_t mode_at = out->size();
  Put<uint8_t>(out, dense_ ? 1 : 0);
  Put<uint8_t>(out, track_lens_ ? 1 : 0);
  Put<uint64_t>(out, base_);
  Put<uint64_t>(out, ls.size());
  if (!dense_) {
    std::string deltas;
    auto varint = [&](uint64_t d) {
      while (d >= 0x80) {
        deltas.push_back(static_cast<char>(d | 0x80));
        d >>= 7;
      }
      deltas.push_back(static_cast<char>(d));
    };
    uint64_t prev_end = 0;  // one past the previous run
    for (size_t i = 0; i < ks.size();) {
      size_t j = i + 1;
      while (j < ks.size() && ks[j] == ks[j - 1] + 1) j++;
      varint(ks[i] - prev_end);  // gap before the run
      varint(j - i);                // run length
      prev_end = ks[j - 1] + 1;
      i = j;
    }
    if (deltas.size() >= 7 * ks.size()) {
      (*out)[mode_at] = 3;
      out->append(reinterpret_cast<const char*>(ks.data()), ks.size() * 8);
    } else {
      Put<uint64_t>(out, deltas.size());
      out->append(deltas);
    }
  }
  std::vector<uint32_t> runs;  // (loc, count) pairs
  for (size_t i = 0; i < ls.size(); i++) {
    if (!runs.empty() && runs[runs.size() - 2] == ls[i] && runs.back() < UINT32_MAX) {
      runs.back()++;
    } else {
      runs.push_back(ls[i]);
      runs.push_back(1);
    }
  }
  Put<uint64_t>(out, runs.size() / 2);
  out->append(reinterpret_cast<const char*>(runs.data()), runs.size() * 4);
  if (track_lens_) out->append(reinterpret_cast<const char*>(lens_.data()), lens_.size() * 4);
}

bool KeyIndex::Skip(const char** p, const char* end, Summary* summary) {
  uint8_t dense, track;
  uint64_t base, n, nbytes = 0, nruns;
  if (!Take(p, end, &dense) || !Take(p, end, &track) || !Take(p, end, &base) || !Take(p, end, &n) || dense > 3)
    return false;
  if (summary) {
    *summary = Summary();
    summary->mode = dense;
    summary->track_lens = track != 0;
    summary->entries = n;
  }
  if (dense == 2) return true;  // deferred: the header is all
  auto skip = [&](uint64_t b) {
    if (static_cast<uint64_t>(end - *p) < b) return false;
    *p += b;
    return true;
  };
  if (dense == 0 && (!Take(p, end, &nbytes) || !skip(nbytes))) return false;
  if (dense == 3 && (n > (1ull << 40) || !skip(n * 8))) return false;
  if (!Take(p, end, &nruns) || nruns > (1ull << 40)) return false;
  const char* runs = *p;
  if (!skip(nruns * 8)) return false;
  const char* lens = *p;
  if (track && (n > (1ull << 40) || !skip(n * 4))) return false;
  if (summary) {
    summary->runs = reinterpret_cast<const uint32_t*>(runs);
    summary->nruns = nruns;
    summary->lens = track ? lens : nullptr;
  }
  return true;
}

bool KeyIndex::Deserialize(const char** p, const char* end) {
  e_ = std::make_shared<Entries>();  // (a snapshot keeps the arrays it shares)
  std::vector<uint64_t>& ks = e_->keys;
  std::vector<uint32_t>& ls = e_->locs;
  uint8_t dense, track;
  uint64_t n;
  if (!Take(p, end, &dense) || !Take(p, end, &track) || !Take(p, end, &base_) || !Take(p, end, &n) || dense > 3)
    return false;
  if (dense == 2) {
    deferred_ = true;
    deferred_max_ = base_;
    deferred_items_ = n;
    track_lens_ = track != 0;
    base_ = 0;
    dense_ = true;
    ks.clear();
    ls.clear();
    lens_.clear();
    return true;
  }
  deferred_ = false;
  dense_ = dense == 1;
  track_lens_ = track != 0;
  ks.clear();
  lens_.clear();
  if (dense == 3) {
    if (!TakeVec(p, end, n, &ks)) return false;
    uint64_t out_of_order = 0;  // keys must ascend strictly; one branch-free pass checks it
    for (size_t i = 1; i < ks.size(); i++) out_of_order |= ks[i] <= ks[i - 1];
    if (out_of_order) return false;
  }
  if (dense_ && n > 0 && n - 1 > UINT64_MAX - base_) return false;  // the dense run would wrap
  if (dense == 0) {
    uint64_t nbytes;
    if (!Take(p, end, &nbytes) || static_cast<uint64_t>(end - *p) < nbytes) return false;
    const uint8_t* q = reinterpret_cast<const uint8_t*>(*p);
    const uint8_t* qe = q + nbytes;
    ks.resize(n);
    uint64_t* const kp = ks.data();
    uint64_t at = 0, next = 0;
    bool wrapped = false;  // the last key was UINT64_MAX: nothing may follow
    while (at < n) {
      uint64_t gap, len;
      if (!ReadVarint(&q, qe, &gap) || !ReadVarint(&q, qe, &len) || len == 0 || len > n - at) return false;
      if (wrapped || gap > UINT64_MAX - next || len - 1 > UINT64_MAX - (next + gap)) return false;  // keys ascend
      next += gap;
      for (uint64_t r = 0; r < len; r++) kp[at++] = next++;
      wrapped = next == 0;
    }
    if (q != qe) return false;
    *p = reinterpret_cast<const char*>(qe);
  }
  // The (location, count) runs, decoded in place: a fragmented feature's entries mostly
  // name a page each, so a run is mostly one entry.
  uint64_t nruns;
  if (!Take(p, end, &nruns) || nruns > static_cast<uint64_t>(end - *p) / 8) return false;
  ls.resize(n);
  uint32_t* const lp = ls.data();
  uint64_t at = 0;
  for (uint64_t r = 0; r < nruns; r++, *p += 8) {
    uint32_t loc, cnt;
    std::memcpy(&loc, *p, 4);
    std::memcpy(&cnt, *p + 4, 4);
    if (cnt > n - at) return false;  // more locations than entries
    if (cnt == 1) {
      lp[at++] = loc;
    } else {
      std::fill_n(lp + at, cnt, loc);
      at += cnt;
    }
  }
  if (at != n) return false;
  if (track_lens_ && !TakeVec(p, end, n, &lens_)) return false;
  return true;
}

}  // namespace recflash
