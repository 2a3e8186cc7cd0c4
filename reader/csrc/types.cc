#include "reader/csrc/types.h"

#include <algorithm>
#include <cctype>

namespace recflash {

std::string FeatureDef::TypeString() const {
  switch (type) {
    case ValueType::kFloat32: return "float32";
    case ValueType::kInt64: return "int64";
    case ValueType::kListInt64: return "list<int64>";
    case ValueType::kListFloat32: return "list<float32>";
    case ValueType::kFixedFloat32: return "fixed_size_list<float32, " + std::to_string(dim) + ">";
    case ValueType::kBinary: return "binary";
  }
  return "?";
}

Status ParseValueType(const std::string& in, ValueType* type, uint32_t* dim) {
  std::string s;
  for (char c : in)
    if (!std::isspace(static_cast<unsigned char>(c))) s.push_back(static_cast<char>(std::tolower(c)));
  *dim = 0;
  if (s == "float32") { *type = ValueType::kFloat32; return Status::OK(); }
  if (s == "int64") { *type = ValueType::kInt64; return Status::OK(); }
  if (s == "list<int64>") { *type = ValueType::kListInt64; return Status::OK(); }
  if (s == "list<float32>") { *type = ValueType::kListFloat32; return Status::OK(); }
  if (s == "binary") { *type = ValueType::kBinary; return Status::OK(); }
  const std::string prefix = "fixed_size_list<float32,";
  if (s.rfind(prefix, 0) == 0 && s.back() == '>') {
    std::string num = s.substr(prefix.size(), s.size() - prefix.size() - 1);
    if (!num.empty() && std::all_of(num.begin(), num.end(), ::isdigit) && num.size() < 8) {
      long d = std::stol(num);
      if (d >= 1 && d <= (1 << 20)) {
        *type = ValueType::kFixedFloat32;
        *dim = static_cast<uint32_t>(d);
        return Status::OK();
      }
    }
  }
  return Status::Schema("unknown value type '" + in +
                        "': expected float32 | int64 | list<int64> | list<float32> | "
                        "fixed_size_list<float32, D> | binary");
}

}  // namespace recflash
