// ThisBuild(): what `kvpush --version`, GET /version and the kvpush_build_info metric report. Its
// definition is generated at build time by cmake/BuildInfo.cmake (the project version from
// CMakeLists.txt, the git commit of the source tree and whether tracked files differed from it).
#pragma once

#include "http/build_info.h"

namespace kvpush::apps {

/// This binary's build. Thread-safe (a constant).
const http::BuildInfo& ThisBuild();

}  // namespace kvpush::apps
