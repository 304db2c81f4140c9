// ExecutorCore's Python side and its METH_FASTCALL execute (see fast_path.h for why this is
// plain CPython). Arrays are read with numpy's public C API (numpy_api.h); a request that is
// not plain goes to the general conversion (Request, py_convert.h), as stage() does.
#include "fast_path.h"

#include "numpy_api.h"  // after pybind11: numpy's header wants Python.h first

#include <cstring>
#include <utility>

namespace gear_runtime {

static_assert(sizeof(npy_intp) == sizeof(int64_t), "numpy dims are read as int64");

namespace {

// The items of one execute() request, referenced for the whole call (a copy may run
// without the GIL, when another thread could drop the caller's last reference), with their
// ArrayViews: on the stack for up to kStack inputs, on the heap beyond.
class Held {
 public:
  explicit Held(size_t n) {
    if (n > kStack) {
      refs_big_.resize(n);
      views_big_.resize(n);
    }
    refs_ = n > kStack ? refs_big_.data() : refs_small_;
    views_ = n > kStack ? views_big_.data() : views_small_;
  }
  ~Held() {
    for (size_t i = 0; i < added_; ++i) Py_DECREF(refs_[i]);
  }
  Held(const Held&) = delete;
  Held& operator=(const Held&) = delete;

  void add(PyObject* item) {  // borrowed: referenced here from now on
    Py_INCREF(item);
    refs_[added_++] = item;
  }
  PyObject* operator[](size_t i) const { return refs_[i]; }
  ArrayView& view(size_t i) { return views_[i]; }
  const ArrayView* views() const { return views_; }
  py::list list() const {  // for the general path (Request)
    py::list out(added_);
    for (size_t i = 0; i < added_; ++i) out[i] = py::reinterpret_borrow<py::object>(refs_[i]);
    return out;
  }

 private:
  static constexpr size_t kStack = 16;
  size_t added_ = 0;
  PyObject** refs_;
  ArrayView* views_;
  PyObject* refs_small_[kStack];
  ArrayView views_small_[kStack];
  std::vector<PyObject*> refs_big_;
  std::vector<ArrayView> views_big_;
};

// `obj` as numpy's array type (the caller checked Py_TYPE(obj) == &PyArray_Type).
PyArrayObject* as_array(PyObject* obj) { return reinterpret_cast<PyArrayObject*>(obj); }

}  // namespace

PyExecutorCoreImpl::PyExecutorCoreImpl(std::shared_ptr<const GearDispatch> dispatch,
                                       const std::vector<py::object>& input_dtypes,
                                       const BoundLayout& layout, const py::array& staging)
    : dtypes_(to_dtypes(input_dtypes, dispatch ? dispatch->input_count() : 0)),
      py_names_(interned(names_of(dispatch))),
      staging_(checked_staging(staging)),
      core_(input_specs(dispatch, dtypes_), dispatch, layout,
            static_cast<uint8_t*>(staging_.mutable_data()),
            static_cast<size_t>(staging_.nbytes())) {}

void PyExecutorCoreImpl::set_padding(
    const std::optional<std::vector<std::optional<py::bytes>>>& pad_values) {
  std::optional<PadValues> pads;
  if (pad_values) {
    pads.emplace();
    for (const std::optional<py::bytes>& b : *pad_values) {
      if (!b) {
        pads->emplace_back();
        continue;
      }
      const std::string raw = *b;
      pads->emplace_back(std::vector<uint8_t>(raw.begin(), raw.end()));
    }
  }
  core_.set_padding(pads);
}

size_t PyExecutorCoreImpl::stage(const py::sequence& arrays, const std::optional<Ints>& preset,
                                 bool pad) {
  const Request request(arrays, &dtypes_);
  const Values set = preset ? values_of(*preset) : Values{};
  return stage_views(request.data(), request.size(), preset ? &set : nullptr, pad);
}

int64_t PyExecutorCoreImpl::stage_request(py::handle inputs, py::handle preset, bool pad,
                                          py::object* placed) {
  const size_t n = py_names_.size();
  Held held(n);  // a reference to every array for the whole call, as Request keeps
  PyObject* obj = inputs.ptr();
  if (PyDict_CheckExact(obj)) {
    if (static_cast<size_t>(PyDict_GET_SIZE(obj)) != n) return -1;
    for (size_t i = 0; i < n; ++i) {
      PyObject* value = PyDict_GetItemWithError(obj, py_names_[i].ptr());
      if (value == nullptr) {
        if (PyErr_Occurred()) throw py::error_already_set();  // a key's __eq__ raised
        return -1;
      }
      held.add(value);
    }
  } else if (PyList_CheckExact(obj) || PyTuple_CheckExact(obj)) {
    if (static_cast<size_t>(PySequence_Fast_GET_SIZE(obj)) != n) return -1;
    for (size_t i = 0; i < n; ++i) held.add(PySequence_Fast_GET_ITEM(obj, i));
  } else {
    return -1;
  }
  for (size_t i = 0; i < n; ++i) {
    if (Py_TYPE(held[i]) != &PyArray_Type) return -1;
  }
  Ints spill;  // a preset that is not a plain tuple of ints (never from execute())
  int64_t set_values[kMaxValues];
  Values set{set_values, 0};
  const Values* set_ptr = read_preset(preset, set_values, spill, set);
  for (size_t i = 0; i < n; ++i) {
    PyArrayObject* a = as_array(held[i]);
    PyArray_Descr* descr = PyArray_DESCR(a);
    auto* expected = reinterpret_cast<PyArray_Descr*>(dtypes_[i].ptr());
    const bool plain = (PyArray_FLAGS(a) & NPY_ARRAY_C_CONTIGUOUS) &&
                       (descr == expected || PyArray_EquivTypes(descr, expected));
    if (!plain) {  // stage() copies a strided array once, or names the wrong dtype
      const Request request(held.list(), &dtypes_);
      return static_cast<int64_t>(stage_views(request.data(), n, set_ptr, pad));
    }
    ArrayView& view = held.view(i);
    view.data = PyArray_DATA(a);
    view.shape = reinterpret_cast<const int64_t*>(PyArray_DIMS(a));
    view.ndim = static_cast<size_t>(PyArray_NDIM(a));
  }
  // the caller's own arrays, alive for the whole execute(): large ones may be read in place
  const size_t gear = stage_views(held.views(), n, set_ptr, pad, true);
  if (placed != nullptr && !core_.last_in_place().empty()) {
    // the very arrays checked (held since): the request may have changed since it was read
    py::dict out;
    for (size_t i : core_.last_in_place()) {
      out[py::int_(i)] = py::reinterpret_borrow<py::object>(held[i]);
    }
    *placed = std::move(out);
  }
  return static_cast<int64_t>(gear);
}

size_t PyExecutorCoreImpl::stage_views(const ArrayView* views, size_t n, const Values* preset,
                                       bool pad, bool in_place) {
  return core_.stage(
      views, n, preset, pad,
      [](size_t bytes, auto&& copy) {
        if (bytes < kReleaseGilBytes) {
          copy();
          return;
        }
        py::gil_scoped_release no_gil;  // only memcpy/memset in here
        copy();
      },
      in_place);
}

const Values* PyExecutorCoreImpl::read_preset(py::handle preset, int64_t* buf, Ints& spill,
                                              Values& out) {
  if (preset.is_none()) return nullptr;
  PyObject* obj = preset.ptr();
  if (PyTuple_CheckExact(obj) && static_cast<size_t>(PyTuple_GET_SIZE(obj)) <= kMaxValues) {
    const size_t size = static_cast<size_t>(PyTuple_GET_SIZE(obj));
    bool ints = true;
    for (size_t v = 0; ints && v < size; ++v) {
      PyObject* item = PyTuple_GET_ITEM(obj, v);
      int overflow = 0;
      buf[v] = PyLong_CheckExact(item) ? PyLong_AsLongLongAndOverflow(item, &overflow) : 0;
      ints = PyLong_CheckExact(item) && overflow == 0 && !(buf[v] == -1 && PyErr_Occurred());
    }
    if (ints) {
      out = Values{buf, size};
      return &out;
    }
    PyErr_Clear();
  }
  spill = preset.cast<Ints>();
  out = values_of(spill);
  return &out;
}

void PyExecutorCoreImpl::set_written(const py::handle& buffers) {
  if (!PyList_Check(buffers.ptr())) {
    throw_input("written must be a list of numpy arrays, got " + type_name(buffers));
  }
  std::vector<py::array> held;
  std::vector<std::pair<uintptr_t, size_t>> ranges;
  for (const py::handle& b : py::reinterpret_borrow<py::list>(buffers)) {
    if (!py::isinstance<py::array>(b)) {
      throw_input("written must hold numpy arrays, got " + type_name(b));
    }
    auto a = py::reinterpret_borrow<py::array>(b);
    if (!(a.flags() & py::array::c_style)) {
      throw_input("written arrays must be C-contiguous (their bytes one range)");
    }
    ranges.emplace_back(reinterpret_cast<uintptr_t>(a.data()), static_cast<size_t>(a.nbytes()));
    held.push_back(std::move(a));
  }
  core_.set_written(std::move(ranges));
  written_ = std::move(held);  // kept alive: the ranges point into them
}

void PyExecutorCoreImpl::set_runs(const py::handle& runs) {
  if (in_run_) throw_input("set_runs() from inside a direct run of this core");
  std::vector<std::optional<DirectRun>> table;
  if (!runs.is_none()) {
    if (!PyList_Check(runs.ptr())) {
      throw_input("runs must be None or a list with one entry per gear, got " +
                  type_name(runs));
    }
    const auto entries = py::reinterpret_borrow<py::list>(runs);
    if (entries.size() != core_.gear_count()) {
      throw_input(std::to_string(entries.size()) + " direct runs for " +
                  std::to_string(core_.gear_count()) + " gears");
    }
    for (const py::handle& entry : entries) table.push_back(direct_run(entry));
  }
  runs_ = std::move(table);
}

py::object PyExecutorCoreImpl::execute(py::handle inputs, py::handle preset, bool pad,
                                       bool copy) {
  py::object placed = py::none();
  const int64_t gear = stage_request(inputs, preset, pad, &placed);
  if (gear < 0) return py::none();
  // a direct run reads every input from staging: one bound in place runs through the session
  if (!placed.is_none()) return py::make_tuple(gear, std::move(placed));
  const size_t g = static_cast<size_t>(gear);
  const std::optional<DirectRun>* run = g < runs_.size() ? &runs_[g] : nullptr;
  if (run == nullptr || !run->has_value() || (copy && !(*run)->copyable)) {
    return py::make_tuple(gear, py::none());
  }
  const DirectRun& r = **run;
  in_run_ = true;  // r lives in runs_: set_runs() refuses until the run returns
  PyObject* result = PyObject_Call(r.call.ptr(), r.args.ptr(), nullptr);
  in_run_ = false;
  if (result == nullptr) raise_run_failed(gear);
  Py_DECREF(result);
  const size_t n = r.outputs.size();
  py::list out(n);
  for (size_t k = 0; k < n; ++k) {
    out[k] = copy ? fresh_copy(r.outputs[k], r.nbytes[k]) : py::object(r.outputs[k]);
  }
  return py::make_tuple(gear, std::move(out));
}

std::vector<py::dtype> PyExecutorCoreImpl::to_dtypes(const std::vector<py::object>& given,
                                                     size_t n) {
  if (given.size() != n) {
    throw_input(std::to_string(given.size()) + " input dtypes for " + std::to_string(n) +
                " inputs");
  }
  std::vector<py::dtype> out;
  for (const py::object& d : given) out.push_back(py::dtype::from_args(d));
  return out;
}

std::vector<std::string> PyExecutorCoreImpl::names_of(
    const std::shared_ptr<const GearDispatch>& d) {
  std::vector<std::string> names;
  for (size_t i = 0; d && i < d->input_count(); ++i) names.push_back(d->dims().name(i));
  return names;
}

std::vector<InputSpec> PyExecutorCoreImpl::input_specs(
    const std::shared_ptr<const GearDispatch>& d, const std::vector<py::dtype>& dtypes) {
  std::vector<InputSpec> out;
  for (size_t i = 0; d && i < d->input_count(); ++i) {
    const std::string& name = d->dims().name(i);
    const std::string dtype = py::str(dtypes[i]);
    if (dtypes[i].attr("hasobject").cast<bool>()) {
      throw_input("input '" + name + "' dtype " + dtype +
                  " holds Python objects, which cannot be staged as bytes");
    }
    out.push_back({name, d->dims().shape(i), static_cast<size_t>(dtypes[i].itemsize()), dtype});
  }
  return out;
}

py::array PyExecutorCoreImpl::checked_staging(const py::array& staging) {
  if (!staging.dtype().equal(py::dtype::of<uint8_t>())) {
    throw_input("staging must have dtype uint8, got " + std::string(py::str(staging.dtype())));
  }
  if (!(staging.flags() & py::array::c_style) || !staging.writeable()) {
    throw_input("staging must be C-contiguous and writable");
  }
  return staging;
}

std::vector<py::str> PyExecutorCoreImpl::interned(const std::vector<std::string>& names) {
  std::vector<py::str> out;
  for (const std::string& name : names) {
    PyObject* str = py::str(name).release().ptr();  // by length: a NUL inside is kept
    PyUnicode_InternInPlace(&str);
    out.push_back(py::reinterpret_steal<py::str>(str));
  }
  return out;
}

std::optional<PyExecutorCoreImpl::DirectRun> PyExecutorCoreImpl::direct_run(
    const py::handle& entry) {
  if (entry.is_none()) return std::nullopt;
  const bool shaped = PyTuple_Check(entry.ptr()) && PyTuple_GET_SIZE(entry.ptr()) == 4;
  const auto parts = shaped ? py::reinterpret_borrow<py::tuple>(entry) : py::tuple();
  if (!shaped || !PyCallable_Check(parts[0].ptr()) || !PyTuple_Check(parts[1].ptr()) ||
      !PyList_Check(parts[2].ptr()) || !PyBool_Check(parts[3].ptr())) {
    throw_input("a direct run is None or a tuple (call, args: tuple, outputs: list, "
                "copyable: bool), got " + std::string(py::repr(entry)));
  }
  DirectRun run{parts[0], py::reinterpret_borrow<py::tuple>(parts[1]), {}, {},
                parts[3].ptr() == Py_True};
  for (const py::handle& item : py::reinterpret_borrow<py::list>(parts[2])) {
    if (Py_TYPE(item.ptr()) != &PyArray_Type ||
        !PyArray_IS_C_CONTIGUOUS(as_array(item.ptr()))) {
      throw_input("a direct run's outputs must be C-contiguous numpy arrays, got " +
                  std::string(py::repr(item)).substr(0, 200));
    }
    run.nbytes.push_back(static_cast<size_t>(PyArray_NBYTES(as_array(item.ptr()))));
    run.outputs.push_back(py::reinterpret_borrow<py::array>(item));
  }
  return run;
}

void PyExecutorCoreImpl::raise_run_failed(int64_t gear) {
  if (!PyErr_ExceptionMatches(PyExc_Exception)) throw py::error_already_set();
  py::error_already_set cause;  // takes the error out of the interpreter
  py::object failed = py::module_::import("gear_runtime.errors").attr("DirectRunFailed")(gear);
  PyException_SetCause(failed.ptr(), cause.value().inc_ref().ptr());  // steals the new ref
  PyErr_SetObject(reinterpret_cast<PyObject*>(Py_TYPE(failed.ptr())), failed.ptr());
  throw py::error_already_set();
}

py::object PyExecutorCoreImpl::fresh_copy(const py::array& a, size_t nbytes) {
  PyArrayObject* src = as_array(a.ptr());
  PyArray_Descr* descr = PyArray_DESCR(src);
  Py_INCREF(descr);  // PyArray_NewFromDescr steals it
  PyObject* copy = PyArray_NewFromDescr(&PyArray_Type, descr, PyArray_NDIM(src),
                                        PyArray_DIMS(src), nullptr, nullptr, 0, nullptr);
  if (copy == nullptr) throw py::error_already_set();
  if (nbytes) std::memcpy(PyArray_DATA(as_array(copy)), PyArray_DATA(src), nbytes);
  return py::reinterpret_steal<py::object>(copy);
}

namespace {

// ExecutorCore.execute, the one call of every execute(): a plain CPython METH_FASTCALL
// method rather than a pybind11 def, whose argument dispatch costs a tenth of the whole
// per-call budget (it builds its argument vectors on the heap). Positional arguments only:
// (inputs, preset, pad: bool, copy: bool). Errors are mapped as the translator maps them.
PyObject* execute_fastcall(PyObject* self, PyObject* const* args, Py_ssize_t nargs) {
  try {
    if (nargs != 4) {
      PyErr_Format(PyExc_TypeError,
                   "execute() takes 4 positional arguments (inputs, preset, pad, copy), "
                   "%zd given", nargs);
      return nullptr;
    }
    if (!PyBool_Check(args[2]) || !PyBool_Check(args[3])) {
      PyErr_SetString(PyExc_TypeError, "execute(): pad and copy must be True or False");
      return nullptr;
    }
    auto& core = py::handle(self).cast<PyExecutorCore&>();
    return core.execute(args[0], args[1], args[2] == Py_True, args[3] == Py_True)
        .release()
        .ptr();
  } catch (py::error_already_set& e) {
    e.restore();
  } catch (const Error& e) {
    set_python_error(e);
  } catch (const py::builtin_exception& e) {
    e.set_error();
  } catch (const std::bad_alloc&) {
    PyErr_NoMemory();
  } catch (const std::exception& e) {
    PyErr_SetString(PyExc_RuntimeError, e.what());
  }
  return nullptr;
}

PyMethodDef execute_def = {
    "execute", reinterpret_cast<PyCFunction>(reinterpret_cast<void (*)(void)>(execute_fastcall)),
    METH_FASTCALL,
    "execute(inputs, preset, pad, copy): stage a plain request (a dict of the input names, or "
    "a list / tuple in input order, of numpy arrays) and make the gear's direct run. None: "
    "not a plain request, nothing staged; (gear, None): staged, the caller runs the gear; "
    "(gear, outputs): ran (copies with copy). A direct run's exception comes out as "
    "gear_runtime.errors.DirectRunFailed(gear), caused by it."};

}  // namespace

void add_execute(const py::handle& cls) {
  PyObject* execute = PyDescr_NewMethod(reinterpret_cast<PyTypeObject*>(cls.ptr()), &execute_def);
  if (execute == nullptr) throw py::error_already_set();
  cls.attr("execute") = py::reinterpret_steal<py::object>(execute);
}

}  // namespace gear_runtime
