// The extension module recflash._native: one module, one binding unit per package (each
// package binds its own code through its Init function; see pybind11's FAQ on build time).
// One module rather than several so that every unit shares one copy of the engine (a Store
// opened through the reader's unit is the Store the NDP engine reads).
#include <pybind11/pybind11.h>

#include "ingest/csrc/bindings.h"
#include "ndp/csrc/bindings.h"
#include "reader/csrc/py_bindings.h"

PYBIND11_MODULE(_native, m) {
  m.doc() = "recflash storage engine (C++20, io_uring, O_DIRECT, RocksDB metadata)";
  recflash::bind::InitReader(m);
  recflash::ingest::InitIngest(m);
  recflash::ndp::InitNdp(m);
}
