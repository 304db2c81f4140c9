#include "cover.h"

#include <algorithm>
#include <cmath>
#include <string>
#include <utility>

#include "errors.h"

namespace gear_runtime {

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
