#include "reader/csrc/scan_merge.h"

#include <smmintrin.h>

#include <algorithm>
#include <cstring>
#include <memory>
#include <type_traits>

#include "reader/csrc/key_index.h"
#include "reader/csrc/page_map.h"
#include "reader/csrc/run_merge.h"
#include "reader/csrc/types.h"
#include "reader/csrc/varint.h"

namespace recflash {

namespace {

// Whether keys spanning [kmin, kmax] with `total` records are dense enough for a slot per key
// (item ids) to pay: the rule of MergeDense and dense placement.
bool SlotsPay(uint64_t kmin, uint64_t kmax, uint64_t total) { return kmax - kmin < 2 * total + 4096; }

// A feature's refs by page id (a lookup per index entry).
PageMap RefOfPage(const std::vector<PageRef>& refs, size_t lookups) {
  return PageMap(refs.size(), [&](size_t j) { return refs[j].page; }, lookups);
}

}  // namespace

std::pair<size_t, size_t> DecodeKeysInRange(const SegmentView& sv, uint64_t lo, uint64_t hi, bool to_end,
                                             std::vector<uint64_t>* keys, std::vector<uint8_t>* tomb) {
  keys->resize(sv.count);  // decoded in place; trimmed to [lo, hi) when partial
  sv.DecodeKeys(keys->data());
  size_t a = sv.min_key < lo ? std::lower_bound(keys->begin(), keys->end(), lo) - keys->begin() : 0;
  const size_t z =
      !to_end && sv.max_key >= hi ? std::lower_bound(keys->begin(), keys->end(), hi) - keys->begin() : sv.count;
  a = std::min(a, z);
  if (z < sv.count) keys->resize(z);
  if (a > 0) keys->erase(keys->begin(), keys->begin() + a);
  tomb->clear();
  if (sv.tomb) {
    tomb->resize(z - a);
    for (size_t r = a; r < z; r++) (*tomb)[r - a] = sv.is_tomb(static_cast<uint32_t>(r));
  }
  return {a, z};
}

void DecodeChunk(const SegmentView& sv, uint64_t seq, uint64_t lo, uint64_t hi, bool to_end, bool all_valid,
                 PageChunk* c) {
  const auto [a, z] = DecodeKeysInRange(sv, lo, hi, to_end, &c->keys, &c->tomb);
  c->seq = seq;
  c->enc = sv.bytes_per_record();
  c->clean = all_valid && !sv.tomb;
  if (sv.width) {
    c->vals.assign(sv.values + a * sv.width, sv.values + z * sv.width);
  } else {
    for (size_t r = a; r < z; r++) {
      const uint8_t* p;
      uint32_t len;
      sv.Value(static_cast<uint32_t>(r), &p, &len);
      c->vals.insert(c->vals.end(), p, p + len);
      c->lens.push_back(len);
    }
  }
}

MergeSink::MergeSink(ColumnData* col_, uint32_t width, uint32_t elem_, const BufferedItems& buf_,
                     const std::vector<PageChunk>& chunks)
    : col(col_), w(width), elem(elem_), buf(buf_), cs(chunks) {
  if (!w) {
    voff.resize(cs.size());
    for (size_t c = 0; c < cs.size(); c++) {
      voff[c].resize(cs[c].lens.size() + 1, 0);
      for (size_t r = 0; r < cs[c].lens.size(); r++) voff[c][r + 1] = voff[c][r] + cs[c].lens[r];
    }
  }
  size_t total = 0, vbytes = 0;
  for (const PageChunk& c : cs) {
    total += c.keys.size();
    vbytes += c.vals.size();
  }
  col->keys.reserve(total + buf.size());
  col->values.reserve(vbytes + buf.arena.size());
  if (!w) col->offsets.push_back(0);
}

void MergeSink::Reset() {
  useful = 0;
  encoded = 0;
  col->keys.clear();
  col->values.clear();
  col->offsets.clear();
  if (!w) col->offsets.push_back(0);
  out_bytes = 0;
  k = 0;
}

void MergeSink::EmitBuffered(size_t e) {
  if (buf.tomb[e]) return;
  col->keys.push_back(buf.keys[e]);
  col->values.insert(col->values.end(), buf.value(e), buf.value(e) + buf.length(e));
  out_bytes += buf.length(e);
  if (!w) col->offsets.push_back(static_cast<int32_t>(out_bytes / elem));
}

void MergeSink::CopyRecords(uint32_t c, uint32_t r0, uint32_t r1) {
  const PageChunk& ch = cs[c];
  if (r0 >= r1) return;
  encoded += (r1 - r0) * ch.enc;
  if (ch.tomb.empty()) {
    col->keys.insert(col->keys.end(), ch.keys.begin() + r0, ch.keys.begin() + r1);
    if (w) {
      col->values.insert(col->values.end(), ch.vals.begin() + static_cast<size_t>(r0) * w,
                         ch.vals.begin() + static_cast<size_t>(r1) * w);
      out_bytes += static_cast<uint64_t>(r1 - r0) * w;
      useful += static_cast<uint64_t>(r1 - r0) * ItemBytes(w);
    } else {
      col->values.insert(col->values.end(), ch.vals.begin() + voff[c][r0], ch.vals.begin() + voff[c][r1]);
      for (uint32_t r = r0; r < r1; r++) {
        out_bytes += ch.lens[r];
        useful += ItemBytes(ch.lens[r]);
        col->offsets.push_back(static_cast<int32_t>(out_bytes / elem));
      }
    }
    return;
  }
  for (uint32_t r = r0; r < r1; r++) {
    if (ch.tomb[r]) continue;
    col->keys.push_back(ch.keys[r]);
    const uint32_t len = w ? w : ch.lens[r];
    const uint64_t off = w ? static_cast<uint64_t>(r) * w : voff[c][r];
    col->values.insert(col->values.end(), ch.vals.begin() + off, ch.vals.begin() + off + len);
    out_bytes += len;
    useful += ItemBytes(len);
    if (!w) col->offsets.push_back(static_cast<int32_t>(out_bytes / elem));
  }
}

void MergeSink::EmitRun(uint32_t c, uint32_t r0, uint32_t r1) {
  const PageChunk& ch = cs[c];
  EmitBufferedBelow(ch.keys[r0]);
  uint32_t r = r0;
  while (r < r1) {
    if (k < buf.size() && buf.keys[k] <= ch.keys[r1 - 1]) {
      const uint64_t bk = buf.keys[k];
      uint32_t rr = static_cast<uint32_t>(std::lower_bound(ch.keys.begin() + r, ch.keys.begin() + r1, bk) - ch.keys.begin());
      CopyRecords(c, r, rr);
      EmitBuffered(k++);
      if (rr < r1 && ch.keys[rr] == bk) rr++;  // overridden by the buffer
      r = rr;
    } else {
      CopyRecords(c, r, r1);
      r = r1;
    }
  }
}

std::vector<uint32_t> ChunkOrder(const std::vector<PageChunk>& cs) {
  std::vector<uint32_t> order;
  for (uint32_t c = 0; c < cs.size(); c++)
    if (!cs[c].keys.empty()) order.push_back(c);
  std::sort(order.begin(), order.end(), [&](uint32_t a, uint32_t c) {
    return cs[a].keys.front() < cs[c].keys.front() || (cs[a].keys.front() == cs[c].keys.front() && cs[a].seq > cs[c].seq);
  });
  return order;
}

bool MergeByIndex(std::span<const uint64_t> ik, std::span<const uint32_t> il, const std::vector<PageRef>& refs,
                  MergeSink* sink) {
  const std::vector<PageChunk>& cs = sink->cs;
  const BufferedItems& b = sink->buf;
  const PageMap chunk_of = RefOfPage(refs, ik.size());
  std::vector<uint32_t> cur(cs.size(), 0);
  const size_t nb = b.size();
  size_t& k = sink->k;
  sink->col->keys.reserve(ik.size() + nb);
  // Each key's record is the next record of its page's chunk at or after that chunk's cursor
  // (stale records are skipped on the way); buffered entries are newer than any page.
  for (size_t e = 0; e < ik.size(); e++) {
    const uint64_t key = ik[e];
    sink->EmitBufferedBelow(key);
    if (k < nb && b.keys[k] == key) {
      sink->EmitBuffered(k++);
      continue;
    }
    const uint32_t loc = il[e];
    if (loc & KeyIndex::kTomb) continue;
    const int32_t cj = chunk_of.Find(loc);
    if (cj < 0) return false;
    const uint32_t c = static_cast<uint32_t>(cj);
    const PageChunk& ch = cs[c];
    const uint32_t cn = static_cast<uint32_t>(ch.keys.size());
    uint32_t r = cur[c];
    while (r < cn && ch.keys[r] < key) r++;
    if (r == cn || ch.keys[r] != key || (!ch.tomb.empty() && ch.tomb[r])) return false;
    cur[c] = r + 1;
    sink->CopyRecords(c, r, r + 1);
  }
  sink->Finish();
  return true;
}

bool MergeDense(const std::vector<uint32_t>& order, MergeSink* sink) {
  const std::vector<PageChunk>& cs = sink->cs;
  uint64_t kmin = UINT64_MAX, kmax = 0;
  size_t total = 0;
  for (uint32_t c : order) {
    kmin = std::min(kmin, cs[c].keys.front());
    kmax = std::max(kmax, cs[c].keys.back());
    total += cs[c].keys.size();
  }
  if (!(order.size() > 1 && SlotsPay(kmin, kmax, total))) return false;
  // Windows of the key span bound the slot arrays' memory.
  constexpr uint64_t kWindow = 1u << 22;
  std::vector<uint32_t> by_seq(order);
  std::sort(by_seq.begin(), by_seq.end(), [&](uint32_t a, uint32_t c) { return cs[a].seq < cs[c].seq; });
  std::vector<uint32_t> wc(std::min<uint64_t>(kWindow, kmax - kmin + 1)), wr(wc.size());
  std::vector<uint32_t> cur(cs.size(), 0);
  const BufferedItems& b = sink->buf;
  size_t& k = sink->k;
  for (uint64_t wlo = kmin;; wlo += kWindow) {
    const uint64_t span = std::min<uint64_t>(kWindow, kmax - wlo + 1);
    std::fill(wc.begin(), wc.begin() + span, 0u);
    for (uint32_t c : by_seq) {
      const auto& ks = cs[c].keys;
      uint32_t r = cur[c];
      const uint32_t n = static_cast<uint32_t>(ks.size());
      for (; r < n && ks[r] - wlo < span; r++) {
        wc[ks[r] - wlo] = c + 1;
        wr[ks[r] - wlo] = r;
      }
      cur[c] = r;
    }
    for (uint64_t x = 0; x < span; x++) {
      if (!wc[x]) continue;
      const uint64_t key = wlo + x;
      sink->EmitBufferedBelow(key);
      if (k < b.size() && b.keys[k] == key) {
        sink->EmitBuffered(k++);  // the buffered write is newer
        continue;
      }
      const uint32_t c = wc[x] - 1, r = wr[x];
      if (!cs[c].tomb.empty() && cs[c].tomb[r]) continue;
      sink->CopyRecords(c, r, r + 1);
    }
    if (kmax - wlo < kWindow) break;
  }
  return true;
}

void MergeHeap(const std::vector<uint32_t>& order, MergeSink* sink) {
  const std::vector<PageChunk>& cs = sink->cs;
  MergeNewestFirst(
      order, cs.size(), [&](uint32_t c) { return cs[c].keys.size(); },
      [&](uint32_t c, uint64_t r) { return cs[c].keys[r]; }, [&](uint32_t c) { return cs[c].seq; },
      [&](uint32_t c, uint64_t r, uint64_t bound) {
        return std::lower_bound(cs[c].keys.begin() + r, cs[c].keys.end(), bound) - cs[c].keys.begin();
      },
      [&](uint32_t c, uint64_t r0, uint64_t r1) {
        sink->EmitRun(c, static_cast<uint32_t>(r0), static_cast<uint32_t>(r1));
      });
}

MergeKind MergeChunks(const IndexEntries* index, const std::vector<PageRef>& refs, MergeSink* sink) {
  MergeKind kind = MergeKind::kHeap;
  if (index) {
    if (MergeByIndex(index->keys, index->locs, refs, sink)) return MergeKind::kIndex;
    sink->Reset();
    kind = MergeKind::kIndexFallback;
  }
  const std::vector<uint32_t> order = ChunkOrder(sink->cs);
  if (MergeDense(order, sink)) {
    if (kind != MergeKind::kIndexFallback) kind = MergeKind::kDense;
  } else {
    MergeHeap(order, sink);
  }
  sink->Finish();
  return kind;
}

IndexPlanner::IndexPlanner(std::span<const uint64_t> ik, std::span<const uint32_t> il,
                           const std::vector<PageRef>& refs, const BufferedItems& b, uint32_t w, ColumnData* col,
                           IndexPlan* plan, unsigned parts)
    : ik_(ik),
      il_(il),
      refs_(refs),
      buf_(b),
      w_(w),
      col_(col),
      plan_(plan),
      ref_of_(RefOfPage(refs, ik.size())) {
  *plan = IndexPlan();
  const size_t n = ik.size();
  if (b.size() > 0 || parts == 0) parts = 1;
  for (unsigned p = 0; p <= parts; p++) bound_.push_back(n * p / parts);
  uint64_t valid = 0;
  bool tombs = false;
  for (const PageRef& r : refs) {
    valid += r.valid;
    tombs |= r.tombs != 0;
  }
  // The one-pass plan reserves room for every entry once per part, and each part fills about
  // its share of every ref's room: up to (parts - 1) more slots per entry become resident
  // (the untouched rest of a ref's room shares pages with its neighbours). Capped, so a scan of
  // a huge feature in one call makes the two-pass plan instead of holding that much more.
  // (Slot numbers are 32-bit: parts x entries must fit.)
  constexpr uint64_t kMaxExtraSlotBytes = 64u << 20;
  const uint64_t extra = static_cast<uint64_t>(n) * (parts - 1) * sizeof(IndexPlan::Slot);
  fused_ = b.size() == 0 && !tombs && n > 0 && valid == n && static_cast<uint64_t>(n) * parts < UINT32_MAX &&
           extra <= kMaxExtraSlotBytes;
  if (!fused_) {
    rid_.resize(n);
    cnt_.assign(parts, std::vector<uint32_t>(refs.size() + 1, 0));
    fill_.resize(parts);
    out_.assign(parts, 0);
    return;
  }
  // Ref j's group: room[j] = its valid records, once per part.
  const size_t nr = refs.size();
  plan->fused = true;
  plan->parts = parts;
  plan->room.resize(nr);
  plan->first.assign(nr + 1, 0);
  for (size_t j = 0; j < nr; j++) {
    plan->room[j] = refs[j].valid;
    plan->first[j + 1] = plan->first[j] + parts * refs[j].valid;
  }
  fill_.assign(parts, std::vector<uint32_t>(nr));
  lim_.assign(parts, std::vector<uint32_t>(nr));
  for (unsigned p = 0; p < parts; p++)
    for (size_t j = 0; j < nr; j++) {
      fill_[p][j] = plan->first[j] + p * plan->room[j];
      lim_[p][j] = fill_[p][j] + plan->room[j];
    }
  plan->slots.resize(plan->first.back());
  col->keys.resize(n);
  col->values.resize(n * static_cast<size_t>(w));
}

bool IndexPlanner::Fused(unsigned p, const std::function<void()>& yield) {
  const uint32_t* const ilp = il_.data();
  const uint64_t* const ikp = ik_.data();
  uint32_t* const fp = fill_[p].data();
  const uint32_t* const lp = lim_[p].data();
  IndexPlan::Slot* const slots = plan_->slots.data();
  const size_t a = bound_[p], z = bound_[p + 1];
  // In chunks of ~30 us, yielding between them: a large fragmented feature's share of the
  // plan took ~0.3 ms, during which its lane's first window of reads completed and the
  // device sat idle until the lane came back to issue more (~250 us per scan of the
  // compaction benchmark's default-store features of 128+ pages). With the lanes' rings
  // pumped from here those scans took 2.5-3.7 % less time, read alternating scan by scan.
  for (size_t c = a; c < z; c += kYieldEntries) {
    const size_t ce = std::min(z, c + kYieldEntries);
    for (size_t e = c; e < ce; e++) {
      const int32_t x = ref_of_.Find(ilp[e]);  // (a tombstone's location names no page)
      if (x < 0) [[unlikely]] return false;
      uint32_t& f = fp[x];
      if (f == lp[x]) [[unlikely]] return false;  // more entries than the ref's valid records
      slots[f++] = {ikp[e], e};
    }
    if (yield && ce < z) yield();
  }
  std::memcpy(col_->keys.data() + a, ikp + a, (z - a) * sizeof(uint64_t));
  return true;
}

bool IndexPlanner::FinishFused() {
  const size_t nr = refs_.size();
  const unsigned np = parts();
  for (size_t j = 0; j < nr; j++) {
    uint64_t got = 0;
    for (unsigned p = 0; p < np; p++) got += fill_[p][j] - (plan_->first[j] + p * plan_->room[j]);
    if (got != refs_[j].valid) return false;
  }
  plan_->fill = std::move(fill_[0]);
  plan_->part_fill.assign(fill_.begin() + 1, fill_.end());
  plan_->from_disk = ik_.size();
  return true;
}

bool IndexPlanner::PlanInOnePart() {
  const size_t n = ik_.size();
  fused_ = false;
  bound_ = {0, n};
  rid_.resize(n);
  cnt_.assign(1, std::vector<uint32_t>(refs_.size() + 1, 0));
  fill_.assign(1, {});
  lim_.clear();
  out_.assign(1, 0);
  *plan_ = IndexPlan();
  if (!Refs(0) || !Size()) return false;
  Slots(0);
  Finish();
  return true;
}

void IndexPlan::Gather(uint32_t j) {
  if (parts <= 1) return;
  uint32_t end = fill[j];
  for (unsigned p = 1; p < parts; p++) {
    const uint32_t base = first[j] + p * room[j];
    const uint32_t c = part_fill[p - 1][j] - base;
    if (c > 0 && base != end) std::memmove(&slots[end], &slots[base], c * sizeof(Slot));
    end += c;
    part_fill[p - 1][j] = base;  // moved: none left there
  }
  fill[j] = end;
}

bool IndexPlanner::Refs(unsigned p) {
  // Consecutive entries of a fragmented feature mostly name different pages, so this pass
  // has no branch on that: deciding per entry whether the page changed was a mispredicted
  // branch for half of them.
  const uint32_t nr = static_cast<uint32_t>(refs_.size());
  const uint32_t* const ilp = il_.data();
  uint32_t* const rp = rid_.data();
  uint32_t* const cnt = cnt_[p].data();
  for (size_t e = bound_[p]; e < bound_[p + 1]; e++) {
    const uint32_t loc = ilp[e];
    uint32_t r = nr;
    if (!(loc & KeyIndex::kTomb)) [[likely]] {
      const int32_t x = ref_of_.Find(loc);
      if (x < 0) [[unlikely]] return false;
      r = static_cast<uint32_t>(x);
    }
    rp[e] = r;
    cnt[r]++;
  }
  return true;
}

bool IndexPlanner::Size() {
  const size_t nr = refs_.size(), np = cnt_.size();
  // An index entry names a valid record of its segment, so a ref holds at most its valid
  // records unless index and pages disagree.
  plan_->first.assign(nr + 1, 0);
  for (size_t j = 0; j < nr; j++) {
    uint64_t c = 0;
    for (size_t p = 0; p < np; p++) c += cnt_[p][j];
    if (c > refs_[j].valid) return false;
    plan_->first[j + 1] = plan_->first[j] + static_cast<uint32_t>(c);
  }
  // Part p's slots of ref j follow those of the parts before it.
  for (size_t p = 0; p < np; p++) {
    fill_[p].resize(nr + 1);
    for (size_t j = 0; j < nr; j++) fill_[p][j] = p == 0 ? plan_->first[j] : fill_[p - 1][j] + cnt_[p - 1][j];
    fill_[p][nr] = 0;  // tombstones: counted, never stored
    if (p > 0) out_[p] = out_[p - 1] + (bound_[p] - bound_[p - 1]) - cnt_[p - 1][nr];
  }
  plan_->slots.resize(plan_->first.back());
  const size_t cap = ik_.size() + buf_.size();
  col_->keys.resize(cap);
  col_->values.resize(cap * static_cast<size_t>(w_));
  return true;
}

void IndexPlanner::Slots(unsigned p) {
  const size_t nb = buf_.size(), nr = refs_.size(), end = bound_[p + 1];
  uint64_t* const kp = col_->keys.data();
  uint8_t* const vp = col_->values.data();
  IndexPlan::Slot* const slots = plan_->slots.data();
  uint32_t* const fp = fill_[p].data();
  const uint32_t* const rp = rid_.data();
  const uint64_t* const ikp = ik_.data();
  uint64_t o = out_[p];
  size_t k = 0, e = bound_[p];
  while (k < nb || e < end) {
    // Entries below the next buffered key (all of them when nothing is buffered, the usual
    // case) take the tight loop.
    const size_t e_stop =
        k < nb ? static_cast<size_t>(std::lower_bound(ik_.begin() + e, ik_.begin() + end, buf_.keys[k]) - ik_.begin())
               : end;
    for (; e < e_stop; e++) {
      const uint32_t r = rp[e];
      if (r == nr) [[unlikely]] continue;  // a tombstone
      const uint64_t key = ikp[e];
      slots[fp[r]++] = {key, o};
      kp[o++] = key;
    }
    if (k == nb) break;  // e == end
    if (e < end && ik_[e] == buf_.keys[k]) e++;  // the buffered write is newer
    if (!buf_.tomb[k]) {
      kp[o] = buf_.keys[k];
      std::memcpy(vp + static_cast<size_t>(o) * w_, buf_.value(k), w_);
      o++;
    }
    k++;
  }
  if (p + 1 == cnt_.size()) o_ = o;
}

void IndexPlanner::Finish() {
  const size_t nr = refs_.size();
  std::vector<uint32_t>& last = fill_.back();  // where each ref's slots end
  last.pop_back();
  uint64_t from_disk = 0;
  for (size_t j = 0; j < nr; j++) from_disk += last[j] - plan_->first[j];
  col_->keys.resize(o_);
  col_->values.resize(o_ * w_);
  plan_->fill = std::move(last);
  plan_->from_disk = from_disk;
}

LanePlan::LanePlan(const IndexEntries* index, const std::vector<PageRef>& refs,
                   const BufferedItems& b, uint32_t w, ColumnData* col, IndexPlan* plan, unsigned lanes,
                   std::function<bool()> prepare)
    : lanes_(lanes),
      prepare_(std::move(prepare)),
      make_planner_([this, index, &refs, &b, w, col, plan, lanes] {
        planner_.emplace(index->keys, index->locs, refs, b, w, col, plan, lanes);
      }),
      shared_(lanes, 0) {}

void LanePlan::Share(unsigned l, const std::function<void()>& yield) {
  if (shared_[l]) return;
  shared_[l] = 1;
  if (l == 0) {
    const bool ok = !prepare_ || prepare_();
    if (ok) make_planner_();
    ready_ = ok ? 1 : 2;
    ready_.notify_all();
  } else {
    while (ready_.load() == 0) ready_.wait(0);
  }
  const bool ready = ready_.load() == 1;
  const unsigned parts = ready ? planner_->parts() : 0;
  if (ready && planner_->fused()) {  // one pass per part, no wait between passes
    if (l < parts && !planner_->Fused(l, yield)) refs_ok_ = false;
    if (shares_done_.fetch_add(1) + 1 == lanes_) {  // the last share: every part is done
      const bool ok = (refs_ok_.load() && planner_->FinishFused()) || planner_->PlanInOnePart();
      planned_ = ok ? 1 : 2;
      planned_.notify_all();
    }
    return;
  }
  if (l < parts) {
    if (!planner_->Refs(l)) refs_ok_ = false;
    refs_done_.fetch_add(1);
    refs_done_.notify_all();
  }
  if (l == 0) {
    for (unsigned d = refs_done_.load(); d < parts; d = refs_done_.load()) refs_done_.wait(d);
    sized_ = ready && refs_ok_.load() && planner_->Size() ? 1 : 2;
    sized_.notify_all();
  } else {
    while (sized_.load() == 0) sized_.wait(0);
  }
  const bool ok = sized_.load() == 1;
  if (ok && l < parts) planner_->Slots(l);
  if (shares_done_.fetch_add(1) + 1 == lanes_) {  // the last share: every part's slots are written
    if (ok) planner_->Finish();
    planned_ = ok ? 1 : 2;
    planned_.notify_all();
  }
}

bool LanePlan::Planned() {
  while (planned_.load() == 0) planned_.wait(0);
  return planned_.load() == 1;
}

bool PlanIndexPlacement(std::span<const uint64_t> ik, std::span<const uint32_t> il,
                        const std::vector<PageRef>& refs, const BufferedItems& b, uint32_t w, ColumnData* col,
                        IndexPlan* plan) {
  IndexPlanner pl(ik, il, refs, b, w, col, plan, 1);
  if (pl.fused()) return (pl.Fused(0) && pl.FinishFused()) || pl.PlanInOnePart();
  if (!pl.Refs(0) || !pl.Size()) return false;
  pl.Slots(0);
  pl.Finish();
  return true;
}

namespace {

template <uint32_t kW>
bool PlaceIndexedW(const SegmentView& sv, const IndexPlan::Slot* sa, size_t ma, const IndexPlan::Slot* sb, size_t mb,
                   ColumnData* col, std::vector<uint64_t>* scratch) {
  scratch->resize(sv.count + 4);
  uint64_t* pk = scratch->data();
  sv.DecodeKeys(pk);
  for (uint32_t i = 0; i < 4; i++) pk[sv.count + i] = UINT64_MAX;  // ends the skips below
  uint8_t* vp = col->values.data();
  const uint32_t w = kW ? kW : sv.width;
  const uint8_t* src = sv.values;
  const uint32_t cn = sv.count;
  if (ma + mb == cn && !sv.tomb) {
    // Every record of the segment is current (a page written by a merge, or one no update
    // has touched since): record r goes to the r-th slot (a's, then b's), after a check that
    // the keys agree.
    uint64_t diff = 0;
    for (uint32_t r = 0; r < ma; r++) {
      diff |= pk[r] ^ sa[r].key;
      std::memcpy(vp + sa[r].pos * w, src + static_cast<size_t>(r) * w, w);
    }
    pk += ma;
    src += ma * static_cast<size_t>(w);
    for (uint32_t r = 0; r < mb; r++) {
      diff |= pk[r] ^ sb[r].key;
      std::memcpy(vp + sb[r].pos * w, src + static_cast<size_t>(r) * w, w);
    }
    if (diff != 0) return false;  // (written slots are rewritten by the fallback merge)
    return true;
  }
  const bool tombs = sv.tomb != nullptr;
  // Slot t's record, searched from *rp on: stale records (older versions the index no longer
  // names) are skipped on the way, four at a time: keys ascend, so how many of the next four
  // are below the slot's key is how far to move (a loop per record mispredicted its exit at
  // every run of stale records). False when the page disagrees with the index.
  // Inlined into the loops below, so each chain's position stays in a register: called out
  // of line, every search reloaded it (and the captured pointers) from memory and stored it
  // back, a store-to-load round trip in the middle of the dependent chain.
  auto place = [&](const IndexPlan::Slot& s, uint32_t* rp) __attribute__((always_inline)) {
    const uint64_t key = s.key;
    uint32_t r = *rp;
    for (;;) {
      const uint32_t below = static_cast<uint32_t>(pk[r] < key) + (pk[r + 1] < key) + (pk[r + 2] < key) + (pk[r + 3] < key);
      r += below;
      if (below < 4) break;
    }
    if (r >= cn || pk[r] != key || (tombs && sv.is_tomb(r))) return false;
    std::memcpy(vp + s.pos * w, src + static_cast<size_t>(r) * w, w);
    *rp = r + 1;
    return true;
  };
  // Each search starts where the previous one ended: a chain of dependent loads and compares,
  // ~10 cycles a record, most of a fragmented feature's placement. Two runs of slots (a's,
  // all of whose keys are below b's: a plan's two parts, or one run's two halves) are searched
  // as two chains side by side (b's from its first key's record, found by a binary search),
  // which the core overlaps.
  if (mb == 0) {
    const size_t h = ma / 2;
    sb = sa + h;
    mb = ma - h;
    ma = h;
  } else if (ma == 0) {
    const size_t h = mb / 2;
    sa = sb;
    ma = h;
    sb += h;
    mb -= h;
  }
  if (mb == 0) return true;
  uint32_t ra = 0;
  uint32_t rb = static_cast<uint32_t>(std::lower_bound(pk, pk + cn, sb[0].key) - pk);
  const size_t both = std::min(ma, mb);
  for (size_t t = 0; t < both; t++)
    if (!place(sa[t], &ra) || !place(sb[t], &rb)) return false;
  for (size_t t = both; t < ma; t++)
    if (!place(sa[t], &ra)) return false;
  for (size_t t = both; t < mb; t++)
    if (!place(sb[t], &rb)) return false;
  return true;
}

}  // namespace

bool PlaceIndexed(const SegmentView& sv, IndexPlan* plan, uint32_t j, ColumnData* col,
                  std::vector<uint64_t>* scratch, double* encoded) {
  // A plan in two parts (two lanes) gives two runs of slots, placed as they are; more parts
  // are gathered into one run first.
  if (plan->parts > 2) plan->Gather(j);
  const size_t a = plan->first[j], ma = plan->fill[j] - a;
  const IndexPlan::Slot* sa = plan->slots.data() + a;
  const IndexPlan::Slot* sb = nullptr;
  size_t mb = 0;
  if (plan->parts == 2) {
    const size_t b = plan->first[j] + plan->room[j];
    sb = plan->slots.data() + b;
    mb = plan->part_fill[0][j] - b;
  }
  if (ma + mb == 0) return true;
  const bool ok = sv.width == 8   ? PlaceIndexedW<8>(sv, sa, ma, sb, mb, col, scratch)
                  : sv.width == 4 ? PlaceIndexedW<4>(sv, sa, ma, sb, mb, col, scratch)
                                  : PlaceIndexedW<0>(sv, sa, ma, sb, mb, col, scratch);
  if (!ok) return false;
  *encoded += static_cast<double>(ma + mb) * sv.bytes_per_record();
  return true;
}

namespace {

// The keys the refs may hold in [lo, hi_incl] and their records.
void KeySpan(const std::vector<PageRef>& refs, uint64_t lo, uint64_t hi_incl, uint64_t* kmin, uint64_t* kmax,
             uint64_t* total) {
  *kmin = UINT64_MAX, *kmax = 0, *total = 0;
  for (const PageRef& r : refs) {
    *kmin = std::min(*kmin, std::max(r.min_key, lo));
    *kmax = std::max(*kmax, std::min(r.max_key, hi_incl));
    *total += r.count;
  }
}

}  // namespace

bool DenseKeyRange(const std::vector<PageRef>& refs, uint64_t lo, uint64_t hi_incl) {
  uint64_t kmin, kmax, total;
  KeySpan(refs, lo, hi_incl, &kmin, &kmax, &total);
  return kmin <= kmax && SlotsPay(kmin, kmax, total);
}

bool PlanDensePlacement(const std::vector<PageRef>& refs, uint64_t lo, uint64_t hi_incl, uint32_t w,
                        DensePlan* plan) {
  if (refs.size() < 2 || w == 0 || lo > hi_incl) return false;
  uint64_t kmin, kmax, total;
  KeySpan(refs, lo, hi_incl, &kmin, &kmax, &total);
  if (kmin > kmax || !SlotsPay(kmin, kmax, total)) return false;
  if (kmax - kmin >= DensePlan::kTomb) return false;  // slot numbers are 31 bits
  plan->kmin = kmin;
  plan->span = kmax - kmin + 1;
  plan->lo = lo;
  plan->hi = hi_incl;
  plan->w = w;
  // A window's tags and values take ~256 KiB: within a core's L2 next to the staged streams.
  plan->window = static_cast<uint32_t>(std::max<uint64_t>(1024, (256u << 10) / (4 + w)));
  std::vector<uint32_t> by_seq(refs.size());
  for (uint32_t j = 0; j < refs.size(); j++) by_seq[j] = j;
  std::sort(by_seq.begin(), by_seq.end(), [&](uint32_t a, uint32_t b) { return refs[a].seq < refs[b].seq; });
  plan->rank.assign(refs.size(), 0);
  for (uint32_t x = 0; x < by_seq.size(); x++) plan->rank[by_seq[x]] = x + 1;
  plan->enc.assign(refs.size() + 1, 0);
  plan->first.resize(refs.size());
  plan->last.resize(refs.size());
  for (size_t j = 0; j < refs.size(); j++) {
    const uint64_t a = std::max(refs[j].min_key, lo), z = std::min(refs[j].max_key, hi_incl);
    plan->first[j] = a <= z ? a - kmin : plan->span;
    plan->last[j] = a <= z ? z - kmin : 0;
  }
  plan->base.resize(refs.size());
  plan->staged.assign(refs.size(), 0);
  plan->arrived.assign(refs.size(), 0);
  for (size_t j = 0; j < refs.size(); j++) plan->base[j] = j ? plan->base[j - 1] + refs[j - 1].count : 0;
  plan->stride = 4 + w;
  plan->recs.resize(total * plan->stride);  // written for staged records only, read only there
  return true;
}

namespace {

// Dense placement's staging of a segment with varint keys and kW-byte values (4: float32,
// 8: int64 features after updates, the steady state's pages), the keys decoded and staged in
// one pass: no scratch of decoded keys read back by the checks and the staging loop. Eight
// one-byte deltas (keys a few dozen apart) are taken together: for 4-byte values by an SSE
// prefix sum and four 16-byte stores. Writes ref j's records at `out` (stride 4 + kW), slot
// numbers key - kmin. True when every key lies in [kmin + first, kmin + first + n) and the
// keys ascend; false otherwise (the caller then takes the general path, which trims keys
// outside the scan range and reports the rest).
template <uint32_t kW>
bool StageVarint(const SegmentView& sv, uint64_t kmin, uint64_t first, uint64_t n, uint8_t* __restrict out) {
  constexpr uint32_t kStride = 4 + kW;
  const uint32_t count = sv.count;
  const uint8_t* p = sv.keys;
  const uint8_t* const end = sv.keys + sv.keys_bytes;
  const uint8_t* const vals = sv.values;
  const uint64_t base = kmin + first;
  uint64_t d;
  if (!ReadVarint(&p, end, &d)) return false;
  // The key's place in the ref's range. Keys that ascend stay in the range if the first and
  // the last do: the last is checked at the end (records staged beyond it are never swept).
  uint64_t rel = sv.min_key + d - base;
  if (rel >= n) return false;
  auto put = [&](uint32_t i) {
    const uint32_t s = static_cast<uint32_t>(rel + first);
    std::memcpy(out + static_cast<size_t>(kStride) * i, &s, 4);
    std::memcpy(out + static_cast<size_t>(kStride) * i + 4, vals + static_cast<size_t>(kW) * i, kW);
  };
  put(0);
  uint32_t i = 1;
  while (i < count) {
    if (count - i >= 8 && end - p >= 8) {
      uint64_t x;
      std::memcpy(&x, p, 8);
      if (!(x & 0x8080808080808080ull)) {
        // A zero delta (a repeated key) fails; nonzero deltas below 128 ascend without wrapping.
        if ((x - 0x0101010101010101ull) & ~x & 0x8080808080808080ull) return false;
        if constexpr (kW != 4) {
          for (uint32_t b = 0; b < 8; b++) {
            rel += (x >> (8 * b)) & 0x7f;
            put(i + b);
          }
        } else {
          __m128i ps = _mm_cvtepu8_epi16(_mm_cvtsi64_si128(static_cast<long long>(x)));
          ps = _mm_add_epi16(ps, _mm_slli_si128(ps, 2));
          ps = _mm_add_epi16(ps, _mm_slli_si128(ps, 4));
          ps = _mm_add_epi16(ps, _mm_slli_si128(ps, 8));  // inclusive prefix sums, at most 1016
          const __m128i s0 = _mm_set1_epi32(static_cast<int>(rel + first));
          const __m128i a = _mm_add_epi32(_mm_cvtepu16_epi32(ps), s0);
          const __m128i b = _mm_add_epi32(_mm_cvtepu16_epi32(_mm_srli_si128(ps, 8)), s0);
          const __m128i v0 = _mm_loadu_si128(reinterpret_cast<const __m128i*>(vals + 4ull * i));
          const __m128i v1 = _mm_loadu_si128(reinterpret_cast<const __m128i*>(vals + 4ull * i + 16));
          uint8_t* o = out + 8ull * i;
          _mm_storeu_si128(reinterpret_cast<__m128i*>(o), _mm_unpacklo_epi32(a, v0));
          _mm_storeu_si128(reinterpret_cast<__m128i*>(o + 16), _mm_unpackhi_epi32(a, v0));
          _mm_storeu_si128(reinterpret_cast<__m128i*>(o + 32), _mm_unpacklo_epi32(b, v1));
          _mm_storeu_si128(reinterpret_cast<__m128i*>(o + 48), _mm_unpackhi_epi32(b, v1));
          rel += static_cast<uint16_t>(_mm_extract_epi16(ps, 7));
        }
        p += 8;
        i += 8;
        continue;
      }
    }
    // d = 0 is a repeated key; d < n (below 2^31) keeps rel from wrapping.
    if (!ReadVarint(&p, end, &d) || d == 0 || d >= n) return false;
    rel += d;
    put(i++);
  }
  return rel < n;
}

}  // namespace

bool PlaceDense(const SegmentView& sv, uint32_t j, DensePlan* plan, std::vector<uint64_t>* scratch) {
  const uint64_t total = plan->recs.size() / plan->stride;
  const uint64_t cap = (j + 1 < plan->base.size() ? plan->base[j + 1] : total) - plan->base[j];
  if (sv.count > cap || plan->arrived[j]) return false;
  plan->arrived[j] = 1;
  plan->enc[plan->rank[j]] = sv.bytes_per_record();
  // The steady state's pages (float32 and int64 features after updates): keys decoded and
  // staged in one pass, 10 % off the engine time of a pass over 100 float32 features at the
  // steady state.
  if ((plan->w == 4 || plan->w == 8) && !sv.run_keys && !sv.raw_keys && !sv.bitmap_keys && !sv.tomb && sv.count &&
      plan->first[j] < plan->span) {
    const uint64_t n = plan->last[j] - plan->first[j] + 1;
    uint8_t* out = plan->recs.data() + plan->base[j] * plan->stride;
    if (plan->w == 4 ? StageVarint<4>(sv, plan->kmin, plan->first[j], n, out)
                     : StageVarint<8>(sv, plan->kmin, plan->first[j], n, out)) {
      plan->staged[j] = sv.count;
      return true;
    }
  }
  const uint64_t* pk;
  uint32_t r0 = 0, r1 = sv.count;
  if (sv.run_keys) {
    // Keys min_key, min_key + 1, ...: the records in range are found by arithmetic.
    if (sv.count == 0) return true;
    const uint64_t a = std::max(sv.min_key, plan->lo);
    const uint64_t z = std::min(sv.min_key + sv.count - 1, plan->hi);
    if (a > z) return true;
    r0 = static_cast<uint32_t>(a - sv.min_key);
    r1 = static_cast<uint32_t>(z - sv.min_key + 1);
    scratch->resize(r1 - r0);
    for (uint32_t r = r0; r < r1; r++) (*scratch)[r - r0] = sv.min_key + r;
    pk = scratch->data() - r0;
  } else {
    scratch->resize(sv.count);
    sv.DecodeKeys(scratch->data());
    pk = scratch->data();
    while (r0 < r1 && pk[r0] < plan->lo) r0++;
    while (r1 > r0 && pk[r1 - 1] > plan->hi) r1--;
  }
  if (r1 > r0 && plan->first[j] >= plan->span) return false;  // listed as outside the range
  // Each key within the ref's listed range (the sweep sweeps a window once every ref listed
  // as reaching into it is staged), and ascending: checked in two branch-free passes the
  // compiler vectorises, apart from the conversion (a loop doing all three did not vectorise
  // and was most of the staging's time).
  const uint64_t kmin = plan->kmin, first = plan->first[j], n = plan->last[j] - first + 1;
  const uint64_t* __restrict a = pk + r0;
  const size_t m = r1 - r0;
  uint64_t bad = 0;
  for (size_t r = 0; r < m; r++) bad |= a[r] - kmin - first >= n;  // (wraps below first: >= n)
  // Ascending: keys within the range just checked differ by less than 2^63, so the sign of
  // the difference decides, a compare that vectorises (an unsigned one does not here).
  for (size_t r = 1; r < m; r++) bad |= static_cast<int64_t>(a[r - 1] - a[r]) >= 0;
  if (bad) return false;  // nothing is read from a ref whose staged count stays 0
  const uint32_t w = plan->w, stride = plan->stride;
  uint8_t* __restrict out = plan->recs.data() + plan->base[j] * stride;
  const uint8_t* __restrict src = sv.values + static_cast<size_t>(r0) * w;
  const uint8_t* const tomb = sv.tomb;
  auto stage = [&](auto width, auto has_tombs) {
    for (size_t r = 0; r < m; r++, out += stride, src += width) {
      uint32_t s = static_cast<uint32_t>(a[r] - kmin);
      if constexpr (decltype(has_tombs)::value) {
        const size_t i = r0 + r;
        s |= static_cast<uint32_t>(tomb[i >> 3] >> (i & 7) & 1) << 31;  // DensePlan::kTomb
      }
      std::memcpy(out, &s, 4);
      std::memcpy(out + 4, src, width);
    }
  };
  // The common widths get a fixed-size copy; pages without deletes skip the tombstone bits.
  auto by_width = [&](auto has_tombs) {
    if (w == 4) stage(std::integral_constant<uint32_t, 4>(), has_tombs);
    else if (w == 8) stage(std::integral_constant<uint32_t, 8>(), has_tombs);
    else stage(w, has_tombs);
  };
  if (tomb) by_width(std::true_type());
  else by_width(std::false_type());
  plan->staged[j] = r1 - r0;
  return true;
}

DenseSweep::DenseSweep(const DensePlan& plan, const BufferedItems& buf, ColumnData* col, bool background,
                       LaneHelpers* helpers)
    : plan_(plan), buf_(buf), col_(col) {
  const size_t cap = plan.span + buf.size();  // no counting pass (the tail is never written)
  col->keys.resize(cap);
  col->values.resize(cap * plan.w);
  const size_t nr = plan.base.size();
  for (uint32_t j = 0; j < nr; j++)
    if (plan.first[j] < plan.span) by_first_.push_back(j);
  std::sort(by_first_.begin(), by_first_.end(),
            [&](uint32_t x, uint32_t y) { return plan.first[x] < plan.first[y]; });
  InitSweeper(&main_);
  for (uint32_t j = 0; j < nr; j++) main_.at[j] = plan.base[j];
  // No thread to be had: Advance sweeps on the caller's thread.
  if (background) helper_.Start(helpers, [this] { Helper(); });
}

void DenseSweep::InitSweeper(Sweeper* c) {
  const size_t nr = plan_.base.size();
  c->at.resize(nr);
  c->active.reserve(nr);  // the sweep allocates nothing
  const uint64_t wcap = std::min<uint64_t>(std::max<uint32_t>(plan_.window, 1), plan_.span);
  c->tags.resize(wcap);
  c->vals.resize(wcap * plan_.w);
}

DenseSweep::~DenseSweep() {
  if (!helper_.running()) return;
  {
    MutexLock l(&mu_);
    stop_ = true;
  }
  cv_.Signal();
  helper_.Join();
}

void DenseSweep::Helper() {
  // One window at a time, each claimed under mu_: Finish then knows how far the helper has
  // got and splits what is left evenly (see Finish).
  const uint64_t wn = std::max<uint32_t>(plan_.window, 1);
  for (;;) {
    uint64_t we;
    {
      MutexLock l(&mu_);
      for (;;) {
        if (stop_ || main_.ws >= plan_.span) return;
        we = std::min(plan_.span, main_.ws + wn);
        if (we <= bound_) break;
        if (last_) return;
        cv_.Wait(&mu_);
      }
      claimed_ = we;
    }
    SweepTo(&main_, we);  // the staging below `bound_` was written before it was published
  }
}

uint64_t DenseSweep::ReadyBound() {
  while (ready_ < by_first_.size() && plan_.arrived[by_first_[ready_]]) ready_++;
  return ready_ < by_first_.size() ? plan_.first[by_first_[ready_]] : plan_.span;
}

void DenseSweep::Advance() {
  const uint64_t bound = ReadyBound();
  if (!helper_.running()) {
    SweepTo(&main_, bound);
    return;
  }
  // Handed over a window's worth at a time (a wake-up per page would cost more than it
  // gives). Not the span: once every page is staged, Finish splits what is left between the
  // helper and the caller's thread.
  if (bound == plan_.span || bound < published_ + std::max<uint32_t>(plan_.window, 1)) return;
  if (bound == published_) return;
  {
    MutexLock l(&mu_);
    bound_ = bound;
  }
  published_ = bound;
  cv_.Signal();
}

void DenseSweep::PutBuffered(Sweeper* c, size_t e) {
  if (buf_.tomb[e]) return;
  const uint32_t w = plan_.w;
  col_->keys[c->o] = buf_.keys[e];
  std::memcpy(col_->values.data() + c->o * w, buf_.value(e), w);
  c->o++;
}

// Places ref j's staged records with slot numbers below `we` into the window starting at
// slot ws. The refs of a window are placed oldest first, so a record always replaces what
// its slot holds: no compare and no branch on which version wins.
template <uint32_t kW>
void DenseSweep::PlaceRef(Sweeper* c, uint32_t j, uint64_t ws, uint64_t we) {
  const uint32_t w = kW ? kW : plan_.w;
  const uint32_t stride = 4 + w;
  const uint32_t t = plan_.rank[j] << 1;
  uint32_t* tags = c->tags.data();
  uint8_t* vals = c->vals.data();
  const uint64_t end = plan_.base[j] + plan_.staged[j];
  uint64_t at = c->at[j];
  const uint8_t* rec = plan_.recs.data() + at * stride;
  for (; at < end; at++, rec += stride) {
    uint32_t p;
    std::memcpy(&p, rec, 4);
    const uint64_t s = (p & ~DensePlan::kTomb) - ws;
    if (s >= we - ws) break;
    tags[s] = t | (p >> 31);
    std::memcpy(vals + s * w, rec + 4, w);
  }
  c->at[j] = at;
}

void DenseSweep::SweepTo(Sweeper* c, uint64_t bound) {
  const DensePlan& plan = plan_;
  const uint32_t w = plan.w;
  const size_t nb = buf_.size();
  const uint64_t wn = std::max<uint32_t>(plan.window, 1);
  // A window is swept once every ref listed as reaching into it is staged: it ends at or
  // below the bound (the first slot of the first ref not yet staged).
  while (c->ws < plan.span) {
    const uint64_t we = std::min(plan.span, c->ws + wn), n = we - c->ws;
    if (we > bound) return;
    bool added = false;
    while (c->waiting < by_first_.size() && plan.first[by_first_[c->waiting]] < we) {
      const uint32_t j = by_first_[c->waiting++];
      if (plan.staged[j]) {
        c->active.push_back(j);
        added = true;
      }
    }
    if (added)
      std::sort(c->active.begin(), c->active.end(), [&](uint32_t x, uint32_t y) { return plan.rank[x] < plan.rank[y]; });
    std::memset(c->tags.data(), 0, n * 4);
    for (uint32_t j : c->active) {
      switch (w) {  // the common widths get a fixed-size copy
        case 4: PlaceRef<4>(c, j, c->ws, we); break;
        case 8: PlaceRef<8>(c, j, c->ws, we); break;
        default: PlaceRef<0>(c, j, c->ws, we); break;
      }
    }
    c->active.erase(std::remove_if(c->active.begin(), c->active.end(),
                                   [&](uint32_t j) { return c->at[j] == plan.base[j] + plan.staged[j]; }),
                    c->active.end());
    // The window into the output, merged with the buffered items. A window whose every key
    // has a current version and no buffered item is one block copy; elsewhere slot by slot.
    uint64_t* __restrict kp = col_->keys.data();
    uint8_t* vp = col_->values.data();
    const uint32_t* __restrict tags = c->tags.data();
    const uint8_t* vals = c->vals.data();
    const uint64_t k0 = plan.kmin + c->ws;
    while (c->k < nb && buf_.keys[c->k] < k0) PutBuffered(c, c->k++);
    // Any slot without a version (tag 0) or deleted (odd tag)? An OR and a min, vectorised.
    uint32_t any = 0, least = UINT32_MAX;
    for (uint64_t s = 0; s < n; s++) {
      any |= tags[s];
      least = std::min(least, tags[s]);
    }
    if (!(any & 1) && least != 0 && (c->k == nb || buf_.keys[c->k] >= k0 + n)) {
      uint64_t* __restrict out = kp + c->o;
      for (uint64_t s = 0; s < n; s++) out[s] = k0 + s;
      std::memcpy(vp + c->o * w, vals, n * w);
      c->o += n;
      // The encoded bytes of the records taken: their pages' bytes per record summed in four
      // independent sums (neighbouring slots mostly come from different pages after uniform
      // updates; counting items per rank in tables was a load and a store per slot and a
      // quarter of the sweep).
      const double* __restrict enc = plan.enc.data();
      double e0 = 0, e1 = 0, e2 = 0, e3 = 0;
      uint64_t s = 0;
      for (; s + 4 <= n; s += 4) {
        e0 += enc[tags[s] >> 1];
        e1 += enc[tags[s + 1] >> 1];
        e2 += enc[tags[s + 2] >> 1];
        e3 += enc[tags[s + 3] >> 1];
      }
      for (; s < n; s++) e0 += enc[tags[s] >> 1];
      c->encoded += (e0 + e1) + (e2 + e3);
      c->from_disk += n;
    } else {
      for (uint64_t s = 0; s < n; s++) {
        const uint32_t t = tags[s];
        if (t == 0) continue;
        const uint64_t key = k0 + s;
        if (c->k < nb) {
          while (c->k < nb && buf_.keys[c->k] < key) PutBuffered(c, c->k++);
          if (c->k < nb && buf_.keys[c->k] == key) {  // the buffered write is newer
            PutBuffered(c, c->k++);
            continue;
          }
        }
        if (t & 1) continue;  // deleted
        kp[c->o] = key;
        if (w == 4) std::memcpy(vp + c->o * 4, vals + s * 4, 4);
        else if (w == 8) std::memcpy(vp + c->o * 8, vals + s * 8, 8);
        else std::memcpy(vp + c->o * w, vals + s * w, w);
        c->o++;
        c->encoded += plan.enc[t >> 1];
        c->from_disk++;
      }
    }
    c->ws = we;
  }
}

void DenseSweep::StartSweeper(Sweeper* c, uint64_t from) {
  InitSweeper(c);
  const DensePlan& plan = plan_;
  const uint32_t stride = plan.stride;
  c->ws = from;
  // The buffered items below `from` are the first sweeper's; so are the output positions
  // that it may fill, at most a slot each below `from` and those items.
  c->k = static_cast<size_t>(std::lower_bound(buf_.keys.begin(), buf_.keys.end(), plan.kmin + from) - buf_.keys.begin());
  c->o = from + c->k;
  c->waiting = static_cast<size_t>(
      std::partition_point(by_first_.begin(), by_first_.end(), [&](uint32_t j) { return plan.first[j] < from; }) -
      by_first_.begin());
  // Refs starting below `from` join with their first staged record at or above it.
  for (size_t x = 0; x < c->waiting; x++) {
    const uint32_t j = by_first_[x];
    uint64_t lo = plan.base[j], hi = plan.base[j] + plan.staged[j];
    while (lo < hi) {
      const uint64_t m = lo + (hi - lo) / 2;
      uint32_t p;
      std::memcpy(&p, plan.recs.data() + m * stride, 4);
      if ((p & ~DensePlan::kTomb) < from) lo = m + 1;
      else hi = m;
    }
    c->at[j] = lo;
    if (lo < plan.base[j] + plan.staged[j]) c->active.push_back(j);
  }
  std::sort(c->active.begin(), c->active.end(), [&](uint32_t x, uint32_t y) { return plan.rank[x] < plan.rank[y]; });
  for (size_t x = c->waiting; x < by_first_.size(); x++) c->at[by_first_[x]] = plan.base[by_first_[x]];
}

void DenseSweep::Finish(uint64_t* useful, double* encoded) {
  Sweeper tail;
  Sweeper* last = &main_;  // the sweeper that reaches the span
  if (helper_.running()) {
    // Every page is staged. The helper sweeps up to `mid` while this thread sweeps the
    // windows above it: the sweep left after the last read (all of it for a feature whose
    // update pages each reach across its keys) takes half as long.
    // The split is made from the window the helper has claimed, not from the bound last
    // handed to it: a helper still behind that bound was left most of the sweep while this
    // thread waited for it (a pass over the 100 features of the steady-state float32 store
    // waited ~0.12 s in the join below; ~0.03 s with the split made here).
    const uint64_t wn = std::max<uint32_t>(plan_.window, 1);
    uint64_t mid = plan_.span;
    {
      MutexLock l(&mu_);
      const uint64_t from = claimed_;  // a window boundary: the helper sweeps no further yet
      if (from < plan_.span && (plan_.span - from) / wn >= 2) mid = from + (plan_.span - from) / wn / 2 * wn;
      bound_ = mid;
      last_ = true;
    }
    cv_.Signal();
    if (mid < plan_.span) {
      StartSweeper(&tail, mid);
      const uint64_t start = tail.o;
      SweepTo(&tail, plan_.span);
      helper_.Join();
      // The first sweeper wrote fewer items than it could (keys without a version, deletes,
      // buffered writes replacing a slot's version): the second's output moves down.
      if (main_.o < start) {
        const uint64_t n = tail.o - start, w = plan_.w;
        std::memmove(col_->keys.data() + main_.o, col_->keys.data() + start, n * 8);
        std::memmove(col_->values.data() + main_.o * w, col_->values.data() + start * w, n * w);
        tail.o = main_.o + n;
      }
      split_slots_ = plan_.span - mid;
      last = &tail;
    } else {
      helper_.Join();
    }
  } else {
    SweepTo(&main_, plan_.span);
  }
  while (last->k < buf_.size()) PutBuffered(last, last->k++);
  col_->keys.resize(last->o);
  col_->values.resize(last->o * static_cast<size_t>(plan_.w));
  *encoded += main_.encoded + tail.encoded;
  *useful += (main_.from_disk + tail.from_disk) * ItemBytes(plan_.w);
}

void FinishDensePlacement(const DensePlan& plan, const BufferedItems& buf, ColumnData* col, uint64_t* useful,
                          double* encoded) {
  DenseSweep sweep(plan, buf, col);
  sweep.Finish(useful, encoded);
}

uint64_t CloseDirectGaps(const std::vector<uint64_t>& slot, const std::vector<std::pair<uint32_t, uint32_t>>& span,
                         uint32_t w, ColumnData* col) {
  // Only the first and last page can be partial: the rest move as whole blocks.
  uint64_t wpos = 0;
  for (size_t j = 0; j < slot.size(); j++) {
    const auto [a, z] = span[j];
    const uint64_t from = slot[j] + a;
    if (from != wpos && z > a) {
      std::memmove(col->keys.data() + wpos, col->keys.data() + from, (z - a) * 8ull);
      std::memmove(col->values.data() + wpos * w, col->values.data() + from * w, static_cast<size_t>(z - a) * w);
    }
    wpos += z - a;
  }
  col->keys.resize(wpos);
  col->values.resize(wpos * w);
  return wpos;
}

}  // namespace recflash
