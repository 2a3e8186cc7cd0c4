#include "reader/csrc/store.h"

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
// Read path

namespace {

// Page id -> position in a feature's page list: open addressing, a few ns per lookup
// whatever the page ids (a flat table over the id range could be megabytes for a
// three-page feature of a large store).
class ChunkOfPage {
 public:
  explicit ChunkOfPage(const std::vector<PageRef>& refs) {
    size_t cap = 16;
    while (cap < 2 * refs.size()) cap <<= 1;
    mask_ = cap - 1;
    slots_.assign(cap, {UINT32_MAX, -1});
    for (size_t j = 0; j < refs.size(); j++) {
      size_t h = Hash(refs[j].page);
      while (slots_[h].first != UINT32_MAX) h = (h + 1) & mask_;
      slots_[h] = {refs[j].page, static_cast<int32_t>(j)};
    }
  }
  int32_t Find(uint32_t page) const {
    for (size_t h = Hash(page);; h = (h + 1) & mask_) {
      if (slots_[h].first == page) return slots_[h].second;
      if (slots_[h].first == UINT32_MAX) return -1;
    }
  }

 private:
  size_t Hash(uint32_t page) const { return (page * 0x9E3779B1u) & mask_; }
  size_t mask_;
  std::vector<std::pair<uint32_t, int32_t>> slots_;
};

}  // namespace

Status Store::ReadPages(IoRing* ring, const std::vector<uint32_t>& sorted_pids, const PageFn& fn) {
  const uint32_t ps = o_.page_size;
  const auto runs = CoalescePages(sorted_pids, ring->slot_bytes() / ps);
  return ring->ReadRuns(file_.fd(), pages_path_, ps, runs, [&](const PageRun& run, const uint8_t* data) -> Status {
    for (uint32_t k = 0; k < run.count; k++) {
      PageView pv;
      RF_RETURN_IF_ERROR(PageView::Parse(data + static_cast<size_t>(k) * ps, ps, run.first + k, pages_path_, &pv));
      RF_RETURN_IF_ERROR(fn(run.first + k, pv));
    }
    return Status::OK();
  });
}

void Store::FinishRead(uint64_t pages, uint64_t useful, double encoded, uint64_t items, double t0, ReadStats* st) {
  st->pages_read = pages;
  st->bytes_read = pages * static_cast<uint64_t>(o_.page_size);
  st->useful_bytes = useful;
  st->encoded_bytes = encoded;
  st->items = items;
  st->seconds = Now() - t0;
  pages_read_ += st->pages_read;
  bytes_read_ += st->bytes_read;
  useful_bytes_read_ += useful;
  encoded_bytes_read_ = encoded_bytes_read_ + encoded;
  reads_++;
}

Status Store::ScanMany(const std::vector<std::string>& names, uint64_t lo, uint64_t hi, std::vector<ColumnData>* out,
                       ReadStats* st) {
  const double t0 = Now();
  RF_RETURN_IF_ERROR(CheckOpen());
  RF_RETURN_IF_ERROR(CheckReadable());
  const size_t nf = names.size();
  const bool to_end = hi == UINT64_MAX;
  // Upper-bound position of hi in a sorted key array.
  auto upper = [&](const uint64_t* b, const uint64_t* e) { return to_end ? e : std::lower_bound(b, e, hi); };
  std::vector<FeatureDef> defs(nf);
  for (size_t i = 0; i < nf; i++) {
    RF_RETURN_IF_ERROR(FeatureFor(names[i], &defs[i]));
    // Checkpointed key indexes decode on first use; the index-guided merge below needs them.
    if (FeatureState* f = FeatureStateFor(defs[i].id)) RF_RETURN_IF_ERROR(LoadIndex(f));
  }
  out->assign(nf, ColumnData());
  std::vector<BufferedItems> buf(nf);
  std::shared_ptr<const Version> v;
  // Sparse-key features whose pages overlap (after updates) are resolved through a private
  // copy of their key index: it names the page of every key's current version, so the
  // output is one pass in key order with a cursor per page — no comparisons between pages.
  // The copy is taken with the version under mu_ so both describe the same state.
  std::vector<std::vector<uint64_t>> ikeys(nf);
  std::vector<std::vector<uint32_t>> ilocs(nf);
  std::vector<uint8_t> indexed(nf, 0);
  {
    std::lock_guard<std::mutex> l(mu_);
    if (closed_) return Status::Closed("store '" + path_ + "' is closed");
    v = versions_.RegisterLocked();
    for (size_t i = 0; i < nf; i++) {
      if (FeatureBuffer* fb = buffer_.find(defs[i].id)) fb->CopyRange(lo, hi, &buf[i]);
      if (index_ahead_ || o_.accounting || defs[i].id >= v->features.size() || !v->features[defs[i].id]) continue;
      const FeatureState* f = features_.Get(defs[i].id);
      if (!f || f->index.dense()) continue;  // dense keys: the scatter below is as fast
      const auto& rs = *v->features[defs[i].id];
      bool overlapping = false;
      for (size_t j = 0; j < rs.size() && !overlapping; j++)
        overlapping = rs[j].valid != rs[j].count || rs[j].tombs || (j > 0 && rs[j - 1].max_key >= rs[j].min_key);
      if (!overlapping) continue;  // direct placement or a plain concatenation
      f->index.CopyRange(lo, hi, &ikeys[i], &ilocs[i]);
      indexed[i] = 1;
    }
  }
  VersionSet::Reader guard(&versions_, v->number);
  if (lo >= hi && !to_end) hi = lo;  // empty range

  // Pages per feature overlapping [lo, hi); a page shared by several features is read once.
  std::vector<std::vector<PageRef>> refs(nf);
  std::unordered_map<uint32_t, std::vector<std::pair<uint32_t, uint32_t>>> users;
  std::vector<uint32_t> pids;
  for (size_t i = 0; i < nf; i++) {
    if ((lo >= hi && !to_end) || defs[i].id >= v->features.size() || !v->features[defs[i].id]) continue;
    for (const PageRef& r : *v->features[defs[i].id]) {
      if (r.max_key < lo || (!to_end && r.min_key >= hi)) continue;
      auto& u = users[r.page];
      if (u.empty()) pids.push_back(r.page);
      u.emplace_back(static_cast<uint32_t>(i), static_cast<uint32_t>(refs[i].size()));
      refs[i].push_back(r);
    }
  }
  std::sort(pids.begin(), pids.end());

  struct Chunk {
    uint64_t seq = 0;
    double enc = 0;     // encoded bytes per record
    bool clean = true;  // no stale records and no tombstones
    std::vector<uint64_t> keys;
    std::vector<uint8_t> tomb;
    std::vector<uint8_t> vals;
    std::vector<uint32_t> lens;  // variable-width only
  };
  std::vector<std::vector<Chunk>> chunks(nf);
  for (size_t i = 0; i < nf; i++) chunks[i].resize(refs[i].size());
  // Direct placement: a fixed-width feature whose pages are clean (no stale records, no
  // tombstones) and hold disjoint key ranges, with nothing buffered in the range, decodes
  // each page straight into its final place in the output — no intermediate copy, no merge.
  std::vector<uint8_t> direct(nf, 0);
  std::vector<std::vector<uint64_t>> slot(nf);               // output start of each page
  std::vector<std::vector<std::pair<uint32_t, uint32_t>>> span(nf);  // [a, z) kept per page
  for (size_t i = 0; i < nf; i++) {
    const auto& rs = refs[i];
    bool ok = defs[i].fixed_width() > 0 && buf[i].size() == 0;
    for (size_t j = 0; j < rs.size() && ok; j++)
      ok = rs[j].valid == rs[j].count && rs[j].tombs == 0 && (j == 0 || rs[j - 1].max_key < rs[j].min_key);
    if (!ok) continue;
    direct[i] = 1;
    uint64_t total = 0;
    slot[i].resize(rs.size());
    span[i].assign(rs.size(), {0, 0});
    for (size_t j = 0; j < rs.size(); j++) {
      slot[i][j] = total;
      total += rs[j].count;
    }
    (*out)[i].keys.resize(total);
    (*out)[i].values.resize(total * defs[i].fixed_width());
  }
  double encoded = 0;
  auto cb = [&](uint32_t pid, const PageView& pv) -> Status {
    for (const auto& [i, j] : users[pid]) {
      const FeatureDef& def = defs[i];
      if (pv.seq() != refs[i][j].seq)
        return Status::Stale("store '" + path_ + "': page " + std::to_string(pid) + " of '" + pages_path_ +
                             "' was rewritten by a writer since this read-only handle opened (seq " +
                             std::to_string(pv.seq()) + ", snapshot expects " + std::to_string(refs[i][j].seq) +
                             "); reopen the store to read the current data");
      SegmentView sv;
      if (!pv.Find(def.id, &sv))
        return Status::Corruption("page " + std::to_string(pid) + " of '" + pages_path_ +
                                  "' lacks the segment of feature '" + def.name + "' that the metadata lists");
      sv.width = def.fixed_width();
      if (direct[i]) {
        if (sv.count != refs[i][j].count)
          return Status::Corruption("page " + std::to_string(pid) + " of '" + pages_path_ + "': feature '" +
                                    def.name + "' segment has " + std::to_string(sv.count) +
                                    " records, the metadata says " + std::to_string(refs[i][j].count));
        ColumnData& col = (*out)[i];
        uint64_t* kp = col.keys.data() + slot[i][j];
        sv.DecodeKeys(kp);
        uint32_t a = 0, z = sv.count;
        if (sv.min_key < lo) a = static_cast<uint32_t>(std::lower_bound(kp, kp + sv.count, lo) - kp);
        if (!to_end && sv.max_key >= hi) z = static_cast<uint32_t>(upper(kp, kp + sv.count) - kp);
        span[i][j] = {a, z};
        encoded += (z - a) * sv.bytes_per_record();
        std::memcpy(col.values.data() + (slot[i][j] + a) * sv.width, sv.values + static_cast<size_t>(a) * sv.width,
                    static_cast<size_t>(z - a) * sv.width);
        continue;
      }
      Chunk& c = chunks[i][j];
      c.keys.resize(sv.count);  // decoded in place; trimmed to [lo, hi) when partial
      sv.DecodeKeys(c.keys.data());
      const size_t a = sv.min_key < lo ? std::lower_bound(c.keys.begin(), c.keys.end(), lo) - c.keys.begin() : 0;
      const size_t z = !to_end && sv.max_key >= hi ? upper(c.keys.data(), c.keys.data() + sv.count) - c.keys.data()
                                                   : sv.count;
      c.seq = pv.seq();
      c.enc = sv.bytes_per_record();
      c.clean = refs[i][j].valid == refs[i][j].count && !sv.tomb;
      if (z < sv.count) c.keys.resize(z);
      if (a > 0) c.keys.erase(c.keys.begin(), c.keys.begin() + a);
      if (sv.tomb) {
        c.tomb.resize(z - a);
        for (size_t r = a; r < z; r++) c.tomb[r - a] = sv.is_tomb(static_cast<uint32_t>(r));
      }
      if (sv.width) {
        c.vals.assign(sv.values + a * sv.width, sv.values + z * sv.width);
      } else {
        for (size_t r = a; r < z; r++) {
          const uint8_t* p;
          uint32_t len;
          sv.Value(static_cast<uint32_t>(r), &p, &len);
          c.vals.insert(c.vals.end(), p, p + len);
          c.lens.push_back(len);
        }
      }
    }
    return Status::OK();
  };
  if (!pids.empty()) {
    RingLease ring(rings_.get());
    RF_RETURN_IF_ERROR(ring.Acquire());
    Status rs = ReadPages(ring.get(), pids, cb);
    if (!rs.ok()) return ExplainReadFailure(rs);
  }

  uint64_t useful = 0, items = 0;
  for (size_t i = 0; i < nf; i++) {
    const FeatureDef& def = defs[i];
    const uint32_t w = def.fixed_width();
    const uint32_t elem = def.element_size();
    ColumnData& col = (*out)[i];
    if (direct[i]) {
      // Close the gaps left by range boundaries (only the first and last page are partial).
      uint64_t wpos = 0;
      for (size_t j = 0; j < refs[i].size(); j++) {
        const auto [a, z] = span[i][j];
        const uint64_t from = slot[i][j] + a;
        if (from != wpos && z > a) {
          std::memmove(col.keys.data() + wpos, col.keys.data() + from, (z - a) * 8ull);
          std::memmove(col.values.data() + wpos * w, col.values.data() + from * w, static_cast<size_t>(z - a) * w);
        }
        wpos += z - a;
      }
      col.keys.resize(wpos);
      col.values.resize(wpos * w);
      useful += wpos * ItemBytes(w);
      items += wpos;
      continue;
    }
    auto& cs = chunks[i];
    const BufferedItems& b = buf[i];
    // Chunks (one per page) in order of first key.
    std::vector<uint32_t> order;
    size_t total = 0, vbytes = 0;
    for (uint32_t c = 0; c < cs.size(); c++) {
      if (cs[c].keys.empty()) continue;
      order.push_back(c);
      total += cs[c].keys.size();
      vbytes += cs[c].vals.size();
    }
    std::sort(order.begin(), order.end(), [&](uint32_t a, uint32_t c) {
      return cs[a].keys.front() < cs[c].keys.front() ||
             (cs[a].keys.front() == cs[c].keys.front() && cs[a].seq > cs[c].seq);
    });
    std::vector<std::vector<uint64_t>> voff(w ? 0 : cs.size());  // value byte offsets per chunk
    for (size_t c = 0; c < voff.size(); c++) {
      voff[c].resize(cs[c].lens.size() + 1, 0);
      for (size_t r = 0; r < cs[c].lens.size(); r++) voff[c][r + 1] = voff[c][r] + cs[c].lens[r];
    }
    col.keys.reserve(total + b.size());
    col.values.reserve(vbytes + b.arena.size());
    if (!w) col.offsets.push_back(0);
    uint64_t out_bytes = 0;
    size_t k = 0;  // buffer cursor
    auto emit_buf = [&](size_t e) {
      if (b.tomb[e]) return;
      col.keys.push_back(b.keys[e]);
      col.values.insert(col.values.end(), b.value(e), b.value(e) + b.len[e]);
      out_bytes += b.len[e];
      if (!w) col.offsets.push_back(static_cast<int32_t>(out_bytes / elem));
    };
    // Copies records [r0, r1) of a chunk: all are current versions (tombstones skipped).
    auto copy_disk = [&](uint32_t c, uint32_t r0, uint32_t r1) {
      const Chunk& ch = cs[c];
      if (r0 >= r1) return;
      encoded += (r1 - r0) * ch.enc;
      if (ch.tomb.empty()) {
        col.keys.insert(col.keys.end(), ch.keys.begin() + r0, ch.keys.begin() + r1);
        if (w) {
          col.values.insert(col.values.end(), ch.vals.begin() + static_cast<size_t>(r0) * w,
                            ch.vals.begin() + static_cast<size_t>(r1) * w);
          out_bytes += static_cast<uint64_t>(r1 - r0) * w;
          useful += static_cast<uint64_t>(r1 - r0) * ItemBytes(w);
        } else {
          col.values.insert(col.values.end(), ch.vals.begin() + voff[c][r0], ch.vals.begin() + voff[c][r1]);
          for (uint32_t r = r0; r < r1; r++) {
            out_bytes += ch.lens[r];
            useful += ItemBytes(ch.lens[r]);
            col.offsets.push_back(static_cast<int32_t>(out_bytes / elem));
          }
        }
        return;
      }
      for (uint32_t r = r0; r < r1; r++) {
        if (ch.tomb[r]) continue;
        col.keys.push_back(ch.keys[r]);
        const uint32_t len = w ? w : ch.lens[r];
        const uint64_t off = w ? static_cast<uint64_t>(r) * w : voff[c][r];
        col.values.insert(col.values.end(), ch.vals.begin() + off, ch.vals.begin() + off + len);
        out_bytes += len;
        useful += ItemBytes(len);
        if (!w) col.offsets.push_back(static_cast<int32_t>(out_bytes / elem));
      }
    };
    // A run of winning records, overlaid with the buffered writes (which are newer).
    auto emit_run = [&](uint32_t c, uint32_t r0, uint32_t r1) {
      const Chunk& ch = cs[c];
      while (k < b.size() && b.keys[k] < ch.keys[r0]) emit_buf(k++);
      uint32_t r = r0;
      while (r < r1) {
        if (k < b.size() && b.keys[k] <= ch.keys[r1 - 1]) {
          const uint64_t bk = b.keys[k];
          uint32_t rr = static_cast<uint32_t>(std::lower_bound(ch.keys.begin() + r, ch.keys.begin() + r1, bk) - ch.keys.begin());
          copy_disk(c, r, rr);
          emit_buf(k++);
          if (rr < r1 && ch.keys[rr] == bk) rr++;  // overridden by the buffer
          r = rr;
        } else {
          copy_disk(c, r, r1);
          r = r1;
        }
      }
    };
    // Index-guided merge: walk the index copy in key order; each key's record is the next
    // record of its page's chunk at or after that chunk's cursor (stale records are skipped
    // on the way). Any disagreement between index and pages falls back to the k-way merge.
    if (indexed[i]) {
      const uint64_t useful0 = useful;
      const double encoded0 = encoded;
      const auto& ik = ikeys[i];
      const auto& il = ilocs[i];
      const ChunkOfPage chunk_of(refs[i]);
      std::vector<uint32_t> cur(cs.size(), 0);
      const size_t nb = b.size();
      // on_buf(e) for a buffered entry (newer than any page), on_disk(c, r) for the record
      // holding a key's current version. False when the index and the pages disagree.
      auto walk = [&](auto&& on_buf, auto&& on_disk) -> bool {
        for (size_t e = 0; e < ik.size(); e++) {
          const uint64_t key = ik[e];
          while (k < nb && b.keys[k] < key) on_buf(k++);
          if (k < nb && b.keys[k] == key) {
            on_buf(k++);
            continue;
          }
          const uint32_t loc = il[e];
          if (loc & KeyIndex::kTomb) continue;
          const int32_t cj = chunk_of.Find(loc);
          if (cj < 0) return false;
          const uint32_t c = static_cast<uint32_t>(cj);
          const Chunk& ch = cs[c];
          const uint32_t cn = static_cast<uint32_t>(ch.keys.size());
          uint32_t r = cur[c];
          while (r < cn && ch.keys[r] < key) r++;
          if (r == cn || ch.keys[r] != key || (!ch.tomb.empty() && ch.tomb[r])) return false;
          cur[c] = r + 1;
          on_disk(c, r);
        }
        while (k < nb) on_buf(k++);
        return true;
      };
      bool ok;
      if (w) {
        // Output sized for the worst case up front, written through raw pointers.
        col.keys.resize(ik.size() + nb);
        col.values.resize((ik.size() + nb) * static_cast<size_t>(w));
        uint64_t* kp = col.keys.data();
        uint8_t* vp = col.values.data();
        size_t o = 0, from_disk = 0;
        auto put = [&](uint64_t key, const uint8_t* val) {
          kp[o] = key;
          if (w == 8) std::memcpy(vp + o * 8, val, 8);
          else if (w == 4) std::memcpy(vp + o * 4, val, 4);
          else std::memcpy(vp + o * w, val, w);
          o++;
        };
        ok = walk([&](size_t e) { if (!b.tomb[e]) put(b.keys[e], b.value(e)); },
                  [&](uint32_t c, uint32_t r) {
                    const Chunk& ch = cs[c];
                    encoded += ch.enc;
                    from_disk++;
                    put(ch.keys[r], ch.vals.data() + static_cast<size_t>(r) * w);
                  });
        if (ok) {
          useful += from_disk * ItemBytes(w);
          col.keys.resize(o);
          col.values.resize(o * static_cast<size_t>(w));
        }
      } else {
        col.keys.reserve(ik.size() + nb);
        ok = walk(emit_buf, [&](uint32_t c, uint32_t r) { copy_disk(c, r, r + 1); });
      }
      if (ok) {
        order.clear();  // resolved: skip the merges below
        index_merges_++;
      } else {
        index_merge_fallbacks_++;
        useful = useful0;
        encoded = encoded0;
        col.keys.clear();
        col.values.clear();
        col.offsets.clear();
        if (!w) col.offsets.push_back(0);
        out_bytes = 0;
        k = 0;
      }
    }
    // K-way merge of the chunks by (key, newest seq first), emitting maximal runs of one
    // chunk at a time: a run extends while its keys stay below every other chunk's next key,
    // so non-overlapping pages cost one bulk copy each and only interleaved stretches pay
    // for heap operations. An older version of an emitted key is skipped.
    // Dense keys (the usual case: item ids): scatter each page's records into a slot per key,
    // pages in ascending seq so the newest version lands last, then sweep the slots in key
    // order. O(records + key span), no comparisons between pages. Windows bound the memory.
    uint64_t kmin = UINT64_MAX, kmax = 0;
    for (uint32_t c : order) {
      kmin = std::min(kmin, cs[c].keys.front());
      kmax = std::max(kmax, cs[c].keys.back());
    }
    const bool dense = order.size() > 1 && kmax - kmin < 2 * total + 4096;
    if (dense) {
      constexpr uint64_t kWindow = 1u << 22;
      std::vector<uint32_t> by_seq(order);
      std::sort(by_seq.begin(), by_seq.end(), [&](uint32_t a, uint32_t c) { return cs[a].seq < cs[c].seq; });
      std::vector<uint32_t> wc(std::min<uint64_t>(kWindow, kmax - kmin + 1)), wr(wc.size());
      std::vector<uint32_t> cur(cs.size(), 0);
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
          while (k < b.size() && b.keys[k] < key) emit_buf(k++);
          if (k < b.size() && b.keys[k] == key) {
            emit_buf(k++);  // the buffered write is newer
            continue;
          }
          const uint32_t c = wc[x] - 1, r = wr[x];
          const Chunk& ch = cs[c];
          if (!ch.tomb.empty() && ch.tomb[r]) continue;
          encoded += ch.enc;
          col.keys.push_back(key);
          if (w) {
            const size_t at = col.values.size();
            col.values.resize(at + w);
            std::memcpy(col.values.data() + at, ch.vals.data() + static_cast<size_t>(r) * w, w);
            out_bytes += w;
            useful += ItemBytes(w);
          } else {
            const uint32_t len = ch.lens[r];
            col.values.insert(col.values.end(), ch.vals.begin() + voff[c][r], ch.vals.begin() + voff[c][r] + len);
            out_bytes += len;
            useful += ItemBytes(len);
            col.offsets.push_back(static_cast<int32_t>(out_bytes / elem));
          }
        }
        if (kmax - wlo < kWindow) break;
      }
      order.clear();  // consumed: skip the merge below
    }
    struct HE {
      uint64_t key, seq;
      uint32_t c;
    };
    auto later = [](const HE& a, const HE& b2) { return a.key > b2.key || (a.key == b2.key && a.seq < b2.seq); };
    std::vector<HE> heap;
    std::vector<uint32_t> pos(cs.size(), 0);
    size_t nx = 0;
    bool have_last = false;
    uint64_t last = 0;
    for (;;) {
      while (nx < order.size() && (heap.empty() || cs[order[nx]].keys.front() <= heap.front().key)) {
        const uint32_t c = order[nx++];
        heap.push_back({cs[c].keys[0], cs[c].seq, c});
        std::push_heap(heap.begin(), heap.end(), later);
      }
      if (heap.empty()) break;
      std::pop_heap(heap.begin(), heap.end(), later);
      const HE t = heap.back();
      heap.pop_back();
      const Chunk& ch = cs[t.c];
      const uint32_t r = pos[t.c];
      const uint32_t n = static_cast<uint32_t>(ch.keys.size());
      uint32_t r1 = r + 1;
      if (have_last && ch.keys[r] == last) {
        // an older version of a key already emitted
      } else {
        uint64_t bound = UINT64_MAX;
        if (!heap.empty()) bound = heap.front().key;
        if (nx < order.size()) bound = std::min(bound, cs[order[nx]].keys.front());
        r1 = static_cast<uint32_t>(std::lower_bound(ch.keys.begin() + r + 1, ch.keys.end(), bound) - ch.keys.begin());
        emit_run(t.c, r, r1);
        last = ch.keys[r1 - 1];
        have_last = true;
      }
      pos[t.c] = r1;
      if (r1 < n) {
        heap.push_back({ch.keys[r1], ch.seq, t.c});
        std::push_heap(heap.begin(), heap.end(), later);
      }
    }
    while (k < b.size()) emit_buf(k++);
    items += col.keys.size();
  }
  FinishRead(pids.size(), useful, encoded, items, t0, st);
  return Status::OK();
}

Status Store::Get(const std::string& name, const uint64_t* keys, size_t n, ColumnData* out, ReadStats* st) {
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
    std::lock_guard<std::mutex> l(mu_);
    if (closed_) return Status::Closed("store '" + path_ + "' is closed");
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
          best[i].len = b.len[j];
          arena.insert(arena.end(), b.value(j), b.value(j) + b.len[j]);
        }
      }
    }
    const FeatureState* f = features_.Get(def.id);
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
    if (o_.read_only && pv.seq() != pages_.at(pid).seq)
      return Status::Stale("store '" + path_ + "': page " + std::to_string(pid) + " of '" + pages_path_ +
                           "' was rewritten by a writer since this read-only handle opened; reopen the store");
    SegmentView sv;
    if (!pv.Find(def.id, &sv))
      return Status::Corruption("page " + std::to_string(pid) + " of '" + pages_path_ +
                                "' lacks the segment of feature '" + def.name + "' that the key index names");
    sv.width = w;
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
  if (!pids.empty()) {
    RingLease ring(rings_.get());
    RF_RETURN_IF_ERROR(ring.Acquire());
    Status rs = ReadPages(ring.get(), pids, cb);
    if (!rs.ok()) return ExplainReadFailure(rs);
  }
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
  FinishRead(pids.size(), useful, encoded, items, t0, st);
  return Status::OK();
}

Status Store::KeyRanges(const std::string& name, std::vector<PageRef>* out) {
  RF_RETURN_IF_ERROR(CheckOpen());
  FeatureDef def;
  RF_RETURN_IF_ERROR(FeatureFor(name, &def));
  std::shared_ptr<const Version> v;
  {
    std::lock_guard<std::mutex> l(mu_);
    v = versions_.current();
  }
  out->clear();
  if (def.id < v->features.size() && v->features[def.id]) *out = *v->features[def.id];  // sorted by min_key
  return Status::OK();
}

Status Store::AccountScan(const std::string& name, ReadStats* st) {
  const double t0 = Now();
  RF_RETURN_IF_ERROR(CheckOpen());
  FeatureDef def;
  RF_RETURN_IF_ERROR(FeatureFor(name, &def));
  std::lock_guard<std::mutex> wl(write_mu_);  // the tables belong to the writer side
  const FeatureState* f = features_.Get(def.id);
  double encoded = 0;
  for (uint32_t p : f->pages)
    for (const auto& sm : pages_.at(p).segs)
      if (sm.fid == def.id && !sm.retired) encoded += sm.live_disk_bytes();
  *st = ReadStats();
  st->pages_read = f->pages.size();
  st->bytes_read = f->pages.size() * static_cast<uint64_t>(o_.page_size);
  st->useful_bytes = f->live_bytes;
  st->encoded_bytes = encoded;
  st->items = f->live_items;
  st->seconds = Now() - t0;
  return Status::OK();
}

}  // namespace recflash
