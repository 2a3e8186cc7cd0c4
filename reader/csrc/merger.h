// Merger (READER §3.3) and Reclaimer: the policies that decide what to rewrite after a flush.
// The Store executes the plans (reads the pages, moves the valid records, commits).
//
// Merger rule, and why it is not the paper's literal one. The paper gathers a victim feature
// only from pages where it is "less than half of the page's valid items". Read that way the
// merger never touches a feature's own initial-load pages, which keep its never-updated items
// forever, and READER ends up reading more pages than the LSM it is meant to beat (SPEC §1,
// "Known pitfalls"). Judging "low merge benefit" by how much of a page's *capacity* the
// feature fills instead still leaves a floor near 1.5x the ideal page count: pages decay from
// full to half full before they are touched, whatever the threshold.
//
// The rule here: a feature is a victim when its fragmentation degree — pages holding it ÷ the
// *ideal* page count, ceil(live on-disk bytes ÷ page payload); measuring against the raw byte
// ratio would re-merge forever a feature just past a page boundary — exceeds `threshold`.
// Its pages are then gathered emptiest first (the most page reduction per byte rewritten, as
// in log-structured cleaning) until the feature is back to `target` = 1 + (threshold - 1) x
// target_frac times its ideal page count; pages it fills at least `low_benefit_frac` of are
// never gathered. So `threshold` really is the read/write knob: the degree oscillates between
// target and threshold, and keeping pages fuller costs more rewriting (≈ 1 / (1 - fill)).
//
// Reclaimer. Pages left holding a few valid items of other features would leak space under
// endless uniform updates. When pages in use exceed `space_amp_limit` times the pages the
// live data needs, the least-utilised pages are rewritten whole (their valid records moved,
// grouped by feature) until the ratio drops below `space_amp_target`.
#pragma once
#include <cstdint>
#include <vector>

#include "reader/csrc/metadata.h"

namespace recflash {

struct MergerOptions {
  bool enabled = true;
  double threshold = 1.5;         // fragmentation degree that makes a feature a victim
  double target_frac = 0.5;       // merge down to 1 + (threshold - 1) * target_frac
  double low_benefit_frac = 0.9;  // never gather a page the feature fills this much of
  double min_slack_pages = 1.0;   // extra pages any feature may hold before it is a victim
  // How much a page's place in the victim's runs of adjacent pages counts in the order pages
  // are gathered, in pages of payload: gathering a page between two of the feature's pages
  // splits a run (one more device read per scan), one with neither ends a read. 0: emptiest
  // first only (see the comment on the rule above Plan).
  double run_weight = 1.0;
  // The trigger while StoreOptions::bulk_load is on, for a feature whose records are all
  // current (no update has left a stale one: what a load appends); the larger of this and
  // `threshold` applies. Features with stale records keep `threshold`: their fragmentation
  // grows with every update, a load's only with its flushes. A bulk load appends: each flush
  // gives a feature its full pages and one partly filled page that it shares with the next
  // feature. A feature that adds a page or more per flush therefore stays below 2x its ideal
  // pages however long the load runs, and merging it bought little and cost much: its deferred
  // key index was materialized (every page of the feature read, 12 B of DRAM per key for the
  // rest of the session, then checkpointed), its records moved one at a time, and its pages'
  // key ranges overlapped afterwards, so its scans took the key-index path instead of placing
  // pages directly. A feature that adds less than a page per flush would grow by a shared page
  // per flush without bound: it passes 2x and is merged as before. Measured on `recflash import
  // criteo` of a 2.1 GB Kaggle-like file (16 MiB chunks, 126 flushes): 1.5 merged 30 features
  // 31 times (8.7 M records moved, 446 MB of key indexes in DRAM, peak RSS 1.05 GB, 38,021
  // pages, 376-386 MB/s); 2 merges none (5.6 MB, 0.33 GB, 37,672 pages, 499-504 MB/s).
  double bulk_load_threshold = 2.0;
};

struct ReclaimOptions {
  bool enabled = true;
  double space_amp_limit = 2.0;   // pages in use / pages the live data needs
  double space_amp_target = 1.6;
};

// A unit of rewrite work: move the valid records of `fid` (or of every feature when
// fid == kAllFeatures) out of page `page`.
struct MoveTask {
  static constexpr uint32_t kAllFeatures = 0xffffffffu;
  uint32_t page;
  uint32_t fid;
};

struct MergerStats {
  uint64_t checks = 0;
  uint64_t victims = 0;           // features merged
  uint64_t pages_gathered = 0;    // victim pages read
  uint64_t items_moved = 0;
  uint64_t bytes_written = 0;
  uint64_t pages_written = 0;
  uint64_t pages_released = 0;
};

struct ReclaimStats {
  uint64_t runs = 0;
  uint64_t pages_cleaned = 0;
  uint64_t items_moved = 0;
  uint64_t bytes_written = 0;
  uint64_t pages_released = 0;
};

// Page payload: what a page can hold besides its header.
uint32_t PagePayload(uint32_t page_size);

// Fragmentation degree of a feature: pages holding its valid items / ideal pages (>= 1, or 0
// for an empty feature).
double FragmentationDegree(const FeatureState& f, const LogicalPageTable& pt, uint32_t page_size);

class Merger {
 public:
  // bulk_load: the session is a bulk load (StoreOptions::bulk_load; see bulk_load_threshold).
  explicit Merger(const MergerOptions& o, bool bulk_load = false) : o_(o), bulk_load_(bulk_load) {}
  // Victim features among `candidates` and the pages to gather them from.
  std::vector<MoveTask> Plan(const std::vector<FeatureState*>& candidates, const LogicalPageTable& pt,
                             uint32_t page_size);
  MergerStats& stats() { return stats_; }
  const MergerOptions& options() const { return o_; }
  bool bulk_load() const { return bulk_load_; }

 private:
  MergerOptions o_;
  bool bulk_load_;
  MergerStats stats_;
};

class Reclaimer {
 public:
  explicit Reclaimer(const ReclaimOptions& o) : o_(o) {}
  // Pages in use / pages the live data needs (the on-disk space amplification).
  static double SpaceAmp(const LogicalPageTable& pt, uint32_t page_size, double* needed_pages);
  std::vector<MoveTask> Plan(const LogicalPageTable& pt, uint32_t page_size);
  ReclaimStats& stats() { return stats_; }
  const ReclaimOptions& options() const { return o_; }

 private:
  ReclaimOptions o_;
  ReclaimStats stats_;
};

}  // namespace recflash
