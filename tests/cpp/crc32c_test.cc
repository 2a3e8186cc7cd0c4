// crc32c::Extend against a bitwise reference: the three interleaved crc32 streams (blocks of
// 4096 and 256 bytes, combined by the zeros tables) and the single stream of the tail must give
// the same CRC-32C at every length and alignment, also when a checksum is extended in pieces —
// every page and WAL record is checked with it.
#include "reader/csrc/crc32c.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cstdint>
#include <random>
#include <string>
#include <vector>

namespace recflash {
namespace {

uint32_t Reference(uint32_t crc, const uint8_t* p, size_t n) {
  crc = ~crc;
  for (size_t i = 0; i < n; i++) {
    crc ^= p[i];
    for (int k = 0; k < 8; k++) crc = (crc & 1) ? (crc >> 1) ^ 0x82F63B78u : crc >> 1;
  }
  return ~crc;
}

std::vector<uint8_t> RandomBytes(size_t n, uint64_t seed) {
  std::mt19937_64 g(seed);
  std::vector<uint8_t> v(n);
  for (auto& b : v) b = static_cast<uint8_t>(g());
  return v;
}

TEST(Crc32c, KnownValue) {
  const std::string s = "123456789";
  EXPECT_EQ(crc32c::Value(s.data(), s.size()), 0xE3069283u);
  EXPECT_EQ(crc32c::Value(s.data(), 0), 0u);
}

TEST(Crc32c, AgreesWithBitwiseReferenceAtEveryLengthAndAlignment) {
  const std::vector<uint8_t> data = RandomBytes(70000, 1);
  for (size_t off = 0; off < 8; off++) {
    for (size_t n = 0; n <= 1100; n++)
      ASSERT_EQ(crc32c::Value(data.data() + off, n), Reference(0, data.data() + off, n)) << "n " << n << " off " << off;
    for (size_t n : {4092u, 4096u, 16380u, 16384u, 65536u + 3})
      ASSERT_EQ(crc32c::Value(data.data() + off, n), Reference(0, data.data() + off, n)) << "n " << n << " off " << off;
  }
}

TEST(Crc32c, ExtendingInPiecesEqualsOneCall) {
  const std::vector<uint8_t> data = RandomBytes(20000, 2);
  std::mt19937_64 g(3);
  for (int t = 0; t < 2000; t++) {
    const size_t n = g() % data.size();
    const size_t k = t < 600 ? std::min<size_t>(n, 200 + g() % 120) : g() % (n + 1);  // around a short block first
    const uint32_t head = crc32c::Extend(0, data.data(), k);
    ASSERT_EQ(crc32c::Extend(head, data.data() + k, n - k), crc32c::Value(data.data(), n)) << "n " << n << " k " << k;
  }
}

}  // namespace
}  // namespace recflash
