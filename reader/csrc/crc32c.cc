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

__attribute__((target("sse4.2"))) uint32_t ExtendHardware(uint32_t crc, const uint8_t* p, size_t n) {
  uint64_t c = ~crc;
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
