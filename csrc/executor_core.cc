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

std::vector<DynamicPosition> to_positions(const std::vector<std::vector<int64_t>>& rows) {
  std::vector<DynamicPosition> out(rows.size());
  for (size_t p = 0; p < rows.size(); ++p) {
    const std::string what = "dynamic_positions[" + str(p) + "]";
    if (rows[p].size() != 3) {
      throw_input(what + " must have 3 values (input, axis, value), got " + str(rows[p].size()));
    }
    for (int64_t v : rows[p]) {
      if (v < 0) throw_input(what + " " + format_tuple(rows[p]) + " has a negative value");
    }
    out[p] = {static_cast<size_t>(rows[p][0]), static_cast<size_t>(rows[p][1]),
              static_cast<size_t>(rows[p][2])};
  }
  return out;
}

DimsExtractor make_dims(const std::vector<InputSpec>& inputs,
                        const std::vector<std::vector<int64_t>>& positions) {
  std::vector<std::string> names;
  std::vector<std::vector<int64_t>> shapes;
  for (const InputSpec& in : inputs) {
    if (in.itemsize == 0) throw_input("input '" + in.name + "' has an itemsize of 0");
    names.push_back(in.name);
    shapes.push_back(in.shape);
  }
  return DimsExtractor(std::move(names), std::move(shapes), to_positions(positions));
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
                           const std::vector<std::vector<int64_t>>& positions,
                           const std::vector<std::vector<int64_t>>& gears, const Layout& layout,
                           uint8_t* staging, size_t staging_size)
    : inputs_(std::move(inputs)),
      names_(names_of(inputs_)),
      dims_(make_dims(inputs_, positions)),
      table_(gears, dims_.values_per_gear()),
      stager_((check_layout(layout), layout), staging, staging_size) {
  const size_t n = inputs_.size();
  gear_shapes_.resize(table_.gear_count());
  for (size_t g = 0; g < table_.gear_count(); ++g) {
    for (size_t i = 0; i < n; ++i) gear_shapes_[g].push_back(dims_.gear_shape(i, table_.gear(g)));
  }
  pads_ = default_pads();
  cover_ = Coverer(table_, element_costs());
  last_values_.reserve(table_.values_per_gear());
  last_request_.reserve(table_.values_per_gear());
}

// The layout fits the model: its gears, inputs, dims buffer and every slot (exact sizes).
void ExecutorCore::check_layout(const Layout& layout) const {
  const size_t n = inputs_.size();
  const size_t width = table_.values_per_gear();
  if (layout.gear_count() != table_.gear_count()) {
    throw_input("layout has " + str(layout.gear_count()) + " gears, the model has " +
                str(table_.gear_count()));
  }
  if (layout.input_count() != n) {
    throw_input("layout has " + str(layout.input_count()) + " inputs, the model has " + str(n));
  }
  if (layout.dims_nbytes() != 4 * width) {
    throw_input("layout dims buffer has " + str(layout.dims_nbytes()) +
                " bytes, the model's gears have " + str(width) + " values (" + str(4 * width) +
                " bytes as int32)");
  }
  for (size_t g = 0; g < table_.gear_count(); ++g) {
    for (size_t i = 0; i < n; ++i) {
      const std::vector<int64_t> shape = dims_.gear_shape(i, table_.gear(g));
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

std::vector<int64_t> ExecutorCore::gear(size_t g) const {
  if (g >= table_.gear_count()) {
    throw_input("gear index " + str(g) + " out of range: the model has " +
                str(table_.gear_count()) + " gears");
  }
  return table_.gear_vector(g);
}

// ---- padding ---------------------------------------------------------------------------------

void ExecutorCore::set_padding(const std::optional<PadValues>& pad_values,
                               const std::optional<std::vector<double>>& costs) {
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
  std::vector<double> cost = element_costs();
  if (costs) {
    if (costs->size() != cost.size()) {
      throw_input(str(costs->size()) + " gear costs for " + str(cost.size()) + " gears");
    }
    cost = *costs;
  }
  cover_ = Coverer(table_, cost);  // validates the costs before anything changes
  pads_ = std::move(pads);
}

std::vector<std::vector<uint8_t>> ExecutorCore::default_pads() const {
  std::vector<std::vector<uint8_t>> pads;
  for (const InputSpec& in : inputs_) pads.emplace_back(in.itemsize, 0);
  return pads;
}

// Each gear's total input elements: the cost of a gear when none is measured.
std::vector<double> ExecutorCore::element_costs() const {
  std::vector<double> costs(table_.gear_count(), 0.0);
  for (size_t g = 0; g < costs.size(); ++g) {
    for (const std::vector<int64_t>& shape : gear_shapes_[g]) {
      double elements = 1.0;
      for (int64_t d : shape) elements *= static_cast<double>(d);
      costs[g] += elements;
    }
  }
  return costs;
}

// ---- lookups ---------------------------------------------------------------------------------

// `values` into out (values_per_gear() of them): 145012 for a wrong count.
void ExecutorCore::read_values(Values values, const char* what, int64_t* out) const {
  const size_t width = table_.values_per_gear();
  if (values.size != width) {
    throw_length(std::string(what) + " have " + str(values.size) +
                 " values, the model's gears have " + str(width));
  }
  if (width > 0) std::memcpy(out, values.data, width * sizeof(int64_t));
}

size_t ExecutorCore::match(Values values) const {
  int64_t buf[kMaxValues];
  read_values(values, "dynamic dims", buf);
  return find_or_throw(buf);
}

size_t ExecutorCore::cover(Values values) const {
  int64_t buf[kMaxValues];
  read_values(values, "dynamic dims", buf);
  return cover_or_throw(buf);
}

std::vector<std::vector<int64_t>> ExecutorCore::nearest(Values values, int64_t k) const {
  int64_t buf[kMaxValues];
  read_values(values, "dynamic dims", buf);
  if (k < 0) throw_input("k must be >= 0, got " + std::to_string(k));
  std::vector<std::vector<int64_t>> out;
  const size_t width = table_.values_per_gear();
  for (size_t g : table_.nearest(buf, width, static_cast<size_t>(k))) {
    out.push_back(table_.gear_vector(g));
  }
  return out;
}

size_t ExecutorCore::find_or_throw(const int64_t* values) const {
  const size_t n = table_.values_per_gear();
  const int64_t gear = table_.find(values, n);
  if (gear < 0) throw_mismatch(table_.mismatch_message(values, n, dims_.dynamic_axes_text()));
  return static_cast<size_t>(gear);
}

size_t ExecutorCore::cover_or_throw(const int64_t* values) const {
  const size_t n = table_.values_per_gear();
  int64_t gear = table_.find(values, n);  // an exact hit is always itself
  if (gear < 0) gear = cover_.find(values, n);
  if (gear < 0) {
    throw_mismatch("dynamic dims " + format_tuple(values, n) + " fit in no gear of the model " +
                   "(inputs: " + dims_.dynamic_axes_text() + "): padding needs a gear at " +
                   "least as large in every value; the largest gear is " +
                   format_tuple(table_.gear(cover_.largest()), n) +
                   "; legal gears, nearest first: " + table_.legal_gears_text(values, n));
  }
  return static_cast<size_t>(gear);
}

// ---- dims ------------------------------------------------------------------------------------

std::vector<int64_t> ExecutorCore::values_from_full_dims(Values full_dims) const {
  std::vector<int64_t> out(table_.values_per_gear());
  dims_.from_full_dims(full_dims.data, full_dims.size, out.data());
  return out;
}

// Count, then every item an array, in input order; their shapes into out.
void ExecutorCore::read_shapes(const ArrayView* arrays, size_t n, ShapeRef* out) const {
  dims_.check_count(n);  // before writing n entries into out
  for (size_t i = 0; i < n; ++i) {
    if (!arrays[i].is_array) {
      throw_input("input '" + inputs_[i].name + "' must be a numpy.ndarray, got " +
                  std::string(arrays[i].type));
    }
    out[i] = {arrays[i].shape, arrays[i].ndim};
  }
}

std::vector<int64_t> ExecutorCore::extract(const ArrayView* arrays, size_t n) const {
  std::vector<ShapeRef> shapes(n);
  read_shapes(arrays, n, shapes.data());
  std::vector<int64_t> out(table_.values_per_gear());
  dims_.extract(shapes.data(), n, out.data());
  return out;
}

// ---- stage -----------------------------------------------------------------------------------

// The gear the preset names when it differs from the inputs' values: with pad, a gear that
// covers the values; otherwise (or when it does not cover them) 145012. -1 when the preset
// equals the values (the normal lookup follows).
int64_t ExecutorCore::preset_gear(const Values& preset, const int64_t* values, bool pad) const {
  const size_t width = table_.values_per_gear();
  int64_t set[kMaxValues];
  read_values(preset, "preset dims", set);
  if (std::memcmp(set, values, width * sizeof(int64_t)) == 0) return -1;
  const int64_t gear = pad ? table_.find(set, width) : -1;
  bool covers = gear >= 0;
  for (size_t v = 0; covers && v < width; ++v) covers = set[v] >= values[v];
  if (!covers) {
    throw_length("the inputs' dynamic dims " + format_tuple(values, width) +
                 " disagree with the dims set with set_dynamic_* " + format_tuple(set, width));
  }
  return gear;
}

// Input i's source: its bytes (the dims checked so far bound them by its slot), and when the
// gear is larger than the request, the shapes and pad value of a padded copy.
void ExecutorCore::set_source(size_t gear, size_t i, const ArrayView& a, bool padded,
                              StageSource& src) const {
  const InputSpec& in = inputs_[i];
  if (!a.dtype_ok) {
    throw_input("input '" + in.name + "' has dtype " + std::string(a.type) +
                ", the model's input has " + in.dtype);
  }
  size_t nbytes = in.itemsize;
  for (size_t d = 0; d < a.ndim; ++d) nbytes *= static_cast<size_t>(a.shape[d]);
  src = StageSource{a.data, nbytes};
  if (!padded) return;
  const std::vector<int64_t>& slot = gear_shapes_[gear][i];
  if (std::memcmp(slot.data(), a.shape, slot.size() * sizeof(int64_t)) == 0) return;
  src.shape = a.shape;
  src.slot_shape = slot.data();
  src.ndim = slot.size();
  src.itemsize = in.itemsize;
  src.pad = pads_[i].data();
}

size_t ExecutorCore::prepare(const ArrayView* arrays, size_t n, const Values* preset, bool pad,
                             int64_t* values, Scratch& scratch) const {
  read_shapes(arrays, n, scratch.shapes);  // checks n first: the scratch holds n entries
  dims_.extract(scratch.shapes, n, values);
  int64_t chosen = preset != nullptr ? preset_gear(*preset, values, pad) : -1;
  if (chosen < 0) {
    chosen = static_cast<int64_t>(pad ? cover_or_throw(values) : find_or_throw(values));
  }
  const size_t gear = static_cast<size_t>(chosen);
  const size_t width = table_.values_per_gear();
  const int64_t* gear_values = table_.gear(gear);
  const bool padded = std::memcmp(gear_values, values, width * sizeof(int64_t)) != 0;
  for (size_t i = 0; i < n; ++i) set_source(gear, i, arrays[i], padded, scratch.sources[i]);
  stager_.check(gear, scratch.sources, n, gear_values, width, names_.data());
  return gear;
}

void ExecutorCore::copy_prepared(size_t gear, const StageSource* sources,
                                 size_t n) const noexcept {
  stager_.copy(gear, sources, n, table_.gear(gear), table_.values_per_gear());
}

void ExecutorCore::finish(size_t gear, const int64_t* values) {
  const int64_t* gear_values = table_.gear(gear);
  last_values_.assign(gear_values, gear_values + table_.values_per_gear());
  last_request_.assign(values, values + table_.values_per_gear());
}

}  // namespace gear_runtime
