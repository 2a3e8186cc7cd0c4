// On-disk page format.
//
// A page is `page_size` bytes (a flash page, default 16 KiB), written and read whole with
// O_DIRECT. Layout:
//
//   PageHeader (40 B)  magic, crc32c of bytes [8, page_size), seq, page id, segment count
//   SegDesc[nseg]      per-feature directory: feature id, item count, body offset/length,
//                      min/max key — a reader jumps straight to its feature's segment
//   segment bodies     one per feature present in the page, items sorted by key:
//                        u8 enc: bits 0-2 the keys' encoding (0: a run, min_key + i, no
//                           bytes; 1: LEB128 varint deltas, dense integer keys cost 1-2 bytes
//                           each; 2: a bitmap over [min_key, max_key], compact pages only,
//                           when smaller; 4: raw little-endian u64 (format 3), when the deltas
//                           average >= kRawKeyMinDeltaBytes, random 64-bit ids: decoding 6-8
//                           byte varints costs more CPU than the bytes they save); bits 4-7:
//                           packed int64 values, the bytes per value;
//                        u8 has_tomb, u16 pad, u32 keys_bytes
//                        tombstone bitmap (only when the segment holds deletes)
//                        pad bytes, so fixed-width values of >= 16 bytes start aligned to
//                              their power-of-two factor (<= 512): a 128-byte embedding row
//                              never straddles a 512-byte device block
//                        values: fixed width: count * width bytes;
//                                int64 packed (frame of reference): i64 base, then
//                                  count * N-byte unsigned offsets from it (N = 1, 2, 4),
//                                  when the segment's value range allows — 32-bit hashed ids
//                                  take 4 bytes, small counts 1 or 2, instead of 8;
//                                variable: u32 offsets[count + 1], then the bytes
//                      (Pages written before packing existed have enc bits 4-7 zero and
//                      read unchanged.)
//
// `seq` orders pages: for a key stored in several pages (an old version not yet reclaimed),
// the page with the highest seq holds the current version. Recovery relies on this.
#pragma once
#include <algorithm>
#include <cstdint>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "reader/csrc/status.h"
#include "reader/csrc/types.h"

namespace recflash {

constexpr uint32_t kPageMagic = 0x47504652;  // "RFPG"
constexpr uint16_t kPageFormatVersion = 4;     // written (4: dictionary-packed int64 segments)
constexpr uint16_t kMinPageFormatVersion = 2;  // still read (2 lacks raw keys, 3 dictionaries)
// Mean varint delta size (bytes) from which a segment stores its keys raw.
constexpr uint32_t kRawKeyMinDeltaBytes = 6;

struct PageHeader {
  uint32_t magic;
  uint32_t crc;
  uint64_t seq;
  uint32_t page_id;
  uint16_t nseg;
  uint16_t version;
  uint32_t used;
  uint32_t reserved[3];
};
static_assert(sizeof(PageHeader) == 40);

struct SegDesc {
  uint32_t feature_id;
  uint32_t count;
  uint32_t offset;
  uint32_t length;
  uint64_t min_key;
  uint64_t max_key;
};
static_assert(sizeof(SegDesc) == 32);

constexpr uint32_t kSegBodyHeader = 8;

// Alignment of fixed-width values inside a page (1 = none).
inline uint32_t ValueAlign(uint32_t width) {
  if (width < 16) return 1;
  const uint32_t a = width & (~width + 1);  // largest power of two dividing width
  return a < 512 ? a : 512;
}
// Offset of row 0 in a page holding a single run-keyed, tombstone-free segment of `width`.
inline uint32_t SoloRowBase(uint32_t width) {
  const uint32_t base = sizeof(PageHeader) + sizeof(SegDesc) + kSegBodyHeader;
  const uint32_t a = ValueAlign(width);
  return (base + a - 1) / a * a;
}

// What a writer learns about each segment it put into a page; becomes metadata.
struct SegmentSummary {
  uint32_t feature_id = 0;
  uint32_t count = 0;        // records, tombstones included
  uint32_t tombs = 0;
  uint64_t min_key = 0, max_key = 0;
  uint64_t item_bytes = 0;   // logical bytes of the non-tombstone records
  uint32_t length = 0;       // on-disk bytes of the segment (directory entry + body)
};

// Bytes per frame-of-reference packed value for a value range (8: no packing pays).
inline uint32_t PackBytes(int64_t vmin, int64_t vmax) {
  const uint64_t range = static_cast<uint64_t>(vmax) - static_cast<uint64_t>(vmin);
  return range <= 0xffu ? 1 : range <= 0xffffu ? 2 : range <= 0xffffffffu ? 4 : 8;
}

// Dictionary packing of an int64 segment (compact pages; value-region layout):
//   i64 base | u32 entries | u8 entry bytes | u8 index bits | u16 0 |
//   entries in order of first appearance, each (value - base) in `entry bytes` | one index
//   per record, LSB-first bit-packed, `index bits` each (0 when there is one entry).
// Categorical ids hashed over 32 bits cost 4 bytes per record packed by range; a page of a
// feature with a few hundred distinct ids holds them in 1-2 bytes each (Parquet's dictionary
// pages, kept per segment so a page stays self-contained).
constexpr uint32_t kDictHeader = 16;
constexpr uint32_t kPackDict = 8;        // the segment's pack nibble for a dictionary
constexpr uint32_t kMaxDictEntries = 4096;  // 12-bit indexes; beyond, the range packing is as good
inline uint32_t DictBits(uint32_t entries) { return entries <= 1 ? 0 : 32 - __builtin_clz(entries - 1); }
inline uint64_t DictValueBytes(uint64_t n, uint32_t entries, uint32_t entry_bytes) {
  return kDictHeader + static_cast<uint64_t>(entries) * entry_bytes + (n * DictBits(entries) + 7) / 8;
}
// Value bytes of a packable int64 segment of n records: packed by range, or by dictionary when
// `entries` (its distinct values; 0 = not tracked) makes that smaller.
inline uint64_t PackedValueBytes(uint64_t n, int64_t vmin, int64_t vmax, uint32_t entries) {
  const uint32_t pack = PackBytes(vmin, vmax);
  uint64_t b = pack < 8 ? 8 + n * pack : 8 * n;
  if (entries) b = std::min(b, DictValueBytes(n, entries, pack));
  return b;
}

// Distinct values of an int64 segment a PageBuilder is filling (open addressing, grows to
// 2 x kMaxDictEntries slots), numbered in order of first appearance: whether a dictionary pays
// is known at every Add, and Finish looks each record's index up instead of sorting.
// A slot holds only a 16-bit index into the values (kEmpty when free): the table of a full
// dictionary is 16 KiB, and the values 32 KiB, where slots holding the values themselves took
// 128 KiB. Hashed ids (a new value per record: every probe a miss) mostly read the small
// table alone, which stays in L1.
class DistinctSet {
 public:
  static constexpr uint32_t kAbsent = UINT32_MAX;
  // Index of v, or kAbsent.
  uint32_t Find(int64_t v) const {
    if (order_.empty()) return kAbsent;
    for (size_t i = Slot(v);; i = (i + 1) & mask_) {
      const uint16_t x = slots_[i];
      if (x == kEmpty) return kAbsent;
      if (order_[x] == v) return x;
    }
  }
  // Index of v; when absent, inserts it if may_insert (else kAbsent). One probe for both.
  uint32_t FindOrInsert(int64_t v, bool may_insert);
  void Truncate(uint32_t n);   // keeps the first n values (by index)
  uint32_t size() const { return static_cast<uint32_t>(order_.size()); }
  const std::vector<int64_t>& values() const { return order_; }  // by index
  // Empties the set for another segment, keeping its allocations (a table that was mostly
  // unused shrinks back to its first size, so a small segment does not wipe a large one).
  void Clear();

 private:
  static constexpr uint16_t kEmpty = 0xffff;
  static_assert(kMaxDictEntries < kEmpty, "indexes are 16-bit");
  size_t Slot(int64_t v) const { return (static_cast<uint64_t>(v) * 0x9E3779B97F4A7C15ull) >> shift_; }
  void Grow();  // doubles the slots (64 at first) and re-inserts in index order
  void SetCapacity(size_t cap);  // empty slots, cap of them (a power of two)
  std::vector<uint16_t> slots_;
  std::vector<int64_t> order_;
  size_t mask_ = 0;
  int shift_ = 64;
};

class PageBuilder {
 public:
  // compact: int64 segments frame-of-reference packed when their range allows, and key
  // bitmaps where they are smaller than varint deltas (StoreOptions::compact_pages).
  explicit PageBuilder(uint32_t page_size, bool compact = false) : page_size_(page_size), compact_(compact) {
    Reset();
  }

  void Reset();
  bool empty() const { return segs_.empty(); }
  // Largest value (bytes) that fits in an otherwise empty page.
  static uint32_t MaxValueBytes(uint32_t page_size);

  // Appends an item if it fits; returns false (and changes nothing) if the page is full.
  bool Add(const FeatureDef& f, uint64_t key, const uint8_t* value, uint32_t len, bool tomb);

  // Appends as many of n fixed-width, tombstone-free items (keys ascending, above any key of
  // this feature already in the page; values packed, f.fixed_width() bytes each) as fit, and
  // returns how many. The bulk form of Add: sizes are computed once per run instead of per
  // item, and keys and values are copied with one memcpy each.
  size_t AddRun(const FeatureDef& f, const uint64_t* keys, const uint8_t* values, size_t n);

  // Serializes into `buf` (page_size bytes), stamping seq, page id and — unless the caller
  // stamps the page later (StampPageId, which checksums again) — the checksum.
  void Finish(uint8_t* buf, uint64_t seq, uint32_t page_id, std::vector<SegmentSummary>* out,
              bool checksum = true) const;

  uint32_t used_bytes() const;

  // The open page's segments as items, for moving them into another builder (PageBatch
  // gathers the partly filled last pages of its threads this way). Valid until the next Add.
  struct SegItems {
    uint32_t fid;
    uint32_t width;            // 0 = variable: values delimited by offsets[0..n]
    bool any_tomb;
    const uint64_t* keys;
    const uint8_t* values;
    const uint32_t* offsets;   // variable only
    size_t n;
  };
  size_t segments() const { return segs_.size(); }
  SegItems segment(size_t i) const {
    const Seg& s = segs_[i];
    return {s.fid, s.width, s.any_tomb, s.keys.data(), s.values.data(), s.offsets.data(), s.keys.size()};
  }

 private:
  struct Seg {
    uint32_t fid = 0;
    uint32_t width = 0;  // 0 = variable
    bool packable = false;  // int64: values may be stored frame-of-reference packed
    int64_t vmin = 0, vmax = 0;  // value range of the slots (packable only)
    DistinctSet distinct;        // packable: its distinct values while a dictionary may pay
    bool dict_ok = false;        // packable and few enough distinct values so far (kMaxDictEntries)
    std::vector<uint16_t> codes;  // dict_ok: each record's dictionary index (Finish writes them)
    int64_t last = 0;            // the last record's value and index: repeats skip the hash
    uint32_t last_code = DistinctSet::kAbsent;
    uint32_t dict_entries() const { return dict_ok ? distinct.size() : 0; }
    // Index of v in the distinct values, kAbsent when new (then its index is dict_entries()).
    uint32_t Code(int64_t v) const { return v == last && last_code != DistinctSet::kAbsent ? last_code : distinct.Find(v); }
    // Records v (its Code is `code`): a new value joins the dictionary unless that would pass
    // kMaxDictEntries, where no dictionary pays any more and tracking stops. (A cap of a
    // quarter of the page measured 15 % more pages on the Criteo-like preset for no CPU gain.)
    void Record(int64_t v, uint32_t code) {
      if (!dict_ok) return;
      if (code == DistinctSet::kAbsent) {
        if (distinct.size() + 1 > kMaxDictEntries) {
          dict_ok = false;  // the set and codes keep their memory for the builder's next segment
          codes.clear();
          return;
        }
        code = distinct.FindOrInsert(v, true);
      }
      codes.push_back(static_cast<uint16_t>(code));
      last = v;
      last_code = code;
    }
    // Record(v, Code(v)) in one hash probe, unless v would be the entry past
    // kMaxDictEntries: then nothing is recorded and false returned. dict_ok only.
    bool Take(int64_t v) {
      uint32_t code = last_code;
      if (v != last || last_code == DistinctSet::kAbsent) {
        code = distinct.FindOrInsert(v, distinct.size() < kMaxDictEntries);
        if (code == DistinctSet::kAbsent) return false;
      }
      codes.push_back(static_cast<uint16_t>(code));
      last = v;
      last_code = code;
      return true;
    }
    std::vector<uint64_t> keys;
    std::vector<uint8_t> tomb;
    std::vector<uint8_t> values;
    std::vector<uint32_t> offsets;  // variable only: offsets[0] = 0
    uint32_t varint_bytes = 0;
    bool bitmap_ok = false;  // compact: a key bitmap may replace the varints
    bool run = true;
    bool any_tomb = false;
    uint32_t tombs = 0;
    uint64_t item_bytes = 0;
    uint32_t BodyBytes() const;
  };
  // Closes the open segment (its bytes join closed_bytes_) and starts `s` (empty, or holding
  // the distinct values of the items about to be added) as the one for f.
  Seg& OpenSegment(const FeatureDef& f, bool packable, Seg s);
  // An empty segment, with the allocations of one an earlier page used when there is one:
  // a bulk load fills thousands of pages, and growing each page's vectors and hash table from
  // nothing cost reallocation copies and page faults per page.
  Seg TakeSpare();
  static Seg Recycled(Seg&& old);
  // packed_bytes: the value bytes of a packable int64 segment (PackedValueBytes; 0 = plain).
  static uint32_t SegBytes(uint32_t n, bool run, uint32_t key_bytes, bool any_tomb, uint32_t width,
                           uint64_t value_bytes, uint64_t packed_bytes = 0);
  uint32_t page_size_;
  bool compact_ = false;
  std::vector<Seg> segs_;
  std::vector<Seg> spare_;  // emptied segments of finished pages (Reset), for TakeSpare
  uint32_t closed_bytes_ = 0;  // header + finished segments
};

// Re-stamps the page id of a finished page and recomputes its checksum (ids are allocated
// after a batch of pages has been built, so a batch can take one contiguous run).
void StampPageId(uint8_t* buf, uint32_t page_size, uint32_t page_id);

// A parsed, verified page held in memory (does not own the bytes).
struct SegmentView {
  uint32_t feature_id = 0;
  uint32_t count = 0;
  uint64_t min_key = 0, max_key = 0;
  bool run_keys = true;
  bool bitmap_keys = false;       // keys is a bitmap over [min_key, max_key]
  bool raw_keys = false;          // keys stored as u64
  const uint8_t* keys = nullptr;  // varint stream, bitmap or raw u64s when !run_keys
  uint32_t keys_bytes = 0;
  const uint8_t* tomb = nullptr;  // bitmap or nullptr
  const uint8_t* values = nullptr;  // packed int64 segments: widened into `unpacked`
  std::shared_ptr<std::vector<int64_t>> unpacked;
  uint32_t width = 0;  // filled by the caller from the feature definition (0 = variable)
  uint32_t length = 0;  // on-disk bytes of the segment, directory entry included
  const uint8_t* end = nullptr;  // one past the segment's body in the page
  bool packed = false;           // int64 values packed to 1/2/4 bytes (widened into `unpacked`)
  bool damaged = false;          // key, tombstone or packed value bytes reach past the body

  // Whether the body holds `count` records of `width` (set first) within its bounds: the
  // metadata's value type and the page agree. Readers check before decoding, so a type that
  // metadata damage changed is a Corruption error, never a read outside the page.
  bool Fits() const;
  double bytes_per_record() const { return count ? static_cast<double>(length) / count : 0.0; }

  bool is_tomb(uint32_t i) const { return tomb && (tomb[i >> 3] >> (i & 7) & 1); }
  // Decodes all keys into out[0, count).
  void DecodeKeys(uint64_t* out) const;
  // Value of record i: pointer and length. `width` must be set.
  void Value(uint32_t i, const uint8_t** p, uint32_t* len) const {
    if (width) {
      *p = values + static_cast<size_t>(i) * width;
      *len = width;
    } else {
      uint32_t a, b;
      std::memcpy(&a, values + 4ull * i, 4);
      std::memcpy(&b, values + 4ull * (i + 1), 4);
      *p = values + 4ull * (count + 1) + a;
      *len = b - a;
    }
  }
};

// Encoding of a non-run segment's keys (bits of the segment's enc byte): a bitmap over the key
// span (compact pages, when smaller than the varints), raw u64s when the varint deltas average
// >= kRawKeyMinDeltaBytes, else varints. PageBuilder sizes and writes segments with the same
// choice, so a page never holds more than it measured.
enum class KeyEnc : uint8_t { kVarint = 1, kBitmap = 2, kRaw = 4 };
inline KeyEnc ChooseKeyEnc(uint32_t n, uint32_t varint_bytes, uint64_t span, bool bitmap_ok) {
  if (bitmap_ok && span != 0 && span <= (1ull << 32) && (span + 7) / 8 < varint_bytes) return KeyEnc::kBitmap;
  return varint_bytes >= static_cast<uint64_t>(kRawKeyMinDeltaBytes) * n ? KeyEnc::kRaw : KeyEnc::kVarint;
}
// Bytes of a non-run segment's keys (span 0: wrapped, no bitmap).
inline uint32_t KeyBytes(uint32_t n, uint32_t varint_bytes, uint64_t span, bool bitmap_ok) {
  switch (ChooseKeyEnc(n, varint_bytes, span, bitmap_ok)) {
    case KeyEnc::kBitmap:
      return static_cast<uint32_t>((span + 7) / 8);
    case KeyEnc::kRaw:
      return 8 * n;
    default:
      return varint_bytes;
  }
}

class PageView {
 public:
  // Verifies magic, version, checksum and that the page is `expect_id` (catches misdirected
  // or never-written pages). `where` names the file for error messages.
  static Status Parse(const uint8_t* buf, uint32_t page_size, uint32_t expect_id, const std::string& where,
                      PageView* out);
  uint64_t seq() const { return seq_; }
  uint32_t nseg() const { return nseg_; }
  const uint8_t* data() const { return buf_; }  // the verified page bytes
  // Segment of a feature, or false if the page holds none. keys_only: the keys and
  // tombstones are located and checked (`damaged`), the values not at all (`values` stays
  // null, packed int64s are not widened; do not call Fits): for reads that want keys alone.
  bool Find(uint32_t feature_id, SegmentView* out, bool keys_only = false) const;
  SegmentView Segment(uint32_t i, bool keys_only = false) const;

 private:
  const uint8_t* buf_ = nullptr;
  uint64_t seq_ = 0;
  uint32_t nseg_ = 0;
};

}  // namespace recflash
