#include "reader/csrc/store_impl.h"

#include "reader/csrc/crc32c.h"
#include "reader/csrc/fault_injection.h"
#include "reader/csrc/scan_merge.h"
#include "reader/csrc/store_internal.h"

#include <fcntl.h>
#include <sys/file.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/uio.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <numeric>
#include <span>
#include <sstream>
#include <system_error>
#include <thread>
#include <unordered_map>

namespace recflash {

namespace fs = std::filesystem;
using namespace store_internal;

// ---------------------------------------------------------------------------------------
// Read path


Status StoreImpl::ReadPagesLeased(const std::vector<uint32_t>& sorted_pids, const PageFn& fn, ReadIo* io) {
  if (sorted_pids.empty()) return Status::OK();
  RingLease ring(rings_, o_.read_poll_us);
  RF_RETURN_IF_ERROR(ring.Acquire());
  Status rs = ReadPages(ring.get(), sorted_pids, fn, nullptr, SingleLaneInflight());
  if (!rs.ok()) return ExplainReadFailure(rs);
  io->wait_seconds += ring.get()->wait_seconds();
  io->peak_inflight_bytes = std::max(io->peak_inflight_bytes, ring.get()->peak_inflight_bytes());
  return Status::OK();
}

Status StoreImpl::ReadPages(IoRing* ring, const std::vector<uint32_t>& sorted_pids, const PageFn& fn,
                            const IoRing::IdleFn& idle, uint64_t inflight_bytes) {
  const uint32_t ps = o_.page_size;
  const auto runs = CoalescePages(sorted_pids, ring->slot_bytes() / ps);
  return ring->ReadRuns(file_.fd(), pages_path_, ps, runs, [&](const PageRun& run, const uint8_t* data) -> Status {
    for (uint32_t k = 0; k < run.count; k++) {
      PageView pv;
      RF_RETURN_IF_ERROR(PageView::Parse(data + static_cast<size_t>(k) * ps, ps, run.first + k, pages_path_, &pv));
      RF_RETURN_IF_ERROR(fn(run.first + k, pv));
    }
    return Status::OK();
  }, idle, inflight_bytes ? inflight_bytes : o_.read_inflight_bytes);
}

Status StoreImpl::SnapshotSegment(uint32_t pid, const PageView& pv, const PageRef& ref, const FeatureDef& def,
                                  bool keys_only, SegmentView* sv) {
  if (pv.seq() != ref.seq && (!o_.read_only || pv.seq() < ref.seq))  // no writer, or not a newer write
    return Status::Corruption("page " + std::to_string(pid) + " of '" + pages_path_ + "' holds seq " +
                              std::to_string(pv.seq()) + " where the metadata lists seq " + std::to_string(ref.seq) +
                              ": the page file and the metadata disagree (damaged, or files from different states)");
  if (pv.seq() != ref.seq)
    return Status::Stale("store '" + path_ + "': page " + std::to_string(pid) + " of '" + pages_path_ +
                         "' was rewritten by a writer since this read-only handle opened (seq " +
                         std::to_string(pv.seq()) + ", snapshot expects " + std::to_string(ref.seq) +
                         "); reopen the store to read the current data");
  if (!pv.Find(def.id, sv, keys_only))
    return Status::Corruption("page " + std::to_string(pid) + " of '" + pages_path_ +
                              "' lacks the segment of feature '" + def.name + "' that the metadata lists");
  sv->width = def.fixed_width();
  if (!keys_only) return CheckSegmentFits(*sv, pid, pages_path_, def);
  if (sv->damaged || sv->count != ref.count)
    return Status::Corruption("page " + std::to_string(pid) + " of '" + pages_path_ + "': the segment of feature '" +
                              def.name + "' " +
                              (sv->damaged ? std::string("has keys or tombstones reaching past its body")
                                           : "has " + std::to_string(sv->count) + " records, the metadata says " +
                                                 std::to_string(ref.count)));
  return Status::OK();
}

void StoreImpl::FinishRead(const std::vector<uint32_t>& pids, uint64_t useful, double encoded, uint64_t items,
                           double t0, const ReadIo& io, ReadStats* st) {
  st->io_wait_seconds = io.wait_seconds;
  st->peak_inflight_bytes = io.peak_inflight_bytes;
  const uint64_t requests = CoalescePages(pids, PagesPerRead()).size();
  st->pages_read = pids.size();
  st->read_requests = requests;
  st->bytes_read = pids.size() * static_cast<uint64_t>(o_.page_size);
  st->useful_bytes = useful;
  st->encoded_bytes = encoded;
  st->items = items;
  st->seconds = Now() - t0;
  pages_read_ += st->pages_read;
  bytes_read_ += st->bytes_read;
  useful_bytes_read_ += useful;
  encoded_bytes_read_ = encoded_bytes_read_ + encoded;
  read_requests_ += requests;
  reads_++;
}

namespace {

// One feature of a scan: its snapshot (buffered items, key index, pages) and its output plan.
struct ScanFeature {
  FeatureDef def;
  BufferedItems buf;
  // Sparse-key features whose pages overlap (after updates) are resolved through a snapshot
  // of their key index (see MergeByIndex and KeyIndex::Snapshot), taken once the first reads
  // are in flight (copy_indexes in ScanPass); `index_entries` is its size, counted with the
  // version.
  bool indexed = false;
  size_t index_entries = 0;
  // The index is still encoded from the checkpoint: copy_indexes decodes it (LoadIndex) first.
  bool decode_pending = false;
  KeyIndex::Snapshot isnap;
  IndexEntries ix;  // isnap's arrays
  // Index placement (fixed width, see IndexPlan): the merge done as pages arrive. `placed`
  // is cleared when a page disagrees with the index; the feature is then merged from chunks.
  bool placed = false;
  bool planned = false;  // the plan is made while the first reads are in flight (or at the feature's first page)
  bool place_failed = false;
  IndexPlan plan;
  // Dense placement (fixed width, dense keys, see DensePlan), decided before the reads.
  bool dense_placed = false;
  DensePlan dplan;
  std::unique_ptr<DenseSweep> sweep;
  std::vector<PageRef> refs;      // pages overlapping the range
  std::vector<PageChunk> chunks;  // one per ref (merge path)
  // Direct placement: a fixed-width feature whose pages are clean (no stale records, no
  // tombstones) and hold disjoint key ranges, with nothing buffered in the range, decodes
  // each page straight into its final place in the output — no intermediate copy, no merge.
  bool direct = false;
  std::vector<uint64_t> slot;                        // output start of each page
  std::vector<std::pair<uint32_t, uint32_t>> span;  // [a, z) kept per page
  // Faults in the dense plan's staging and output buffers while the reads go on; declared
  // last, so it is joined before the buffers above are freed.
  Populator populate;
};

// Whether the pages of a feature in a version need a merge through the key index.
bool Overlapping(const std::vector<PageRef>& rs) {
  for (size_t j = 0; j < rs.size(); j++)
    if (rs[j].valid != rs[j].count || rs[j].tombs || (j > 0 && rs[j - 1].max_key >= rs[j].min_key)) return true;
  return false;
}

// Whether a scan of [lo, hi_incl] needs the feature's key index: its pages overlap and no
// slot per key will do (fixed-width values of dense keys take dense placement instead, which
// needs no index and was faster than index placement for them).
bool WantsIndex(const std::vector<PageRef>& rs, const FeatureDef& def, uint64_t lo, uint64_t hi_incl) {
  if (!Overlapping(rs)) return false;
  return def.fixed_width() == 0 || rs.size() < 2 || !DenseKeyRange(rs, lo, hi_incl);
}

// Decides direct placement for f and, when it applies, sizes the output for every record.
void PlanDirect(ScanFeature* f, ColumnData* col) {
  const auto& rs = f->refs;
  bool ok = f->def.fixed_width() > 0 && f->buf.size() == 0;
  for (size_t j = 0; j < rs.size() && ok; j++)
    ok = rs[j].valid == rs[j].count && rs[j].tombs == 0 && (j == 0 || rs[j - 1].max_key < rs[j].min_key);
  if (!ok) {
    f->chunks.resize(rs.size());
    return;
  }
  f->direct = true;
  uint64_t total = 0;
  f->slot.resize(rs.size());
  f->span.assign(rs.size(), {0, 0});
  for (size_t j = 0; j < rs.size(); j++) {
    f->slot[j] = total;
    total += rs[j].count;
  }
  col->keys.resize(total);
  col->values.resize(total * f->def.fixed_width());
}

// Direct placement of page j's segment `sv` of f; adds the encoded bytes kept.
void PlaceDirect(const SegmentView& sv, uint64_t lo, uint64_t hi, bool to_end, ScanFeature* f, uint32_t j,
                 ColumnData* col, double* encoded) {
  uint64_t* kp = col->keys.data() + f->slot[j];
  sv.DecodeKeys(kp);
  uint32_t a = 0, z = sv.count;
  if (sv.min_key < lo) a = static_cast<uint32_t>(std::lower_bound(kp, kp + sv.count, lo) - kp);
  if (!to_end && sv.max_key >= hi) z = static_cast<uint32_t>(std::lower_bound(kp, kp + sv.count, hi) - kp);
  f->span[j] = {a, z};
  *encoded += (z - a) * sv.bytes_per_record();
  std::memcpy(col->values.data() + (f->slot[j] + a) * sv.width, sv.values + static_cast<size_t>(a) * sv.width,
              static_cast<size_t>(z - a) * sv.width);
}

// Decides each feature's placement over the keys [lo, hi_incl] (index, direct, dense or the
// chunk merges) and starts the dense placements' sweeps. Helper threads (the sweep, the
// faulting-in of fresh buffers; parked ones of `helpers` when idle) go to the largest dense
// placement only, where the sweep is worth a thread: one scan_many of a Ray read task may
// place dozens of features, and a thread each would oversubscribe the cores.
void PlanPlacements(uint64_t lo, uint64_t hi_incl, LaneHelpers* helpers, std::vector<ScanFeature>* features,
                    std::vector<ColumnData>* out) {
  std::vector<ScanFeature>& fs = *features;
  const size_t nf = fs.size();
  for (size_t i = 0; i < nf; i++) {
    ScanFeature& f = fs[i];
    if (f.indexed && f.def.fixed_width() > 0) {
      f.placed = true;
      continue;
    }
    PlanDirect(&f, &(*out)[i]);
    if (f.direct || f.refs.empty() || f.def.fixed_width() == 0) continue;
    f.dense_placed = PlanDensePlacement(f.refs, lo, hi_incl, f.def.fixed_width(), &f.dplan);
  }
  constexpr uint64_t kBackgroundSweepSlots = 64u << 10;
  size_t helped = nf;
  for (size_t i = 0; i < nf; i++)
    if (fs[i].dense_placed && fs[i].dplan.span >= kBackgroundSweepSlots &&
        (helped == nf || fs[i].dplan.span > fs[helped].dplan.span))
      helped = i;
  for (size_t i = 0; i < nf; i++) {
    ScanFeature& f = fs[i];
    if (!f.dense_placed) continue;
    ColumnData& col = (*out)[i];
    f.sweep = std::make_unique<DenseSweep>(f.dplan, f.buf, &col, i == helped, helpers);
    if (i == helped)
      f.populate.Start({{f.dplan.recs.data(), f.dplan.recs.size()},
                        {col.keys.data(), col.keys.size() * 8},
                        {col.values.data(), col.values.size()}},
                       helpers);
  }
}

// The (feature, ref) pairs of a scan that read each of its pages, by page: built once before
// the reads, looked up per page read. Flat and sorted, not a hash map of vectors: that cost a
// node and a vector allocation per page of every scan.
class PageUsers {
 public:
  struct User {
    uint32_t page, feature, ref;
  };
  // Feature `feature` reads page `page` as its ref `ref`. Adds come feature by feature, refs
  // ascending.
  void Add(uint32_t page, uint32_t feature, uint32_t ref) { u_.push_back({page, feature, ref}); }
  // After the last Add: the pages read, ascending and distinct.
  std::vector<uint32_t> Finish() {
    // Stable: a page's users stay in the order they were added (features, then refs, ascending).
    std::stable_sort(u_.begin(), u_.end(), [](const User& a, const User& b) { return a.page < b.page; });
    std::vector<uint32_t> pids;
    for (const User& x : u_)
      if (pids.empty() || pids.back() != x.page) pids.push_back(x.page);
    return pids;
  }
  // The users of a page that Finish listed.
  std::span<const User> of(uint32_t page) const {
    const auto a = std::lower_bound(u_.begin(), u_.end(), page, [](const User& x, uint32_t p) { return x.page < p; });
    auto z = a;
    while (z != u_.end() && z->page == page) ++z;
    return {a, z};
  }

 private:
  std::vector<User> u_;
};

// Reorders a dense placement's reads (runs of adjacent pages of `pids`, ascending, as
// ReadPages coalesces them) by the lowest key they hold, so that the sweep writes windows of
// the output while reads are in flight (in page order, the first window's pages may come
// last). Runs, not pages: a feature's pages lie in runs written together, and one read per
// page took twice as long.
void OrderRunsByLowestKey(const ScanFeature& f, const PageUsers& users, uint32_t per_read, std::vector<uint32_t>* pids) {
  auto first_of = [&](uint32_t page) { return f.dplan.first[users.of(page).front().ref]; };
  const std::vector<PageRun> runs = CoalescePages(*pids, per_read);
  std::vector<uint64_t> low(runs.size(), UINT64_MAX);
  for (size_t r = 0; r < runs.size(); r++)
    for (uint32_t p = runs[r].first; p < runs[r].first + runs[r].count; p++) low[r] = std::min(low[r], first_of(p));
  std::vector<uint32_t> by_low(runs.size());
  for (uint32_t r = 0; r < runs.size(); r++) by_low[r] = r;
  std::stable_sort(by_low.begin(), by_low.end(), [&](uint32_t a, uint32_t b) { return low[a] < low[b]; });
  pids->clear();
  for (uint32_t r : by_low)
    for (uint32_t p = runs[r].first; p < runs[r].first + runs[r].count; p++) pids->push_back(p);
}

using LanePageFn = std::function<Status(uint32_t pid, const PageView& page)>;  // StoreImpl::PageFn
using LaneReadFn =
    std::function<Status(IoRing*, const std::vector<uint32_t>&, const LanePageFn&, const IoRing::IdleFn&)>;
using SegmentFn = std::function<Status(uint32_t pid, const PageView&, const ScanFeature&, uint32_t j, SegmentView*)>;

// Smallest index placement worth more threads: below it waking a helper and the lanes'
// hand-overs cost about what a helper's share of the plan and placement saves.
constexpr size_t kLaneMinEntries = 16384;
constexpr size_t kLaneMinPages = 8;

// Index placement of one feature on the scan's thread and the claimed helpers: lane
// l reads the l-th share of the pages (ascending ids, so each lane's reads stay in file
// order) on a ring of its own, makes its part of the plan (LanePlan) while its first reads
// are in flight and places its pages as they arrive. Lane 0 takes the index snapshot
// (`copy_index`) before the plan. Pages write disjoint output slots, so
// the lanes share nothing else. A lane's read error stops the others at their next page.
Status ReadPlacedInLanes(LaneHelpers::Claim* helpers, IoRingPool* pool, uint32_t poll_us,
                         const std::vector<uint32_t>& pids, const PageUsers& users, ScanFeature* f, ColumnData* col,
                         const LaneReadFn& read, const SegmentFn& segment,
                         const std::function<bool()>& copy_index, double* encoded, ReadIo* io) {
  struct Lane {
    std::vector<uint64_t> scratch;
    double encoded = 0;
    bool failed = false;  // a page disagreed with the index
    Status status;
    uint64_t peak_inflight = 0;
  };
  const unsigned lanes = static_cast<unsigned>(helpers->size()) + 1;
  std::vector<Lane> lane(lanes);
  LanePlan plan(&f->ix, f->refs, f->buf, f->def.fixed_width(), col, &f->plan, lanes, copy_index);
  std::atomic<bool> stop{false};
  std::atomic<int> origin{-1};  // the lane whose error stopped the others
  // The helpers are woken once lane 0's first reads are submitted, not before: waking one
  // is a system call that took ~15 us on the 2-core virtual machine measured here, and the
  // device waited for it (the fragmented features of 16-64 pages of the compaction benchmark's
  // default store 1.9 % faster, read alternating scan by scan). Lane 0 wakes them before its
  // first share of the plan (its ring calls `idle` right after submitting), or on its way out.
  bool woken = false;
  std::function<void()> wake;
  auto share = [&](unsigned l, IoRing* ring) {
    if (l == 0) wake();
    if (ring) {
      plan.Share(l, [ring] { ring->Pump(); });
    } else {
      plan.Share(l);
    }
  };
  auto run = [&](unsigned l, unsigned n) {
    Lane& me = lane[l];
    const std::vector<uint32_t> mine(pids.begin() + pids.size() * l / n, pids.begin() + pids.size() * (l + 1) / n);
    auto page = [&](uint32_t pid, const PageView& pv) -> Status {
      if (stop.load(std::memory_order_relaxed)) return Status::IOError("scan stopped: another of its threads failed");
      share(l, nullptr);
      const bool planned = plan.Planned();
      for (const PageUsers::User& u : users.of(pid)) {
        const uint32_t j = u.ref;
        SegmentView sv;
        RF_RETURN_IF_ERROR(segment(pid, pv, *f, j, &sv));
        if (planned && !me.failed && !PlaceIndexed(sv, &f->plan, j, col, &me.scratch, &me.encoded)) me.failed = true;
      }
      return Status::OK();
    };
    RingLease ring(pool, poll_us);
    me.status = ring.Acquire();
    if (me.status.ok())
      me.status = read(ring.get(), mine, page, [&]() -> Status {
        share(l, ring.get());  // (the plan's chunks pump the ring: reads go on meanwhile)
        return Status::OK();
      });
    if (ring.get()) me.peak_inflight = ring.get()->peak_inflight_bytes();
    if (l == 0 && ring.get()) io->wait_seconds = ring.get()->wait_seconds();
    share(l, nullptr);  // on every path: the other lanes wait for it
    if (!me.status.ok()) {
      int none = -1;
      origin.compare_exchange_strong(none, static_cast<int>(l));
      stop = true;
    }
  };
  wake = [&]() {
    if (woken) return;
    woken = true;
    for (unsigned l = 1; l < lanes; l++) helpers->Run(l - 1, [&, l] { run(l, lanes); });
  };
  run(0, lanes);
  wake();  // (lane 0 woke them already unless it had nothing to do)
  helpers->Wait();
  f->planned = true;
  f->place_failed = !plan.Planned();
  for (unsigned l = 0; l < lanes; l++) {
    f->place_failed |= lane[l].failed;
    *encoded += lane[l].encoded;
    io->peak_inflight_bytes += lane[l].peak_inflight;
  }
  return origin.load() >= 0 ? lane[origin.load()].status : Status::OK();
}

}  // namespace

Status StoreImpl::ScanMany(const std::vector<std::string>& names, uint64_t lo, uint64_t hi,
                           std::vector<ColumnData>* out, ReadStats* st) {
  std::vector<size_t> redo;
  RF_RETURN_IF_ERROR(ScanPass(names, lo, hi, true, out, st, &redo));
  if (redo.empty()) return Status::OK();
  // A page disagreed with the key index snapshot (see IndexPlan), or a writer changed the index
  // before the scan copied it: those features again, merged from page chunks, which resolve
  // versions by seq without trusting the index.
  std::vector<std::string> again;
  for (size_t i : redo) again.push_back(names[i]);
  std::vector<ColumnData> cols;
  ReadStats st2;
  std::vector<size_t> none;
  RF_RETURN_IF_ERROR(ScanPass(again, lo, hi, false, &cols, &st2, &none));
  for (size_t k = 0; k < redo.size(); k++) (*out)[redo[k]] = std::move(cols[k]);
  index_merge_fallbacks_ += redo.size();
  st->Add(st2);
  return Status::OK();
}

Status StoreImpl::ScanPass(const std::vector<std::string>& names, uint64_t lo, uint64_t hi, bool use_index,
                           std::vector<ColumnData>* out, ReadStats* st, std::vector<size_t>* redo) {
  const double t0 = Now();
  RF_RETURN_IF_ERROR(CheckOpen());
  RF_RETURN_IF_ERROR(CheckReadable());
  const size_t nf = names.size();
  const bool to_end = hi == UINT64_MAX;
  std::vector<ScanFeature> fs(nf);
  for (size_t i = 0; i < nf; i++) RF_RETURN_IF_ERROR(FeatureFor(names[i], &fs[i].def));
  // Only features whose pages overlap need their key index (the index-guided merge), unless
  // dense placement takes them; the others are placed page by page, so their checkpointed
  // indexes stay encoded.
  std::vector<uint8_t> wants_index(nf, 0);
  bool any_wants_index = false;
  if (use_index) {
    MutexLock l(&mu_);
    const std::shared_ptr<const Version> cur = versions_.current();
    for (size_t i = 0; i < nf; i++) {
      wants_index[i] = WantsIndex(cur->refs(fs[i].def.id), fs[i].def, lo, hi == UINT64_MAX ? UINT64_MAX : hi - 1);
      any_wants_index |= wants_index[i] != 0;
    }
  }
  if (o_.read_only && any_wants_index) RF_RETURN_IF_ERROR(TryKeyIndexFromCheckpoint());
  // Checkpointed key indexes decode on first use. The index-guided merge never runs for a
  // dense index, so a checkpointed dense one stays encoded (decoding it, 4 B per key, was
  // the largest cost of a feature's first scan after an open). A full scan decodes a
  // checkpointed index of keys while its first reads are in flight (copy_indexes below), not
  // before they are submitted: the decode and its key checks took ~0.2 ms of a fragmented
  // feature's first scan after an open, its reads ~0.5 ms. A ranged scan needs the decoded
  // index to count its entries, so it decodes here. A writer's flush between here and the
  // snapshot below can make a feature overlap whose index is still encoded: that scan merges
  // the pages' chunks instead.
  constexpr uint64_t kNotPending = UINT64_MAX;
  std::vector<uint64_t> pending_entries(nf, kNotPending);
  for (size_t i = 0; i < nf; i++) {
    if (!wants_index[i]) continue;
    FeatureState* f = FeatureStateFor(fs[i].def.id);
    if (!f) continue;
    uint64_t n = 0;
    const PendingIndex kind = IndexPending(f, &n);
    if (kind == PendingIndex::kDense) continue;
    if (kind == PendingIndex::kKeys && lo == 0 && to_end)
      pending_entries[i] = n;
    else
      RF_RETURN_IF_ERROR(LoadIndex(f));
  }
  out->assign(nf, ColumnData());
  std::shared_ptr<const Version> v;
  {
    // The buffered items are taken with the version under mu_, so both describe the same
    // state; the index copies are taken later (copy_indexes), checked against it.
    MutexLock l(&mu_);
    if (closed_) return Status::Closed("store '" + path_ + "' is closed");
    versions_.AssertHeld();
    v = versions_.RegisterLocked();
    for (size_t i = 0; i < nf; i++) {
      ScanFeature& sf = fs[i];
      if (FeatureBuffer* fb = buffer_.find(sf.def.id)) fb->CopyRange(lo, hi, &sf.buf);
      if (!use_index || index_ahead_ || o_.accounting || v->refs(sf.def.id).empty()) continue;
      const FeatureState* f = ReaderFeatures().Get(sf.def.id);
      if (!f) continue;
      // Still encoded: decoded by copy_indexes when it was found pending above (another
      // scan may have decoded it since); otherwise a dense index, or not decoded: the chunk
      // merges. Dense keys: the scatter merge is as fast.
      const bool pending = f->index_lazy;
      if (pending ? pending_entries[i] == kNotPending : f->index.dense()) continue;
      // Direct placement or a plain concatenation; dense placement.
      if (!WantsIndex(v->refs(sf.def.id), sf.def, lo, hi == UINT64_MAX ? UINT64_MAX : hi - 1)) continue;
      sf.index_entries = pending ? pending_entries[i] : f->index.CountRange(lo, hi);
      sf.indexed = true;
      sf.decode_pending = pending;
    }
  }
  VersionSet::Reader guard(&versions_, v->number);
  if (lo >= hi && !to_end) hi = lo;  // empty range

  // Pages per feature overlapping [lo, hi); a page shared by several features is read once.
  PageUsers users;
  for (size_t i = 0; i < nf; i++) {
    if (lo >= hi && !to_end) continue;
    for (const PageRef& r : v->refs(fs[i].def.id)) {
      if (r.max_key < lo || (!to_end && r.min_key >= hi)) continue;
      users.Add(r.page, static_cast<uint32_t>(i), static_cast<uint32_t>(fs[i].refs.size()));
      fs[i].refs.push_back(r);
    }
  }
  std::vector<uint32_t> pids = users.Finish();
  PlanPlacements(lo, to_end ? UINT64_MAX : hi - 1, lane_helpers_.get(), &fs, out);
  if (nf == 1 && fs[0].dense_placed)
    OrderRunsByLowestKey(fs[0], users, PagesPerRead(), &pids);
  // The index snapshots, taken once the first reads are in flight rather than before them
  // (a lazily loaded index is decoded first). They must describe the version v. A writer changes the
  // index under mu_ between setting index_ahead_ and installing the next version, so an
  // unchanged version with index_ahead_ clear means an unchanged index; otherwise the
  // index-placed features are read again by the chunk merges (ScanMany's redo), which
  // resolve versions by seq.
  bool any_indexed = false;
  for (const ScanFeature& f : fs) any_indexed |= f.indexed;
  int index_copy = any_indexed ? 0 : 1;  // 0: not yet; 1: taken (or none); 2: the index moved past the version
  Status decode_status;                  // a pending index that failed to decode (checked after the reads)
  auto copy_indexes = [&]() -> bool {
    if (index_copy != 0) return index_copy == 1;
    for (ScanFeature& sf : fs) {
      if (!sf.decode_pending) continue;
      sf.decode_pending = false;
      FeatureState* f = FeatureStateFor(sf.def.id);
      if (f && decode_status.ok()) decode_status = LoadIndex(f);  // (none: the copy below finds none either)
    }
    RF_PAUSE_POINT("scan.before_index_copy");
    bool same;
    {
      MutexLock l(&mu_);
      versions_.AssertHeld();
      same = decode_status.ok() && !closed_ && !index_ahead_ && versions_.current()->number == v->number;
      for (ScanFeature& sf : fs) {
        if (!sf.indexed) continue;
        const FeatureState* f = same ? ReaderFeatures().Get(sf.def.id) : nullptr;
        if (f && !f->index.dense() && !f->index_lazy) {
          sf.isnap = f->index.Share(lo, hi);
          sf.ix = {sf.isnap.keys(), sf.isnap.locs()};
          continue;
        }
        sf.indexed = false;
        if (sf.placed) sf.planned = sf.place_failed = true;
      }
      index_copy = same ? 1 : 2;
    }
    // (A writer that changes the index from here on copies its arrays: the snapshots stay.)
    RF_PAUSE_POINT("scan.after_index_snapshot");
    return same;
  };
  std::vector<uint64_t> scratch;  // a page's decoded keys (index and dense placement)
  auto plan = [&](size_t i) {
    ScanFeature& f = fs[i];
    if (!copy_indexes() && f.planned) return;
    f.planned = true;
    if (!PlanIndexPlacement(f.ix.keys, f.ix.locs, f.refs, f.buf, f.def.fixed_width(), &(*out)[i], &f.plan))
      f.place_failed = true;
  };

  double encoded = 0;
  // Page pid's segment of feature f (its ref j), checked against the snapshot.
  auto segment = [&](uint32_t pid, const PageView& pv, const ScanFeature& f, uint32_t j, SegmentView* sv) -> Status {
    return SnapshotSegment(pid, pv, f.refs[j], f.def, false, sv);
  };
  auto cb = [&](uint32_t pid, const PageView& pv) -> Status {
    for (const PageUsers::User& u : users.of(pid)) {
      const uint32_t i = u.feature, j = u.ref;
      ScanFeature& f = fs[i];
      const PageRef& ref = f.refs[j];
      SegmentView sv;
      RF_RETURN_IF_ERROR(segment(pid, pv, f, j, &sv));
      if (f.placed) {
        if (!f.planned) plan(i);
        if (!f.place_failed && !PlaceIndexed(sv, &f.plan, j, &(*out)[i], &scratch, &encoded)) f.place_failed = true;
        continue;
      }
      if (!f.direct) {
        if (f.dense_placed) {
          if (!PlaceDense(sv, j, &f.dplan, &scratch))
            return Status::Corruption("page " + std::to_string(pid) + " of '" + pages_path_ + "': feature '" +
                                      f.def.name + "' segment disagrees with its metadata (" +
                                      std::to_string(ref.count) + " records of keys [" +
                                      std::to_string(ref.min_key) + ", " + std::to_string(ref.max_key) +
                                      "]): more records, a key outside that range or keys out of order");
          f.sweep->Advance();
          continue;
        }
        DecodeChunk(sv, pv.seq(), lo, hi, to_end, ref.valid == ref.count, &f.chunks[j]);
        continue;
      }
      if (sv.count != ref.count)
        return Status::Corruption("page " + std::to_string(pid) + " of '" + pages_path_ + "': feature '" +
                                  f.def.name + "' segment has " + std::to_string(sv.count) +
                                  " records, the metadata says " + std::to_string(ref.count));
      PlaceDirect(sv, lo, hi, to_end, &f, j, &(*out)[i], &encoded);
    }
    return Status::OK();
  };
  // The index plans are made while the first reads are in flight (one feature per wait), not
  // behind them: a plan walks the feature's whole index snapshot, as long as its pages take to read.
  size_t next_plan = 0;
  auto idle = [&]() -> Status {
    copy_indexes();
    RF_RETURN_IF_ERROR(decode_status);
    for (; next_plan < nf; next_plan++)
      if (fs[next_plan].placed && !fs[next_plan].planned) {
        plan(next_plan++);
        break;
      }
    return Status::OK();
  };
  const unsigned lanes = lane_helpers_ && nf == 1 && fs[0].placed && fs[0].index_entries >= kLaneMinEntries
                            ? static_cast<unsigned>(std::min<size_t>(o_.scan_threads, pids.size() / kLaneMinPages))
                            : 1;
  LaneHelpers::Claim helpers = lanes > 1 ? lane_helpers_->Acquire(lanes - 1) : LaneHelpers::Claim();
  ReadIo io;
  if (helpers.size() > 0) {
    // The lanes share the scan's in-flight budget, so a scan keeps read_inflight_bytes in
    // flight whatever its lane count. Each with the whole budget, a fragmented feature's pages
    // went out in one burst of twice that, which this disk completed all at once after ~0.9 ms:
    // placing began only then. Shared, the first half arrives sooner and is placed while the
    // rest is read (the compaction benchmark's default store: the sum of per-feature median
    // scan times 2-6 % lower in three runs alternating the two per scan).
    // (0, no budget, stays 0; a share below one read still reads one at a time.)
    const uint64_t share = o_.read_inflight_bytes / (helpers.size() + 1);
    auto read = [this, share](IoRing* r, const std::vector<uint32_t>& p, const PageFn& fn, const IoRing::IdleFn& idle) {
      return ReadPages(r, p, fn, idle, share);
    };
    lane_scans_++;
    Status rs = ReadPlacedInLanes(&helpers, rings_, std::max(o_.read_poll_us, o_.lane_read_poll_us), pids, users, &fs[0], &(*out)[0], read, segment, copy_indexes,
                                  &encoded, &io);
    RF_RETURN_IF_ERROR(decode_status);
    if (!rs.ok()) return ExplainReadFailure(rs);
  } else if (!pids.empty()) {
    RingLease ring(rings_, o_.read_poll_us);
    RF_RETURN_IF_ERROR(ring.Acquire());
    Status rs = ReadPages(ring.get(), pids, cb, any_indexed ? IoRing::IdleFn(idle) : IoRing::IdleFn(),
                          SingleLaneInflight());
    RF_RETURN_IF_ERROR(decode_status);
    if (!rs.ok()) return ExplainReadFailure(rs);
    io.wait_seconds = ring.get()->wait_seconds();
    io.peak_inflight_bytes = ring.get()->peak_inflight_bytes();
  }
  copy_indexes();  // (no reads: nothing in the range)
  RF_RETURN_IF_ERROR(decode_status);

  uint64_t useful = 0, items = 0;
  for (size_t i = 0; i < nf; i++) {
    ScanFeature& f = fs[i];
    ColumnData& col = (*out)[i];
    const uint32_t w = f.def.fixed_width();
    if (f.placed) {
      if (!f.planned) plan(i);  // no page of it in the range
      if (f.place_failed) {
        redo->push_back(i);
        continue;
      }
      index_merges_++;
      useful += f.plan.from_disk * ItemBytes(w);
      items += col.keys.size();
      continue;
    }
    if (f.dense_placed) {
      f.sweep->Finish(&useful, &encoded);
      items += col.keys.size();
      continue;
    }
    if (f.direct) {
      const uint64_t kept = CloseDirectGaps(f.slot, f.span, w, &col);
      useful += kept * ItemBytes(w);
      items += kept;
      continue;
    }
    MergeSink sink(&col, w, f.def.element_size(), f.buf, f.chunks);
    const MergeKind kind = MergeChunks(f.indexed ? &f.ix : nullptr, f.refs, &sink);
    if (kind == MergeKind::kIndex) index_merges_++;
    if (kind == MergeKind::kIndexFallback) index_merge_fallbacks_++;
    useful += sink.useful;
    encoded += sink.encoded;
    items += col.keys.size();
  }
  FinishRead(pids, useful, encoded, items, t0, io, st);
  return Status::OK();
}

Status StoreImpl::Get(const std::string& name, const uint64_t* keys, size_t n, ColumnData* out, ReadStats* st) {
  const double t0 = Now();
  RF_RETURN_IF_ERROR(CheckOpen());
  RF_RETURN_IF_ERROR(CheckReadable());
  RF_RETURN_IF_ERROR(EnsureKeyIndex());
  FeatureDef def;
  RF_RETURN_IF_ERROR(FeatureFor(name, &def));
  RF_RETURN_IF_ERROR(LoadIndex(FeatureStateFor(def.id)));
  const uint32_t w = def.fixed_width();
  // Unique requested keys, ascending.
  std::vector<uint64_t> uk(keys, keys + n);
  std::sort(uk.begin(), uk.end());
  uk.erase(std::unique(uk.begin(), uk.end()), uk.end());
  struct Best {
    int src = 0;  // 0 none, 1 buffer, 2 page
    bool tomb = false;
    uint64_t seq = 0;
    uint64_t off = 0;
    uint32_t len = 0;
  };
  std::vector<Best> best(uk.size());
  std::vector<uint8_t> arena;
  std::shared_ptr<const Version> v;
  // Page of each requested key's current version, from the key index. Buffer, index and
  // version are read under mu_: the writer mutates the index under mu_ too, and a page the
  // index names stays readable while this reader is registered (pending-free rule).
  std::unordered_map<uint32_t, std::vector<uint32_t>> want;  // page -> positions in uk
  bool deferred = false;
  {
    MutexLock l(&mu_);
    if (closed_) return Status::Closed("store '" + path_ + "' is closed");
    versions_.AssertHeld();
    v = versions_.RegisterLocked();
    if (FeatureBuffer* fb = buffer_.find(def.id)) {
      fb->Normalize();
      const BufferedItems& b = fb->items();
      size_t j = 0;
      for (size_t i = 0; i < uk.size(); i++) {
        j = std::lower_bound(b.keys.begin() + j, b.keys.end(), uk[i]) - b.keys.begin();
        if (j < b.size() && b.keys[j] == uk[i]) {
          best[i].src = 1;
          best[i].tomb = b.tomb[j] != 0;
          best[i].off = arena.size();
          best[i].len = b.length(j);
          arena.insert(arena.end(), b.value(j), b.value(j) + b.length(j));
        }
      }
    }
    const FeatureState* f = ReaderFeatures().Get(def.id);
    deferred = f->index.deferred();
    size_t hint = 0;
    for (size_t i = 0; i < uk.size(); i++) {
      if (best[i].src == 1) continue;
      if (deferred) {  // the one segment whose key range holds the key, if any (see KeyIndex)
        const uint32_t pid = v->DeferredPage(def.id, uk[i]);
        if (pid != UINT32_MAX) want[pid].push_back(static_cast<uint32_t>(i));
        continue;
      }
      const int64_t pos = f->index.FindFrom(uk[i], &hint);
      if (pos == KeyIndex::kAbsent) continue;
      const uint32_t loc = f->index.loc(static_cast<size_t>(pos));
      if (loc & KeyIndex::kTomb) continue;
      want[loc].push_back(static_cast<uint32_t>(i));
    }
  }
  VersionSet::Reader guard(&versions_, v->number);
  std::vector<uint32_t> pids;
  for (const auto& [p, ks] : want) pids.push_back(p);
  std::sort(pids.begin(), pids.end());
  uint64_t useful = 0;
  double encoded = 0;
  std::vector<uint64_t> tmp;
  auto cb = [&](uint32_t pid, const PageView& pv) -> Status {
    // (pages_ is immutable on a read-only handle once its key index is built.)
    if (o_.read_only && pv.seq() != OpenedPageSeq(pid))
      return Status::Stale("store '" + path_ + "': page " + std::to_string(pid) + " of '" + pages_path_ +
                           "' was rewritten by a writer since this read-only handle opened; reopen the store");
    SegmentView sv;
    if (!pv.Find(def.id, &sv))
      return Status::Corruption("page " + std::to_string(pid) + " of '" + pages_path_ +
                                "' lacks the segment of feature '" + def.name + "' that the key index names");
    sv.width = w;
    RF_RETURN_IF_ERROR(CheckSegmentFits(sv, pid, pages_path_, def));
    tmp.resize(sv.count);
    sv.DecodeKeys(tmp.data());
    for (uint32_t u : want[pid]) {
      auto f = std::lower_bound(tmp.begin(), tmp.end(), uk[u]);
      if ((f == tmp.end() || *f != uk[u]) && deferred) continue;  // a gap in the segment's range: absent
      if (f == tmp.end() || *f != uk[u])
        return Status::Corruption("page " + std::to_string(pid) + " of '" + pages_path_ + "' lacks key " +
                                  std::to_string(uk[u]) + " of feature '" + def.name + "' that the key index names");
      const uint32_t r = static_cast<uint32_t>(f - tmp.begin());
      const uint8_t* p;
      uint32_t len;
      sv.Value(r, &p, &len);
      Best& bb = best[u];
      bb.src = 2;
      bb.seq = pv.seq();
      bb.tomb = false;
      bb.off = arena.size();
      bb.len = len;
      arena.insert(arena.end(), p, p + len);
      encoded += sv.bytes_per_record();
    }
    return Status::OK();
  };
  ReadIo io;
  RF_RETURN_IF_ERROR(ReadPagesLeased(pids, cb, &io));
  // Output aligned with the request.
  out->keys.assign(keys, keys + n);
  out->found.assign(n, 0);
  out->values.clear();
  out->offsets.clear();
  if (!w) out->offsets.push_back(0);
  const uint32_t elem = def.element_size();
  uint64_t items = 0;
  for (size_t i = 0; i < n; i++) {
    const size_t u = std::lower_bound(uk.begin(), uk.end(), keys[i]) - uk.begin();
    const Best& bb = best[u];
    const bool hit = bb.src != 0 && !bb.tomb;
    out->found[i] = hit;
    if (hit) {
      out->values.insert(out->values.end(), arena.begin() + bb.off, arena.begin() + bb.off + bb.len);
      items++;
      if (bb.src == 2) useful += ItemBytes(bb.len);
    } else if (w) {
      out->values.resize(out->values.size() + w, 0);
    }
    if (!w) out->offsets.push_back(static_cast<int32_t>(out->values.size() / elem));
  }
  FinishRead(pids, useful, encoded, items, t0, io, st);
  return Status::OK();
}

Status StoreImpl::KeyRanges(const std::string& name, std::vector<PageRef>* out) {
  RF_RETURN_IF_ERROR(CheckOpen());
  FeatureDef def;
  RF_RETURN_IF_ERROR(FeatureFor(name, &def));
  std::shared_ptr<const Version> v;
  {
    MutexLock l(&mu_);
    v = versions_.current();
  }
  out->clear();
  if (def.id < v->features.size() && v->features[def.id]) *out = *v->features[def.id];  // sorted by min_key
  return Status::OK();
}

Status StoreImpl::AccountScan(const std::string& name, ReadStats* st) {
  const double t0 = Now();
  RF_RETURN_IF_ERROR(CheckOpen());
  FeatureDef def;
  RF_RETURN_IF_ERROR(FeatureFor(name, &def));
  MutexLock wl(&write_mu_);  // the tables belong to the writer side
  const FeatureState* f = features_.Get(def.id);
  double encoded = 0;
  for (uint32_t p : f->pages)
    for (const auto& sm : pages_.at(p).segs)
      if (sm.fid == def.id && !sm.retired) encoded += sm.live_disk_bytes();
  *st = ReadStats();
  st->pages_read = f->pages.size();
  std::vector<uint32_t> pids(f->pages.begin(), f->pages.end());
  std::sort(pids.begin(), pids.end());
  st->read_requests = CoalescePages(pids, PagesPerRead()).size();
  st->bytes_read = f->pages.size() * static_cast<uint64_t>(o_.page_size);
  st->useful_bytes = f->live_bytes;
  st->encoded_bytes = encoded;
  st->items = f->live_items;
  st->seconds = Now() - t0;
  return Status::OK();
}

}  // namespace recflash
