// The definition of numpy's C API table (gear_runtime_ARRAY_API) and the one import_array()
// that fills it (see numpy_api.h).
#define GEAR_RUNTIME_NUMPY_API_DEFINE
#include "numpy_api.h"

#include <pybind11/pybind11.h>

#include "fast_path.h"

namespace gear_runtime {

void import_numpy() {
  if (_import_array() >= 0) return;
  // numpy's reason (no numpy, or one whose C API is older than the headers built against)
  // becomes the cause of the ImportError that `import gear_runtime._core` shows.
  if (!PyErr_Occurred()) PyErr_SetString(PyExc_ImportError, "numpy's import_array() failed");
  py::error_already_set cause;
  py::raise_from(cause, PyExc_ImportError,
                 "gear_runtime._core could not load numpy's C API (numpy._core.multiarray)");
  throw py::error_already_set();
}

}  // namespace gear_runtime
