// Backend selection by a short spec string, for tools and tests:
//   "loopback" | "ucx:tcp" | "ucx:shm" | "libfabric:tcp" | "libfabric:shm"
// Thread-safety: pure function.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "common/status.h"
#include "xfer/backend.h"

namespace kvpush::xfer {

/// Creates the backend named by `spec`. Errors: kInvalidArgument (unknown spec), or the backend's
/// own initialisation error (kUnavailable when the transport does not work on this machine).
Result<std::unique_ptr<Backend>> MakeBackend(const std::string& spec);

/// The specs that MakeBackend understands and that work across processes on one host.
std::vector<std::string> MultiProcessBackendSpecs();

}  // namespace kvpush::xfer
