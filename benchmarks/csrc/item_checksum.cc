// The compaction benchmark's check of a READER scan's output, as page_reader checks OPT's and
// LSM's reads after its timer: sum(key * 0x9E3779B97F4A7C15 + first 8 value bytes) (mod
// 2^64). A shared library called through ctypes on the Arrow buffers of the scan's table, so
// the check between two timed reads takes microseconds, as page_reader's does: this virtual
// disk serves a read markedly slower when it was idle for more than ~100 µs before it (see
// benchmarks/compaction.py, _table_checksum).
#include <cstdint>
#include <cstring>

extern "C" uint64_t rf_items_checksum(const uint64_t* keys, const uint8_t* values, uint64_t n, uint64_t stride) {
  constexpr uint64_t kMix = 0x9E3779B97F4A7C15ull;
  // sum(key * kMix + v) = kMix * sum(key) + sum(v) (mod 2^64): two sums the compiler
  // vectorises, no multiply per item.
  uint64_t sk = 0, sv = 0;
  for (uint64_t i = 0; i < n; i++) sk += keys[i];
  if (stride == 8) {  // int64 values: a contiguous array
    const uint8_t* p = values;
    for (uint64_t i = 0; i < n; i++, p += 8) {
      uint64_t v;
      std::memcpy(&v, p, 8);
      sv += v;
    }
  } else {
    for (uint64_t i = 0; i < n; i++) {
      uint64_t v;
      std::memcpy(&v, values + i * stride, 8);
      sv += v;
    }
  }
  return kMix * sk + sv;
}
