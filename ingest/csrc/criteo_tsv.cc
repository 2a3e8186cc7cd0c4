#include "ingest/csrc/criteo_tsv.h"
#include "ingest/csrc/hex_ids.h"

#include <array>
#include <cstring>

namespace recflash::ingest {

namespace {

constexpr int kInt = 13;
constexpr int kCat = 26;


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

bool ParseCriteoBlock(const uint8_t* data, size_t n, bool has_label, CriteoColumns* out) {
  const int nfields = (has_label ? 1 : 0) + kInt + kCat;
  const size_t lines = CountLines(data, n);
  out->rows = 0;
  out->values.resize(nfields);
  out->present.resize(nfields);
  out->missing.assign(nfields, 0);
  // Raw cursors per field: the loop below runs once per field of every line.
  int64_t* vals[kInt + kCat + 1];
  uint8_t* pres[kInt + kCat + 1];
  size_t cnt[kInt + kCat + 1] = {};
  for (int f = 0; f < nfields; f++) {
    out->values[f].resize(lines);
    out->present[f].resize(lines);
    vals[f] = out->values[f].data();
    pres[f] = out->present[f].data();
  }
  const int first_int = has_label ? 1 : 0;
  const uint8_t* p = data;
  const uint8_t* end = data + n;
  size_t row = 0;
  while (p < end) {
    if (row == lines || *p == '\n' || *p == '\r') return false;  // blank line or CRLF: the general parser decides
    for (int f = 0; f < nfields; f++) {
      int64_t v = 0;
      const int r = f < first_int + kInt ? ParseInt(&p, end, &v) : ParseHex(&p, end, &v);
      if (r < 0) return false;
      pres[f][row] = static_cast<uint8_t>(r);
      vals[f][cnt[f]] = v;
      cnt[f] += static_cast<size_t>(r);
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
  if (row != lines) return false;
  out->rows = row;
  for (int f = 0; f < nfields; f++) {
    out->missing[f] = row - cnt[f];
    out->values[f].resize(cnt[f]);
  }
  out->labels.clear();
  if (has_label) {
    out->labels.resize(cnt[0]);
    for (size_t i = 0; i < cnt[0]; i++) out->labels[i] = static_cast<float>(vals[0][i]);
  }
  return true;
}

}  // namespace recflash::ingest
