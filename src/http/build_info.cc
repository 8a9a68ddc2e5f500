#include "http/build_info.h"

#include <nlohmann/json.hpp>

namespace kvpush::http {

std::string BuildInfo::ToString() const {
  std::string s = version + " (git " + git_commit.substr(0, 12);
  if (git_dirty) s += ", modified";
  return s + ")";
}

std::string BuildInfo::ToJson() const {
  return nlohmann::json{{"version", version}, {"git_commit", git_commit}, {"git_dirty", git_dirty}}
      .dump();
}

void WriteBuildInfo(PrometheusWriter& w, const BuildInfo& build) {
  static constexpr MetricFamily kFamily{
      "kvpush_build_info", "gauge",
      "1, labelled with the running build: version and git commit (git_dirty: tracked files "
      "differed from it)"};
  w.Family(kFamily);
  w.Sample(kFamily.name, int64_t{1},
           Labels{{"version", build.version},
                  {"git_commit", build.git_commit},
                  {"git_dirty", build.git_dirty ? "true" : "false"}});
}

}  // namespace kvpush::http
