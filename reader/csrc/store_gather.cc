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
// Embedding rows (the NDP engine's gather)

Status StoreImpl::GatherRows(const std::string& name, const uint64_t* ids, size_t n, bool vector_grained,
                             uint32_t dense_page_rows, float* out, GatherStats* st) {
  std::vector<GatherRequest> one(1);
  one[0].feature = name;
  one[0].ids = ids;
  one[0].n = n;
  one[0].out = out;
  one[0].stats = st;
  return GatherRowsMany(one, vector_grained, dense_page_rows, nullptr);
}

BlockSums* StoreImpl::LoadedBlockSums() {
  if (!o_.verify_block_reads || !block_sums_) return nullptr;
  std::call_once(block_sums_loaded_, [this] { block_sums_->Load(StoreFileName(path_, FileKind::kBlockSums)); });
  return block_sums_.get();
}

// One GatherRowsMany call: where each requested row is (resolved under mu_ with the version),
// the reads planned from that, and the hand-off of each finished request to `done`.
class StoreImpl::Gather {
 public:
  Gather(StoreImpl* s, const std::vector<GatherRequest>& reqs_, std::vector<FeatureDef> defs_, bool vector_grained_,
         uint32_t dense_page_rows_, const GatherDoneFn& done_, double t0_)
      : s_(s), reqs(reqs_), defs(std::move(defs_)), nr(reqs_.size()), ps(s->o_.page_size),
        vector_grained(vector_grained_), dense_page_rows(dense_page_rows_), done(done_), t0(t0_), locs(nr),
        deferred(nr, 0), pending(nr, 0) {}

  // Buffered rows are copied out; every other row gets its page (or an error naming it).
  // Registers the version read (the caller holds a VersionSet::Reader on v->number).
  Status Resolve();
  // Splits the rows into block-granular reads at computed addresses (`needs`) and rows read
  // with their whole page (`by_page`).
  void Plan();
  // Moves the rows of dense pages (dense_page_rows) from `needs` to `by_page`; drops the held
  // rows (GatherRequest::have) that no page read brings.
  void PlanDensePages();
  // The block reads, verified against block checksums; a block whose page has no sums for its
  // version moves its rows to the page path (first touch).
  Status ReadBlocks();
  // The whole-page reads (checksum verified), taking block sums where asked.
  Status ReadWholePages();
  // Hands every finished request to `done`.
  Status RunReady();

  std::shared_ptr<const Version> v;
  BlockSums* sums = nullptr;

 private:
  static constexpr uint32_t kNone = UINT32_MAX;
  // A row at a computed address in a packed page.
  struct Need {
    uint64_t off;
    uint64_t seq;  // the page version the address was computed for
    uint32_t r, i;
    bool held = false;  // the caller has the row (GatherRequest::have)
  };
  struct PageNeed {
    uint32_t page, r, i;
    bool take_sums;  // record the page's block checksums (not held for this version)
    bool dense = false;  // read whole as one of the call's dense pages (dense_page_rows)
    bool held = false;   // the caller has the row: rewritten from the page, not counted
  };
  // Rows still to arrive per request; a request is ready when its count reaches 0.
  void Arrived(uint32_t r) {
    if (--pending[r] == 0) ready.push_back(r);
  }

  StoreImpl* const s_;
  const std::vector<GatherRequest>& reqs;
  const std::vector<FeatureDef> defs;
  const size_t nr;
  const uint32_t ps;
  const bool vector_grained;
  const uint32_t dense_page_rows;
  const GatherDoneFn& done;
  const double t0;
  std::vector<std::vector<uint32_t>> locs;
  std::vector<uint8_t> deferred;  // the request's table keeps no key index (see KeyIndex)
  std::vector<size_t> pending;
  std::vector<size_t> ready;
  std::vector<Need> needs;
  std::vector<PageNeed> by_page;
};

Status StoreImpl::Gather::Resolve() {
  MutexLock l(&s_->mu_);
  if (s_->closed_) return Status::Closed("store '" + s_->path_ + "' is closed");
  for (size_t r = 0; r < nr; r++) {
    const GatherRequest& q = reqs[r];
    const FeatureDef& def = defs[r];
    const uint32_t w = def.fixed_width();
    std::vector<uint32_t>& loc = locs[r];
    loc.assign(q.n, kNone);
    FeatureBuffer* fb = s_->buffer_.find(def.id);
    if (fb) fb->Normalize();
    const FeatureState* f = s_->ReaderFeatures().Get(def.id);
    size_t hint = 0, j = 0;
    for (size_t i = 0; i < q.n; i++) {
      if (fb) {
        const BufferedItems& b = fb->items();
        j = std::lower_bound(b.keys.begin() + j, b.keys.end(), q.ids[i]) - b.keys.begin();
        if (j < b.size() && b.keys[j] == q.ids[i]) {
          if (b.tomb[j])
            return Status::InvalidArgument("row " + std::to_string(q.ids[i]) + " of table '" + q.feature + "' was deleted");
          std::memcpy(q.out + i * def.dim, b.value(j), w);
          q.stats->buffer_rows += !(q.have && q.have[i]);
          continue;
        }
      }
      auto not_stored = [&](uint64_t id) {
        return Status::InvalidArgument("row " + std::to_string(id) + " is not in table '" + q.feature + "' (" +
                                       std::to_string(f->live_items) + " rows stored)");
      };
      if (f->index.deferred()) {  // the one segment whose key range holds the row (checked on read)
        deferred[r] = 1;
        loc[i] = s_->versions_.current()->DeferredPage(def.id, q.ids[i]);
        if (loc[i] == UINT32_MAX) return not_stored(q.ids[i]);
        continue;
      }
      const int64_t pos = f->index.FindFrom(q.ids[i], &hint);
      if (pos == KeyIndex::kAbsent || (f->index.loc(static_cast<size_t>(pos)) & KeyIndex::kTomb))
        return not_stored(q.ids[i]);
      loc[i] = f->index.loc(static_cast<size_t>(pos));
    }
  }
  s_->versions_.AssertHeld();
  v = s_->versions_.RegisterLocked();
  return Status::OK();
}

void StoreImpl::Gather::Plan() {
  static const std::vector<PageRef> kNoRefs;
  for (uint32_t r = 0; r < nr; r++) {
    const GatherRequest& q = reqs[r];
    const FeatureDef& def = defs[r];
    const uint32_t w = def.fixed_width();
    const uint64_t row_base = SoloRowBase(w);
    const std::vector<PageRef>& refs =
        def.id < v->features.size() && v->features[def.id] ? *v->features[def.id] : kNoRefs;
    for (uint32_t i = 0; i < q.n; i++) {
      const uint32_t loc = locs[r][i];
      if (loc == kNone) continue;
      const bool held = q.have && q.have[i];  // counted and read only with a dense page (below)
      if (!held) pending[r]++;
      const PageRef* ref = nullptr;
      auto it = std::upper_bound(refs.begin(), refs.end(), q.ids[i], [](uint64_t k, const PageRef& x) { return k < x.min_key; });
      for (int steps = 0; it != refs.begin() && steps < 16; steps++) {
        --it;
        if (it->page == loc) {
          ref = &*it;
          break;
        }
      }
      if (vector_grained && ref && ref->solo && ref->tombs == 0 && ref->valid == ref->count &&
          ref->max_key - ref->min_key + 1 == ref->count) {
        needs.push_back({static_cast<uint64_t>(loc) * ps + row_base + (q.ids[i] - ref->min_key) * w, ref->seq, r, i, held});
      } else if (!held) {
        by_page.push_back({loc, r, i, false});
      }
    }
  }
  PlanDensePages();
  for (uint32_t r = 0; r < nr; r++)
    if (pending[r] == 0) ready.push_back(r);
}

void StoreImpl::Gather::PlanDensePages() {
  // Dense pages: read whole, in runs with adjacent ones (ReadWholePages), instead of block by
  // block. A page next to one read whole joins it (and so on along touched neighbours): 16 KiB
  // more of a request already made costs less device time than a request of its own. Rows the
  // caller holds count towards a page's rows, so a cache does not thin out dense pages, but a
  // page is read only for a row the caller lacks. Block sums are taken from pages read whole
  // where not held, for later block reads.
  auto drop_held = [&]() {
    needs.erase(std::remove_if(needs.begin(), needs.end(), [](const Need& n) { return n.held; }), needs.end());
  };
  if (dense_page_rows == 0 || needs.size() < dense_page_rows) return drop_held();
  std::sort(needs.begin(), needs.end(), [](const Need& a, const Need& b) { return a.off < b.off; });
  struct Group {
    uint32_t page;
    size_t a, z;  // needs[a, z)
    bool needed;  // a row the caller lacks
    bool whole;
  };
  std::vector<Group> groups;
  for (size_t a = 0; a < needs.size();) {
    const uint32_t page = static_cast<uint32_t>(needs[a].off / ps);
    size_t z = a + 1;
    bool needed = !needs[a].held;
    while (z < needs.size() && needs[z].off / ps == page) needed |= !needs[z++].held;
    groups.push_back({page, a, z, needed, needed && z - a >= dense_page_rows});
    a = z;
  }
  for (size_t g = 1; g < groups.size(); g++)
    groups[g].whole |= groups[g].needed && groups[g - 1].whole && groups[g - 1].page + 1 == groups[g].page;
  for (size_t g = groups.size(); g-- > 1;)
    groups[g - 1].whole |= groups[g - 1].needed && groups[g].whole && groups[g - 1].page + 1 == groups[g].page;
  std::vector<Need> sparse;
  sparse.reserve(needs.size());
  for (const Group& g : groups) {
    if (!g.whole) {
      for (size_t k = g.a; k < g.z; k++)
        if (!needs[k].held) sparse.push_back(needs[k]);
      continue;
    }
    const bool take_sums = sums && !sums->Has(g.page, needs[g.a].seq);
    for (size_t k = g.a; k < g.z; k++) {
      by_page.push_back({g.page, needs[k].r, needs[k].i, take_sums, true, needs[k].held});
      if (needs[k].held) pending[needs[k].r]++;  // rewritten from the page
    }
  }
  needs.swap(sparse);
}

Status StoreImpl::Gather::RunReady() {
  while (!ready.empty()) {
    const size_t r = ready.back();
    ready.pop_back();
    reqs[r].stats->seconds = Now() - t0;
    if (done) RF_RETURN_IF_ERROR(done(r));
  }
  return Status::OK();
}

Status StoreImpl::Gather::ReadBlocks() {
  if (needs.empty()) return Status::OK();
  // Blocks: each need's device blocks, adjacent ones of a page merged up to 4 KiB. With
  // verification, a block whose page has no sums for this version moves its rows to the
  // page path, which takes the sums (first touch).
  std::sort(needs.begin(), needs.end(), [](const Need& a, const Need& b) { return a.off < b.off; });
  const uint64_t bs = s_->block_size_;
  std::vector<IoRing::Block> blocks;
  std::vector<size_t> first_need;   // blocks[k] serves needs[first_need[k] .. first_need[k + 1])
  std::vector<size_t> first_sum;    // blocks[k]'s expected sums: expect[first_sum[k] ..]
  std::vector<uint32_t> expect;
  std::vector<Need> kept;
  kept.reserve(needs.size());
  auto close_block = [&]() {
    if (blocks.empty() || !sums) return;
    const IoRing::Block& b = blocks.back();
    const uint32_t page = static_cast<uint32_t>(b.offset / ps);
    const uint32_t count = b.len / static_cast<uint32_t>(bs);
    const size_t at = expect.size();
    expect.resize(at + count);
    if (sums->Lookup(page, kept[first_need.back()].seq, static_cast<uint32_t>((b.offset % ps) / bs), count, expect.data() + at)) {
      first_sum.push_back(at);
      return;
    }
    expect.resize(at);
    for (size_t k = first_need.back(); k < kept.size(); k++) by_page.push_back({page, kept[k].r, kept[k].i, true});
    kept.resize(first_need.back());
    blocks.pop_back();
    first_need.pop_back();
  };
  for (const Need& nd : needs) {
    const uint32_t w = defs[nd.r].fixed_width();
    const uint64_t lo = nd.off / bs * bs;
    const uint64_t hi = (nd.off + w + bs - 1) / bs * bs;
    if (!blocks.empty() && lo <= blocks.back().offset + blocks.back().len && hi - blocks.back().offset <= 4096 &&
        lo / ps == blocks.back().offset / ps) {
      blocks.back().len = static_cast<uint32_t>(std::max<uint64_t>(blocks.back().offset + blocks.back().len, hi) -
                                                blocks.back().offset);
    } else {
      close_block();
      blocks.push_back({lo, static_cast<uint32_t>(hi - lo)});
      first_need.push_back(kept.size());
    }
    kept.push_back(nd);
  }
  close_block();
  first_need.push_back(kept.size());
  for (size_t k = 0; k + 1 < first_need.size(); k++) {
    GatherStats* s = reqs[kept[first_need[k]].r].stats;
    s->device_reads++;
    s->device_bytes += blocks[k].len;
    if (sums) s->verified_blocks += blocks[k].len / bs;
    for (size_t x = first_need[k]; x < first_need[k + 1]; x++) reqs[kept[x].r].stats->vector_rows++;
  }
  if (!blocks.empty()) {
    RingLease ring(s_->block_rings_, s_->o_.read_poll_us);
    RF_RETURN_IF_ERROR(ring.Acquire());
    RF_RETURN_IF_ERROR(ring.get()->ReadBlocks(
        s_->file_.fd(), s_->pages_path_, blocks,
        [&](size_t b, const uint8_t* data) -> Status {
          const IoRing::Block& blk = blocks[b];
          if (sums) {
            for (uint32_t j = 0; j < blk.len / bs; j++) {
              const uint32_t got = BlockSums::Sum(data + j * bs, static_cast<uint32_t>(bs));
              const uint32_t want = expect[first_sum[b] + j];
              if (got != want) {
                const Need& nd = kept[first_need[b]];
                return Status::Corruption("block at offset " + std::to_string(blk.offset + j * bs) + " (page " +
                                          std::to_string(blk.offset / ps) + ") of '" + s_->pages_path_ +
                                          "' fails its checksum (taken " + std::to_string(want) + ", read " +
                                          std::to_string(got) + ") reading row " + std::to_string(reqs[nd.r].ids[nd.i]) +
                                          " of '" + reqs[nd.r].feature + "'");
              }
            }
          }
          for (size_t k = first_need[b]; k < first_need[b + 1]; k++) {
            const Need& nd = kept[k];
            const FeatureDef& def = defs[nd.r];
            std::memcpy(reqs[nd.r].out + static_cast<size_t>(nd.i) * def.dim, data + (nd.off - blk.offset), def.fixed_width());
            Arrived(nd.r);
          }
          return Status::OK();
        },
        [this] { return RunReady(); }));
  }
  return Status::OK();
}

Status StoreImpl::Gather::ReadWholePages() {
  if (by_page.empty()) return Status::OK();
  std::sort(by_page.begin(), by_page.end(), [](const PageNeed& a, const PageNeed& b) {
    return a.page != b.page ? a.page < b.page : a.r != b.r ? a.r < b.r : a.i < b.i;
  });
  std::vector<uint32_t> pids;
  for (const PageNeed& p : by_page)
    if (pids.empty() || pids.back() != p.page) pids.push_back(p.page);
  for (uint32_t r = 0; r < nr; r++) {  // per-request page statistics
    std::vector<uint32_t> mine;
    for (const PageNeed& p : by_page)
      if (p.r == r) {
        reqs[r].stats->page_rows += !p.held;
        if (mine.empty() || mine.back() != p.page) {
          if (p.dense)
            reqs[r].stats->dense_pages++;
          else if (p.take_sums)
            reqs[r].stats->first_touch_pages++;
        }
        if (mine.empty() || mine.back() != p.page) mine.push_back(p.page);
      }
    if (mine.empty()) continue;
    reqs[r].stats->device_reads += CoalescePages(mine, s_->rings_ ? s_->PagesPerRead() : 1).size();
    reqs[r].stats->device_bytes += mine.size() * static_cast<uint64_t>(ps);
  }
  std::vector<uint64_t> keys;
  RingLease ring(s_->rings_, s_->o_.read_poll_us);
  RF_RETURN_IF_ERROR(ring.Acquire());
  Status rs = s_->ReadPages(ring.get(), pids, [&](uint32_t pid, const PageView& pv) -> Status {
    if (s_->o_.read_only && pv.seq() != s_->OpenedPageSeq(pid))
      return Status::Stale("store '" + s_->path_ + "': page " + std::to_string(pid) + " of '" + s_->pages_path_ +
                           "' was rewritten by a writer since this read-only handle opened; reopen the store");
    // Pages complete in any order (io_uring), so find this page's rows by search.
    size_t cursor = std::lower_bound(by_page.begin(), by_page.end(), pid,
                                     [](const PageNeed& a, uint32_t p) { return a.page < p; }) - by_page.begin();
    uint32_t decoded_fid = UINT32_MAX;
    SegmentView sv;
    bool take_sums = false;
    for (; cursor < by_page.size() && by_page[cursor].page == pid; cursor++) {
      const PageNeed& pn = by_page[cursor];
      const GatherRequest& q = reqs[pn.r];
      const FeatureDef& def = defs[pn.r];
      take_sums |= pn.take_sums;
      if (def.id != decoded_fid) {
        if (!pv.Find(def.id, &sv))
          return Status::Corruption("page " + std::to_string(pid) + " of '" + s_->pages_path_ + "' lacks the segment of '" +
                                    q.feature + "' that the key index names");
        sv.width = def.fixed_width();
        RF_RETURN_IF_ERROR(store_internal::CheckSegmentFits(sv, pid, s_->pages_path_, def));
        keys.resize(sv.count);
        sv.DecodeKeys(keys.data());
        decoded_fid = def.id;
      }
      auto f = std::lower_bound(keys.begin(), keys.end(), q.ids[pn.i]);
      if ((f == keys.end() || *f != q.ids[pn.i]) && deferred[pn.r])  // a gap in the segment's key range
        return Status::InvalidArgument("row " + std::to_string(q.ids[pn.i]) + " is not in table '" + q.feature + "'");
      if (f == keys.end() || *f != q.ids[pn.i])
        return Status::Corruption("page " + std::to_string(pid) + " of '" + s_->pages_path_ + "' lacks row " +
                                  std::to_string(q.ids[pn.i]) + " of '" + q.feature + "' that the key index names");
      const uint8_t* p;
      uint32_t len;
      sv.Value(static_cast<uint32_t>(f - keys.begin()), &p, &len);
      std::memcpy(q.out + static_cast<size_t>(pn.i) * def.dim, p, def.fixed_width());
      Arrived(pn.r);
    }
    if (take_sums && sums) sums->Record(pid, pv.seq(), pv.data());
    return Status::OK();
  });
  if (!rs.ok()) return s_->ExplainReadFailure(rs);
  RF_RETURN_IF_ERROR(RunReady());
  return Status::OK();
}

Status StoreImpl::GatherRowsMany(const std::vector<GatherRequest>& reqs, bool vector_grained, uint32_t dense_page_rows,
                                 const GatherDoneFn& done) {
  const double t0 = Now();
  RF_RETURN_IF_ERROR(CheckOpen());
  RF_RETURN_IF_ERROR(CheckReadable());
  RF_RETURN_IF_ERROR(EnsureKeyIndex());
  // Block reads are verified against checksums a whole-page read took; a read-only handle may
  // race a writer reusing slots, so it reads whole (verified, seq-checked) pages only.
  if (o_.read_only) vector_grained = false;
  std::vector<FeatureDef> defs(reqs.size());
  for (size_t r = 0; r < reqs.size(); r++) {
    const GatherRequest& q = reqs[r];
    RF_RETURN_IF_ERROR(FeatureFor(q.feature, &defs[r]));
    RF_RETURN_IF_ERROR(LoadIndex(FeatureStateFor(defs[r].id)));
    if (defs[r].type != ValueType::kFixedFloat32)
      return Status::Schema("feature '" + q.feature + "' is " + defs[r].TypeString() +
                            "; embedding rows need fixed_size_list<float32, D>");
    for (size_t i = 1; i < q.n; i++)
      if (q.ids[i] <= q.ids[i - 1]) return Status::InvalidArgument("row ids for '" + q.feature + "' must be ascending and unique");
    *q.stats = GatherStats();
    q.stats->rows = q.n;
    if (q.have)
      for (size_t i = 0; i < q.n; i++) q.stats->rows -= q.have[i] != 0;
  }
  Gather g(this, reqs, std::move(defs), vector_grained, dense_page_rows, done, t0);
  RF_RETURN_IF_ERROR(g.Resolve());
  VersionSet::Reader guard(&versions_, g.v->number);
  g.sums = vector_grained ? LoadedBlockSums() : nullptr;
  g.Plan();
  RF_RETURN_IF_ERROR(g.ReadBlocks());
  RF_RETURN_IF_ERROR(g.RunReady());
  RF_RETURN_IF_ERROR(g.ReadWholePages());
  return g.RunReady();
}

Status StoreImpl::VerifyRows(const std::string& name, uint64_t* pages_read) {
  *pages_read = 0;
  RF_RETURN_IF_ERROR(CheckOpen());
  RF_RETURN_IF_ERROR(CheckReadable());
  FeatureDef def;
  RF_RETURN_IF_ERROR(FeatureFor(name, &def));
  if (def.type != ValueType::kFixedFloat32)
    return Status::Schema("feature '" + name + "' is " + def.TypeString() + "; embedding rows need fixed_size_list<float32, D>");
  BlockSums* sums = LoadedBlockSums();
  if (!sums) return Status::OK();
  std::shared_ptr<const Version> v;
  {
    MutexLock l(&mu_);
    if (closed_) return Status::Closed("store '" + path_ + "' is closed");
    versions_.AssertHeld();
    v = versions_.RegisterLocked();
  }
  VersionSet::Reader guard(&versions_, v->number);
  if (def.id >= v->features.size() || !v->features[def.id]) return Status::OK();
  std::vector<uint32_t> pids;
  for (const PageRef& ref : *v->features[def.id])
    if (ref.solo && ref.tombs == 0 && ref.valid == ref.count && ref.max_key - ref.min_key + 1 == ref.count &&
        !sums->Has(ref.page, ref.seq))
      pids.push_back(ref.page);
  std::sort(pids.begin(), pids.end());
  pids.erase(std::unique(pids.begin(), pids.end()), pids.end());
  if (pids.empty()) return Status::OK();
  RingLease ring(rings_, o_.read_poll_us);
  RF_RETURN_IF_ERROR(ring.Acquire());
  RF_RETURN_IF_ERROR(ReadPages(ring.get(), pids, [&](uint32_t pid, const PageView& pv) -> Status {
    sums->Record(pid, pv.seq(), pv.data());
    return Status::OK();
  }));
  *pages_read = pids.size();
  return Status::OK();
}

}  // namespace recflash
