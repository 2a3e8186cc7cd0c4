#include "ingest/csrc/hex_ids.h"

#include <array>
#include <cstring>

namespace recflash::ingest {

namespace {


// Eight hex digits at p (first digit most significant); false if any is not a digit. SWAR
// on one little-endian word (first digit in the low byte), as recflash.ingest.hexids does
// with numpy: validate all eight bytes with carry-free byte-wise additions, then turn each
// byte into its nibble and pack the nibbles pairwise.
inline bool Hex8(const uint8_t* p, uint64_t* out) {
  constexpr uint64_t k01 = 0x0101010101010101ull, k0F = 0x0F0F0F0F0F0F0F0Full, k80 = 0x8080808080808080ull;
  uint64_t c;
  std::memcpy(&c, p, 8);
  const uint64_t lower = c | 0x2020202020202020ull;
  const uint64_t letter = (lower + 0x1F1F1F1F1F1F1F1Full) & ~(lower + 0x1919191919191919ull);  // bit 7: a..f
  const uint64_t digit = (c + 0x5050505050505050ull) & ~(c + 0x4646464646464646ull);         // bit 7: 0..9
  // A byte >= 0x80 could carry into its neighbour: flag the word (0x08 breaks equality).
  const uint64_t ok = ((letter | digit) & k80) | ((c & k80) >> 4);
  uint64_t v = (c & k0F) + ((c >> 6) & k01) * 9;  // one nibble per byte
  v = ((v & 0x000F000F000F000Full) << 4) | ((v >> 8) & 0x000F000F000F000Full);   // two digits per 16 bits
  v = ((v & 0x000000FF000000FFull) << 8) | ((v >> 16) & 0x000000FF000000FFull);  // four per 32 bits
  v = ((v & 0xFFFFull) << 16) | (v >> 32);                                          // eight
  *out = v;
  return ok == k80;
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
        const uint8_t d = kHexNibble[p[j]];
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
