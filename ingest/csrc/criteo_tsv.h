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
#pragma once
#include <cstddef>
#include <cstdint>
#include <vector>

namespace recflash::ingest {

struct CriteoColumns {
  size_t rows = 0;
  // One per field of the layout, in order: values of the rows that have one (compacted), and
  // a per-row presence byte. The label (when the layout has one) is parsed as an integer and
  // stored as float32 bits in `labels`.
  std::vector<std::vector<int64_t>> values;
  std::vector<float> labels;
  std::vector<std::vector<uint8_t>> present;
  std::vector<size_t> missing;  // rows without a value, per field
};

// Lines in data[0, n): newlines, plus one for a last line without its newline.
size_t CountLines(const uint8_t* data, size_t n);

// Parses data[0, n) (whole lines; the last one may lack its '\n') with `has_label`, then
// kInt = 13 integer fields and kCat = 26 hex fields. Returns false — and the caller falls
// back to the general parser — for anything outside the fast path's grammar.
bool ParseCriteoBlock(const uint8_t* data, size_t n, bool has_label, CriteoColumns* out);

}  // namespace recflash::ingest
