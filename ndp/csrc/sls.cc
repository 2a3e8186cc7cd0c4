#include "ndp/csrc/sls.h"

#include <algorithm>
#include <chrono>
#include <cstring>
#include <numeric>

namespace recflash::ndp {

namespace {

Status Validate(const SlsRequest& r, const FeatureDef& def) {
  const std::string where = "sls on table '" + r.table + "'";
  if (def.type != ValueType::kFixedFloat32) return Status::Schema(where + ": the feature is " + def.TypeString() + ", not an embedding table");
  if (RowWords(r.format, r.dim) != def.dim)
    return Status::InvalidArgument(where + ": stored rows are " + std::to_string(def.dim) + " words wide, a " + RowFormatName(r.format) +
                                   " row of dim " + std::to_string(r.dim) + " takes " + std::to_string(RowWords(r.format, r.dim)));
  if (r.offsets[0] != 0) return Status::InvalidArgument(where + ": offsets must start at 0");
  for (size_t b = 0; b < r.num_bags; b++)
    if (r.offsets[b + 1] < r.offsets[b])
      return Status::InvalidArgument(where + ": offsets decrease at bag " + std::to_string(b));
  if (static_cast<size_t>(r.offsets[r.num_bags]) != r.num_indices)
    return Status::InvalidArgument(where + ": the last offset is " + std::to_string(r.offsets[r.num_bags]) + " but there are " +
                                   std::to_string(r.num_indices) + " indices");
  for (size_t i = 0; i < r.num_indices; i++)
    if (r.indices[i] < 0) return Status::InvalidArgument(where + ": negative row id " + std::to_string(r.indices[i]) + " at position " + std::to_string(i));
  return Status::OK();
}

}  // namespace

SlsEngine::SlsEngine(Store* store, const SlsOptions& o)
    : store_(store), o_(o), rows_(o.row_cache_bytes), pooled_(o.pooled_cache_bytes, o.pooled_min_bag) {
  MutexLock l(&mu_);
  auto_profile_ = o_.hot_rows_bytes > 0 && o_.hot_rows_profile_ids > 0;
}

DirectMappedCache* SlsEngine::DeviceCache(uint32_t fid, uint32_t dim) {
  if (!o_.device_cache_bytes) return nullptr;
  auto& c = device_[fid];
  if (!c) c = std::make_unique<DirectMappedCache>(o_.device_cache_bytes / std::max(1u, o_.expected_tables), dim);
  return c->enabled() ? c.get() : nullptr;
}

Status SlsEngine::Run(const std::vector<SlsRequest>& requests, SlsStats* stats) {
  MutexLock l(&mu_);
  const auto t0 = std::chrono::steady_clock::now();
  *stats = SlsStats();
  const size_t nr = requests.size();
  if (work_.size() < nr) work_.resize(nr);
  // 1. Per table: validate, whole bags from the pooled cache, sorted and de-duplicated ids,
  //    rows from the caches; what is left becomes one gather request per table.
  std::vector<GatherRequest> gathers;
  std::vector<size_t> gather_of;  // gathers[g] belongs to requests[gather_of[g]]
  for (size_t k = 0; k < nr; k++) {
    const SlsRequest& r = requests[k];
    Work& wk = work_[k];
    RF_RETURN_IF_ERROR(store_->LookupFeature(r.table, &wk.def));
    RF_RETURN_IF_ERROR(Validate(r, wk.def));
    RF_RETURN_IF_ERROR(Prepare(r, &wk));
    wk.gs = GatherStats();
    if (!wk.miss_u.empty()) {
      // Every unique row goes to the gather, the cached ones marked held: they count towards
      // their page's rows (hits do not thin out the pages read whole) and are not read for
      // themselves. The gather writes straight into `rows`.
      GatherRequest g;
      g.feature = r.table;
      g.stats = &wk.gs;
      g.ids = wk.uids.data();
      g.n = wk.uids.size();
      g.out = wk.rows.data();
      g.have = wk.held.data();
      gathers.push_back(std::move(g));
      gather_of.push_back(k);
    } else {
      Pool(r, &wk);
    }
  }
  // 2. Every table's missing rows in one ring pass; a table is pooled as soon as its rows
  //    are in, while the other tables' reads are still in flight.
  if (!gathers.empty()) {
    RF_RETURN_IF_ERROR(store_->GatherRowsMany(gathers, o_.vector_grained, o_.dense_page_rows, [&](size_t g) RF_REQUIRES(mu_) -> Status {
      const size_t k = gather_of[g];
      Work& wk = work_[k];
      const uint32_t words = wk.words;
      for (const uint32_t u : wk.miss_u) {  // the rows the caches lacked: into them now
        const float* row = wk.rows.data() + static_cast<size_t>(u) * words;
        const uint64_t key = RowKey(wk.def.id, wk.uids[u]);
        if (rows_.enabled()) rows_.Put(key, row, words);
        if (wk.dev) wk.dev->Put(key, row);
      }
      Pool(requests[k], &wk);
      return Status::OK();
    }));
  }
  for (size_t k = 0; k < nr; k++) {
    const Work& wk = work_[k];
    const GatherStats& gs = wk.gs;
    stats->lookups += requests[k].num_indices;
    stats->unique_rows += wk.uids.size();
    stats->gather.rows += gs.rows;
    stats->gather.buffer_rows += gs.buffer_rows;
    stats->gather.vector_rows += gs.vector_rows;
    stats->gather.page_rows += gs.page_rows;
    stats->gather.device_reads += gs.device_reads;
    stats->gather.device_bytes += gs.device_bytes;
    stats->gather.verified_blocks += gs.verified_blocks;
    stats->gather.first_touch_pages += gs.first_touch_pages;
    stats->gather.dense_pages += gs.dense_pages;
    stats->gather.seconds = std::max(stats->gather.seconds, gs.seconds);
  }
  stats->seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  if (auto_profile_) AutoProfile(requests);
  return Status::OK();
}

void SlsEngine::AutoProfile(const std::vector<SlsRequest>& requests) {
  for (size_t k = 0; k < requests.size(); k++) {
    const SlsRequest& r = requests[k];
    const FeatureDef& def = work_[k].def;
    auto_tables_[def.id] = {r.table, def.dim};
    for (size_t i = 0; i < r.num_indices; i++) auto_freq_[RowKey(def.id, static_cast<uint64_t>(r.indices[i]))]++;
    auto_seen_ += r.num_indices;
  }
  if (auto_seen_ < o_.hot_rows_profile_ids) return;
  auto_profile_ = false;  // once: the partition is static from here on (Invalidate keeps it fresh)
  hot_.Clear();
  if (!FillHot(auto_freq_, auto_tables_).ok()) hot_.Clear();  // a failed read: lookups go to the store as before
  auto_freq_ = {};
  auto_tables_ = {};
}

Status SlsEngine::Prepare(const SlsRequest& r, Work* wk) {
  const uint32_t dim = r.dim;           // pooled width
  const uint32_t words = wk->def.dim;   // stored width (validated: RowWords(format, dim))
  const uint32_t fid = wk->def.id;
  wk->words = words;
  std::memset(r.out, 0, sizeof(float) * r.num_bags * dim);
  // Whole bags from the pooled-embedding cache.
  wk->done.assign(r.num_bags, 0);
  wk->pool_cacheable = pooled_.enabled() && !r.weights;
  if (wk->pool_cacheable) {
    for (size_t b = 0; b < r.num_bags; b++) {
      const uint32_t len = static_cast<uint32_t>(r.offsets[b + 1] - r.offsets[b]);
      if (len >= pooled_.min_len())
        wk->done[b] = pooled_.Get(PooledCache::Key(fid, r.mean, r.indices + r.offsets[b], len), r.out + b * dim, dim);
    }
  }
  // Sorted (row id, position) pairs of the remaining bags: each row fetched once.
  std::vector<uint32_t>& order = wk->order;
  order.clear();
  for (size_t b = 0; b < r.num_bags; b++)
    if (!wk->done[b])
      for (int64_t p = r.offsets[b]; p < r.offsets[b + 1]; p++) order.push_back(static_cast<uint32_t>(p));
  std::sort(order.begin(), order.end(), [&](uint32_t a, uint32_t b) { return r.indices[a] < r.indices[b]; });
  wk->uids.clear();
  wk->uid_of.assign(r.num_indices, 0);
  for (uint32_t p : order) {
    const uint64_t id = static_cast<uint64_t>(r.indices[p]);
    if (wk->uids.empty() || wk->uids.back() != id) wk->uids.push_back(id);
    wk->uid_of[p] = static_cast<uint32_t>(wk->uids.size() - 1);
  }
  // Rows: hot partition, host row cache, store-side cache; the rest are gathered.
  wk->rows.resize(wk->uids.size() * words);
  wk->miss_u.clear();
  wk->held.assign(wk->uids.size(), 1);
  wk->dev = DeviceCache(fid, words);
  for (size_t u = 0; u < wk->uids.size(); u++) {
    const uint64_t key = RowKey(fid, wk->uids[u]);
    float* dst = wk->rows.data() + u * words;
    if (hot_.size()) {
      if (const float* h = hot_.Row(key)) {
        std::memcpy(dst, h, words * sizeof(float));
        hot_.counters.hits++;
        continue;
      }
      hot_.counters.misses++;
    }
    if (rows_.enabled() && rows_.Get(key, dst, words)) continue;
    if (wk->dev && wk->dev->Get(key, dst)) continue;
    wk->miss_u.push_back(static_cast<uint32_t>(u));
    wk->held[u] = 0;
  }
  return Status::OK();
}

void SlsEngine::Pool(const SlsRequest& r, Work* wk) {
  // Pool in index order within each bag (the order torch.nn.EmbeddingBag sums in).
  const uint32_t dim = r.dim;
  const float* rows = wk->rows.data();
  if (r.format != RowFormat::kFloat32) {  // decode each unique row once
    wk->decoded.resize(wk->uids.size() * dim);
    for (size_t u = 0; u < wk->uids.size(); u++) DecodeRow(r.format, rows + u * wk->words, dim, wk->decoded.data() + u * dim);
    rows = wk->decoded.data();
  }
  for (size_t b = 0; b < r.num_bags; b++) {
    if (wk->done[b]) continue;
    float* acc = r.out + b * dim;
    const int64_t a = r.offsets[b], z = r.offsets[b + 1];
    for (int64_t p = a; p < z; p++) {
      const float* row = rows + static_cast<size_t>(wk->uid_of[p]) * dim;
      const float wgt = r.weights ? r.weights[p] : 1.0f;
      for (uint32_t d = 0; d < dim; d++) acc[d] += wgt * row[d];
    }
    if (r.mean && z > a) {
      const float inv = 1.0f / static_cast<float>(z - a);
      for (uint32_t d = 0; d < dim; d++) acc[d] *= inv;
    }
    if (wk->pool_cacheable && static_cast<uint32_t>(z - a) >= pooled_.min_len())
      pooled_.Put(PooledCache::Key(wk->def.id, r.mean, r.indices + a, static_cast<uint32_t>(z - a)), acc, dim);
  }
}

Status SlsEngine::Profile(const std::vector<SlsRequest>& requests) {
  MutexLock l(&mu_);
  auto_profile_ = false;  // an explicit profile replaces the automatic one
  auto_freq_ = {};
  auto_tables_ = {};
  hot_.Clear();
  if (!o_.hot_rows_bytes) return Status::OK();
  std::unordered_map<uint32_t, HotTable> tables;
  std::unordered_map<uint64_t, uint32_t> freq;
  for (const SlsRequest& r : requests) {
    FeatureDef def;
    RF_RETURN_IF_ERROR(store_->LookupFeature(r.table, &def));
    RF_RETURN_IF_ERROR(Validate(r, def));
    tables[def.id] = {r.table, def.dim};
    for (size_t i = 0; i < r.num_indices; i++) freq[RowKey(def.id, static_cast<uint64_t>(r.indices[i]))]++;
  }
  return FillHot(freq, tables);
}

Status SlsEngine::FillHot(const std::unordered_map<uint64_t, uint32_t>& freq,
                          std::unordered_map<uint32_t, HotTable>& tables) {
  std::vector<std::pair<uint32_t, uint64_t>> ranked;
  ranked.reserve(freq.size());
  for (const auto& [k, c] : freq) ranked.emplace_back(c, k);
  std::sort(ranked.begin(), ranked.end(), [](const auto& a, const auto& b) { return a.first > b.first || (a.first == b.first && a.second < b.second); });
  std::unordered_map<uint32_t, std::vector<uint64_t>> chosen;
  size_t used = 0;
  for (const auto& [c, k] : ranked) {
    const uint32_t fid = static_cast<uint32_t>(k >> 40);
    const size_t cost = tables[fid].words * sizeof(float) + 32;
    if (used + cost > o_.hot_rows_bytes) break;
    used += cost;
    chosen[fid].push_back(k & ((1ull << 40) - 1));
  }
  std::vector<float> buf;
  for (auto& [fid, ids] : chosen) {
    std::sort(ids.begin(), ids.end());
    const uint32_t dim = tables[fid].words;
    buf.resize(ids.size() * dim);
    GatherStats gs;
    RF_RETURN_IF_ERROR(store_->GatherRows(tables[fid].name, ids.data(), ids.size(), o_.vector_grained, o_.dense_page_rows, buf.data(), &gs));
    for (size_t i = 0; i < ids.size(); i++) hot_.Add(RowKey(fid, ids[i]), buf.data() + i * dim, dim);
  }
  return Status::OK();
}

Status SlsEngine::Invalidate(const std::string& table, const uint64_t* ids, size_t n) {
  MutexLock l(&mu_);
  FeatureDef def;
  RF_RETURN_IF_ERROR(store_->LookupFeature(table, &def));
  DirectMappedCache* dev = device_.count(def.id) ? device_[def.id].get() : nullptr;
  std::vector<uint64_t> hot_ids;
  for (size_t i = 0; i < n; i++) {
    const uint64_t key = RowKey(def.id, ids[i]);
    rows_.Erase(key);
    if (dev) dev->Erase(key);
    if (hot_.Contains(key)) hot_ids.push_back(ids[i]);
  }
  if (!hot_ids.empty()) {  // hot rows stay hot: refresh their copies from the store
    std::sort(hot_ids.begin(), hot_ids.end());
    hot_ids.erase(std::unique(hot_ids.begin(), hot_ids.end()), hot_ids.end());
    std::vector<float> buf(hot_ids.size() * def.dim);
    GatherStats gs;
    RF_RETURN_IF_ERROR(store_->GatherRows(table, hot_ids.data(), hot_ids.size(), o_.vector_grained, o_.dense_page_rows, buf.data(), &gs));
    for (size_t i = 0; i < hot_ids.size(); i++) hot_.Refresh(RowKey(def.id, hot_ids[i]), buf.data() + i * def.dim, def.dim);
    hot_.counters.invalidations += hot_ids.size();
  }
  pooled_.ClearTable(def.id);
  return Status::OK();
}

std::string SlsEngine::CacheStatsJson() {
  MutexLock l(&mu_);
  auto one = [](const char* name, const CacheCounters& c, size_t bytes, size_t budget) {
    return std::string("\"") + name + "\":{\"hits\":" + std::to_string(c.hits) + ",\"misses\":" + std::to_string(c.misses) +
           ",\"inserts\":" + std::to_string(c.inserts) + ",\"evictions\":" + std::to_string(c.evictions) +
           ",\"invalidations\":" + std::to_string(c.invalidations) + ",\"bytes\":" + std::to_string(bytes) +
           ",\"budget_bytes\":" + std::to_string(budget) + "}";
  };
  CacheCounters dev;
  size_t dev_bytes = 0;
  for (const auto& [fid, c] : device_) {
    dev.hits += c->counters.hits;
    dev.misses += c->counters.misses;
    dev.inserts += c->counters.inserts;
    dev.evictions += c->counters.evictions;
    dev.invalidations += c->counters.invalidations;
    dev_bytes += c->bytes();
  }
  return "{" + one("row_cache", rows_.counters, rows_.bytes(), o_.row_cache_bytes) + "," +
         one("hot_rows", hot_.counters, hot_.bytes(), o_.hot_rows_bytes) + "," +
         one("pooled_cache", pooled_.counters, pooled_.bytes(), o_.pooled_cache_bytes) + "," +
         one("device_cache", dev, dev_bytes, o_.device_cache_bytes) + "}";
}

}  // namespace recflash::ndp
