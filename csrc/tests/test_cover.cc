// Coverer: the cheapest covering gear (by size, by measured cost), keyed tables (dense and
// sparse), the scan for independent values, cost validation.
#include <cstdint>
#include <vector>

#include "check.h"
#include "cover.h"

using gear_runtime::Coverer;
using gear_runtime::GearTable;

TEST(coverer_cheapest_covering_gear) {
  GearTable one({{4}, {8}, {16}}, 1);
  Coverer by_size(one, {4, 8, 16});
  int64_t v[1] = {5};
  CHECK_EQ(by_size.find(v, 1), 1);
  v[0] = 17;
  CHECK_EQ(by_size.find(v, 1), -1);
  Coverer measured(one, {5, 1, 2});  // gear 8 cheapest: it serves everything up to 8
  v[0] = 2;
  CHECK_EQ(measured.find(v, 1), 1);
  CHECK(measured.keyed());
  // tied values + a constant one: keyed; independent values: the scan
  GearTable tied({{4, 4, 16}, {9, 9, 16}}, 3);
  Coverer t(tied, {1, 2});
  int64_t r[3] = {3, 5, 16};
  CHECK(t.keyed());
  CHECK_EQ(t.find(r, 3), 1);
  r[2] = 17;
  CHECK_EQ(t.find(r, 3), -1);
  GearTable two({{2, 8}, {8, 2}, {8, 8}}, 2);
  Coverer s(two, {16, 16, 64});
  int64_t q[2] = {3, 2};
  CHECK(!s.keyed());
  CHECK_EQ(s.find(q, 2), 1);
  CHECK_THROWS_ERROR(Coverer(two, {1, 2}), "input", "145000", "2 gear costs for 3 gears");
  // beyond the dense table: binary search over the keys
  GearTable sparse({{10}, {70000}, {200000}}, 1);
  Coverer big(sparse, {10, 70000, 200000});
  int64_t w[1] = {70001};
  CHECK_EQ(big.find(w, 1), 2);
}
