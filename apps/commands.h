// Subcommands of the `kvpush` binary. Each Register* adds one CLI11 subcommand whose callback
// runs it; a failing command throws CLI::RuntimeError(exit_code) after printing its error.
#pragma once

#include <CLI/CLI.hpp>

namespace kvpush::apps {

void RegisterServeCommand(CLI::App& app);      // kvpush serve     (apps/cmd_serve.cc)
void RegisterGenerateCommand(CLI::App& app);   // kvpush generate  (apps/cmd_generate.cc)
void RegisterGenModelCommand(CLI::App& app);   // kvpush gen-model (apps/cmd_gen_model.cc)
void RegisterXferBenchCommand(CLI::App& app);  // kvpush xfer-bench (apps/cmd_xfer_bench.cc)
void RegisterDemoCommand(CLI::App& app);       // kvpush demo      (apps/cmd_demo.cc)
void RegisterRouterCommand(CLI::App& app);     // kvpush router    (apps/cmd_router.cc)
void RegisterBenchCommand(CLI::App& app);      // kvpush bench     (apps/cmd_bench.cc)
void RegisterWaitReadyCommand(CLI::App& app);  // kvpush wait-ready (apps/cmd_wait_ready.cc)

}  // namespace kvpush::apps
