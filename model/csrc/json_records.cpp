// Records' JSON text from their columns (schemas.Columns: the scorer's and the job's records), as Python writes it:
// record r is pieces[0] + value(column 0, r) + pieces[1] + ... + pieces[k], a text column's value as it is, a number
// by Python's repr (what json.dumps writes). In Python most of the time went to the floats' repr (~0.85 us a value)
// and to formatting each record; here one pass appends every record to one buffer.
//
// Floats: std::to_chars gives the shortest digits that read back as the same double, the nearest such on a tie, as
// Python's repr (David Gay's dtoa, mode 0) does; this lays them out by repr's rule: decimal point position decpt (the
// value is 0.d1d2... x 10^decpt), exponent form where decpt <= -4 or decpt > 16 ("1e-05", "1.5e+16"), else positional
// with ".0" after an integer ("100.0", "0.0001"). Inputs must be finite (the caller checks: inf and nan are no JSON).
//
// An extension of its own (model.json_records.json_extension): no torch header, no -march, so it builds in seconds
// and the same on every machine.
#include <Python.h>
#include <pybind11/numpy.h>
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <charconv>
#include <cstdint>
#include <cstring>
#include <stdexcept>
#include <string>
#include <tuple>
#include <vector>

namespace trustbeam {
namespace {

// repr(x) into out (at least 32 chars); returns its length.
int python_repr(double x, char* out) {
  char sci[32];  // [-]d[.ddd]e(+|-)XX[X]
  const auto result = std::to_chars(sci, sci + sizeof(sci), x, std::chars_format::scientific);
  const char* end = result.ptr;
  const char* p = sci;
  int n = 0;
  if (*p == '-') out[n++] = *p++;
  char digits[20];
  int count = 0;
  for (; *p != 'e'; ++p) {
    if (*p != '.') digits[count++] = *p;
  }
  int exponent = 0;
  std::from_chars(p + (p[1] == '+' ? 2 : 1), end, exponent);
  const int decpt = exponent + 1;
  if (decpt <= -4 || decpt > 16) {
    out[n++] = digits[0];
    if (count > 1) {
      out[n++] = '.';
      std::memcpy(out + n, digits + 1, count - 1);
      n += count - 1;
    }
    out[n++] = 'e';
    out[n++] = exponent < 0 ? '-' : '+';
    const int magnitude = exponent < 0 ? -exponent : exponent;
    if (magnitude < 10) out[n++] = '0';
    n = static_cast<int>(std::to_chars(out + n, out + 32, magnitude).ptr - out);
  } else if (decpt <= 0) {  // 0.000ddd
    out[n++] = '0';
    out[n++] = '.';
    std::memset(out + n, '0', -decpt);
    n += -decpt;
    std::memcpy(out + n, digits, count);
    n += count;
  } else if (decpt >= count) {  // ddd000.0
    std::memcpy(out + n, digits, count);
    n += count;
    std::memset(out + n, '0', decpt - count);
    n += decpt - count;
    out[n++] = '.';
    out[n++] = '0';
  } else {  // dd.ddd
    std::memcpy(out + n, digits, decpt);
    n += decpt;
    out[n++] = '.';
    std::memcpy(out + n, digits + decpt, count - decpt);
    n += count - decpt;
  }
  return n;
}

void append_text(std::string& out, PyObject* text) {
  Py_ssize_t size = 0;
  const char* data = PyUnicode_AsUTF8AndSize(text, &size);  // NULL (and a TypeError) for anything not a str
  if (data == nullptr) throw pybind11::error_already_set();
  out.append(data, size);
}

}  // namespace

// pieces (k + 1) str, columns (k) each a list of count str or a (count,) C-contiguous float64 (finite) or int64 array
// -> (every record's UTF-8 text one after another, (count,) int64 where each ends). It reads Python strings, so it
// holds the interpreter.
std::tuple<pybind11::bytes, pybind11::array_t<int64_t>> render_records(const std::vector<std::string>& pieces,
                                                                       const pybind11::list& columns, int64_t count) {
  namespace py = pybind11;
  const size_t k = columns.size();
  if (pieces.size() != k + 1) throw std::invalid_argument("render_records: one more piece than columns");
  std::vector<PyObject*> texts(k, nullptr);  // a list of str, inserted as is
  std::vector<const double*> floats(k, nullptr);
  std::vector<const int64_t*> ints(k, nullptr);  // the caller's list holds every column while it is read
  size_t fixed = 0;
  for (const auto& piece : pieces) fixed += piece.size();
  for (size_t c = 0; c < k; ++c) {
    PyObject* column = columns[c].ptr();
    if (PyList_Check(column)) {
      if (PyList_GET_SIZE(column) != count) throw std::invalid_argument("render_records: a column's length");
      texts[c] = column;
      continue;
    }
    const bool is_array = py::isinstance<py::array>(columns[c]);
    const py::array array = is_array ? py::reinterpret_borrow<py::array>(columns[c]) : py::array();
    const bool is_float = is_array && array.dtype().is(py::dtype::of<double>());
    if (!is_array || array.ndim() != 1 || array.shape(0) != count || !(array.flags() & py::array::c_style) ||
        !(is_float || array.dtype().is(py::dtype::of<int64_t>()))) {
      throw std::invalid_argument("render_records: a column must be a list of str or a (count,) C-contiguous float64 "
                                  "or int64 array");
    }
    if (is_float) {
      floats[c] = static_cast<const double*>(array.data());
    } else {
      ints[c] = static_cast<const int64_t*>(array.data());
    }
  }
  std::string out;
  out.reserve(static_cast<size_t>(count) * (fixed + 20 * k));
  py::array_t<int64_t> ends(count);
  int64_t* end = ends.mutable_data();
  char number[32];
  for (int64_t r = 0; r < count; ++r) {
    out += pieces[0];
    for (size_t c = 0; c < k; ++c) {
      if (texts[c] != nullptr) {
        append_text(out, PyList_GET_ITEM(texts[c], r));
      } else if (floats[c] != nullptr) {
        out.append(number, python_repr(floats[c][r], number));
      } else {
        out.append(number, std::to_chars(number, number + sizeof(number), ints[c][r]).ptr - number);
      }
      out += pieces[c + 1];
    }
    end[r] = static_cast<int64_t>(out.size());
  }
  return {py::bytes(out.data(), out.size()), ends};
}

}  // namespace trustbeam

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  m.def("render_records", &trustbeam::render_records, "records' JSON text from their columns, as Python writes it");
}
