#include "reader/csrc/store_impl.h"

#include "reader/csrc/crc32c.h"
#include "reader/csrc/page_batch.h"
#include "reader/csrc/store_internal.h"

#include <rocksdb/write_batch.h>

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
// Write path

Status StoreImpl::Put(const std::string& feature, const uint64_t* keys, size_t n, const uint8_t* values,
                  size_t values_len, const int64_t* offsets) {
  RF_RETURN_IF_ERROR(CheckWritable());
  FeatureDef def;
  RF_RETURN_IF_ERROR(FeatureFor(feature, &def));
  if (n == 0) return Status::OK();
  const uint32_t width = def.fixed_width();
  const uint32_t max_value = PageBuilder::MaxValueBytes(o_.page_size);
  if (width) {
    if (values_len != n * width)
      return Status::InvalidArgument("feature '" + feature + "': " + std::to_string(n) + " keys need " +
                                     std::to_string(n * width) + " value bytes, got " + std::to_string(values_len));
  } else {
    if (!offsets) return Status::InvalidArgument("feature '" + feature + "': variable-width values need offsets");
    const uint32_t elem = def.element_size();
    if (offsets[0] < 0 || static_cast<size_t>(offsets[n]) > values_len)
      return Status::InvalidArgument("feature '" + feature + "': value offsets out of bounds");
    for (size_t i = 0; i < n; i++) {
      const int64_t len = offsets[i + 1] - offsets[i];
      if (len < 0) return Status::InvalidArgument("feature '" + feature + "': value offsets decrease at item " + std::to_string(i));
      if (len % elem) return Status::Schema("feature '" + feature + "': value of key " + std::to_string(keys[i]) +
                                            " is not a whole number of elements");
      if (len > max_value)
        return Status::TooLarge("feature '" + feature + "': the value of key " + std::to_string(keys[i]) + " is " +
                                std::to_string(len) + " bytes; a page of " + std::to_string(o_.page_size) +
                                " bytes holds at most " + std::to_string(max_value));
    }
  }
  WriteOp w;
  if (!o_.bulk_load && !o_.accounting)
    BatchParts(kOpPut, def.id, keys, n, width, values, offsets, w.header, &w.lens, &w.parts, &w.payload_bytes);
  w.fid = def.id;
  w.keys = keys;
  w.n = n;
  w.values = values;
  w.offsets = offsets;
  w.width = width;
  return Write(&w);
}

Status StoreImpl::Delete(const std::string& feature, const uint64_t* keys, size_t n) {
  RF_RETURN_IF_ERROR(CheckWritable());
  FeatureDef def;
  RF_RETURN_IF_ERROR(FeatureFor(feature, &def));
  if (n == 0) return Status::OK();
  WriteOp w;
  if (!o_.bulk_load && !o_.accounting)
    BatchParts(kOpDelete, def.id, keys, n, def.fixed_width(), nullptr, nullptr, w.header, &w.lens, &w.parts,
               &w.payload_bytes);
  w.fid = def.id;
  w.keys = keys;
  w.n = n;
  w.width = def.fixed_width();
  w.tomb = true;
  return Write(&w);
}

Status StoreImpl::Write(WriteOp* w) {
  MutexLock ql(&queue_mu_);
  writers_.push_back(w);
  while (!w->done && writers_.front() != w) w->cv.Wait(&queue_mu_);
  if (w->done) return w->status;
  // This writer leads a group: everything queued behind it goes into one WAL write.
  std::vector<WriteOp*> group;
  size_t bytes = 0;
  for (WriteOp* x : writers_) {
    if (!group.empty() && bytes + x->payload_bytes > (8u << 20)) break;
    group.push_back(x);
    bytes += x->payload_bytes;
  }
  ql.Unlock();

  Status s;
  {
    MutexLock wl(&write_mu_);
    s = closed_ ? Status::Closed("store '" + path_ + "' is closed") : bg_error_;
    bool sync = o_.sync_on_write;
    const bool logged = !o_.accounting && !o_.bulk_load;
    // The metadata names this session's file as the newest before any record goes into it
    // (once per session, or per flush that starts a file: the flush's commit names it).
    if (s.ok() && logged && pstate_.wal_last != wal_number_) s = RecordWalLastLocked();
    for (WriteOp* x : group) {
      if (!s.ok() || !logged) break;
      s = wal_.AppendParts(kWalBatch, x->parts.data(), x->parts.size());
      // A failed append may have left part of a record in the log; replay stops there, so
      // nothing appended behind it would survive: the store takes no more writes (RocksDB
      // does the same on a WAL write error).
      if (s.code() == Status::Code::kIOError) bg_error_ = s;
      sync = sync || x->sync;
    }
    if (s.ok() && sync && logged) {
      s = wal_.Sync();
      // After a failed fsync the kernel may have dropped the dirty pages; a later fsync
      // could then succeed without them ("fsyncgate"): no acknowledgement after this one.
      if (!s.ok()) bg_error_ = s;
    }
    if (s.ok()) {
      MutexLock l(&mu_);
      for (WriteOp* x : group)
        buffer_.feature(x->fid).Append(x->keys, x->n, x->values, x->offsets, x->width, x->tomb);
    }
    if (s.ok()) {
      uint64_t buffered;
      {
        MutexLock l(&mu_);
        buffered = buffer_.bytes();
      }
      if (buffered >= o_.write_buffer_bytes) s = FlushLocked(o_.bulk_load);
    }
  }

  ql.Lock();
  for (WriteOp* x : group) {
    writers_.pop_front();
    x->status = s;
    x->done = true;
    if (x != w) x->cv.Signal();
  }
  if (!writers_.empty()) writers_.front()->cv.Signal();
  return s;
}

Status StoreImpl::RecordWalLastLocked() {
  PersistentState next = pstate_;
  next.wal_last = wal_number_;
  rocksdb::WriteBatch b;
  MetaStore::PutState(&b, next);
  // The state record alone, and not through CommitMetaLocked: a loaded checkpoint stays
  // valid, since it describes the pages and the sequence, which this commit leaves as they
  // are (LoadCheckpoint checks both). Retiring it here would make every session that writes
  // and then crashes before its first flush cost the next open a rebuild from all pages.
  RF_RETURN_IF_ERROR(meta_.Commit(&b));
  pstate_ = next;
  return Status::OK();
}

Status StoreImpl::Sync() {
  RF_RETURN_IF_ERROR(CheckWritable());
  MutexLock wl(&write_mu_);
  RF_RETURN_IF_ERROR(bg_error_);
  // Bulk-load mode has no log to sync: the buffer itself goes to pages.
  if (o_.bulk_load) return FlushLocked(true);
  Status s = wal_.Sync();
  if (!s.ok()) bg_error_ = s;  // see Write: a failed fsync is not retried
  return s;
}

Status StoreImpl::Flush(bool force) {
  RF_RETURN_IF_ERROR(CheckWritable());
  MutexLock wl(&write_mu_);
  // Bulk-load mode never pins: unlogged items held back would not be durable after flush().
  RF_RETURN_IF_ERROR(FlushLocked(force || o_.bulk_load));
  TrimFileLocked();
  return Status::OK();
}

Status StoreImpl::FlushLocked(bool force) {
  RF_RETURN_IF_ERROR(bg_error_);
  std::vector<uint32_t> write_fids;
  std::set<uint32_t> pinned;
  {
    MutexLock l(&mu_);
    std::vector<PinCandidate> cands;
    for (auto& [fid, fb] : buffer_.all()) {
      fb.Normalize();
      if (fb.size()) cands.push_back({fid, fb.size(), fb.bytes(), fb.pinned_flushes});
    }
    if (!force)
      for (uint32_t fid : pinner_.Choose(cands, o_.write_buffer_bytes, o_.page_size)) pinned.insert(fid);
    for (const auto& c : cands)
      if (!pinned.count(c.fid)) write_fids.push_back(c.fid);
  }
  // Everything acknowledged so far becomes durable first (flush is a durability point).
  Status s = o_.accounting ? Status::OK() : wal_.Sync();
  if (!s.ok()) return bg_error_ = s;
  if (write_fids.empty()) return Status::OK();

  // The WAL file this flush commits as the first to replay holds only what stays pinned; once
  // the flush commits, the older files are obsolete. It is a new file after the current one
  // when that holds records; an empty current file (nothing logged since the open or the last
  // flush, e.g. in bulk-load mode, which logs nothing) takes the pinned items itself. So a
  // file is only ever created after one with records: the files from wal_start on stay
  // consecutive with only the last one empty, which the open checks (ReplayWal).
  const bool logged = !o_.accounting;
  const bool rotate = logged && wal_.file_bytes() > 0;
  const uint64_t new_wal = rotate ? wal_number_ + 1 : wal_number_;
  if (rotate) s = wal_.Open(WalFileName(wal_dir_, new_wal));
  if (s.ok() && logged) {
    for (uint32_t fid : pinned) {
      std::vector<std::string> payloads;
      EncodeBuffered(fid, features_.Get(fid)->def.fixed_width(), WriterBuffer().find(fid)->items(), &payloads);
      for (const auto& p : payloads)
        if (s.ok()) s = wal_.Append(kWalBatch, p);
    }
    if (s.ok()) s = wal_.Sync();
    if (s.ok() && rotate) s = SyncDir(wal_dir_);
  }
  if (!s.ok()) return bg_error_ = s;
  wal_number_ = new_wal;

  for (uint32_t fid : write_fids) {
    s = LoadIndex(features_.Get(fid));
    if (!s.ok()) return bg_error_ = s;
  }
  // Items are written grouped by feature, ascending keys. The buffer is not modified until
  // the new version is installed (no writer runs: we hold write_mu_), so records point into it.
  // A feature whose index is deferred and whose buffered items are all puts above its stored
  // keys is an append: its items go to pages straight from the buffer (no per-item record, no
  // index lookup) and the index stays deferred. Everything else takes the general path.
  std::vector<AppendRun> runs;
  std::vector<Rec> recs;
  for (uint32_t fid : write_fids) {
    FeatureState* f = features_.Get(fid);
    const BufferedItems& b = WriterBuffer().find(fid)->items();
    f->touched = true;
    // An append (IsAppend) is written as a run. A deferred index stays deferred; to a
    // materialized one (a merge or an update came before: a bulk load's small features are
    // merged between its flushes) the run's keys are added at its end, in one step.
    const bool append = IsAppend(f, b);
    if (!(append && f->index.deferred())) {
      s = MaterializeIndexLocked(f);
      if (!s.ok()) return bg_error_ = s;
    }
    if (append) {
      uint64_t bytes = 0;
      if (f->def.fixed_width()) {
        bytes = b.size() * ItemBytes(f->def.fixed_width());
      } else {
        for (size_t i = 0; i < b.size(); i++) bytes += ItemBytes(b.length(i));
      }
      pstate_.user_bytes_written += bytes;
      runs.push_back({fid, &b, bytes, !f->index.deferred()});
      continue;
    }
    size_t hint = 0;
    for (size_t i = 0; i < b.size(); i++) {
      const int64_t pos = f->index.FindFrom(b.keys[i], &hint);
      pstate_.user_bytes_written += ItemBytes(b.length(i));
      if (b.tomb[i] && pos == KeyIndex::kAbsent) continue;  // nothing on disk to hide
      if (b.tomb[i] && pos != KeyIndex::kAbsent && (f->index.loc(pos) & KeyIndex::kTomb)) continue;  // already deleted
      recs.push_back({fid, b.keys[i], b.tomb[i] != 0, b.value(i), b.length(i), pos});
    }
  }
  std::set<uint32_t> dirty, freed;
  uint64_t pw = 0;
  bool retire_below = false;
  s = WriteRecordsLocked(runs, recs, &dirty, &freed, &pw);
  flush_pages_written_ += pw;
  if (s.ok()) {
    // From new_wal on there is one file, which exists: what the state record claims holds
    // from this commit on, whatever the open found (PersistentState).
    const uint64_t old_start = pstate_.wal_start;
    pstate_.wal_start = new_wal;
    if (logged) {
      pstate_.wal_start_kept = pstate_.wal_files_consecutive = true;
      pstate_.wal_last = new_wal;
    }
    s = CommitLocked(dirty, freed);
    retire_below = logged && new_wal > old_start;
  }
  if (!s.ok()) return bg_error_ = s;
  {
    // Install: the flushed items leave the buffer in the same step that the version naming
    // their pages appears, so readers see them exactly once.
    auto v = BuildVersion(versions_.current()->number + 1, features_, pages_);
    MutexLock l(&mu_);
    for (uint32_t fid : write_fids) buffer_.find(fid)->Clear();
    buffer_.TrimCapacity(o_.write_buffer_bytes);
    for (uint32_t fid : pinned) buffer_.find(fid)->pinned_flushes++;
    versions_.AssertHeld();
    versions_.InstallLocked(v, freed);
    index_ahead_ = false;
  }
  // Any order will do: the files below wal_start are ignored by opens (a read-only open that
  // listed them before the commit sees them vanish and reopens).
  std::vector<uint64_t> numbers;
  if (retire_below && ListWalFiles(wal_dir_, &numbers).ok())
    for (uint64_t no : numbers)
      if (no < new_wal) ::unlink(WalFileName(wal_dir_, no).c_str());
  flushes_++;
  ReleasePendingLocked();
  s = MaintainLocked();
  if (!s.ok()) return bg_error_ = s;
  return Status::OK();
}

void StoreImpl::InvalidateLocked(FeatureState* f, size_t pos, std::set<uint32_t>* dirty, std::set<uint32_t>* freed) {
  const uint32_t loc = f->index.loc(pos);
  const uint32_t pid = loc & ~KeyIndex::kTomb;
  PageMeta& pm = pages_.at(pid);
  SegMeta* sm = pm.seg(f->def.id);
  sm->valid--;
  if (loc & KeyIndex::kTomb) {
    f->tombs--;
  } else {
    const uint64_t b = ItemBytes(f->def.variable() ? f->index.len(pos) : f->def.fixed_width());
    sm->valid_bytes -= b;
    f->live_items--;
    f->live_bytes -= b;
  }
  if (sm->valid == 0) {
    sm->retired = true;
    auto it = std::find(f->pages.begin(), f->pages.end(), pid);
    if (it != f->pages.end()) {
      *it = f->pages.back();
      f->pages.pop_back();
    }
    if (pm.valid() == 0) {
      dirty->erase(pid);
      freed->insert(pid);
    } else {
      dirty->insert(pid);
    }
  }
}

bool StoreImpl::IsAppend(const FeatureState* f, const BufferedItems& b) {
  if (b.size() == 0) return false;
  if (std::memchr(b.tomb.data(), 1, b.tomb.size()) != nullptr) return false;
  uint64_t last;
  if (f->index.LastKey(&last) && b.keys.front() <= last) return false;
  const uint32_t w = f->def.fixed_width();
  // Fixed-width values are packed in key order (see FeatureBuffer): value i at i * width.
  return w == 0 || (b.arena.size() == b.size() * w && (b.width == w || b.off.back() == (b.size() - 1) * w));
}

Status StoreImpl::MaterializeIndexLocked(FeatureState* f) {
  if (!f->index.deferred()) return Status::OK();
  // Every record of the feature's live segments is current (see KeyIndex): read them all.
  // A deferred index's segments hold disjoint key ranges, so the keys come out sorted by
  // ordering the segments by their first key; only if that does not hold (it always should)
  // are the records sorted one by one. A full sort of a 2 M-key feature took most of the
  // first update's flush after an import.
  struct Chunk {
    uint64_t first, last;
    uint32_t pid;
    size_t begin, count;  // positions in keys / lens
  };
  std::vector<Chunk> chunks;
  std::vector<uint64_t> keys;
  std::vector<uint32_t> lens;
  keys.reserve(f->index.deferred_items());
  std::vector<uint32_t> pids = f->pages;
  std::sort(pids.begin(), pids.end());
  chunks.reserve(pids.size());
  const FeatureDef& def = f->def;
  const uint32_t w = def.fixed_width();
  if (!w) lens.reserve(f->index.deferred_items());
  auto cb = [&](uint32_t pid, const PageView& pv) -> Status {
    SegmentView sv;
    if (!pv.Find(def.id, &sv))
      return Status::Corruption("page " + std::to_string(pid) + " of '" + pages_path_ +
                                "' lacks the segment of feature '" + def.name + "' that the page table names");
    sv.width = w;
    RF_RETURN_IF_ERROR(CheckSegmentFits(sv, pid, pages_path_, def));
    if (sv.count == 0) return Status::OK();
    const size_t begin = keys.size();
    keys.resize(begin + sv.count);
    sv.DecodeKeys(keys.data() + begin);
    if (!w) {
      for (uint32_t i = 0; i < sv.count; i++) {
        const uint8_t* v;
        uint32_t len;
        sv.Value(i, &v, &len);
        lens.push_back(len);
      }
    }
    chunks.push_back({keys[begin], keys.back(), pid, begin, sv.count});
    return Status::OK();
  };
  // Fixed-width segments without gaps in their key ranges (an embedding table's rows) name
  // their keys in the page table: the index is built with no page read.
  bool implied = w != 0;
  for (size_t i = 0; i < pids.size() && implied; i++)
    for (const SegMeta& sm : pages_.at(pids[i]).segs)
      if (sm.fid == def.id && !sm.retired && !sm.gapless()) implied = false;
  if (implied) {
    for (uint32_t pid : pids)
      for (const SegMeta& sm : pages_.at(pid).segs) {
        if (sm.fid != def.id || sm.retired) continue;
        const size_t begin = keys.size();
        keys.resize(begin + sm.count);
        std::iota(keys.begin() + begin, keys.end(), sm.min_key);
        chunks.push_back({sm.min_key, sm.max_key, pid, begin, sm.count});
      }
  } else if (!pids.empty()) {
    RF_RETURN_IF_ERROR(ReadPages(write_ring_.get(), pids, cb));
    pages_read_ += pids.size();
    bytes_read_ += pids.size() * static_cast<uint64_t>(o_.page_size);
  }
  std::sort(chunks.begin(), chunks.end(), [](const Chunk& a, const Chunk& b) { return a.first < b.first; });
  bool disjoint = true;
  for (size_t c = 1; c < chunks.size() && disjoint; c++) disjoint = chunks[c - 1].last < chunks[c].first;
  const size_t total = keys.size();
  std::vector<uint64_t> k(total);
  std::vector<uint32_t> l(total), n(total, w);
  if (disjoint) {
    size_t o = 0;
    for (const Chunk& c : chunks) {
      std::memcpy(k.data() + o, keys.data() + c.begin, c.count * sizeof(uint64_t));
      std::fill(l.begin() + o, l.begin() + o + c.count, c.pid);
      if (!w) std::memcpy(n.data() + o, lens.data() + c.begin, c.count * sizeof(uint32_t));
      o += c.count;
    }
  } else {
    std::vector<uint32_t> page_of(total);
    for (const Chunk& c : chunks) std::fill(page_of.begin() + c.begin, page_of.begin() + c.begin + c.count, c.pid);
    std::vector<uint32_t> order(total);
    for (size_t i = 0; i < total; i++) order[i] = static_cast<uint32_t>(i);
    std::sort(order.begin(), order.end(), [&](uint32_t a, uint32_t b) { return keys[a] < keys[b]; });
    for (size_t i = 0; i < total; i++) {
      k[i] = keys[order[i]];
      l[i] = page_of[order[i]];
      if (!w) n[i] = lens[order[i]];
    }
  }
  std::vector<uint64_t>().swap(keys);
  MutexLock index_lock(&mu_);  // get() reads the key index under mu_
  f->index.Undefer();
  f->index.InsertNew(k, l, n);
  return Status::OK();
}

Status StoreImpl::WriteRecordsLocked(const std::vector<AppendRun>& runs, std::vector<Rec>& recs,
                                 std::set<uint32_t>* dirty, std::set<uint32_t>* freed, uint64_t* pages_written) {
  *pages_written = 0;
  if (recs.empty() && runs.empty()) return Status::OK();
  PageBatch batch(o_.page_size, o_.compact_pages && !o_.accounting, !o_.accounting, &write_blocks_);
  std::vector<AppendItems> appends;
  appends.reserve(runs.size());
  for (const AppendRun& run : runs) appends.push_back({&features_.Get(run.fid)->def, run.items});
  // Accounting mode keeps its one-thread build: its figures are the layout's, item for item.
  RF_RETURN_IF_ERROR(batch.AddRuns(appends, o_.accounting ? 1 : o_.build_threads, kMinItemsPerBuildThread));
  std::vector<uint32_t> rec_page(recs.size());
  for (size_t r = 0; r < recs.size(); r++) {
    const Rec& x = recs[r];
    RF_RETURN_IF_ERROR(batch.AddRecord(features_.Get(x.fid)->def, x.key, x.value, x.len, x.tomb));
    rec_page[r] = static_cast<uint32_t>(batch.open_page());
  }
  batch.Close();
  const size_t npages = batch.size();
  std::vector<uint64_t> seqs(npages);
  for (size_t i = 0; i < npages; i++) seqs[i] = pstate_.next_seq++;
  const std::vector<uint32_t> ids = pages_.Allocate(static_cast<uint32_t>(npages));
  if (!o_.accounting) {
    for (size_t i = 0; i < npages; i++) std::memcpy(batch.page(i) + offsetof(PageHeader, seq), &seqs[i], 8);
    RF_RETURN_IF_ERROR(WritePagesLocked(ids, [&](size_t i) { return batch.page(i); }));
  }
  pstate_.pages_written += npages;
  *pages_written = npages;
  const std::vector<std::vector<SegmentSummary>>& summaries = batch.summaries();

  // The pages are durable: update the tables (committed to RocksDB by the caller).
  UpdateTablesLocked(recs, rec_page, ids, summaries, seqs, dirty, freed);
  if (!runs.empty()) {
    // Where each key of an indexed run went: its segments, in page order, hold its items in
    // key order (a PageBatch keeps each feature's items in order across its threads).
    std::unordered_map<uint32_t, std::vector<uint32_t>> locs;
    for (const AppendRun& run : runs)
      if (run.indexed) locs[run.fid].reserve(run.items->size());
    if (!locs.empty())
      for (size_t i = 0; i < npages; i++)
        for (const SegmentSummary& sum : summaries[i]) {
          auto it = locs.find(sum.feature_id);
          if (it != locs.end()) it->second.insert(it->second.end(), sum.count, ids[i]);
        }
    MutexLock index_lock(&mu_);
    for (const AppendRun& run : runs) {
      FeatureState* f = features_.Get(run.fid);
      f->live_items += run.items->size();
      f->live_bytes += run.bytes;
      if (!run.indexed) {
        f->index.AppendDeferred(run.items->size(), run.items->keys.back());
        continue;
      }
      const std::vector<uint32_t>& l = locs[run.fid];
      if (l.size() != run.items->size())
        return Status::Corruption("flush: feature '" + f->def.name + "' wrote " + std::to_string(l.size()) +
                                  " records of an append of " + std::to_string(run.items->size()));
      f->index.InsertNew(run.items->keys, l, run.items->len);
    }
  }
  return Status::OK();
}

template <typename PagePtr>
Status StoreImpl::WritePagesLocked(const std::vector<uint32_t>& ids, const PagePtr& page_ptr) {
  const uint32_t ps = o_.page_size;
  const size_t npages = ids.size();
  for (size_t i = 0; i < npages; i++) StampPageId(page_ptr(i), ps, ids[i]);
  if (npages) RF_RETURN_IF_ERROR(file_.Reserve(static_cast<uint64_t>(*std::max_element(ids.begin(), ids.end())) + 1));
  // Runs of consecutive ids within one block go out as one write.
  std::vector<PageRun> runs;
  std::vector<const uint8_t*> src;
  const uint32_t max_run = PagesPerRead();
  for (size_t i = 0; i < npages; i++) {
    // One write needs the pages contiguous on disk and in memory (a staging block; the
    // threads of a PageBatch fill blocks of their own).
    if (!runs.empty() && ids[i] == runs.back().first + runs.back().count && page_ptr(i) == page_ptr(i - 1) + ps &&
        runs.back().count < max_run) {
      runs.back().count++;
    } else {
      runs.push_back({ids[i], 1});
      src.push_back(page_ptr(i));
    }
  }
  RF_RETURN_IF_ERROR(write_ring_->WriteRuns(file_.fd(), pages_path_, ps, runs, src));
  return file_.Sync();
}

void StoreImpl::UpdateTablesLocked(const std::vector<Rec>& recs, const std::vector<uint32_t>& rec_page,
                               const std::vector<uint32_t>& ids,
                               const std::vector<std::vector<SegmentSummary>>& summaries,
                               const std::vector<uint64_t>& seqs, std::set<uint32_t>* dirty, std::set<uint32_t>* freed) {
  const size_t npages = ids.size();
  for (size_t i = 0; i < npages; i++) {
    std::vector<SegMeta> segs;
    for (const auto& s : summaries[i]) {
      SegMeta m;
      m.fid = s.feature_id;
      m.count = s.count;
      m.tombs = s.tombs;
      m.min_key = s.min_key;
      m.max_key = s.max_key;
      m.length = s.length;
      m.valid = s.count;
      m.valid_bytes = s.item_bytes;
      segs.push_back(m);
      features_.Get(s.feature_id)->pages.push_back(ids[i]);
    }
    pages_.MarkLive(ids[i], seqs[i], std::move(segs));
    dirty->insert(ids[i]);
  }
  std::vector<uint64_t> new_keys;
  std::vector<uint32_t> new_locs, new_lens;
  MutexLock index_lock(&mu_);  // get() reads the key index under mu_
  index_ahead_ = true;                          // until the caller installs the new version
  for (size_t r = 0; r < recs.size(); r++) {
    const Rec& x = recs[r];
    FeatureState* f = features_.Get(x.fid);
    const uint32_t loc = ids[rec_page[r]] | (x.tomb ? KeyIndex::kTomb : 0);
    if (x.tomb) {
      f->tombs++;
    } else {
      f->live_items++;
      f->live_bytes += ItemBytes(x.len);
    }
    if (x.pos != KeyIndex::kAbsent) {
      InvalidateLocked(f, static_cast<size_t>(x.pos), dirty, freed);
      f->index.set_loc(static_cast<size_t>(x.pos), loc);
      f->index.set_len(static_cast<size_t>(x.pos), x.tomb ? 0 : x.len);
    } else {
      new_keys.push_back(x.key);
      new_locs.push_back(loc);
      new_lens.push_back(x.tomb ? 0 : x.len);
    }
    const bool last_of_feature = r + 1 == recs.size() || recs[r + 1].fid != x.fid;
    if (last_of_feature && !new_keys.empty()) {
      f->index.InsertNew(new_keys, new_locs, new_lens);
      new_keys.clear();
      new_locs.clear();
      new_lens.clear();
    }
  }
}

Status StoreImpl::CommitLocked(const std::set<uint32_t>& dirty, const std::set<uint32_t>& freed) {
  rocksdb::WriteBatch b;
  for (uint32_t p : dirty)
    if (pages_.at(p).live) MetaStore::PutPage(&b, p, pages_.at(p));
  for (uint32_t p : freed) MetaStore::DeletePage(&b, p);
  MetaStore::PutState(&b, pstate_);
  if (!o_.accounting && !o_.read_only) RF_RETURN_IF_ERROR(CommitMetaLocked(&b));
  for (uint32_t p : freed) pages_.MarkDead(p);
  return Status::OK();
}

void StoreImpl::TrimFileLocked() {
  if (o_.accounting || o_.read_only) return;
  uint32_t slots;
  {
    MutexLock l(&mu_);
    slots = pages_.TrimFreeTail();
  }
  if (!file_.Truncate(slots).ok()) punch_failures_++;
}

void StoreImpl::ReleasePendingLocked() {
  for (uint32_t p : versions_.TakeReleasable()) pages_.AddFree(p, /*kept=*/true);
  const double reserve = o_.free_reserve_buffers * static_cast<double>(o_.write_buffer_bytes) / o_.page_size;
  ReturnFreeSlotsLocked(reserve > 0 ? static_cast<size_t>(reserve) : 0);
}

void StoreImpl::ReturnLeftoverSlotsLocked() {
  if (o_.accounting || o_.read_only) return;
  TrimFileLocked();
  uint64_t alloc = 0;
  if (!file_.AllocatedBytes(&alloc).ok()) return;
  std::vector<uint32_t> free;
  uint64_t live;
  {
    MutexLock l(&mu_);
    live = pages_.live_pages();
    // A little slack for filesystem metadata blocks: a clean close leaves nothing to punch,
    // and that open pays one fstat.
    if (alloc <= (live + 16) * o_.page_size) return;
    free = pages_.FreeSlots();
  }
  open_returned_slots_ += PunchSlotsLocked(free);
}

uint64_t StoreImpl::PunchSlotsLocked(const std::vector<uint32_t>& slots) {
  uint64_t punched = 0;
  for (const PageRun& r : CoalescePages(slots, UINT32_MAX)) {
    // Best effort: the slot is reusable either way (a failure only keeps its old bytes
    // allocated), so it is counted in stats rather than failing the flush or the open.
    if (o_.accounting) continue;
    if (file_.Punch(r.first, r.count).ok()) punched += r.count;
    else punch_failures_++;
  }
  return punched;
}

void StoreImpl::ReturnFreeSlotsLocked(size_t max_kept) {
  PunchSlotsLocked(pages_.ReturnKeptBeyond(max_kept));
}

}  // namespace recflash
