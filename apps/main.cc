// kvpush: one binary, one subcommand per job (see `kvpush --help`).
#include <CLI/CLI.hpp>
#include <algorithm>
#include <cstdio>
#include <string>
#include <vector>

#include "apps/build_info.h"
#include "apps/commands.h"
#include "apps/yaml_config.h"

int main(int argc, char** argv) {
  CLI::App app{"kvpush: push-based KV transfer for prefill/decode disaggregated LLM serving",
               "kvpush"};
  app.set_version_flag("--version", "kvpush " + kvpush::apps::ThisBuild().ToString(),
                       "Print the version (and the git commit it was built from) and exit");
  app.require_subcommand(1);
  kvpush::apps::RegisterServeCommand(app);
  kvpush::apps::RegisterGenerateCommand(app);
  kvpush::apps::RegisterGenModelCommand(app);
  kvpush::apps::RegisterXferBenchCommand(app);
  kvpush::apps::RegisterDemoCommand(app);
  kvpush::apps::RegisterRouterCommand(app);
  kvpush::apps::RegisterBenchCommand(app);
  kvpush::apps::RegisterWaitReadyCommand(app);
  // vLLM's `serve --config FILE.yaml`: the file's flags join the command line first.
  auto args = kvpush::apps::ExpandConfigFile(std::vector<std::string>(argv + 1, argv + argc),
                                             "serve");
  if (!args.ok()) {
    std::fprintf(stderr, "kvpush serve: %s\n", args.status().message().c_str());
    return 2;
  }
  std::reverse(args->begin(), args->end());  // CLI11 takes the arguments last first
  try {
    app.parse(*args);
  } catch (const CLI::ParseError& e) {
    return app.exit(e);
  }
  return 0;
}
