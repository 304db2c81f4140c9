#include "staging.h"

#include <cstring>
#include <utility>

#include "errors.h"

namespace gear_runtime {
namespace {

// Bytes of one step along `axis` of a C-contiguous array of `shape`.
size_t stride_of(const int64_t* shape, size_t ndim, size_t axis, size_t itemsize) noexcept {
  size_t stride = itemsize;
  for (size_t a = axis + 1; a < ndim; ++a) stride *= static_cast<size_t>(shape[a]);
  return stride;
}

struct PadCopy {
  const int64_t* dst_shape;
  const int64_t* src_shape;
  size_t ndim;
  size_t itemsize;
  const uint8_t* pad;
  size_t last;   // the last axis whose sizes differ: everything inside it is one run of bytes
  size_t inner;  // bytes of one step along `last` (equal in src and dst)

  void fill(uint8_t* dst, size_t nbytes) const noexcept {
    fill_pattern(dst, nbytes, pad, itemsize);
  }

  // Rows of `axis` that the source has are copied (recursively), the rest padded.
  void run(size_t axis, uint8_t* dst, const uint8_t* src) const noexcept {
    const size_t have = static_cast<size_t>(src_shape[axis]);
    const size_t want = static_cast<size_t>(dst_shape[axis]);
    if (axis == last) {
      if (have > 0) std::memcpy(dst, src, have * inner);
      fill(dst + have * inner, (want - have) * inner);
      return;
    }
    const size_t dst_step = stride_of(dst_shape, ndim, axis, itemsize);
    const size_t src_step = stride_of(src_shape, ndim, axis, itemsize);
    for (size_t j = 0; j < have; ++j) run(axis + 1, dst + j * dst_step, src + j * src_step);
    fill(dst + have * dst_step, (want - have) * dst_step);
  }
};

}  // namespace

void fill_pattern(uint8_t* dst, size_t nbytes, const uint8_t* pattern, size_t width) noexcept {
  if (nbytes == 0) return;
  bool uniform = true;  // 0, -1, ...: one memset
  for (size_t b = 1; b < width; ++b) uniform = uniform && pattern[b] == pattern[0];
  if (uniform) {
    std::memset(dst, pattern[0], nbytes);
    return;
  }
  std::memcpy(dst, pattern, width);
  size_t done = width;  // doubling copies: log2(n) memcpy calls, no per-element loop
  while (done < nbytes) {
    const size_t chunk = done < nbytes - done ? done : nbytes - done;
    std::memcpy(dst + done, dst, chunk);
    done += chunk;
  }
}

void pad_copy(uint8_t* dst, const int64_t* dst_shape, const uint8_t* src,
              const int64_t* src_shape, size_t ndim, size_t itemsize,
              const uint8_t* pad) noexcept {
  size_t last = ndim;
  for (size_t a = 0; a < ndim; ++a) {
    if (src_shape[a] != dst_shape[a]) last = a;
  }
  if (last == ndim) {  // nothing to pad: one copy
    const size_t nbytes = stride_of(src_shape, ndim, 0, itemsize) *
                          (ndim > 0 ? static_cast<size_t>(src_shape[0]) : 1);
    if (nbytes > 0) std::memcpy(dst, src, nbytes);
    return;
  }
  const PadCopy job{dst_shape, src_shape, ndim, itemsize, pad, last,
                    stride_of(dst_shape, ndim, last, itemsize)};
  job.run(0, dst, src);
}

void Stager::check_padded(const StageSource& s, size_t slot, size_t gear, uintptr_t lo,
                          uintptr_t hi, const std::string& name) const {
  if (s.slot_shape == nullptr || s.pad == nullptr || s.itemsize == 0) {
    throw_input("input " + name + " is padded without a slot shape, itemsize or pad value");
  }
  unsigned __int128 need = s.itemsize;
  for (size_t a = 0; a < s.ndim; ++a) {
    if (s.shape[a] < 0 || s.shape[a] > s.slot_shape[a]) {
      throw_input("input " + name + " of shape " + format_tuple(s.shape, s.ndim) +
                  " does not fit its padded shape " + format_tuple(s.slot_shape, s.ndim));
    }
    need *= static_cast<uint64_t>(s.slot_shape[a]);
  }
  if (need > slot) {
    throw_input("input " + name + " padded to " + format_tuple(s.slot_shape, s.ndim) +
                " needs more than its slot of " + std::to_string(slot) + " bytes in gear " +
                std::to_string(gear));
  }
  const uintptr_t p = reinterpret_cast<uintptr_t>(s.data);
  if (s.nbytes > 0 && p < hi && lo < p + s.nbytes) {
    throw_input("input " + name + " overlaps the staging buffer and must be padded: pass a "
                "copy");
  }
}

Stager::Stager(Layout layout, uint8_t* base, size_t size)
    : layout_(std::move(layout)), base_(base), size_(size) {
  if (size_ < layout_.total_bytes()) {
    throw_input("staging buffer has " + std::to_string(size_) + " bytes, the layout needs " +
                std::to_string(layout_.total_bytes()));
  }
  if (base_ == nullptr && size_ > 0) throw_input("staging buffer has no data pointer");
}

void Stager::check(size_t gear, const StageSource* srcs, size_t n, const int64_t* values,
                   size_t nvalues, const std::string* names) const {
  layout_.check_gear(gear);
  if (n != layout_.input_count()) {
    throw_input("expected " + std::to_string(layout_.input_count()) + " inputs to stage, got " +
                std::to_string(n));
  }
  const uintptr_t lo = reinterpret_cast<uintptr_t>(base_);
  const uintptr_t hi = lo + size_;
  // Names are built only on the error path: check() runs on every stage.
  auto name = [&](size_t i) { return names ? "'" + names[i] + "'" : "#" + std::to_string(i); };
  for (size_t i = 0; i < n; ++i) {
    const size_t slot = layout_.nbytes_unchecked(gear, i);
    if (srcs[i].shape != nullptr) {
      check_padded(srcs[i], slot, gear, lo, hi, name(i));
      continue;
    }
    if (srcs[i].nbytes > slot) {
      throw_input("input " + name(i) + " has " + std::to_string(srcs[i].nbytes) +
                  " bytes, more than its slot of " + std::to_string(slot) + " bytes in gear " +
                  std::to_string(gear));
    }
    if (srcs[i].nbytes == 0) continue;
    const uintptr_t s = reinterpret_cast<uintptr_t>(srcs[i].data);
    const bool overlaps = s < hi && lo < s + srcs[i].nbytes;
    if (overlaps && srcs[i].data != base_ + layout_.offset_unchecked(gear, i)) {
      throw_input("input " + name(i) + " overlaps the staging buffer but is not its own slot in gear " +
                  std::to_string(gear));
    }
  }
  if (nvalues * 4 != layout_.dims_nbytes()) {
    throw_input(std::to_string(nvalues) + " dynamic values do not fill the layout's dims buffer of " +
                std::to_string(layout_.dims_nbytes()) + " bytes (4 bytes per value)");
  }
  for (size_t v = 0; v < nvalues; ++v) {
    if (values[v] < INT32_MIN || values[v] > INT32_MAX) {
      throw_input("dynamic value " + std::to_string(values[v]) + " does not fit int32");
    }
  }
}

void Stager::copy(size_t gear, const StageSource* srcs, size_t n, const int64_t* values,
                  size_t nvalues) const noexcept {
  for (size_t i = 0; i < n; ++i) {
    uint8_t* dst = base_ + layout_.offset_unchecked(gear, i);
    const StageSource& s = srcs[i];
    if (s.shape != nullptr) {
      pad_copy(dst, s.slot_shape, static_cast<const uint8_t*>(s.data), s.shape, s.ndim,
               s.itemsize, s.pad);
    } else if (s.nbytes > 0 && s.data != dst && !s.in_place) {
      std::memcpy(dst, s.data, s.nbytes);
    }
  }
  uint8_t* dims = base_ + layout_.dims_offset_unchecked(gear);
  for (size_t v = 0; v < nvalues; ++v) {
    const int32_t value = static_cast<int32_t>(values[v]);
    std::memcpy(dims + 4 * v, &value, sizeof(value));  // memcpy: base may be unaligned
  }
}

void Stager::stage(size_t gear, const StageSource* srcs, size_t n, const int64_t* values,
                   size_t nvalues, const std::string* names) const {
  check(gear, srcs, n, values, nvalues, names);
  copy(gear, srcs, n, values, nvalues);
}

}  // namespace gear_runtime
