// GearTable: exact O(1) lookup, validation with GE's codes, nearest gears, 145013 text.
#include <cstdint>
#include <string>
#include <vector>

#include "check.h"
#include "gear_table.h"

using gear_runtime::GearTable;
using V = std::vector<int64_t>;

TEST(gear_table_finds_every_gear_and_nothing_else) {
  GearTable t({{20, 1, 1}, {40, 2, 2}, {40, 2, 3}}, 3);
  CHECK_EQ(t.gear_count(), 3u);
  CHECK_EQ(t.values_per_gear(), 3u);
  V a{20, 1, 1}, b{40, 2, 2}, c{40, 2, 3}, miss{40, 3, 2};
  CHECK_EQ(t.find(a.data(), 3), 0);
  CHECK_EQ(t.find(b.data(), 3), 1);
  CHECK_EQ(t.find(c.data(), 3), 2);
  CHECK_EQ(t.find(miss.data(), 3), -1);
  CHECK_EQ(t.find(a.data(), 2), -1);  // wrong length never matches
}

TEST(gear_table_hundred_gears_all_found) {
  std::vector<V> gears;
  for (int64_t g = 0; g < 100; ++g) gears.push_back({g * 3 + 1, g % 7});
  GearTable t(gears, 2);
  for (int64_t g = 0; g < 100; ++g) CHECK_EQ(t.find(gears[g].data(), 2), g);
  for (int64_t g = 0; g < 100; ++g) {
    V miss{g * 3 + 2, g % 7};
    CHECK_EQ(t.find(miss.data(), 2), -1);
  }
}

TEST(gear_table_zero_values_per_gear) {
  GearTable t({{}}, 0);
  CHECK_EQ(t.find(nullptr, 0), 0);
  CHECK_THROWS_ERROR(GearTable({{}, {}}, 0), "spec", "E10039", "gear 1 () repeats gear 0");
}

TEST(gear_table_validation_codes) {
  CHECK_THROWS_ERROR(GearTable({}, 1), "spec", "E10035", "no gears");
  CHECK_THROWS_ERROR(GearTable({{1}, {2, 3}}, 1), "spec", "E10037",
                     "gear 1 (2, 3) has 2 values, the model's inputs have 1 dynamic values");
  CHECK_THROWS_ERROR(GearTable({{1}, {-2}}, 1), "spec", "E10038",
                     "gear 1 (-2,) has value -2 outside [0, 2147483647]");
  CHECK_THROWS_ERROR(GearTable({{1}, {2147483648LL}}, 1), "spec", "E10038", "outside");
  CHECK_THROWS_ERROR(GearTable({{1, 2}, {3, 4}, {1, 2}}, 2), "spec", "E10039",
                     "gear 2 (1, 2) repeats gear 0");
}

TEST(gear_table_nearest_orders_by_l1_then_index) {
  GearTable t({{1}, {8}, {16}, {6}, {10}}, 1);
  V v{8};
  std::vector<size_t> n = t.nearest(v.data(), 1, 10);
  // distances: 7, 0, 8, 2, 2 -> 8 (0), 6 (2, index 3), 10 (2, index 4), 1 (7), 16 (8)
  CHECK_EQ(n.size(), 5u);
  CHECK(n == (std::vector<size_t>{1, 3, 4, 0, 2}));
  CHECK_EQ(t.nearest(v.data(), 1, 2).size(), 2u);
  CHECK_EQ(t.nearest(v.data(), 1, 0).size(), 0u);
}

TEST(gear_table_nearest_exact_for_huge_values) {
  GearTable t({{0, 0}, {2147483647, 2147483647}}, 2);
  V v{INT64_MAX, INT64_MIN};  // distances would overflow int64
  std::vector<size_t> n = t.nearest(v.data(), 2, 2);
  // both L1 distances are exactly 2^64 - 1: they overflow int64 and uint64 arithmetic
  CHECK_EQ(n.size(), 2u);
  CHECK_EQ(n[0], 0u);  // equal distance: lower index first
}

TEST(gear_table_mismatch_message_text) {
  GearTable t({{1}, {8}, {16}}, 1);
  V v{17};
  CHECK_EQ(t.mismatch_message(v.data(), 1, "data axis 0"),
           std::string("dynamic dims (17,) match no gear of the model (inputs: data axis 0); "
                       "legal gears, nearest first: (16,), (8,), (1,)"));
}

TEST(gear_table_mismatch_message_shows_eight_then_more) {
  std::vector<V> gears;
  for (int64_t g = 1; g <= 20; ++g) gears.push_back({g});
  GearTable t(gears, 1);
  V v{100};
  CHECK_EQ(t.legal_gears_text(v.data(), 1),
           std::string("(20,), (19,), (18,), (17,), (16,), (15,), (14,), (13,), ... and 12 more"));
}
