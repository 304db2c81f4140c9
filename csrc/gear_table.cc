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
  // Distance: the L1 distance of the dynamic values, the numbers the user wrote (a gear flag,
  // the shapes' lengths), so the order can be checked by eye: 100 is nearer 128 (28) than 64
  // (36), and 32 (68) than 256 (156). Input elements would weigh each value by the other dims
  // of its inputs (a batch of images against a sequence length); a ratio would rank 256
  // before 32 for a request that is nearer 32. The gear a padded run would take is named on
  // its own in GearDispatch's message, so covering gears need not come first here.
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
                                        const std::string& axes_text,
                                        const std::string& hint) const {
  return "dynamic dims " + format_tuple(values, n) + " match no gear of the model (inputs: " +
         axes_text + ")" + (hint.empty() ? "" : "; " + hint) +
         "; legal gears, nearest first: " + legal_gears_text(values, n);
}

}  // namespace gear_runtime
