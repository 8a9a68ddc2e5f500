// BuildInfo: which build of kvpush a process is, as both front doors report it (GET /version and
// the kvpush_build_info gauge, docs/server.md "Which build is running"). The `kvpush` binary fills
// it from values generated at build time (apps/build_info.h); libraries and tests that start a
// front door without it report version "unknown".
#pragma once

#include <string>

#include "http/prometheus.h"

namespace kvpush::http {

struct BuildInfo {
  std::string version = "unknown";     ///< the project version, "MAJOR.MINOR.PATCH"
  std::string git_commit = "unknown";  ///< 40 hex digits, or "unknown" outside a git checkout
  bool git_dirty = false;              ///< tracked files differed from git_commit at build time

  /// "0.1.0 (git 118e5af5c3d1, modified)": the `kvpush --version` line. Pure.
  std::string ToString() const;
  /// {"version": ..., "git_commit": ..., "git_dirty": ...}: the body of GET /version (vLLM's
  /// endpoint answers {"version": ...}; the other members are kvpush's). Pure.
  std::string ToJson() const;
};

/// Writes the gauge family kvpush_build_info{version, git_commit} 1 (Prometheus' build-info
/// convention) on `w`.
void WriteBuildInfo(PrometheusWriter& w, const BuildInfo& build);

}  // namespace kvpush::http
