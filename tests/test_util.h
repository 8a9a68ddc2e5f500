// Helpers shared by kvpush tests.
#pragma once

#include <gtest/gtest.h>

#include <chrono>
#include <filesystem>
#include <string>
#include <thread>

namespace kvpush::testing {

/// ../shared/models as configured at build time (KVPUSH_SHARED_MODELS_DIR).
inline std::filesystem::path SharedModelsDir() { return KVPUSH_SHARED_MODELS_DIR; }

/// Path of a file in SharedModelsDir(), or "" when it does not exist.
inline std::string SharedModel(const std::string& file) {
  auto p = SharedModelsDir() / file;
  return std::filesystem::exists(p) ? p.string() : std::string();
}

/// Polls `pred` every `poll` until it returns true or `timeout` has passed. Returns true when it
/// held (the last call is made at or after the deadline, so a condition that became true just in
/// time still counts). The one polling helper for tests that wait on another thread or process;
/// assert on its result (ASSERT_TRUE(WaitUntil(...)) << "what did not happen"). Code under test
/// with an injectable clock should be driven by a fake clock instead (no waiting at all).
template <typename Pred>
bool WaitUntil(Pred&& pred, std::chrono::milliseconds timeout = std::chrono::seconds(5),
               std::chrono::milliseconds poll = std::chrono::milliseconds(2)) {
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  while (!pred()) {
    if (std::chrono::steady_clock::now() >= deadline) return static_cast<bool>(pred());
    std::this_thread::sleep_for(poll);
  }
  return true;
}

}  // namespace kvpush::testing

/// Skips the current test with a clear message when a shared model file is missing.
#define KVP_REQUIRE_SHARED_MODEL(var, file)                                                  \
  const std::string var = ::kvpush::testing::SharedModel(file);                              \
  if ((var).empty()) {                                                                        \
    GTEST_SKIP() << "shared model file '" << (file) << "' not found in "                    \
                 << ::kvpush::testing::SharedModelsDir()                                      \
                 << " (see ../shared/models/README.md); skipping";                            \
  }
