// The WAL payload of one put/delete call, encoder and decoder side by side (the LevelDB
// db/write_batch.cc pattern): the group commit writes it, recovery replays it, and a flush
// re-logs pinned items with it.
//
//   u8 op | u32 fid | u32 n | u32 width | u64 keys[n] | (variable-width put) u32 lens[n] | values
//
// width is the feature's fixed value width (0: variable-width values, then lens[] follows the
// keys). A delete carries no values. The record framing (crc, length, type) is wal.h's.
#pragma once
#include <sys/uio.h>

#include <cstdint>
#include <string>
#include <vector>

#include "reader/csrc/status.h"
#include "reader/csrc/write_buffer.h"

namespace recflash {

constexpr uint8_t kOpPut = 1;
constexpr uint8_t kOpDelete = 2;
constexpr size_t kBatchHeaderBytes = 13;  // op, fid, n, width

// values: n * width bytes, or (width 0) the bytes delimited by offsets[0..n].
std::string EncodeBatch(uint8_t op, uint32_t fid, const uint64_t* keys, size_t n, uint32_t width,
                        const uint8_t* values, const int64_t* offsets);
// The same payload as EncodeBatch, as pieces pointing at the caller's arrays (no copy): the
// header goes into `header`, variable-width lengths into `lens`; `bytes` is the total.
void BatchParts(uint8_t op, uint32_t fid, const uint64_t* keys, size_t n, uint32_t width, const uint8_t* values,
                const int64_t* offsets, uint8_t header[kBatchHeaderBytes], std::vector<uint32_t>* lens,
                std::vector<iovec>* parts, size_t* bytes);
// Buffered items of one feature re-encoded as payloads (puts and deletes separately).
void EncodeBuffered(uint32_t fid, uint32_t width, const BufferedItems& b, std::vector<std::string>* out);

struct DecodedBatch {
  uint8_t op = 0;
  uint32_t fid = 0;
  uint32_t n = 0;
  uint32_t width = 0;
  std::vector<uint64_t> keys;
  const uint8_t* values = nullptr;  // into the payload; null for a delete
  std::vector<int64_t> offsets;     // variable-width put: n + 1 byte offsets into values
  bool is_delete() const { return op == kOpDelete; }
};
// Parses a payload (which must outlive `out`: values point into it). A short or truncated
// payload, or an unknown op, is a Corruption naming `where`.
Status DecodeBatch(const std::string& payload, const std::string& where, DecodedBatch* out);

}  // namespace recflash
