// What the binding units of the other packages (ndp/csrc/bindings.cc) need from the store's
// binding unit: status -> exception, the engine Store behind a Python store object, and the
// small conversions every unit repeats. All bindings live in one extension module,
// recflash._native (src/recflash/csrc/module.cc calls each package's Init function), so a
// Store object made by one unit is usable by another.
#pragma once
#include <pybind11/numpy.h>
#include <pybind11/pybind11.h>

#include <utility>

#include "reader/csrc/store.h"

namespace recflash::bind {

namespace py = pybind11;

// Raises the recflash.reader.errors class of the status's code.
[[noreturn]] void Raise(const Status& s);
inline void Check(const Status& s) {
  if (!s.ok()) Raise(s);
}

// The engine Store behind a recflash._native.Store object (TypeError for anything else).
// The caller keeps the Python object alive for as long as it uses the pointer.
Store* StoreOf(const py::object& native_store);

py::dict GatherStatsDict(const GatherStats& g);

// Moves a vector into a numpy array that owns it (no copy).
template <typename V>
py::array_t<typename V::value_type> ToNumpy(V&& v) {
  using T = typename V::value_type;
  auto* heap = new V(std::move(v));
  py::capsule owner(heap, [](void* p) { delete static_cast<V*>(p); });
  return py::array_t<T>({static_cast<py::ssize_t>(heap->size())}, {sizeof(T)}, heap->data(), owner);
}

// Sets `field` from options[key] when present (options dicts come from Python dataclasses).
template <typename T>
void GetOpt(const py::dict& options, const char* key, T& field) {
  if (options.contains(key)) field = options[key].cast<T>();
}

// Binds the store (recflash._native.Store and its module-level helpers) into m.
void InitReader(py::module_& m);

}  // namespace recflash::bind
