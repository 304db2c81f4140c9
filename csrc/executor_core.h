// ExecutorCore: one executor's hot path in plain C++ -- dims from the request, the gear (exact
// O(1) match, or the cheapest covering gear when padding), every check, then one copy of all
// inputs (padded where the gear is larger) and, where the layout has one, the int32 dims buffer.
//
// No Python here: requests come in as ArrayViews (pointers, shapes, a dtype verdict) and
// values as spans. The binding converts Python objects into these and releases the GIL around
// the copy (the `around` hook of stage()). Every check runs before any byte is written, in a
// fixed order (count, array types, ranks and static dims, preset, gear, dtypes, slot sizes),
// so the first failure reported is always the same one.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "dims.h"
#include "dispatch.h"
#include "layout.h"
#include "staging.h"

namespace gear_runtime {

// Pad values per input (itemsize bytes each; nullopt: zeros).
using PadValues = std::vector<std::optional<std::vector<uint8_t>>>;

// One model input.
struct InputSpec {
  std::string name;
  std::vector<int64_t> shape;  // -1 on dynamic axes
  size_t itemsize = 0;         // bytes of one element (> 0)
  std::string dtype;           // the dtype's name, for messages ("float32")
};

// The "input" errors of plan_layout's arguments (negative sizes, alignment, padding), then
// Layout::plan. `dims_count`, `alignment` and `tail_padding` as the caller gave them.
Layout plan_layout_checked(const std::vector<std::vector<int64_t>>& input_nbytes,
                           int64_t dims_count, int64_t fusion_size, int64_t alignment,
                           int64_t tail_padding);

// Which gear is the model's GearDispatch's answer (one instance, shared by reference by every
// executor's core: built once per model, never copied or rebuilt here); the core adds the
// request side: array views, the preset dims, pad values, and the staging copy.
class ExecutorCore {
 public:
  // `inputs` must be the dispatch's inputs (names and shapes, in order) and each needs an
  // itemsize > 0 (else Error kind "input"). The layout must have the model's gears and
  // inputs, slots large enough for every gear's shapes, and a dims buffer of 4 bytes per
  // value -- or none (dims_count 0), for a backend that never reads
  // ascend_mbatch_shape_data: then stage() writes no dims; [staging, staging + size) must
  // hold the layout (kind "input"). The core does not own the staging buffer; it shares the
  // dispatch (immutable, so any number of cores read it at once).
  ExecutorCore(std::vector<InputSpec> inputs, std::shared_ptr<const GearDispatch> dispatch,
               const Layout& layout, uint8_t* staging, size_t staging_size);

  size_t gear_count() const noexcept { return dispatch_->gear_count(); }
  size_t values_per_gear() const noexcept { return dispatch_->values_per_gear(); }
  size_t input_count() const noexcept { return inputs_.size(); }
  const InputSpec& input(size_t i) const { return inputs_.at(i); }
  const Layout& layout() const noexcept { return stager_.layout(); }
  // The dispatch this core asks "which gear" (the model's, shared).
  const std::shared_ptr<const GearDispatch>& dispatch() const noexcept { return dispatch_; }

  // Pad values per input (nullopt: all zeros) for stage(pad = true); which covering gear
  // is cheapest is the dispatch's (its costs). Nothing changes when anything is refused
  // (Error kind "input").
  void set_padding(const std::optional<PadValues>& pads);

  // Inputs of at least `bytes` bytes that a stage(in_place = true) does not pad, aligned to
  // their itemsize, are bound in place: checked as any input, but not copied (their slots keep what they held); the
  // backend reads the caller's arrays, which must stay alive and unchanged until its run
  // ends. 0 (the default): every input is copied. Only for a backend that can read inputs
  // where they are (ONNX Runtime on the CPU); the merged copy is the point everywhere else.
  void set_in_place_bytes(size_t bytes) noexcept { in_place_bytes_ = bytes; }
  size_t in_place_bytes() const noexcept { return in_place_bytes_; }
  // Memory the backend's runs write, as [start, start + bytes) ranges (its output buffers):
  // an input overlapping any of it is copied even where in_place_bytes() would leave it in
  // place. A copy=False output fed back as an input is the case: the run would write the
  // very bytes it reads. Empty by default.
  void set_written(std::vector<std::pair<uintptr_t, size_t>> ranges) {
    written_ = std::move(ranges);
  }
  // The inputs the last successful stage bound in place (indices, ascending; most often none).
  const std::vector<size_t>& last_in_place() const noexcept { return last_in_place_; }

  // The whole hot path: extract; a preset (the values set with set_dynamic_*) must equal
  // them (145012) unless `pad` and the preset is a gear that covers them; the gear (match,
  // or with `pad` cover); dtypes (kind "input"); every slot check of Stager::check. Then
  // around(bytes, copy): copy() moves every byte (padded inputs with their pad values, the
  // dims where the layout has a dims buffer) and must be called exactly once; `bytes` is how
  // many it writes (every slot of the gear, and the dims), so that the binding can release
  // the GIL around a large copy and keep it for a small one. Returns the gear; last_values /
  // last_request change only on success. Not thread-safe, like any plain C++ object: one
  // caller at a time (the Python Executor's ownership lock is the one guard). Each call
  // keeps its own scratch, so that even concurrent misuse through Python (where a large
  // copy() runs without the GIL) can only garble staged bytes, never overflow a slot.
  // `in_place`: the arrays are the caller's own and outlive the backend's run, so inputs of
  // in_place_bytes() or more may be bound in place (see set_in_place_bytes).
  template <typename Around>
  size_t stage(const ArrayView* arrays, size_t n, const Values* preset, bool pad,
               Around&& around, bool in_place = false);
  size_t stage(const ArrayView* arrays, size_t n, const Values* preset, bool pad,
               bool in_place = false) {
    return stage(arrays, n, preset, pad, [](size_t, auto&& copy) { copy(); }, in_place);
  }

  // The gear values of the last successful stage, and the request's own values (they differ
  // when it was padded); empty before any.
  const std::vector<int64_t>& last_values() const noexcept { return last_values_; }
  const std::vector<int64_t>& last_request() const noexcept { return last_request_; }

 private:
  // Per-call scratch of stage(): on the stack for up to kStackInputs inputs (no allocation
  // on the hot path), on the heap beyond.
  static constexpr size_t kStackInputs = 16;
  struct Scratch {
    explicit Scratch(size_t n);
    ShapeRef* shapes;
    StageSource* sources;
    ShapeRef shapes_small[kStackInputs];
    StageSource sources_small[kStackInputs];
    std::vector<ShapeRef> shapes_big;
    std::vector<StageSource> sources_big;
    // The request's shapes as a padded copy reads them, copied here while the GIL is held:
    // the copy runs without it, and another thread may rewrite an array's own dims then
    // (`x.shape = ...` on the array being staged).
    std::vector<int64_t> padded_shapes;
  };

  size_t prepare(const ArrayView* arrays, size_t n, const Values* preset, bool pad,
                 bool in_place, int64_t* values, Scratch& scratch) const;
  void copy_prepared(size_t gear, const StageSource* sources, size_t n) const noexcept;
  void finish(size_t gear, const int64_t* values, const StageSource* sources, size_t n);
  // The bytes copy_prepared writes for gear `gear`: its n slots (less those bound in place)
  // and the dims buffer.
  size_t copy_bytes(size_t gear, const StageSource* sources, size_t n) const noexcept {
    size_t bytes = staged_values() ? stager_.layout().dims_nbytes() : 0;
    for (size_t i = 0; i < n; ++i) {
      if (!sources[i].in_place) bytes += stager_.layout().nbytes_unchecked(gear, i);
    }
    return bytes;
  }

  int64_t preset_gear(const Values& preset, const int64_t* values, bool pad) const;
  void set_source(size_t gear, size_t i, const ArrayView& a, int64_t* padded_shape,
                  bool in_place, StageSource& src) const;
  // Whether [data, data + nbytes) overlaps memory the backend's runs write (set_written).
  bool overlaps_written(const void* data, size_t nbytes) const noexcept;
  void check_layout(const Layout& layout) const;
  std::vector<std::vector<uint8_t>> default_pads() const;
  // The values stage() writes as the int32 dims buffer: all of them, or none without one.
  size_t staged_values() const noexcept {
    return stager_.layout().dims_nbytes() ? dispatch_->values_per_gear() : 0;
  }

  // Declared first: it is checked against the constructor's inputs before they move.
  std::shared_ptr<const GearDispatch> dispatch_;  // never null
  std::vector<InputSpec> inputs_;
  std::vector<std::string> names_;  // inputs_[i].name, contiguous for Stager's messages
  Stager stager_;
  std::vector<std::vector<uint8_t>> pads_;  // [input] pad value bytes
  std::vector<int64_t> last_values_;
  std::vector<int64_t> last_request_;
  size_t in_place_bytes_ = 0;  // 0: off
  std::vector<std::pair<uintptr_t, size_t>> written_;  // see set_written
  std::vector<size_t> last_in_place_;
};

template <typename Around>
size_t ExecutorCore::stage(const ArrayView* arrays, size_t n, const Values* preset, bool pad,
                           Around&& around, bool in_place) {
  int64_t values[kMaxValues];
  Scratch scratch(n);
  const size_t gear = prepare(arrays, n, preset, pad, in_place, values, scratch);
  around(copy_bytes(gear, scratch.sources, n),
         [this, gear, &scratch, n] { copy_prepared(gear, scratch.sources, n); });
  finish(gear, values, scratch.sources, n);
  return gear;
}

}  // namespace gear_runtime
