#include "errors.h"

#include <utility>

namespace gear_runtime {

Error::Error(std::string kind, std::string code, const std::string& message)
    : std::runtime_error(message), kind_(std::move(kind)), code_(std::move(code)) {}

void throw_input(const std::string& message) { throw Error(kKindInput, kCodeParamInvalid, message); }

void throw_length(const std::string& message) {
  throw Error(kKindLength, kCodeInputLength, message);
}

void throw_mismatch(const std::string& message) {
  throw Error(kKindMismatch, kCodeGearMismatch, message);
}

void throw_spec(const std::string& message, const std::string& code) {
  throw Error(kKindSpec, code, message);
}

std::string format_tuple(const int64_t* values, size_t n) {
  std::string out = "(";
  for (size_t i = 0; i < n; ++i) {
    if (i > 0) out += ", ";
    out += std::to_string(values[i]);
  }
  if (n == 1) out += ",";
  out += ")";
  return out;
}

std::string format_tuple(const std::vector<int64_t>& values) {
  return format_tuple(values.data(), values.size());
}

}  // namespace gear_runtime
