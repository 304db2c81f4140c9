// The hand-written CPython half of gear_runtime._core: ExecutorCore's Python side
// (PyExecutorCoreImpl) and its method execute, the one call of every Executor.execute().
//
// Why not pybind11 here: execute() is a plain METH_FASTCALL method (execute_fastcall in
// fast_path.cc, added to the class by add_execute) because pybind11's argument dispatch costs
// a tenth of the whole per-call budget (it builds its argument vectors on the heap), and the
// plain requests it takes (a dict of the input names, or a list / tuple in input order, of
// numpy arrays) are read with CPython's and numpy's public C APIs (numpy_api.h) rather than
// pybind11's wrappers. Everything else about the class (its constructor, stage, set_padding,
// set_runs, the properties) is bound declaratively in bindings.cc.
//
// One exception to "bindings only convert": execute() also makes the session's direct run
// after staging (a Python call handed over by the backend, BackendSession.direct_runs), so
// that the common execute() is one call from Python.
#pragma once

#include <pybind11/numpy.h>
#include <pybind11/pybind11.h>

#include <cstddef>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "dispatch.h"
#include "executor_core.h"
#include "layout.h"
#include "py_convert.h"

namespace gear_runtime {

using BoundLayout = Bound<Layout>;
using BoundDispatch = Bound<GearDispatch>;

// ExecutorCore with the Python objects it works with: the model's dtypes (what arrays are
// compared with) and the staging array (alive as long as the core).
class PyExecutorCoreImpl {
 public:
  // The inputs (names, shapes) are the dispatch's: the model's one GearDispatch, shared.
  PyExecutorCoreImpl(std::shared_ptr<const GearDispatch> dispatch,
                     const std::vector<py::object>& input_dtypes, const BoundLayout& layout,
                     const py::array& staging);

  ExecutorCore& core() { return core_; }

  void set_padding(const std::optional<std::vector<std::optional<py::bytes>>>& pad_values);

  size_t stage(const py::sequence& arrays, const std::optional<Ints>& preset, bool pad);

  // stage() on execute()'s own `inputs`, for the call a service makes: a dict holding exactly
  // the model's input names, or a list / tuple in input order, of numpy arrays (not
  // subclasses). Returns the gear; -1 for anything else (a nested list, an ndarray subclass,
  // a missing or unknown name, another container, another count) without touching the
  // staging buffer: the caller then applies the Python rules (gear_runtime.runtime.inputs)
  // and calls stage(). What goes wrong with the arrays themselves (dtype, layout, shapes) is
  // stage()'s business: it gets them as a list. `preset`: None or the set dims (a tuple).
  // `placed`: where given, set to a dict staged index -> array of the inputs bound in place
  // (the very objects checked, referenced from the read on), left alone when there are none.
  int64_t stage_request(py::handle inputs, py::handle preset, bool pad,
                        py::object* placed = nullptr);

  // A copy this large runs with the GIL released (other threads run meanwhile); a smaller
  // one keeps it: releasing and taking the GIL back costs more than copying a few KiB, and
  // when another thread holds it by then, the wait is up to its switch interval (5 ms).
  static constexpr size_t kReleaseGilBytes = 256 * 1024;

  // `in_place`: the views are the caller's own arrays (not temporary copies), so large ones
  // may be bound in place (ExecutorCore::set_in_place_bytes).
  size_t stage_views(const ArrayView* views, size_t n, const Values* preset, bool pad,
                     bool in_place = false);

  // `preset` as values: nullptr for None; a tuple of ints read onto `buf` (the hot case),
  // anything else converted as stage()'s argument is (into `spill`; a TypeError if it is
  // no sequence of ints).
  static const Values* read_preset(py::handle preset, int64_t* buf, Ints& spill, Values& out);

  // The backend's runs that execute() makes itself, right after staging: per gear None (the
  // executor runs that gear through its session) or (call, args, outputs, copyable):
  // call(*args) runs the gear and leaves its outputs in `outputs`, the same C-contiguous
  // arrays every run; `copyable`: whether execute(copy=True) may hand out copies of them
  // (False: the session has a better way, e.g. pooled memory for large outputs). None: no
  // direct runs. The entries are checked here, once.
  void set_runs(const py::handle& runs);

  // The backend's output buffers (a list of C-contiguous numpy arrays, referenced from now
  // on): an input sharing memory with one is always copied, never bound in place
  // (ExecutorCore::set_written).
  void set_written(const py::handle& buffers);

  // What Executor.execute asks first: stage_request(inputs, preset, pad), then the staged
  // gear's direct run. Returns None when the inputs need the Python rules (nothing staged);
  // (gear, None) when staged but the gear has no direct run for this `copy`; (gear, placed)
  // when inputs were bound in place: placed is a dict staged index -> the caller's array that
  // was checked (not read from the request again: another thread may have changed it since),
  // and the executor runs the gear through its session with them; else (gear, outputs): a
  // new list of the run's arrays, or with `copy` of fresh copies the caller keeps. An exception of the run itself comes out as DirectRunFailed(gear),
  // caused by it.
  py::object execute(py::handle inputs, py::handle preset, bool pad, bool copy);

 private:
  struct DirectRun {
    py::object call;
    py::tuple args;
    std::vector<py::array> outputs;
    std::vector<size_t> nbytes;  // of each output
    bool copyable = false;
  };

  static std::vector<py::dtype> to_dtypes(const std::vector<py::object>& given, size_t n);
  // The dispatch's input names (none without a dispatch: the core refuses that).
  static std::vector<std::string> names_of(const std::shared_ptr<const GearDispatch>& d);
  static std::vector<InputSpec> input_specs(const std::shared_ptr<const GearDispatch>& d,
                                            const std::vector<py::dtype>& dtypes);
  static py::array checked_staging(const py::array& staging);
  static std::vector<py::str> interned(const std::vector<std::string>& names);
  static std::optional<DirectRun> direct_run(const py::handle& entry);
  // The run raised (the Python error is set): an Exception is raised again as
  // gear_runtime.errors.DirectRunFailed(gear) caused by it, for the executor to turn into
  // the backend's error; anything else (KeyboardInterrupt, SystemExit) as it is.
  [[noreturn]] static void raise_run_failed(int64_t gear);
  // A new C-contiguous array of `a`'s dtype and shape holding its `nbytes` bytes.
  static py::object fresh_copy(const py::array& a, size_t nbytes);

  std::vector<py::dtype> dtypes_;
  std::vector<py::str> py_names_;  // the input names as dict keys (interned: hashed once)
  std::vector<std::optional<DirectRun>> runs_;
  std::vector<py::array> written_;  // set_written's arrays: core_'s ranges point into them
  bool in_run_ = false;  // a direct run is in progress (its entry must stay where it is)
  py::array staging_;
  ExecutorCore core_;
};

using PyExecutorCore = Bound<PyExecutorCoreImpl>;

// Adds ExecutorCore.execute (execute_fastcall: positional arguments only, (inputs, preset,
// pad: bool, copy: bool); errors mapped as the translator maps them) to the bound class `cls`.
void add_execute(const py::handle& cls);

// Loads numpy's C API (numpy_api.cc: import_array()) for the fast path: once, at module init,
// before any ExecutorCore exists. Its failure is the ImportError of `import gear_runtime._core`
// (a py::error_already_set, numpy's own reason as the cause).
void import_numpy();

}  // namespace gear_runtime
