// Python bindings of the ingest parsers (Criteo TSV blocks, hex ids, line counts). Ingest
// depends on nothing else of recflash: these functions take and return plain buffers.
#pragma once
#include <pybind11/pybind11.h>

namespace recflash::ingest {

void InitIngest(pybind11::module_& m);

}  // namespace recflash::ingest
