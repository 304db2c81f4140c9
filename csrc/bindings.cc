// The Python module gear_runtime._core: declarative pybind11 bindings of the plain C++ core.
//
// Only conversions live here: Python values to spans and ArrayViews (numpy arrays read in
// place, a non-C-contiguous one copied once), the GIL released around a large copy of
// stage(), and the ONE exception translator that turns gear_runtime::Error into the
// package's classes via gear_runtime.errors.make_error (execute_fastcall maps errors the same
// way). A call that does not fit the signatures is a TypeError; every check on the values
// themselves is the core's. One exception to "only conversions": ExecutorCore.execute also
// makes the session's direct run after staging (a Python call handed over by the backend,
// BackendSession.direct_runs), so that the common execute() is one call from Python.
#include <pybind11/numpy.h>
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <cstdint>
#include <cstring>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "dispatch.h"
#include "errors.h"
#include "executor_core.h"
#include "layout.h"

namespace py = pybind11;

namespace gear_runtime {
namespace {

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

using BoundLayout = Bound<Layout>;
using BoundDispatch = Bound<GearDispatch>;

Values values_of(const Ints& v) { return {v.data(), v.size()}; }

py::tuple tuple_of(const Ints& v) {
  py::tuple out(v.size());
  for (size_t j = 0; j < v.size(); ++j) out[j] = py::int_(v[j]);
  return out;
}

std::string type_name(py::handle obj) {
  return py::str(py::type::handle_of(obj).attr("__name__"));
}

// The arrays of one call as ArrayViews. Holds a reference to every item (or to the
// C-contiguous copy of one that was not) for the whole call: stage() copies without the GIL,
// when another thread could drop the caller's last reference to an array.
class Request {
 public:
  // `dtypes`: the model's, compared with the arrays' (nullptr: not compared).
  Request(const py::sequence& arrays, const std::vector<py::dtype>* dtypes)
      : views_(py::len(arrays)), keep_(views_.size()), types_(views_.size()) {
    for (size_t i = 0; i < views_.size(); ++i) {
      const py::dtype* expected = dtypes && i < dtypes->size() ? &(*dtypes)[i] : nullptr;
      read(i, arrays[i], expected);
    }
  }
  const ArrayView* data() const { return views_.data(); }
  size_t size() const { return views_.size(); }

 private:
  void read(size_t i, py::object item, const py::dtype* expected) {
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

  std::vector<ArrayView> views_;
  std::vector<py::object> keep_;
  std::vector<std::string> types_;  // what views_[i].type points at
};

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

// ExecutorCore with the Python objects it works with: the model's dtypes (what arrays are
// compared with) and the staging array (alive as long as the core).
class PyExecutorCoreImpl {
 public:
  // The inputs (names, shapes) are the dispatch's: the model's one GearDispatch, shared.
  PyExecutorCoreImpl(std::shared_ptr<const GearDispatch> dispatch,
                     const std::vector<py::object>& input_dtypes, const BoundLayout& layout,
                     const py::array& staging)
      : dtypes_(to_dtypes(input_dtypes, dispatch ? dispatch->input_count() : 0)),
        py_names_(interned(names_of(dispatch))),
        staging_(checked_staging(staging)),
        core_(input_specs(dispatch, dtypes_), dispatch, layout,
              static_cast<uint8_t*>(staging_.mutable_data()),
              static_cast<size_t>(staging_.nbytes())) {}

  ExecutorCore& core() { return core_; }

  void set_padding(const std::optional<std::vector<std::optional<py::bytes>>>& pad_values) {
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

  size_t stage(const py::sequence& arrays, const std::optional<Ints>& preset, bool pad) {
    const Request request(arrays, &dtypes_);
    const Values set = preset ? values_of(*preset) : Values{};
    return stage_views(request.data(), request.size(), preset ? &set : nullptr, pad);
  }

  // stage() on execute()'s own `inputs`, for the call a service makes: a dict holding exactly
  // the model's input names, or a list / tuple in input order, of numpy arrays (not
  // subclasses). Returns the gear; -1 for anything else (a nested list, an ndarray subclass,
  // a missing or unknown name, another container, another count) without touching the
  // staging buffer: the caller then applies the Python rules (gear_runtime.runtime.inputs)
  // and calls stage(). What goes wrong with the arrays themselves (dtype, layout, shapes) is
  // stage()'s business: it gets them as a list. `preset`: None or the set dims (a tuple).
  int64_t stage_request(py::handle inputs, py::handle preset, bool pad) {
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
    const auto& api = py::detail::npy_api::get();
    for (size_t i = 0; i < n; ++i) {
      if (Py_TYPE(held[i]) != api.PyArray_Type_) return -1;
    }
    Ints spill;  // a preset that is not a plain tuple of ints (never from execute())
    int64_t set_values[kMaxValues];
    Values set{set_values, 0};
    const Values* set_ptr = read_preset(preset, set_values, spill, set);
    for (size_t i = 0; i < n; ++i) {
      const auto* a = py::detail::array_proxy(held[i]);
      PyObject* expected = dtypes_[i].ptr();
      const bool plain = (a->flags & py::detail::npy_api::NPY_ARRAY_C_CONTIGUOUS_) &&
                         (a->descr == expected || api.PyArray_EquivTypes_(a->descr, expected));
      if (!plain) {  // stage() copies a strided array once, or names the wrong dtype
        const Request request(held.list(), &dtypes_);
        return static_cast<int64_t>(stage_views(request.data(), n, set_ptr, pad));
      }
      ArrayView& view = held.view(i);
      view.data = a->data;
      view.shape = reinterpret_cast<const int64_t*>(a->dimensions);
      view.ndim = static_cast<size_t>(a->nd);
    }
    return static_cast<int64_t>(stage_views(held.views(), n, set_ptr, pad));
  }

  // A copy this large runs with the GIL released (other threads run meanwhile); a smaller
  // one keeps it: releasing and taking the GIL back costs more than copying a few KiB, and
  // when another thread holds it by then, the wait is up to its switch interval (5 ms).
  static constexpr size_t kReleaseGilBytes = 256 * 1024;

  size_t stage_views(const ArrayView* views, size_t n, const Values* preset, bool pad) {
    return core_.stage(views, n, preset, pad, [](size_t bytes, auto&& copy) {
      if (bytes < kReleaseGilBytes) {
        copy();
        return;
      }
      py::gil_scoped_release no_gil;  // only memcpy/memset in here
      copy();
    });
  }

  // `preset` as values: nullptr for None; a tuple of ints read onto `buf` (the hot case),
  // anything else converted as stage()'s argument is (into `spill`; a TypeError if it is
  // no sequence of ints).
  static const Values* read_preset(py::handle preset, int64_t* buf, Ints& spill, Values& out) {
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

  // The backend's runs that execute() makes itself, right after staging: per gear None (the
  // executor runs that gear through its session) or (call, args, outputs, copyable):
  // call(*args) runs the gear and leaves its outputs in `outputs`, the same C-contiguous
  // arrays every run; `copyable`: whether execute(copy=True) may hand out copies of them
  // (False: the session has a better way, e.g. pooled memory for large outputs). None: no
  // direct runs. The entries are checked here, once.
  void set_runs(const py::handle& runs) {
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

  // What Executor.execute asks first: stage_request(inputs, preset, pad), then the staged
  // gear's direct run. Returns None when the inputs need the Python rules (nothing staged);
  // (gear, None) when staged but the gear has no direct run for this `copy` (the executor runs
  // it); else (gear, outputs): a new list of the run's arrays, or with `copy` of fresh copies
  // the caller keeps. An exception of the run itself comes out as DirectRunFailed(gear),
  // caused by it.
  py::object execute(py::handle inputs, py::handle preset, bool pad, bool copy) {
    const int64_t gear = stage_request(inputs, preset, pad);
    if (gear < 0) return py::none();
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

 private:
  static std::vector<py::dtype> to_dtypes(const std::vector<py::object>& given, size_t n) {
    if (given.size() != n) {
      throw_input(std::to_string(given.size()) + " input dtypes for " + std::to_string(n) +
                  " inputs");
    }
    std::vector<py::dtype> out;
    for (const py::object& d : given) out.push_back(py::dtype::from_args(d));
    return out;
  }

  // The dispatch's input names (none without a dispatch: the core refuses that).
  static std::vector<std::string> names_of(const std::shared_ptr<const GearDispatch>& d) {
    std::vector<std::string> names;
    for (size_t i = 0; d && i < d->input_count(); ++i) names.push_back(d->dims().name(i));
    return names;
  }

  static std::vector<InputSpec> input_specs(const std::shared_ptr<const GearDispatch>& d,
                                            const std::vector<py::dtype>& dtypes) {
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

  static py::array checked_staging(const py::array& staging) {
    if (!staging.dtype().equal(py::dtype::of<uint8_t>())) {
      throw_input("staging must have dtype uint8, got " + std::string(py::str(staging.dtype())));
    }
    if (!(staging.flags() & py::array::c_style) || !staging.writeable()) {
      throw_input("staging must be C-contiguous and writable");
    }
    return staging;
  }

  static std::vector<py::str> interned(const std::vector<std::string>& names) {
    std::vector<py::str> out;
    for (const std::string& name : names) {
      PyObject* str = py::str(name).release().ptr();  // by length: a NUL inside is kept
      PyUnicode_InternInPlace(&str);
      out.push_back(py::reinterpret_steal<py::str>(str));
    }
    return out;
  }

  struct DirectRun {
    py::object call;
    py::tuple args;
    std::vector<py::array> outputs;
    std::vector<size_t> nbytes;  // of each output
    bool copyable = false;
  };

  static std::optional<DirectRun> direct_run(const py::handle& entry) {
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
      if (Py_TYPE(item.ptr()) != py::detail::npy_api::get().PyArray_Type_ ||
          !(py::reinterpret_borrow<py::array>(item).flags() & py::array::c_style)) {
        throw_input("a direct run's outputs must be C-contiguous numpy arrays, got " +
                    std::string(py::repr(item)).substr(0, 200));
      }
      auto a = py::reinterpret_borrow<py::array>(item);
      run.nbytes.push_back(static_cast<size_t>(a.nbytes()));
      run.outputs.push_back(std::move(a));
    }
    return run;
  }

  // The run raised (the Python error is set): an Exception is raised again as
  // gear_runtime.errors.DirectRunFailed(gear) caused by it, for the executor to turn into
  // the backend's error; anything else (KeyboardInterrupt, SystemExit) as it is.
  [[noreturn]] static void raise_run_failed(int64_t gear) {
    if (!PyErr_ExceptionMatches(PyExc_Exception)) throw py::error_already_set();
    py::error_already_set cause;  // takes the error out of the interpreter
    py::object failed = py::module_::import("gear_runtime.errors").attr("DirectRunFailed")(gear);
    PyException_SetCause(failed.ptr(), cause.value().inc_ref().ptr());  // steals the new ref
    PyErr_SetObject(reinterpret_cast<PyObject*>(Py_TYPE(failed.ptr())), failed.ptr());
    throw py::error_already_set();
  }

  // A new C-contiguous array of `a`'s dtype and shape holding its `nbytes` bytes.
  static py::object fresh_copy(const py::array& a, size_t nbytes) {
    const auto& api = py::detail::npy_api::get();
    const auto* src = py::detail::array_proxy(a.ptr());
    Py_INCREF(src->descr);  // PyArray_NewFromDescr steals it
    PyObject* copy = api.PyArray_NewFromDescr_(api.PyArray_Type_, src->descr, src->nd,
                                               src->dimensions, nullptr, nullptr, 0, nullptr);
    if (copy == nullptr) throw py::error_already_set();
    if (nbytes) std::memcpy(py::detail::array_proxy(copy)->data, src->data, nbytes);
    return py::reinterpret_steal<py::object>(copy);
  }

  std::vector<py::dtype> dtypes_;
  std::vector<py::str> py_names_;  // the input names as dict keys (interned: hashed once)
  std::vector<std::optional<DirectRun>> runs_;
  bool in_run_ = false;  // a direct run is in progress (its entry must stay where it is)
  py::array staging_;
  ExecutorCore core_;
};

using PyExecutorCore = Bound<PyExecutorCoreImpl>;

// Raise e as the package's exception: gear_runtime.errors.make_error(kind, message, code).
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

// The ONE translator for everything bound here.
void translate(std::exception_ptr p) {
  try {
    if (p) std::rethrow_exception(p);
  } catch (const Error& e) {
    set_python_error(e);
  }
}

std::pair<size_t, size_t> span_pair(const Span& s) { return {s.start, s.end}; }

py::tuple float_tuple(const std::vector<double>& v) {
  py::tuple out(v.size());
  for (size_t j = 0; j < v.size(); ++j) out[j] = py::float_(v[j]);
  return out;
}

// cover() of every row of `requests` (int64 [n, values_per_gear]), -1 where nothing covers:
// the dispatcher's batch table and the planner's view of many requests in one call.
py::array_t<int64_t> cover_many(const BoundDispatch& d,
                                const py::array_t<int64_t, py::array::c_style>& requests) {
  const size_t width = d.values_per_gear();
  if (requests.ndim() != 2 || static_cast<size_t>(requests.shape(1)) != width) {
    throw_length("requests must be an array [n, " + std::to_string(width) +
                 "] of dynamic values, got one of " + std::to_string(requests.ndim()) +
                 " dims" +
                 (requests.ndim() == 2 ? " with " + std::to_string(requests.shape(1)) +
                                             " values per row"
                                       : std::string()));
  }
  const size_t n = static_cast<size_t>(requests.shape(0));
  py::array_t<int64_t> out(static_cast<py::ssize_t>(n));
  const int64_t* in = requests.data();
  int64_t* gears = out.mutable_data();
  {
    py::gil_scoped_release no_gil;  // plain lookups over memory this call holds
    for (size_t r = 0; r < n; ++r) gears[r] = d.find_cover(in + r * width);
  }
  return out;
}

void bind_layout(py::module_& m) {
  py::class_<BoundLayout>(m, "Layout", "Staging layout of every gear; built by plan_layout().")
      .def_property_readonly("gear_count", &Layout::gear_count)
      .def_property_readonly("input_count", &Layout::input_count)
      .def_property_readonly("merged", &Layout::merged)
      .def_property_readonly("dims_nbytes", &Layout::dims_nbytes)
      .def_property_readonly("total_bytes", &Layout::total_bytes)
      .def_property_readonly("alignment", &Layout::alignment)
      .def_property_readonly("tail_padding", &Layout::tail_padding)
      .def("offset", &Layout::offset, py::arg("gear"), py::arg("input"))
      .def("nbytes", &Layout::nbytes, py::arg("gear"), py::arg("input"))
      .def("fused", &Layout::fused, py::arg("input"))
      .def("dims_offset", &Layout::dims_offset, py::arg("gear"))
      .def(
          "merged_span", [](const BoundLayout& l, size_t g) { return span_pair(l.merged_span(g)); },
          py::arg("gear"))
      .def(
          "separate",
          [](const BoundLayout& l, size_t g) {
            std::vector<std::pair<size_t, size_t>> out;
            for (const Span& s : l.separate(g)) out.push_back(span_pair(s));
            return out;
          },
          py::arg("gear"))
      .def("__repr__", &Layout::repr);

  m.def(
      "plan_layout",
      [](const std::vector<Ints>& input_nbytes, int64_t dims_count, int64_t fusion_size,
         int64_t alignment, int64_t tail_padding) {
        return make_bound<Layout>(plan_layout_checked(input_nbytes, dims_count, fusion_size,
                                                      alignment, tail_padding));
      },
      py::arg("input_nbytes"), py::arg("dims_count"),
        py::arg("fusion_size") = kDefaultFusionSize, py::arg("alignment") = kDefaultAlignment,
        py::arg("tail_padding") = 0,
        "Plan the staging layout of every gear (rules: csrc/layout.h).");
}

void bind_dispatch(py::module_& m) {
  using D = BoundDispatch;
  // Held by shared_ptr: one instance per model, shared by every executor's core.
  py::class_<D, std::shared_ptr<D>>(m, "GearDispatch",
                                    "Which gear: exact match and the cheapest cover.")
      .def(py::init([](const std::vector<std::string>& names, const std::vector<Ints>& shapes,
                       const std::vector<Ints>& positions, const std::vector<Ints>& gears,
                       const std::optional<std::vector<double>>& costs) {
             return std::shared_ptr<D>(make_bound<GearDispatch>(names, shapes, positions,
                                                                gears, costs));
           }),
           py::arg("input_names"), py::arg("input_shapes"), py::arg("dynamic_positions"),
           py::arg("gears"), py::arg("costs") = py::none())
      .def_property_readonly("gear_count", &GearDispatch::gear_count)
      .def_property_readonly("values_per_gear", &GearDispatch::values_per_gear)
      .def_property_readonly("costs", [](const D& d) { return float_tuple(d.costs()); })
      .def(
          "match", [](const D& d, const Ints& v) { return d.match(values_of(v)); },
          py::arg("values"))
      .def(
          "cover", [](const D& d, const Ints& v) { return d.cover(values_of(v)); },
          py::arg("values"))
      .def("cover_many", &cover_many, py::arg("requests"))
      .def(
          "nearest",
          [](const D& d, const Ints& v, int64_t k) {
            py::list out;
            for (const Ints& gear : d.nearest(values_of(v), k)) out.append(tuple_of(gear));
            return out;
          },
          py::arg("values"), py::arg("k") = 5)
      .def(
          "values_from_full_dims",
          [](const D& d, const Ints& full) {
            return tuple_of(d.values_from_full_dims(values_of(full)));
          },
          py::arg("full_dims"))
      .def(
          "extract",
          [](const D& d, const py::sequence& arrays) {
            const Request request(arrays, nullptr);
            return tuple_of(d.extract(request.data(), request.size()));
          },
          py::arg("arrays"))
      .def(
          "elements", [](const D& d, const Ints& v) { return d.elements(values_of(v)); },
          py::arg("values"));
}

// The GearDispatch instance `obj` holds, to share (a TypeError for anything else, and for one
// made without __init__: it is used as a reference first, which Bound refuses).
std::shared_ptr<BoundDispatch> shared_dispatch(const py::object& obj) {
  if (!py::isinstance<BoundDispatch>(obj)) {
    throw py::type_error("dispatch must be a GearDispatch, got " + type_name(obj));
  }
  obj.cast<const BoundDispatch&>();
  return obj.cast<std::shared_ptr<BoundDispatch>>();
}

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

void bind_executor_core(py::module_& m) {
  using Core = PyExecutorCore;
  auto cls = py::class_<Core>(m, "ExecutorCore",
                              "Gear matching and input staging for one executor.");
  cls
      .def(py::init([](const py::object& dispatch, const std::vector<py::object>& dtypes,
                       const BoundLayout& layout, const py::array& staging) {
             return make_bound<PyExecutorCoreImpl>(shared_dispatch(dispatch), dtypes, layout,
                                                   staging);
           }),
           py::arg("dispatch"), py::arg("input_dtypes"), py::arg("layout"),
           py::arg("staging").noconvert())  // never a converted copy: the core writes into it
      .def_property_readonly("gear_count", [](Core& c) { return c.core().gear_count(); })
      .def_property_readonly("values_per_gear",
                             [](Core& c) { return c.core().values_per_gear(); })
      .def_property_readonly(
          "layout", [](Core& c) { return make_bound<Layout>(Layout(c.core().layout())); })
      .def_property_readonly("last_values",
                             [](Core& c) { return tuple_of(c.core().last_values()); })
      .def_property_readonly("last_request",
                             [](Core& c) { return tuple_of(c.core().last_request()); })
      .def_property_readonly(
          "dispatch",
          [](Core& c) {  // the very instance it was made with
            return std::const_pointer_cast<BoundDispatch>(
                std::static_pointer_cast<const BoundDispatch>(c.core().dispatch()));
          })
      .def("set_padding", &Core::set_padding, py::arg("pad_values") = py::none())
      .def("stage", &Core::stage, py::arg("arrays"), py::arg("preset") = py::none(),
           py::arg("pad") = false)
      .def("set_runs", &Core::set_runs, py::arg("runs"));
  PyObject* execute = PyDescr_NewMethod(reinterpret_cast<PyTypeObject*>(cls.ptr()), &execute_def);
  if (execute == nullptr) throw py::error_already_set();
  cls.attr("execute") = py::reinterpret_steal<py::object>(execute);
}

}  // namespace
}  // namespace gear_runtime

PYBIND11_MODULE(_core, m) {
  using namespace gear_runtime;
  m.doc() = "C++ hot path of gear_runtime (see gear_runtime.runtime.core for the documented API).";
  py::register_exception_translator(&translate);
  m.attr("DEFAULT_FUSION_SIZE") = kDefaultFusionSize;
  m.attr("MAX_FUSION_SIZE") = kMaxFusionSize;
  m.attr("DEFAULT_ALIGNMENT") = kDefaultAlignment;
  bind_layout(m);
  bind_dispatch(m);
  bind_executor_core(m);
}
