// The Python module gear_runtime._core: the declarative pybind11 bindings of the plain C++
// core (Layout and plan_layout, GearDispatch, ExecutorCore) and the module init.
//
// Only declarations and conversions live here. The conversions both halves of the module share
// are in py_convert.h: Python values to spans and ArrayViews (numpy arrays read in place, a
// non-C-contiguous one copied once) and the ONE exception translator, registered here, that
// turns gear_runtime::Error into the package's classes via gear_runtime.errors.make_error. A
// call that does not fit the signatures is a TypeError; every check on the values themselves
// is the core's. ExecutorCore's Python side (PyExecutorCoreImpl: staging, with the GIL
// released around a large copy; the direct runs) and its execute(), the one call of every
// Executor.execute(), are hand-written CPython on numpy's C API in fast_path.cc (why:
// fast_path.h): this file binds the rest of that class declaratively and adds execute() to it
// (add_execute). numpy's C API is loaded once, here at module init (import_numpy).
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
#include "fast_path.h"
#include "layout.h"
#include "py_convert.h"

namespace gear_runtime {
namespace {

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
      .def_property_readonly("last_in_place",
                             [](Core& c) {
                               const std::vector<size_t>& placed = c.core().last_in_place();
                               return tuple_of(Ints(placed.begin(), placed.end()));
                             })
      .def_property("in_place_bytes", [](Core& c) { return c.core().in_place_bytes(); },
                    [](Core& c, size_t bytes) { c.core().set_in_place_bytes(bytes); })
      .def("set_padding", &Core::set_padding, py::arg("pad_values") = py::none())
      .def("stage", &Core::stage, py::arg("arrays"), py::arg("preset") = py::none(),
           py::arg("pad") = false)
      .def("set_runs", &Core::set_runs, py::arg("runs"))
      .def("set_written", &Core::set_written, py::arg("buffers"));
  add_execute(cls);  // the METH_FASTCALL execute (fast_path.cc)
}

}  // namespace
}  // namespace gear_runtime

PYBIND11_MODULE(_core, m) {
  using namespace gear_runtime;
  m.doc() = "C++ hot path of gear_runtime (see gear_runtime.runtime.core for the documented API).";
  import_numpy();  // numpy's C API for the fast path; its failure is this import's ImportError
  py::register_exception_translator(&translate);
  m.attr("DEFAULT_FUSION_SIZE") = kDefaultFusionSize;
  m.attr("MAX_FUSION_SIZE") = kMaxFusionSize;
  m.attr("DEFAULT_ALIGNMENT") = kDefaultAlignment;
  bind_layout(m);
  bind_dispatch(m);
  bind_executor_core(m);
}
