// kvpush generate: placeholder until its layer lands.
#include <cstdio>

#include "apps/commands.h"

namespace kvpush::apps {

void RegisterGenerateCommand(CLI::App& app) {
  auto* cmd = app.add_subcommand("generate", "(not implemented yet)");
  cmd->callback([] {
    std::fprintf(stderr, "kvpush generate: not implemented yet\n");
    throw CLI::RuntimeError(2);
  });
}

}  // namespace kvpush::apps
