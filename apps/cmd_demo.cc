// kvpush demo: placeholder until its layer lands.
#include <cstdio>

#include "apps/commands.h"

namespace kvpush::apps {

void RegisterDemoCommand(CLI::App& app) {
  auto* cmd = app.add_subcommand("demo", "(not implemented yet)");
  cmd->callback([] {
    std::fprintf(stderr, "kvpush demo: not implemented yet\n");
    throw CLI::RuntimeError(2);
  });
}

}  // namespace kvpush::apps
