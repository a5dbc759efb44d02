// The records' JSON (json_records.cpp), apart from the torch kernels: it needs no torch header, which costs a
// translation unit ~30 s to compile.
#pragma once

#include <pybind11/numpy.h>
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <cstdint>
#include <string>
#include <tuple>
#include <vector>

namespace trustbeam {

// pieces (k + 1) str, columns (k) each a list of count str or a (count,) C-contiguous float64 (finite) or int64 array
// -> (every record's UTF-8 text one after another, (count,) int64 where each ends).
std::tuple<pybind11::bytes, pybind11::array_t<int64_t>> render_records(const std::vector<std::string>& pieces,
                                                                       const pybind11::list& columns, int64_t count);

}  // namespace trustbeam
