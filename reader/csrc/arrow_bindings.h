// A scan's result as a pyarrow.Table made in C++ (Arrow's C++ API and pyarrow's wrap_table),
// over the engine's buffers without a copy: the Python side gets one object per scan.
//
// Why in C++: a scan's result used to cross as numpy arrays that Python wrapped into Arrow
// arrays and a table (pa.py_buffer, Array.from_buffers, Table.from_arrays). After a scan that
// streamed megabytes through the core's caches, those Python and Cython calls ran cold: ~40 us
// a scan, where the same table made here takes ~13 us. On the compaction benchmark's
// 1,313-read rounds that was 5-8 % of read time, and this disk serves the next read more
// slowly the longer the pause before it. Binding code only: the engine knows no Arrow.
#pragma once
#include <pybind11/pybind11.h>

#include "reader/csrc/column.h"
#include "reader/csrc/types.h"

namespace recflash::bind {

// The table of one scanned feature: columns `key` (uint64) and `value` (the feature's Arrow
// type), with `schema` (a pyarrow.Schema, the Python side's scan schema: its value type must
// be the one `def` maps to, else TypeError). drop_max_key: a half-open user range ending at
// 2**64 - 1 excludes that key, which the engine's inclusive end returned. The table owns the
// column's buffers (moved out of `col`); they are freed when Arrow releases them.
pybind11::object ScanTable(ColumnData&& col, const FeatureDef& def, const pybind11::handle& schema,
                           bool drop_max_key);

}  // namespace recflash::bind
