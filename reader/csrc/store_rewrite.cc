#include "reader/csrc/store_impl.h"

#include "reader/csrc/crc32c.h"
#include "reader/csrc/store_internal.h"

#include <fcntl.h>
#include <sys/file.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/uio.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <numeric>
#include <sstream>
#include <thread>
#include <unordered_map>

namespace recflash {

namespace fs = std::filesystem;
using namespace store_internal;

// ---------------------------------------------------------------------------------------
// Merger and reclamation

Status StoreImpl::Compact(const std::vector<std::string>& names) {
  RF_RETURN_IF_ERROR(CheckWritable());
  std::vector<FeatureDef> defs;
  for (const auto& n : names) {
    FeatureDef d;
    RF_RETURN_IF_ERROR(FeatureFor(n, &d));
    defs.push_back(d);
  }
  MutexLock wl(&write_mu_);
  RF_RETURN_IF_ERROR(FlushLocked(true));
  if (names.empty())
    for (FeatureState* f : features_.All()) defs.push_back(f->def);
  for (const FeatureDef& d : defs) {
    FeatureState* f = features_.Get(d.id);
    if (f->pages.size() < 2 && (f->pages.empty() || pages_.at(f->pages[0]).seg(d.id)->valid ==
                                                         pages_.at(f->pages[0]).seg(d.id)->count))
      continue;  // already packed
    std::vector<MoveTask> tasks;
    for (uint32_t p : f->pages) tasks.push_back({p, d.id});
    merger_.stats().victims++;
    merger_.stats().pages_gathered += tasks.size();
    Status s = RewriteLocked(tasks, true);
    if (!s.ok()) return bg_error_ = s;  // DRAM tables may be ahead of the metadata, as in a flush
  }
  return Status::OK();
}

Status StoreImpl::MaintainLocked() {
  std::vector<FeatureState*> touched;
  for (FeatureState* f : features_.All())
    if (f->touched) {
      touched.push_back(f);
      f->touched = false;
    }
  std::vector<MoveTask> tasks = merger_.Plan(touched, pages_, o_.page_size);
  if (!tasks.empty()) RF_RETURN_IF_ERROR(RewriteLocked(tasks, true));
  tasks = reclaimer_.Plan(pages_, o_.page_size);
  if (!tasks.empty()) RF_RETURN_IF_ERROR(RewriteLocked(tasks, false));
  return Status::OK();
}

// About 150 lines on purpose: its phases (collect the valid records from pages or, in
// accounting mode, from the key index; drop covered tombstones; write; commit; install) all
// work on one set of moved records, their value arena and the map of source pages, and the
// crash ordering (pages durable -> metadata commit -> install -> release) reads top to bottom.
Status StoreImpl::RewriteLocked(const std::vector<MoveTask>& tasks, bool merge) {
  const uint32_t ps = o_.page_size;
  std::map<uint32_t, std::vector<uint32_t>> want;  // page -> features to move out of it
  for (const auto& t : tasks) want[t.page].push_back(t.fid);
  std::vector<uint32_t> pids;
  for (const auto& [p, f] : want) pids.push_back(p);
  // Moving records needs each key's current location: load checkpointed indexes and
  // materialize deferred ones first.
  for (const auto& [pid, wf] : want) {
    const bool all = std::find(wf.begin(), wf.end(), MoveTask::kAllFeatures) != wf.end();
    for (const auto& sm : pages_.at(pid).segs) {
      FeatureState* f = features_.Get(sm.fid);
      RF_RETURN_IF_ERROR(LoadIndex(f));
      if (sm.retired || (!all && std::find(wf.begin(), wf.end(), sm.fid) == wf.end())) continue;
      RF_RETURN_IF_ERROR(MaterializeIndexLocked(f));
    }
  }

  struct Moved {
    uint32_t fid;
    uint64_t key;
    bool tomb;
    uint64_t off;
    uint32_t len;
    int64_t pos;
  };
  std::vector<Moved> moved;
  std::vector<uint8_t> arena;
  std::map<uint32_t, std::set<uint32_t>> src_pages;  // fid -> pages its records leave
  std::vector<uint64_t> keys;
  auto cb = [&](uint32_t pid, const PageView& pv) RF_REQUIRES(write_mu_) -> Status {
    const auto& wf = want[pid];
    const bool all = std::find(wf.begin(), wf.end(), MoveTask::kAllFeatures) != wf.end();
    for (uint32_t si = 0; si < pv.nseg(); si++) {
      SegmentView sv = pv.Segment(si);
      if (!all && std::find(wf.begin(), wf.end(), sv.feature_id) == wf.end()) continue;
      SegMeta* sm = pages_.at(pid).seg(sv.feature_id);
      if (!sm || sm->retired) continue;
      FeatureState* f = features_.Get(sv.feature_id);
      sv.width = f->def.fixed_width();
      RF_RETURN_IF_ERROR(CheckSegmentFits(sv, pid, pages_path_, f->def));
      keys.resize(sv.count);
      sv.DecodeKeys(keys.data());
      size_t hint = 0;
      for (uint32_t i = 0; i < sv.count; i++) {
        const int64_t pos = f->index.FindFrom(keys[i], &hint);
        if (pos == KeyIndex::kAbsent || (f->index.loc(pos) & ~KeyIndex::kTomb) != pid) continue;  // stale
        const uint8_t* v;
        uint32_t len;
        sv.Value(i, &v, &len);
        const bool tomb = (f->index.loc(pos) & KeyIndex::kTomb) != 0;
        if (tomb) len = 0;
        moved.push_back({sv.feature_id, keys[i], tomb, arena.size(), len, pos});
        arena.insert(arena.end(), v, v + len);
      }
      src_pages[sv.feature_id].insert(pid);
    }
    return Status::OK();
  };
  if (o_.accounting) {
    // No page contents: a record of F in page p is valid iff F's key index points at p.
    std::map<uint32_t, std::vector<uint8_t>> in_victim;  // fid -> page bitmap
    for (const auto& [pid, wf] : want) {
      const bool all = std::find(wf.begin(), wf.end(), MoveTask::kAllFeatures) != wf.end();
      for (const auto& sm : pages_.at(pid).segs) {
        if (sm.retired || (!all && std::find(wf.begin(), wf.end(), sm.fid) == wf.end())) continue;
        auto& bm = in_victim[sm.fid];
        bm.resize(pages_.slots(), 0);
        bm[pid] = 1;
        src_pages[sm.fid].insert(pid);
      }
    }
    uint32_t max_len = 0;
    for (auto& [fid, bm] : in_victim) {
      const FeatureState* f = features_.Get(fid);
      const KeyIndex& idx = f->index;
      const uint32_t w = f->def.fixed_width();
      for (size_t i = 0; i < idx.size(); i++) {
        const uint32_t loc = idx.loc(i);
        const uint32_t p = loc & ~KeyIndex::kTomb;
        if (p >= bm.size() || !bm[p]) continue;
        const bool tomb = (loc & KeyIndex::kTomb) != 0;
        const uint32_t len = tomb ? 0 : (w ? w : idx.len(i));
        max_len = std::max(max_len, len);
        moved.push_back({fid, idx.key(i), tomb, 0, len, static_cast<int64_t>(i)});
      }
    }
    arena.assign(std::max<uint32_t>(max_len, 1), 0);  // values do not matter, sizes do
  } else {
    RF_RETURN_IF_ERROR(ReadPages(write_ring_.get(), pids, cb));
  }
  pages_read_ += pids.size();
  bytes_read_ += pids.size() * static_cast<uint64_t>(ps);

  std::sort(moved.begin(), moved.end(),
            [](const Moved& a, const Moved& b) { return a.fid < b.fid || (a.fid == b.fid && a.key < b.key); });
  // A tombstone can go once no other live segment of its feature could still hold an older
  // version of the key (recovery would otherwise resurrect it).
  std::vector<Rec> recs;
  std::map<uint32_t, std::vector<size_t>> drop;  // fid -> index positions of dropped tombstones
  for (const Moved& m : moved) {
    if (m.tomb) {
      FeatureState* f = features_.Get(m.fid);
      const auto& src = src_pages[m.fid];
      bool covered = false;
      for (uint32_t p : f->pages) {
        if (src.count(p)) continue;
        const SegMeta* s = pages_.at(p).seg(m.fid);
        if (s && !s->retired && s->min_key <= m.key && m.key <= s->max_key) {
          covered = true;
          break;
        }
      }
      if (!covered) {
        drop[m.fid].push_back(static_cast<size_t>(m.pos));
        continue;
      }
    }
    recs.push_back({m.fid, m.key, m.tomb, arena.data() + m.off, m.len, m.pos});
  }
  std::set<uint32_t> dirty, freed;
  uint64_t pw = 0;
  RF_RETURN_IF_ERROR(WriteRecordsLocked({}, recs, &dirty, &freed, &pw));
  MutexLock index_lock(&mu_);
  index_ahead_ = true;
  for (auto& [fid, positions] : drop) {
    FeatureState* f = features_.Get(fid);
    std::sort(positions.begin(), positions.end());
    for (size_t pos : positions) InvalidateLocked(f, pos, &dirty, &freed);
    f->index.Erase(positions);
  }
  index_lock.Unlock();
  RF_RETURN_IF_ERROR(CommitLocked(dirty, freed));
  {
    auto v = BuildVersion(versions_.current()->number + 1, features_, pages_);
    MutexLock l(&mu_);
    versions_.AssertHeld();
    versions_.InstallLocked(v, freed);
    index_ahead_ = false;
  }
  if (merge) {
    auto& st = merger_.stats();
    st.items_moved += recs.size();
    st.pages_written += pw;
    st.bytes_written += pw * ps;
    st.pages_released += freed.size();
  } else {
    auto& st = reclaimer_.stats();
    st.items_moved += recs.size();
    st.bytes_written += pw * ps;
    st.pages_released += freed.size();
  }
  ReleasePendingLocked();
  return Status::OK();
}

}  // namespace recflash
