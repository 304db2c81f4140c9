// GearDispatch: which gear -- exact match, the cheapest cover by the configured costs, the
// element count of any request, and that refused costs change nothing.
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "check.h"
#include "dispatch.h"

using gear_runtime::ArrayView;
using gear_runtime::GearDispatch;
using gear_runtime::Values;
using V = std::vector<int64_t>;

namespace {

// batch mode, one input data [-1, 3]: gears 1, 2, 4, 8.
GearDispatch batch(const std::optional<std::vector<double>>& costs = std::nullopt) {
  return GearDispatch({"data"}, {{-1, 3}}, {{0, 0, 0}}, {{1}, {2}, {4}, {8}}, costs);
}

Values of(const V& v) { return {v.data(), v.size()}; }

}  // namespace

TEST(dispatch_costs_default_to_input_elements) {
  const GearDispatch d = batch();
  CHECK(d.costs() == (std::vector<double>{3, 6, 12, 24}));
  CHECK_EQ(d.elements(of({5})), 15.0);  // any request, not only a gear
  // two inputs, one value carried by both: x [1, S] and mask [S]
  const GearDispatch two({"x", "mask"}, {{1, -1}, {-1}}, {{0, 1, 0}, {1, 0, 0}}, {{2}, {4}});
  CHECK(two.costs() == (std::vector<double>{4, 8}));
  CHECK_THROWS_ERROR(two.elements(of({1, 2})), "length", "145012", "have 2 values");
}

TEST(dispatch_match_and_cover_by_elements) {
  const GearDispatch d = batch();
  CHECK_EQ(d.match(of({4})), 2u);
  CHECK_THROWS_ERROR(d.match(of({3})), "mismatch", "145013",
                     "dynamic dims (3,) match no gear of the model (inputs: data axis 0)");
  CHECK_EQ(d.cover(of({3})), 2u);  // the smallest covering gear: the cheapest by elements
  CHECK_EQ(d.cover(of({8})), 3u);
  CHECK_EQ(d.cover(of({1})), 0u);
  CHECK_THROWS_ERROR(d.cover(of({9})), "mismatch", "145013", "the largest gear is (8,)");
  const V nine{9}, five{5};
  CHECK_EQ(d.find_cover(nine.data()), -1);
  CHECK_EQ(d.find_cover(five.data()), 3);
}

TEST(dispatch_cover_follows_measured_costs) {
  // gear 8 measured faster than gear 4: rows 3..8 go to gear 8, rows 1 and 2 stay
  const GearDispatch d = batch(std::vector<double>{1.0, 2.0, 5.0, 3.0});
  CHECK_EQ(d.cover(of({3})), 3u);
  CHECK_EQ(d.cover(of({2})), 1u);
  CHECK_EQ(d.cover(of({4})), 2u);  // an exact gear is always itself
  CHECK(d.costs() == (std::vector<double>{1.0, 2.0, 5.0, 3.0}));
}

TEST(dispatch_refuses_bad_costs) {
  // The costs are fixed at construction (other costs make another dispatch).
  CHECK_THROWS_ERROR(batch(std::vector<double>{1.0, 2.0}), "input", "145000",
                     "2 gear costs for 4 gears");
  CHECK_THROWS_ERROR(batch(std::vector<double>{1.0, -2.0, 3.0, 4.0}), "input", "145000",
                     "gear 1 cost must be finite and >= 0");
  const GearDispatch d = batch();
  CHECK(d.costs() == (std::vector<double>{3, 6, 12, 24}));
  CHECK_EQ(d.cover(of({3})), 2u);
}

TEST(dispatch_extract_and_full_dims) {
  const GearDispatch d = batch();
  const int64_t shape[2] = {4, 3};
  const ArrayView view{true, {}, nullptr, shape, 2, true};
  CHECK(d.extract(&view, 1) == V{4});
  const ArrayView list{false, "list", nullptr, nullptr, 0, true};
  CHECK_THROWS_ERROR(d.extract(&list, 1), "input", "145000",
                     "input 'data' must be a numpy.ndarray, got list");
  CHECK_THROWS_ERROR(d.extract(&view, 0), "input", "145000", "expected 1 input arrays");
  const int64_t bad[2] = {4, 5};
  const ArrayView wrong{true, {}, nullptr, bad, 2, true};
  CHECK_THROWS_ERROR(d.extract(&wrong, 1), "length", "145012", "data");
  CHECK(d.values_from_full_dims(of({8, 3})) == V{8});
}

TEST(dispatch_positions_are_checked) {
  CHECK_THROWS_ERROR(GearDispatch({"x"}, {{-1}}, {{0, 0}}, {{1}}), "input", "145000",
                     "dynamic_positions[0] must have 3 values");
  CHECK_THROWS_ERROR(GearDispatch({"x"}, {{-1}}, {{0, -1, 0}}, {{1}}), "input", "145000",
                     "has a negative value");
  CHECK_THROWS_ERROR(GearDispatch({"x"}, {{-1}}, {{0, 0, 0}}, {}), "spec", "E10035", "no gears");
}
