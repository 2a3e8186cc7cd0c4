// Criteo TSV blocks -> columns, in one pass (for recflash.ingest.sources.CriteoSource).
//
// Why: parsing a Criteo line with pyarrow's CSV reader and then converting its 26 hex columns
// costs ~10 CPU ns per byte (measured: 93 MB per CPU second, most of an import's CPU time);
// the format is fixed — an optional integer label, 13 optional integers, 26 optional hex
// ids, tab-separated — so one tight pass over the bytes produces the same columns for a
// fraction of that. This is only the fast path: a block holding anything unusual (a blank
// line, '\r', a field count other than the layout's, a value that is not a plain integer or
// 1..16 hex digits, an integer of more than 18 digits) is refused as a whole, and the caller
// parses that block with pyarrow, which reports bad lines with file, line and column.
//
// How: separators are found 64 bytes at a time (SSE compares -> a bit mask; one trailing-zero
// count per field), every byte's character class is checked in the same pass (a block with a
// byte no field can hold is refused before any field is parsed), and a field is converted from
// one or two 8-byte loads (SWAR: no loop over its digits). The lines within 128 bytes of the
// block's end, where those loads would pass it, go through the byte-at-a-time parser, which is
// also the reference the fast one is tested against (ParseCriteoBlockScalar).
#pragma once
#include <cstddef>
#include <cstdint>
#include <vector>

namespace recflash::ingest {

constexpr int kCriteoInts = 13;
constexpr int kCriteoCats = 26;
constexpr int kCriteoMaxFields = 1 + kCriteoInts + kCriteoCats;

// Where the parser writes, owned by the caller: per field of the layout (label first when
// there is one), room for `rows` values and `rows` presence bytes, rows = CountLines(data, n).
// values[f] gets the values of the rows that have one (compacted; the label's are integers
// too, the caller converts), present[f][row] 1 or 0, and count[f] how many values.
struct CriteoSink {
  size_t rows = 0;
  int64_t* values[kCriteoMaxFields] = {};
  uint8_t* present[kCriteoMaxFields] = {};
  size_t count[kCriteoMaxFields] = {};
};

// Lines in data[0, n): newlines, plus one for a last line without its newline.
size_t CountLines(const uint8_t* data, size_t n);

// Parses data[0, n) (whole lines; the last one may lack its '\n') with `has_label`, then
// kCriteoInts integer fields and kCriteoCats hex fields, into `sink` (sink->rows lines).
// Returns false — and the caller falls back to the general parser — for anything outside the
// fast path's grammar; the sink's contents are then unspecified.
bool ParseCriteoBlock(const uint8_t* data, size_t n, bool has_label, CriteoSink* sink);

// The same, a byte at a time: the reference for tests (and the fast path's tail).
bool ParseCriteoBlockScalar(const uint8_t* data, size_t n, bool has_label, CriteoSink* sink);

// Owning form, for tests: columns sized to their counts.
struct CriteoColumns {
  size_t rows = 0;
  std::vector<std::vector<int64_t>> values;
  std::vector<std::vector<uint8_t>> present;
};
bool ParseCriteoColumns(const uint8_t* data, size_t n, bool has_label, bool scalar, CriteoColumns* out);

}  // namespace recflash::ingest
