// Layout: GE's merged host-to-device copy plan (fusion size, >= 2 buffers, alignment).
#include <algorithm>
#include <cstdint>
#include <ostream>
#include <utility>
#include <vector>

#include "check.h"
#include "layout.h"

using gear_runtime::kDefaultFusionSize;
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

// ---- tail_padding (pyACL: each buffer carved from one aclrtMalloc block owns
// ALIGN_UP(len, 32) + 32 bytes from a 64-aligned start) ----------------------------------------

namespace {

// Every accessor of two layouts, compared one by one.
void check_same_layout(const Layout& a, const Layout& b) {
  CHECK_EQ(a.gear_count(), b.gear_count());
  CHECK_EQ(a.input_count(), b.input_count());
  CHECK_EQ(a.merged(), b.merged());
  CHECK_EQ(a.dims_nbytes(), b.dims_nbytes());
  CHECK_EQ(a.total_bytes(), b.total_bytes());
  CHECK_EQ(a.alignment(), b.alignment());
  CHECK_EQ(a.tail_padding(), b.tail_padding());
  CHECK_EQ(a.repr(), b.repr());
  for (size_t i = 0; i < a.input_count(); ++i) CHECK_EQ(a.fused(i), b.fused(i));
  for (size_t g = 0; g < a.gear_count(); ++g) {
    CHECK_EQ(a.dims_offset(g), b.dims_offset(g));
    CHECK_EQ(a.merged_span(g), b.merged_span(g));
    CHECK(a.separate(g) == b.separate(g));
    for (size_t i = 0; i < a.input_count(); ++i) {
      CHECK_EQ(a.offset(g, i), b.offset(g, i));
      CHECK_EQ(a.nbytes(g, i), b.nbytes(g, i));
    }
  }
}

size_t align32(size_t n) { return (n + 31) / 32 * 32; }

// The pyACL rule on every buffer of every gear: start % 64 == 0 and the distance to the next
// buffer's start (or to total_bytes) >= ALIGN_UP(len, 32) + 32.
void check_acl_rule(const Layout& l) {
  for (size_t g = 0; g < l.gear_count(); ++g) {
    std::vector<std::pair<size_t, size_t>> bufs;  // (start, nbytes), sorted below
    for (size_t i = 0; i < l.input_count(); ++i) bufs.emplace_back(l.offset(g, i), l.nbytes(g, i));
    if (l.dims_nbytes() > 0) bufs.emplace_back(l.dims_offset(g), l.dims_nbytes());
    std::sort(bufs.begin(), bufs.end());
    for (size_t k = 0; k < bufs.size(); ++k) {
      const size_t limit = k + 1 < bufs.size() ? bufs[k + 1].first : l.total_bytes();
      CHECK_EQ(bufs[k].first % 64, 0u);
      CHECK(bufs[k].first + align32(bufs[k].second) + 32 <= limit);
    }
  }
}

}  // namespace

TEST(layout_tail_padding_zero_is_the_packed_layout) {
  const Table tables[] = {{{100, 10}, {200, 20}}, {{16, 1000}, {32, 5000}}, {{0, 3}, {5, 3}},
                          {{16, 16}}};
  for (const Table& t : tables) {
    for (int64_t fusion : {int64_t{-1}, int64_t{4096}, kDefaultFusionSize}) {
      for (size_t dims : {size_t{0}, size_t{3}}) {
        check_same_layout(Layout::plan(t, dims, fusion, 64, 0), Layout::plan(t, dims, fusion, 64));
      }
    }
  }
  CHECK_EQ(Layout::plan({{1}}, 1).tail_padding(), 0u);
}

TEST(layout_tail_padding_32_by_hand) {
  // inputs 100/10/5000 (gear 0) and 200/20/9000 (gear 1), 3 dims values, fusion 4096:
  // gear 1: input 0 at 0 owns ALIGN_UP(200,32)+32 = 256, input 1 at 256 owns 32+32 = 64,
  // dims at 320 own 32+32 = 64 (merged end 384), input 2 at 384 owns 9024+32 -> 9440.
  Layout l = Layout::plan({{100, 10, 5000}, {200, 20, 9000}}, 3, 4096, 64, 32);
  CHECK_EQ(l.tail_padding(), 32u);
  CHECK_EQ(l.offset(1, 0), 0u);
  CHECK_EQ(l.offset(1, 1), 256u);
  CHECK_EQ(l.dims_offset(1), 320u);
  CHECK_EQ(l.merged_span(1), (Span{0, 384}));  // covers the dims buffer's padding
  CHECK_EQ(l.offset(1, 2), 384u);
  CHECK_EQ(l.nbytes(1, 2), 9000u);  // sizes stay the real ones
  CHECK_EQ(l.dims_nbytes(), 12u);
  std::vector<Span> sep = l.separate(1);
  CHECK_EQ(sep.size(), 1u);
  CHECK_EQ(sep[0], (Span{384, 9384}));  // separate spans: the data only
  CHECK_EQ(l.total_bytes(), 9440u);
  // gear 0: 100 -> 160, so input 1 at 192 (aligned), dims at 256, merged end 320.
  CHECK_EQ(l.offset(0, 1), 192u);
  CHECK_EQ(l.dims_offset(0), 256u);
  CHECK_EQ(l.merged_span(0), (Span{0, 320}));
  CHECK_EQ(l.repr(), "Layout(gears=2, inputs=3, merged=True, total_bytes=9440, tail_padding=32)");
  check_acl_rule(l);
}

TEST(layout_tail_padding_zero_byte_buffers) {
  // A 0-byte input still owns its padding; no dims buffer (dims_count 0) owns nothing.
  Layout l = Layout::plan({{0, 3}}, 0, -1, 64, 32);
  CHECK(!l.merged());
  CHECK_EQ(l.offset(0, 0), 0u);
  CHECK_EQ(l.offset(0, 1), 64u);
  CHECK_EQ(l.total_bytes(), 128u);
  // merged without a dims buffer: the span ends where the dims buffer would start.
  Layout m = Layout::plan({{16, 16}}, 0, kDefaultFusionSize, 64, 32);
  CHECK(m.merged());
  CHECK_EQ(m.offset(0, 1), 64u);
  CHECK_EQ(m.merged_span(0), (Span{0, 128}));
  CHECK_EQ(m.total_bytes(), 128u);
}

TEST(layout_tail_padding_any_value_and_alignment) {
  // Padding not a multiple of anything, alignment 1: every footprint is ALIGN_UP(n,32)+1.
  Layout l = Layout::plan({{5, 3}}, 1, kDefaultFusionSize, 1, 1);
  CHECK_EQ(l.offset(0, 1), 33u);
  CHECK_EQ(l.dims_offset(0), 66u);
  CHECK_EQ(l.merged_span(0), (Span{0, 99}));
  CHECK_EQ(l.total_bytes(), 99u);
}

TEST(layout_tail_padding_keeps_the_acl_rule) {
  const Table tables[] = {{{100, 10}, {200, 20}}, {{16, 1000}, {32, 5000}}, {{0, 3}, {5, 3}},
                          {{16, 16}}, {{32, 64, 96}, {1, 2, 31}, {33, 65, 97}}};
  for (const Table& t : tables) {
    for (int64_t fusion : {int64_t{-1}, int64_t{40}, kDefaultFusionSize}) {
      for (size_t dims : {size_t{0}, size_t{1}, size_t{8}, size_t{9}}) {
        check_acl_rule(Layout::plan(t, dims, fusion, 64, 32));
      }
    }
  }
}

TEST(layout_tail_padding_errors) {
  CHECK_THROWS_ERROR(Layout::plan({{1}}, 1, 10, 64, -1), "input", "145000",
                     "tail_padding must be >= 0, got -1");
  // the alignment is checked first, as in the Python reference
  CHECK_THROWS_ERROR(Layout::plan({{1}}, 1, 10, 48, -1), "input", "145000", "alignment");
  // fits packed, overflows once ALIGN_UP(n, 32) + 32 is owned
  Layout packed = Layout::plan({{SIZE_MAX - 40}}, 0, -1, 1, 0);
  CHECK_EQ(packed.total_bytes(), SIZE_MAX - 40);
  CHECK_THROWS_ERROR(Layout::plan({{SIZE_MAX - 40}}, 0, -1, 1, 32), "input", "145000",
                     "overflows");
}
