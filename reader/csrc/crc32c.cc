#include "reader/csrc/crc32c.h"

#include <nmmintrin.h>

#include <cstring>

namespace recflash::crc32c {

namespace {

// Software fallback table, used where the CPU lacks SSE4.2.
struct Table {
  uint32_t t[256];
  Table() {
    for (uint32_t i = 0; i < 256; i++) {
      uint32_t c = i;
      for (int k = 0; k < 8; k++) c = (c & 1) ? (c >> 1) ^ 0x82F63B78u : c >> 1;
      t[i] = c;
    }
  }
};

uint32_t ExtendSoftware(uint32_t crc, const uint8_t* p, size_t n) {
  static const Table table;
  crc = ~crc;
  for (size_t i = 0; i < n; i++) crc = table.t[(crc ^ p[i]) & 0xff] ^ (crc >> 8);
  return ~crc;
}

// Operators that advance a crc over a run of zero bytes, as four 256-entry tables (one per
// crc byte). They let three independent crc32 instruction streams run over adjacent blocks
// and be combined afterwards: the instruction's latency is 3 cycles but its throughput is 1,
// so one stream leaves two thirds of the unit idle (M. Adler's crc32c method).
constexpr uint32_t kPoly = 0x82F63B78u;  // reflected CRC-32C polynomial
constexpr size_t kLong = 4096;
constexpr size_t kShort = 256;

uint32_t MatrixTimes(const uint32_t* mat, uint32_t vec) {
  uint32_t sum = 0;
  for (; vec; vec >>= 1, mat++)
    if (vec & 1) sum ^= *mat;
  return sum;
}

void MatrixSquare(uint32_t* square, const uint32_t* mat) {
  for (int n = 0; n < 32; n++) square[n] = MatrixTimes(mat, mat[n]);
}

struct ZerosTable {
  uint32_t t[4][256];
  explicit ZerosTable(size_t len) {  // len: a power of two, in bytes
    uint32_t even[32], odd[32];
    odd[0] = kPoly;  // one zero bit
    for (int n = 1; n < 32; n++) odd[n] = 1u << (n - 1);
    MatrixSquare(even, odd);  // two bits
    MatrixSquare(odd, even);  // four bits
    const uint32_t* op = nullptr;
    for (;;) {
      MatrixSquare(even, odd);  // 8, 32, 128, ... bits
      len >>= 1;
      if (len == 0) {
        op = even;
        break;
      }
      MatrixSquare(odd, even);
      len >>= 1;
      if (len == 0) {
        op = odd;
        break;
      }
    }
    for (uint32_t n = 0; n < 256; n++) {
      t[0][n] = MatrixTimes(op, n);
      t[1][n] = MatrixTimes(op, n << 8);
      t[2][n] = MatrixTimes(op, n << 16);
      t[3][n] = MatrixTimes(op, n << 24);
    }
  }
  uint32_t Shift(uint32_t crc) const {
    return t[0][crc & 0xff] ^ t[1][(crc >> 8) & 0xff] ^ t[2][(crc >> 16) & 0xff] ^ t[3][crc >> 24];
  }
};

template <size_t kBlock>
__attribute__((target("sse4.2"))) inline uint64_t ThreeWay(uint64_t c0, const uint8_t*& p, size_t& n,
                                                           const ZerosTable& z) {
  while (n >= 3 * kBlock) {
    uint64_t c1 = 0, c2 = 0;
    for (const uint8_t* end = p + kBlock; p < end; p += 8) {
      uint64_t a, b, c;
      std::memcpy(&a, p, 8);
      std::memcpy(&b, p + kBlock, 8);
      std::memcpy(&c, p + 2 * kBlock, 8);
      c0 = _mm_crc32_u64(c0, a);
      c1 = _mm_crc32_u64(c1, b);
      c2 = _mm_crc32_u64(c2, c);
    }
    c0 = z.Shift(static_cast<uint32_t>(c0)) ^ c1;
    c0 = z.Shift(static_cast<uint32_t>(c0)) ^ c2;
    p += 2 * kBlock;
    n -= 3 * kBlock;
  }
  return c0;
}

__attribute__((target("sse4.2"))) uint32_t ExtendHardware(uint32_t crc, const uint8_t* p, size_t n) {
  static const ZerosTable long_zeros(kLong), short_zeros(kShort);
  uint64_t c = ~crc;
  c = ThreeWay<kLong>(c, p, n, long_zeros);
  c = ThreeWay<kShort>(c, p, n, short_zeros);
  while (n >= 8) {
    uint64_t v;
    std::memcpy(&v, p, 8);
    c = _mm_crc32_u64(c, v);
    p += 8;
    n -= 8;
  }
  uint32_t c32 = static_cast<uint32_t>(c);
  while (n--) c32 = _mm_crc32_u8(c32, *p++);
  return ~c32;
}

bool HaveSse42() { return __builtin_cpu_supports("sse4.2"); }

}  // namespace

uint32_t Extend(uint32_t crc, const void* data, size_t n) {
  static const bool hw = HaveSse42();
  const auto* p = static_cast<const uint8_t*>(data);
  return hw ? ExtendHardware(crc, p, n) : ExtendSoftware(crc, p, n);
}

}  // namespace recflash::crc32c
