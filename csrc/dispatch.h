// GearDispatch: the single source of truth for "which gear" of one model, in plain C++.
//
// Built once from the model's gear configuration -- the inputs' shapes (-1 on dynamic axes),
// GearSpec's dynamic positions, the gears, and a cost per gear (measured latencies, or each
// gear's total input elements) -- with every check made up front, it answers, in O(1) and
// without allocating on the hot path:
//   * which gear the request's dims ARE (exact match: GearTable, a hash table), and
//   * which gear COVERS them most cheaply (padding: Coverer, a precomputed key table),
// plus the queries around them (GetCurDynamicDims from shapes, aclmdlSetInputDynamicDims'
// full dims, the nearest gears for messages, any request's input elements). vLLM's
// CudagraphDispatcher is the model: precomputed keys, configuration checked at
// construction, dispatch a lookup. It is immutable once built, so one instance per model is
// shared by reference by every executor's core (and by the Python GearDispatcher): other
// costs (a measured profile) make a new one.
#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "cover.h"
#include "dims.h"
#include "gear_table.h"

namespace gear_runtime {

// GE allows at most ACL_MAX_DIM_CNT = 128 dynamic values (DimsExtractor enforces it), so the
// hot path keeps values on the stack.
inline constexpr size_t kMaxValues = 128;

// A read-only run of int64 values (dynamic dims, full dims, a preset).
struct Values {
  const int64_t* data = nullptr;
  size_t size = 0;
};

// One array of a request, as the caller found it.
struct ArrayView {
  // Not an array at all: `type` names what it is, nothing else is read.
  bool is_array = true;
  std::string_view type;
  // An array: C-contiguous bytes and its shape.
  const void* data = nullptr;
  const int64_t* shape = nullptr;
  size_t ndim = 0;
  // Whether its dtype is the model's; when not, `type` is the array's dtype name.
  bool dtype_ok = true;
};

class GearDispatch {
 public:
  // `positions` rows are (input, axis, value index), each >= 0 (else Error kind "input");
  // then DimsExtractor's and GearTable's checks (kind "spec"); `costs`: one per gear, finite
  // and >= 0 (kind "input"); nullopt: each gear's total input elements.
  GearDispatch(std::vector<std::string> names, std::vector<std::vector<int64_t>> shapes,
               const std::vector<std::vector<int64_t>>& positions,
               const std::vector<std::vector<int64_t>>& gears,
               const std::optional<std::vector<double>>& costs = std::nullopt);

  size_t gear_count() const noexcept { return table_.gear_count(); }
  size_t values_per_gear() const noexcept { return table_.values_per_gear(); }
  size_t input_count() const noexcept { return dims_.input_count(); }
  const DimsExtractor& dims() const noexcept { return dims_; }
  const GearTable& table() const noexcept { return table_; }
  const std::vector<double>& costs() const noexcept { return costs_; }
  // Input i's full shape in gear g (both in range: internal use).
  const std::vector<int64_t>& gear_shape(size_t g, size_t i) const { return shapes_[g][i]; }
  // Gear g's values (kind "input" unless g < gear_count()).
  std::vector<int64_t> gear(size_t g) const;

  // The gear equal to `values`: 145012 for a wrong count, 145013 naming the inputs' dynamic
  // axes and the legal gears, nearest first.
  size_t match(Values values) const;
  // The cheapest gear covering `values` (an exact gear is itself): 145012 / 145013.
  size_t cover(Values values) const;
  // Up to k gears by L1 distance to `values`, ties to the lower index (145012 on a wrong
  // count; k < 0: kind "input").
  std::vector<std::vector<int64_t>> nearest(Values values, int64_t k) const;
  // aclmdlSetInputDynamicDims' full dims (every input's shape flattened) -> gear values,
  // with GE's 145012 checks; not matched.
  std::vector<int64_t> values_from_full_dims(Values full_dims) const;
  // GetCurDynamicDims: the gear values from the arrays' shapes (count and array types:
  // kind "input"; ranks, static dims, agreement: 145012); not matched.
  std::vector<int64_t> extract(const ArrayView* arrays, size_t n) const;
  // Total input elements of the inputs shaped by `values` (any request's or gear's; 145012
  // on a wrong count): the cost of a gear when none is measured.
  double elements(Values values) const;

  // The hot path's forms: `values` holds values_per_gear() values, already read. find_cover
  // is the gear cover() names, or -1 (no allocation, no exception).
  size_t match_or_throw(const int64_t* values) const;
  // The 145013 message of `values` (values_per_gear() of them) that match no gear: the
  // inputs' dynamic axes, the gear cover() would pad them to (if any) and the legal gears.
  std::string mismatch_message(const int64_t* values) const;
  size_t cover_or_throw(const int64_t* values) const;
  int64_t find_cover(const int64_t* values) const noexcept;
  // Count (kind "input"), then every item an array (kind "input", naming the input); their
  // shapes into out, which holds n entries.
  void read_shapes(const ArrayView* arrays, size_t n, ShapeRef* out) const;
  // `values` into out: 145012 unless values.size == values_per_gear(); `what` names them.
  void read_values(Values values, const char* what, int64_t* out) const;

 private:
  double elements_of(const int64_t* values) const;
  // The costs (nullopt: elements) and the Coverer over them (kind "input" when refused).
  void init_costs(const std::optional<std::vector<double>>& costs);

  DimsExtractor dims_;
  GearTable table_;
  std::vector<std::vector<std::vector<int64_t>>> shapes_;  // [gear][input] full shape
  std::vector<double> costs_;
  Coverer cover_;
};

}  // namespace gear_runtime
