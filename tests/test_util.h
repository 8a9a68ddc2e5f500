// Helpers shared by kvpush tests.
#pragma once

#include <gtest/gtest.h>

#include <filesystem>
#include <string>

namespace kvpush::testing {

/// ../shared/models as configured at build time (KVPUSH_SHARED_MODELS_DIR).
inline std::filesystem::path SharedModelsDir() { return KVPUSH_SHARED_MODELS_DIR; }

/// Path of a file in SharedModelsDir(), or "" when it does not exist.
inline std::string SharedModel(const std::string& file) {
  auto p = SharedModelsDir() / file;
  return std::filesystem::exists(p) ? p.string() : std::string();
}

}  // namespace kvpush::testing

/// Skips the current test with a clear message when a shared model file is missing.
#define KVP_REQUIRE_SHARED_MODEL(var, file)                                                  \
  const std::string var = ::kvpush::testing::SharedModel(file);                              \
  if (var.empty()) {                                                                          \
    GTEST_SKIP() << "shared model file '" << file << "' not found in "                      \
                 << ::kvpush::testing::SharedModelsDir()                                      \
                 << " (see ../shared/models/README.md); skipping";                            \
  }
