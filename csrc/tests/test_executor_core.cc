// ExecutorCore: the hot path over plain views -- match, cover, extract, stage (plain and
// padded), the order of its checks, and scratch of its own per call.
#include <cstdint>
#include <cstring>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "check.h"
#include "executor_core.h"

using gear_runtime::ArrayView;
using gear_runtime::ExecutorCore;
using gear_runtime::GearDispatch;
using gear_runtime::InputSpec;
using gear_runtime::Layout;
using gear_runtime::PadValues;
using gear_runtime::plan_layout_checked;
using gear_runtime::Values;

namespace {

using Rows = std::vector<std::vector<int64_t>>;

// The model's dispatch over `inputs` (what the Python model builds once).
std::shared_ptr<const GearDispatch> dispatch_of(const std::vector<InputSpec>& inputs,
                                                const Rows& positions, const Rows& gears) {
  std::vector<std::string> names;
  Rows shapes;
  for (const InputSpec& in : inputs) names.push_back(in.name), shapes.push_back(in.shape);
  return std::make_shared<const GearDispatch>(names, shapes, positions, gears);
}

// A core over a dispatch of its own inputs.
ExecutorCore core_of(const std::vector<InputSpec>& inputs, const Rows& positions,
                     const Rows& gears, const Layout& layout, uint8_t* staging, size_t size) {
  return ExecutorCore(inputs, dispatch_of(inputs, positions, gears), layout, staging, size);
}

// x: float32 [1, S], mask: int64 [S]; gears S = 2, 4, 8 (value 0 carried by both inputs).
struct Model {
  Layout layout = Layout::plan({{8, 16}, {16, 32}, {32, 64}}, 1, 131072, 64);
  std::vector<uint8_t> staging = std::vector<uint8_t>(layout.total_bytes(), 0xEE);
  ExecutorCore core = core_of({{"x", {1, -1}, 4, "float32"}, {"mask", {-1}, 8, "int64"}},
                              {{0, 1, 0}, {1, 0, 0}}, {{2}, {4}, {8}}, layout, staging.data(),
                              staging.size());
};

struct Request {
  std::vector<float> x;
  std::vector<int64_t> mask;
  int64_t x_shape[2];
  int64_t mask_shape[1];
  ArrayView views[2];
  explicit Request(int64_t s) : x(static_cast<size_t>(s)), mask(static_cast<size_t>(s)) {
    for (int64_t k = 0; k < s; ++k) {
      x[static_cast<size_t>(k)] = static_cast<float>(k + 1);
      mask[static_cast<size_t>(k)] = 7;
    }
    x_shape[0] = 1;
    x_shape[1] = s;
    mask_shape[0] = s;
    views[0] = ArrayView{true, {}, x.data(), x_shape, 2, true};
    views[1] = ArrayView{true, {}, mask.data(), mask_shape, 1, true};
  }
};

template <typename T>
T at(const Model& m, size_t offset, size_t k) {
  T v;
  std::memcpy(&v, m.staging.data() + offset + k * sizeof(T), sizeof(T));
  return v;
}

}  // namespace

TEST(core_match_cover_and_their_errors) {
  Model m;
  const int64_t four[1] = {4}, five[1] = {5}, nine[1] = {9};
  CHECK_EQ(m.core.dispatch()->match({four, 1}), 1u);
  CHECK_EQ(m.core.dispatch()->cover({five, 1}), 2u);  // 8 is the only gear covering 5
  CHECK_EQ(m.core.dispatch()->cover({four, 1}), 1u);  // an exact gear is itself
  CHECK_THROWS_ERROR(m.core.dispatch()->match({five, 1}), "mismatch", "145013",
                     "dynamic dims (5,) match no gear of the model (inputs: x axis 1; mask "
                     "axis 0); the cheapest gear holding them is gear 2 (8,): "
                     "execute(pad=True) (gear-runtime run / bench: --pad) runs them there, "
                     "padded, the outputs trimmed to them; legal gears, nearest first: (4,), "
                     "(2,), (8,)");
  // nothing holds 9: no gear to pad to is named
  CHECK_THROWS_ERROR(m.core.dispatch()->match({nine, 1}), "mismatch", "145013",
                     "mask axis 0); legal gears, nearest first: (8,), (4,), (2,)");
  CHECK_THROWS_ERROR(m.core.dispatch()->cover({nine, 1}), "mismatch", "145013",
                     "the largest gear is (8,)");
  CHECK_THROWS_ERROR(m.core.dispatch()->match({four, 0}), "length", "145012",
                     "dynamic dims have 0 values, the model's gears have 1");
  CHECK_EQ(m.core.dispatch()->nearest({five, 1}, 2).size(), 2u);
  CHECK_THROWS_ERROR(m.core.dispatch()->nearest({five, 1}, -1), "input", "145000", "k must be >= 0");
}

TEST(core_stage_copies_inputs_and_dims) {
  Model m;
  Request r(4);
  CHECK(m.core.last_values().empty());
  CHECK_EQ(m.core.stage(r.views, 2, nullptr, false), 1u);
  for (size_t k = 0; k < 4; ++k) {
    CHECK_EQ(at<float>(m, m.layout.offset(1, 0), k), static_cast<float>(k + 1));
    CHECK_EQ(at<int64_t>(m, m.layout.offset(1, 1), k), 7);
  }
  CHECK_EQ(at<int32_t>(m, m.layout.dims_offset(1), 0), 4);
  CHECK(m.core.last_values() == std::vector<int64_t>{4});
  CHECK(m.core.last_request() == std::vector<int64_t>{4});
}

TEST(core_stage_pads_to_the_covering_gear) {
  Model m;
  m.core.set_padding(PadValues{std::nullopt, std::vector<uint8_t>(8, 0xFF)});
  Request r(3);
  CHECK_EQ(m.core.stage(r.views, 2, nullptr, true), 1u);
  CHECK_EQ(at<float>(m, m.layout.offset(1, 0), 2), 3.0f);
  CHECK_EQ(at<float>(m, m.layout.offset(1, 0), 3), 0.0f);  // default pad: zeros
  CHECK_EQ(at<int64_t>(m, m.layout.offset(1, 1), 3), -1);  // 0xFF.. pad value
  CHECK_EQ(at<int32_t>(m, m.layout.dims_offset(1), 0), 4);
  CHECK(m.core.last_values() == std::vector<int64_t>{4});
  CHECK(m.core.last_request() == std::vector<int64_t>{3});
  // bad pad values change nothing
  CHECK_THROWS_ERROR(m.core.set_padding(PadValues{std::vector<uint8_t>(3)}), "input", "145000",
                     "1 pad values for 2 inputs");
  CHECK_EQ(m.core.stage(r.views, 2, nullptr, true), 1u);
  CHECK_EQ(at<int64_t>(m, m.layout.offset(1, 1), 3), -1);
}

TEST(core_cover_follows_its_dispatch_costs) {
  // measured costs (gear 8 cheaper than gear 4) are the dispatch's: a core over it pads to 8
  Model m;
  const std::vector<InputSpec> inputs{{"x", {1, -1}, 4, "float32"}, {"mask", {-1}, 8, "int64"}};
  auto measured = std::make_shared<const GearDispatch>(
      std::vector<std::string>{"x", "mask"}, Rows{{1, -1}, {-1}}, Rows{{0, 1, 0}, {1, 0, 0}},
      Rows{{2}, {4}, {8}}, std::vector<double>{1.0, 9.0, 2.0});
  ExecutorCore core(inputs, measured, m.layout, m.staging.data(), m.staging.size());
  Request r(3);
  CHECK_EQ(core.stage(r.views, 2, nullptr, true), 2u);
  CHECK_EQ(m.core.stage(r.views, 2, nullptr, true), 1u);  // by elements: gear 4
}

TEST(core_stage_checks_in_order_and_writes_nothing_on_error) {
  Model m;
  Request r(4);
  const std::vector<uint8_t> before = m.staging;
  CHECK_THROWS_ERROR(m.core.stage(r.views, 1, nullptr, false), "input", "145000",
                     "expected 2 input arrays (x, mask), got 1");
  ArrayView not_array[2] = {r.views[0], ArrayView{false, "list"}};
  CHECK_THROWS_ERROR(m.core.stage(not_array, 2, nullptr, false), "input", "145000",
                     "input 'mask' must be a numpy.ndarray, got list");
  const int64_t eight[1] = {8};
  const Values preset{eight, 1};
  CHECK_THROWS_ERROR(m.core.stage(r.views, 2, &preset, false), "length", "145012",
                     "the inputs' dynamic dims (4,) disagree with the dims set with "
                     "set_dynamic_* (8,)");
  CHECK_EQ(m.core.stage(r.views, 2, &preset, true), 2u);  // with pad: a covering preset
  m.staging = before;
  ArrayView wrong_dtype[2] = {r.views[0], r.views[1]};
  wrong_dtype[1].dtype_ok = false;
  wrong_dtype[1].type = "float64";
  CHECK_THROWS_ERROR(m.core.stage(wrong_dtype, 2, nullptr, false), "input", "145000",
                     "input 'mask' has dtype float64, the model's input has int64");
  Request five(5);
  CHECK_THROWS_ERROR(m.core.stage(five.views, 2, nullptr, false), "mismatch", "145013",
                     "(5,) match no gear");
  CHECK(m.staging == before);
  CHECK(m.core.last_request() == std::vector<int64_t>{4});  // the padded stage above
}

TEST(core_stage_keeps_its_scratch_per_call) {
  // A stage inside another's copy hook (what two Python threads misusing one core could do:
  // the copy runs without the GIL) has scratch of its own: each call copies its own request
  // into its own gear's slots, the outer one's sources are not overwritten.
  Model m;
  Request outer(2), inner(8);
  inner.x[0] = 99.0f;
  const size_t got = m.core.stage(outer.views, 2, nullptr, false, [&](size_t, auto&& copy) {
    CHECK_EQ(m.core.stage(inner.views, 2, nullptr, false), 2u);
    CHECK_EQ(at<float>(m, m.layout.offset(2, 0), 0), 99.0f);  // inner's x in gear 2
    CHECK_EQ(at<int64_t>(m, m.layout.offset(2, 1), 7), 7);
    copy();
  });
  CHECK_EQ(got, 0u);
  CHECK_EQ(at<float>(m, m.layout.offset(0, 0), 0), 1.0f);  // then outer's own x in gear 0
  CHECK_EQ(at<float>(m, m.layout.offset(0, 0), 1), 2.0f);
  CHECK_EQ(at<int64_t>(m, m.layout.offset(0, 1), 1), 7);
  CHECK_EQ(at<int32_t>(m, m.layout.dims_offset(0), 0), 2);
}

TEST(core_without_a_dims_buffer_writes_no_dims) {
  // A backend that never reads ascend_mbatch_shape_data (ONNX Runtime) plans its layout with
  // dims_count 0: the core stages the inputs and nothing after them.
  const Layout layout = Layout::plan({{8, 16}, {16, 32}, {32, 64}}, 0, 131072, 64);
  CHECK_EQ(layout.dims_nbytes(), 0u);
  std::vector<uint8_t> staging(layout.total_bytes() + 64, 0xEE);
  ExecutorCore core = core_of({{"x", {1, -1}, 4, "float32"}, {"mask", {-1}, 8, "int64"}},
                    {{0, 1, 0}, {1, 0, 0}}, {{2}, {4}, {8}}, layout, staging.data(),
                    staging.size());
  Request r(4);
  CHECK_EQ(core.stage(r.views, 2, nullptr, false), 1u);
  const size_t end = layout.offset(1, 1) + layout.nbytes(1, 1);
  for (size_t b = end; b < staging.size(); ++b) CHECK_EQ(staging[b], 0xEE);
  CHECK(core.last_values() == std::vector<int64_t>{4});
  const Layout three = Layout::plan({{8, 16}, {16, 32}, {32, 64}}, 3, 131072, 64);
  std::vector<uint8_t> big(three.total_bytes());
  CHECK_THROWS_ERROR(core_of({{"x", {1, -1}, 4, "float32"}, {"mask", {-1}, 8, "int64"}},
                                  {{0, 1, 0}, {1, 0, 0}}, {{2}, {4}, {8}}, three, big.data(),
                                  big.size()),
                     "input", "145000", "layout dims buffer has 12 bytes");
}

TEST(core_stage_of_many_inputs_uses_heap_scratch) {
  // More inputs than the stack scratch holds: the same results, from the heap.
  const size_t n = 20;
  std::vector<InputSpec> inputs;
  std::vector<std::vector<int64_t>> positions;
  std::vector<std::vector<size_t>> nbytes(2);
  for (size_t i = 0; i < n; ++i) {
    inputs.push_back({"x" + std::to_string(i), {-1}, 4, "float32"});
    positions.push_back({static_cast<int64_t>(i), 0, 0});
    nbytes[0].push_back(4);
    nbytes[1].push_back(8);
  }
  const Layout layout = Layout::plan(nbytes, 1, 131072, 64);
  std::vector<uint8_t> staging(layout.total_bytes(), 0);
  ExecutorCore core = core_of(inputs, positions, {{1}, {2}}, layout, staging.data(), staging.size());
  std::vector<std::vector<float>> data(n);
  std::vector<ArrayView> views(n);
  const int64_t shape[1] = {2};
  for (size_t i = 0; i < n; ++i) {
    data[i] = {static_cast<float>(i), static_cast<float>(i) + 0.5f};
    views[i] = ArrayView{true, {}, data[i].data(), shape, 1, true};
  }
  CHECK_EQ(core.stage(views.data(), n, nullptr, false), 1u);
  for (size_t i = 0; i < n; ++i) {
    float v;
    std::memcpy(&v, staging.data() + layout.offset(1, i) + 4, 4);
    CHECK_EQ(v, static_cast<float>(i) + 0.5f);
  }
  CHECK_THROWS_ERROR(core.stage(views.data(), n - 1, nullptr, false), "input", "145000",
                     "expected 20 input arrays");
}

TEST(core_construction_checks_layout_positions_and_staging) {
  const std::vector<InputSpec> inputs{{"x", {-1}, 4, "float32"}};
  const Layout small = Layout::plan({{4}, {7}}, 1, 131072, 64);
  std::vector<uint8_t> buf(4096);
  CHECK_THROWS_ERROR(core_of(inputs, {{0, 0, 0}}, {{1}, {2}}, small, buf.data(), 4096),
                     "input", "145000",
                     "layout slot of input 'x' in gear 1 has 7 bytes, its shape (2,) of "
                     "float32 needs 8");
  const Layout good = Layout::plan({{4}, {8}}, 1, 131072, 64);
  CHECK_THROWS_ERROR(core_of(inputs, {{0, 0}}, {{1}, {2}}, good, buf.data(), 4096),
                     "input", "145000", "dynamic_positions[0] must have 3 values");
  CHECK_THROWS_ERROR(core_of(inputs, {{0, 0, -1}}, {{1}, {2}}, good, buf.data(), 4096),
                     "input", "145000", "has a negative value");
  CHECK_THROWS_ERROR(core_of(inputs, {{0, 0, 0}}, {{1}, {1}}, good, buf.data(), 4096),
                     "spec", "E10039", "repeats gear 0");
  CHECK_THROWS_ERROR(core_of(inputs, {{0, 0, 0}}, {{1}, {2}}, good, buf.data(), 3),
                     "input", "145000", "staging buffer has 3 bytes");
  ExecutorCore core = core_of(inputs, {{0, 0, 0}}, {{1}, {2}}, good, buf.data(), 4096);
  CHECK_THROWS_ERROR(core.dispatch()->gear(2), "input", "145000", "gear index 2 out of range");
}

TEST(core_shares_its_dispatch_and_checks_it_fits) {
  // One dispatch, many cores: held by reference, never copied; it must be the inputs' own.
  const std::vector<InputSpec> inputs{{"x", {-1}, 4, "float32"}};
  const Layout layout = Layout::plan({{4}, {8}}, 1, 131072, 64);
  std::vector<uint8_t> a(4096), b(4096);
  const auto shared = dispatch_of(inputs, {{0, 0, 0}}, {{1}, {2}});
  ExecutorCore one(inputs, shared, layout, a.data(), a.size());
  ExecutorCore two(inputs, shared, layout, b.data(), b.size());
  CHECK(one.dispatch().get() == shared.get());
  CHECK(two.dispatch().get() == shared.get());
  CHECK_EQ(shared.use_count(), 3);
  CHECK_THROWS_ERROR(ExecutorCore(inputs, nullptr, layout, a.data(), a.size()), "input",
                     "145000", "needs the model's dispatch");
  const std::vector<InputSpec> renamed{{"y", {-1}, 4, "float32"}};
  CHECK_THROWS_ERROR(ExecutorCore(renamed, shared, layout, a.data(), a.size()), "input",
                     "145000", "input 0 is 'y' (-1,), the dispatch's is 'x' (-1,)");
  const std::vector<InputSpec> reshaped{{"x", {-1, 2}, 4, "float32"}};
  CHECK_THROWS_ERROR(ExecutorCore(reshaped, shared, layout, a.data(), a.size()), "input",
                     "145000", "the dispatch's is 'x' (-1,)");
  const std::vector<InputSpec> two_inputs{{"x", {-1}, 4, "float32"}, {"m", {-1}, 4, "int32"}};
  CHECK_THROWS_ERROR(ExecutorCore(two_inputs, shared, layout, a.data(), a.size()), "input",
                     "145000", "2 inputs for a dispatch of 1 inputs (x)");
  const std::vector<InputSpec> no_size{{"x", {-1}, 0, "float32"}};
  CHECK_THROWS_ERROR(ExecutorCore(no_size, shared, layout, a.data(), a.size()), "input",
                     "145000", "input 'x' has an itemsize of 0");
}

TEST(core_plan_layout_checked_refuses_negative_arguments) {
  CHECK_THROWS_ERROR(plan_layout_checked({{1, -2}}, 1, 10, 64, 0), "input", "145000",
                     "input_nbytes[0][1] is -2, a byte count must be >= 0");
  CHECK_THROWS_ERROR(plan_layout_checked({{1}}, -1, 10, 64, 0), "input", "145000",
                     "dims_count must be >= 0, got -1");
  CHECK_THROWS_ERROR(plan_layout_checked({{1}}, 1, 10, 0, 0), "input", "145000",
                     "alignment must be a power of two >= 1, got 0");
  CHECK_THROWS_ERROR(plan_layout_checked({{1}}, 1, 10, 64, -1), "input", "145000",
                     "tail_padding must be >= 0, got -1");
  CHECK_EQ(plan_layout_checked({{4, 8}}, 1, 131072, 64, 0).total_bytes(), 132u);
}

TEST(core_stage_tells_its_hook_the_bytes_it_copies) {
  // The GIL rule of the binding reads this count: every slot of the chosen gear and the dims
  // buffer (x: 4 bytes * S, mask: 8 bytes * S, dims: 4 bytes), padded or not.
  Model m;
  Request exact(4), short_one(3);
  size_t seen = 0;
  const auto hook = [&](size_t bytes, auto&& copy) {
    seen = bytes;
    copy();
  };
  CHECK_EQ(m.core.stage(exact.views, 2, nullptr, false, hook), 1u);
  CHECK_EQ(seen, 16u + 32u + 4u);
  CHECK_EQ(m.core.stage(short_one.views, 2, nullptr, true, hook), 1u);  // padded to S = 4
  CHECK_EQ(seen, 16u + 32u + 4u);
  Request big(8);
  CHECK_EQ(m.core.stage(big.views, 2, nullptr, false, hook), 2u);
  CHECK_EQ(seen, 32u + 64u + 4u);
}

TEST(core_stage_leaves_large_inputs_in_place_only_when_asked) {
  // in_place_bytes 32: mask of S = 4 (32 bytes) qualifies, x (16 bytes) does not; padded
  // inputs never do, and nothing is in place unless the caller says its arrays outlive the
  // run (stage's in_place argument).
  Model m;
  m.core.set_in_place_bytes(32);
  Request exact(4), short_one(3);
  size_t seen = 0;
  const auto hook = [&](size_t bytes, auto&& copy) {
    seen = bytes;
    copy();
  };
  CHECK_EQ(m.core.stage(exact.views, 2, nullptr, false, hook, true), 1u);
  CHECK(m.core.last_in_place() == std::vector<size_t>{1});
  CHECK_EQ(seen, 16u + 4u);  // x and the dims only
  CHECK_EQ(at<int64_t>(m, m.layout.offset(1, 1), 0), static_cast<int64_t>(0xEEEEEEEEEEEEEEEE));
  CHECK_EQ(at<float>(m, m.layout.offset(1, 0), 3), 4.0f);
  CHECK_EQ(m.core.stage(exact.views, 2, nullptr, false, hook), 1u);  // not asked: copied
  CHECK(m.core.last_in_place().empty());
  CHECK_EQ(at<int64_t>(m, m.layout.offset(1, 1), 0), 7);
  CHECK_EQ(m.core.stage(short_one.views, 2, nullptr, true, hook, true), 1u);  // padded
  CHECK(m.core.last_in_place().empty());
  CHECK_EQ(seen, 16u + 32u + 4u);
  m.core.set_in_place_bytes(0);
  CHECK_EQ(m.core.stage(exact.views, 2, nullptr, false, hook, true), 1u);  // off
  CHECK(m.core.last_in_place().empty());
}

TEST(core_stage_copies_an_input_overlapping_written_memory) {
  // set_written: the backend's output buffers. mask (32 bytes) overlapping one by a single
  // byte at either end is copied; a range just beside it leaves it in place.
  Model m;
  m.core.set_in_place_bytes(32);
  Request exact(4);
  const uintptr_t lo = reinterpret_cast<uintptr_t>(exact.mask.data());
  const std::vector<std::vector<std::pair<uintptr_t, size_t>>> overlapping = {
      {{lo + 31, 8}}, {{lo - 7, 8}}, {{0, 1}, {lo + 8, 1}}};
  for (const auto& ranges : overlapping) {
    m.core.set_written(ranges);
    CHECK_EQ(m.core.stage(exact.views, 2, nullptr, false, true), 1u);
    CHECK(m.core.last_in_place().empty());
  }
  m.core.set_written({{lo + 32, 8}, {lo - 8, 8}});  // touching, not overlapping
  CHECK_EQ(m.core.stage(exact.views, 2, nullptr, false, true), 1u);
  CHECK(m.core.last_in_place() == std::vector<size_t>{1});
}
