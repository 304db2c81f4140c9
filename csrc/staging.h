// Stager: copies one gear's inputs and its dims into the host staging buffer as the Layout
// says (GE's CopyInputDataWithMergeH2D host-to-host step), so that the merged span can then be
// moved to the device in ONE copy.
//
// check() validates everything (and may throw); copy() only copies, never throws and touches
// no Python object, so the binding runs it with the GIL released.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

#include "layout.h"

namespace gear_runtime {

struct StageSource {
  const void* data;  // C-contiguous bytes of one input
  size_t nbytes;
  // Padding (all set together, or shape == nullptr for a plain copy): the source has `shape`
  // (ndim dims), its slot in the gear has `slot_shape` (each dim >= the source's), and
  // everything of the slot the source does not cover gets `pad` (itemsize bytes, repeated).
  const int64_t* shape = nullptr;
  const int64_t* slot_shape = nullptr;
  size_t ndim = 0;
  size_t itemsize = 0;
  const uint8_t* pad = nullptr;
  // Bound in place: the backend reads the caller's array itself (ExecutorCore's large
  // inputs on ONNX Runtime's CPU), so copy() leaves its slot as it is. Never padded.
  bool in_place = false;
};

// Fills [dst, dst + nbytes) with `pattern` (width bytes) repeated; nbytes a multiple of width.
void fill_pattern(uint8_t* dst, size_t nbytes, const uint8_t* pattern, size_t width) noexcept;

// Right padding in one pass: copies the C-contiguous array `src` of shape src_shape into the
// leading corner of the C-contiguous buffer `dst` of shape dst_shape (dst_shape[a] >=
// src_shape[a] on every axis) and fills every other element of dst with `pad` (itemsize
// bytes). Each byte of dst is written exactly once.
void pad_copy(uint8_t* dst, const int64_t* dst_shape, const uint8_t* src,
              const int64_t* src_shape, size_t ndim, size_t itemsize,
              const uint8_t* pad) noexcept;

class Stager {
 public:
  // The staging buffer [base, base + size) must hold layout.total_bytes() bytes (else
  // Error(kind "input")). The Stager keeps its own copy of the layout; it does not own base.
  Stager(Layout layout, uint8_t* base, size_t size);

  const Layout& layout() const noexcept { return layout_; }
  uint8_t* base() const noexcept { return base_; }
  size_t size() const noexcept { return size_; }

  // Throws Error(kind "input", 145000) unless: gear < gear_count; n == input_count; every
  // source fits its slot in this gear (a larger one is an error, never an overflow); a source
  // overlapping the staging buffer is exactly its own slot (then it is not copied: zero copy);
  // nvalues * 4 == dims_nbytes and every value fits int32. `names` (n of them) or nullptr.
  // A padded source (shape != nullptr) must not overlap the staging buffer at all, and its
  // padded size (slot_shape) must fit the slot.
  void check(size_t gear, const StageSource* srcs, size_t n, const int64_t* values,
             size_t nvalues, const std::string* names) const;

  // Copies every source into its slot (padded ones with pad_copy; in-place ones not at all)
  // and writes values as int32 at the dims offset. Only
  // after a successful check() with the same arguments. No exceptions, no Python.
  void copy(size_t gear, const StageSource* srcs, size_t n, const int64_t* values,
            size_t nvalues) const noexcept;

  // check() then copy().
  void stage(size_t gear, const StageSource* srcs, size_t n, const int64_t* values,
             size_t nvalues, const std::string* names = nullptr) const;

 private:
  void check_padded(const StageSource& s, size_t slot, size_t gear, uintptr_t lo, uintptr_t hi,
                    const std::string& name) const;

  Layout layout_;
  uint8_t* base_;
  size_t size_;
};

}  // namespace gear_runtime
