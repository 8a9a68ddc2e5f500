// Standalone xfer-bench (same flags as `kvpush xfer-bench`), so the benchmark builds and runs
// without the other layers of the kvpush binary.
#include <CLI/CLI.hpp>

#include "apps/commands.h"

int main(int argc, char** argv) {
  CLI::App app{"xfer_bench: kvpush transfer engine benchmark"};
  kvpush::apps::RegisterXferBenchCommand(app);
  app.require_subcommand(1);
  std::vector<std::string> args;
  for (int i = argc - 1; i >= 1; --i) args.push_back(argv[i]);
  if (args.empty() || args.back() != "xfer-bench") args.push_back("xfer-bench");
  try {
    app.parse(args);
  } catch (const CLI::ParseError& e) {
    return app.exit(e);
  }
  return 0;
}
