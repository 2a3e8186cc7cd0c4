// Python bindings of the NDP engine (recflash._native.SlsEngine); see reader/csrc/py_bindings.h.
#pragma once
#include <pybind11/pybind11.h>

namespace recflash::ndp {

void InitNdp(pybind11::module_& m);

}  // namespace recflash::ndp
