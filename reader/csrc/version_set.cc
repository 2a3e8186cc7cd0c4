#include "reader/csrc/version_set.h"

#include <algorithm>

namespace recflash {

const std::vector<PageRef>& Version::refs(uint32_t fid) const {
  static const std::vector<PageRef> kNone;
  return fid < features.size() && features[fid] ? *features[fid] : kNone;
}

uint32_t Version::DeferredPage(uint32_t fid, uint64_t key) const {
  const std::vector<PageRef>& r = refs(fid);  // sorted by min_key, disjoint
  auto it = std::upper_bound(r.begin(), r.end(), key, [](uint64_t k, const PageRef& x) { return k < x.min_key; });
  if (it == r.begin()) return UINT32_MAX;
  --it;
  return key <= it->max_key ? it->page : UINT32_MAX;
}

std::shared_ptr<const Version> BuildVersion(uint64_t number, FeatureTable& features, const LogicalPageTable& pages) {
  auto v = std::make_shared<Version>();
  v->number = number;
  for (FeatureState* f : features.All()) {
    if (v->features.size() <= f->def.id) v->features.resize(f->def.id + 1);
    auto refs = std::make_shared<std::vector<PageRef>>();
    refs->reserve(f->pages.size());
    for (uint32_t p : f->pages) {
      const PageMeta& pm = pages.at(p);
      for (const auto& s : pm.segs)
        if (s.fid == f->def.id && !s.retired && s.valid > 0)
          refs->push_back({p, s.count, s.valid, s.tombs, pm.segs.size() == 1, pm.seq, s.min_key, s.max_key});
    }
    std::sort(refs->begin(), refs->end(), [](const PageRef& a, const PageRef& b) {
      return a.min_key < b.min_key || (a.min_key == b.min_key && a.page < b.page);
    });
    v->features[f->def.id] = std::move(refs);
  }
  return v;
}

std::shared_ptr<const Version> VersionSet::RegisterLocked() {
  readers_.insert(current_->number);
  return current_;
}

void VersionSet::InstallLocked(std::shared_ptr<const Version> v, const std::set<uint32_t>& freed) {
  for (uint32_t p : freed) pending_free_.emplace_back(v->number, p);
  current_ = std::move(v);
}

std::vector<uint32_t> VersionSet::TakeReleasable() {
  std::vector<uint32_t> release;
  {
    MutexLock l(mu_);
    const uint64_t oldest = readers_.empty() ? UINT64_MAX : *readers_.begin();
    auto it = std::partition(pending_free_.begin(), pending_free_.end(),
                             [&](const std::pair<uint64_t, uint32_t>& e) { return e.first > oldest; });
    for (auto j = it; j != pending_free_.end(); ++j) release.push_back(j->second);
    pending_free_.erase(it, pending_free_.end());
  }
  std::sort(release.begin(), release.end());
  return release;
}

void VersionSet::WaitForNoReadersLocked() {
  while (!readers_.empty()) readers_cv_.Wait(mu_);
}

void VersionSet::Unregister(uint64_t number) {
  MutexLock l(mu_);
  readers_.erase(readers_.find(number));
  readers_cv_.SignalAll();
}

}  // namespace recflash
