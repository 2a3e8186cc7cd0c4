#include "reader/csrc/page_batch.h"

#include <algorithm>
#include <exception>
#include <string>
#include <system_error>
#include <thread>

namespace recflash {

namespace {

Status TooLarge(const FeatureDef& def, uint64_t key) {
  return Status::TooLarge("feature '" + def.name + "': the value of key " + std::to_string(key) +
                          " does not fit in a page");
}

}  // namespace

void PageBatch::Lane::FinishPage() {
  uint8_t* buf = scratch.data();
  if (keep) {
    // Slots count this lane's own pages (`pages` also lists the other lanes' once merged).
    const size_t i = slots_used++;
    if (i % kBlockPages == 0 && i / kBlockPages >= pool->size()) pool->emplace_back(static_cast<size_t>(kBlockPages) * page_size);
    buf = (*pool)[i / kBlockPages].data() + (i % kBlockPages) * static_cast<size_t>(page_size);
  }
  summaries.emplace_back();
  // Seq, page id and checksum are stamped when the batch is written.
  pb.Finish(buf, 0, 0, &summaries.back(), false);
  pages.push_back(keep ? buf : nullptr);
  pb.Reset();
}

Status PageBatch::Lane::AddItems(const FeatureDef& def, const uint64_t* keys, const uint8_t* values,
                                 const uint32_t* offsets, size_t n) {
  const uint32_t w = def.fixed_width();
  for (size_t i = 0; i < n;) {
    const size_t k = w ? pb.AddRun(def, keys + i, values + i * w, n - i)
                       : (pb.Add(def, keys[i], values + offsets[i], offsets[i + 1] - offsets[i], false) ? 1 : 0);
    if (k == 0) {
      if (pb.empty()) return TooLarge(def, keys[i]);
      FinishPage();
      continue;
    }
    i += k;
  }
  return Status::OK();
}

Status PageBatch::Lane::Add(const FeatureDef& def, uint64_t key, const uint8_t* value, uint32_t len, bool tomb) {
  if (pb.Add(def, key, value, len, tomb)) return Status::OK();
  FinishPage();
  return pb.Add(def, key, value, len, tomb) ? Status::OK() : TooLarge(def, key);
}

PageBatch::PageBatch(uint32_t page_size, bool compact, bool keep, std::vector<std::vector<AlignedBuffer>>* pools)
    : page_size_(page_size), compact_(compact), keep_(keep), pools_(pools) {
  if (pools_->empty()) pools_->emplace_back();
  lanes_.reserve(pools_->size());
  lanes_.emplace_back(page_size_, compact_, keep_, &(*pools_)[0]);
}

Status PageBatch::AddRuns(const std::vector<AppendItems>& runs, unsigned threads, size_t min_items_per_thread) {
  // A run's items as AddItems takes them (buffered fixed-width values are packed in key
  // order; variable ones need their offsets relative to the arena).
  auto add_run = [](Lane& lane, const AppendItems& r) -> Status {
    const BufferedItems& b = *r.items;
    if (b.size() == 0) return Status::OK();
    if (r.def->fixed_width()) return lane.AddItems(*r.def, b.keys.data(), b.arena.data(), nullptr, b.size());
    for (size_t i = 0; i < b.size(); i++) RF_RETURN_IF_ERROR(lane.Add(*r.def, b.keys[i], b.value(i), b.length(i), false));
    return Status::OK();
  };
  size_t items = 0;
  std::vector<uint64_t> work(runs.size());
  uint64_t total = 0;
  for (size_t i = 0; i < runs.size(); i++) {
    const BufferedItems& b = *runs[i].items;
    items += b.size();
    work[i] = b.size() * 8 + b.arena.size();
    total += work[i];
  }
  unsigned lanes = std::max(1u, threads);
  if (min_items_per_thread) lanes = static_cast<unsigned>(std::min<size_t>(lanes, items / min_items_per_thread));
  lanes = static_cast<unsigned>(std::min<size_t>(std::max(1u, lanes), runs.size()));
  if (lanes <= 1 || lanes_.size() != 1 || !lanes_.back().pb.empty() || size() != 0) {
    // One thread (also when pages were added before: the split assumes an empty batch).
    for (const AppendItems& r : runs) RF_RETURN_IF_ERROR(add_run(lanes_.back(), r));
    return Status::OK();
  }
  while (pools_->size() < lanes) pools_->emplace_back();
  lanes_.clear();
  lanes_.reserve(lanes);
  for (unsigned l = 0; l < lanes; l++) lanes_.emplace_back(page_size_, compact_, keep_, &(*pools_)[l]);
  // Contiguous groups of about total / lanes bytes each.
  std::vector<size_t> begin(lanes + 1, runs.size());
  begin[0] = 0;
  uint64_t acc = 0;
  unsigned next = 1;
  for (size_t i = 0; i < runs.size() && next < lanes; i++) {
    acc += work[i];
    if (acc * lanes >= total * next) begin[next++] = i + 1;
  }
  std::vector<Status> status(lanes);
  auto build = [&](unsigned l) {
    try {
      for (size_t i = begin[l]; i < begin[l + 1] && status[l].ok(); i++) status[l] = add_run(lanes_[l], runs[i]);
    } catch (const std::exception& e) {  // allocation failure in a lane thread
      status[l] = Status::IOError(std::string("building pages: ") + e.what());
    }
  };
  std::vector<std::thread> pool;
  for (unsigned l = 1; l < lanes; l++) {
    try {
      pool.emplace_back(build, l);
    } catch (const std::system_error&) {
      break;  // no thread to be had (EAGAIN): the lanes not started are built on this one
    }
  }
  build(0);
  for (unsigned l = 1 + static_cast<unsigned>(pool.size()); l < lanes; l++) build(l);
  for (auto& t : pool) t.join();
  threads_used_ = lanes;
  for (const Status& s : status) RF_RETURN_IF_ERROR(s);

  // Every lane's finished pages, in lane order, become the main lane's; then the partly
  // filled pages of the other lanes move into the main lane's open page.
  Lane& main = lanes_.back();
  std::vector<uint8_t*> pages;
  std::vector<std::vector<SegmentSummary>> summaries;
  for (Lane& lane : lanes_) {
    pages.insert(pages.end(), lane.pages.begin(), lane.pages.end());
    for (auto& s : lane.summaries) summaries.push_back(std::move(s));
  }
  main.pages = std::move(pages);
  main.summaries = std::move(summaries);
  for (unsigned l = 0; l + 1 < lanes; l++) {
    const PageBuilder& pb = lanes_[l].pb;
    for (size_t s = 0; s < pb.segments(); s++) {
      const PageBuilder::SegItems seg = pb.segment(s);
      const FeatureDef* def = nullptr;
      for (size_t i = begin[l]; i < begin[l + 1] && !def; i++)
        if (runs[i].def->id == seg.fid) def = runs[i].def;
      if (!def || seg.any_tomb) return Status::Corruption("page batch: a lane's open segment is not one of its runs");
      RF_RETURN_IF_ERROR(main.AddItems(*def, seg.keys, seg.values, seg.offsets, seg.n));
    }
  }
  // Only the main lane stays; the others' pages live on in their pools.
  lanes_.erase(lanes_.begin(), lanes_.end() - 1);
  return Status::OK();
}

Status PageBatch::AddRecord(const FeatureDef& def, uint64_t key, const uint8_t* value, uint32_t len, bool tomb) {
  return lanes_.back().Add(def, key, value, len, tomb);
}

void PageBatch::Close() {
  if (!lanes_.back().pb.empty()) lanes_.back().FinishPage();
}

}  // namespace recflash
