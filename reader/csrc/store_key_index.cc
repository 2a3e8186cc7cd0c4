// The derived state of an open store: each segment's valid counts, each feature's live
// totals and key index. Taken from the checkpoint of a clean close when it matches the
// committed state (store_checkpoint.cc), else rebuilt by reading the pages (RebuildFromPages);
// a checkpointed key index stays encoded until a read or a write needs it (LoadIndex).
#include "reader/csrc/store_impl.h"

#include "reader/csrc/fault_injection.h"
#include "reader/csrc/page_map.h"
#include "reader/csrc/store_internal.h"

#include <algorithm>
#include <set>
#include <vector>

namespace recflash {

using namespace store_internal;

void StoreImpl::DeriveAllValid() {
  for (uint32_t p = 0; p < pages_.slots(); p++) {
    PageMeta& pm = pages_.at(p);
    if (!pm.live) continue;
    for (auto& sm : pm.segs) {
      if (sm.retired) continue;
      FeatureState* f = features_.Get(sm.fid);
      const uint32_t w = f->def.fixed_width();
      const uint32_t items = sm.count - sm.tombs;
      sm.valid = sm.count;
      sm.valid_bytes = w ? static_cast<uint64_t>(items) * ItemBytes(w) : static_cast<uint64_t>(items) * 8 + sm.length;
      f->pages.push_back(p);
      f->live_items += items;
      f->live_bytes += sm.valid_bytes;
      f->tombs += sm.tombs;
    }
  }
}

void StoreImpl::ResetDerivedLocked() {
  for (FeatureState* f : features_.All()) {
    f->index = KeyIndex();
    f->index.track_lengths(f->def.variable());
    f->index_lazy = false;
    f->index_blob.clear();
    f->index_ranges.clear();
    f->pages.clear();
    f->live_items = f->live_bytes = f->tombs = 0;
  }
  for (uint32_t p = 0; p < pages_.slots(); p++)
    for (auto& sm : pages_.at(p).segs) {
      sm.valid = 0;
      sm.valid_bytes = 0;
    }
}

Status StoreImpl::EnsureKeyIndex() {
  MutexLock wl(&write_mu_);
  if (key_index_ready_) return Status::OK();
  // The checkpoint describes the state at a writer's clean close; it is used only when its
  // seq and page count match this snapshot, else the pages are read.
  if (SwapInCheckpointIndex()) return Status::OK();
  {
    MutexLock l(&mu_);
    ResetDerivedLocked();
  }
  Status s = RebuildFromPages();
  if (!s.ok()) return ExplainReadFailure(s);
  auto v = BuildVersion(versions_.current()->number + 1, features_, pages_);
  MutexLock l(&mu_);
  versions_.AssertHeld();
  versions_.InstallLocked(v);
  key_index_ready_ = true;
  return Status::OK();
}

FeatureState* StoreImpl::FeatureStateFor(uint32_t fid) {
  MutexLock l(&mu_);
  return const_cast<FeatureState*>(ReaderFeatures().Get(fid));  // LoadIndex fills it, under lazy_mu_
}

StoreImpl::PendingIndex StoreImpl::IndexPending(FeatureState* f, uint64_t* entries) {
  MutexLock l(&lazy_mu_);
  if (!f->index_lazy) return PendingIndex::kDecodeNow;
  if (KeyIndex::SerializedDense(f->index_blob)) return PendingIndex::kDense;
  const char* p = f->index_blob.data();
  KeyIndex::Summary sum;
  // Key runs or raw keys only; a deferred index, or a blob that does not parse, is left to
  // LoadIndex (cheap for the one, an error naming the feature and the file for the other).
  if (!KeyIndex::Skip(&p, p + f->index_blob.size(), &sum) || (sum.mode != 0 && sum.mode != 3))
    return PendingIndex::kDecodeNow;
  *entries = sum.entries;
  return PendingIndex::kKeys;
}

Status StoreImpl::LoadIndex(FeatureState* f) {
  MutexLock l(&lazy_mu_);
  if (!f->index_lazy) return Status::OK();
  const char* p = f->index_blob.data();
  const char* end = p + f->index_blob.size();
  KeyIndex idx;
  if (!idx.Deserialize(&p, end) || p != end)
    return Status::Corruption("checkpoint key index of feature '" + f->def.name + "' in '" + path_ +
                              "' does not decode");
  // Each key must fall in the key range of the segment its location names (LoadCheckpoint
  // checked the locations and counts; the keys are only decoded here).
  const std::vector<FeatureState::SegmentRange>& ranges = f->index_ranges;
  const PageMap range_of(ranges.size(), [&](size_t x) { return ranges[x].page; }, idx.size());
  // Consecutive keys of a fragmented feature mostly name different pages, so the check runs
  // without branches on the data: each entry's range bounds by table lookup (a page with no
  // segment gets bounds no key meets), the verdicts OR-ed; the first offender is looked for
  // only when one exists. A feature's first scan after an open pays for this decode.
  const size_t nr = ranges.size();
  std::vector<uint64_t> lo(nr + 1, UINT64_MAX), hi(nr + 1, 0);
  for (size_t x = 0; x < nr; x++) lo[x] = ranges[x].min_key, hi[x] = ranges[x].max_key;
  auto bounds_of = [&](uint32_t loc) {
    const int32_t x = range_of.Find(loc & ~KeyIndex::kTomb);
    return x < 0 ? nr : static_cast<size_t>(x);
  };
  uint64_t bad = 0;
  for (size_t i = 0; i < idx.size(); i++) {
    const size_t x = bounds_of(idx.loc(i));
    const uint64_t k = idx.key(i);
    bad |= static_cast<uint64_t>(k < lo[x]) | static_cast<uint64_t>(k > hi[x]);
  }
  if (bad) {
    for (size_t i = 0; i < idx.size(); i++) {
      const size_t x = bounds_of(idx.loc(i));
      const uint64_t k = idx.key(i);
      if (k < lo[x] || k > hi[x])
        return Status::Corruption("checkpoint key index of feature '" + f->def.name + "' in '" + path_ +
                                  "' places key " + std::to_string(k) + " in page " +
                                  std::to_string(idx.loc(i) & ~KeyIndex::kTomb) + ", whose segment does not cover it");
    }
  }
  {
    MutexLock ml(&mu_);  // get() reads indexes under mu_
    f->index = std::move(idx);
    f->index_lazy = false;
  }
  std::string().swap(f->index_blob);
  std::vector<FeatureState::SegmentRange>().swap(f->index_ranges);
  return Status::OK();
}

// About 150 lines on purpose: deciding which features stay deferred, reading the other
// features' pages, resolving the newest version per key and retiring emptied segments form one
// pass over the same per-feature record lists; recovery reads best as one sequence.
Status StoreImpl::RebuildFromPages() {
  struct R {
    uint64_t key;
    uint64_t seq;
    uint32_t pid;
    uint32_t len;
    bool tomb;
  };
  const size_t nfid = features_.All().empty() ? 0 : features_.All().back()->def.id + 1;
  std::vector<std::vector<R>> recs(nfid);
  std::vector<uint32_t> live;
  for (uint32_t p = 0; p < pages_.slots(); p++)
    if (pages_.at(p).live) live.push_back(p);
  const uint32_t ps = o_.page_size;

  // A fixed-width feature whose live segments hold pairwise disjoint key ranges and no
  // tombstones has exactly one version of each key, all valid: its state follows from the
  // page records alone and its index stays deferred (see KeyIndex). So reopening after a
  // crash in the middle of a bulk load reads no pages and builds no per-key index for it.
  std::vector<uint8_t> deferred(nfid, 0);
  std::vector<uint32_t> live_read;  // pages holding a segment of a feature that is not deferred
  if (!o_.accounting) {
    std::vector<std::vector<std::pair<uint64_t, uint64_t>>> ranges(nfid);
    std::vector<uint8_t> ok(nfid, 1);
    for (uint32_t pid : live)
      for (const auto& sm : pages_.at(pid).segs) {
        if (sm.retired) continue;
        if (sm.tombs) ok[sm.fid] = 0;
        ranges[sm.fid].emplace_back(sm.min_key, sm.max_key);
      }
    for (uint32_t fid = 0; fid < nfid; fid++) {
      FeatureState* f = features_.Get(fid);
      if (!f || !ok[fid] || f->def.fixed_width() == 0) continue;
      auto& r = ranges[fid];
      if (!SortedDisjoint(&r)) continue;
      deferred[fid] = 1;
      f->index.Defer();
      std::vector<std::pair<uint64_t, uint64_t>>().swap(r);
    }
    std::vector<uint32_t> to_read;
    std::vector<uint64_t> max_key(nfid, 0);
    for (uint32_t pid : live) {
      PageMeta& pm = pages_.at(pid);
      bool read = false;
      for (auto& sm : pm.segs) {
        if (sm.retired) continue;
        if (!deferred[sm.fid]) {
          read = true;
          continue;
        }
        FeatureState* f = features_.Get(sm.fid);
        const uint64_t b = static_cast<uint64_t>(sm.count) * ItemBytes(f->def.fixed_width());
        sm.valid = sm.count;
        sm.valid_bytes = b;
        f->live_items += sm.count;
        f->live_bytes += b;
        max_key[sm.fid] = std::max(max_key[sm.fid], sm.max_key);
        f->index.AppendDeferred(sm.count, max_key[sm.fid]);
      }
      if (read) to_read.push_back(pid);
    }
    live_read.swap(to_read);
  } else {
    live_read = live;
  }
  std::vector<uint64_t> keys;
  auto cb = [&](uint32_t pid, const PageView& pv) RF_REQUIRES(write_mu_) -> Status {
    PageMeta& pm = pages_.at(pid);
    if (pv.seq() != pm.seq)
      return Status::Corruption("page " + std::to_string(pid) + " of '" + pages_path_ + "' has seq " +
                                std::to_string(pv.seq()) + " but the metadata expects " + std::to_string(pm.seq));
    for (auto& sm : pm.segs) {
      if (sm.retired || deferred[sm.fid]) continue;
      SegmentView sv;
      if (!pv.Find(sm.fid, &sv) || sv.count != sm.count)
        return Status::Corruption("page " + std::to_string(pid) + " of '" + pages_path_ +
                                  "' does not hold the segment of feature id " + std::to_string(sm.fid) +
                                  " its metadata lists");
      const FeatureDef& def = features_.Get(sm.fid)->def;
      sv.width = def.fixed_width();
      RF_RETURN_IF_ERROR(CheckSegmentFits(sv, pid, pages_path_, def));
      keys.resize(sv.count);
      sv.DecodeKeys(keys.data());
      auto& out = recs[sm.fid];
      for (uint32_t i = 0; i < sv.count; i++) {
        const uint8_t* v;
        uint32_t len;
        sv.Value(i, &v, &len);
        out.push_back({keys[i], pv.seq(), pid, sv.is_tomb(i) ? 0u : len, sv.is_tomb(i)});
      }
    }
    return Status::OK();
  };
  if (!live_read.empty()) {
    RF_RETURN_IF_ERROR(ReadPages(write_ring_.get(), live_read, cb));
    pages_read_ += live_read.size();
    bytes_read_ += static_cast<uint64_t>(live_read.size()) * ps;
  }
  // Highest seq wins per key.
  for (uint32_t fid = 0; fid < recs.size(); fid++) {
    auto& v = recs[fid];
    if (v.empty()) continue;
    FeatureState* f = features_.Get(fid);
    std::sort(v.begin(), v.end(), [](const R& a, const R& b) { return a.key < b.key || (a.key == b.key && a.seq > b.seq); });
    std::vector<uint64_t> k;
    std::vector<uint32_t> l, n;
    for (size_t i = 0; i < v.size(); i++) {
      if (i > 0 && v[i].key == v[i - 1].key) continue;
      const R& r = v[i];
      k.push_back(r.key);
      l.push_back(r.pid | (r.tomb ? KeyIndex::kTomb : 0));
      n.push_back(r.len);
      SegMeta* sm = pages_.at(r.pid).seg(fid);
      sm->valid++;
      if (r.tomb) {
        f->tombs++;
      } else {
        sm->valid_bytes += ItemBytes(r.len);
        f->live_items++;
        f->live_bytes += ItemBytes(r.len);
      }
    }
    f->index.InsertNew(k, l, n);
    std::vector<R>().swap(v);
  }
  // Segments that lost every record to newer versions are retired; empty pages freed.
  std::set<uint32_t> dirty, freed;
  for (uint32_t pid : live) {
    PageMeta& pm = pages_.at(pid);
    for (auto& sm : pm.segs) {
      if (sm.retired) continue;
      if (sm.valid == 0) {
        sm.retired = true;
        dirty.insert(pid);
      } else {
        features_.Get(sm.fid)->pages.push_back(pid);
      }
    }
    if (pm.valid() == 0) {
      dirty.erase(pid);
      freed.insert(pid);
    }
  }
  if (!dirty.empty() || !freed.empty()) {
    RF_RETURN_IF_ERROR(CommitLocked(dirty, freed));
    for (uint32_t p : freed) pages_.AddFree(p);
  }
  return Status::OK();
}

}  // namespace recflash
