// Python bindings of the C++ core: the module gear_runtime._core.
//
// Everything Python-facing lives here: argument conversion (bad input becomes InputError,
// never TypeError/IndexError), the ExecutorCore glue around GearTable / DimsExtractor / Stager,
// and the ONE exception translator that turns gear_runtime::Error into the package's classes
// via gear_runtime.errors.make_error. gear_runtime/core/reference.py is the pure-Python twin;
// every message here must stay identical to it (tests/test_core_parity.py compares them).
#include <pybind11/numpy.h>
#include <pybind11/pybind11.h>

#include <atomic>
#include <cstring>
#include <initializer_list>
#include <memory>
#include <new>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "dims.h"
#include "errors.h"
#include "gear_table.h"
#include "layout.h"
#include "staging.h"

namespace py = pybind11;

namespace gear_runtime {
namespace {

static_assert(sizeof(py::ssize_t) == sizeof(int64_t), "numpy dims are read as int64");

// GE allows at most ACL_MAX_DIM_CNT = 128 dynamic values; DimsExtractor enforces it, so the
// hot path keeps values on the stack.
constexpr size_t kMaxValues = 128;

std::string type_name(py::handle obj) {
  return py::str(py::type::handle_of(obj).attr("__name__")).cast<std::string>();
}

const py::detail::npy_api& npy() { return py::detail::npy_api::get(); }

// ---- argument conversion ---------------------------------------------------------------------

// A sequence as PySequence_Fast sees it (lists and tuples without a copy; any other iterable
// is read into a list once). Not an iterable -> InputError "<what> must be a sequence".
class Items {
 public:
  Items(py::handle obj, std::string_view what) {
    PyObject* seq = PySequence_Fast(obj.ptr(), "");
    if (seq == nullptr) {
      if (!PyErr_ExceptionMatches(PyExc_TypeError)) throw py::error_already_set();
      PyErr_Clear();
      throw_input(std::string(what) + " must be a sequence, got " + type_name(obj));
    }
    seq_ = py::reinterpret_steal<py::object>(seq);
  }
  size_t size() const { return static_cast<size_t>(PySequence_Fast_GET_SIZE(seq_.ptr())); }
  PyObject* operator[](size_t i) const {
    return PySequence_Fast_GET_ITEM(seq_.ptr(), static_cast<py::ssize_t>(i));
  }

 private:
  py::object seq_;
};

// "<what>" or "<what> item <j>": how messages name a value (built on the error path only).
std::string label_of(std::string_view what, int64_t item) {
  std::string label(what);
  if (item >= 0) label += " item " + std::to_string(item);
  return label;
}

// operator.index(obj) as int64; `what` (and `item` when >= 0) name it in messages
// ("dims_count", "dynamic dims item 2"); a non-int -> "<label> is <type>, not an int".
int64_t to_int64(PyObject* obj, std::string_view what, int64_t item = -1) {
  int overflow = 0;
  long long value;
  if (PyLong_CheckExact(obj)) {
    value = PyLong_AsLongLongAndOverflow(obj, &overflow);
  } else {
    PyObject* index = PyNumber_Index(obj);
    if (index == nullptr) {
      if (!PyErr_ExceptionMatches(PyExc_TypeError)) throw py::error_already_set();
      PyErr_Clear();
      throw_input(label_of(what, item) + " is " + type_name(obj) + ", not an int");
    }
    value = PyLong_AsLongLongAndOverflow(index, &overflow);
    Py_DECREF(index);
  }
  if (overflow != 0) throw_input(label_of(what, item) + " does not fit in 64 bits");
  if (value == -1 && PyErr_Occurred()) throw py::error_already_set();
  return static_cast<int64_t>(value);
}

int64_t item_int(const Items& items, size_t j, std::string_view what) {
  return to_int64(items[j], what, static_cast<int64_t>(j));
}

std::vector<int64_t> to_int_vector(py::handle obj, std::string_view what) {
  Items items(obj, what);
  std::vector<int64_t> out(items.size());
  for (size_t j = 0; j < out.size(); ++j) out[j] = item_int(items, j, what);
  return out;
}

// Values of the gear tuple size: sequence -> length (145012) -> items. Writes into buf.
void read_values(py::handle obj, std::string_view what, size_t expected, int64_t* buf) {
  Items items(obj, what);
  if (items.size() != expected) {
    throw_length(std::string(what) + " have " + std::to_string(items.size()) +
                 " values, the model's gears have " +
                 std::to_string(expected));
  }
  for (size_t j = 0; j < expected; ++j) buf[j] = item_int(items, j, what);
}

py::tuple to_tuple(const int64_t* values, size_t n) {
  py::tuple out(n);
  for (size_t j = 0; j < n; ++j) {
    PyObject* v = PyLong_FromLongLong(values[j]);
    if (v == nullptr) throw py::error_already_set();
    PyTuple_SET_ITEM(out.ptr(), static_cast<py::ssize_t>(j), v);
  }
  return out;
}

// An index argument in [0, count): "<what> <v> out of range: the layout has <count> <unit>".
size_t index_arg(py::handle obj, const char* what, size_t count, const char* unit) {
  const int64_t v = to_int64(obj.ptr(), what);
  if (v < 0 || static_cast<uint64_t>(v) >= count) {
    throw_input(std::string(what) + " " + std::to_string(v) + " out of range: the layout has " +
                std::to_string(count) + " " + unit);
  }
  return static_cast<size_t>(v);
}

// ---- plan_layout -------------------------------------------------------------------------------

Layout plan_layout(py::handle input_nbytes, py::handle dims_count, py::handle fusion_size,
                   py::handle alignment, py::handle tail_padding) {
  Items rows(input_nbytes, "input_nbytes");
  std::vector<std::vector<size_t>> table(rows.size());
  for (size_t g = 0; g < rows.size(); ++g) {
    const std::string what = "input_nbytes[" + std::to_string(g) + "]";
    const std::vector<int64_t> row = to_int_vector(rows[g], what);
    table[g].resize(row.size());
    for (size_t i = 0; i < row.size(); ++i) {
      if (row[i] < 0) {
        throw_input(what + "[" + std::to_string(i) + "] is " + std::to_string(row[i]) +
                    ", a byte count must be >= 0");
      }
      table[g][i] = static_cast<size_t>(row[i]);
    }
  }
  const int64_t dims = to_int64(dims_count.ptr(), "dims_count");
  if (dims < 0) throw_input("dims_count must be >= 0, got " + std::to_string(dims));
  const int64_t fusion = to_int64(fusion_size.ptr(), "fusion_size");
  const int64_t align = to_int64(alignment.ptr(), "alignment");
  if (align <= 0) {
    throw_input("alignment must be a power of two >= 1, got " + std::to_string(align));
  }
  const int64_t padding = to_int64(tail_padding.ptr(), "tail_padding");  // < 0: Layout::plan
  return Layout::plan(table, static_cast<size_t>(dims), fusion, static_cast<size_t>(align),
                      padding);
}

py::tuple span_tuple(const Span& s) { return py::make_tuple(s.start, s.end); }

// ---- instances of the bound classes ------------------------------------------------------------
// An instance made with T.__new__ alone (no __init__) has storage but no T in it: reading it
// (as pybind11's cast<T&> does) is a wild read. Every use of a bound instance goes through
// value_of<> instead.
template <typename T>
const py::detail::type_info* bound_type() {
  static const py::detail::type_info* info = py::detail::get_type_info(typeid(T));
  return info;
}

// The T inside obj, or nullptr when obj is not a T or its __init__ was not called.
template <typename T>
T* value_of(py::handle obj) {
  const py::detail::type_info* info = bound_type<T>();
  if (!PyObject_TypeCheck(obj.ptr(), info->type)) return nullptr;
  auto* inst = reinterpret_cast<py::detail::instance*>(obj.ptr());
  py::detail::value_and_holder vh = inst->get_value_and_holder(info, true);
  return vh.holder_constructed() ? vh.value_ptr<T>() : nullptr;
}

// `self` of a bound method: not a T, or a T whose __init__ was not called, is a TypeError (as
// for Python's own methods on a wrong self), never a wild read.
template <typename T>
T& self_of(py::handle self) {
  PyTypeObject* type = bound_type<T>()->type;
  if (!PyObject_TypeCheck(self.ptr(), type)) throw py::type_error("wrong self type");
  T* value = value_of<T>(self);
  if (value == nullptr) {
    throw py::type_error(std::string(type->tp_name) + ".__init__ was not called");
  }
  return *value;
}

// ---- ExecutorCore ------------------------------------------------------------------------------

std::vector<std::string> to_names(py::handle obj) {
  Items items(obj, "input_names");
  std::vector<std::string> out(items.size());
  for (size_t j = 0; j < out.size(); ++j) {
    if (!PyUnicode_Check(items[j])) {
      throw_input("input_names item " + std::to_string(j) + " is " + type_name(items[j]) +
                  ", not a str");
    }
    Py_ssize_t size = 0;
    const char* utf8 = PyUnicode_AsUTF8AndSize(items[j], &size);
    if (utf8 == nullptr) {  // lone surrogates: no UTF-8 form for the C++ side to hold
      if (!PyErr_ExceptionMatches(PyExc_UnicodeEncodeError)) throw py::error_already_set();
      PyErr_Clear();
      throw_input("input_names item " + std::to_string(j) + " " +
                  py::repr(items[j]).cast<std::string>() + " cannot be encoded as UTF-8");
    }
    out[j].assign(utf8, static_cast<size_t>(size));
  }
  return out;
}

std::vector<std::vector<int64_t>> to_int_matrix(py::handle obj, std::string_view what) {
  Items rows(obj, what);
  std::vector<std::vector<int64_t>> out(rows.size());
  for (size_t j = 0; j < out.size(); ++j) {
    out[j] = to_int_vector(rows[j], std::string(what) + "[" + std::to_string(j) + "]");
  }
  return out;
}

std::vector<DynamicPosition> to_positions(py::handle obj) {
  const std::vector<std::vector<int64_t>> rows = to_int_matrix(obj, "dynamic_positions");
  std::vector<DynamicPosition> out(rows.size());
  for (size_t p = 0; p < rows.size(); ++p) {
    const std::string what = "dynamic_positions[" + std::to_string(p) + "]";
    if (rows[p].size() != 3) {
      throw_input(what + " must have 3 values (input, axis, value), got " +
                  std::to_string(rows[p].size()));
    }
    for (int64_t v : rows[p]) {
      if (v < 0) throw_input(what + " " + format_tuple(rows[p]) + " has a negative value");
    }
    out[p] = {static_cast<size_t>(rows[p][0]), static_cast<size_t>(rows[p][1]),
              static_cast<size_t>(rows[p][2])};
  }
  return out;
}

// Resets a flag on scope exit: one stage() at a time per core.
class BusyGuard {
 public:
  explicit BusyGuard(std::atomic<bool>& flag) : flag_(flag) {
    if (flag_.exchange(true)) {
      throw_input("ExecutorCore.stage is already running in another thread: use one executor "
                  "per thread");
    }
  }
  ~BusyGuard() { flag_.store(false); }
  BusyGuard(const BusyGuard&) = delete;
  BusyGuard& operator=(const BusyGuard&) = delete;

 private:
  std::atomic<bool>& flag_;
};

class ExecutorCore {
 public:
  ExecutorCore(py::handle input_names, py::handle input_shapes, py::handle dynamic_positions,
               py::handle gears, py::handle input_dtypes, py::handle layout, py::handle staging)
      : dims_(make_dims(input_names, input_shapes, dynamic_positions)),
        table_(to_int_matrix(gears, "gears"), dims_.values_per_gear()) {
    init_dtypes(input_dtypes);
    init_staging(layout, staging);
    const size_t n = dims_.input_count();
    shapes_.resize(n);
    sources_.resize(n);
    keep_.resize(n);
    init_padding();
  }

  // Pad values (bytes of each input's dtype, None: zeros) and gear costs (None: each gear's
  // total input elements) for stage(pad=True).
  void set_padding(py::handle pad_values, py::handle costs) {
    std::vector<std::vector<uint8_t>> pads = default_pads();
    if (!pad_values.is_none()) {
      Items items(pad_values, "pad_values");
      if (items.size() != pads.size()) {
        throw_input(std::to_string(items.size()) + " pad values for " +
                    std::to_string(pads.size()) + " inputs");
      }
      for (size_t i = 0; i < pads.size(); ++i) {
        if (items[i] == Py_None) continue;
        if (!PyBytes_Check(items[i]) ||
            static_cast<size_t>(PyBytes_GET_SIZE(items[i])) != itemsizes_[i]) {
          throw_input("pad value of input '" + names_[i] + "' must be " +
                      std::to_string(itemsizes_[i]) + " bytes (one " +
                      py::str(dtypes_[i]).cast<std::string>() + "), got " +
                      py::repr(items[i]).cast<std::string>());
        }
        const auto* data = reinterpret_cast<const uint8_t*>(PyBytes_AS_STRING(items[i]));
        pads[i].assign(data, data + itemsizes_[i]);
      }
    }
    std::vector<double> cost = element_costs();
    if (!costs.is_none()) {
      Items items(costs, "costs");
      if (items.size() != cost.size()) {
        throw_input(std::to_string(items.size()) + " gear costs for " +
                    std::to_string(cost.size()) + " gears");
      }
      for (size_t g = 0; g < cost.size(); ++g) {
        cost[g] = PyFloat_AsDouble(items[g]);
        if (cost[g] == -1.0 && PyErr_Occurred()) {
          PyErr_Clear();
          throw_input("costs item " + std::to_string(g) + " is " + type_name(items[g]) +
                      ", not a number");
        }
      }
    }
    cover_ = Coverer(table_, cost);  // validates the costs before anything changes
    pads_ = std::move(pads);
  }

  // The cheapest gear covering `values` (the exact gear when there is one); 145013 otherwise.
  int64_t cover(py::handle values) const {
    int64_t buf[kMaxValues];
    const size_t n = table_.values_per_gear();
    read_values(values, "dynamic dims", n, buf);
    return cover_or_throw(buf);
  }

  size_t gear_count() const { return table_.gear_count(); }
  size_t values_per_gear() const { return table_.values_per_gear(); }
  const Layout& layout() const { return stager_->layout(); }

  int64_t match(py::handle values) const {
    int64_t buf[kMaxValues];
    const size_t n = table_.values_per_gear();
    read_values(values, "dynamic dims", n, buf);
    return find_or_throw(buf);
  }

  py::tuple values_from_full_dims(py::handle full_dims) const {
    const std::vector<int64_t> dims = to_int_vector(full_dims, "full dims");
    int64_t buf[kMaxValues];
    dims_.from_full_dims(dims.data(), dims.size(), buf);
    return to_tuple(buf, table_.values_per_gear());
  }

  py::tuple extract(py::handle arrays) const {
    Items items(arrays, "input arrays");
    std::vector<ShapeRef> shapes(items.size());
    read_shapes(items, shapes.data());
    int64_t buf[kMaxValues];
    dims_.extract(shapes.data(), shapes.size(), buf);
    return to_tuple(buf, table_.values_per_gear());
  }

  int64_t stage(py::handle arrays, py::handle preset, bool pad) {
    BusyGuard busy(busy_);
    // Clears the references taken below whatever happens (with the GIL held: it is, here).
    struct Release {
      std::vector<py::object>& keep;
      ~Release() {
        for (py::object& o : keep) o = py::object();
      }
    } release{keep_};
    Items items(arrays, "input arrays");
    read_shapes(items, shapes_.data());  // count, type and shape pointers
    const size_t n = dims_.input_count();
    const size_t width = table_.values_per_gear();
    int64_t values[kMaxValues];
    dims_.extract(shapes_.data(), n, values);
    int64_t chosen = -1;
    if (!preset.is_none()) chosen = preset_gear(preset, values, pad);
    if (chosen < 0) chosen = pad ? cover_or_throw(values) : find_or_throw(values);
    const size_t gear = static_cast<size_t>(chosen);
    const int64_t* gear_values = table_.gear(gear);
    const bool padded = std::memcmp(gear_values, values, width * sizeof(int64_t)) != 0;
    for (size_t i = 0; i < n; ++i) {
      sources_[i] = source_of(i, items[i]);
      if (padded) pad_source(gear, i, sources_[i]);
    }
    stager_->check(gear, sources_.data(), n, gear_values, width, names_.data());
    {
      py::gil_scoped_release no_gil;  // only memcpy/memset in here: no Python object
      stager_->copy(gear, sources_.data(), n, gear_values, width);
    }
    last_values_.assign(gear_values, gear_values + width);
    last_request_.assign(values, values + width);
    return static_cast<int64_t>(gear);
  }

  py::tuple last_values() const { return to_tuple(last_values_.data(), last_values_.size()); }
  py::tuple last_request() const {
    return to_tuple(last_request_.data(), last_request_.size());
  }

  py::list nearest(py::handle values, py::handle k) const {
    int64_t buf[kMaxValues];
    const size_t n = table_.values_per_gear();
    read_values(values, "dynamic dims", n, buf);
    const int64_t count = to_int64(k.ptr(), "k");
    if (count < 0) throw_input("k must be >= 0, got " + std::to_string(count));
    py::list out;
    for (size_t g : table_.nearest(buf, n, static_cast<size_t>(count))) {
      out.append(to_tuple(table_.gear(g), n));
    }
    return out;
  }

 private:
  static DimsExtractor make_dims(py::handle names, py::handle shapes, py::handle positions) {
    std::vector<std::string> n = to_names(names);
    std::vector<std::vector<int64_t>> s = to_int_matrix(shapes, "input_shapes");
    std::vector<DynamicPosition> p = to_positions(positions);
    return DimsExtractor(std::move(n), std::move(s), p);
  }

  void init_dtypes(py::handle input_dtypes) {
    Items items(input_dtypes, "input_dtypes");
    const size_t n = dims_.input_count();
    if (items.size() != n) {
      throw_input(std::to_string(items.size()) + " input dtypes for " + std::to_string(n) +
                  " inputs");
    }
    py::object dtype_type = py::module_::import("numpy").attr("dtype");
    for (size_t i = 0; i < n; ++i) {
      names_.push_back(dims_.name(i));
      py::object dt;
      try {
        dt = dtype_type(py::handle(items[i]));
      } catch (py::error_already_set&) {
        throw_input("input_dtypes item " + std::to_string(i) + " is not a numpy dtype: " +
                    py::repr(items[i]).cast<std::string>());
      }
      if (dt.attr("hasobject").cast<bool>()) {
        throw_input("input '" + names_[i] + "' dtype " + py::str(dt).cast<std::string>() +
                    " holds Python objects, which cannot be staged as bytes");
      }
      itemsizes_.push_back(dt.attr("itemsize").cast<size_t>());
      dtypes_.push_back(std::move(dt));
    }
  }

  void init_staging(py::handle layout_obj, py::handle staging) {
    if (!py::isinstance<Layout>(layout_obj)) {
      throw_input("layout must be a Layout from plan_layout, got " + type_name(layout_obj));
    }
    const Layout* planned = value_of<Layout>(layout_obj);
    if (planned == nullptr) {
      throw_input("layout must be a Layout from plan_layout, got one whose __init__ was not "
                  "called");
    }
    const Layout& layout = *planned;
    const size_t n = dims_.input_count();
    const size_t width = table_.values_per_gear();
    if (layout.gear_count() != table_.gear_count()) {
      throw_input("layout has " + std::to_string(layout.gear_count()) + " gears, the model has " +
                  std::to_string(table_.gear_count()));
    }
    if (layout.input_count() != n) {
      throw_input("layout has " + std::to_string(layout.input_count()) + " inputs, the model has " +
                  std::to_string(n));
    }
    if (layout.dims_nbytes() != 4 * width) {
      throw_input("layout dims buffer has " + std::to_string(layout.dims_nbytes()) +
                  " bytes, the model's gears have " + std::to_string(width) + " values (" +
                  std::to_string(4 * width) + " bytes as int32)");
    }
    for (size_t g = 0; g < table_.gear_count(); ++g) {
      for (size_t i = 0; i < n; ++i) {
        const std::vector<int64_t> shape = dims_.gear_shape(i, table_.gear(g));
        unsigned __int128 need = itemsizes_[i];
        for (int64_t d : shape) need *= static_cast<uint64_t>(d);
        if (need > layout.nbytes_unchecked(g, i)) {
          throw_input("layout slot of input '" + names_[i] + "' in gear " + std::to_string(g) +
                      " has " + std::to_string(layout.nbytes_unchecked(g, i)) +
                      " bytes, its shape " + format_tuple(shape) + " of " +
                      py::str(dtypes_[i]).cast<std::string>() + " needs " +
                      bytes_text(need));
        }
      }
    }
    if (!npy().PyArray_Check_(staging.ptr())) {
      throw_input("staging must be a numpy.ndarray, got " + type_name(staging));
    }
    py::array arr = py::reinterpret_borrow<py::array>(staging);
    if (!arr.dtype().is(py::dtype::of<uint8_t>()) &&
        !npy().PyArray_EquivTypes_(arr.dtype().ptr(), py::dtype::of<uint8_t>().ptr())) {
      throw_input("staging must have dtype uint8, got " + py::str(arr.dtype()).cast<std::string>());
    }
    const int flags = py::detail::array_proxy(arr.ptr())->flags;
    if (!(flags & py::detail::npy_api::NPY_ARRAY_C_CONTIGUOUS_) ||
        !(flags & py::detail::npy_api::NPY_ARRAY_WRITEABLE_)) {
      throw_input("staging must be C-contiguous and writable");
    }
    stager_ = std::make_unique<Stager>(layout, static_cast<uint8_t*>(arr.mutable_data()),
                                       static_cast<size_t>(arr.nbytes()));
    staging_ = std::move(arr);  // kept alive as long as the core
  }

  static std::string bytes_text(unsigned __int128 v) {
    if (v == 0) return "0";
    std::string s;
    while (v > 0) {
      s.insert(s.begin(), static_cast<char>('0' + static_cast<int>(v % 10)));
      v /= 10;
    }
    return s;
  }

  // Count, ndarray type and shape of every input, in input order, before any dim check.
  void read_shapes(const Items& items, ShapeRef* shapes) const {
    dims_.check_count(items.size());  // before writing n entries into shapes
    for (size_t i = 0; i < items.size(); ++i) {
      PyObject* a = items[i];
      if (!npy().PyArray_Check_(a)) {
        throw_input("input '" + dims_.name(i) + "' must be a numpy.ndarray, got " + type_name(a));
      }
      const py::detail::PyArray_Proxy* p = py::detail::array_proxy(a);
      shapes[i] = {reinterpret_cast<const int64_t*>(p->dimensions), static_cast<size_t>(p->nd)};
    }
  }

  // The gear the set dims name when they differ from the inputs' values: with pad, a gear
  // that covers the values; otherwise (or when it does not cover them) 145012. -1 when the
  // set dims equal the values (the normal lookup follows).
  int64_t preset_gear(py::handle preset, const int64_t* values, bool pad) const {
    const size_t width = table_.values_per_gear();
    int64_t set[kMaxValues];
    read_values(preset, "preset dims", width, set);
    if (std::memcmp(set, values, width * sizeof(int64_t)) == 0) return -1;
    const int64_t gear = pad ? table_.find(set, width) : -1;
    bool covers = gear >= 0;
    for (size_t v = 0; covers && v < width; ++v) covers = set[v] >= values[v];
    if (!covers) {
      throw_length("the inputs' dynamic dims " + format_tuple(values, width) +
                   " disagree with the dims set with set_dynamic_* " + format_tuple(set, width));
    }
    return gear;
  }

  int64_t cover_or_throw(const int64_t* values) const {
    const size_t n = table_.values_per_gear();
    int64_t gear = table_.find(values, n);  // an exact hit is always itself
    if (gear < 0) gear = cover_.find(values, n);
    if (gear < 0) {
      throw_mismatch("dynamic dims " + format_tuple(values, n) + " fit in no gear of the model " +
                     "(inputs: " + dims_.dynamic_axes_text() + "): padding needs a gear at " +
                     "least as large in every value; the largest gear is " +
                     format_tuple(table_.gear(cover_.largest()), n) +
                     "; legal gears, nearest first: " + table_.legal_gears_text(values, n));
    }
    return gear;
  }

  // Point input i's source at its padded copy: the gear's shape and the input's pad value.
  void pad_source(size_t gear, size_t i, StageSource& src) const {
    const std::vector<int64_t>& slot = gear_shapes_[gear][i];
    const ShapeRef& have = shapes_[i];
    if (std::memcmp(slot.data(), have.dims, slot.size() * sizeof(int64_t)) == 0) return;
    src.shape = have.dims;
    src.slot_shape = slot.data();
    src.ndim = slot.size();
    src.itemsize = itemsizes_[i];
    src.pad = pads_[i].data();
  }

  void init_padding() {
    const size_t n = dims_.input_count();
    gear_shapes_.resize(table_.gear_count());
    for (size_t g = 0; g < table_.gear_count(); ++g) {
      for (size_t i = 0; i < n; ++i) gear_shapes_[g].push_back(dims_.gear_shape(i, table_.gear(g)));
    }
    pads_ = default_pads();
    cover_ = Coverer(table_, element_costs());
  }

  std::vector<std::vector<uint8_t>> default_pads() const {
    std::vector<std::vector<uint8_t>> pads;
    for (size_t size : itemsizes_) pads.emplace_back(size, 0);
    return pads;
  }

  // Each gear's total input elements: the cost of a gear when none is measured.
  std::vector<double> element_costs() const {
    std::vector<double> costs(table_.gear_count(), 0.0);
    for (size_t g = 0; g < costs.size(); ++g) {
      for (const std::vector<int64_t>& shape : gear_shapes_[g]) {
        double elements = 1.0;
        for (int64_t d : shape) elements *= static_cast<double>(d);
        costs[g] += elements;
      }
    }
    return costs;
  }

  int64_t find_or_throw(const int64_t* values) const {
    const size_t n = table_.values_per_gear();
    const int64_t gear = table_.find(values, n);
    if (gear < 0) throw_mismatch(table_.mismatch_message(values, n, dims_.dynamic_axes_text()));
    return gear;
  }

  // Input i's bytes: dtype must equal the model's; a non-C-contiguous array is copied first.
  // Takes a reference (keep_) so the buffer outlives the GIL-free copy.
  StageSource source_of(size_t i, PyObject* a) {
    const py::detail::PyArray_Proxy* p = py::detail::array_proxy(a);
    PyObject* expected = dtypes_[i].ptr();
    if (p->descr != expected && !npy().PyArray_EquivTypes_(p->descr, expected)) {
      throw_input("input '" + names_[i] + "' has dtype " +
                  py::str(py::handle(p->descr)).cast<std::string>() +
                  ", the model's input has " + py::str(dtypes_[i]).cast<std::string>());
    }
    if (p->flags & py::detail::npy_api::NPY_ARRAY_C_CONTIGUOUS_) {
      keep_[i] = py::reinterpret_borrow<py::object>(a);
    } else {
      py::array copy = py::array::ensure(a, py::array::c_style);
      if (!copy) throw_input("input '" + names_[i] + "' could not be made C-contiguous");
      keep_[i] = std::move(copy);
      p = py::detail::array_proxy(keep_[i].ptr());
    }
    size_t nbytes = itemsizes_[i];
    for (int d = 0; d < p->nd; ++d) nbytes *= static_cast<size_t>(p->dimensions[d]);
    return {p->data, nbytes};
  }

  DimsExtractor dims_;
  GearTable table_;
  std::vector<std::string> names_;
  std::vector<py::object> dtypes_;  // numpy.dtype per input
  std::vector<size_t> itemsizes_;
  std::unique_ptr<Stager> stager_;
  py::array staging_;
  std::vector<int64_t> last_values_;
  std::vector<int64_t> last_request_;
  std::vector<std::vector<std::vector<int64_t>>> gear_shapes_;  // [gear][input] shape
  std::vector<std::vector<uint8_t>> pads_;                      // [input] pad value bytes
  Coverer cover_;
  std::atomic<bool> busy_{false};
  // Scratch of stage(), guarded by busy_ so that no call allocates.
  std::vector<ShapeRef> shapes_;
  std::vector<StageSource> sources_;
  std::vector<py::object> keep_;
};

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

// The ONE translator for everything bound through pybind11.
void translate(std::exception_ptr p) {
  try {
    if (p) std::rethrow_exception(p);
  } catch (const Error& e) {
    set_python_error(e);
  }
}

// ---- vectorcall fast path ------------------------------------------------------------------------
// match / extract / stage are called once per request. pybind11's generic dispatcher costs
// more than the work of a match, so these three are plain METH_FASTCALL methods added to the
// pybind11 class; errors go through set_python_error, like the translator above.

template <typename F>
PyObject* guarded(F&& body) noexcept {
  try {
    return body();
  } catch (py::error_already_set& e) {
    e.restore();
  } catch (const Error& e) {
    set_python_error(e);
  } catch (py::builtin_exception& e) {
    e.set_error();
  } catch (const std::bad_alloc&) {
    PyErr_NoMemory();
  } catch (const std::exception& e) {
    PyErr_SetString(PyExc_RuntimeError, e.what());
  }
  return nullptr;
}

// Positional-or-keyword arguments `names` (the first `required` of them required) into out;
// false with a TypeError set on a call that does not fit, as Python does.
bool parse_args(const char* fname, PyObject* const* args, Py_ssize_t nargs, PyObject* kwnames,
                const std::initializer_list<const char*>& names, size_t required,
                PyObject** out) {
  const size_t n = names.size();
  if (static_cast<size_t>(nargs) > n) {
    PyErr_Format(PyExc_TypeError, "%s() takes at most %zu arguments (%zd given)", fname, n,
                 nargs);
    return false;
  }
  for (size_t j = 0; j < n; ++j) out[j] = j < static_cast<size_t>(nargs) ? args[j] : nullptr;
  const Py_ssize_t nk = kwnames ? PyTuple_GET_SIZE(kwnames) : 0;
  for (Py_ssize_t k = 0; k < nk; ++k) {
    PyObject* key = PyTuple_GET_ITEM(kwnames, k);
    size_t j = 0;
    for (const char* name : names) {
      if (PyUnicode_CompareWithASCIIString(key, name) == 0) break;
      ++j;
    }
    if (j == n) {
      PyErr_Format(PyExc_TypeError, "%s() got an unexpected keyword argument '%U'", fname, key);
      return false;
    }
    if (out[j] != nullptr) {
      PyErr_Format(PyExc_TypeError, "%s() got multiple values for argument '%U'", fname, key);
      return false;
    }
    out[j] = args[nargs + k];
  }
  for (size_t j = 0; j < required; ++j) {
    if (out[j] == nullptr) {
      PyErr_Format(PyExc_TypeError, "%s() missing required argument '%s'", fname,
                   names.begin()[j]);
      return false;
    }
  }
  return true;
}

ExecutorCore& core_of(PyObject* self) { return self_of<ExecutorCore>(self); }

PyObject* fast_match(PyObject* self, PyObject* const* args, Py_ssize_t nargs,
                     PyObject* kwnames) {
  PyObject* a[1];
  if (!parse_args("match", args, nargs, kwnames, {"values"}, 1, a)) return nullptr;
  return guarded([&] { return PyLong_FromLongLong(core_of(self).match(a[0])); });
}

PyObject* fast_extract(PyObject* self, PyObject* const* args, Py_ssize_t nargs,
                       PyObject* kwnames) {
  PyObject* a[1];
  if (!parse_args("extract", args, nargs, kwnames, {"arrays"}, 1, a)) return nullptr;
  return guarded([&] { return core_of(self).extract(a[0]).release().ptr(); });
}

PyObject* fast_stage(PyObject* self, PyObject* const* args, Py_ssize_t nargs,
                     PyObject* kwnames) {
  PyObject* a[3];
  if (!parse_args("stage", args, nargs, kwnames, {"arrays", "preset", "pad"}, 1, a)) {
    return nullptr;
  }
  return guarded([&] {
    bool pad = false;
    if (a[2] != nullptr) {
      const int truth = PyObject_IsTrue(a[2]);
      if (truth < 0) throw py::error_already_set();
      pad = truth == 1;
    }
    return PyLong_FromLongLong(core_of(self).stage(a[0], a[1] ? a[1] : Py_None, pad));
  });
}

PyMethodDef kFastMethods[] = {
    {"match", reinterpret_cast<PyCFunction>(reinterpret_cast<void (*)(void)>(fast_match)),
     METH_FASTCALL | METH_KEYWORDS,
     "match($self, /, values)\n--\n\nIndex of the gear with exactly these dynamic values."},
    {"extract", reinterpret_cast<PyCFunction>(reinterpret_cast<void (*)(void)>(fast_extract)),
     METH_FASTCALL | METH_KEYWORDS,
     "extract($self, /, arrays)\n--\n\nGear values from the arrays' shapes (not matched)."},
    {"stage", reinterpret_cast<PyCFunction>(reinterpret_cast<void (*)(void)>(fast_stage)),
     METH_FASTCALL | METH_KEYWORDS,
     "stage($self, /, arrays, preset=None, pad=False)\n--\n\nExtract, match (or, with pad, "
     "cover), check and copy the inputs into the staging buffer; returns the gear index."},
};

void add_fast_methods(py::handle cls) {
  for (PyMethodDef& def : kFastMethods) {
    PyObject* descr = PyDescr_NewMethod(reinterpret_cast<PyTypeObject*>(cls.ptr()), &def);
    if (descr == nullptr) throw py::error_already_set();
    if (PyObject_SetAttrString(cls.ptr(), def.ml_name, descr) != 0) {
      Py_DECREF(descr);
      throw py::error_already_set();
    }
    Py_DECREF(descr);
  }
}

}  // namespace
}  // namespace gear_runtime

PYBIND11_MODULE(_core, m) {
  using namespace gear_runtime;
  m.doc() = "C++ hot path of gear_runtime (see gear_runtime.core for the documented API).";
  py::register_exception_translator(&translate);

  m.attr("DEFAULT_FUSION_SIZE") = kDefaultFusionSize;
  m.attr("MAX_FUSION_SIZE") = kMaxFusionSize;
  m.attr("DEFAULT_ALIGNMENT") = kDefaultAlignment;

  // Methods take `self` as a handle and go through self_of<> (see there).
  using H = py::handle;
  auto gear = [](const Layout& l, H g) {
    return index_arg(g, "gear index", l.gear_count(), "gears");
  };
  auto input = [](const Layout& l, H i) {
    return index_arg(i, "input index", l.input_count(), "inputs");
  };
  py::class_<Layout>(m, "Layout", "Staging layout of every gear; built by plan_layout().")
      .def_property_readonly("gear_count", [](H s) { return self_of<Layout>(s).gear_count(); })
      .def_property_readonly("input_count", [](H s) { return self_of<Layout>(s).input_count(); })
      .def_property_readonly("merged", [](H s) { return self_of<Layout>(s).merged(); })
      .def_property_readonly("dims_nbytes", [](H s) { return self_of<Layout>(s).dims_nbytes(); })
      .def_property_readonly("total_bytes", [](H s) { return self_of<Layout>(s).total_bytes(); })
      .def_property_readonly("alignment", [](H s) { return self_of<Layout>(s).alignment(); })
      .def_property_readonly("tail_padding",
                             [](H s) { return self_of<Layout>(s).tail_padding(); })
      .def("offset",
           [=](H s, H g, H i) {
             const Layout& l = self_of<Layout>(s);
             return l.offset_unchecked(gear(l, g), input(l, i));
           })
      .def("nbytes",
           [=](H s, H g, H i) {
             const Layout& l = self_of<Layout>(s);
             return l.nbytes_unchecked(gear(l, g), input(l, i));
           })
      .def("fused",
           [=](H s, H i) {
             const Layout& l = self_of<Layout>(s);
             return l.fused(input(l, i));
           })
      .def("dims_offset",
           [=](H s, H g) {
             const Layout& l = self_of<Layout>(s);
             return l.dims_offset(gear(l, g));
           })
      .def("merged_span",
           [=](H s, H g) {
             const Layout& l = self_of<Layout>(s);
             return span_tuple(l.merged_span(gear(l, g)));
           })
      .def("separate",
           [=](H s, H g) {
             const Layout& l = self_of<Layout>(s);
             py::list out;
             for (const Span& span : l.separate(gear(l, g))) out.append(span_tuple(span));
             return out;
           })
      .def("__repr__", [](H s) { return self_of<Layout>(s).repr(); });

  m.def("plan_layout", &plan_layout, py::arg("input_nbytes"), py::arg("dims_count"),
        py::arg("fusion_size") = kDefaultFusionSize, py::arg("alignment") = kDefaultAlignment,
        py::arg("tail_padding") = 0,
        "Plan the staging layout of every gear (see gear_runtime.core.reference.plan_layout).");

  py::class_<ExecutorCore> core_cls(m, "ExecutorCore",
                                    "Gear matching and input staging for one executor.");
  core_cls
      .def(py::init<py::handle, py::handle, py::handle, py::handle, py::handle, py::handle,
                    py::handle>(),
           py::arg("input_names"), py::arg("input_shapes"), py::arg("dynamic_positions"),
           py::arg("gears"), py::arg("input_dtypes"), py::arg("layout"), py::arg("staging"))
      .def_property_readonly("gear_count", [](H s) { return core_of(s.ptr()).gear_count(); })
      .def_property_readonly("values_per_gear",
                             [](H s) { return core_of(s.ptr()).values_per_gear(); })
      .def_property_readonly("layout", [](H s) { return py::cast(core_of(s.ptr()).layout()); })
      .def_property_readonly("last_values", [](H s) { return core_of(s.ptr()).last_values(); })
      .def_property_readonly("last_request",
                             [](H s) { return core_of(s.ptr()).last_request(); })
      .def(
          "set_padding",
          [](H s, H pad_values, H costs) { core_of(s.ptr()).set_padding(pad_values, costs); },
          py::arg("pad_values") = py::none(), py::arg("costs") = py::none())
      .def(
          "cover", [](H s, H values) { return core_of(s.ptr()).cover(values); },
          py::arg("values"))
      .def(
          "values_from_full_dims",
          [](H s, H full_dims) { return core_of(s.ptr()).values_from_full_dims(full_dims); },
          py::arg("full_dims"))
      .def(
          "nearest", [](H s, H values, H k) { return core_of(s.ptr()).nearest(values, k); },
          py::arg("values"), py::arg("k") = 5);
  add_fast_methods(core_cls);  // match, extract, stage
}
