#include "dispatch.h"

#include <cstring>
#include <utility>

#include "errors.h"

namespace gear_runtime {
namespace {

std::string str(size_t v) { return std::to_string(v); }

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

}  // namespace

GearDispatch::GearDispatch(std::vector<std::string> names,
                           std::vector<std::vector<int64_t>> shapes,
                           const std::vector<std::vector<int64_t>>& positions,
                           const std::vector<std::vector<int64_t>>& gears,
                           const std::optional<std::vector<double>>& costs)
    : dims_(std::move(names), std::move(shapes), to_positions(positions)),
      table_(gears, dims_.values_per_gear()) {
  shapes_.resize(table_.gear_count());
  for (size_t g = 0; g < table_.gear_count(); ++g) {
    for (size_t i = 0; i < dims_.input_count(); ++i) {
      shapes_[g].push_back(dims_.gear_shape(i, table_.gear(g)));
    }
  }
  init_costs(costs);
}

std::vector<int64_t> GearDispatch::gear(size_t g) const {
  if (g >= table_.gear_count()) {
    throw_input("gear index " + str(g) + " out of range: the model has " +
                str(table_.gear_count()) + " gears");
  }
  return table_.gear_vector(g);
}

void GearDispatch::init_costs(const std::optional<std::vector<double>>& costs) {
  std::vector<double> cost;
  if (costs) {
    if (costs->size() != table_.gear_count()) {
      throw_input(str(costs->size()) + " gear costs for " + str(table_.gear_count()) +
                  " gears");
    }
    cost = *costs;
  } else {
    for (size_t g = 0; g < table_.gear_count(); ++g) cost.push_back(elements_of(table_.gear(g)));
  }
  cover_ = Coverer(table_, cost);  // validates the costs
  costs_ = std::move(cost);
}

// ---- lookups ---------------------------------------------------------------------------------

void GearDispatch::read_values(Values values, const char* what, int64_t* out) const {
  const size_t width = table_.values_per_gear();
  if (values.size != width) {
    throw_length(std::string(what) + " have " + str(values.size) +
                 " values, the model's gears have " + str(width));
  }
  if (width > 0) std::memcpy(out, values.data, width * sizeof(int64_t));
}

size_t GearDispatch::match(Values values) const {
  int64_t buf[kMaxValues];
  read_values(values, "dynamic dims", buf);
  return match_or_throw(buf);
}

size_t GearDispatch::cover(Values values) const {
  int64_t buf[kMaxValues];
  read_values(values, "dynamic dims", buf);
  return cover_or_throw(buf);
}

std::vector<std::vector<int64_t>> GearDispatch::nearest(Values values, int64_t k) const {
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

std::vector<int64_t> GearDispatch::values_from_full_dims(Values full_dims) const {
  std::vector<int64_t> out(table_.values_per_gear());
  dims_.from_full_dims(full_dims.data, full_dims.size, out.data());
  return out;
}

void GearDispatch::read_shapes(const ArrayView* arrays, size_t n, ShapeRef* out) const {
  dims_.check_count(n);  // before writing n entries into out
  for (size_t i = 0; i < n; ++i) {
    if (!arrays[i].is_array) {
      throw_input("input '" + dims_.name(i) + "' must be a numpy.ndarray, got " +
                  std::string(arrays[i].type));
    }
    out[i] = {arrays[i].shape, arrays[i].ndim};
  }
}

std::vector<int64_t> GearDispatch::extract(const ArrayView* arrays, size_t n) const {
  std::vector<ShapeRef> shapes(n);
  read_shapes(arrays, n, shapes.data());
  std::vector<int64_t> out(table_.values_per_gear());
  dims_.extract(shapes.data(), n, out.data());
  return out;
}

double GearDispatch::elements(Values values) const {
  int64_t buf[kMaxValues];
  read_values(values, "dynamic dims", buf);
  return elements_of(buf);
}

double GearDispatch::elements_of(const int64_t* values) const {
  double total = 0.0;
  for (size_t i = 0; i < dims_.input_count(); ++i) {
    double elements = 1.0;
    for (int64_t d : dims_.gear_shape(i, values)) elements *= static_cast<double>(d);
    total += elements;
  }
  return total;
}

size_t GearDispatch::match_or_throw(const int64_t* values) const {
  const size_t n = table_.values_per_gear();
  const int64_t gear = table_.find(values, n);
  if (gear < 0) throw_mismatch(mismatch_message(values));
  return static_cast<size_t>(gear);
}

std::string GearDispatch::mismatch_message(const int64_t* values) const {
  const size_t n = table_.values_per_gear();
  // A miss is often a request between the gears that padding would run: say where (the
  // gear cover() picks: the cheapest that holds it) and how to ask for it.
  const int64_t covering = cover_.find(values, n);
  std::string hint;
  if (covering >= 0) {
    const size_t g = static_cast<size_t>(covering);
    hint = "the cheapest gear holding them is gear " + str(g) + " " +
           format_tuple(table_.gear(g), n) +
           ": execute(pad=True) (gear-runtime run / bench: --pad) runs them there, padded, "
           "the outputs trimmed to them";
  }
  return table_.mismatch_message(values, n, dims_.dynamic_axes_text(), hint);
}

int64_t GearDispatch::find_cover(const int64_t* values) const noexcept {
  const size_t n = table_.values_per_gear();
  const int64_t gear = table_.find(values, n);  // an exact hit is always itself
  return gear >= 0 ? gear : cover_.find(values, n);
}

size_t GearDispatch::cover_or_throw(const int64_t* values) const {
  const size_t n = table_.values_per_gear();
  const int64_t gear = find_cover(values);
  if (gear < 0) {
    throw_mismatch("dynamic dims " + format_tuple(values, n) + " fit in no gear of the model " +
                   "(inputs: " + dims_.dynamic_axes_text() + "): padding needs a gear at " +
                   "least as large in every value; the largest gear is " +
                   format_tuple(table_.gear(cover_.largest()), n) +
                   "; legal gears, nearest first: " + table_.legal_gears_text(values, n));
  }
  return static_cast<size_t>(gear);
}

}  // namespace gear_runtime
