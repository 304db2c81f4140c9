#include "gear_table.h"

#include <algorithm>
#include <cmath>
#include <stdexcept>
#include <utility>

#include "errors.h"

namespace gear_runtime {
namespace {

// splitmix64's finaliser: a cheap full-avalanche mix, so nearby gears (1, 2, 3, ...) spread
// over the whole table instead of clustering under linear probing.
inline uint64_t mix64(uint64_t x) noexcept {
  x ^= x >> 30;
  x *= 0xbf58476d1ce4e5b9ULL;
  x ^= x >> 27;
  x *= 0x94d049bb133111ebULL;
  x ^= x >> 31;
  return x;
}

inline uint64_t hash_values(const int64_t* values, size_t n) noexcept {
  uint64_t h = 0x9e3779b97f4a7c15ULL;
  for (size_t i = 0; i < n; ++i) h = mix64(h + static_cast<uint64_t>(values[i]));
  return h;
}

// |a - b| exactly, for any int64 a and b (computed in unsigned arithmetic, no overflow).
inline uint64_t abs_diff(int64_t a, int64_t b) noexcept {
  return a > b ? static_cast<uint64_t>(a) - static_cast<uint64_t>(b)
               : static_cast<uint64_t>(b) - static_cast<uint64_t>(a);
}

}  // namespace

GearTable::GearTable(const std::vector<std::vector<int64_t>>& gears, size_t values_per_gear)
    : count_(gears.size()), width_(values_per_gear) {
  if (gears.empty()) throw_spec("the model has no gears: at least one is needed", "E10035");
  if (gears.size() > static_cast<size_t>(INT32_MAX)) throw_spec("too many gears", "E10036");
  flat_.reserve(count_ * width_);
  for (size_t g = 0; g < count_; ++g) {
    const std::vector<int64_t>& gear = gears[g];
    if (gear.size() != width_) {
      throw_spec("gear " + std::to_string(g) + " " + format_tuple(gear) + " has " +
                     std::to_string(gear.size()) + " values, the model's inputs have " +
                     std::to_string(width_) + " dynamic values",
                 "E10037");
    }
    for (int64_t v : gear) {
      if (v < 0 || v > kMaxGearValue) {
        throw_spec("gear " + std::to_string(g) + " " + format_tuple(gear) + " has value " +
                       std::to_string(v) + " outside [0, " + std::to_string(kMaxGearValue) +
                       "]",
                   "E10038");
      }
    }
    flat_.insert(flat_.end(), gear.begin(), gear.end());
  }
  size_t capacity = 4;
  // Load factor <= 1/4: a hit almost always takes one probe, so 100 gears cost what 2 do.
  while (capacity < 4 * count_) capacity *= 2;
  slots_.assign(capacity, -1);
  mask_ = capacity - 1;
  for (size_t g = 0; g < count_; ++g) {
    size_t slot = slot_of(gear(g));
    if (slots_[slot] != -1) {
      const size_t first = static_cast<size_t>(slots_[slot]);
      throw_spec("gear " + std::to_string(g) + " " + format_tuple(gear(g), width_) +
                     " repeats gear " + std::to_string(first),
                 "E10039");
    }
    slots_[slot] = static_cast<int32_t>(g);
  }
}

std::vector<int64_t> GearTable::gear_vector(size_t g) const {
  return std::vector<int64_t>(gear(g), gear(g) + width_);
}

// The slot holding `values` if present, else the empty slot where they would go.
size_t GearTable::slot_of(const int64_t* values) const noexcept {
  size_t slot = static_cast<size_t>(hash_values(values, width_)) & mask_;
  while (slots_[slot] != -1) {
    const int64_t* candidate = gear(static_cast<size_t>(slots_[slot]));
    size_t i = 0;  // an inline loop: gears are a few values, a memcmp call costs more
    while (i < width_ && candidate[i] == values[i]) ++i;
    if (i == width_) return slot;
    slot = (slot + 1) & mask_;
  }
  return slot;
}

int64_t GearTable::find(const int64_t* values, size_t n) const noexcept {
  if (n != width_) return -1;
  return slots_[slot_of(values)];
}

std::vector<size_t> GearTable::nearest(const int64_t* values, size_t n, size_t k) const {
  if (n != width_) throw std::invalid_argument("GearTable::nearest: wrong number of values");
  // 128-bit sums: up to 128 differences of up to 2^64 each are exact, as in Python.
  std::vector<std::pair<unsigned __int128, size_t>> order(count_);
  for (size_t g = 0; g < count_; ++g) {
    unsigned __int128 distance = 0;
    const int64_t* gv = gear(g);
    for (size_t i = 0; i < width_; ++i) distance += abs_diff(gv[i], values[i]);
    order[g] = {distance, g};
  }
  const size_t shown = std::min(k, count_);
  std::partial_sort(order.begin(), order.begin() + static_cast<std::ptrdiff_t>(shown),
                    order.end());  // pairs compare by distance, then by gear index
  std::vector<size_t> out(shown);
  for (size_t j = 0; j < shown; ++j) out[j] = order[j].second;
  return out;
}

std::string GearTable::legal_gears_text(const int64_t* values, size_t n) const {
  std::string out;
  const std::vector<size_t> shown = nearest(values, n, kGearsShownInErrors);
  for (size_t j = 0; j < shown.size(); ++j) {
    if (j > 0) out += ", ";
    out += format_tuple(gear(shown[j]), width_);
  }
  if (count_ > shown.size()) out += ", ... and " + std::to_string(count_ - shown.size()) + " more";
  return out;
}

std::string GearTable::mismatch_message(const int64_t* values, size_t n,
                                        const std::string& axes_text) const {
  return "dynamic dims " + format_tuple(values, n) + " match no gear of the model (inputs: " +
         axes_text + "); legal gears, nearest first: " + legal_gears_text(values, n);
}

// ---- Coverer ----------------------------------------------------------------------------------

Coverer::Coverer(const GearTable& table, const std::vector<double>& costs)
    : width_(table.values_per_gear()) {
  const size_t count = table.gear_count();
  if (costs.size() != count) {
    throw_input(std::to_string(costs.size()) + " gear costs for " + std::to_string(count) +
                " gears");
  }
  for (size_t g = 0; g < count; ++g) {
    if (!std::isfinite(costs[g]) || costs[g] < 0) {
      throw_input("gear " + std::to_string(g) + " cost must be finite and >= 0");
    }
  }
  flat_.assign(table.gear(0), table.gear(0) + count * width_);
  // Cheapest first, ties to the lower index: the one order every lookup agrees with.
  order_.resize(count);
  for (size_t g = 0; g < count; ++g) order_[g] = static_cast<int32_t>(g);
  std::stable_sort(order_.begin(), order_.end(),
                   [&](int32_t a, int32_t b) { return costs[a] < costs[b]; });
  unsigned __int128 largest_sum = 0;
  for (size_t g = 0; g < count; ++g) {
    unsigned __int128 sum = 0;
    for (size_t v = 0; v < width_; ++v) sum += static_cast<uint64_t>(flat_[g * width_ + v]);
    if (g == 0 || sum > largest_sum) largest_sum = sum, largest_ = g;
  }
  // Classify values: constant in every gear, or else tied to the first varying value.
  size_t first = width_;
  keyed_ = true;
  for (size_t v = 0; v < width_; ++v) {
    bool constant = true, tied = true;
    for (size_t g = 0; g < count; ++g) {
      constant = constant && flat_[g * width_ + v] == flat_[v];
      if (first < width_) tied = tied && flat_[g * width_ + v] == flat_[g * width_ + first];
    }
    if (constant) {
      constant_.push_back(v);
      constant_value_.push_back(flat_[v]);
    } else if (first == width_) {
      first = v;
      tied_.push_back(v);
    } else if (tied) {
      tied_.push_back(v);
    } else {
      keyed_ = false;
    }
  }
  if (!keyed_) return;
  // Keys descending: a running minimum gives, for each key, the cheapest gear at or above it.
  const size_t key_of = tied_.empty() ? 0 : tied_[0];
  std::vector<std::pair<int64_t, int32_t>> by_key(count);
  for (size_t g = 0; g < count; ++g) {
    by_key[g] = {tied_.empty() ? 0 : flat_[g * width_ + key_of], static_cast<int32_t>(g)};
  }
  std::sort(by_key.begin(), by_key.end());
  auto cheaper = [&](int32_t a, int32_t b) {
    return b < 0 || costs[a] < costs[b] || (costs[a] == costs[b] && a < b);
  };
  int32_t best = -1;
  for (size_t j = count; j-- > 0;) {
    if (cheaper(by_key[j].second, best)) best = by_key[j].second;
    if (j == 0 || by_key[j - 1].first != by_key[j].first) {
      keys_.push_back(by_key[j].first);
      best_.push_back(best);
    }
  }
  std::reverse(keys_.begin(), keys_.end());
  std::reverse(best_.begin(), best_.end());
  if (keys_.back() <= kMaxDenseCoverKey) {
    dense_.assign(static_cast<size_t>(keys_.back()) + 1, -1);
    size_t j = 0;
    for (size_t key = 0; key < dense_.size(); ++key) {
      while (keys_[j] < static_cast<int64_t>(key)) ++j;
      dense_[key] = best_[j];
    }
  }
}

int64_t Coverer::find(const int64_t* values, size_t n) const noexcept {
  if (n != width_ || order_.empty()) return -1;
  return keyed_ ? find_keyed(values) : find_scan(values);
}

int64_t Coverer::find_keyed(const int64_t* values) const noexcept {
  for (size_t c = 0; c < constant_.size(); ++c) {
    if (values[constant_[c]] > constant_value_[c]) return -1;
  }
  int64_t key = 0;
  for (size_t v : tied_) key = std::max(key, values[v]);
  if (!dense_.empty()) {
    return key < static_cast<int64_t>(dense_.size()) ? dense_[static_cast<size_t>(key)] : -1;
  }
  const auto it = std::lower_bound(keys_.begin(), keys_.end(), key);
  return it == keys_.end() ? -1 : best_[static_cast<size_t>(it - keys_.begin())];
}

int64_t Coverer::find_scan(const int64_t* values) const noexcept {
  for (int32_t g : order_) {
    const int64_t* gv = flat_.data() + static_cast<size_t>(g) * width_;
    size_t v = 0;
    while (v < width_ && gv[v] >= values[v]) ++v;
    if (v == width_) return g;
  }
  return -1;
}

}  // namespace gear_runtime
