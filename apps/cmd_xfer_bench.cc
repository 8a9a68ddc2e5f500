// kvpush xfer-bench: placeholder until its layer lands.
#include <cstdio>

#include "apps/commands.h"

namespace kvpush::apps {

void RegisterXferBenchCommand(CLI::App& app) {
  auto* cmd = app.add_subcommand("xfer-bench", "(not implemented yet)");
  cmd->callback([] {
    std::fprintf(stderr, "kvpush xfer-bench: not implemented yet\n");
    throw CLI::RuntimeError(2);
  });
}

}  // namespace kvpush::apps
