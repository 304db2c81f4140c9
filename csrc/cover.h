// Coverer: which gear covers a request most cheaply, for padding (execute(pad=True)).
//
// The covering rule of the whole project lives here: a gear covers a request when each of its
// values is >= the request's; among covering gears the cheapest wins (GearDispatch's costs:
// measured latencies, or each gear's total input elements), ties to the lower index.
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

#include "gear_table.h"

namespace gear_runtime {

// Requests up to this key get a dense key -> gear table (4 bytes an entry: 256 KiB at most);
// models with larger values use a binary search over the distinct gear keys instead.
inline constexpr int64_t kMaxDenseCoverKey = 65535;

// Coverer: the cheapest gear that covers a request (every gear value >= the request's), for
// padding. Cheapest means lowest cost, ties broken by the lower gear index. Everything is
// precomputed at construction so that a lookup does not grow with the gear count:
//   * "keyed" gears -- one value, or values that are equal in every gear ("tied"), plus values
//     that are the same in every gear ("constant"): the request's key is the largest of its
//     tied values; a table from key to gear (vLLM's padded-size table), dense up to
//     kMaxDenseCoverKey, else a binary search over the distinct keys. Constant values only
//     need a comparison.
//   * anything else (several values that vary independently): the gears sorted by (cost,
//     index), scanned for the first that covers. The scan stops at the cheapest covering
//     gear, but it is O(G) in the worst case (a request only the most expensive gear
//     covers): G = the gear count, at most a few hundred in practice.
class Coverer {
 public:
  Coverer() = default;  // covers nothing
  // costs[g] is gear g's cost (finite, >= 0; else Error kind "input"); one per gear.
  Coverer(const GearTable& table, const std::vector<double>& costs);

  bool keyed() const noexcept { return keyed_; }
  // Index of the cheapest gear covering values[0..n), or -1 (nothing covers it, n is not the
  // gear width, or the coverer is empty). No allocation, no exception.
  int64_t find(const int64_t* values, size_t n) const noexcept;
  // Index of the largest gear (by the sum of its values, ties to the lower index): what a
  // "nothing covers it" message names.
  size_t largest() const noexcept { return largest_; }

 private:
  int64_t find_keyed(const int64_t* values) const noexcept;
  int64_t find_scan(const int64_t* values) const noexcept;

  std::vector<int64_t> flat_;  // the gears, as in GearTable
  size_t width_ = 0;
  size_t largest_ = 0;
  bool keyed_ = false;
  std::vector<size_t> tied_;             // value indices that move together
  std::vector<size_t> constant_;         // value indices equal in every gear
  std::vector<int64_t> constant_value_;  // their values
  std::vector<int32_t> dense_;           // key -> gear (or -1), keys 0..dense_.size()-1
  std::vector<int64_t> keys_;            // distinct gear keys ascending (sparse case)
  std::vector<int32_t> best_;            // best_[j]: cheapest gear whose key >= keys_[j]
  std::vector<int32_t> order_;           // general case: gears by (cost, index)
};

}  // namespace gear_runtime
