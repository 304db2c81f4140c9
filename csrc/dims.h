// DimsExtractor: GE's GetCurDynamicDims -- from the inputs' shapes (or from the flattened full
// dims given to aclmdlSetInputDynamicDims) to the gear's dynamic values, with GE's checks.
//
// The mapping from "-1 in input_shape" to "index into the gear tuple" is GearSpec's
// dynamic_positions: (input index, axis, value index). It covers all three GE modes: in dims
// mode every -1 has its own value; in batch mode every -1 carries value 0; in image-size mode
// the two -1 of each input carry values 0 (H) and 1 (W). When several positions carry the same
// value, the inputs must agree on it (145012 naming both positions).
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

namespace gear_runtime {

struct DynamicPosition {
  size_t input;  // index into the model's inputs (user_designate_shape_order)
  size_t axis;   // axis of that input whose model dim is -1
  size_t value;  // index into the gear tuple
};

// One input's shape as seen at run time (a numpy array's shape, or a slice of full dims).
struct ShapeRef {
  const int64_t* dims;
  size_t ndim;
};

class DimsExtractor {
 public:
  // `shapes[i]` is input i's model shape (-1 on dynamic axes, other dims >= 0). Every -1 must
  // be named by exactly one position, every position must name a -1, and the value indices
  // must be exactly 0..values_per_gear()-1. Throws Error(kind "spec") otherwise.
  DimsExtractor(std::vector<std::string> names, std::vector<std::vector<int64_t>> shapes,
                const std::vector<DynamicPosition>& positions);

  size_t input_count() const noexcept { return inputs_.size(); }
  size_t values_per_gear() const noexcept { return width_; }
  size_t total_rank() const noexcept { return total_rank_; }
  const std::string& name(size_t i) const { return inputs_.at(i).name; }
  const std::vector<int64_t>& shape(size_t i) const { return inputs_.at(i).shape; }

  // InputError 145000 "expected 2 input arrays (x, m), got 1" unless n == input_count(): the
  // one arity check of every caller that reads the inputs' shapes.
  void check_count(size_t n) const;

  // Values from the inputs' shapes. n must equal input_count() (check_count); each
  // rank must equal the model's, each static dim must equal the model's, and positions that
  // carry the same value must agree (else DynamicInputLengthError 145012). Writes
  // values_per_gear() values to out. Checks run input by input, axis by axis; the first
  // failure is reported.
  void extract(const ShapeRef* shapes, size_t n, int64_t* out) const;

  // Values from aclmdlSetInputDynamicDims' full dims: every input's full shape flattened in
  // input order. n must equal total_rank() (else 145012), then the same checks as extract().
  void from_full_dims(const int64_t* dims, size_t n, int64_t* out) const;

  // Input i's full shape in the gear whose values are gear_values.
  std::vector<int64_t> gear_shape(size_t i, const int64_t* gear_values) const;

  // "data axis 0" / "x axis 1; m axes 0, 1": the inputs' dynamic axes, for 145013 messages.
  const std::string& dynamic_axes_text() const noexcept { return axes_text_; }
  // "x, m": the input names, for arity messages.
  std::string names_text() const;

 private:
  struct Input {
    std::string name;
    std::vector<int64_t> shape;
    std::vector<int32_t> value_of;  // per axis: the gear value it carries, -1 when static
    std::vector<uint8_t> first;     // per axis: 1 when it is the first position of its value
  };

  void check_input(size_t i, const int64_t* dims, size_t ndim, int64_t* out) const;

  std::vector<Input> inputs_;
  size_t width_ = 0;
  size_t total_rank_ = 0;
  std::vector<size_t> first_input_;  // per value: where it is first carried (for messages)
  std::vector<size_t> first_axis_;
  std::string axes_text_;
};

}  // namespace gear_runtime
