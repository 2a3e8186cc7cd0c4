#include "ingest/csrc/bindings.h"

#include <pybind11/numpy.h>
#include <pybind11/stl.h>

#include <cstring>
#include <vector>

#include "ingest/csrc/criteo_tsv.h"
#include "ingest/csrc/hex_ids.h"

namespace recflash::ingest {

namespace py = pybind11;

namespace {

// parse_hex_ids(offsets int32[n + 1], data uint8[], validity uint8[] | None, bit_offset)
//   -> (values int64[m], keep bool[n] | None when every entry has a value, bad int64[] | None)
py::tuple ParseHexIdsPy(py::array_t<int32_t, py::array::c_style> offsets, py::array_t<uint8_t, py::array::c_style> data,
                        py::object validity, int64_t bit_offset) {
  if (offsets.size() < 1) throw py::value_error("parse_hex_ids: offsets need n + 1 entries");
  const size_t n = static_cast<size_t>(offsets.size() - 1);
  const int32_t* off = offsets.data();
  if (off[0] < 0 || off[n] < off[0] || static_cast<size_t>(off[n]) > static_cast<size_t>(data.size()))
    throw py::value_error("parse_hex_ids: offsets out of the data's bounds");
  const uint8_t* bits = nullptr;
  py::array_t<uint8_t, py::array::c_style> vb;
  if (!validity.is_none()) {
    vb = validity.cast<py::array_t<uint8_t, py::array::c_style>>();
    if (static_cast<size_t>(vb.size()) * 8 < static_cast<size_t>(bit_offset) + n)
      throw py::value_error("parse_hex_ids: validity bitmap too short");
    bits = vb.data();
  }
  py::array_t<int64_t> values(static_cast<py::ssize_t>(n));
  py::array_t<bool> keep(static_cast<py::ssize_t>(n));
  std::vector<int64_t> bad;
  size_t m;
  {
    py::gil_scoped_release nogil;
    m = ParseHexIds(off, data.data(), bits, bit_offset, n, values.mutable_data(),
                                      reinterpret_cast<uint8_t*>(keep.mutable_data()), &bad);
  }
  values.resize({static_cast<py::ssize_t>(m)});
  py::object keep_out = m == n ? py::object(py::none()) : py::object(keep);
  py::object bad_out = py::none();
  if (!bad.empty()) {
    py::array_t<int64_t> b(static_cast<py::ssize_t>(bad.size()));
    std::memcpy(b.mutable_data(), bad.data(), bad.size() * 8);
    bad_out = b;
  }
  return py::make_tuple(values, keep_out, bad_out);
}

// parse_criteo_block(data: buffer, has_label, scalar=False) -> None (not for the fast path:
// use the general parser) or (rows, [(values, present bool[rows] | None), ...] one per field
// in layout order; the label's values are float32, the others int64). The parser writes into
// the returned arrays (views of two arrays shared by the block's fields): no copies.
// scalar: the byte-at-a-time reference parser, for tests.
py::object ParseCriteoBlockPy(py::buffer data, bool has_label, bool scalar) {
  py::buffer_info info = data.request();
  const auto* p = static_cast<const uint8_t*>(info.ptr);
  const size_t n = static_cast<size_t>(info.size * info.itemsize);
  const int nfields = (has_label ? 1 : 0) + kCriteoInts + kCriteoCats;
  CriteoSink sink;
  {
    py::gil_scoped_release nogil;
    sink.rows = CountLines(p, n);
  }
  const auto rows = static_cast<py::ssize_t>(sink.rows);
  // All fields' values in one array and all presence bytes in another (two allocations per
  // block instead of 80), each field's part starting one cache line further into a 4 KiB page
  // than the previous one's: the parser appends to ~80 streams at once, and streams at the
  // same offset within their pages share L1 sets (a few % of the parse on 16 MiB blocks).
  const py::ssize_t vstride = (rows + 511) / 512 * 512 + 8, pstride = (rows + 4095) / 4096 * 4096 + 64;
  py::array_t<int64_t> all_values(vstride * nfields);
  py::array_t<bool> all_present(pstride * nfields);
  std::vector<int64_t> labels(has_label ? sink.rows : 0);
  for (int f = 0; f < nfields; f++) {
    sink.values[f] = has_label && f == 0 ? labels.data() : all_values.mutable_data() + vstride * f;
    sink.present[f] = reinterpret_cast<uint8_t*>(all_present.mutable_data()) + pstride * f;
  }
  bool ok;
  {
    py::gil_scoped_release nogil;
    ok = scalar ? ParseCriteoBlockScalar(p, n, has_label, &sink) : ParseCriteoBlock(p, n, has_label, &sink);
  }
  if (!ok) return py::none();
  py::list fields;
  for (int f = 0; f < nfields; f++) {
    const auto count = static_cast<py::ssize_t>(sink.count[f]);
    py::object vals;
    if (has_label && f == 0) {
      py::array_t<float> a(count);
      float* out = a.mutable_data();
      for (py::ssize_t i = 0; i < count; i++) out[i] = static_cast<float>(labels[i]);
      vals = a;
    } else {
      vals = all_values[py::slice(vstride * f, vstride * f + count, 1)];  // views of the shared arrays
    }
    py::object pres = py::none();
    if (count != rows) pres = all_present[py::slice(pstride * f, pstride * f + rows, 1)];
    fields.append(py::make_tuple(vals, pres));
  }
  return py::make_tuple(sink.rows, fields);
}

// count_lines(data: buffer) -> lines (newlines, plus a last line without one)
size_t CountLinesPy(py::buffer data) {
  py::buffer_info info = data.request();
  py::gil_scoped_release nogil;
  return CountLines(static_cast<const uint8_t*>(info.ptr), static_cast<size_t>(info.size * info.itemsize));
}

}  // namespace

void InitIngest(py::module_& m) {
  m.def("parse_criteo_block", &ParseCriteoBlockPy, py::arg("data"), py::arg("has_label"), py::arg("scalar") = false,
        "Criteo TSV block -> columns, or None outside the fast path; see ingest/csrc/criteo_tsv.h");
  m.def("count_lines", &CountLinesPy, py::arg("data"));
  m.def("parse_hex_ids", &ParseHexIdsPy, py::arg("offsets"), py::arg("data"), py::arg("validity"),
        py::arg("bit_offset"), "Hex id strings (Arrow string buffers) -> int64 values; see ingest/csrc/hex_ids.h");
}

}  // namespace recflash::ingest
