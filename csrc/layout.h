// Layout: where each input and the dims buffer sit in the host staging buffer, per gear, and
// which bytes move in GE's ONE merged host-to-device copy (davinci_model.cc,
// InitModelInputsMergeCopyHostMem / CopyInputDataWithMergeH2D; docs/ge-notes.md section 3).
//
// Rules (one per gear g):
//  * The merging limit is min(fusion_size, 32 MiB); a negative fusion_size turns merging off.
//  * A buffer "takes part" when its LARGEST size over all gears is <= the limit. The buffers
//    are the inputs and, when dims_count > 0, the int32 dims buffer (ascend_mbatch_shape_data,
//    4 * dims_count bytes).
//  * GE merges only when at least two buffers take part. If they do, the layout is "merged":
//    fused(i) is true for the inputs that take part. Otherwise nothing is fused.
//  * Packing, offsets rounded up to `alignment`: fused inputs in input order, then the dims
//    buffer, then the other inputs in input order.
//  * Footprint: each buffer owns the bytes from its offset up to where the cursor moves
//    before the next offset is rounded up. With tail_padding == 0 (the default, GE's own
//    staging) a buffer of n bytes owns exactly n bytes: buffers are packed. With
//    tail_padding > 0 it owns ALIGN_UP(n, 32) + tail_padding bytes, so the next buffer's start
//    (and total_bytes) is at least that far away. This is pyACL's rule for buffers carved out
//    of one aclrtMalloc block (ALIGN_UP(len, 32) + 32, starts 64-byte aligned): the acl
//    backend plans with alignment 64 and tail_padding 32. Every input owns a footprint, even
//    with 0 bytes (it still gets its own data buffer); the dims buffer only when
//    dims_count > 0. nbytes(g, i) and dims_nbytes() stay the real sizes: the padding is in
//    the offsets, never in the sizes.
//  * merged_span(g) = [0, end of the last merged buffer's footprint) when merged, else (0, 0):
//    with tail_padding > 0 it also covers the padding of its last buffer (so the merged copy
//    may move padding bytes, never bytes of a separate buffer). Without a dims buffer the
//    end is rounded up to `alignment` (where the dims buffer would start).
//  * separate(g) = the spans copied on their own, in staging order: every non-fused input
//    with at least one byte, and the dims buffer when it is not part of the merged span.
//    merged_span + separate cover every byte that has to reach the device.
//  * total_bytes = max over gears of the end of the last buffer's footprint: the staging
//    buffer size (and the size of a device region mirroring it).
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

namespace gear_runtime {

inline constexpr int64_t kDefaultFusionSize = 131072;        // ge.exec.input_fusion_size
inline constexpr int64_t kMaxFusionSize = 32LL * 1024 * 1024;  // GE caps it at 32 MiB
inline constexpr size_t kDefaultAlignment = 64;
inline constexpr size_t kPaddingGranule = 32;  // ALIGN_UP(len, 32) of pyACL's carving rule

struct Span {
  size_t start = 0;
  size_t end = 0;  // exclusive
  bool operator==(const Span& o) const noexcept { return start == o.start && end == o.end; }
};

class Layout {
 public:
  // input_nbytes[g][i]: bytes of input i in gear g (rows of equal length, at least one gear).
  // tail_padding: see "Footprint" above (0 = packed, as GE stages).
  // Throws Error(kind "input", 145000) on a ragged table, a non-power-of-two alignment, a
  // negative tail_padding or a size overflow.
  static Layout plan(const std::vector<std::vector<size_t>>& input_nbytes, size_t dims_count,
                     int64_t fusion_size = kDefaultFusionSize,
                     size_t alignment = kDefaultAlignment, int64_t tail_padding = 0);

  size_t gear_count() const noexcept { return gear_count_; }
  size_t input_count() const noexcept { return input_count_; }
  bool merged() const noexcept { return merged_; }
  size_t dims_nbytes() const noexcept { return dims_nbytes_; }
  size_t total_bytes() const noexcept { return total_bytes_; }
  size_t alignment() const noexcept { return alignment_; }
  size_t tail_padding() const noexcept { return tail_padding_; }

  // Unchecked accessors (hot path; g < gear_count(), i < input_count()).
  size_t offset_unchecked(size_t g, size_t i) const noexcept {
    return offsets_[g * input_count_ + i];
  }
  size_t nbytes_unchecked(size_t g, size_t i) const noexcept {
    return nbytes_[g * input_count_ + i];
  }
  size_t dims_offset_unchecked(size_t g) const noexcept { return dims_offsets_[g]; }

  // Checked accessors: an index out of range is Error(kind "input", 145000).
  size_t offset(size_t g, size_t i) const;
  size_t nbytes(size_t g, size_t i) const;
  bool fused(size_t i) const;
  size_t dims_offset(size_t g) const;
  Span merged_span(size_t g) const;
  std::vector<Span> separate(size_t g) const;

  std::string repr() const;

  // Error(kind "input", 145000) "gear index 3 out of range: the layout has 2 gears" unless
  // g < gear_count() (and the same for input indices): every checked accessor's bound.
  void check_gear(size_t g) const;
  void check_input(size_t i) const;

 private:
  size_t gear_count_ = 0;
  size_t input_count_ = 0;
  bool merged_ = false;
  size_t dims_nbytes_ = 0;
  size_t total_bytes_ = 0;
  size_t alignment_ = kDefaultAlignment;
  size_t tail_padding_ = 0;
  std::vector<size_t> offsets_;  // [g * input_count + i]
  std::vector<size_t> nbytes_;
  std::vector<uint8_t> fused_;  // per input
  std::vector<size_t> dims_offsets_;  // per gear
  std::vector<size_t> merged_end_;    // per gear; 0 when not merged
};

}  // namespace gear_runtime
