// Runs every TEST registered in the test files; exit code = number of failed tests (capped).
#include <cstdio>
#include <cstring>
#include <exception>

#include "check.h"

namespace gear_runtime_test {

namespace {
int g_failures_in_test = 0;
}

std::vector<TestCase>& registry() {
  static std::vector<TestCase> tests;
  return tests;
}

void record_failure(const char* file, int line, const std::string& what) {
  ++g_failures_in_test;
  std::fprintf(stderr, "  FAILED %s:%d: %s\n", file, line, what.c_str());
}

}  // namespace gear_runtime_test

int main(int argc, char** argv) {
  using namespace gear_runtime_test;
  const char* filter = argc > 1 ? argv[1] : nullptr;  // optional substring of test names
  int failed = 0, ran = 0;
  for (const TestCase& t : registry()) {
    if (filter && std::strstr(t.name, filter) == nullptr) continue;
    ++ran;
    g_failures_in_test = 0;
    try {
      t.fn();
    } catch (const std::exception& e) {
      record_failure(__FILE__, __LINE__, std::string("unexpected exception: ") + e.what());
    }
    std::printf("%s %s\n", g_failures_in_test ? "FAIL" : "ok  ", t.name);
    failed += g_failures_in_test ? 1 : 0;
  }
  std::printf("%d tests, %d failed\n", ran, failed);
  if (ran == 0) return 2;  // a filter that matches nothing is a mistake, not a pass
  return failed > 100 ? 100 : failed;
}
