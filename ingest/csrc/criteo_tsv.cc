#include "ingest/csrc/criteo_tsv.h"
#include "ingest/csrc/hex_ids.h"

#include <immintrin.h>

#include <cstring>

namespace recflash::ingest {

namespace {

// ---- byte at a time (the reference, and the block's last lines) ----------------------------

// Field parsers: p at the field's first byte; on success *p ends at its terminator ('\t',
// '\n' or end). Return 0 = empty field, 1 = value, -1 = outside the fast path's grammar.
inline int ParseInt(const uint8_t** pp, const uint8_t* end, int64_t* out) {
  const uint8_t* p = *pp;
  bool neg = false;
  if (p < end && *p == '-') {
    neg = true;
    p++;
  }
  const uint8_t* digits = p;
  uint64_t v = 0;
  while (p < end && static_cast<uint8_t>(*p - '0') < 10) v = v * 10 + (*p++ - '0');
  const size_t nd = static_cast<size_t>(p - digits);
  if (p < end && *p != '\t' && *p != '\n') return -1;
  *pp = p;
  if (nd == 0) return neg ? -1 : 0;
  if (nd > 18) return -1;
  *out = neg ? -static_cast<int64_t>(v) : static_cast<int64_t>(v);
  return 1;
}

inline int ParseHex(const uint8_t** pp, const uint8_t* end, int64_t* out) {
  const uint8_t* p = *pp;
  const uint8_t* start = p;
  uint64_t v = 0;
  uint8_t bad = 0;
  while (p < end && *p != '\t' && *p != '\n') {
    const uint8_t d = kHexNibble[*p++];
    bad |= d;
    v = (v << 4) | (d & 0x0F);
  }
  const size_t nd = static_cast<size_t>(p - start);
  *pp = p;
  if (nd == 0) return 0;
  if ((bad & 0xF0) || nd > 16) return -1;
  *out = static_cast<int64_t>(v);
  return 1;
}

// Lines from p to end, the first being line `*row` of the sink; *row ends past the last.
bool ParseLinesScalar(const uint8_t* p, const uint8_t* end, int nfields, int first_hex, CriteoSink* s,
                      size_t* row_io) {
  size_t row = *row_io;
  while (p < end) {
    if (row == s->rows || *p == '\n' || *p == '\r') return false;  // blank line or CRLF: the general parser decides
    for (int f = 0; f < nfields; f++) {
      int64_t v = 0;
      const int r = f < first_hex ? ParseInt(&p, end, &v) : ParseHex(&p, end, &v);
      if (r < 0) return false;
      s->present[f][row] = static_cast<uint8_t>(r);
      s->values[f][s->count[f]] = v;
      s->count[f] += static_cast<size_t>(r);
      // the separator: a tab between fields, a newline (or the end) after the last
      const bool last = f == nfields - 1;
      if (p == end) {
        if (!last) return false;
      } else {
        if ((*p == '\t') == last) return false;
        p++;
      }
    }
    row++;
  }
  *row_io = row;
  return true;
}

// ---- 64 bytes at a time ---------------------------------------------------------------------

// Character classes, looked up by a byte's low and high nibble (pshufb); a byte is allowed
// when the two lookups share a bit: separators '\t' '\n', '-', digits, hex letters either case.
constexpr char kSep = 1, kMinus = 2, kDigit = 4, kLetter = 8;
const __m128i kLowClass = _mm_setr_epi8(kDigit, kDigit | kLetter, kDigit | kLetter, kDigit | kLetter,
                                        kDigit | kLetter, kDigit | kLetter, kDigit | kLetter, kDigit, kDigit,
                                        kDigit | kSep, kSep, 0, 0, kMinus, 0, 0);
const __m128i kHighClass = _mm_setr_epi8(kSep, 0, kMinus, kDigit, kLetter, 0, kLetter, 0, 0, 0, 0, 0, 0, 0, 0, 0);

// Bit i set when b[i] is '\t' or '\n'; false when any of the 64 bytes is outside the classes.
inline bool Window(const uint8_t* b, uint64_t* seps) {
  const __m128i nib = _mm_set1_epi8(0x0F), tab = _mm_set1_epi8('\t'), nl = _mm_set1_epi8('\n');
  const __m128i zero = _mm_setzero_si128();
  __m128i bad = zero;
  uint64_t m = 0;
  for (int i = 0; i < 4; i++) {
    const __m128i x = _mm_loadu_si128(reinterpret_cast<const __m128i*>(b + 16 * i));
    const __m128i lo = _mm_shuffle_epi8(kLowClass, _mm_and_si128(x, nib));
    const __m128i hi = _mm_shuffle_epi8(kHighClass, _mm_and_si128(_mm_srli_epi16(x, 4), nib));
    bad = _mm_or_si128(bad, _mm_cmpeq_epi8(_mm_and_si128(lo, hi), zero));
    const __m128i sep = _mm_or_si128(_mm_cmpeq_epi8(x, tab), _mm_cmpeq_epi8(x, nl));
    m |= static_cast<uint64_t>(static_cast<uint32_t>(_mm_movemask_epi8(sep))) << (16 * i);
  }
  *seps = m;
  return _mm_movemask_epi8(bad) == 0;
}

constexpr uint64_t kOnes = 0x0101010101010101ull;

inline uint64_t Load8(const uint8_t* p) {
  uint64_t x;
  std::memcpy(&x, p, 8);
  return x;
}

// len (1..8) hex digits at p (8 bytes readable) -> *out; false when one is not a hex digit.
// The window check let only digits, hex letters and '-' into a field: digits have bit 4 set,
// letters bit 6, '-' neither.
inline bool Hex8(const uint8_t* p, size_t len, uint64_t* out) {
  const int shift = static_cast<int>(8 * (8 - len));
  const uint64_t x = Load8(p) << shift;  // the field's bytes on top, zero "digits" below
  if ((((x >> 4) | (x >> 6)) & kOnes) != (kOnes << shift)) return false;
  uint64_t v = (x & 0x0F0F0F0F0F0F0F0Full) + 9 * ((x >> 6) & kOnes);  // each byte its nibble
  v = __builtin_bswap64(v);  // least significant digit in byte 0
  v = (v & 0x000F000F000F000Full) | ((v & 0x0F000F000F000F00ull) >> 4);
  v = (v & 0x000000FF000000FFull) | ((v & 0x00FF000000FF0000ull) >> 8);
  *out = (v & 0xFFFFull) | ((v & 0x0000FFFF00000000ull) >> 16);
  return true;
}

inline int FieldHex(const uint8_t* p, size_t len, int64_t* out) {
  if (len == 0) return 0;
  uint64_t v;
  if (len <= 8) {
    if (!Hex8(p, len, &v)) return -1;
  } else {
    uint64_t hi;
    if (len > 16 || !Hex8(p, len - 8, &hi) || !Hex8(p + len - 8, 8, &v)) return -1;
    v |= hi << 32;
  }
  *out = static_cast<int64_t>(v);
  return 1;
}

inline int FieldInt(const uint8_t* p, size_t len, int64_t* out) {
  if (len == 0) return 0;
  const bool neg = *p == '-';
  p += neg;
  const size_t nd = len - neg;
  uint64_t v = 0;
  if (nd - 1 < 8) {  // 1..8 digits: SWAR (simdjson's eight-digit conversion)
    const int shift = static_cast<int>(8 * (8 - nd));
    uint64_t x = (Load8(p) ^ 0x3030303030303030ull) << shift;  // digits 0..9, leading zeros below
    if (((x + 0x7676767676767676ull) | x) & 0x8080808080808080ull) return -1;  // a byte above 9
    x = (x * 2561) >> 8;
    x = ((x & 0x00FF00FF00FF00FFull) * 6553601) >> 16;
    v = ((x & 0x0000FFFF0000FFFFull) * 42949672960001ull) >> 32;
  } else {
    if (nd == 0 || nd > 18) return -1;
    for (size_t i = 0; i < nd; i++) {
      const uint8_t d = static_cast<uint8_t>(p[i] - '0');
      if (d >= 10) return -1;
      v = v * 10 + d;
    }
  }
  *out = neg ? -static_cast<int64_t>(v) : static_cast<int64_t>(v);
  return 1;
}

// Loads reach this far past a field's start (two 8-byte loads of a 16-digit id) and windows
// 64 bytes past their start: lines ending this close to the block's end go the scalar way.
constexpr size_t kTail = 128;

}  // namespace

size_t CountLines(const uint8_t* data, size_t n) {
  size_t lines = 0;
  const uint8_t* p = data;
  const uint8_t* end = data + n;
  while (p < end) {
    const void* nl = std::memchr(p, '\n', static_cast<size_t>(end - p));
    if (!nl) {
      lines++;  // a last line without its newline
      break;
    }
    lines++;
    p = static_cast<const uint8_t*>(nl) + 1;
  }
  return lines;
}

bool ParseCriteoBlockScalar(const uint8_t* data, size_t n, bool has_label, CriteoSink* s) {
  const int nfields = (has_label ? 1 : 0) + kCriteoInts + kCriteoCats;
  for (int f = 0; f < nfields; f++) s->count[f] = 0;
  size_t row = 0;
  return ParseLinesScalar(data, data + n, nfields, nfields - kCriteoCats, s, &row) && row == s->rows;
}

bool ParseCriteoBlock(const uint8_t* data, size_t n, bool has_label, CriteoSink* s) {
  const int nfields = (has_label ? 1 : 0) + kCriteoInts + kCriteoCats;
  const int first_hex = nfields - kCriteoCats;
  for (int f = 0; f < nfields; f++) s->count[f] = 0;
  const uint8_t* end = data + n;
  // The fast part: whole lines ending before end - kTail.
  const uint8_t* fast_end = data;
  if (n > kTail) {
    const void* nl = memrchr(data, '\n', n - kTail);
    if (nl) fast_end = static_cast<const uint8_t*>(nl) + 1;
  }
  const uint8_t* p = data;
  size_t row = 0;
  if (fast_end > data) {
    int64_t* vals[kCriteoMaxFields];
    uint8_t* pres[kCriteoMaxFields];
    size_t cnt[kCriteoMaxFields] = {};
    for (int f = 0; f < nfields; f++) vals[f] = s->values[f], pres[f] = s->present[f];
    const uint8_t* base = data;  // the window the separator mask describes
    uint64_t seps;
    if (!Window(base, &seps)) return false;
    // The next separator: its position, the mask moved past it. Only the line's last field
    // may end at a newline.
    auto next_sep = [&](const uint8_t** sep) -> bool {
      while (seps == 0) {
        base += 64;  // stays below fast_end: a separator ends every field before it
        if (!Window(base, &seps)) return false;
      }
      *sep = base + __builtin_ctzll(seps);
      seps &= seps - 1;
      return true;
    };
    auto put = [&](int f, int r, int64_t v) {
      pres[f][row] = static_cast<uint8_t>(r);
      vals[f][cnt[f]] = v;
      cnt[f] += static_cast<size_t>(r);
    };
    while (p < fast_end) {
      if (row == s->rows) return false;
      const uint8_t* sep;
      for (int f = 0; f < first_hex; f++) {
        if (!next_sep(&sep) || *sep != '\t') return false;
        int64_t v = 0;
        const int r = FieldInt(p, static_cast<size_t>(sep - p), &v);
        if (r < 0) return false;
        put(f, r, v);
        p = sep + 1;
      }
      for (int f = first_hex; f < nfields; f++) {
        if (!next_sep(&sep) || (*sep == '\n') != (f == nfields - 1)) return false;
        const size_t len = static_cast<size_t>(sep - p);
        uint64_t v = 0;
        int r;
        if (len == 8) {  // the usual Criteo id, 32 bits in 8 digits: Hex8 with the shift folded away
          r = Hex8(p, 8, &v) ? 1 : -1;
        } else {
          int64_t w = 0;
          r = FieldHex(p, len, &w);
          v = static_cast<uint64_t>(w);
        }
        if (r < 0) return false;
        put(f, r, static_cast<int64_t>(v));
        p = sep + 1;
      }
      row++;
    }
    for (int f = 0; f < nfields; f++) s->count[f] = cnt[f];
  }
  return ParseLinesScalar(p, end, nfields, first_hex, s, &row) && row == s->rows;
}

bool ParseCriteoColumns(const uint8_t* data, size_t n, bool has_label, bool scalar, CriteoColumns* out) {
  const int nfields = (has_label ? 1 : 0) + kCriteoInts + kCriteoCats;
  CriteoSink s;
  s.rows = CountLines(data, n);
  out->values.assign(nfields, {});
  out->present.assign(nfields, {});
  for (int f = 0; f < nfields; f++) {
    out->values[f].resize(s.rows);
    out->present[f].resize(s.rows);
    s.values[f] = out->values[f].data();
    s.present[f] = out->present[f].data();
  }
  const bool ok = scalar ? ParseCriteoBlockScalar(data, n, has_label, &s) : ParseCriteoBlock(data, n, has_label, &s);
  if (!ok) return false;
  out->rows = s.rows;
  for (int f = 0; f < nfields; f++) out->values[f].resize(s.count[f]);
  return true;
}

}  // namespace recflash::ingest
