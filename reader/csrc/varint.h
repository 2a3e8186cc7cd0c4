// LEB128 varints (7 bits per byte, high bit set on every byte but the last) read a word at a
// time: one 8-byte load finds the length (the first byte with the high bit clear) and the
// 7-bit groups are gathered with shifts and masks, with no branch per byte. Sparse 64-bit
// keys have 5-8 byte deltas, where a loop per byte dominated page decoding and the decoding
// of checkpointed key indexes.
#pragma once
#include <cstdint>
#include <cstring>

namespace recflash {

// The varint starting at the low byte of x (8 bytes loaded from the stream). Sets *len to its
// length in bytes and returns its value; *len = 0 when it is longer than 8 bytes (the caller
// reads it byte by byte).
inline uint64_t GatherVarint(uint64_t x, int* len) {
  const uint64_t stop = ~x & 0x8080808080808080ull;
  if (!stop) {
    *len = 0;
    return 0;
  }
  const int n = (__builtin_ctzll(stop) >> 3) + 1;
  if (n < 8) x &= (1ull << (8 * n)) - 1;
  *len = n;
  return (x & 0x7full) | ((x >> 1) & 0x3f80ull) | ((x >> 2) & 0x1fc000ull) | ((x >> 3) & 0xfe00000ull) |
         ((x >> 4) & 0x7f0000000ull) | ((x >> 5) & 0x3f800000000ull) | ((x >> 6) & 0x1fc0000000000ull) |
         ((x >> 7) & 0xfe000000000000ull);
}

// Reads one varint from [*p, end) into *v and advances *p; false when the stream ends inside
// it or it is longer than 64 bits.
inline bool ReadVarint(const uint8_t** p, const uint8_t* end, uint64_t* v) {
  const uint8_t* q = *p;
  if (end - q >= 8) {
    uint64_t x;
    std::memcpy(&x, q, 8);
    int len;
    const uint64_t g = GatherVarint(x, &len);
    if (len) {
      *v = g;
      *p = q + len;
      return true;
    }
  }
  uint64_t d = 0;
  for (int shift = 0;; shift += 7) {
    if (q >= end || shift > 63) return false;
    const uint8_t b = *q++;
    d |= static_cast<uint64_t>(b & 0x7f) << shift;
    if (!(b & 0x80)) break;
  }
  *v = d;
  *p = q;
  return true;
}

}  // namespace recflash
