// Errors of the C++ core: one exception type carrying the Python-side *kind*.
//
// The core never talks to Python here: it throws gear_runtime::Error{kind, code, message} and
// the single translator (py_convert.cc, registered in bindings.cc) turns it into
// gear_runtime.errors.make_error(kind, message, code). `kind` is a key of gear_runtime.errors.KINDS, so the mapping from kind to
// exception class lives in one place (errors.py) for both layers.
#pragma once

#include <cstddef>
#include <cstdint>
#include <stdexcept>
#include <string>
#include <vector>

namespace gear_runtime {

// GE / ACL codes we mirror (docs/ge-notes.md section 11; gear_runtime/errors.py holds the
// same values, tests/test_shared_facts.py keeps them equal).
inline constexpr const char* kCodeParamInvalid = "145000";        // ACL_ERROR_GE_PARAM_INVALID
inline constexpr const char* kCodeInputLength = "145012";  // ..._DYNAMIC_INPUT_LENGTH_INVALID
inline constexpr const char* kCodeGearMismatch = "145013";  // ..._DYNAMIC_BATCH_SIZE_INVALID

// Kinds (keys of gear_runtime.errors.KINDS).
inline constexpr const char* kKindSpec = "spec";          // GearSpecError
inline constexpr const char* kKindInput = "input";        // InputError
inline constexpr const char* kKindLength = "length";      // DynamicInputLengthError
inline constexpr const char* kKindMismatch = "mismatch";  // GearMismatchError

class Error : public std::runtime_error {
 public:
  Error(std::string kind, std::string code, const std::string& message);

  const std::string& kind() const noexcept { return kind_; }
  const std::string& code() const noexcept { return code_; }
  // The message without the code prefix (what() is the same text).
  std::string message() const { return what(); }

 private:
  std::string kind_;
  std::string code_;
};

// InputError, code 145000: inputs or parameters that cannot be used.
[[noreturn]] void throw_input(const std::string& message);
// DynamicInputLengthError, code 145012: wrong dims length / rank / static dim / disagreement.
[[noreturn]] void throw_length(const std::string& message);
// GearMismatchError, code 145013: dynamic dims that match no gear.
[[noreturn]] void throw_mismatch(const std::string& message);
// GearSpecError with a GE code (E100xx) or "" when GE has none.
[[noreturn]] void throw_spec(const std::string& message, const std::string& code = "");

// Python's repr of a tuple of ints: "()", "(17,)", "(20, 1, 1)". Messages show values this
// way, so that they read as Python users write them.
std::string format_tuple(const int64_t* values, size_t n);
std::string format_tuple(const std::vector<int64_t>& values);

}  // namespace gear_runtime
