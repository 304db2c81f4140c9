#include "executor_core.h"

#include <cstring>
#include <utility>

#include "errors.h"

namespace gear_runtime {
namespace {

std::string str(size_t v) { return std::to_string(v); }

// Decimal text of a 128-bit count (slot sizes are computed exactly, beyond size_t).
std::string bytes_text(unsigned __int128 v) {
  if (v == 0) return "0";
  std::string s;
  for (; v > 0; v /= 10) s.insert(s.begin(), static_cast<char>('0' + static_cast<int>(v % 10)));
  return s;
}

// The dispatch, non-null, whose inputs are `inputs` (names and shapes, in order), each with an
// itemsize > 0.
std::shared_ptr<const GearDispatch> checked(std::shared_ptr<const GearDispatch> dispatch,
                                            const std::vector<InputSpec>& inputs) {
  if (!dispatch) throw_input("an executor core needs the model's dispatch, got none");
  const DimsExtractor& dims = dispatch->dims();
  if (dims.input_count() != inputs.size()) {
    throw_input(str(inputs.size()) + " inputs for a dispatch of " + str(dims.input_count()) +
                " inputs (" + dims.names_text() + ")");
  }
  for (size_t i = 0; i < inputs.size(); ++i) {
    const InputSpec& in = inputs[i];
    if (in.name != dims.name(i) || in.shape != dims.shape(i)) {
      throw_input("input " + str(i) + " is '" + in.name + "' " + format_tuple(in.shape) +
                  ", the dispatch's is '" + dims.name(i) + "' " + format_tuple(dims.shape(i)));
    }
    if (in.itemsize == 0) throw_input("input '" + in.name + "' has an itemsize of 0");
  }
  return dispatch;
}

std::vector<std::string> names_of(const std::vector<InputSpec>& inputs) {
  std::vector<std::string> names;
  for (const InputSpec& in : inputs) names.push_back(in.name);
  return names;
}

}  // namespace

Layout plan_layout_checked(const std::vector<std::vector<int64_t>>& input_nbytes,
                           int64_t dims_count, int64_t fusion_size, int64_t alignment,
                           int64_t tail_padding) {
  std::vector<std::vector<size_t>> table(input_nbytes.size());
  for (size_t g = 0; g < table.size(); ++g) {
    for (size_t i = 0; i < input_nbytes[g].size(); ++i) {
      const int64_t n = input_nbytes[g][i];
      if (n < 0) {
        throw_input("input_nbytes[" + str(g) + "][" + str(i) + "] is " + std::to_string(n) +
                    ", a byte count must be >= 0");
      }
      table[g].push_back(static_cast<size_t>(n));
    }
  }
  if (dims_count < 0) throw_input("dims_count must be >= 0, got " + std::to_string(dims_count));
  if (alignment <= 0) {
    throw_input("alignment must be a power of two >= 1, got " + std::to_string(alignment));
  }
  // A negative tail_padding is Layout::plan's to refuse (after the alignment).
  return Layout::plan(table, static_cast<size_t>(dims_count), fusion_size,
                      static_cast<size_t>(alignment), tail_padding);
}

ExecutorCore::Scratch::Scratch(size_t n) : shapes(shapes_small), sources(sources_small) {
  if (n > kStackInputs) {
    shapes_big.resize(n);
    sources_big.resize(n);
    shapes = shapes_big.data();
    sources = sources_big.data();
  }
}

ExecutorCore::ExecutorCore(std::vector<InputSpec> inputs,
                           std::shared_ptr<const GearDispatch> dispatch, const Layout& layout,
                           uint8_t* staging, size_t staging_size)
    : dispatch_(checked(std::move(dispatch), inputs)),
      inputs_(std::move(inputs)),
      names_(names_of(inputs_)),
      stager_((check_layout(layout), layout), staging, staging_size) {
  pads_ = default_pads();
  last_values_.reserve(dispatch_->values_per_gear());
  last_request_.reserve(dispatch_->values_per_gear());
}

// The layout fits the model: its gears, inputs, dims buffer and every slot (exact sizes).
void ExecutorCore::check_layout(const Layout& layout) const {
  const size_t n = inputs_.size();
  const size_t width = dispatch_->values_per_gear();
  if (layout.gear_count() != dispatch_->gear_count()) {
    throw_input("layout has " + str(layout.gear_count()) + " gears, the model has " +
                str(dispatch_->gear_count()));
  }
  if (layout.input_count() != n) {
    throw_input("layout has " + str(layout.input_count()) + " inputs, the model has " + str(n));
  }
  if (layout.dims_nbytes() != 4 * width && layout.dims_nbytes() != 0) {
    throw_input("layout dims buffer has " + str(layout.dims_nbytes()) +
                " bytes, the model's gears have " + str(width) + " values (" + str(4 * width) +
                " bytes as int32; or 0: no dims buffer)");
  }
  for (size_t g = 0; g < dispatch_->gear_count(); ++g) {
    for (size_t i = 0; i < n; ++i) {
      const std::vector<int64_t>& shape = dispatch_->gear_shape(g, i);
      unsigned __int128 need = inputs_[i].itemsize;
      for (int64_t d : shape) need *= static_cast<uint64_t>(d);
      if (need > layout.nbytes_unchecked(g, i)) {
        throw_input("layout slot of input '" + inputs_[i].name + "' in gear " + str(g) +
                    " has " + str(layout.nbytes_unchecked(g, i)) + " bytes, its shape " +
                    format_tuple(shape) + " of " + inputs_[i].dtype + " needs " +
                    bytes_text(need));
      }
    }
  }
}

// ---- padding ---------------------------------------------------------------------------------

void ExecutorCore::set_padding(const std::optional<PadValues>& pad_values) {
  std::vector<std::vector<uint8_t>> pads = default_pads();
  if (pad_values) {
    if (pad_values->size() != pads.size()) {
      throw_input(str(pad_values->size()) + " pad values for " + str(pads.size()) + " inputs");
    }
    for (size_t i = 0; i < pads.size(); ++i) {
      const std::optional<std::vector<uint8_t>>& given = (*pad_values)[i];
      if (!given) continue;
      if (given->size() != inputs_[i].itemsize) {
        throw_input("pad value of input '" + inputs_[i].name + "' must be " +
                    str(inputs_[i].itemsize) + " bytes (one " + inputs_[i].dtype + "), got " +
                    str(given->size()) + " bytes");
      }
      pads[i] = *given;
    }
  }
  pads_ = std::move(pads);
}

std::vector<std::vector<uint8_t>> ExecutorCore::default_pads() const {
  std::vector<std::vector<uint8_t>> pads;
  for (const InputSpec& in : inputs_) pads.emplace_back(in.itemsize, 0);
  return pads;
}

// ---- stage -----------------------------------------------------------------------------------

// The gear the preset names when it differs from the inputs' values: with pad, a gear that
// covers the values; otherwise (or when it does not cover them) 145012. -1 when the preset
// equals the values (the normal lookup follows).
int64_t ExecutorCore::preset_gear(const Values& preset, const int64_t* values, bool pad) const {
  const size_t width = dispatch_->values_per_gear();
  int64_t set[kMaxValues];
  dispatch_->read_values(preset, "preset dims", set);
  if (std::memcmp(set, values, width * sizeof(int64_t)) == 0) return -1;
  const int64_t gear = pad ? dispatch_->table().find(set, width) : -1;
  bool covers = gear >= 0;
  for (size_t v = 0; covers && v < width; ++v) covers = set[v] >= values[v];
  if (!covers) {
    throw_length("the inputs' dynamic dims " + format_tuple(values, width) +
                 " disagree with the dims set with set_dynamic_* " + format_tuple(set, width));
  }
  return gear;
}

// Input i's source: its bytes (the dims checked so far bound them by its slot), and when the
// gear is larger than the request (`padded_shape`: room for the input's rank, or nullptr),
// the shapes and pad value of a padded copy. The request's shape is COPIED there: the copy
// may run with the GIL released, when numpy may rewrite the array's own dims.
void ExecutorCore::set_source(size_t gear, size_t i, const ArrayView& a, int64_t* padded_shape,
                              bool in_place, StageSource& src) const {
  const InputSpec& in = inputs_[i];
  if (!a.dtype_ok) {
    throw_input("input '" + in.name + "' has dtype " + std::string(a.type) +
                ", the model's input has " + in.dtype);
  }
  size_t nbytes = in.itemsize;
  for (size_t d = 0; d < a.ndim; ++d) nbytes *= static_cast<size_t>(a.shape[d]);
  src = StageSource{a.data, nbytes};
  // an input that is not padded is the gear's shape exactly: a large one is read in place,
  // if it is aligned as its dtype needs (as numpy's aligned flag; staging is 64-aligned)
  src.in_place = in_place && in_place_bytes_ > 0 && nbytes >= in_place_bytes_ &&
                 reinterpret_cast<uintptr_t>(a.data) % in.itemsize == 0 &&
                 !overlaps_written(a.data, nbytes);
  if (padded_shape == nullptr) return;
  const std::vector<int64_t>& slot = dispatch_->gear_shape(gear, i);
  if (std::memcmp(slot.data(), a.shape, slot.size() * sizeof(int64_t)) == 0) return;
  src.in_place = false;
  std::memcpy(padded_shape, a.shape, slot.size() * sizeof(int64_t));  // ndim == slot's: checked
  src.shape = padded_shape;
  src.slot_shape = slot.data();
  src.ndim = slot.size();
  src.itemsize = in.itemsize;
  src.pad = pads_[i].data();
}

bool ExecutorCore::overlaps_written(const void* data, size_t nbytes) const noexcept {
  const uintptr_t lo = reinterpret_cast<uintptr_t>(data);
  for (const auto& [start, bytes] : written_) {
    if (lo < start + bytes && start < lo + nbytes) return true;
  }
  return false;
}

size_t ExecutorCore::prepare(const ArrayView* arrays, size_t n, const Values* preset, bool pad,
                             bool in_place, int64_t* values, Scratch& scratch) const {
  dispatch_->read_shapes(arrays, n, scratch.shapes);  // checks n first: the scratch holds n entries
  dispatch_->dims().extract(scratch.shapes, n, values);
  int64_t chosen = preset != nullptr ? preset_gear(*preset, values, pad) : -1;
  if (chosen < 0) {
    chosen = static_cast<int64_t>(pad ? dispatch_->cover_or_throw(values)
                                      : dispatch_->match_or_throw(values));
  }
  const size_t gear = static_cast<size_t>(chosen);
  const size_t width = dispatch_->values_per_gear();
  const int64_t* gear_values = dispatch_->table().gear(gear);
  const bool padded = std::memcmp(gear_values, values, width * sizeof(int64_t)) != 0;
  if (padded) {  // room for every input's shape, sized once: the pointers into it stay valid
    size_t ranks = 0;
    for (size_t i = 0; i < n; ++i) ranks += dispatch_->gear_shape(gear, i).size();
    scratch.padded_shapes.resize(ranks);
  }
  size_t at = 0;
  for (size_t i = 0; i < n; ++i) {
    set_source(gear, i, arrays[i], padded ? scratch.padded_shapes.data() + at : nullptr,
               in_place, scratch.sources[i]);
    at += dispatch_->gear_shape(gear, i).size();
  }
  stager_.check(gear, scratch.sources, n, gear_values, staged_values(), names_.data());
  return gear;
}

void ExecutorCore::copy_prepared(size_t gear, const StageSource* sources,
                                 size_t n) const noexcept {
  stager_.copy(gear, sources, n, dispatch_->table().gear(gear), staged_values());
}

void ExecutorCore::finish(size_t gear, const int64_t* values, const StageSource* sources,
                          size_t n) {
  const size_t width = dispatch_->values_per_gear();
  const int64_t* gear_values = dispatch_->table().gear(gear);
  last_values_.assign(gear_values, gear_values + width);
  last_request_.assign(values, values + width);
  last_in_place_.clear();  // no allocation once it has held a few
  for (size_t i = 0; i < n; ++i) {
    if (sources[i].in_place) last_in_place_.push_back(i);
  }
}

}  // namespace gear_runtime
