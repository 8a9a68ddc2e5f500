// kvpush: one binary, one subcommand per job (see `kvpush --help`).
#include <CLI/CLI.hpp>

#include "apps/commands.h"

int main(int argc, char** argv) {
  CLI::App app{"kvpush: push-based KV transfer for prefill/decode disaggregated LLM serving"};
  app.require_subcommand(1);
  kvpush::apps::RegisterServeCommand(app);
  kvpush::apps::RegisterGenerateCommand(app);
  kvpush::apps::RegisterGenModelCommand(app);
  kvpush::apps::RegisterXferBenchCommand(app);
  kvpush::apps::RegisterDemoCommand(app);
  kvpush::apps::RegisterRouterCommand(app);
  kvpush::apps::RegisterBenchCommand(app);
  CLI11_PARSE(app, argc, argv);
  return 0;
}
