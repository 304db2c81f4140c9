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
};

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
  void check(size_t gear, const StageSource* srcs, size_t n, const int64_t* values,
             size_t nvalues, const std::string* names) const;

  // Copies every source into its slot and writes values as int32 at the dims offset. Only
  // after a successful check() with the same arguments. No exceptions, no Python.
  void copy(size_t gear, const StageSource* srcs, size_t n, const int64_t* values,
            size_t nvalues) const noexcept;

  // check() then copy().
  void stage(size_t gear, const StageSource* srcs, size_t n, const int64_t* values,
             size_t nvalues, const std::string* names = nullptr) const;

 private:
  Layout layout_;
  uint8_t* base_;
  size_t size_;
};

}  // namespace gear_runtime
