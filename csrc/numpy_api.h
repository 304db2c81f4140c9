// numpy's public C API (numpy/arrayobject.h), for the fast path of ExecutorCore.execute.
//
// The ONE place that includes numpy's header, so that every translation unit sees it under
// numpy's rules for an extension of several files: the API table is one symbol,
// gear_runtime_ARRAY_API (PY_ARRAY_UNIQUE_SYMBOL, hidden like the rest of the module), defined
// by numpy_api.cc, which alone defines GEAR_RUNTIME_NUMPY_API_DEFINE and calls import_array()
// (import_numpy(), once at module init); every other file gets NO_IMPORT_ARRAY and uses the
// table that call filled. Only the API of numpy 1.7 and later is visible
// (NPY_NO_DEPRECATED_API): the array struct's fields are read through PyArray_DATA / _DIMS /
// _NDIM / _FLAGS / _DESCR. Built against numpy >= 2 (pyproject.toml [build-system]), the
// module also runs on numpy 1.x: NPY_TARGET_VERSION asks for nothing newer than the C API of
// numpy 1.24, the oldest numpy the package supports ([project] dependencies), so a later
// numpy's headers (whose default target moves up over time) cannot raise that floor silently.
#pragma once

#ifdef NUMPY_CORE_INCLUDE_NUMPY_NDARRAYOBJECT_H_
#error "numpy's header was included before numpy_api.h: include it only through numpy_api.h"
#endif

#include <Python.h>  // numpy's header needs it first

#define NPY_NO_DEPRECATED_API NPY_1_7_API_VERSION
#define NPY_TARGET_VERSION NPY_1_24_API_VERSION
#define PY_ARRAY_UNIQUE_SYMBOL gear_runtime_ARRAY_API
#ifndef GEAR_RUNTIME_NUMPY_API_DEFINE
#define NO_IMPORT_ARRAY
#endif
#include <numpy/arrayobject.h>
