// GearTable: the model's gears and an O(1) exact lookup from dynamic values to gear index.
//
// GE matches with a linear scan (docs/ge-notes.md section 2); we build an open-addressing table
// once so a lookup costs one hash of the values and (almost always) one comparison, whether
// the model has 2 gears or 100. Nearest gears (for the error message) are computed only on
// the error path.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

namespace gear_runtime {

// Largest value a gear may hold: the dims buffer (ascend_mbatch_shape_data) is int32.
inline constexpr int64_t kMaxGearValue = 2147483647;
// How many gears an error message lists before "... and N more".
inline constexpr size_t kGearsShownInErrors = 8;

class GearTable {
 public:
  // `gears[g]` holds gear g's dynamic values in GE order; each must have `values_per_gear`
  // values in [0, kMaxGearValue]; gears must be distinct and at least one must exist.
  // Throws Error(kind "spec") with GE's code otherwise (E10035/E10037/E10038/E10039).
  GearTable(const std::vector<std::vector<int64_t>>& gears, size_t values_per_gear);

  size_t gear_count() const noexcept { return count_; }
  size_t values_per_gear() const noexcept { return width_; }
  // Gear g's values (values_per_gear() of them). g must be < gear_count() (unchecked:
  // internal use).
  const int64_t* gear(size_t g) const noexcept { return flat_.data() + g * width_; }
  std::vector<int64_t> gear_vector(size_t g) const;

  // Index of the gear equal to values[0..n), or -1 (also when n != values_per_gear()).
  // No allocation, no exception: this is the hot path.
  int64_t find(const int64_t* values, size_t n) const noexcept;

  // Up to k gear indices ordered by L1 distance to values[0..n) (n must equal
  // values_per_gear(), else std::invalid_argument), ties broken by the lower gear index.
  std::vector<size_t> nearest(const int64_t* values, size_t n, size_t k) const;

  // "(16,), (8,), (1,)" -- the nearest kGearsShownInErrors gears, then ", ... and N more".
  std::string legal_gears_text(const int64_t* values, size_t n) const;

  // The full 145013 message: "dynamic dims (17,) match no gear of the model (inputs: data
  // axis 0); legal gears, nearest first: (16,), (8,), (1,)". `axes_text` says which inputs'
  // axes carry the dynamic values (DimsExtractor::dynamic_axes_text()); `hint`, when not
  // empty, goes between them and the legal gears ("; " + hint).
  std::string mismatch_message(const int64_t* values, size_t n, const std::string& axes_text,
                               const std::string& hint = "") const;

 private:
  size_t slot_of(const int64_t* values) const noexcept;

  size_t count_ = 0;
  size_t width_ = 0;
  std::vector<int64_t> flat_;  // gear g at [g * width_, (g + 1) * width_)
  std::vector<int32_t> slots_;  // open addressing, linear probing, load <= 1/4; -1 = empty
  size_t mask_ = 0;             // slots_.size() - 1 (a power of two)
};

}  // namespace gear_runtime
