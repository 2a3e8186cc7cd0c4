// Criteo categorical ids: hexadecimal strings -> int64 (for recflash.ingest.hexids).
//
// The importer's hot loop: 26 of Criteo's 40 columns are 8-digit hex hashes. Parsing them
// here, from the Arrow column's buffers and without the GIL, costs ~3 ns per value; the
// vectorised numpy version it replaces needed about 15 % of an import's CPU time and held
// the GIL between its many small ufunc calls, stalling the thread that feeds the store.
#pragma once
#include <array>
#include <cstddef>
#include <cstdint>
#include <vector>

namespace recflash::ingest {

// Nibble of an ASCII hex digit, or 0xFF (shared by the hex-id and Criteo TSV parsers).
constexpr std::array<uint8_t, 256> MakeHexNibbleTable() {
  std::array<uint8_t, 256> t{};
  for (auto& v : t) v = 0xFF;
  for (int c = '0'; c <= '9'; c++) t[c] = static_cast<uint8_t>(c - '0');
  for (int c = 'a'; c <= 'f'; c++) t[c] = static_cast<uint8_t>(c - 'a' + 10);
  for (int c = 'A'; c <= 'F'; c++) t[c] = static_cast<uint8_t>(c - 'A' + 10);
  return t;
}
inline constexpr std::array<uint8_t, 256> kHexNibble = MakeHexNibbleTable();

// Parses the n strings data[offsets[i], offsets[i + 1]) whose validity bit is set (`validity`
// is an Arrow LSB-first bitmap read from bit `bit_offset`; nullptr: all valid). An empty
// string counts as missing, like a null. For every string with a value, appends it to
// `values` (1..16 hex digits, either case; 16-digit values above 2^63 wrap to negative) and
// sets keep[i] = 1; other entries get keep[i] = 0. Positions of strings that are not hex ids
// (a non-hex character, or more than 16 digits) go to `bad` (their value slot holds 0).
// Returns the number of values written.
size_t ParseHexIds(const int32_t* offsets, const uint8_t* data, const uint8_t* validity, int64_t bit_offset,
                   size_t n, int64_t* values, uint8_t* keep, std::vector<int64_t>* bad);

}  // namespace recflash::ingest
