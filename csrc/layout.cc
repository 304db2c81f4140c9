#include "layout.h"

#include <algorithm>
#include <limits>

#include "errors.h"

namespace gear_runtime {
namespace {

constexpr size_t kMax = std::numeric_limits<size_t>::max();

size_t checked_add(size_t a, size_t b) {
  if (a > kMax - b) throw_input("layout size overflows: the inputs are too large");
  return a + b;
}

size_t align_up(size_t x, size_t alignment) {
  return checked_add(x, alignment - 1) & ~(alignment - 1);
}

// Bytes a buffer of n bytes owns before the next one may start (layout.h, "Footprint").
size_t footprint(size_t n, size_t tail_padding) {
  if (tail_padding == 0) return n;  // packed: byte for byte GE's staging
  return checked_add(align_up(n, kPaddingGranule), tail_padding);
}

}  // namespace

Layout Layout::plan(const std::vector<std::vector<size_t>>& input_nbytes, size_t dims_count,
                    int64_t fusion_size, size_t alignment, int64_t tail_padding) {
  if (input_nbytes.empty()) throw_input("input_nbytes has no gears: at least one is needed");
  if (alignment == 0 || (alignment & (alignment - 1)) != 0) {
    throw_input("alignment must be a power of two >= 1, got " + std::to_string(alignment));
  }
  if (tail_padding < 0) {
    throw_input("tail_padding must be >= 0, got " + std::to_string(tail_padding));
  }
  const size_t padding = static_cast<size_t>(tail_padding);
  if (dims_count > kMax / 4) throw_input("dims_count " + std::to_string(dims_count) + " is too large");
  Layout l;
  l.gear_count_ = input_nbytes.size();
  l.input_count_ = input_nbytes[0].size();
  l.alignment_ = alignment;
  l.tail_padding_ = padding;
  l.dims_nbytes_ = 4 * dims_count;
  for (size_t g = 1; g < l.gear_count_; ++g) {
    if (input_nbytes[g].size() != l.input_count_) {
      throw_input("input_nbytes row " + std::to_string(g) + " has " +
                  std::to_string(input_nbytes[g].size()) + " inputs, row 0 has " +
                  std::to_string(l.input_count_));
    }
  }
  // Who takes part: largest size over gears <= limit (merging off when fusion_size < 0).
  l.fused_.assign(l.input_count_, 0);
  size_t taking_part = 0;
  if (fusion_size >= 0) {
    const size_t limit = static_cast<size_t>(std::min(fusion_size, kMaxFusionSize));
    for (size_t i = 0; i < l.input_count_; ++i) {
      size_t largest = 0;
      for (size_t g = 0; g < l.gear_count_; ++g) largest = std::max(largest, input_nbytes[g][i]);
      l.fused_[i] = largest <= limit;
      taking_part += l.fused_[i];
    }
    const bool dims_take_part = dims_count > 0 && l.dims_nbytes_ <= limit;
    taking_part += dims_take_part;
  }
  l.merged_ = taking_part >= 2;  // GE merges only two or more buffers
  if (!l.merged_) l.fused_.assign(l.input_count_, 0);

  const size_t cells = l.gear_count_ * l.input_count_;
  l.offsets_.assign(cells, 0);
  l.nbytes_.assign(cells, 0);
  l.dims_offsets_.assign(l.gear_count_, 0);
  l.merged_end_.assign(l.gear_count_, 0);
  for (size_t g = 0; g < l.gear_count_; ++g) {
    size_t cursor = 0;
    auto place = [&](size_t i) {
      cursor = align_up(cursor, alignment);
      l.offsets_[g * l.input_count_ + i] = cursor;
      l.nbytes_[g * l.input_count_ + i] = input_nbytes[g][i];
      cursor = checked_add(cursor, footprint(input_nbytes[g][i], padding));
    };
    for (size_t i = 0; i < l.input_count_; ++i) {
      if (l.fused_[i]) place(i);
    }
    cursor = align_up(cursor, alignment);
    l.dims_offsets_[g] = cursor;
    // No dims buffer (dims_count == 0): nothing to own, not even padding.
    if (l.dims_nbytes_ > 0) cursor = checked_add(cursor, footprint(l.dims_nbytes_, padding));
    if (l.merged_) l.merged_end_[g] = cursor;
    for (size_t i = 0; i < l.input_count_; ++i) {
      if (!l.fused_[i]) place(i);
    }
    l.total_bytes_ = std::max(l.total_bytes_, cursor);
  }
  return l;
}

void Layout::check_gear(size_t g) const {
  if (g >= gear_count_) {
    throw_input("gear index " + std::to_string(g) + " out of range: the layout has " +
                std::to_string(gear_count_) + " gears");
  }
}

void Layout::check_input(size_t i) const {
  if (i >= input_count_) {
    throw_input("input index " + std::to_string(i) + " out of range: the layout has " +
                std::to_string(input_count_) + " inputs");
  }
}

size_t Layout::offset(size_t g, size_t i) const {
  check_gear(g);
  check_input(i);
  return offset_unchecked(g, i);
}

size_t Layout::nbytes(size_t g, size_t i) const {
  check_gear(g);
  check_input(i);
  return nbytes_unchecked(g, i);
}

bool Layout::fused(size_t i) const {
  check_input(i);
  return fused_[i] != 0;
}

size_t Layout::dims_offset(size_t g) const {
  check_gear(g);
  return dims_offsets_[g];
}

Span Layout::merged_span(size_t g) const {
  check_gear(g);
  return Span{0, merged_end_[g]};
}

std::vector<Span> Layout::separate(size_t g) const {
  check_gear(g);
  std::vector<Span> out;
  // Staging order: [fused inputs][dims][other inputs]; only the last two can be separate.
  if (!merged_ && dims_nbytes_ > 0) out.push_back({dims_offsets_[g], dims_offsets_[g] + dims_nbytes_});
  for (size_t i = 0; i < input_count_; ++i) {
    const size_t n = nbytes_unchecked(g, i);
    if (!fused_[i] && n > 0) out.push_back({offset_unchecked(g, i), offset_unchecked(g, i) + n});
  }
  return out;
}

std::string Layout::repr() const {
  return "Layout(gears=" + std::to_string(gear_count_) + ", inputs=" +
         std::to_string(input_count_) + ", merged=" + (merged_ ? "True" : "False") +
         ", total_bytes=" + std::to_string(total_bytes_) +
         (tail_padding_ > 0 ? ", tail_padding=" + std::to_string(tail_padding_) : "") + ")";
}

}  // namespace gear_runtime
