// CRC-32C (Castagnoli), the checksum of every page and WAL record.
#pragma once
#include <cstddef>
#include <cstdint>

namespace recflash::crc32c {

// Extends `crc` (0 for a fresh checksum) over data[0, n).
uint32_t Extend(uint32_t crc, const void* data, size_t n);
inline uint32_t Value(const void* data, size_t n) { return Extend(0, data, n); }

}  // namespace recflash::crc32c
