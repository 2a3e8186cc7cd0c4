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
  if (r.dim != def.dim)
    return Status::InvalidArgument(where + ": rows have dim " + std::to_string(def.dim) + ", the request expects " + std::to_string(r.dim));
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

Status SlsEngine::Run(const std::vector<SlsRequest>& requests, bool vector_grained, SlsStats* stats) {
  const auto t0 = std::chrono::steady_clock::now();
  *stats = SlsStats();
  std::vector<uint32_t> order, uid_of;
  std::vector<uint64_t> uids;
  std::vector<float> rows;
  for (const SlsRequest& r : requests) {
    FeatureDef def;
    RF_RETURN_IF_ERROR(store_->LookupFeature(r.table, &def));
    RF_RETURN_IF_ERROR(Validate(r, def));
    const size_t n = r.num_indices;
    const uint32_t dim = def.dim;
    // Sorted (row id, position) pairs: each row is read once however often it is used.
    order.resize(n);
    std::iota(order.begin(), order.end(), 0u);
    std::sort(order.begin(), order.end(), [&](uint32_t a, uint32_t b) { return r.indices[a] < r.indices[b]; });
    uids.clear();
    uid_of.resize(n);
    for (size_t k = 0; k < n; k++) {
      const uint64_t id = static_cast<uint64_t>(r.indices[order[k]]);
      if (uids.empty() || uids.back() != id) uids.push_back(id);
      uid_of[order[k]] = static_cast<uint32_t>(uids.size() - 1);
    }
    rows.resize(uids.size() * dim);
    GatherStats gs;
    RF_RETURN_IF_ERROR(store_->GatherRows(r.table, uids.data(), uids.size(), vector_grained, rows.data(), &gs));
    // Pool in index order within each bag (the order torch.nn.EmbeddingBag sums in).
    std::memset(r.out, 0, sizeof(float) * r.num_bags * dim);
    for (size_t b = 0; b < r.num_bags; b++) {
      float* acc = r.out + b * dim;
      const int64_t a = r.offsets[b], z = r.offsets[b + 1];
      for (int64_t p = a; p < z; p++) {
        const float* row = rows.data() + static_cast<size_t>(uid_of[p]) * dim;
        const float wgt = r.weights ? r.weights[p] : 1.0f;
        for (uint32_t d = 0; d < dim; d++) acc[d] += wgt * row[d];
      }
      if (r.mean && z > a) {
        const float inv = 1.0f / static_cast<float>(z - a);
        for (uint32_t d = 0; d < dim; d++) acc[d] *= inv;
      }
    }
    stats->lookups += n;
    stats->unique_rows += uids.size();
    stats->gather.rows += gs.rows;
    stats->gather.buffer_rows += gs.buffer_rows;
    stats->gather.vector_rows += gs.vector_rows;
    stats->gather.page_rows += gs.page_rows;
    stats->gather.device_reads += gs.device_reads;
    stats->gather.device_bytes += gs.device_bytes;
    stats->gather.seconds += gs.seconds;
  }
  stats->seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  return Status::OK();
}

}  // namespace recflash::ndp
