// Feature definitions: a feature is a named column of (key u64 -> value) items of one type.
#pragma once
#include <cstdint>
#include <string>

#include "reader/csrc/status.h"

namespace recflash {

enum class ValueType : uint8_t {
  kFloat32 = 1,
  kInt64 = 2,
  kListInt64 = 3,
  kListFloat32 = 4,
  kFixedFloat32 = 5,  // fixed_size_list<float32, dim>: an embedding row
  kBinary = 6,
};

struct FeatureDef {
  uint32_t id = 0;
  std::string name;
  ValueType type = ValueType::kFloat32;
  uint32_t dim = 0;  // only for kFixedFloat32

  // Bytes per value for fixed-width types, 0 for variable-length ones.
  uint32_t fixed_width() const {
    switch (type) {
      case ValueType::kFloat32: return 4;
      case ValueType::kInt64: return 8;
      case ValueType::kFixedFloat32: return 4 * dim;
      default: return 0;
    }
  }
  // Bytes per list element (variable-length types); values are a whole number of elements.
  uint32_t element_size() const {
    switch (type) {
      case ValueType::kListInt64: return 8;
      case ValueType::kListFloat32: return 4;
      case ValueType::kBinary: return 1;
      default: return fixed_width();
    }
  }
  bool variable() const { return fixed_width() == 0; }
  std::string TypeString() const;
};

// Parses "float32", "int64", "list<int64>", "list<float32>", "fixed_size_list<float32, D>", "binary".
Status ParseValueType(const std::string& s, ValueType* type, uint32_t* dim);

// The logical size of an item: 8 key bytes plus its value bytes. "Useful bytes" of reads and
// "live item bytes" are sums of this.
inline uint64_t ItemBytes(uint32_t value_len) { return 8ull + value_len; }

}  // namespace recflash
