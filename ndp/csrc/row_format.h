// Row formats of embedding tables in the store.
//
// The store keeps a table as a fixed_size_list<float32, W> feature: W 4-byte words per row,
// whatever the row holds. The SLS engine reads, caches and de-duplicates those raw words, and
// decodes a row only when it pools it, so a quantized row costs fewer device bytes and less
// cache DRAM than a float32 one:
//
//   kFloat32      dim float32                                       W = dim
//   kFloat16      dim IEEE half, padded to 4 bytes                  W = ceil(dim / 2)
//   kInt8Rowwise  FBGEMM's row-wise int8 row as TorchRec's quantized
//                 TBE stores it: scale (half), bias (half), then
//                 dim uint8 q; value = scale * q + bias; padded      W = ceil((dim + 4) / 4)
//
// so a quantized TorchRec model's int8 and fp16 rows go to the store byte for byte.
#pragma once
#include <cstdint>
#include <cstring>

namespace recflash::ndp {

enum class RowFormat : uint8_t { kFloat32 = 0, kFloat16 = 1, kInt8Rowwise = 2 };

inline uint32_t RowWords(RowFormat f, uint32_t dim) {
  switch (f) {
    case RowFormat::kFloat16:
      return (dim + 1) / 2;
    case RowFormat::kInt8Rowwise:
      return (dim + 4 + 3) / 4;
    case RowFormat::kFloat32:
    default:
      return dim;
  }
}

inline const char* RowFormatName(RowFormat f) {
  switch (f) {
    case RowFormat::kFloat16:
      return "float16";
    case RowFormat::kInt8Rowwise:
      return "int8";
    case RowFormat::kFloat32:
      return "float32";
    default:
      return "unknown";
  }
}

// IEEE binary16 -> binary32, exact (normals, subnormals, inf and NaN).
inline float HalfToFloat(uint16_t h) {
  const uint32_t sign = static_cast<uint32_t>(h & 0x8000u) << 16;
  uint32_t exp = (h >> 10) & 0x1fu;
  uint32_t mant = h & 0x3ffu;
  uint32_t bits;
  if (exp == 0) {
    if (mant == 0) {
      bits = sign;
    } else {  // subnormal: normalise
      exp = 127 - 15 + 1;
      while (!(mant & 0x400u)) {
        mant <<= 1;
        exp--;
      }
      bits = sign | (exp << 23) | ((mant & 0x3ffu) << 13);
    }
  } else if (exp == 31) {
    bits = sign | 0x7f800000u | (mant << 13);
  } else {
    bits = sign | ((exp + 127 - 15) << 23) | (mant << 13);
  }
  float f;
  std::memcpy(&f, &bits, sizeof f);
  return f;
}

// Decodes one stored row (RowWords(f, dim) words at `raw`) into dim floats.
inline void DecodeRow(RowFormat f, const float* raw, uint32_t dim, float* out) {
  const auto* b = reinterpret_cast<const uint8_t*>(raw);
  switch (f) {
    case RowFormat::kFloat16:
      for (uint32_t d = 0; d < dim; d++) {
        uint16_t h;
        std::memcpy(&h, b + 2 * d, 2);
        out[d] = HalfToFloat(h);
      }
      return;
    case RowFormat::kInt8Rowwise: {
      uint16_t hs, hb;
      std::memcpy(&hs, b, 2);
      std::memcpy(&hb, b + 2, 2);
      const float scale = HalfToFloat(hs), bias = HalfToFloat(hb);
      for (uint32_t d = 0; d < dim; d++) out[d] = scale * static_cast<float>(b[4 + d]) + bias;
      return;
    }
    case RowFormat::kFloat32:
    default:
      std::memcpy(out, raw, dim * sizeof(float));
      return;
  }
}

}  // namespace recflash::ndp
