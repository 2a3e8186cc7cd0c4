#include "ingest/csrc/hex_ids.h"

#include <array>
#include <cstring>

namespace recflash::ingest {

namespace {

// Nibble of an ASCII hex digit, or 0xFF.
constexpr std::array<uint8_t, 256> MakeTable() {
  std::array<uint8_t, 256> t{};
  for (auto& v : t) v = 0xFF;
  for (int c = '0'; c <= '9'; c++) t[c] = static_cast<uint8_t>(c - '0');
  for (int c = 'a'; c <= 'f'; c++) t[c] = static_cast<uint8_t>(c - 'a' + 10);
  for (int c = 'A'; c <= 'F'; c++) t[c] = static_cast<uint8_t>(c - 'A' + 10);
  return t;
}
constexpr std::array<uint8_t, 256> kNibble = MakeTable();

// Eight hex digits at p (first digit most significant); false if any is not a digit.
inline bool Hex8(const uint8_t* p, uint64_t* out) {
  uint64_t v = 0;
  uint8_t any_bad = 0;
  for (int i = 0; i < 8; i++) {
    const uint8_t d = kNibble[p[i]];
    any_bad |= d;
    v = (v << 4) | (d & 0x0F);
  }
  *out = v;
  return (any_bad & 0xF0) == 0;
}

}  // namespace

size_t ParseHexIds(const int32_t* offsets, const uint8_t* data, const uint8_t* validity, int64_t bit_offset,
                   size_t n, int64_t* values, uint8_t* keep, std::vector<int64_t>* bad) {
  size_t m = 0;
  for (size_t i = 0; i < n; i++) {
    const int64_t bit = bit_offset + static_cast<int64_t>(i);
    if (validity && !((validity[bit >> 3] >> (bit & 7)) & 1)) {
      keep[i] = 0;
      continue;
    }
    const int32_t a = offsets[i], len = offsets[i + 1] - offsets[i];
    if (len == 0) {
      keep[i] = 0;
      continue;
    }
    keep[i] = 1;
    const uint8_t* p = data + a;
    uint64_t v = 0;
    bool ok;
    if (len == 8) {
      ok = Hex8(p, &v);
    } else if (len <= 16) {
      uint8_t any_bad = 0;
      for (int32_t j = 0; j < len; j++) {
        const uint8_t d = kNibble[p[j]];
        any_bad |= d;
        v = (v << 4) | (d & 0x0F);
      }
      ok = (any_bad & 0xF0) == 0;
    } else {
      ok = false;
    }
    if (!ok) {
      bad->push_back(static_cast<int64_t>(i));
      v = 0;
    }
    values[m++] = static_cast<int64_t>(v);
  }
  return m;
}

}  // namespace recflash::ingest
