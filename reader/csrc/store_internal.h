// Internals shared by the Store's translation units (store.cc, store_open.cc,
// store_wal_replay.cc, store_key_index.cc, store_checkpoint.cc, store_write.cc,
// store_rewrite.cc, store_read.cc, store_keys.cc, store_gather.cc, store_stats.cc). Not part
// of the API.
#pragma once
#include <sys/uio.h>

#include <algorithm>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "reader/csrc/clock.h"
#include "reader/csrc/filename.h"
#include "reader/csrc/store_impl.h"
#include "reader/csrc/write_batch.h"

namespace recflash {
namespace store_internal {

constexpr const char* kMarkerMagic = "recflash store";
// 2: aligned fixed-width values; 3: raw u64 keys; 4: dictionaries; 5: the WAL files from
// wal_start consecutive (a state-record byte). A writable open upgrades an older store's marker.
constexpr int kFormatVersion = 5;
constexpr int kMinFormatVersion = 2;
// A flush builds its appends on several threads only with at least this many items per thread
// (about 100 packed pages): below, a thread's start and its partly filled page cost more than
// it saves, and small flushes keep their one-thread layout.
constexpr size_t kMinItemsPerBuildThread = 256 * 1024;  // format 2 stores open (their pages stay readable)

template <typename T>
void Append(std::string* s, const T& v) {
  s->append(reinterpret_cast<const char*>(&v), sizeof v);
}

Status SyncDir(const std::string& dir);

// A segment whose bytes do not fit its feature's value type: the metadata (type) and the page
// disagree, so its values cannot be decoded (SegmentView::Fits).
inline Status CheckSegmentFits(const SegmentView& sv, uint32_t pid, const std::string& pages_path,
                               const FeatureDef& def) {
  if (sv.Fits()) return Status::OK();
  return Status::Corruption("page " + std::to_string(pid) + " of '" + pages_path + "': the segment of feature '" +
                            def.name + "' does not fit its value type " + def.TypeString() +
                            " (the metadata and the page disagree)");
}

// Sorts key ranges [first, second] and tells whether they are pairwise disjoint: one of a
// feature's conditions for a deferred key index (RebuildFromPages, LoadCheckpoint).
inline bool SortedDisjoint(std::vector<std::pair<uint64_t, uint64_t>>* r) {
  std::sort(r->begin(), r->end());
  for (size_t i = 1; i < r->size(); i++)
    if ((*r)[i].first <= (*r)[i - 1].second) return false;
  return true;
}

}  // namespace store_internal

// ---------------------------------------------------------------------------------------
// Internal types

struct StoreImpl::WriteOp {
  // WAL payload, written from the caller's buffers: header (op, fid, n, width), keys,
  // (variable-width puts) u32 lengths, values. Empty in bulk-load mode.
  uint8_t header[13];
  std::vector<uint32_t> lens;
  std::vector<iovec> parts;
  size_t payload_bytes = 0;
  uint32_t fid = 0;
  const uint64_t* keys = nullptr;
  size_t n = 0;
  const uint8_t* values = nullptr;
  const int64_t* offsets = nullptr;
  uint32_t width = 0;
  bool tomb = false;
  bool sync = false;
  bool done = false;
  Status status;
  CondVar cv;  // waited on with the Store's queue_mu_
};

struct StoreImpl::Rec {
  uint32_t fid;
  uint64_t key;
  bool tomb;
  const uint8_t* value;
  uint32_t len;
  int64_t pos;  // KeyIndex position of the current version, or kAbsent
};

}  // namespace recflash
