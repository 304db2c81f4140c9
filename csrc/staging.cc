#include "staging.h"

#include <cstring>
#include <utility>

#include "errors.h"

namespace gear_runtime {

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
    if (srcs[i].nbytes > 0 && srcs[i].data != dst) std::memcpy(dst, srcs[i].data, srcs[i].nbytes);
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
