// The Python module gear_runtime._core: declarative pybind11 bindings of the plain C++ core.
//
// Only conversions live here: Python values to spans and ArrayViews (numpy arrays read in
// place, a non-C-contiguous one copied once), the GIL released around stage()'s copy, and the
// ONE exception translator that turns gear_runtime::Error into the package's classes via
// gear_runtime.errors.make_error. A call that does not fit the signatures is pybind11's
// TypeError; every check on the values themselves is the core's.
#include <pybind11/numpy.h>
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <cstdint>
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

// ExecutorCore with the Python objects it works with: the model's dtypes (what arrays are
// compared with) and the staging array (alive as long as the core).
class PyExecutorCoreImpl {
 public:
  PyExecutorCoreImpl(const std::vector<std::string>& names, const std::vector<Ints>& shapes,
                 const std::vector<Ints>& positions, const std::vector<Ints>& gears,
                 const std::vector<py::object>& input_dtypes, const BoundLayout& layout,
                 const py::array& staging)
      : dtypes_(to_dtypes(input_dtypes, names.size())),
        staging_(checked_staging(staging)),
        core_(input_specs(names, shapes, dtypes_), positions, gears, layout,
              static_cast<uint8_t*>(staging_.mutable_data()),
              static_cast<size_t>(staging_.nbytes())) {}

  ExecutorCore& core() { return core_; }

  void set_padding(const std::optional<std::vector<std::optional<py::bytes>>>& pad_values,
                   const std::optional<std::vector<double>>& costs) {
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
    core_.set_padding(pads, costs);
  }

  size_t stage(const py::sequence& arrays, const std::optional<Ints>& preset, bool pad) {
    const Request request(arrays, &dtypes_);
    const Values set = preset ? values_of(*preset) : Values{};
    return core_.stage(request.data(), request.size(), preset ? &set : nullptr, pad,
                       [](auto&& copy) {
                         py::gil_scoped_release no_gil;  // only memcpy/memset in here
                         copy();
                       });
  }

  py::tuple extract(const py::sequence& arrays) const {
    const Request request(arrays, nullptr);
    return tuple_of(core_.extract(request.data(), request.size()));
  }

  py::list nearest(const Ints& values, int64_t k) const {
    py::list out;
    for (const Ints& gear : core_.nearest(values_of(values), k)) out.append(tuple_of(gear));
    return out;
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

  static std::vector<InputSpec> input_specs(const std::vector<std::string>& names,
                                            const std::vector<Ints>& shapes,
                                            const std::vector<py::dtype>& dtypes) {
    if (shapes.size() != names.size()) {
      throw_spec(std::to_string(names.size()) + " input names but " +
                 std::to_string(shapes.size()) + " input shapes");
    }
    std::vector<InputSpec> out;
    for (size_t i = 0; i < names.size(); ++i) {
      const std::string dtype = py::str(dtypes[i]);
      if (dtypes[i].attr("hasobject").cast<bool>()) {
        throw_input("input '" + names[i] + "' dtype " + dtype +
                    " holds Python objects, which cannot be staged as bytes");
      }
      out.push_back({names[i], shapes[i], static_cast<size_t>(dtypes[i].itemsize()), dtype});
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

  std::vector<py::dtype> dtypes_;
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
  py::class_<D>(m, "GearDispatch", "Which gear: exact match and the cheapest cover, O(1).")
      .def(py::init([](const std::vector<std::string>& names, const std::vector<Ints>& shapes,
                       const std::vector<Ints>& positions, const std::vector<Ints>& gears,
                       const std::optional<std::vector<double>>& costs) {
             return make_bound<GearDispatch>(names, shapes, positions, gears, costs);
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

void bind_executor_core(py::module_& m) {
  using Core = PyExecutorCore;
  py::class_<Core>(m, "ExecutorCore", "Gear matching and input staging for one executor.")
      .def(py::init([](const std::vector<std::string>& names, const std::vector<Ints>& shapes,
                       const std::vector<Ints>& positions, const std::vector<Ints>& gears,
                       const std::vector<py::object>& dtypes, const BoundLayout& layout,
                       const py::array& staging) {
             return make_bound<PyExecutorCoreImpl>(names, shapes, positions, gears, dtypes,
                                                   layout, staging);
           }),
           py::arg("input_names"), py::arg("input_shapes"), py::arg("dynamic_positions"),
           py::arg("gears"), py::arg("input_dtypes"), py::arg("layout"),
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
      .def("set_padding", &Core::set_padding, py::arg("pad_values") = py::none(),
           py::arg("costs") = py::none())
      .def(
          "match", [](Core& c, const Ints& v) { return c.core().match(values_of(v)); },
          py::arg("values"))
      .def(
          "cover", [](Core& c, const Ints& v) { return c.core().cover(values_of(v)); },
          py::arg("values"))
      .def("nearest", &Core::nearest, py::arg("values"), py::arg("k") = 5)
      .def(
          "values_from_full_dims",
          [](Core& c, const Ints& full) {
            return tuple_of(c.core().values_from_full_dims(values_of(full)));
          },
          py::arg("full_dims"))
      .def("extract", &Core::extract, py::arg("arrays"))
      .def("stage", &Core::stage, py::arg("arrays"), py::arg("preset") = py::none(),
           py::arg("pad") = false);
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
