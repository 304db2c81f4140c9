// The conversions shared by the declarative bindings and the fast path (see py_convert.h):
// Request (Python arrays as ArrayViews) and the mapping of gear_runtime::Error onto the
// package's exceptions.
#include "py_convert.h"

namespace gear_runtime {

py::tuple tuple_of(const Ints& v) {
  py::tuple out(v.size());
  for (size_t j = 0; j < v.size(); ++j) out[j] = py::int_(v[j]);
  return out;
}

std::string type_name(py::handle obj) {
  return py::str(py::type::handle_of(obj).attr("__name__"));
}

Request::Request(const py::sequence& arrays, const std::vector<py::dtype>* dtypes)
    : views_(py::len(arrays)), keep_(views_.size()), types_(views_.size()) {
  for (size_t i = 0; i < views_.size(); ++i) {
    const py::dtype* expected = dtypes && i < dtypes->size() ? &(*dtypes)[i] : nullptr;
    read(i, arrays[i], expected);
  }
}

void Request::read(size_t i, py::object item, const py::dtype* expected) {
  ArrayView& view = views_[i];
  if (!py::isinstance<py::array>(item)) {
    types_[i] = type_name(item);
    view.is_array = false;
    view.type = types_[i];
    return;
  }
  auto a = py::reinterpret_steal<py::array>(item.release());
  if (!(a.flags() & py::array::c_style)) {
    a = py::array::ensure(a, py::array::c_style);
    if (!a) throw py::error_already_set();
  }
  view.data = a.data();
  view.shape = reinterpret_cast<const int64_t*>(a.shape());
  view.ndim = static_cast<size_t>(a.ndim());
  if (expected != nullptr) {
    const py::dtype dt = a.dtype();
    view.dtype_ok = dt.is(*expected) || dt.equal(*expected);  // numpy: equivalent types
    if (!view.dtype_ok) types_[i] = py::str(dt);
    view.type = types_[i];
  }
  keep_[i] = std::move(a);
}

void set_python_error(const Error& e) {
  try {
    py::object make_error = py::module_::import("gear_runtime.errors").attr("make_error");
    py::object code = e.code().empty() ? py::object(py::none()) : py::object(py::str(e.code()));
    py::object exc = make_error(e.kind(), e.message(), code);
    PyErr_SetObject(reinterpret_cast<PyObject*>(Py_TYPE(exc.ptr())), exc.ptr());
  } catch (py::error_already_set& err) {
    err.restore();  // could not build the package's exception: raise why instead
  }
}

void translate(std::exception_ptr p) {
  try {
    if (p) std::rethrow_exception(p);
  } catch (const Error& e) {
    set_python_error(e);
  }
}

}  // namespace gear_runtime
