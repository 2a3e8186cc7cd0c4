// The compaction benchmark's check of a READER scan's pyarrow.Table in one call: the table's
// key and value buffers found through Arrow's C++ API (pyarrow's unwrap_table), then
// item_checksum.cc's sum. The check runs between two timed reads, and this virtual disk serves
// a read more slowly the longer it was idle before it (benchmarks/compaction.py,
// _table_checksum): through pyarrow's Python API the same lookups (column, chunk, buffers,
// addresses) took ~40 us, cold after the scan, against page_reader's few microseconds for its
// check of OPT's reads. Loaded with ctypes.PyDLL: called with the GIL held.
#include <Python.h>

#include <arrow/api.h>
#include <arrow/python/pyarrow.h>

#include <cstdint>

extern "C" uint64_t rf_items_checksum(const uint64_t* keys, const uint8_t* values, uint64_t n, uint64_t stride);


// 0 and *items, *checksum set; -2: the columns' lengths differ; -1: not a table of one chunk
// per column with uint64 keys and int64 or fixed_size_list<float32> values, none null (the
// caller checks it another way).
extern "C" int rf_table_checksum(PyObject* table, uint64_t value_bytes, uint64_t* items, uint64_t* checksum) {
  static bool imported = false;
  if (!imported) {
    if (arrow::py::import_pyarrow() != 0) {
      PyErr_Clear();
      return -1;
    }
    imported = true;
  }
  auto r = arrow::py::unwrap_table(table);
  if (!r.ok()) {
    PyErr_Clear();
    return -1;
  }
  const std::shared_ptr<arrow::Table> t = *r;
  if (t->num_columns() != 2 || t->column(0)->num_chunks() != 1 || t->column(1)->num_chunks() != 1) return -1;
  const arrow::ArrayData& kd = *t->column(0)->chunk(0)->data();
  const arrow::ArrayData& vd = *t->column(1)->chunk(0)->data();
  if (kd.type->id() != arrow::Type::UINT64 || kd.GetNullCount() != 0 || vd.GetNullCount() != 0) return -1;
  const int64_t nk = kd.length, nv = vd.length;
  if (nv != nk) return -2;
  const uint8_t* keys = kd.buffers.size() > 1 && kd.buffers[1] ? kd.buffers[1]->data() + kd.offset * 8 : nullptr;
  const uint8_t* values = nullptr;
  if (vd.type->id() == arrow::Type::INT64 && value_bytes == 8) {
    if (vd.buffers.size() > 1 && vd.buffers[1]) values = vd.buffers[1]->data() + vd.offset * 8;
  } else if (vd.type->id() == arrow::Type::FIXED_SIZE_LIST && vd.child_data.size() == 1 &&
             vd.child_data[0]->type->id() == arrow::Type::FLOAT) {
    const int64_t dim = static_cast<const arrow::FixedSizeListType&>(*vd.type).list_size();
    const arrow::ArrayData& cd = *vd.child_data[0];
    if (static_cast<uint64_t>(dim) * 4 == value_bytes && cd.GetNullCount() == 0 && cd.buffers.size() > 1 &&
        cd.buffers[1] && cd.length >= (vd.offset + nv) * dim)
      values = cd.buffers[1]->data() + (cd.offset + vd.offset * dim) * 4;
  }
  if (nk && (!keys || !values)) return -1;
  *items = static_cast<uint64_t>(nk);
  *checksum = nk ? rf_items_checksum(reinterpret_cast<const uint64_t*>(keys), values, nk, value_bytes) : 0;
  return 0;
}
