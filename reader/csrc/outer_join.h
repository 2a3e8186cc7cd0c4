// OuterJoin: scan_many's rows. Several features' keys (each sorted, unique) are joined on
// key; each feature's values land at its keys' rows, null elsewhere.
//
// Done natively into read buffers (HVec, reused across reads) because the numpy version
// allocated a presence map, a rank array, a mask, a packed mask and a zeroed copy of every
// column with gaps: a Ray read task of 250 K rows spent more time faulting in that fresh
// memory than scanning its pages.
#pragma once
#include <cstddef>
#include <cstdint>
#include <vector>

#include "reader/csrc/column.h"

namespace recflash {

struct KeySpan {
  const uint64_t* keys;
  size_t n;
};

struct JoinedKeys {
  HVec<uint64_t> keys;             // the union, ascending
  std::vector<HVec<int64_t>> pos;  // per input: the row of each of its keys; empty when the
  std::vector<uint8_t> identical;  // input holds every key of the union (identical[i] = 1)
};

// The union of the inputs' keys and where each input's keys are in it. Row-number-like keys
// (span at most 8 x the longest input + 1024) take a presence map and prefix counts, O(span);
// other key sets a merge, O(inputs x rows).
void JoinKeys(const std::vector<KeySpan>& in, JoinedKeys* out);

// A column of n rows holding `count` fixed-width values (width bytes each) at rows pos
// (ascending), zero bytes elsewhere, and its Arrow validity bitmap ((n + 7) / 8 bytes).
void SpreadFixed(const uint8_t* values, size_t count, uint32_t width, const int64_t* pos, size_t n, uint8_t* out,
                 uint8_t* validity);

}  // namespace recflash
