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

// Options structs set from Python dicts. Each binding lists every key it takes once, with the
// field it sets (RF_OPTION_FIELD); the list is exported to Python (OptionNames) and a key not
// in it is refused, never ignored.
template <typename Options>
struct OptionField {
  const char* name;
  void (*set)(Options& o, const py::handle& v);
};
#define RF_OPTION_FIELD(Options, key, field) \
  { key, [](Options& o, const py::handle& v) { o.field = v.cast<decltype(o.field)>(); } }

// `what` names the options in errors ("store", "SLS engine"): an unknown key lists the known
// ones; a value of the wrong type names its type and value.
template <typename Options, size_t N>
Options OptionsFromDict(const py::dict& d, const OptionField<Options> (&table)[N], const char* what) {
  Options o;
  for (const auto& [key, value] : d) {
    const std::string k = py::str(key);
    const OptionField<Options>* f = nullptr;
    for (const auto& x : table)
      if (k == x.name) f = &x;
    if (!f) {
      std::string known;
      for (const auto& x : table) known += (known.empty() ? "" : ", ") + std::string(x.name);
      Raise(Status::InvalidArgument("unknown " + std::string(what) + " option '" + k + "' (known: " + known + ")"));
    }
    try {
      f->set(o, value);
    } catch (const py::cast_error&) {
      Raise(Status::InvalidArgument(std::string(what) + " option '" + k + "' cannot be " +
                                    std::string(py::str(py::type::handle_of(value).attr("__name__"))) + " " +
                                    std::string(py::repr(value))));
    }
  }
  return o;
}

template <typename Options, size_t N>
py::list OptionNames(const OptionField<Options> (&table)[N]) {
  py::list names;
  for (const auto& x : table) names.append(x.name);
  return names;
}

// Binds the store (recflash._native.Store and its module-level helpers) into m.
void InitReader(py::module_& m);

}  // namespace recflash::bind
