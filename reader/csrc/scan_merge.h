// Scan merge strategies as plain functions over page cursors (the LevelDB table/merger.cc
// idea). A scan decodes each page's records of a feature within its key range into a
// PageChunk; the functions here merge those chunks with the feature's buffered items into the
// output in key order, the newest version of each key winning (buffered items are newer than
// any page; between pages the higher seq wins) and tombstones hiding older versions. No I/O
// and no store state: tests build chunks by hand.
//
// Strategies, tried in this order by MergeChunks:
//   index  — the scan copied the feature's key index (it names the page of each key's current
//            version): one pass in key order with a cursor per chunk, no comparisons between
//            pages. Any disagreement between index and chunks falls back to the next two.
//   dense  — keys spanning little more than their count (item ids): scatter records into a
//            slot per key, chunks in ascending seq so the newest lands last, then sweep.
//   heap   — k-way merge by (key, newest seq first) emitting maximal runs of one chunk.
// Direct placement (clean, disjoint fixed-width pages decoded straight into the output) is
// the scan's own fast path; CloseDirectGaps finishes it.
#pragma once
#include <atomic>
#include <cstring>
#include <cstdint>
#include <functional>
#include <optional>
#include <span>
#include <utility>
#include <vector>

#include "reader/csrc/column.h"
#include "reader/csrc/format.h"
#include "reader/csrc/lane_helpers.h"
#include "reader/csrc/mutex.h"
#include "reader/csrc/page_map.h"
#include "reader/csrc/thread_annotations.h"
#include "reader/csrc/version_set.h"
#include "reader/csrc/write_buffer.h"

namespace recflash {

// One page's records of one feature inside the scan range, decoded.
struct PageChunk {
  uint64_t seq = 0;
  double enc = 0;     // encoded bytes per record
  bool clean = true;  // no stale records and no tombstones
  std::vector<uint64_t> keys;
  std::vector<uint8_t> tomb;   // empty: no tombstones
  std::vector<uint8_t> vals;
  std::vector<uint32_t> lens;  // variable-width only
};

// The keys of `sv` with lo <= key < hi (hi ignored when to_end), ascending, and their delete
// flags (`tomb` left empty when the segment has none); returns the records' range [a, z) in
// the segment. What DecodeChunk and keys-only scans (store_keys.cc) both start from.
std::pair<size_t, size_t> DecodeKeysInRange(const SegmentView& sv, uint64_t lo, uint64_t hi, bool to_end,
                                             std::vector<uint64_t>* keys, std::vector<uint8_t>* tomb);

// Decodes the records of `sv` with lo <= key < hi (hi ignored when to_end) into `c`.
// `all_valid`: the page table says every record of the segment is current.
void DecodeChunk(const SegmentView& sv, uint64_t seq, uint64_t lo, uint64_t hi, bool to_end, bool all_valid,
                 PageChunk* c);

// The output of one feature's merge and what it cost.
struct MergeSink {
  MergeSink(ColumnData* col, uint32_t width, uint32_t elem, const BufferedItems& buf,
            const std::vector<PageChunk>& chunks);

  // Buffered item e (skipped when a tombstone).
  void EmitBuffered(size_t e);
  // Buffered items below `key`.
  void EmitBufferedBelow(uint64_t key) {
    while (k < buf.size() && buf.keys[k] < key) EmitBuffered(k++);
  }
  // Records [r0, r1) of chunk c, all current versions (tombstones skipped).
  void CopyRecords(uint32_t c, uint32_t r0, uint32_t r1);
  // A run of winning records of chunk c overlaid with the buffered items (which are newer).
  void EmitRun(uint32_t c, uint32_t r0, uint32_t r1);
  // The remaining buffered items.
  void Finish() {
    while (k < buf.size()) EmitBuffered(k++);
  }
  // Back to empty (after a failed index walk).
  void Reset();

  ColumnData* col;
  const uint32_t w;     // fixed value width, 0 for variable-width values
  const uint32_t elem;  // element size (variable-width offsets count elements)
  const BufferedItems& buf;
  const std::vector<PageChunk>& cs;
  std::vector<std::vector<uint64_t>> voff;  // variable width: value byte offsets per chunk
  size_t k = 0;                              // buffer cursor
  uint64_t out_bytes = 0;
  uint64_t useful = 0;  // logical bytes (8 + value) of the items taken from pages
  double encoded = 0;   // their on-disk bytes
};

// Chunks with records, in order of first key (newest seq first on ties).
std::vector<uint32_t> ChunkOrder(const std::vector<PageChunk>& chunks);

// A scan's view of a feature's key index in its range: keys ascending, each with the
// location of its current version (page | KeyIndex::kTomb). A KeyIndex::Snapshot's arrays.
struct IndexEntries {
  std::span<const uint64_t> keys;
  std::span<const uint32_t> locs;
};

// Index-guided merge over an index snapshot (keys ascending, locs = page | KeyIndex::kTomb);
// scans use it for variable-width values (fixed-width ones take index placement below)
// whose pages are `refs` (chunk j is page refs[j]). False when index and chunks disagree;
// the sink is then as the call found it only if the caller Resets it.
bool MergeByIndex(std::span<const uint64_t> ikeys, std::span<const uint32_t> ilocs,
                  const std::vector<PageRef>& refs, MergeSink* sink);
// Dense-key scatter over the chunks in `order`; false (nothing done) when the keys are not
// dense enough for it to pay.
bool MergeDense(const std::vector<uint32_t>& order, MergeSink* sink);
// K-way merge of the chunks in `order` (see ChunkOrder).
void MergeHeap(const std::vector<uint32_t>& order, MergeSink* sink);

enum class MergeKind { kIndex, kIndexFallback, kDense, kHeap };
// The whole merge of one feature: index snapshot (when given) -> dense -> heap, then the
// remaining buffered items. Returns the strategy that produced the output.
MergeKind MergeChunks(const IndexEntries* index, const std::vector<PageRef>& refs, MergeSink* sink);

// Index placement: the index merge for fixed-width values done as pages arrive, so it
// overlaps the reads still in flight and needs no per-page copies. Before the reads, the plan
// writes every output key (from the index snapshot and the buffered items) and the buffered
// values, sizes the output exactly, and lists per page the output slots of the keys whose
// current version it holds (ascending). Each arriving page then copies those records' values
// straight into their slots; a page that disagrees with the index (a record missing, or a
// tombstone) makes the scan fall back to the chunk merges above.
// Each slot carries its key next to its output position, so a page's placement reads its
// slots in order instead of loading output keys from positions scattered over the result.
struct IndexPlan {
  std::vector<uint32_t> first;  // per ref j: room for its valid records at slots[first[j], ..)
  std::vector<uint32_t> fill;   // per ref j: its slots (its first part's, see below) end at slots[fill[j]]
  struct Slot {
    uint64_t key;  // the key of the record that goes there
    uint64_t pos;  // its output position
  };
  HVec<Slot> slots;  // grouped by ref, ascending within each: one write stream per page
  uint64_t from_disk = 0;       // output items that come from pages
  // A plan made in one pass by several parts (IndexPlanner::Fused): ref j's group holds
  // room[j] slots per part, part p's from first[j] + p * room[j]; part 0's end at fill[j],
  // part p's (p >= 1) at part_fill[p - 1][j]. PlaceIndexed reads two parts' runs as they are
  // (its two search chains); Gather(j) moves more together first.
  bool fused = false;
  unsigned parts = 1;
  std::vector<uint32_t> room;
  std::vector<std::vector<uint32_t>> part_fill;
  // Makes ref j's slots one ascending run, slots[first[j], fill[j]): the caller owns ref j
  // (one lane places a page). Idempotent; nothing to do for a plan in one part.
  void Gather(uint32_t j);
};
// Makes the plan in parts that threads may run side by side: the index snapshot's entries are
// split into `parts` ranges (1 when items are buffered in the range: where an entry's output
// goes then depends on the buffered keys before it). Each part's Refs (which ref each entry
// names, counted per ref) may run at once; then Size, once all have; then each part's Slots
// at once. Every output slot and position is written by exactly one part.
//
// The usual scan needs no counting pass (fused()): a whole feature read with nothing
// buffered and no tombstone in its pages, whose index entries are as many as its pages' valid
// records. Each ref then gets exactly its valid records, and each entry's output position is
// its own index, so one pass per part (Fused) writes the output keys and the slots, each part
// into room of its own in every ref's group (its share of a ref is unknown until it is done);
// FinishFused checks that every ref got exactly its valid records. Profile of the compaction
// benchmark's default store: the counting and slot passes were 8.4 % and 10.6 % of its scans'
// CPU, the one pass 11.7 % (the scans' wall time unchanged: the plan runs while reads are in flight).
class IndexPlanner {
 public:
  IndexPlanner(std::span<const uint64_t> ikeys, std::span<const uint32_t> ilocs,
               const std::vector<PageRef>& refs, const BufferedItems& buf, uint32_t width, ColumnData* col,
               IndexPlan* plan, unsigned parts);
  unsigned parts() const { return static_cast<unsigned>(bound_.size() - 1); }
  // The one-pass plan applies (see above): call Fused per part, then FinishFused, instead of
  // Refs, Size, Slots and Finish.
  bool fused() const { return fused_; }
  // Part p of the one-pass plan. False when an entry names a page not in `refs` (or a
  // tombstone) or a ref would get more entries than its valid records. `yield` (when set) is
  // called between chunks of kYieldEntries entries: a scan's lane keeps its reads going
  // meanwhile (IoRing::Pump).
  static constexpr size_t kYieldEntries = 8192;
  bool Fused(unsigned p, const std::function<void()>& yield = nullptr);
  // After every part's Fused returned true: whether every ref got exactly its valid records
  // (then the plan is done), else the index and the pages' counts disagree.
  bool FinishFused();
  // The plan made the two-pass way in one part, from scratch (after the one-pass plan
  // failed: valid counts that disagree with the index, or a damaged index). False when an
  // entry names a page not in `refs` or a ref gets more entries than its valid records.
  bool PlanInOnePart();
  // Pass 1 of part p. False when an index location names a page not in `refs`.
  bool Refs(unsigned p);
  // Sizes the plan and the output after every part's Refs returned true. False when a ref
  // would hold more entries than its valid records (index and pages disagree).
  bool Size();
  // Pass 2 of part p, after Size: the output keys, the buffered values and the part's slots.
  void Slots(unsigned p);
  // After every part's Slots: the plan's fill and from_disk, the output trimmed.
  void Finish();

 private:
  const std::span<const uint64_t> ik_;
  const std::span<const uint32_t> il_;
  const std::vector<PageRef>& refs_;
  const BufferedItems& buf_;
  const uint32_t w_;
  ColumnData* col_;
  IndexPlan* plan_;
  const PageMap ref_of_;                     // page -> ref, built once for every part
  std::vector<size_t> bound_;                // part p: entries [bound_[p], bound_[p + 1])
  HVec<uint32_t> rid_;                       // each entry's ref (refs.size(): a tombstone); two-pass only
  std::vector<std::vector<uint32_t>> cnt_;   // per part: entries per ref, tombstones last
  std::vector<std::vector<uint32_t>> fill_;  // per part: its next slot per ref
  std::vector<uint64_t> out_;                // per part: its first output position
  uint64_t o_ = 0;                           // output items (one part: set by its Slots)
  bool fused_ = false;
  std::vector<std::vector<uint32_t>> lim_;   // fused: per part, the end of its room per ref
};
// The plan made by `lanes` threads side by side (see StoreOptions::scan_threads): each lane
// calls Share once it has submitted its first reads, and Planned before it places a page.
// Share(l) runs lane l's parts of the plan and waits for the other lanes only between the
// passes, so it returns once every lane has called Share; each lane must therefore call it
// on every path (also when its reads failed), or the others wait forever.
// `prepare`, when given, runs first, on lane 0 (the scan's own thread, with its first reads
// in flight): it sets `*index`, the snapshot the plan reads, or returns false when it cannot
// (the plan then fails as when index and pages disagree).
class LanePlan {
 public:
  LanePlan(const IndexEntries* index, const std::vector<PageRef>& refs,
           const BufferedItems& buf, uint32_t width, ColumnData* col, IndexPlan* plan, unsigned lanes,
           std::function<bool()> prepare = nullptr);
  // Lane l's share (lane l's thread only; later calls return at once). `yield`: see
  // IndexPlanner::Fused.
  void Share(unsigned l, const std::function<void()>& yield = nullptr);
  // Waits until every lane's share is done: whether the plan holds (false: index and pages
  // disagree; the feature is merged from chunks instead).
  bool Planned();

 private:
  const unsigned lanes_;
  const std::function<bool()> prepare_;
  const std::function<void()> make_planner_;  // the constructor's inputs, bound
  std::optional<IndexPlanner> planner_;       // made by lane 0 once the index snapshot is there
  std::vector<uint8_t> shared_;  // per lane, written by its own thread only
  std::atomic<int> ready_{0};    // 0: not yet; 1: the planner is made; 2: prepare failed
  std::atomic<unsigned> refs_done_{0};
  std::atomic<bool> refs_ok_{true};
  std::atomic<int> sized_{0};  // 0: not yet; 1: sized; 2: the index and the pages disagree
  std::atomic<unsigned> shares_done_{0};
  std::atomic<int> planned_{0};  // 0: not yet; 1: planned; 2: failed
};
// The whole plan on the caller's thread. False when an index location names a page not in
// `refs` or the index and the pages disagree (col and plan are then unusable).
bool PlanIndexPlacement(std::span<const uint64_t> ikeys, std::span<const uint32_t> ilocs,
                        const std::vector<PageRef>& refs, const BufferedItems& buf, uint32_t width, ColumnData* col,
                        IndexPlan* plan);
// Fills ref j's slots from its page's segment `sv` (width set); `scratch` holds decoded keys.
// Adds the encoded bytes of the records taken. False when the page disagrees with the index.
// The caller owns ref j (a plan in more than two parts has its slots gathered here).
bool PlaceIndexed(const SegmentView& sv, IndexPlan* plan, uint32_t j, ColumnData* col,
                  std::vector<uint64_t>* scratch, double* encoded);

// Dense placement: the dense merge for fixed-width values. When the feature's keys in the
// range span little more than its records (item ids), every key has a slot; each record
// whose version is newer than the slot's (seq rank, tombstones included) is written into it,
// so pages may come in any order; the finish sweeps the slots in key order with the buffered
// items (newer than any page) into the output.
//
// Slots for every key of a large feature do not fit in a core's cache, and after uniform
// updates half its records sit on update pages whose keys are dozens apart: written as each
// page arrives, every such record was a cache miss (~70 % of a 1.8 M-key feature's scan CPU).
// So an arriving page is only staged — its records' slot numbers and values appended in the
// segment's (ascending) key order — and a sweep places them one window of slots at a time
// (window: cache-sized), each page's records of that window being the next run of its staged
// records, oldest page first, then writes the window into the output while it is still in
// cache. A window is swept as soon as every page whose key range (page table) reaches into it
// has been staged: a scan that reads the pages in key order sweeps while its reads are in flight.
struct DensePlan {
  uint64_t kmin = 0, span = 0;
  uint64_t lo = 0, hi = 0;  // the scan range, hi inclusive
  uint32_t w = 0;
  uint32_t window = 0;         // slots placed and swept together (tests may shrink it after planning)
  std::vector<uint32_t> rank;  // per ref: its seq rank, 1 = oldest
  std::vector<double> enc;     // per rank: encoded bytes per record of that page's segment
  // Per ref: the slots its records may take in the range, [first, last] (from the page
  // table; first = span for a ref with none in the range).
  std::vector<uint64_t> first, last;
  // Staged records: ref j's records in the range are records [base[j], base[j] + staged[j])
  // of `recs`, ascending key order, each (stride 4 + w) its slot (key - kmin, with kTomb set
  // for a tombstone; spans stay below kTomb) and its value (a tombstone's unwritten): one
  // stream per page for the sweep to read, not two.
  static constexpr uint32_t kTomb = 1u << 31;
  std::vector<uint64_t> base;
  std::vector<uint32_t> staged;
  std::vector<uint8_t> arrived;  // per ref: staged already (a page is staged once)
  uint32_t stride = 0;
  HVec<uint8_t> recs;
};
// Whether the pages' keys in [lo, hi_incl] span little enough more than their records for a
// slot per key to pay (item ids; MergeDense's rule).
bool DenseKeyRange(const std::vector<PageRef>& refs, uint64_t lo, uint64_t hi_incl);
// False when the keys are not dense enough for slots to pay (the chunk merges then run).
// `hi_incl`: the range's largest key.
bool PlanDensePlacement(const std::vector<PageRef>& refs, uint64_t lo, uint64_t hi_incl, uint32_t width,
                        DensePlan* plan);
// Stages ref j's records (segment `sv`, width set); `scratch` holds its keys. False (nothing
// staged) when the page and its metadata disagree: the segment holds more records than the
// page table lists, a key in the scan range outside the key range listed for it, or keys out
// of order (the sweep relies on each page's staged records ascending within its range).
bool PlaceDense(const SegmentView& sv, uint32_t j, DensePlan* plan, std::vector<uint64_t>* scratch);

// The output of a dense placement: the slots' current versions merged with the buffered
// items (newer than any page), in key order, written window by window. With `background`,
// a helper thread sweeps the windows the staged pages allow while the scan's thread goes on
// reading and staging (a scan is CPU-bound: staging and sweeping take turns on one core
// otherwise); without, Advance sweeps them on the caller's thread.
class DenseSweep {
 public:
  // Sizes `col` for the most items the output can hold; Finish trims it. `plan` and `buf`
  // must outlive the sweep. The helper is a parked one of `helpers` when one is idle, else a
  // thread of its own; no thread to be had: the caller's thread sweeps.
  DenseSweep(const DensePlan& plan, const BufferedItems& buf, ColumnData* col, bool background = false,
             LaneHelpers* helpers = nullptr);
  ~DenseSweep();  // stops the helper (a scan that failed midway)
  DenseSweep(const DenseSweep&) = delete;
  DenseSweep& operator=(const DenseSweep&) = delete;
  // Sweeps the windows whose pages have all been staged (call after each PlaceDense).
  void Advance();
  // Sweeps the rest (every page of the range staged), trims the output and adds the logical
  // and encoded bytes of the items taken from pages.
  void Finish(uint64_t* useful, double* encoded);
  // Slots swept so far by the first sweeper (the windows written to the output).
  uint64_t swept() const { return main_.ws; }
  // Slots the caller's thread swept in Finish beside the helper (0: no split).
  uint64_t split_slots() const { return split_slots_; }
  // Whether a helper thread sweeps.
  bool background() const { return helper_.running(); }

 private:
  // One sweep's position and scratch. The main sweeper runs from slot 0 (on the helper, or
  // the caller's thread without one); in Finish the caller's thread may sweep the last
  // windows with a second one beside it, writing its output further up (see Finish).
  struct Sweeper {
    uint64_t o = 0;                // output items written (next output position)
    size_t k = 0;                  // next buffered item
    uint64_t ws = 0;               // next window's first slot
    size_t waiting = 0;            // by_first_[waiting..]: not yet active
    std::vector<uint32_t> active;  // refs with staged records left, oldest first
    std::vector<uint64_t> at;      // per ref: its next staged record
    uint64_t from_disk = 0;        // items taken from pages ...
    double encoded = 0;            // ... and their encoded bytes
    std::vector<uint32_t> tags;    // the window: rank << 1 | tomb per slot (0 = no version) ...
    std::vector<uint8_t> vals;     // ... and the value
  };
  // The slot below which every window's pages are staged (caller's thread).
  uint64_t ReadyBound();
  // Sweeps the windows that end at or below `bound` (the last may end at the span).
  void SweepTo(Sweeper* c, uint64_t bound);
  void Helper();
  template <uint32_t kW>
  void PlaceRef(Sweeper* c, uint32_t j, uint64_t ws, uint64_t we);
  void PutBuffered(Sweeper* c, size_t e);
  // A sweeper's scratch (window, cursors, tables).
  void InitSweeper(Sweeper* c);
  // A second sweeper for the windows from slot `from` (a window boundary) up.
  void StartSweeper(Sweeper* c, uint64_t from);

  const DensePlan& plan_;
  const BufferedItems& buf_;
  ColumnData* col_;
  // Caller's thread only.
  std::vector<uint32_t> by_first_;  // refs by first slot
  size_t ready_ = 0;                // by_first_[..ready_): staged
  uint64_t published_ = 0;          // the last bound handed to the helper
  uint64_t split_slots_ = 0;
  Sweeper main_;  // the helper's (the caller's without one)
  // Hand-over to the helper: the bound up to which it may sweep (staging written before it
  // is published under mu_), whether that bound is its last, or stop; and the windows it
  // has taken.
  Mutex mu_;
  CondVar cv_;
  uint64_t bound_ RF_GUARDED_BY(mu_) = 0;
  uint64_t claimed_ RF_GUARDED_BY(mu_) = 0;  // the end of the last window the helper took
  bool last_ RF_GUARDED_BY(mu_) = false;
  bool stop_ RF_GUARDED_BY(mu_) = false;
  HelperThread helper_;  // the sweep's helper: a parked LaneHelpers thread or one of its own
};
// The whole sweep at once (every page staged).
void FinishDensePlacement(const DensePlan& plan, const BufferedItems& buf, ColumnData* col, uint64_t* useful,
                          double* encoded);

// Direct placement: page j's records were decoded at col.keys[slot[j]..], of which
// [span[j].first, span[j].second) are in range; moves them together. Returns the items kept.
uint64_t CloseDirectGaps(const std::vector<uint64_t>& slot, const std::vector<std::pair<uint32_t, uint32_t>>& span,
                         uint32_t width, ColumnData* col);

}  // namespace recflash
