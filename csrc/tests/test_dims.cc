// DimsExtractor: GetCurDynamicDims from shapes and from full dims, GE's 145012 checks.
#include <cstdint>
#include <string>
#include <vector>

#include "check.h"
#include "dims.h"

using gear_runtime::DimsExtractor;
using gear_runtime::DynamicPosition;
using gear_runtime::ShapeRef;
using V = std::vector<int64_t>;

namespace {

// dims mode, the documented example (docs/ge-notes.md section 8): x:1,-1;m:-1,-1
// with gears like 20,1,1.
DimsExtractor dims_mode() {
  return DimsExtractor({"x", "m"}, {{1, -1}, {-1, -1}}, {{0, 1, 0}, {1, 0, 1}, {1, 1, 2}});
}

// batch mode: every -1 carries value 0.
DimsExtractor batch_mode() {
  return DimsExtractor({"a", "b"}, {{-1, 3}, {-1, 4}}, {{0, 0, 0}, {1, 0, 0}});
}

// image mode: img:1,3,-1,-1 -> H value 0, W value 1.
DimsExtractor image_mode() {
  return DimsExtractor({"img"}, {{1, 3, -1, -1}}, {{0, 2, 0}, {0, 3, 1}});
}

}  // namespace

TEST(dims_extract_dims_mode) {
  DimsExtractor d = dims_mode();
  CHECK_EQ(d.values_per_gear(), 3u);
  CHECK_EQ(d.total_rank(), 4u);
  CHECK_EQ(d.dynamic_axes_text(), std::string("x axis 1; m axes 0, 1"));
  V x{1, 20}, m{1, 2};
  ShapeRef shapes[2] = {{x.data(), 2}, {m.data(), 2}};
  int64_t out[3] = {-7, -7, -7};
  d.extract(shapes, 2, out);
  CHECK_EQ(out[0], 20);
  CHECK_EQ(out[1], 1);
  CHECK_EQ(out[2], 2);
}

TEST(dims_extract_batch_and_image) {
  DimsExtractor b = batch_mode();
  CHECK_EQ(b.values_per_gear(), 1u);
  V a{8, 3}, bb{8, 4};
  ShapeRef shapes[2] = {{a.data(), 2}, {bb.data(), 2}};
  int64_t out[1] = {0};
  b.extract(shapes, 2, out);
  CHECK_EQ(out[0], 8);

  DimsExtractor i = image_mode();
  V img{1, 3, 224, 448};
  ShapeRef s[1] = {{img.data(), 4}};
  int64_t hw[2] = {0, 0};
  i.extract(s, 1, hw);
  CHECK_EQ(hw[0], 224);
  CHECK_EQ(hw[1], 448);
}

TEST(dims_extract_errors) {
  DimsExtractor d = dims_mode();
  int64_t out[3];
  V x{1, 20}, m{1, 2}, x3{1, 20, 1}, xs{2, 20};
  ShapeRef ok[2] = {{x.data(), 2}, {m.data(), 2}};
  CHECK_THROWS_ERROR(d.extract(ok, 1, out), "input", "145000", "expected 2 input arrays (x, m), got 1");
  ShapeRef rank[2] = {{x3.data(), 3}, {m.data(), 2}};
  CHECK_THROWS_ERROR(d.extract(rank, 2, out), "length", "145012",
                     "input 'x' has 3 dims, the model's input has 2");
  ShapeRef fixed[2] = {{xs.data(), 2}, {m.data(), 2}};
  CHECK_THROWS_ERROR(d.extract(fixed, 2, out), "length", "145012",
                     "input 'x' axis 0 is 2 but the model fixes it to 1");
}

TEST(dims_extract_positions_must_agree) {
  DimsExtractor b = batch_mode();
  V a{8, 3}, bb{4, 4};
  ShapeRef shapes[2] = {{a.data(), 2}, {bb.data(), 2}};
  int64_t out[1];
  CHECK_THROWS_ERROR(b.extract(shapes, 2, out), "length", "145012",
                     "input 'b' axis 0 is 4 but input 'a' axis 0 is 8, and both carry gear value 0");
}

TEST(dims_from_full_dims) {
  DimsExtractor d = dims_mode();
  V full{1, 40, 2, 3};
  int64_t out[3];
  d.from_full_dims(full.data(), 4, out);
  CHECK_EQ(out[0], 40);
  CHECK_EQ(out[1], 2);
  CHECK_EQ(out[2], 3);
  CHECK_THROWS_ERROR(d.from_full_dims(full.data(), 3, out), "length", "145012",
                     "full dims have 3 values, the model's inputs have 4 dims in all (x:2, m:2)");
  V bad{5, 40, 2, 3};
  CHECK_THROWS_ERROR(d.from_full_dims(bad.data(), 4, out), "length", "145012",
                     "input 'x' axis 0 is 5 but the model fixes it to 1");
}

TEST(dims_gear_shape) {
  DimsExtractor d = dims_mode();
  V gear{20, 1, 2};
  CHECK(d.gear_shape(0, gear.data()) == (V{1, 20}));
  CHECK(d.gear_shape(1, gear.data()) == (V{1, 2}));
}

TEST(dims_spec_validation) {
  CHECK_THROWS_ERROR(DimsExtractor({"x"}, {{1, -1}}, {{1, 0, 0}}), "spec", "",
                     "dynamic position 0 (1, 0, 0) names input 1, the model has 1 inputs");
  CHECK_THROWS_ERROR(DimsExtractor({"x"}, {{1, -1}}, {{0, 2, 0}}), "spec", "",
                     "names axis 2 of input 'x', which has 2 dims");
  CHECK_THROWS_ERROR(DimsExtractor({"x"}, {{1, -1}}, {{0, 0, 0}}), "spec", "",
                     "names input 'x' axis 0, which the model fixes to 1");
  CHECK_THROWS_ERROR(DimsExtractor({"x"}, {{-1, -1}}, {{0, 0, 0}, {0, 0, 1}}), "spec", "",
                     "repeats input 'x' axis 0");
  CHECK_THROWS_ERROR(DimsExtractor({"x"}, {{-1, -1}}, {{0, 0, 0}}), "spec", "",
                     "input 'x' axis 1 is -1 but no dynamic position maps it to a gear value");
  CHECK_THROWS_ERROR(DimsExtractor({"x"}, {{-1, -1}}, {{0, 0, 0}, {0, 1, 2}}), "spec", "",
                     "no dynamic position carries gear value 1 (values 0..2 must all be used)");
  CHECK_THROWS_ERROR(DimsExtractor({"x"}, {{-2}}, {}), "spec", "", "input 'x' axis 0 is -2");
  CHECK_THROWS_ERROR(DimsExtractor({"x"}, {{-1}}, {{0, 0, 128}}), "spec", "",
                     "names gear value 128, GE allows at most 128 dynamic values");
  CHECK_THROWS_ERROR(DimsExtractor({"x", "y"}, {{1}}, {}), "spec", "", "2 input names but 1");
}
