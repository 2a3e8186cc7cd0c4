#include "reader/csrc/format.h"

#include <algorithm>
#include <cstring>

#include "reader/csrc/crc32c.h"
#include "reader/csrc/varint.h"

namespace recflash {

namespace {

inline uint32_t VarintSize(uint64_t v) {
  uint32_t n = 1;
  while (v >= 128) {
    v >>= 7;
    n++;
  }
  return n;
}

inline uint8_t* PutVarint(uint8_t* p, uint64_t v) {
  while (v >= 128) {
    *p++ = static_cast<uint8_t>(v | 128);
    v >>= 7;
  }
  *p++ = static_cast<uint8_t>(v);
  return p;
}

}  // namespace

void PageBuilder::Reset() {
  for (Seg& seg : segs_) spare_.push_back(Recycled(std::move(seg)));
  segs_.clear();
  closed_bytes_ = sizeof(PageHeader);
}

PageBuilder::Seg PageBuilder::Recycled(Seg&& old) {
  Seg s;  // every field at its default; the vectors and the set come from `old`, emptied
  s.keys = std::move(old.keys);
  s.tomb = std::move(old.tomb);
  s.values = std::move(old.values);
  s.offsets = std::move(old.offsets);
  s.codes = std::move(old.codes);
  s.distinct = std::move(old.distinct);
  s.keys.clear();
  s.tomb.clear();
  s.values.clear();
  s.offsets.clear();
  s.codes.clear();
  s.distinct.Clear();
  return s;
}

PageBuilder::Seg PageBuilder::TakeSpare() {
  if (spare_.empty()) return Seg();
  Seg s = std::move(spare_.back());
  spare_.pop_back();
  return s;
}

uint32_t PageBuilder::MaxValueBytes(uint32_t page_size) {
  // One variable-length record with a tombstone-free run key: header, directory entry, body
  // header and two offsets.
  return page_size - sizeof(PageHeader) - sizeof(SegDesc) - kSegBodyHeader - 8;
}

void DistinctSet::SetCapacity(size_t cap) {
  slots_.assign(cap, kEmpty);
  mask_ = cap - 1;
  shift_ = 64 - __builtin_ctzll(cap);
}

void DistinctSet::Clear() {
  if (slots_.empty()) return;
  if (order_.size() * 16 < slots_.size())
    SetCapacity(64);
  else
    std::fill(slots_.begin(), slots_.end(), kEmpty);
  order_.clear();
}

void DistinctSet::Grow() {
  SetCapacity(std::max<size_t>(64, slots_.size() * 2));
  for (uint32_t k = 0; k < order_.size(); k++) {
    size_t j = Slot(order_[k]);
    while (slots_[j] != kEmpty) j = (j + 1) & mask_;
    slots_[j] = static_cast<uint16_t>(k);
  }
}

uint32_t DistinctSet::FindOrInsert(int64_t v, bool may_insert) {
  if ((order_.size() + 1) * 2 > slots_.size()) Grow();  // first: the slot the probe ends at stays valid
  size_t i = Slot(v);
  for (;; i = (i + 1) & mask_) {
    const uint16_t x = slots_[i];
    if (x == kEmpty) break;
    if (order_[x] == v) return x;
  }
  if (!may_insert) return kAbsent;
  const uint32_t index = static_cast<uint32_t>(order_.size());
  slots_[i] = static_cast<uint16_t>(index);
  order_.push_back(v);
  return index;
}

void DistinctSet::Truncate(uint32_t n) {
  // Newest first: an entry inserted last lies on no other entry's probe path (every slot a
  // later insert probed past was taken before it), so clearing its slot breaks no chain.
  while (order_.size() > n) {
    const uint16_t last = static_cast<uint16_t>(order_.size() - 1);
    size_t i = Slot(order_.back());
    while (slots_[i] != last) i = (i + 1) & mask_;
    slots_[i] = kEmpty;
    order_.pop_back();
  }
}

uint32_t PageBuilder::SegBytes(uint32_t n, bool run, uint32_t key_bytes, bool any_tomb, uint32_t width,
                               uint64_t value_bytes, uint64_t packed_bytes) {
  uint64_t b = sizeof(SegDesc) + kSegBodyHeader;
  if (!run) b += key_bytes;
  if (any_tomb) b += (n + 7) / 8;
  b += ValueAlign(width) - 1;  // worst-case pad; the real one depends on where the segment lands
  if (packed_bytes)
    b += packed_bytes;
  else
    b += width ? static_cast<uint64_t>(n) * width : 4ull * (n + 1) + value_bytes;
  return static_cast<uint32_t>(std::min<uint64_t>(b, 0xffffffffu));
}

uint32_t PageBuilder::Seg::BodyBytes() const {
  const uint32_t n = static_cast<uint32_t>(keys.size());
  return SegBytes(n, run, KeyBytes(n, varint_bytes, keys.empty() ? 0 : keys.back() - keys.front() + 1, bitmap_ok), any_tomb,
                  width, values.size(), packable ? PackedValueBytes(n, vmin, vmax, dict_entries()) : 0);
}

uint32_t PageBuilder::used_bytes() const {
  return segs_.empty() ? closed_bytes_ : closed_bytes_ + segs_.back().BodyBytes();
}

PageBuilder::Seg& PageBuilder::OpenSegment(const FeatureDef& f, bool packable, Seg seg) {
  if (!segs_.empty()) closed_bytes_ += segs_.back().BodyBytes();
  Seg& s = segs_.emplace_back(std::move(seg));
  s.fid = f.id;
  s.width = f.fixed_width();
  s.packable = packable;
  s.dict_ok = packable;
  s.bitmap_ok = compact_;
  return s;
}

bool PageBuilder::Add(const FeatureDef& f, uint64_t key, const uint8_t* value, uint32_t len, bool tomb) {
  const uint32_t width = f.fixed_width();
  const bool new_seg = segs_.empty() || segs_.back().fid != f.id;
  const uint32_t vlen = tomb ? width : len;  // fixed-width tombstones keep a zeroed slot
  const bool packable = compact_ && f.type == ValueType::kInt64;
  int64_t v = 0;  // a tombstone's slot holds 0
  if (packable && !tomb) std::memcpy(&v, value, 8);
  uint32_t before = closed_bytes_;
  uint32_t after;
  uint32_t code = DistinctSet::kAbsent;  // v's index among the open segment's distinct values
  if (new_seg) {
    if (!segs_.empty()) before += segs_.back().BodyBytes();
    after = before + SegBytes(1, true, 1, tomb, width, width ? 0 : vlen, packable ? PackedValueBytes(1, v, v, 1) : 0);
  } else {
    const Seg& s = segs_.back();
    const uint32_t n = static_cast<uint32_t>(s.keys.size());
    const bool run = s.run && key == s.keys.front() + n;
    const uint32_t vb =
        KeyBytes(n + 1, s.varint_bytes + VarintSize(key - s.keys.back()), key - s.keys.front() + 1, compact_);
    uint64_t packed = 0;
    if (packable) {
      const int64_t lo = std::min(s.vmin, v), hi = std::max(s.vmax, v);
      code = s.dict_ok ? s.Code(v) : DistinctSet::kAbsent;
      uint32_t entries = s.dict_entries() + (s.dict_ok && code == DistinctSet::kAbsent ? 1 : 0);
      if (entries > kMaxDictEntries) entries = 0;
      packed = PackedValueBytes(n + 1, lo, hi, entries);
    }
    after = closed_bytes_ + SegBytes(n + 1, run, vb, s.any_tomb || tomb, width, s.values.size() + (width ? 0 : vlen),
                                     packed);
  }
  if (after > page_size_) return false;

  if (new_seg) {
    Seg& s = OpenSegment(f, packable, TakeSpare());
    s.vmin = s.vmax = v;
    if (packable) s.Record(v, DistinctSet::kAbsent);
    s.varint_bytes = 1;  // first delta (0) is one byte
    if (!width) s.offsets.push_back(0);
  } else {
    Seg& s = segs_.back();
    s.run = s.run && key == s.keys.front() + s.keys.size();
    s.varint_bytes += VarintSize(key - s.keys.back());
    s.vmin = std::min(s.vmin, v);
    s.vmax = std::max(s.vmax, v);
    if (packable) s.Record(v, code);
  }
  Seg& s = segs_.back();
  s.keys.push_back(key);
  s.tomb.push_back(tomb ? 1 : 0);
  if (tomb) {
    s.any_tomb = true;
    s.tombs++;
    if (width) s.values.resize(s.values.size() + width, 0);
  } else {
    s.values.insert(s.values.end(), value, value + len);
    s.item_bytes += ItemBytes(len);
  }
  if (!width) s.offsets.push_back(static_cast<uint32_t>(s.values.size()));
  return true;
}

size_t PageBuilder::AddRun(const FeatureDef& f, const uint64_t* keys, const uint8_t* values, size_t n) {
  const uint32_t width = f.fixed_width();
  if (n == 0) return 0;
  if (width == 0) return Add(f, keys[0], values, 0, false) ? 1 : 0;  // not for variable-width values
  const bool packable = compact_ && f.type == ValueType::kInt64;
  const bool new_seg = segs_.empty() || segs_.back().fid != f.id;
  // The segment as it would be after taking items [0, k): closed bytes before it plus its size.
  uint32_t base = closed_bytes_;
  uint32_t have = 0;  // items already in the segment
  bool run = true;
  uint32_t varint = 1;
  uint64_t first = keys[0], prev = keys[0];
  int64_t vmin = 0, vmax = 0;
  if (packable) std::memcpy(&vmin, values, 8), vmax = vmin;
  // Distinct values: a new segment's are collected here and move into it at the end; an open
  // segment's set takes the accepted items directly (all of them are committed below).
  // fresh_state: a new segment's entry count and dict_ok while its items are sized; taken from
  // the spares, it becomes the segment itself when items are taken.
  Seg fresh_state = new_seg ? TakeSpare() : Seg();
  fresh_state.dict_ok = packable;
  Seg* ds = &fresh_state;
  if (new_seg) {
    if (!segs_.empty()) base += segs_.back().BodyBytes();
  } else {
    ds = &segs_.back();
    const Seg& s = segs_.back();
    have = static_cast<uint32_t>(s.keys.size());
    run = s.run;
    varint = s.varint_bytes;
    first = s.keys.front();
    prev = s.keys.back();
    vmin = s.vmin;
    vmax = s.vmax;
  }
  // Size of the segment with cnt items (SegBytes for a tombstone-free fixed-width segment),
  // inline: this runs for every item of a bulk load. Compact pages add a key bitmap choice
  // and the packed width, which follows the running value range.
  const uint32_t fixed = base + sizeof(SegDesc) + kSegBodyHeader + (ValueAlign(width) - 1);
  auto bytes_with = [&](uint32_t cnt, bool r, uint32_t vb, uint64_t last_key, int64_t lo, int64_t hi,
                        uint32_t entries) -> uint64_t {
    const uint64_t kb = r ? 0 : KeyBytes(cnt, vb, last_key - first + 1, compact_);  // as SegBytes
    const uint64_t value_bytes = packable ? PackedValueBytes(cnt, lo, hi, entries) : static_cast<uint64_t>(cnt) * width;
    return static_cast<uint64_t>(fixed) + kb + value_bytes;
  };
  // Items are taken in batches of kBatch: a batch's key and value statistics and dictionary
  // codes are gathered without sizing each item, and the batch is sized once at its end.
  // Every term of the size grows with the items taken (key bytes are a minimum of growing
  // encodings; packed bytes grow with the count, the range and the entries), so if the last
  // item of a batch fits, all of them do. A batch that does not fit is undone (its new
  // dictionary entries are the newest, so they come out cleanly) and its items are taken one
  // at a time up to the page's end: the result is item for item what sizing every item gives,
  // at a fraction of the cost (the per-item sizing was the import's largest CPU cost).
  constexpr size_t kBatch = 256;
  size_t k = 0;
  size_t exact_until = 0;  // items before this index are taken one at a time
  while (k < n) {
    if (k >= exact_until) {
      const size_t m_max = std::min(kBatch, n - k);
      const bool dict = ds->dict_ok;
      const uint32_t entries0 = dict ? ds->distinct.size() : 0;
      const size_t codes0 = ds->codes.size();
      const int64_t last0 = ds->last;
      const uint32_t last_code0 = ds->last_code;
      bool r = run;
      uint32_t vb = varint;
      uint64_t pk = prev;
      int64_t lo = vmin, hi = vmax;
      size_t m = 0;
      for (; m < m_max; m++) {
        const size_t j = k + m;
        const uint64_t key = keys[j];
        if (packable) {
          int64_t v;
          std::memcpy(&v, values + 8 * j, 8);
          // The entry that would end the dictionary is taken by the exact path below.
          if (dict && !ds->Take(v)) break;
          lo = std::min(lo, v);
          hi = std::max(hi, v);
        }
        const uint32_t before = have + static_cast<uint32_t>(j);  // items ahead of this one
        r = r && key == first + before;
        vb = before == 0 ? 1 : vb + VarintSize(key - pk);
        pk = key;
      }
      const uint32_t cnt = have + static_cast<uint32_t>(k + m);
      if (m > 0 && bytes_with(cnt, r, vb, pk, lo, hi, ds->dict_entries()) <= page_size_) {
        run = r;
        varint = vb;
        prev = pk;
        vmin = lo;
        vmax = hi;
        k += m;
        continue;
      }
      if (dict) {  // undo the batch's dictionary records
        ds->distinct.Truncate(entries0);
        ds->codes.resize(codes0);
        ds->last = last0;
        ds->last_code = last_code0;
      }
      exact_until = k + std::max<size_t>(m, 1);
    }
    // One item, sized on its own.
    const uint64_t key = keys[k];
    const uint32_t cnt = have + static_cast<uint32_t>(k) + 1;
    const bool r = run && key == first + (cnt - 1);
    const uint32_t vb = (have + k == 0) ? 1 : varint + VarintSize(key - prev);
    int64_t lo = vmin, hi = vmax;
    int64_t v = 0;
    uint32_t code = DistinctSet::kAbsent;
    uint32_t entries = 0;
    if (packable) {
      std::memcpy(&v, values + 8 * k, 8);
      lo = std::min(lo, v);
      hi = std::max(hi, v);
      if (ds->dict_ok) {
        code = ds->Code(v);
        entries = ds->dict_entries() + (code == DistinctSet::kAbsent ? 1 : 0);
        if (entries > kMaxDictEntries) entries = 0;
      }
    }
    if (bytes_with(cnt, r, vb, key, lo, hi, entries) > page_size_) break;
    if (packable) ds->Record(v, code);
    run = r;
    varint = vb;
    prev = key;
    vmin = lo;
    vmax = hi;
    k++;
  }
  if (k == 0) {
    if (new_seg) spare_.push_back(Recycled(std::move(fresh_state)));
    return 0;
  }
  if (new_seg) {
    const bool dict_ok = fresh_state.dict_ok;
    Seg& s = OpenSegment(f, packable, std::move(fresh_state));  // its distinct values, codes, last value
    s.dict_ok = dict_ok;
  }
  Seg& s = segs_.back();
  s.run = run;
  s.varint_bytes = varint;
  s.vmin = vmin;
  s.vmax = vmax;
  s.keys.insert(s.keys.end(), keys, keys + k);
  s.tomb.resize(s.tomb.size() + k, 0);
  s.values.insert(s.values.end(), values, values + k * width);
  s.item_bytes += k * ItemBytes(width);
  return k;
}

void PageBuilder::Finish(uint8_t* buf, uint64_t seq, uint32_t page_id, std::vector<SegmentSummary>* out,
                         bool checksum) const {
  std::memset(buf, 0, page_size_);
  auto* h = reinterpret_cast<PageHeader*>(buf);
  h->magic = kPageMagic;
  h->seq = seq;
  h->page_id = page_id;
  h->nseg = static_cast<uint16_t>(segs_.size());
  h->version = kPageFormatVersion;
  uint32_t off = sizeof(PageHeader) + sizeof(SegDesc) * segs_.size();
  for (size_t i = 0; i < segs_.size(); i++) {
    const Seg& s = segs_[i];
    const uint32_t n = static_cast<uint32_t>(s.keys.size());
    uint8_t* body = buf + off;
    uint8_t* p = body + kSegBodyHeader;
    uint32_t keys_bytes = 0;
    const uint64_t span = s.keys.back() - s.keys.front() + 1;
    const KeyEnc enc = s.run ? KeyEnc::kVarint : ChooseKeyEnc(n, s.varint_bytes, span, s.bitmap_ok);
    if (!s.run && enc == KeyEnc::kBitmap) {
      keys_bytes = static_cast<uint32_t>((span + 7) / 8);
      for (uint32_t j = 0; j < n; j++) {
        const uint64_t x = s.keys[j] - s.keys.front();
        p[x >> 3] |= static_cast<uint8_t>(1u << (x & 7));
      }
      p += keys_bytes;
    } else if (!s.run && enc == KeyEnc::kRaw) {
      keys_bytes = 8 * n;
      std::memcpy(p, s.keys.data(), keys_bytes);
      p += keys_bytes;
    } else if (!s.run) {
      uint8_t* k0 = p;
      uint64_t prev = s.keys.front();
      for (uint32_t j = 0; j < n; j++) {
        p = PutVarint(p, s.keys[j] - prev);
        prev = s.keys[j];
      }
      keys_bytes = static_cast<uint32_t>(p - k0);
    }
    body[0] = s.run ? 0 : static_cast<uint8_t>(enc);
    body[1] = s.any_tomb ? 1 : 0;
    std::memcpy(body + 4, &keys_bytes, 4);
    if (s.any_tomb) {
      for (uint32_t j = 0; j < n; j++)
        if (s.tomb[j]) p[j >> 3] |= static_cast<uint8_t>(1u << (j & 7));
      p += (n + 7) / 8;
    }
    if (!s.width) {
      std::memcpy(p, s.offsets.data(), 4ull * (n + 1));
      p += 4ull * (n + 1);
    } else {
      const uint32_t a = ValueAlign(s.width);
      const uint32_t at = static_cast<uint32_t>(p - buf);
      const uint16_t pad = static_cast<uint16_t>((at + a - 1) / a * a - at);
      std::memcpy(body + 2, &pad, 2);
      p += pad;
    }
    const uint32_t pack = s.packable ? PackBytes(s.vmin, s.vmax) : 8;
    // The same choice as the sizing (PackedValueBytes): the dictionary when strictly smaller.
    const uint64_t by_range = pack < 8 ? 8 + static_cast<uint64_t>(n) * pack : 8ull * n;
    const uint32_t entries = s.packable ? s.dict_entries() : 0;
    if (entries && DictValueBytes(n, entries, pack) < by_range) {
      body[0] |= static_cast<uint8_t>(kPackDict << 4);
      const std::vector<int64_t>& dict = s.distinct.values();
      const uint32_t bits = DictBits(entries);
      std::memcpy(p, &s.vmin, 8);
      std::memcpy(p + 8, &entries, 4);
      p[12] = static_cast<uint8_t>(pack);
      p[13] = static_cast<uint8_t>(bits);
      p += kDictHeader;
      const uint64_t base = static_cast<uint64_t>(s.vmin);
      for (int64_t x : dict) {
        const uint64_t delta = static_cast<uint64_t>(x) - base;
        std::memcpy(p, &delta, pack);
        p += pack;
      }
      uint64_t acc = 0;
      uint32_t nacc = 0;
      for (uint32_t j = 0; j < n; j++) {
        acc |= static_cast<uint64_t>(s.codes[j]) << nacc;
        nacc += bits;
        while (nacc >= 8) {
          *p++ = static_cast<uint8_t>(acc);
          acc >>= 8;
          nacc -= 8;
        }
      }
      if (nacc) *p++ = static_cast<uint8_t>(acc);
    } else if (pack < 8) {
      body[0] |= static_cast<uint8_t>(pack << 4);
      std::memcpy(p, &s.vmin, 8);
      p += 8;
      const uint64_t base = static_cast<uint64_t>(s.vmin);
      for (uint32_t j = 0; j < n; j++) {
        int64_t x;
        std::memcpy(&x, s.values.data() + 8ull * j, 8);
        const uint64_t d = static_cast<uint64_t>(x) - base;  // little-endian: the low `pack` bytes
        std::memcpy(p, &d, pack);
        p += pack;
      }
    } else {
      if (!s.values.empty()) std::memcpy(p, s.values.data(), s.values.size());
      p += s.values.size();
    }
    const uint32_t len = static_cast<uint32_t>(p - body);
    SegDesc d{s.fid, n, off, len, s.keys.front(), s.keys.back()};
    std::memcpy(buf + sizeof(PageHeader) + sizeof(SegDesc) * i, &d, sizeof d);
    if (out) {
      SegmentSummary sum;
      sum.feature_id = s.fid;
      sum.count = n;
      sum.tombs = s.tombs;
      sum.min_key = s.keys.front();
      sum.max_key = s.keys.back();
      sum.item_bytes = s.item_bytes;
      sum.length = len + sizeof(SegDesc);
      out->push_back(sum);
    }
    off += len;
  }
  h->used = off;
  if (checksum) h->crc = crc32c::Value(buf + 8, page_size_ - 8);
}

void StampPageId(uint8_t* buf, uint32_t page_size, uint32_t page_id) {
  auto* h = reinterpret_cast<PageHeader*>(buf);
  h->page_id = page_id;
  h->crc = crc32c::Value(buf + 8, page_size - 8);
}

Status PageView::Parse(const uint8_t* buf, uint32_t page_size, uint32_t expect_id, const std::string& where,
                       PageView* out) {
  const auto* h = reinterpret_cast<const PageHeader*>(buf);
  auto bad = [&](const std::string& why) {
    return Status::Corruption("page " + std::to_string(expect_id) + " of '" + where + "' (offset " +
                              std::to_string(static_cast<uint64_t>(expect_id) * page_size) + "): " + why);
  };
  if (h->magic != kPageMagic) return bad("bad magic (not a written page, or overwritten)");
  const uint32_t crc = crc32c::Value(buf + 8, page_size - 8);
  if (crc != h->crc) return bad("checksum mismatch (stored " + std::to_string(h->crc) + ", computed " +
                                std::to_string(crc) + ")");
  if (h->version < kMinPageFormatVersion || h->version > kPageFormatVersion)
    return bad("unknown page format version " + std::to_string(h->version));
  if (h->page_id != expect_id) return bad("page header says it is page " + std::to_string(h->page_id));
  if (sizeof(PageHeader) + static_cast<uint64_t>(h->nseg) * sizeof(SegDesc) > page_size || h->used > page_size)
    return bad("segment directory out of bounds");
  for (uint32_t i = 0; i < h->nseg; i++) {
    SegDesc d;
    std::memcpy(&d, buf + sizeof(PageHeader) + sizeof(SegDesc) * i, sizeof d);
    if (static_cast<uint64_t>(d.offset) + d.length > page_size) return bad("segment out of bounds");
  }
  out->buf_ = buf;
  out->seq_ = h->seq;
  out->nseg_ = h->nseg;
  return Status::OK();
}

SegmentView PageView::Segment(uint32_t i, bool keys_only) const {
  SegDesc d;
  std::memcpy(&d, buf_ + sizeof(PageHeader) + sizeof(SegDesc) * i, sizeof d);
  SegmentView v;
  v.feature_id = d.feature_id;
  v.count = d.count;
  v.min_key = d.min_key;
  v.max_key = d.max_key;
  v.length = d.length + sizeof(SegDesc);
  const uint8_t* body = buf_ + d.offset;
  v.end = body + d.length;
  if (d.length < kSegBodyHeader) {
    v.damaged = true;
    return v;
  }
  v.run_keys = (body[0] & 7) == 0;
  v.bitmap_keys = (body[0] & 2) != 0;
  v.raw_keys = (body[0] & 4) != 0;
  const uint32_t pack = body[0] >> 4;
  std::memcpy(&v.keys_bytes, body + 4, 4);
  const uint8_t* p = body + kSegBodyHeader;
  v.keys = p;
  auto room = [&](const uint8_t* at, uint64_t n) { return at <= v.end && static_cast<uint64_t>(v.end - at) >= n; };
  if (!v.run_keys && (!room(p, v.keys_bytes) || (v.raw_keys && v.keys_bytes < 8ull * d.count))) {
    v.damaged = true;
    return v;
  }
  p += v.run_keys ? 0 : v.keys_bytes;
  if (body[1]) {
    v.tomb = p;
    if (!room(p, (d.count + 7ull) / 8)) {
      v.damaged = true;
      return v;
    }
    p += (d.count + 7) / 8;
  }
  if (keys_only) return v;
  uint16_t pad;
  std::memcpy(&pad, body + 2, 2);
  v.values = p + pad;
  if (pack == kPackDict) {
    v.packed = true;
    uint32_t entries = 0;
    const uint8_t* q = v.values;
    if (room(q, kDictHeader)) std::memcpy(&entries, q + 8, 4);
    const uint32_t eb = room(q, kDictHeader) ? q[12] : 0, bits = room(q, kDictHeader) ? q[13] : 0;
    if ((eb != 1 && eb != 2 && eb != 4 && eb != 8) || entries == 0 || entries > kMaxDictEntries ||
        bits != DictBits(entries) || !room(q, DictValueBytes(d.count, entries, eb))) {
      v.damaged = true;
      return v;
    }
    int64_t base;
    std::memcpy(&base, q, 8);
    q += kDictHeader;
    std::vector<int64_t> dict(entries);
    for (uint32_t e = 0; e < entries; e++) {
      uint64_t delta = 0;
      std::memcpy(&delta, q, eb);  // little-endian: the low `eb` bytes
      q += eb;
      dict[e] = static_cast<int64_t>(static_cast<uint64_t>(base) + delta);
    }
    v.unpacked = std::make_shared<std::vector<int64_t>>(d.count);
    int64_t* out = v.unpacked->data();
    const uint64_t mask = (1ull << bits) - 1;
    uint64_t acc = 0;
    uint32_t nacc = 0;
    for (uint32_t j = 0; j < d.count; j++) {
      while (nacc < bits) {
        acc |= static_cast<uint64_t>(*q++) << nacc;
        nacc += 8;
      }
      const uint64_t idx = acc & mask;
      acc >>= bits;
      nacc -= bits;
      if (idx >= entries) {
        v.damaged = true;
        v.unpacked.reset();
        return v;
      }
      out[j] = dict[idx];
    }
    v.values = reinterpret_cast<const uint8_t*>(out);
    return v;
  }
  if (pack) {
    v.packed = true;
    if ((pack != 1 && pack != 2 && pack != 4) || !room(v.values, 8 + static_cast<uint64_t>(d.count) * pack)) {
      v.damaged = true;
      return v;
    }
    // Widen a packed int64 segment once, so every reader sees plain 8-byte values.
    const uint8_t* q = v.values;
    int64_t base;
    std::memcpy(&base, q, 8);
    q += 8;
    v.unpacked = std::make_shared<std::vector<int64_t>>(d.count);
    int64_t* out = v.unpacked->data();
    const uint64_t b = static_cast<uint64_t>(base);
    if (pack == 1) {
      for (uint32_t j = 0; j < d.count; j++) out[j] = static_cast<int64_t>(b + q[j]);
    } else if (pack == 2) {
      for (uint32_t j = 0; j < d.count; j++) {
        uint16_t x;
        std::memcpy(&x, q + 2ull * j, 2);
        out[j] = static_cast<int64_t>(b + x);
      }
    } else {
      for (uint32_t j = 0; j < d.count; j++) {
        uint32_t x;
        std::memcpy(&x, q + 4ull * j, 4);
        out[j] = static_cast<int64_t>(b + x);
      }
    }
    v.values = reinterpret_cast<const uint8_t*>(out);
  }
  return v;
}

bool SegmentView::Fits() const {
  if (damaged) return false;
  if (packed) return width == 8;  // widened int64s
  if (values > end) return false;
  const uint64_t room = static_cast<uint64_t>(end - values);
  if (width) return static_cast<uint64_t>(count) * width <= room;
  const uint64_t table = 4ull * (count + 1ull);  // value offsets, then the bytes
  if (table > room) return false;
  uint32_t prev = 0;
  for (uint32_t i = 0; i <= count; i++) {
    uint32_t o;
    std::memcpy(&o, values + 4ull * i, 4);
    if (o < prev) return false;
    prev = o;
  }
  return prev <= room - table;
}

bool PageView::Find(uint32_t feature_id, SegmentView* out, bool keys_only) const {
  for (uint32_t i = 0; i < nseg_; i++) {
    uint32_t fid;
    std::memcpy(&fid, buf_ + sizeof(PageHeader) + sizeof(SegDesc) * i, 4);
    if (fid == feature_id) {
      *out = Segment(i, keys_only);
      return true;
    }
  }
  return false;
}

void SegmentView::DecodeKeys(uint64_t* out) const {
  if (run_keys) {
    for (uint32_t i = 0; i < count; i++) out[i] = min_key + i;
    return;
  }
  if (raw_keys) {
    std::memcpy(out, keys, 8ull * count);
    return;
  }
  if (bitmap_keys) {
    uint32_t i = 0;
    for (uint32_t byte = 0; byte < keys_bytes && i < count; byte++) {
      uint8_t b = keys[byte];
      while (b && i < count) {
        const int bit = __builtin_ctz(b);
        out[i++] = min_key + (static_cast<uint64_t>(byte) << 3) + bit;
        b &= static_cast<uint8_t>(b - 1);
      }
    }
    for (; i < count; i++) out[i] = i ? out[i - 1] : min_key;  // fewer bits than records: damage
    return;
  }
  const uint8_t* p = keys;
  const uint8_t* const end = keys + keys_bytes;
  uint64_t prev = min_key;
  uint32_t i = 0;
  // Word-at-a-time (varint.h) while 8 bytes are readable.
  for (; i < count && end - p >= 8; i++) {
    uint64_t x;
    std::memcpy(&x, p, 8);
    if (!(x & 0x8080808080808080ull) && count - i >= 8) {
      // Eight one-byte deltas (keys a few dozen apart: uniform updates of dense ids), taken
      // together without finding lengths.
      for (int b = 0; b < 8; b++) {
        prev += (x >> (8 * b)) & 0x7f;
        out[i + b] = prev;
      }
      i += 7;
      p += 8;
      continue;
    }
    int len;
    const uint64_t v = GatherVarint(x, &len);
    if (!len) break;  // a 9- or 10-byte varint: the byte loop below takes it
    p += len;
    prev += v;
    out[i] = prev;
  }
  // The tail, byte by byte, never past the key bytes (a stream cut short repeats the last key).
  for (; i < count; i++) {
    uint64_t v = 0;
    int shift = 0;
    while (p < end && (*p & 128) && shift < 64) {
      v |= static_cast<uint64_t>(*p++ & 127) << shift;
      shift += 7;
    }
    if (p < end && shift < 64) v |= static_cast<uint64_t>(*p++) << shift;
    prev += v;
    out[i] = prev;
  }
}

}  // namespace recflash
