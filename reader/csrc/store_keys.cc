// Keys-only scans (Store::ScanKeys): which keys a feature holds in a range, for callers that
// need a feature's rows but not its values — a Ray read task whose projection drops the
// feature still owes the rows of its keys. Three sources, cheapest first, so that what a
// scan would read for the values is read only when nothing else knows the keys:
//   page table — a tombstone-free segment whose record count equals its key span holds every
//                key of the span (dense ids, row numbers: what bulk loads write);
//   key index  — when one describes the snapshot without a page read;
//   pages      — the other segments, keys decoded (values neither decoded nor copied).
// Versions are resolved as the scan merges do (key_merge.h), buffered writes overlay.
#include "reader/csrc/key_merge.h"
#include "reader/csrc/scan_merge.h"
#include "reader/csrc/store_impl.h"
#include "reader/csrc/store_internal.h"

#include <algorithm>
#include <unordered_map>

namespace recflash {

using namespace store_internal;

namespace {

// Whether the page table alone gives the ref's keys: count records, unique and ascending in
// a segment, spanning exactly count keys, none a tombstone.
bool SpanOfKeys(const PageRef& r) { return r.tombs == 0 && r.count > 0 && r.max_key - r.min_key == r.count - 1ull; }

}  // namespace

Status StoreImpl::ScanKeys(const std::string& name, uint64_t lo, uint64_t hi, HVec<uint64_t>* out, ReadStats* st) {
  const double t0 = Now();
  RF_RETURN_IF_ERROR(CheckOpen());
  RF_RETURN_IF_ERROR(CheckReadable());
  FeatureDef def;
  RF_RETURN_IF_ERROR(FeatureFor(name, &def));
  const bool to_end = hi == UINT64_MAX;
  const bool empty = !to_end && lo >= hi;
  const uint64_t hi_incl = to_end ? UINT64_MAX : hi - 1;
  auto in_range = [&](const PageRef& r) { return !empty && r.max_key >= lo && r.min_key <= hi_incl; };

  // Does the page table alone give the keys? Else the key index is made ready where that
  // costs no page read: a read-only handle takes the CHECKPOINT's indexes when they describe
  // its snapshot (as its scans of overlapping features do), and an index kept encoded since
  // the open is decoded. (Decided on the current version; the one registered below is
  // checked again, so a writer moving on in between only costs this work.)
  bool table_only = true;
  {
    MutexLock l(&mu_);
    versions_.AssertHeld();
    for (const PageRef& r : versions_.current()->refs(def.id))
      if (in_range(r) && !SpanOfKeys(r)) {
        table_only = false;
        break;
      }
  }
  if (!table_only) {
    if (o_.read_only) RF_RETURN_IF_ERROR(TryKeyIndexFromCheckpoint());
    if (FeatureState* f = FeatureStateFor(def.id)) RF_RETURN_IF_ERROR(LoadIndex(f));
  }

  // The snapshot: version, buffered keys and (when it describes that version) the index's
  // keys, in one critical section. A writer changes the index under mu_ between setting
  // index_ahead_ and installing the next version, so with index_ahead_ clear the index
  // describes the current version.
  std::vector<uint64_t> bkeys;
  std::vector<uint8_t> btomb;
  HVec<uint64_t> disk;
  bool from_index = false;
  std::shared_ptr<const Version> v;
  {
    MutexLock l(&mu_);
    if (closed_) return Status::Closed("store '" + path_ + "' is closed");
    versions_.AssertHeld();
    v = versions_.RegisterLocked();
    if (!empty) {
      if (FeatureBuffer* fb = buffer_.find(def.id)) fb->CopyKeys(lo, hi, &bkeys, &btomb);
      const FeatureState* f = ReaderFeatures().Get(def.id);
      if (!table_only && f && ReaderKeyIndexReady() && !index_ahead_ && !f->index_lazy && !f->index.deferred()) {
        f->index.AppendLiveKeys(lo, hi, &disk);
        from_index = true;
      }
    }
  }
  VersionSet::Reader guard(&versions_, v->number);

  // Otherwise the version's segments in the range: spans from the page table, the others'
  // pages read for their keys (a page holds at most one segment of a feature).
  std::vector<KeyChunk> chunks;
  std::vector<PageRef> refs;
  std::vector<uint32_t> pids;
  std::unordered_map<uint32_t, uint32_t> chunk_of;  // page -> chunk
  if (!from_index) {
    for (const PageRef& r : v->refs(def.id)) {
      if (!in_range(r)) continue;
      if (SpanOfKeys(r)) {
        chunks.push_back(KeyChunk::Span(r.seq, std::max(lo, r.min_key), std::min(hi_incl, r.max_key)));
      } else {
        chunk_of[r.page] = static_cast<uint32_t>(chunks.size());
        pids.push_back(r.page);
        chunks.emplace_back();
      }
      refs.push_back(r);
    }
  }
  std::sort(pids.begin(), pids.end());
  double encoded = 0;
  auto cb = [&](uint32_t pid, const PageView& pv) -> Status {
    const uint32_t j = chunk_of.at(pid);
    SegmentView sv;
    RF_RETURN_IF_ERROR(SnapshotSegment(pid, pv, refs[j], def, true, &sv));
    KeyChunk& c = chunks[j];
    c.seq = pv.seq();
    DecodeKeysInRange(sv, lo, hi, to_end, &c.keys, &c.tomb);
    encoded += static_cast<double>(c.keys.size()) * sv.bytes_per_record();
    return Status::OK();
  };
  ReadIo io;
  RF_RETURN_IF_ERROR(ReadPagesLeased(pids, cb, &io));
  if (!from_index) MergeKeyChunks(chunks, &disk);

  // Buffered writes are newer than any page.
  uint64_t buffered_live = 0;
  if (bkeys.empty()) {
    *out = std::move(disk);
  } else {
    OverlayBufferedKeys(disk, bkeys, btomb, out);
    for (uint8_t t : btomb) buffered_live += t == 0;
  }
  FinishRead(pids, 8 * (out->size() - buffered_live), encoded, out->size(), t0, io, st);
  return Status::OK();
}

}  // namespace recflash
