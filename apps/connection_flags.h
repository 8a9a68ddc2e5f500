// The front door's connection flags, the same on `kvpush serve` and `kvpush router`
// (docs/configuration.md): idle and slow clients, the connection cap.
#pragma once

#include <CLI/CLI.hpp>

#include "http/connection_options.h"

namespace kvpush::apps {

/// Adds --timeout-keep-alive S (uvicorn's and vLLM's name), --request-head-timeout-s S and
/// --max-connections N to `cmd`, filling `o` (defaults: its initial values). `o` must outlive
/// `cmd`'s parse; the values are checked by http::ConnectionOptions::Validate at start.
void AddConnectionFlags(CLI::App* cmd, http::ConnectionOptions* o);

}  // namespace kvpush::apps
