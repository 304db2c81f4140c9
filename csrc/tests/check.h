// A tiny self-contained test runner (no GoogleTest download needed).
//
//   TEST(name) { CHECK(cond); CHECK_EQ(a, b); CHECK_THROWS_ERROR(stmt, "length", "145012",
//                "substring of the message"); }
//
// A failed CHECK records the failure (file, line, expression) and the test continues; the
// process exits non-zero when any check failed, so ctest reports it.
#pragma once

#include <cstdio>
#include <functional>
#include <sstream>
#include <string>
#include <vector>

#include "errors.h"

namespace gear_runtime_test {

struct TestCase {
  const char* name;
  std::function<void()> fn;
};

std::vector<TestCase>& registry();
void record_failure(const char* file, int line, const std::string& what);

struct Register {
  Register(const char* name, std::function<void()> fn) { registry().push_back({name, fn}); }
};

template <typename A, typename B>
void check_eq(const A& a, const B& b, const char* ea, const char* eb, const char* file, int line) {
  if (!(a == b)) {
    std::ostringstream os;
    os << ea << " == " << eb << "  (" << a << " vs " << b << ")";
    record_failure(file, line, os.str());
  }
}

}  // namespace gear_runtime_test

#define GR_CONCAT2(a, b) a##b
#define GR_CONCAT(a, b) GR_CONCAT2(a, b)
#define TEST(name)                                                                   \
  static void name();                                                                \
  static ::gear_runtime_test::Register GR_CONCAT(register_, name)(#name, &name);     \
  static void name()

#define CHECK(cond)                                                                  \
  do {                                                                               \
    if (!(cond)) ::gear_runtime_test::record_failure(__FILE__, __LINE__, #cond);     \
  } while (0)

#define CHECK_EQ(a, b) ::gear_runtime_test::check_eq((a), (b), #a, #b, __FILE__, __LINE__)

// stmt must throw gear_runtime::Error with this kind and code, its message containing text.
#define CHECK_THROWS_ERROR(stmt, kind_, code_, text)                                          \
  do {                                                                                        \
    bool thrown_ = false;                                                                     \
    try {                                                                                     \
      stmt;                                                                                   \
    } catch (const ::gear_runtime::Error& e_) {                                               \
      thrown_ = true;                                                                         \
      if (e_.kind() != (kind_) || e_.code() != (code_) ||                                     \
          e_.message().find(text) == std::string::npos) {                                     \
        ::gear_runtime_test::record_failure(                                                  \
            __FILE__, __LINE__,                                                               \
            std::string(#stmt) + " threw [" + e_.kind() + " " + e_.code() + "] " + e_.message()); \
      }                                                                                       \
    }                                                                                         \
    if (!thrown_) {                                                                           \
      ::gear_runtime_test::record_failure(__FILE__, __LINE__, std::string(#stmt) + " did not throw"); \
    }                                                                                         \
  } while (0)
