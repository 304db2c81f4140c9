#include "dims.h"

#include <utility>

#include "errors.h"

namespace gear_runtime {
namespace {

std::string position_text(const DynamicPosition& p) {
  return "(" + std::to_string(p.input) + ", " + std::to_string(p.axis) + ", " +
         std::to_string(p.value) + ")";
}

}  // namespace

DimsExtractor::DimsExtractor(std::vector<std::string> names,
                             std::vector<std::vector<int64_t>> shapes,
                             const std::vector<DynamicPosition>& positions) {
  if (names.size() != shapes.size()) {
    throw_spec(std::to_string(names.size()) + " input names but " +
               std::to_string(shapes.size()) + " input shapes");
  }
  inputs_.resize(names.size());
  for (size_t i = 0; i < names.size(); ++i) {
    Input& in = inputs_[i];
    in.name = std::move(names[i]);
    in.shape = std::move(shapes[i]);
    for (size_t a = 0; a < in.shape.size(); ++a) {
      if (in.shape[a] < -1) {
        throw_spec("input '" + in.name + "' axis " + std::to_string(a) + " is " +
                   std::to_string(in.shape[a]) + ": a model dim is >= 0, or -1 when dynamic");
      }
    }
    in.value_of.assign(in.shape.size(), -1);
    in.first.assign(in.shape.size(), 0);
    total_rank_ += in.shape.size();
  }
  for (size_t p = 0; p < positions.size(); ++p) {
    const DynamicPosition& pos = positions[p];
    const std::string where = "dynamic position " + std::to_string(p) + " " + position_text(pos);
    if (pos.input >= inputs_.size()) {
      throw_spec(where + " names input " + std::to_string(pos.input) + ", the model has " +
                 std::to_string(inputs_.size()) + " inputs");
    }
    Input& in = inputs_[pos.input];
    if (pos.axis >= in.shape.size()) {
      throw_spec(where + " names axis " + std::to_string(pos.axis) + " of input '" + in.name +
                 "', which has " + std::to_string(in.shape.size()) + " dims");
    }
    if (in.shape[pos.axis] != -1) {
      throw_spec(where + " names input '" + in.name + "' axis " + std::to_string(pos.axis) +
                 ", which the model fixes to " + std::to_string(in.shape[pos.axis]));
    }
    if (in.value_of[pos.axis] != -1) {
      throw_spec(where + " repeats input '" + in.name + "' axis " + std::to_string(pos.axis));
    }
    if (pos.value > 127) {  // ACL_MAX_DIM_CNT = 128 dynamic values at most
      throw_spec(where + " names gear value " + std::to_string(pos.value) +
                 ", GE allows at most 128 dynamic values");
    }
    in.value_of[pos.axis] = static_cast<int32_t>(pos.value);
    if (pos.value + 1 > width_) width_ = pos.value + 1;
  }
  // First carrier of every value, in input/axis order (the order the checks run in).
  first_input_.assign(width_, SIZE_MAX);
  first_axis_.assign(width_, SIZE_MAX);
  for (size_t i = 0; i < inputs_.size(); ++i) {
    Input& in = inputs_[i];
    std::string axes;
    size_t dynamic_axes = 0;
    for (size_t a = 0; a < in.shape.size(); ++a) {
      if (in.shape[a] != -1) continue;
      if (in.value_of[a] < 0) {
        throw_spec("input '" + in.name + "' axis " + std::to_string(a) +
                   " is -1 but no dynamic position maps it to a gear value");
      }
      const size_t v = static_cast<size_t>(in.value_of[a]);
      if (first_input_[v] == SIZE_MAX) {
        first_input_[v] = i;
        first_axis_[v] = a;
        in.first[a] = 1;
      }
      axes += (dynamic_axes++ ? ", " : "") + std::to_string(a);
    }
    if (dynamic_axes > 0) {
      if (!axes_text_.empty()) axes_text_ += "; ";
      axes_text_ += in.name + (dynamic_axes == 1 ? " axis " : " axes ") + axes;
    }
  }
  for (size_t v = 0; v < width_; ++v) {
    if (first_input_[v] == SIZE_MAX) {
      throw_spec("no dynamic position carries gear value " + std::to_string(v) + " (values 0.." +
                 std::to_string(width_ - 1) + " must all be used)");
    }
  }
  if (axes_text_.empty()) axes_text_ = "no dynamic axes";
}

void DimsExtractor::check_input(size_t i, const int64_t* dims, size_t ndim, int64_t* out) const {
  const Input& in = inputs_[i];
  const size_t rank = in.shape.size();
  if (ndim != rank) {
    throw_length("input '" + in.name + "' has " + std::to_string(ndim) +
                 " dims, the model's input has " + std::to_string(rank));
  }
  for (size_t a = 0; a < rank; ++a) {
    const int64_t d = dims[a];
    const int32_t v = in.value_of[a];
    if (v < 0) {
      if (d != in.shape[a]) {
        throw_length("input '" + in.name + "' axis " + std::to_string(a) + " is " +
                     std::to_string(d) + " but the model fixes it to " +
                     std::to_string(in.shape[a]));
      }
    } else if (in.first[a]) {
      out[v] = d;
    } else if (out[v] != d) {
      const Input& first = inputs_[first_input_[static_cast<size_t>(v)]];
      throw_length("input '" + in.name + "' axis " + std::to_string(a) + " is " +
                   std::to_string(d) + " but input '" + first.name + "' axis " +
                   std::to_string(first_axis_[static_cast<size_t>(v)]) + " is " +
                   std::to_string(out[v]) + ", and both carry gear value " + std::to_string(v));
    }
  }
}

void DimsExtractor::check_count(size_t n) const {
  if (n != inputs_.size()) {
    throw_input("expected " + std::to_string(inputs_.size()) + " input arrays (" + names_text() +
                "), got " + std::to_string(n));
  }
}

void DimsExtractor::extract(const ShapeRef* shapes, size_t n, int64_t* out) const {
  check_count(n);
  for (size_t i = 0; i < n; ++i) check_input(i, shapes[i].dims, shapes[i].ndim, out);
}

void DimsExtractor::from_full_dims(const int64_t* dims, size_t n, int64_t* out) const {
  if (n != total_rank_) {
    std::string ranks;
    for (size_t i = 0; i < inputs_.size(); ++i) {
      ranks += (i ? ", " : "") + inputs_[i].name + ":" + std::to_string(inputs_[i].shape.size());
    }
    throw_length("full dims have " + std::to_string(n) + " values, the model's inputs have " +
                 std::to_string(total_rank_) + " dims in all (" + ranks + ")");
  }
  size_t offset = 0;
  for (size_t i = 0; i < inputs_.size(); ++i) {
    const size_t rank = inputs_[i].shape.size();
    check_input(i, dims + offset, rank, out);
    offset += rank;
  }
}

std::vector<int64_t> DimsExtractor::gear_shape(size_t i, const int64_t* gear_values) const {
  const Input& in = inputs_.at(i);
  std::vector<int64_t> shape = in.shape;
  for (size_t a = 0; a < shape.size(); ++a) {
    if (in.value_of[a] >= 0) shape[a] = gear_values[in.value_of[a]];
  }
  return shape;
}

std::string DimsExtractor::names_text() const {
  std::string out;
  for (size_t i = 0; i < inputs_.size(); ++i) out += (i ? ", " : "") + inputs_[i].name;
  return out;
}

}  // namespace gear_runtime
