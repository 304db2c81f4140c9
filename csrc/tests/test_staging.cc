// Stager: bytes land at the layout's offsets, dims as int32, every bound checked.
#include <cstdint>
#include <cstring>
#include <string>
#include <vector>

#include "check.h"
#include "staging.h"

using gear_runtime::Layout;
using gear_runtime::StageSource;
using gear_runtime::Stager;

TEST(staging_copies_to_offsets_and_writes_dims) {
  Layout l = Layout::plan({{4, 8}, {8, 16}}, 2, 131072, 64);
  std::vector<uint8_t> buf(l.total_bytes() + 32, 0xEE);
  Stager s(l, buf.data(), buf.size());
  std::vector<uint8_t> a(8), b(16);
  for (size_t k = 0; k < a.size(); ++k) a[k] = static_cast<uint8_t>(k + 1);
  for (size_t k = 0; k < b.size(); ++k) b[k] = static_cast<uint8_t>(100 + k);
  StageSource src[2] = {{a.data(), a.size()}, {b.data(), b.size()}};
  int64_t values[2] = {7, 300};
  std::string names[2] = {"a", "b"};
  s.stage(1, src, 2, values, 2, names);
  CHECK(std::memcmp(buf.data() + l.offset(1, 0), a.data(), a.size()) == 0);
  CHECK(std::memcmp(buf.data() + l.offset(1, 1), b.data(), b.size()) == 0);
  int32_t dims[2];
  std::memcpy(dims, buf.data() + l.dims_offset(1), sizeof(dims));
  CHECK_EQ(dims[0], 7);
  CHECK_EQ(dims[1], 300);
  // padding between slots and the tail are untouched
  CHECK_EQ(buf[l.offset(1, 0) + a.size()], 0xEE);
  CHECK_EQ(buf[l.total_bytes()], 0xEE);
}

TEST(staging_rejects_what_does_not_fit) {
  Layout l = Layout::plan({{4, 8}}, 1, 131072, 64);
  std::vector<uint8_t> buf(l.total_bytes());
  CHECK_THROWS_ERROR(Stager(l, buf.data(), l.total_bytes() - 1), "input", "145000",
                     "staging buffer has 131 bytes, the layout needs 132");
  Stager s(l, buf.data(), buf.size());
  std::vector<uint8_t> a(4), big(9);
  StageSource src[2] = {{a.data(), 4}, {big.data(), 9}};
  int64_t values[1] = {3};
  std::string names[2] = {"a", "b"};
  CHECK_THROWS_ERROR(s.check(0, src, 2, values, 1, names), "input", "145000",
                     "input 'b' has 9 bytes, more than its slot of 8 bytes in gear 0");
  CHECK_THROWS_ERROR(s.check(0, src, 2, values, 1, nullptr), "input", "145000", "input #1");
  CHECK_THROWS_ERROR(s.check(1, src, 2, values, 1, names), "input", "145000",
                     "gear index 1 out of range");
  CHECK_THROWS_ERROR(s.check(0, src, 1, values, 1, names), "input", "145000",
                     "expected 2 inputs to stage, got 1");
  src[1].nbytes = 8;
  CHECK_THROWS_ERROR(s.check(0, src, 2, values, 0, names), "input", "145000",
                     "0 dynamic values do not fill the layout's dims buffer of 4 bytes");
  int64_t huge[1] = {int64_t(1) << 40};
  CHECK_THROWS_ERROR(s.check(0, src, 2, huge, 1, names), "input", "145000", "does not fit int32");
}

TEST(staging_aliasing) {
  Layout l = Layout::plan({{8, 8}}, 1, 131072, 64);
  std::vector<uint8_t> buf(l.total_bytes(), 0);
  Stager s(l, buf.data(), buf.size());
  // input 0 already sits in its slot (zero copy): accepted and left as is.
  std::memset(buf.data() + l.offset(0, 0), 0x5A, 8);
  std::vector<uint8_t> other(8, 0x11);
  StageSource own[2] = {{buf.data() + l.offset(0, 0), 8}, {other.data(), 8}};
  int64_t values[1] = {1};
  s.stage(0, own, 2, values, 1);
  CHECK_EQ(buf[l.offset(0, 0)], 0x5A);
  CHECK_EQ(buf[l.offset(0, 1)], 0x11);
  // input 1 pointing into input 0's slot: an overlap, not allowed.
  StageSource wrong[2] = {{other.data(), 8}, {buf.data() + l.offset(0, 0) + 4, 8}};
  CHECK_THROWS_ERROR(s.check(0, wrong, 2, values, 1, nullptr), "input", "145000",
                     "input #1 overlaps the staging buffer but is not its own slot in gear 0");
}

TEST(pad_copy_right_pads_every_axis_once) {
  // src [2, 3] int16 into dst [3, 5], pad 0x0102 (non-uniform bytes: the pattern path)
  const int64_t src_shape[2] = {2, 3}, dst_shape[2] = {3, 5};
  int16_t src[6] = {1, 2, 3, 4, 5, 6};
  int16_t dst[15];
  const int16_t pad = 0x0102;
  gear_runtime::pad_copy(reinterpret_cast<uint8_t*>(dst), dst_shape,
                         reinterpret_cast<const uint8_t*>(src), src_shape, 2, 2,
                         reinterpret_cast<const uint8_t*>(&pad));
  const int16_t want[15] = {1, 2, 3, pad, pad, 4, 5, 6, pad, pad, pad, pad, pad, pad, pad};
  for (int k = 0; k < 15; ++k) CHECK_EQ(dst[k], want[k]);
  // equal shapes: a plain copy
  int16_t same[6] = {0};
  gear_runtime::pad_copy(reinterpret_cast<uint8_t*>(same), src_shape,
                         reinterpret_cast<const uint8_t*>(src), src_shape, 2, 2,
                         reinterpret_cast<const uint8_t*>(&pad));
  CHECK(std::memcmp(same, src, sizeof(src)) == 0);
}

TEST(staging_padded_source_must_fit_and_not_alias) {
  Layout l = Layout::plan({{16}}, 1, 131072, 64);
  std::vector<uint8_t> buf(l.total_bytes(), 0xEE);
  Stager s(l, buf.data(), buf.size());
  const int64_t have[1] = {3}, slot[1] = {4}, big[1] = {5};
  const uint8_t pad[4] = {9, 9, 9, 9};
  std::vector<uint8_t> a(12, 1);
  StageSource src[1] = {{a.data(), 12, have, slot, 1, 4, pad}};
  int64_t values[1] = {4};
  std::string names[1] = {"a"};
  s.stage(0, src, 1, values, 1, names);
  CHECK_EQ(buf[l.offset(0, 0) + 11], 1);
  CHECK_EQ(buf[l.offset(0, 0) + 12], 9);
  StageSource wide[1] = {{a.data(), 12, big, slot, 1, 4, pad}};
  CHECK_THROWS_ERROR(s.check(0, wide, 1, values, 1, names), "input", "145000",
                     "does not fit its padded shape");
  StageSource inside[1] = {{buf.data() + l.offset(0, 0), 12, have, slot, 1, 4, pad}};
  CHECK_THROWS_ERROR(s.check(0, inside, 1, values, 1, names), "input", "145000",
                     "overlaps the staging buffer and must be padded");
}
