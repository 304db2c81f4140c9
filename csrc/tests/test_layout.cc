// Layout: GE's merged host-to-device copy plan (fusion size, >= 2 buffers, alignment).
#include <cstdint>
#include <ostream>
#include <vector>

#include "check.h"
#include "layout.h"

using gear_runtime::Layout;
using gear_runtime::Span;
using Table = std::vector<std::vector<size_t>>;

namespace gear_runtime {  // found by ADL from check_eq
std::ostream& operator<<(std::ostream& os, const Span& s) {
  return os << "(" << s.start << ", " << s.end << ")";
}
}  // namespace gear_runtime

TEST(layout_two_small_inputs_merge_with_dims) {
  // 2 gears, inputs of 100 and 10 bytes (gear 0) / 200 and 20 (gear 1), 3 dims values.
  Layout l = Layout::plan({{100, 10}, {200, 20}}, 3, 131072, 64);
  CHECK(l.merged());
  CHECK(l.fused(0));
  CHECK(l.fused(1));
  CHECK_EQ(l.offset(0, 0), 0u);
  CHECK_EQ(l.offset(0, 1), 128u);
  CHECK_EQ(l.dims_offset(0), 192u);
  CHECK_EQ(l.dims_nbytes(), 12u);
  CHECK_EQ(l.merged_span(0), (Span{0, 204}));
  CHECK_EQ(l.offset(1, 1), 256u);
  CHECK_EQ(l.dims_offset(1), 320u);
  CHECK_EQ(l.merged_span(1), (Span{0, 332}));
  CHECK(l.separate(0).empty());
  CHECK_EQ(l.total_bytes(), 332u);
}

TEST(layout_big_input_is_separate) {
  // input 1 is small in gear 0 but too big in gear 1: its LARGEST size decides.
  Layout l = Layout::plan({{16, 1000}, {32, 5000}}, 1, 4096, 64);
  CHECK(l.merged());  // input 0 + dims = two buffers
  CHECK(l.fused(0));
  CHECK(!l.fused(1));
  CHECK_EQ(l.offset(1, 0), 0u);
  CHECK_EQ(l.dims_offset(1), 64u);
  CHECK_EQ(l.merged_span(1), (Span{0, 68}));
  CHECK_EQ(l.offset(1, 1), 128u);
  std::vector<Span> sep = l.separate(1);
  CHECK_EQ(sep.size(), 1u);
  CHECK_EQ(sep[0], (Span{128, 5128}));
  CHECK_EQ(l.total_bytes(), 5128u);
}

TEST(layout_needs_two_buffers_to_merge) {
  // one small input, no dims buffer: one buffer only -> no merged copy at all.
  Layout l = Layout::plan({{16}, {32}}, 0, 131072, 64);
  CHECK(!l.merged());
  CHECK(!l.fused(0));
  CHECK_EQ(l.merged_span(0), (Span{0, 0}));
  CHECK_EQ(l.offset(0, 0), 0u);
  CHECK_EQ(l.separate(1).size(), 1u);
  CHECK_EQ(l.separate(1)[0], (Span{0, 32}));
  // the same input with a dims buffer: two buffers -> merged.
  Layout m = Layout::plan({{16}, {32}}, 1, 131072, 64);
  CHECK(m.merged());
  CHECK_EQ(m.merged_span(1), (Span{0, 68}));
}

TEST(layout_merging_off_when_negative) {
  Layout l = Layout::plan({{16, 16}}, 2, -1, 64);
  CHECK(!l.merged());
  CHECK_EQ(l.dims_offset(0), 0u);  // dims first, then the inputs
  CHECK_EQ(l.offset(0, 0), 64u);
  CHECK_EQ(l.offset(0, 1), 128u);
  std::vector<Span> sep = l.separate(0);
  CHECK_EQ(sep.size(), 3u);
  CHECK_EQ(sep[0], (Span{0, 8}));
  CHECK_EQ(sep[2], (Span{128, 144}));
}

TEST(layout_fusion_size_capped_at_32_mib) {
  const size_t mib = 1024 * 1024;
  Layout l = Layout::plan({{32 * mib, 32 * mib + 1}}, 1, 1LL << 40, 64);
  CHECK(l.fused(0));
  CHECK(!l.fused(1));
}

TEST(layout_zero_byte_inputs_and_alignment_one) {
  Layout l = Layout::plan({{0, 3}, {5, 3}}, 1, 131072, 1);
  CHECK(l.merged());
  CHECK_EQ(l.offset(1, 1), 5u);
  CHECK_EQ(l.dims_offset(1), 8u);
  CHECK_EQ(l.total_bytes(), 12u);
}

TEST(layout_errors) {
  CHECK_THROWS_ERROR(Layout::plan({}, 1), "input", "145000", "no gears");
  CHECK_THROWS_ERROR(Layout::plan({{1, 2}, {1}}, 1), "input", "145000",
                     "input_nbytes row 1 has 1 inputs, row 0 has 2");
  CHECK_THROWS_ERROR(Layout::plan({{1}}, 1, 10, 48), "input", "145000",
                     "alignment must be a power of two >= 1, got 48");
  CHECK_THROWS_ERROR(Layout::plan({{SIZE_MAX - 10, 100}}, 1, -1, 64), "input", "145000",
                     "overflows");
  Layout l = Layout::plan({{1}}, 1);
  CHECK_THROWS_ERROR(l.offset(1, 0), "input", "145000",
                     "gear index 1 out of range: the layout has 1 gears");
  CHECK_THROWS_ERROR(l.nbytes(0, 3), "input", "145000",
                     "input index 3 out of range: the layout has 1 inputs");
}
