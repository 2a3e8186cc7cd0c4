#include "reader/csrc/arrow_bindings.h"

#include <arrow/api.h>
#include <arrow/python/pyarrow.h>

#include <memory>
#include <string>
#include <utility>
#include <vector>

namespace py = pybind11;

namespace recflash::bind {
namespace {

// An Arrow buffer that owns the engine's vector (HugeAlloc's blocks go back to its cache when
// Arrow drops the last reference, on whichever thread that is: HugeFree takes its own lock).
template <typename V>
class VectorBuffer final : public arrow::Buffer {
 public:
  explicit VectorBuffer(V&& v) : arrow::Buffer(nullptr, 0), v_(std::move(v)) {
    // (An empty column still gets a valid address, as Arrow's own empty buffers have.)
    alignas(64) static const uint8_t kEmpty[64] = {};
    data_ = v_.empty() ? kEmpty : reinterpret_cast<const uint8_t*>(v_.data());
    size_ = capacity_ = static_cast<int64_t>(v_.size() * sizeof(typename V::value_type));
  }

 private:
  V v_;
};

template <typename V>
std::shared_ptr<arrow::Buffer> Own(V&& v) {
  return std::make_shared<VectorBuffer<V>>(std::move(v));
}

void EnsurePyarrow() {
  static bool imported = false;  // (under the GIL)
  if (imported) return;
  if (arrow::py::import_pyarrow() != 0) throw py::error_already_set();
  imported = true;
}

// The value column: n items of `def`'s type over the column's buffers.
std::shared_ptr<arrow::Array> Values(ColumnData& col, const FeatureDef& def, int64_t n) {
  switch (def.type) {
    case ValueType::kFloat32:
      return arrow::MakeArray(arrow::ArrayData::Make(arrow::float32(), n, {nullptr, Own(std::move(col.values))}, 0));
    case ValueType::kInt64:
      return arrow::MakeArray(arrow::ArrayData::Make(arrow::int64(), n, {nullptr, Own(std::move(col.values))}, 0));
    case ValueType::kFixedFloat32: {
      auto child = arrow::ArrayData::Make(arrow::float32(), n * def.dim, {nullptr, Own(std::move(col.values))}, 0);
      return arrow::MakeArray(arrow::ArrayData::Make(arrow::fixed_size_list(arrow::float32(), def.dim), n, {nullptr},
                                                     {std::move(child)}, 0));
    }
    case ValueType::kListInt64:
    case ValueType::kListFloat32: {
      const bool i64 = def.type == ValueType::kListInt64;
      const int64_t elems = n ? col.offsets[n] : 0;
      auto child = arrow::ArrayData::Make(i64 ? arrow::int64() : arrow::float32(), elems,
                                          {nullptr, Own(std::move(col.values))}, 0);
      auto type = arrow::list(i64 ? arrow::int64() : arrow::float32());
      return arrow::MakeArray(
          arrow::ArrayData::Make(type, n, {nullptr, Own(std::move(col.offsets))}, {std::move(child)}, 0));
    }
    case ValueType::kBinary:
      return arrow::MakeArray(arrow::ArrayData::Make(
          arrow::binary(), n, {nullptr, Own(std::move(col.offsets)), Own(std::move(col.values))}, 0));
  }
  throw py::type_error("feature '" + def.name + "': value type " + def.TypeString() + " has no Arrow mapping");
}

}  // namespace

py::object ScanTable(ColumnData&& col, const FeatureDef& def, const py::handle& schema, bool drop_max_key) {
  EnsurePyarrow();
  auto sr = arrow::py::unwrap_schema(schema.ptr());
  if (!sr.ok()) throw py::type_error("scan schema of feature '" + def.name + "': " + sr.status().ToString());
  std::shared_ptr<arrow::Schema> sch = std::move(sr).ValueUnsafe();
  int64_t n = static_cast<int64_t>(col.keys.size());
  if (drop_max_key && n > 0 && col.keys[n - 1] == UINT64_MAX) n--;
  auto keys = arrow::MakeArray(arrow::ArrayData::Make(arrow::uint64(), n, {nullptr, Own(std::move(col.keys))}, 0));
  auto values = Values(col, def, n);
  if (sch->num_fields() != 2 || !sch->field(0)->type()->Equals(*keys->type()) ||
      !sch->field(1)->type()->Equals(*values->type()))
    throw py::type_error("scan schema of feature '" + def.name + "' (" + sch->ToString() +
                         ") does not match its value type " + def.TypeString());
  std::shared_ptr<arrow::Table> t = arrow::Table::Make(std::move(sch), {std::move(keys), std::move(values)}, n);
  PyObject* obj = arrow::py::wrap_table(t);
  if (!obj) throw py::error_already_set();
  return py::reinterpret_steal<py::object>(obj);
}

}  // namespace recflash::bind
