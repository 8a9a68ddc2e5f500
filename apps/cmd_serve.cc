// kvpush serve: placeholder until its layer lands.
#include <cstdio>

#include "apps/commands.h"

namespace kvpush::apps {

void RegisterServeCommand(CLI::App& app) {
  auto* cmd = app.add_subcommand("serve", "(not implemented yet)");
  cmd->callback([] {
    std::fprintf(stderr, "kvpush serve: not implemented yet\n");
    throw CLI::RuntimeError(2);
  });
}

}  // namespace kvpush::apps
