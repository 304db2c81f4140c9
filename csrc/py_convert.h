// The conversions between Python and the plain C++ core that both halves of gear_runtime._core
// share: the declarative pybind11 bindings (bindings.cc) and the CPython fast path of
// ExecutorCore.execute (fast_path.cc).
//
//   * Bound<T> / make_bound: how a bound C++ object is allocated (never as raw memory);
//   * values_of / tuple_of / type_name: ints to spans and back, a Python type's name;
//   * Request: a sequence of numpy arrays read in place as ArrayViews (a non-C-contiguous one
//     copied once), with a reference to each held for the whole call;
//   * set_python_error / translate: gear_runtime::Error as the package's exception, via
//     gear_runtime.errors.make_error (the ONE exception translator, and the fast path's own
//     error mapping, both go through set_python_error).
//
// Only pybind11's public API is used here (its numpy arrays and dtypes included); numpy's own
// C API is the fast path's alone (numpy_api.h).
#pragma once

#include <pybind11/numpy.h>
#include <pybind11/pybind11.h>

#include <cstddef>
#include <cstdint>
#include <exception>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "dispatch.h"
#include "errors.h"

namespace py = pybind11;

namespace gear_runtime {

static_assert(sizeof(py::ssize_t) == sizeof(int64_t), "numpy dims are read as int64");

using Ints = std::vector<int64_t>;

// pybind11 lets Python make an instance without __init__ (T.__new__(T)) and, on its first
// use, allocates the C++ object's storage with T::operator new: raw memory, no object in it.
// The bound types refuse that allocation, so such an instance is a TypeError, never a wild
// read; real objects are made with the global ::new (make_bound).
template <typename T>
struct Bound : T {
  using T::T;
  explicit Bound(T&& value) : T(std::move(value)) {}
  static void* operator new(size_t) {
    throw py::type_error("this object was made without __init__; it cannot be used");
  }
  static void operator delete(void* p) { ::operator delete(p); }
};

template <typename T, typename... Args>
std::unique_ptr<Bound<T>> make_bound(Args&&... args) {
  return std::unique_ptr<Bound<T>>(::new Bound<T>(std::forward<Args>(args)...));
}

inline Values values_of(const Ints& v) { return {v.data(), v.size()}; }

py::tuple tuple_of(const Ints& v);

// The __name__ of obj's type (for messages).
std::string type_name(py::handle obj);

// The arrays of one call as ArrayViews. Holds a reference to every item (or to the
// C-contiguous copy of one that was not) for the whole call: stage() copies without the GIL,
// when another thread could drop the caller's last reference to an array.
class Request {
 public:
  // `dtypes`: the model's, compared with the arrays' (nullptr: not compared).
  Request(const py::sequence& arrays, const std::vector<py::dtype>* dtypes);
  const ArrayView* data() const { return views_.data(); }
  size_t size() const { return views_.size(); }

 private:
  void read(size_t i, py::object item, const py::dtype* expected);

  std::vector<ArrayView> views_;
  std::vector<py::object> keep_;
  std::vector<std::string> types_;  // what views_[i].type points at
};

// Raise e as the package's exception: gear_runtime.errors.make_error(kind, message, code).
void set_python_error(const Error& e);

// The ONE translator for everything bound with pybind11 (registered at module init).
void translate(std::exception_ptr p);

}  // namespace gear_runtime
