// kvpush gen-model: placeholder until its layer lands.
#include <cstdio>

#include "apps/commands.h"

namespace kvpush::apps {

void RegisterGenModelCommand(CLI::App& app) {
  auto* cmd = app.add_subcommand("gen-model", "(not implemented yet)");
  cmd->callback([] {
    std::fprintf(stderr, "kvpush gen-model: not implemented yet\n");
    throw CLI::RuntimeError(2);
  });
}

}  // namespace kvpush::apps
