// CHECKPOINT: the derived state (valid counts, live totals, key indexes) as of a writer's clean
// close, so that the next open need not read every page to rebuild it. It names the committed
// state it describes (next seq, live pages) and is used only when that is the state opened;
// a writer retires it before its first commit (CommitMetaLocked), so it never sits next to
// newer metadata.
#include "reader/csrc/store_impl.h"

#include "reader/csrc/crc32c.h"
#include "reader/csrc/fault_injection.h"
#include "reader/csrc/file_util.h"
#include "reader/csrc/store_internal.h"

#include <fcntl.h>
#include <unistd.h>

#include <cstring>
#include <vector>

namespace recflash {

using namespace store_internal;

// The checkpoint file's first word (its header: magic, next seq, live pages).
constexpr uint64_t kCheckpointMagic = 0x33544b4348434652ull;  // "RFCHCKT3": compact key index form

Status StoreImpl::TryKeyIndexFromCheckpoint() {
  if (checkpoint_index_tried_.load(std::memory_order_acquire)) return Status::OK();
  MutexLock wl(&write_mu_);
  if (!key_index_ready_ && !checkpoint_index_tried_.load(std::memory_order_relaxed)) SwapInCheckpointIndex();
  checkpoint_index_tried_.store(true, std::memory_order_release);
  return Status::OK();
}

bool StoreImpl::SwapInCheckpointIndex() {
  // The header names the state the checkpoint describes: without one of this snapshot the
  // derived state is not touched at all (a writer is open and retired it, or wrote since).
  uint64_t head[3];
  if (!ReadFilePrefix(StoreFileName(path_, FileKind::kCheckpoint), head, sizeof(head)) ||
      head[0] != kCheckpointMagic || head[1] != pstate_.next_seq || head[2] != pages_.live_pages())
    return false;
  // Scans read the feature states under mu_ and decode indexes under lazy_mu_: both are held
  // while the derived state is replaced, so no reader sees it half way.
  MutexLock zl(&lazy_mu_);
  MutexLock l(&mu_);
  versions_.AssertHeld();
  ResetDerivedLocked();
  if (!LoadCheckpoint()) {  // damaged or disagreeing: back to what the open derived
    ResetDerivedLocked();
    DeriveAllValid();
    return false;
  }
  versions_.InstallLocked(BuildVersion(versions_.current()->number + 1, features_, pages_));
  opened_from_checkpoint_ = true;
  key_index_ready_ = true;
  return true;
}

namespace {

// One feature's record in the checkpoint, parsed but not yet applied.
struct CheckpointFeature {
  uint32_t id;
  uint64_t items, bytes, tombs;
  const char* blob;
  size_t blob_len;
  KeyIndex::Summary sum;
};

using CheckpointSegs = std::vector<std::pair<uint32_t, std::vector<std::pair<uint32_t, uint64_t>>>>;

// True when the checkpoint's derived state is consistent with the page table: per feature,
// the index's entries and locations match the segments' valid counts and bytes, which sum to
// the feature's counters, and no segment claims more valid records than it holds. Linear in
// segments plus index runs: a clean reopen of a large store must stay cheap.
bool CheckpointAgrees(const std::vector<CheckpointFeature>& fs, const CheckpointSegs& segs,
                      const std::vector<uint32_t>& slot_of, FeatureTable* features, LogicalPageTable* pages) {
  struct SegRef {
    uint32_t slot, i;  // entry in segs, segment index in the page
  };
  std::vector<std::vector<SegRef>> of_feature;  // fid -> its live segments
  for (uint32_t slot = 0; slot < segs.size(); slot++) {
    const auto& [pid, v] = segs[slot];
    const PageMeta& pm = pages->at(pid);
    for (uint32_t i = 0; i < v.size(); i++) {
      const SegMeta& sm = pm.segs[i];
      const FeatureState* f = features->Get(sm.fid);
      if (!f) return false;
      if (sm.retired) {
        if (v[i].first != 0 || v[i].second != 0) return false;
        continue;
      }
      const uint32_t valid = v[i].first;
      const uint32_t w = f->def.fixed_width();
      const uint64_t most = w ? static_cast<uint64_t>(valid) * ItemBytes(w) : static_cast<uint64_t>(valid) * 8 + sm.length;
      if (valid > sm.count || v[i].second > most) return false;
      if (sm.fid >= of_feature.size()) of_feature.resize(sm.fid + 1);
      of_feature[sm.fid].push_back({slot, i});
    }
  }
  // Per-slot tallies of one feature's index entries; reset through its own segment list.
  std::vector<uint64_t> entries_at(segs.size(), 0), tombs_at(segs.size(), 0), bytes_at(segs.size(), 0);
  // Per slot, the feature (id + 1) whose live segment it holds while that feature is checked:
  // a run's page must hold one of the feature's live segments, and after uniform updates a
  // large feature's index has a run per few keys (looking the segment up in the page table for
  // each took most of a clean reopen's CPU).
  std::vector<uint32_t> owner(segs.size(), 0);
  static const std::vector<SegRef> kNone;
  for (const CheckpointFeature& f : fs) {
    const FeatureState* st = features->Get(f.id);
    const uint32_t w = st->def.fixed_width();
    const std::vector<SegRef>& mine = f.id < of_feature.size() ? of_feature[f.id] : kNone;
    for (const SegRef& r : mine) owner[r.slot] = f.id + 1;
    uint64_t valid_sum = 0, bytes_sum = 0;
    for (const SegRef& r : mine) {
      valid_sum += segs[r.slot].second[r.i].first;
      bytes_sum += segs[r.slot].second[r.i].second;
    }
    if (f.items > UINT64_MAX - f.tombs || valid_sum != f.items + f.tombs || bytes_sum != f.bytes) return false;
    if (f.sum.track_lens != st->def.variable()) return false;
    if (f.sum.mode == 2) {  // deferred: every record of every live segment is current, no tombstones
      // (a variable-width feature's bytes per segment are bounded above, not known exactly)
      if (f.tombs != 0 || f.sum.entries != f.items) return false;
      for (const SegRef& r : mine) {
        const SegMeta& sm = pages->at(segs[r.slot].first).segs[r.i];
        const auto& [valid, bytes] = segs[r.slot].second[r.i];
        if (sm.tombs != 0 || valid != sm.count || (w && bytes != static_cast<uint64_t>(sm.count) * ItemBytes(w)))
          return false;
      }
      continue;
    }
    if (f.sum.entries != f.items + f.tombs) return false;
    uint64_t at = 0;
    bool ok = true;
    for (uint64_t r = 0; r < f.sum.nruns && ok; r++) {
      uint32_t run[2];
      std::memcpy(run, f.sum.runs + 2 * r, sizeof(run));
      const uint32_t loc = run[0], count = run[1];
      const uint32_t pid = loc & ~KeyIndex::kTomb;
      if (count > f.sum.entries - at || pid >= slot_of.size() || slot_of[pid] == UINT32_MAX ||
          owner[slot_of[pid]] != f.id + 1) {
        ok = false;
        break;
      }
      const uint32_t slot = slot_of[pid];
      entries_at[slot] += count;
      if (loc & KeyIndex::kTomb) {
        tombs_at[slot] += count;
      } else if (w) {
        bytes_at[slot] += static_cast<uint64_t>(count) * ItemBytes(w);
      } else {
        for (uint64_t k = at; k < at + count; k++) {
          uint32_t len;
          std::memcpy(&len, f.sum.lens + 4 * k, 4);
          bytes_at[slot] += ItemBytes(len);
        }
      }
      at += count;
    }
    ok = ok && at == f.sum.entries;
    // Every run landed on one of this feature's segments (seg(f.id) above), so comparing and
    // resetting through its own list covers every tally touched.
    uint64_t tombs = 0;
    for (const SegRef& r : mine) {
      const auto& [valid, bytes] = segs[r.slot].second[r.i];
      if (entries_at[r.slot] != valid || bytes_at[r.slot] != bytes) ok = false;
      tombs += tombs_at[r.slot];
      entries_at[r.slot] = tombs_at[r.slot] = bytes_at[r.slot] = 0;
    }
    if (!ok || tombs != f.tombs) return false;
  }
  return true;
}
}

Status StoreImpl::RetireCheckpointLocked() {
  checkpoint_current_ = false;
  const std::string ckpt = StoreFileName(path_, FileKind::kCheckpoint);
  if (::unlink(ckpt.c_str()) != 0) return errno == ENOENT ? Status::OK() : Status::FromErrno("unlink", ckpt, errno);
  return SyncDir(path_);
}

Status StoreImpl::CommitMetaLocked(rocksdb::WriteBatch* b) {
  // The deletion durable before the commit: a crash in between finds no checkpoint (a
  // rebuild), never one of an older state next to newer metadata. (The open would refuse
  // that one too, by its seq and the page table, but not rely on it.)
  if (checkpoint_current_) RF_RETURN_IF_ERROR(RetireCheckpointLocked());
  return meta_.Commit(b);
}

Status StoreImpl::WriteCheckpoint() {
  // Streamed a feature at a time (a large key index is not copied whole), crc32c over all.
  const std::string tmp = StoreFileName(path_, FileKind::kCheckpointTemp);
  if (const int e = RF_FAULT(kCheckpointWrite, tmp)) return Status::FromErrno("write", tmp, e);
  FILE* f = std::fopen(tmp.c_str(), "wb");
  if (!f) return Status::FromErrno("open", tmp, errno);
  uint32_t crc = 0;
  bool ok = true;
  std::string out;
  auto emit = [&]() {
    crc = crc32c::Extend(crc, out.data(), out.size());
    ok = ok && std::fwrite(out.data(), 1, out.size(), f) == out.size();
    out.clear();
  };
  Append(&out, kCheckpointMagic);
  Append(&out, pstate_.next_seq);
  Append(&out, static_cast<uint64_t>(pages_.live_pages()));
  auto feats = features_.All();
  Append(&out, static_cast<uint32_t>(feats.size()));
  for (FeatureState* fs : feats) {
    Append(&out, fs->def.id);
    Append(&out, fs->live_items);
    Append(&out, fs->live_bytes);
    Append(&out, fs->tombs);
    if (fs->index_lazy)
      out += fs->index_blob;  // never decoded this session: unchanged
    else
      fs->index.Serialize(&out);
    emit();
  }
  for (uint32_t p = 0; p < pages_.slots(); p++) {
    const PageMeta& pm = pages_.at(p);
    if (!pm.live) continue;
    Append(&out, p);
    for (const auto& sm : pm.segs) {
      Append(&out, sm.valid);
      Append(&out, sm.valid_bytes);
    }
    if (out.size() > (1u << 20)) emit();
  }
  emit();
  Append(&out, crc);
  ok = ok && std::fwrite(out.data(), 1, out.size(), f) == out.size() && std::fflush(f) == 0 && ::fsync(fileno(f)) == 0;
  std::fclose(f);
  if (!ok) return Status::IOError("cannot write checkpoint '" + tmp + "'");
  RF_KILL_POINT("checkpoint.before_rename");
  if (::rename(tmp.c_str(), StoreFileName(path_, FileKind::kCheckpoint).c_str()) != 0) return Status::FromErrno("rename", tmp, errno);
  RF_RETURN_IF_ERROR(SyncDir(path_));
  checkpoints_written_++;
  checkpoint_current_ = true;
  return Status::OK();
}

namespace {

// A fixed-width feature whose live segments each hold a gapless key range (count = max - min
// + 1), pairwise disjoint, with no tombstones and only valid records, has one current record
// per key, and the page table names every key: its index is the deferred one (see KeyIndex),
// which RebuildFromPages also gives it after a crash. Kept deferred here too: decoded at its
// first lookup, the checkpoint's index would cost 4 bytes per key (an embedding table
// rewritten once by a merge or compact(): 4 GB of DRAM per billion rows, only to name pages the
// page table already names). Lookups, scans and keys-only scans need no page read for it; the
// first write that is not an append builds the index from the page table
// (MaterializeIndexLocked). Features with gaps keep the checkpoint's index, which serves their
// keys-only scans without reading pages.
void DeferCurrentIndexes(const std::vector<CheckpointFeature>& fs, FeatureTable* features,
                         const LogicalPageTable& pages_) {
  const size_t nfid = features->All().empty() ? 0 : features->All().back()->def.id + 1;
  std::vector<uint8_t> ok(nfid, 1);
  std::vector<std::vector<std::pair<uint64_t, uint64_t>>> ranges(nfid);
  for (uint32_t p = 0; p < pages_.slots(); p++) {
    const PageMeta& pm = pages_.at(p);
    if (!pm.live) continue;
    for (const SegMeta& sm : pm.segs) {
      if (sm.retired || sm.fid >= nfid || !ok[sm.fid]) continue;
      if (sm.valid != sm.count || !sm.gapless()) {
        ok[sm.fid] = 0;
        continue;
      }
      ranges[sm.fid].emplace_back(sm.min_key, sm.max_key);
    }
  }
  for (const CheckpointFeature& f : fs) {
    FeatureState* st = features->Get(f.id);
    if (f.sum.mode == 2 || !ok[f.id] || f.tombs != 0 || st->def.fixed_width() == 0) continue;
    auto& r = ranges[f.id];
    if (!SortedDisjoint(&r)) continue;
    KeyIndex deferred;
    deferred.Defer();
    if (!r.empty()) deferred.AppendDeferred(f.items, r.back().second);
    st->index_blob.clear();
    deferred.Serialize(&st->index_blob);
    std::vector<std::pair<uint64_t, uint64_t>>().swap(r);
  }
}

}  // namespace

bool StoreImpl::LoadCheckpoint() {
  std::string data;
  if (!ReadWholeFile(StoreFileName(path_, FileKind::kCheckpoint), &data)) return false;
  if (data.size() < 4) return false;
  uint32_t crc;
  std::memcpy(&crc, data.data() + data.size() - 4, 4);
  if (crc32c::Value(data.data(), data.size() - 4) != crc) return false;
  const char* p = data.data();
  const char* end = data.data() + data.size() - 4;
  auto take = [&](auto* v) {
    if (end - p < static_cast<ptrdiff_t>(sizeof(*v))) return false;
    std::memcpy(v, p, sizeof(*v));
    p += sizeof(*v);
    return true;
  };
  uint64_t magic, seq, live;
  uint32_t nf;
  if (!take(&magic) || magic != kCheckpointMagic || !take(&seq) || seq != pstate_.next_seq || !take(&live) ||
      live != pages_.live_pages() || !take(&nf))
    return false;
  // Parse into scratch state first: a mismatch anywhere leaves the tables untouched.
  using F = CheckpointFeature;
  if (nf > static_cast<size_t>(end - p) / 28) return false;  // each feature takes >= 28 bytes
  if (nf != features_.All().size()) return false;            // every feature, once
  std::vector<F> fs(nf);
  std::vector<uint8_t> seen_feature;
  for (auto& f : fs) {
    if (!take(&f.id) || !take(&f.items) || !take(&f.bytes) || !take(&f.tombs) || !features_.Get(f.id)) return false;
    if (f.id >= seen_feature.size()) seen_feature.resize(f.id + 1, 0);
    if (seen_feature[f.id]++) return false;
    f.blob = p;
    if (!KeyIndex::Skip(&p, end, &f.sum)) return false;  // decoded on first use (LoadIndex)
    f.blob_len = static_cast<size_t>(p - f.blob);
  }
  std::vector<std::pair<uint32_t, std::vector<std::pair<uint32_t, uint64_t>>>> segs;
  std::vector<uint32_t> slot_of(pages_.slots(), UINT32_MAX);  // page -> its entry in segs
  for (uint64_t i = 0; i < live; i++) {
    uint32_t pid;
    if (!take(&pid) || pid >= pages_.slots() || !pages_.at(pid).live || slot_of[pid] != UINT32_MAX) return false;
    slot_of[pid] = static_cast<uint32_t>(segs.size());
    std::vector<std::pair<uint32_t, uint64_t>> v(pages_.at(pid).segs.size());
    for (auto& [valid, bytes] : v)
      if (!take(&valid) || !take(&bytes)) return false;
    segs.emplace_back(pid, std::move(v));
  }
  if (p != end) return false;
  // The crc says the bytes are the ones written; these checks say the derived state agrees
  // with the page table (RocksDB), so a bad checkpoint is rebuilt from the pages instead of
  // steering reads: every count and location the index claims is cross-checked.
  if (!CheckpointAgrees(fs, segs, slot_of, &features_, &pages_)) return false;
  for (auto& f : fs) {
    FeatureState* st = features_.Get(f.id);
    st->live_items = f.items;
    st->live_bytes = f.bytes;
    st->tombs = f.tombs;
    st->index = KeyIndex();
    st->index.track_lengths(st->def.variable());
    st->index_blob.assign(f.blob, f.blob_len);
    st->index_lazy = true;
  }
  for (auto& [pid, v] : segs) {
    PageMeta& pm = pages_.at(pid);
    for (size_t i = 0; i < v.size(); i++) {
      pm.segs[i].valid = v[i].first;
      pm.segs[i].valid_bytes = v[i].second;
      const SegMeta& sm = pm.segs[i];
      if (sm.retired || sm.valid == 0) continue;
      FeatureState* st = features_.Get(sm.fid);
      st->pages.push_back(pid);
      st->index_ranges.push_back({pid, sm.min_key, sm.max_key});
    }
  }
  if (!o_.accounting) DeferCurrentIndexes(fs, &features_, pages_);  // accounting: no pages to materialize from
  return true;
}

}  // namespace recflash
